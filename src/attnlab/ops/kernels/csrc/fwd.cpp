// Forward: for each (batch, head, panel of BQ query rows) an online softmax over blocks of BK
// keys, visiting only the panel's union of intervals, each group of RQ rows only its own union.
#include <algorithm>
#include <cmath>

#include "tiles.h"

namespace attnlab_k {

double fma_loop(int64_t iters) {
  // enough independent chains to cover two FMA pipes' latency, few enough to stay in registers
  constexpr int N = W == 16 ? 16 : 12;
  vf acc[N];
  const vf a = vset(0.999f), b = vset(1e-7f);
  for (int t = 0; t < N; ++t) acc[t] = vset(1.0f + t);
  for (int64_t i = 0; i < iters; ++i)
    for (int t = 0; t < N; ++t) acc[t] = vfma(acc[t], a, b);
  vf s = vzero();
  for (int t = 0; t < N; ++t) s = vadd(s, acc[t]);
  static volatile float sink;
  sink = hsum(s);
  return 2.0 * W * N * (double)iters;
}

Panels make_panels(const Problem& pr) {
  Panels pn;
  pn.Bl = pr.Bl;
  pn.Hl = pr.Hl;
  pn.P = (pr.L + BQ - 1) / BQ;
  const int64_t n = (int64_t)pn.Bl * pn.Hl * pn.P;
  pn.klo.assign(n, pr.S);
  pn.khi.assign(n, 0);
  pn.live.assign(n, 0);
  for (int b = 0; b < pn.Bl; ++b)
    for (int h = 0; h < pn.Hl; ++h) {
      const int32_t* lo = pr.lo + b * pr.lo_sb + h * pr.lo_sh;
      const int32_t* hi = pr.hi + b * pr.lo_sb + h * pr.lo_sh;
      for (int i = 0; i < pr.L; ++i) {
        if (lo[i] >= hi[i]) continue;
        const int64_t at = pn.at(b, h, i / BQ);
        pn.klo[at] = std::min(pn.klo[at], lo[i]);
        pn.khi[at] = std::max(pn.khi[at], hi[i]);
        pn.live[at] += 1;
      }
    }
  return pn;
}

size_t fwd_scratch(const Problem& pr) {
  // Qs (BQ, D), O (BQ, ldv), scores (RQ, BK), m, l (BQ), alpha (RQ)
  return (size_t)BQ * pr.D + (size_t)BQ * pr.ldv + RQ * BK + 2 * BQ + RQ;
}

// One group's step over keys [ga, gb) of the block at j0: scores -> online softmax -> P in Sb;
// alpha gets each row's rescale of its running output.
static void softmax_step(const Problem& pr, const RowMods& md0, float* Sb, int j0, int va, int vb,
                         int ga, int gb, int r0, int i0, const int* rlo, const int* rhi, float* m,
                         float* l, float* alpha) {
  for (int rr = 0; rr < RQ; ++rr) {
    const int r = r0 + rr, lo = rlo[r], hi = rhi[r];
    float* s = Sb + rr * BK;
    alpha[rr] = 1.0f;
    if (lo >= hi || hi <= ga || lo >= gb) {  // the row sees no key of this step
      zero_span(s + va * W, (vb - va) * W);
      continue;
    }
    RowMods md = md0;
    md.rel0 = pr.pos_off - (i0 + r);
    const bool plain = md.plain();  // products kept; the max of the scores is scale · theirs
    // four running maxima and sums: one chain would wait on each vmax / vadd's latency
    vf mx4[4] = {vset(NEG_INF), vset(NEG_INF), vset(NEG_INF), vset(NEG_INF)};
    auto see = [&](int v, vf& mx) {
      const int jv = j0 + v * W;
      const bool edge = jv < lo || jv + W > hi;  // only the row's edge vectors are masked
      if (plain && !edge) {
        mx = vmax(mx, vload(s + v * W));
        return;
      }
      vf x = plain ? vload(s + v * W) : modify(vload(s + v * W), md, jv, nullptr);
      if (edge) x = vmask(x, jv, lo, hi);
      vstore(s + v * W, x);
      mx = vmax(mx, x);
    };
    int v = va;
    for (; v + 4 <= vb; v += 4)
      for (int u = 0; u < 4; ++u) see(v + u, mx4[u]);
    for (; v < vb; ++v) see(v, mx4[0]);
    const vf mx = vmax(vmax(mx4[0], mx4[1]), vmax(mx4[2], mx4[3]));
    const float top = plain ? hmax(mx) * md.scale : hmax(mx);
    const float mo = m[r], mn = std::max(mo, top);
    if (mn == NEG_INF) {  // every score -inf (infinite inputs): nothing to add
      zero_span(s + va * W, (vb - va) * W);
      continue;
    }
    const float a = mo == NEG_INF ? 0.0f : std::exp(mo - mn);
    const vf shift = vset(mn), nshift = vset(-mn), sc = vset(md.scale);
    vf sum4[4] = {vzero(), vzero(), vzero(), vzero()};
    auto take = [&](int v, vf& sum) {
      vf p = vexp(plain ? vfma(vload(s + v * W), sc, nshift) : vsub(vload(s + v * W), shift));
      vstore(s + v * W, p);
      sum = vadd(sum, p);
    };
    for (v = va; v + 4 <= vb; v += 4)
      for (int u = 0; u < 4; ++u) take(v + u, sum4[u]);
    for (; v < vb; ++v) take(v, sum4[0]);
    const vf sum = vadd(vadd(sum4[0], sum4[1]), vadd(sum4[2], sum4[3]));
    l[r] = l[r] * a + hsum(sum);
    m[r] = mn;
    alpha[rr] = a;
  }
}

void fwd_item(const Problem& pr, const Panels& pn, int64_t item, float* out, float* lse,
              float* scratch, std::atomic<bool>* bad) {
  const int P = pn.P, L = pr.L, D = pr.D, Dv = pr.Dv, ldv = pr.ldv;
  const int64_t bh = item / P;
  const int p = (int)(item % P), b = (int)(bh / pr.H), h = (int)(bh % pr.H);
  const int hk = h / (pr.H / pr.Hkv), i0 = p * BQ, nr = std::min(BQ, L - i0);
  float* o_out = out + (bh * L + i0) * Dv;
  float* l_out = lse + bh * L + i0;
  const int64_t at = pn.at(b, h, p);
  if (pn.live[at] == 0) {  // no row of the panel attends anything: out 0, lse -inf
    zero_span(o_out, nr * Dv);
    std::fill(l_out, l_out + nr, NEG_INF);
    return;
  }
  const int klo = pn.klo[at], khi = pn.khi[at], ng = (nr + RQ - 1) / RQ;
  float* Qp = scratch;                 // (BQ, D): the last panel's q, padded to whole groups
  float* O = Qp + BQ * D;              // (BQ, ldv): running output
  float* Sb = O + (int64_t)BQ * ldv;   // (RQ, BK): one group's scores, then P
  float* m = Sb + RQ * BK;             // (BQ,) running max
  float* l = m + BQ;                   // (BQ,) running sum
  float* alpha = l + BQ;               // (RQ,)
  const float* q = pr.q_rows(b, h) + (int64_t)i0 * D;
  if (bad && !finite_span(q, (int64_t)nr * D)) bad->store(true, std::memory_order_relaxed);
  const float* Qs = q;  // whole groups are read in place
  if (nr % RQ) {
    std::copy(q, q + (int64_t)nr * D, Qp);
    zero_span(Qp + nr * D, (ng * RQ - nr) * D);
    Qs = Qp;
  }
  zero_span(O, ng * RQ * ldv);
  std::fill(m, m + BQ, NEG_INF);
  std::fill(l, l + BQ, 0.0f);

  int rlo[BQ], rhi[BQ], glo[BQ / RQ], ghi[BQ / RQ];
  const int32_t* lo = pr.lo + b * (pr.Bl > 1 ? pr.lo_sb : 0) + h * (pr.Hl > 1 ? pr.lo_sh : 0) + i0;
  const int32_t* hi = pr.hi + (lo - pr.lo);
  for (int g = 0; g < ng; ++g) {
    glo[g] = pr.S;
    ghi[g] = 0;
    for (int rr = 0; rr < RQ; ++rr) {
      const int r = g * RQ + rr;
      rlo[r] = r < nr ? lo[r] : 0;
      rhi[r] = r < nr ? hi[r] : 0;
      if (rlo[r] < rhi[r]) {
        glo[g] = std::min(glo[g], rlo[r]);
        ghi[g] = std::max(ghi[g], rhi[r]);
      }
    }
  }
  const int64_t kv = (int64_t)b * pr.Hkv + hk;
  const float* kt = pr.kt + kv * D * pr.S16;  // (S16/PAD, D, PAD)
  const float* v = pr.v_rows(b, hk);          // (S, ldv)
  RowMods md{pr.softcap, pr.softcap > 0 ? 1.0f / pr.softcap : 0.0f,
             pr.slopes ? pr.slopes[b * pr.slope_sb + h] : 0.0f, pr.slopes != nullptr, 0,
             pr.scale};
  for (int j0 = klo & ~(PAD - 1); j0 < khi; j0 += BK) {
    for (int g = 0; g < ng; ++g) {
      const int ga = std::max(j0, glo[g]), gb = std::min(j0 + BK, ghi[g]);
      if (ga >= gb) continue;
      const int va = (ga - j0) / W, vb = (gb - j0 + W - 1) / W, r0 = g * RQ;
      dot_rows(Qs + r0 * D, D, kt, D, j0, Sb, BK, va, vb);  // (RQ, D) @ (D, keys)
      softmax_step(pr, md, Sb, j0, va, vb, ga, gb, r0, i0, rlo, rhi, m, l, alpha);
      // O = O·alpha + P[:, ga:gb] @ V[ga:gb]   (RQ, keys) @ (keys, Dv) -> (RQ, Dv)
      outer_rows(O + r0 * ldv, ldv, alpha, Sb + (ga - j0), BK, 1, v + (int64_t)ga * ldv, ldv,
                 gb - ga, ldv);
    }
  }
  // a NaN/Inf value row that a group read reaches its outputs (0·Inf is NaN)
  if (bad)
    for (int r = 0; r < nr; ++r)
      if (!finite_span(O + r * ldv, Dv)) bad->store(true, std::memory_order_relaxed);
  for (int r = 0; r < nr; ++r) {
    float* o = o_out + r * Dv;
    if (l[r] > 0.0f) {
      const float inv = 1.0f / l[r];
      if (pr.stream_out) {  // whole aligned vectors, written past the caches
        for (int c = 0; c < Dv; c += W) vstream(o + c, vmul(vload(O + r * ldv + c), vset(inv)));
      } else {
        for (int c = 0; c < Dv; ++c) o[c] = O[r * ldv + c] * inv;
      }
      l_out[r] = m[r] + std::log(l[r]);
    } else {
      zero_span(o, Dv);
      l_out[r] = NEG_INF;
    }
  }
  if (pr.stream_out) vfence();
}

}  // namespace attnlab_k

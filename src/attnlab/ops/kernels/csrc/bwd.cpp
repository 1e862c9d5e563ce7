// Backward, FlashAttention-2 style: P recomputed from the saved lse, dS = P ∘ (dP − delta) with
// delta = rowsum(dO ∘ O) − dlse; a dK/dV pass over key panels (every query head of a key/value
// head, so no atomics) and a dQ pass over query panels.
#include <algorithm>
#include <cmath>

#include "tiles.h"

namespace attnlab_k {

namespace {

struct Rows {  // one query panel's inputs and per-row data
  int i0, nr, ng;
  const float* Q;   // (ng·RQ, ldq) queries: read in place, or packed into scratch
  const float* dO;  // (ng·RQ, ldo) output gradients, likewise
  int64_t ldq, ldo;
  int rlo[BQ], rhi[BQ], glo[BQ / RQ], ghi[BQ / RQ];
  float lse[BQ], delta[BQ];
};

// q (ld ldq) and dO (ld ldv) of panel p of head (b, h): whole groups of rows whose layout is
// already that are read in place (the common case: D and Dv multiples of PAD, dO's rows
// contiguous); others are packed into Qs and dOs, zeros past L and past D, Dv
void load_rows(const Problem& pr, const float* lse, const float* delta, int b, int h, int p,
               int ldq, float* Qs, float* dOs, Rows& rw) {
  const int L = pr.L, D = pr.D, Dv = pr.Dv;
  const int64_t bh = (int64_t)b * pr.H + h;
  rw.i0 = p * BQ;
  rw.nr = std::min(BQ, L - rw.i0);
  rw.ng = (rw.nr + RQ - 1) / RQ;
  const float* q = pr.q_rows(b, h) + (int64_t)rw.i0 * D;
  const float* go = pr.dout_rows(b, h) + rw.i0 * pr.g_sl;
  const bool whole = rw.nr % RQ == 0;
  rw.Q = q;
  rw.ldq = D;
  if (!whole || ldq != D) {
    for (int r = 0; r < rw.ng * RQ; ++r) {
      const bool in = r < rw.nr;
      for (int d = 0; d < ldq; ++d) Qs[r * ldq + d] = in && d < D ? q[r * D + d] : 0.0f;
    }
    rw.Q = Qs;
    rw.ldq = ldq;
  }
  rw.dO = go;
  rw.ldo = pr.g_sl;
  if (!whole || pr.g_sd != 1 || Dv != pr.ldv) {
    for (int r = 0; r < rw.ng * RQ; ++r) {
      const bool in = r < rw.nr;
      for (int d = 0; d < pr.ldv; ++d)
        dOs[r * pr.ldv + d] = in && d < Dv ? go[r * pr.g_sl + d * pr.g_sd] : 0.0f;
    }
    rw.dO = dOs;
    rw.ldo = pr.ldv;
  }
  const int32_t* lo = pr.lo + b * (pr.Bl > 1 ? pr.lo_sb : 0) + h * (pr.Hl > 1 ? pr.lo_sh : 0) + rw.i0;
  const int32_t* hi = pr.hi + (lo - pr.lo);
  for (int g = 0; g < rw.ng; ++g) {
    rw.glo[g] = pr.S;
    rw.ghi[g] = 0;
    for (int rr = 0; rr < RQ; ++rr) {
      const int r = g * RQ + rr;
      const bool in = r < rw.nr;
      rw.lse[r] = in ? lse[bh * L + rw.i0 + r] : NEG_INF;
      rw.delta[r] = in ? delta[bh * L + rw.i0 + r] : 0.0f;
      rw.rlo[r] = in ? lo[r] : 0;
      rw.rhi[r] = in ? hi[r] : 0;
      if (rw.lse[r] == NEG_INF) rw.rhi[r] = rw.rlo[r];  // nothing attended: zero gradient
      if (rw.rlo[r] < rw.rhi[r]) {
        rw.glo[g] = std::min(rw.glo[g], rw.rlo[r]);
        rw.ghi[g] = std::max(rw.ghi[g], rw.rhi[r]);
      }
    }
  }
}

// scores S (in Sb) and dP (in dPb) of group rows r0.. over vectors [va, vb) at keys j0.. become
// P (in Sb, if keepP) and dS (in dPb); rows seeing none of [ga, gb) get zeros
void grad_step(const Problem& pr, const Rows& rw, float* Sb, float* dPb, int64_t ld, int j0,
               int va, int vb, int ga, int gb, int r0, float slope) {
  for (int rr = 0; rr < RQ; ++rr) {
    const int r = r0 + rr, lo = rw.rlo[r], hi = rw.rhi[r];
    float* s = Sb + rr * ld;
    float* dp = dPb + rr * ld;
    if (lo >= hi || hi <= ga || lo >= gb) {
      zero_span(s + va * W, (vb - va) * W);
      zero_span(dp + va * W, (vb - va) * W);
      continue;
    }
    RowMods md{pr.softcap, pr.softcap > 0 ? 1.0f / pr.softcap : 0.0f, slope,
               pr.slopes != nullptr, pr.pos_off - (rw.i0 + r), pr.scale};
    const vf l = vset(rw.lse[r]), nl = vset(-rw.lse[r]), dl = vset(rw.delta[r]);
    const vf sc = vset(md.scale);
    const bool plain = md.plain();
    for (int v = va; v < vb; ++v) {
      const int jv = j0 + v * W;
      vf t = vzero();
      vf x = plain ? vload(s + v * W) : modify(vload(s + v * W), md, jv, &t);
      const bool edge = jv < lo || jv + W > hi;  // only the row's edge vectors are masked
      if (edge) x = vmask(x, jv, lo, hi);
      vf pv = vexp(plain ? vfma(x, sc, nl) : vsub(x, l));
      vf ds = vmul(pv, vsub(vload(dp + v * W), dl));
      if (md.cap > 0) ds = vmul(ds, vsub(vset(1.0f), vmul(t, t)));  // d tanh
      // exactly 0 outside the row's keys, whatever dP is there: a vector's lanes past the keys
      // any row reads hold values nothing checked (0·NaN is NaN)
      if (edge) ds = vmask(ds, jv, lo, hi, 0.0f);
      vstore(s + v * W, pv);
      vstore(dp + v * W, ds);
    }
  }
}

}  // namespace

size_t dq_scratch(const Problem& pr) {
  // Qs (BQ, D), dOs (BQ, ldv), dQ (BQ, ldk), S and dP (RQ, BK) each
  return (size_t)BQ * (pr.D + pr.ldv + pr.ldk) + 2 * RQ * BK + sizeof(Rows) / sizeof(float) + 1;
}

void dq_item(const Problem& pr, const Panels& pn, const float* lse, const float* delta,
             int64_t item, float* dq, float* scratch) {
  const int P = pn.P, D = pr.D, ldk = pr.ldk, ldv = pr.ldv;
  const int64_t bh = item / P;
  const int p = (int)(item % P), b = (int)(bh / pr.H), h = (int)(bh % pr.H);
  const int hk = h / (pr.H / pr.Hkv);
  float* Qs = scratch;
  float* dOs = Qs + BQ * D;
  float* dQ = dOs + BQ * ldv;
  float* Sb = dQ + BQ * ldk;
  float* dPb = Sb + RQ * BK;
  Rows& rw = *reinterpret_cast<Rows*>(dPb + RQ * BK);
  const int i0 = p * BQ, nr = std::min(BQ, pr.L - i0);
  float* out = dq + (bh * pr.L + i0) * D;
  const int64_t at = pn.at(b, h, p);
  if (pn.live[at] == 0) {
    zero_span(out, nr * D);
    return;
  }
  load_rows(pr, lse, delta, b, h, p, D, Qs, dOs, rw);
  zero_span(dQ, rw.ng * RQ * ldk);
  const int64_t kv = (int64_t)b * pr.Hkv + hk;
  const float* kt = pr.kt + kv * D * pr.S16;      // (S16/PAD, D, PAD)
  const float* vt = pr.vt + kv * pr.Dv * pr.S16;  // (S16/PAD, Dv, PAD)
  const float* k = pr.k_rows(b, hk);              // (S, ldk)
  const float slope = pr.slopes ? pr.slopes[b * pr.slope_sb + h] : 0.0f;
  for (int j0 = pn.klo[at] & ~(PAD - 1); j0 < pn.khi[at]; j0 += BK) {
    for (int g = 0; g < rw.ng; ++g) {
      const int ga = std::max(j0, rw.glo[g]), gb = std::min(j0 + BK, rw.ghi[g]);
      if (ga >= gb) continue;
      const int va = (ga - j0) / W, vb = (gb - j0 + W - 1) / W, r0 = g * RQ;
      dot_rows(rw.Q + r0 * rw.ldq, rw.ldq, kt, D, j0, Sb, BK, va, vb);        // S
      dot_rows(rw.dO + r0 * rw.ldo, rw.ldo, vt, pr.Dv, j0, dPb, BK, va, vb);  // dP = dO Vᵀ
      grad_step(pr, rw, Sb, dPb, BK, j0, va, vb, ga, gb, r0, slope);
      // dQ += dS[:, ga:gb] @ K[ga:gb]   (RQ, keys) @ (keys, D) -> (RQ, D)
      outer_rows(dQ + r0 * ldk, ldk, nullptr, dPb + (ga - j0), BK, 1, k + (int64_t)ga * ldk, ldk,
                 gb - ga, ldk);
    }
  }
  for (int r = 0; r < nr; ++r)
    for (int d = 0; d < D; ++d) out[r * D + d] = dQ[r * ldk + d] * pr.scale;
}

size_t dkdv_scratch(const Problem& pr) {
  // Qs (BQ, ldk), dOs (BQ, ldv), P and dS (BQ, KP) each, dK (KP, ldk), dV (KP, ldv)
  return (size_t)BQ * (pr.ldk + pr.ldv) + 2 * BQ * KP + (size_t)KP * (pr.ldk + pr.ldv) +
         sizeof(Rows) / sizeof(float) + 1;
}

void dkdv_item(const Problem& pr, const Panels& pn, const float* lse, const float* delta,
               int64_t item, float* dk, float* dv, float* dqacc, float* scratch) {
  const int nkp = (pr.S + KP - 1) / KP, ldk = pr.ldk, ldv = pr.ldv, D = pr.D, Dv = pr.Dv;
  const int64_t kv = item / nkp;
  const int b = (int)(kv / pr.Hkv), hk = (int)(kv % pr.Hkv), G = pr.H / pr.Hkv;
  const int kp0 = (int)(item % nkp) * KP, kp1 = std::min(pr.S, kp0 + KP);
  float* Qs = scratch;
  float* dOs = Qs + BQ * ldk;
  float* Pb = dOs + BQ * ldv;
  float* dSb = Pb + BQ * KP;
  float* dK = dSb + BQ * KP;
  float* dV = dK + KP * ldk;
  Rows& rw = *reinterpret_cast<Rows*>(dV + KP * ldv);
  zero_span(dK, KP * ldk);
  zero_span(dV, KP * ldv);
  const float* kt = pr.kt + kv * D * pr.S16;   // (S16/PAD, D, PAD)
  const float* vt = pr.vt + kv * Dv * pr.S16;  // (S16/PAD, Dv, PAD)
  for (int h = hk * G; h < (hk + 1) * G; ++h) {
    const float slope = pr.slopes ? pr.slopes[b * pr.slope_sb + h] : 0.0f;
    for (int p = 0; p < pn.P; ++p) {
      const int64_t at = pn.at(b, h, p);
      if (pn.live[at] == 0 || pn.khi[at] <= kp0 || pn.klo[at] >= kp1) continue;
      load_rows(pr, lse, delta, b, h, p, ldk, Qs, dOs, rw);
      int ka = kp1, kb = kp0;
      for (int g = 0; g < rw.ng; ++g) {
        const int r0 = g * RQ;
        zero_span(Pb + r0 * KP, RQ * KP);
        zero_span(dSb + r0 * KP, RQ * KP);
        const int ga = std::max(kp0, rw.glo[g]), gb = std::min(kp1, rw.ghi[g]);
        if (ga >= gb) continue;
        const int va = (ga - kp0) / W, vb = (gb - kp0 + W - 1) / W;
        dot_rows(rw.Q + r0 * rw.ldq, rw.ldq, kt, D, kp0, Pb + r0 * KP, KP, va, vb);     // S
        dot_rows(rw.dO + r0 * rw.ldo, rw.ldo, vt, Dv, kp0, dSb + r0 * KP, KP, va, vb);  // dP
        grad_step(pr, rw, Pb + r0 * KP, dSb + r0 * KP, KP, kp0, va, vb, ga, gb, r0, slope);
        if (dqacc) {
          // dQ[rows] += dS[:, ga:gb] @ K[ga:gb]   (RQ, keys) @ (keys, D) -> (RQ, D)
          float* acc = dqacc + (((int64_t)b * pr.H + h) * pn.P * BQ + rw.i0 + r0) * ldk;
          outer_rows(acc, ldk, nullptr, dSb + r0 * KP + (ga - kp0), KP, 1,
                     pr.k_rows(b, hk) + (int64_t)ga * ldk, ldk, gb - ga, ldk);
        }
        ka = std::min(ka, ga);
        kb = std::max(kb, gb);
      }
      if (ka >= kb) continue;
      for (int m = (ka - kp0) & ~(RQ - 1); m < kb - kp0; m += RQ) {
        // only the groups whose keys reach these RQ keys: a window's or a diagonal's edge
        // panels leave the other rows' P and dS zero
        int g0 = rw.ng, g1 = 0;
        for (int g = 0; g < rw.ng; ++g)
          if (rw.glo[g] < kp0 + m + RQ && rw.ghi[g] > kp0 + m) {
            g0 = std::min(g0, g);
            g1 = g + 1;
          }
        if (g0 >= g1) continue;
        const int t0 = g0 * RQ, T = (g1 - g0) * RQ;
        // dV[m..] += P[:, m..]ᵀ @ dO   (keys, rows) @ (rows, Dv) -> (keys, Dv)
        outer_rows(dV + m * ldv, ldv, nullptr, Pb + t0 * KP + m, 1, KP, rw.dO + t0 * rw.ldo,
                   rw.ldo, T, ldv);
        // dK[m..] += dS[:, m..]ᵀ @ Q   (keys, rows) @ (rows, D) -> (keys, D); · scale at the end
        outer_rows(dK + m * ldk, ldk, nullptr, dSb + t0 * KP + m, 1, KP, rw.Q + t0 * rw.ldq,
                   rw.ldq, T, ldk);
      }
    }
  }
  float* ok = dk + (kv * pr.S + kp0) * D;
  float* ov = dv + (kv * pr.S + kp0) * Dv;
  for (int j = 0; j < kp1 - kp0; ++j) {
    for (int d = 0; d < D; ++d) ok[j * D + d] = dK[j * ldk + d] * pr.scale;
    for (int d = 0; d < Dv; ++d) ov[j * Dv + d] = dV[j * ldv + d];
  }
}

}  // namespace attnlab_k

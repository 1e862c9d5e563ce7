// Exact rows of the attention weights from a forward's lse: w[i, j] = exp(s[i, j] - lse[i]) for the
// requested rows i, where s is the forward's score (tiles.h: product, scale, softcap, ALiBi, the
// interval), so the weights fit the lse they are divided by. Each item is one group of RQ
// requested rows of one head; it scores only the union of their intervals, in blocks of WBK keys
// transposed into a chunk of Kᵀ, and writes nothing else: out comes zeroed.
#include <algorithm>

#include "tiles.h"

namespace attnlab_k {

constexpr int WBK = 128;  // keys of one block: its Kᵀ, 32 KiB at D = 64, stays in L1

size_t weights_scratch(const Problem& pr) {
  // Kᵀ of one block (WBK/PAD chunks of (D, PAD)), the group's queries (RQ, D), scores (RQ, WBK)
  return (size_t)WBK * pr.D + (size_t)RQ * pr.D + (size_t)RQ * WBK;
}

void weights_item(const Problem& pr, const WeightRows& wr, int64_t item, float* out,
                  float* scratch) {
  const int D = pr.D, ng = (wr.R + RQ - 1) / RQ, S = wr.S_out, k0 = wr.k0;
  const int64_t bh = item / ng;
  const int g = (int)(item % ng), b = (int)(bh / pr.H), h = (int)(bh % pr.H);
  const int hk = h / (pr.H / pr.Hkv), r0 = g * RQ, nr = std::min(RQ, wr.R - r0);
  float* Kt = scratch;                   // (WBK/PAD, D, PAD)
  float* A = Kt + (int64_t)WBK * D;      // (RQ, D)
  float* Sb = A + RQ * D;                // (RQ, WBK)
  const int64_t lo_at = b * (pr.Bl > 1 ? pr.lo_sb : 0) + h * (pr.Hl > 1 ? pr.lo_sh : 0);
  int rlo[RQ], rhi[RQ], ri[RQ];
  float rl[RQ];
  int glo = S, ghi = 0;
  for (int rr = 0; rr < RQ; ++rr) {
    float* a = A + rr * D;
    rlo[rr] = rhi[rr] = 0;
    if (rr >= nr) {
      std::fill(a, a + D, 0.0f);
      continue;
    }
    const int i = ri[rr] = (int)wr.idx[r0 + rr];
    rl[rr] = wr.lse[bh * wr.L + i];
    const float* qi = pr.q_rows(b, h) + wr.q_at[r0 + rr] * D;
    std::copy(qi, qi + D, a);
    if (rl[rr] == NEG_INF || pr.lo[lo_at + i] >= pr.hi[lo_at + i]) continue;  // attends nothing
    rlo[rr] = pr.lo[lo_at + i];
    rhi[rr] = pr.hi[lo_at + i];
    glo = std::min(glo, rlo[rr]);
    ghi = std::max(ghi, rhi[rr]);
  }
  if (glo >= ghi) return;  // out is zeros: only the scored union [glo, ghi) is written
  const float* k = pr.k_rows(b, hk);  // (nk, D): keys k0.. of the call
  const int nk = pr.S;
  RowMods md{pr.softcap, pr.softcap > 0 ? 1.0f / pr.softcap : 0.0f,
             pr.slopes ? pr.slopes[b * pr.slope_sb + h] : 0.0f, pr.slopes != nullptr, 0,
             pr.scale};
  // every line of the union's keys asked for at once: they arrive in parallel, not one miss at a
  // time as the transposes reach them (a row's keys are rarely cached: a forward ran last)
  for (int64_t e = (int64_t)(glo - k0) * D; e < (int64_t)(ghi - k0) * D; e += 16)
    __builtin_prefetch(k + e);
  for (int j0 = glo; j0 < ghi; j0 += WBK) {  // call key indices [j0, j0 + n)
    const int n = std::min(WBK, ghi - j0), vb = (n + W - 1) / W;
    for (int c = 0; c * PAD < n; ++c) {
      const int j = j0 - k0 + c * PAD;  // k's row
      key_chunk(k + (int64_t)j * D, D, std::min(PAD, nk - j), Kt + (int64_t)c * D * PAD, false);
    }
    dot_rows(A, D, Kt, D, 0, Sb, WBK, 0, vb);  // (RQ, D) @ (D, n) -> (RQ, n)
    for (int rr = 0; rr < nr; ++rr) {
      if (rlo[rr] >= rhi[rr]) continue;
      float* o = out + (bh * wr.R + r0 + rr) * (int64_t)S + j0;
      md.rel0 = pr.pos_off - ri[rr];
      const vf l = vset(rl[rr]), nl = vset(-rl[rr]), sc = vset(md.scale);
      for (int v = 0; v < vb; ++v) {
        const int jv = j0 + v * W;
        vf x = vload(Sb + rr * WBK + v * W);
        x = vmask(md.plain() ? x : modify(x, md, jv, nullptr), jv, rlo[rr], rhi[rr]);
        // exp(s - lse) as the forward computed its lse; -inf (outside the interval) -> 0
        x = vexp(md.plain() ? vfma(x, sc, nl) : vsub(x, l));
        if ((v + 1) * W <= n) {
          vstore(o + v * W, x);
        } else {  // the block's last keys: only the n - v·W that belong to it
          float tail[W];
          vstore(tail, x);
          std::copy(tail, tail + (n - v * W), o + v * W);
        }
      }
    }
  }
}

}  // namespace attnlab_k

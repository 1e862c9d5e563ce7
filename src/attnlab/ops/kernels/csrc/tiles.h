// The two register-blocked FMA micro-kernels every pass is made of, and the score pipeline of one
// row (ops/scores.py's order: softcap, then ALiBi, then the interval mask).
#pragma once
#include <algorithm>

#include "interval.h"
#include "vec.h"

namespace attnlab_k {

// key vectors per dot tile and value vectors per outer tile: RQ·N accumulators in registers
// (AVX-512: 8·3 and 8·2 of 32; AVX2: 4·2 of 16; scalar: 4·4)
constexpr int NVK = W == 16 ? 3 : W == 8 ? 2 : 4;
constexpr int NVO = W == 16 ? 2 : W == 8 ? 2 : 4;

// Kᵀ (and Vᵀ) are stored in chunks of PAD keys: (S16 / PAD, D, PAD), so the PAD keys of one
// dimension are contiguous and a tile's loads walk forward through memory (few pages, prefetch)
static inline const float* chunked(const float* base, int D, int j) {
  return base + (int64_t)(j / PAD) * D * PAD + j % PAD;
}

// one chunk of Kᵀ: o (n, PAD) from `rows` <= PAD rows of n floats at x (row stride n), the keys
// past them zero
static inline void key_chunk(const float* x, int64_t n, int rows, float* o, bool stream) {
  if (rows == PAD) {
    transpose_rows16(x, n, o, stream);
    return;
  }
  for (int64_t d = 0; d < n; ++d)
    for (int t = 0; t < PAD; ++t) o[d * PAD + t] = t < rows ? x[t * n + d] : 0.0f;
}

// C[r][t·W..] = Σ_d A[r·lda + d] · Kᵀ[d][keys of vector t] for RQ rows, NV vectors of keys:
// products Q·Kᵀ (A = packed Q), or dP = dO·Vᵀ
template <int NV>
static inline void dot_tile(const float* A, int64_t lda, const float* const* bp, int D, float* C,
                            int64_t ldc) {
  vf acc[RQ][NV];
  for (int r = 0; r < RQ; ++r)
    for (int t = 0; t < NV; ++t) acc[r][t] = vzero();
  for (int d = 0; d < D; ++d) {
    vf b[NV];
    for (int t = 0; t < NV; ++t) b[t] = vload(bp[t] + d * PAD);
    for (int r = 0; r < RQ; ++r) {
      vf a = vset(A[r * lda + d]);
      for (int t = 0; t < NV; ++t) acc[r][t] = vfma(a, b[t], acc[r][t]);
    }
  }
  for (int r = 0; r < RQ; ++r)
    for (int t = 0; t < NV; ++t) vstore(C + r * ldc + t * W, acc[r][t]);
}

// vectors [va, vb) of C's RQ rows, C[·][0] at key j0; kt is the chunked (S16/PAD, D, PAD) Kᵀ.
// The vectors are split into tiles as even as possible (9 -> 3 + 3 + 3, not 4 + 4 + 1): a
// one-vector tile has too few independent accumulators to keep the FMA units busy
static inline void dot_rows(const float* A, int64_t lda, const float* kt, int D, int j0,
                            float* C, int64_t ldc, int va, int vb) {
  const int total = vb - va, tiles = (total + NVK - 1) / NVK;
  for (int i = 0, v = va; i < tiles; ++i) {
    const int n = (total * (i + 1)) / tiles - (total * i) / tiles;
    const float* bp[NVK];
    for (int t = 0; t < NVK; ++t) bp[t] = chunked(kt, D, j0 + (v + std::min(t, n - 1)) * W);
    float* c = C + v * W;
    switch (n) {
      case 1: dot_tile<1>(A, lda, bp, D, c, ldc); break;
      case 2: dot_tile<2>(A, lda, bp, D, c, ldc); break;
      case 3: dot_tile<3>(A, lda, bp, D, c, ldc); break;
      default: dot_tile<NVK>(A, lda, bp, D, c, ldc); break;
    }
    v += n;
  }
}

// C[m][c..] = C[m][c..]·cs[m] + Σ_{t<T} A[m·ams + t·ats] · B[t·ldb + c..] for RQ rows m:
// P·V (A = P rows), Pᵀ·dO and dSᵀ·Q (A = P or dS read down a column), dS·K
template <int NV>
static inline void outer_tile(float* C, int64_t ldc, const float* cs, const float* A, int64_t ams,
                              int64_t ats, const float* B, int64_t ldb, int T) {
  vf acc[RQ][NV];
  for (int m = 0; m < RQ; ++m) {
    vf s = vset(cs ? cs[m] : 1.0f);
    for (int t = 0; t < NV; ++t)
      acc[m][t] = cs ? vmul(vload(C + m * ldc + t * W), s) : vload(C + m * ldc + t * W);
  }
  for (int t = 0; t < T; ++t) {
    vf b[NV];
    for (int u = 0; u < NV; ++u) b[u] = vload(B + t * ldb + u * W);
    for (int m = 0; m < RQ; ++m) {
      vf a = vset(A[m * ams + t * ats]);
      for (int u = 0; u < NV; ++u) acc[m][u] = vfma(a, b[u], acc[m][u]);
    }
  }
  for (int m = 0; m < RQ; ++m)
    for (int t = 0; t < NV; ++t) vstore(C + m * ldc + t * W, acc[m][t]);
}

// all `ncols` columns (a multiple of PAD) of C's RQ rows
static inline void outer_rows(float* C, int64_t ldc, const float* cs, const float* A, int64_t ams,
                              int64_t ats, const float* B, int64_t ldb, int T, int ncols) {
  for (int c = 0; c < ncols; c += NVO * W) {
    switch (std::min(NVO, (ncols - c) / W)) {
      case 1: outer_tile<1>(C + c, ldc, cs, A, ams, ats, B + c, ldb, T); break;
      case 2: outer_tile<2>(C + c, ldc, cs, A, ams, ats, B + c, ldb, T); break;
      case 3: outer_tile<3>(C + c, ldc, cs, A, ams, ats, B + c, ldb, T); break;
      default: outer_tile<NVO>(C + c, ldc, cs, A, ams, ats, B + c, ldb, T); break;
    }
  }
}

// What a row's scores need besides the product: the scale, the modifiers, the row's position.
struct RowMods {
  float cap, inv_cap;  // softcap (0: none)
  float slope;         // ALiBi slope of the head (0 and unused without slopes)
  bool alibi;
  int rel0;            // j - i + pos_off at j = 0: ALiBi's distance is rel0 + j
  float scale;
  // no softcap, no ALiBi, a positive scale: a score's exp(s - shift) is exp(fma(q·k, scale,
  // -shift)), one rounding and no stored scores; the forward, backward and weights all take it,
  // so the lse fits the P and the weights recomputed from it
  bool plain() const { return cap <= 0 && !alibi && scale > 0; }
};

// the scale, softcap and ALiBi on one vector of products q·k at keys j0.. (ops/scores.py's order:
// the product first, then the scale, as PyTorch's fused kernel rounds it, so an lse from here
// fits the scores `attention_weights` recomputes); t gets tanh(s/cap) for the softcap's gradient
static inline vf modify(vf x, const RowMods& md, int j0, vf* t) {
  x = vmul(x, vset(md.scale));
  if (md.cap > 0) {
    vf th = vtanh(vmul(x, vset(md.inv_cap)));
    if (t) *t = th;
    x = vmul(th, vset(md.cap));
  }
  if (md.alibi) x = vfma(vset(md.slope), vrel(md.rel0 + j0), x);
  return x;
}

static inline void zero_span(float* p, int n) { std::fill(p, p + n, 0.0f); }

}  // namespace attnlab_k

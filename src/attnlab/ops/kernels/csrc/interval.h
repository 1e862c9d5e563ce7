// The interval kernel's plain-C++ core: one call's problem, the per-panel key ranges, and the work
// items of the forward and the two backward passes. No torch here: ops.cpp is the only file that
// knows tensors. Glossary: B batch, H query heads, Hkv key/value heads, L queries, S keys,
// D query/key head dim, Dv value head dim; query row i attends keys lo[i] <= j < hi[i].
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace attnlab_k {

// query rows of one register block (a "group"). With AVX-512's 32 registers a group of 8 rows
// shares each loaded vector of Kᵀ among 8 rows: half the key traffic from L2 per multiply-add of
// a group of 4, which is what limits a group's scores when its keys do not fit in L1 (a 4-row
// group: 4 loads per 16 FMAs). AVX2's 16 registers hold 4 rows of 2 vectors.
#if defined(ATTNLAB_AVX512)
constexpr int RQ = 8;
#else
constexpr int RQ = 4;
#endif
// The block sizes. Each can be overridden at build time (-DATTNLAB_BQ=32 ...) only to measure an
// alternative (benchmarks/kernel_blocks.py); the library always ships with these.
#ifndef ATTNLAB_BQ
#define ATTNLAB_BQ 64
#endif
#ifndef ATTNLAB_BK
#define ATTNLAB_BK 512
#endif
#ifndef ATTNLAB_KP
#define ATTNLAB_KP 64
#endif
// Measured alternatives: BK = 64, 128, 256 were slower than 512 (Xeon, 3 December 2026:
// docs/performance.md, "Alternatives measured and not taken"); BQ = 32, 128 and KP = 32, 128
// (benchmarks/kernel_blocks.py, 4 December 2026) fell within that run's noise: at load average 15
// a KP change moved the forward, which KP does not touch, by up to 20%. Re-run it on an idle
// machine before changing one.
// BQ: query rows of one forward / dQ work item (a "panel"; 8 groups of 8 rows on AVX-512, 16 of
// 4 on AVX2). A panel's q rows stay in L1 across its keys (64 × D = 64 floats: 16 KiB of the
// 32-48 KiB L1d), and its rows' intervals are one key range, so a panel skips what its rows skip.
constexpr int BQ = ATTNLAB_BQ;
// BK: key columns of one forward / dQ step: one score block per group, RQ × BK floats (16 KiB
// on AVX-512) in L1 beside q, and a long run of keys per softmax rescale.
constexpr int BK = ATTNLAB_BK;
// KP: keys of one dK/dV work item: its dK and dV accumulators (KP × D each) stay in L1 while the
// panels of the query rows that reach those keys stream past; one item per 64 keys gives a 4k
// call 64 items per head to balance across threads.
constexpr int KP = ATTNLAB_KP;
constexpr int PAD = 16;  // kt/vt columns and k/v rows are padded to multiples of this

struct Problem {
  int B, H, Hkv, L, S, D, Dv;
  int S16;            // padded key count: the row length of kt and vt
  int ldk, ldv;       // row strides of k and v: D and Dv padded to PAD
  // q, k, v: each head's rows contiguous (row stride D, ldk, ldv), any batch and head strides
  // (a block of a context-parallel shard: rows of every head, nothing copied); dout: any strides
  // (the gradient of a sum is one value expanded), read once per panel into a packed copy
  const float* q;     // (B, H, L, D)
  const float* k;     // (B, Hkv, S, ldk), backward only
  const float* kt;    // (B, Hkv, D, S16): keys contiguous
  const float* v;     // (B, Hkv, S, ldv)
  const float* vt;    // (B, Hkv, Dv, S16), backward only
  const float* dout;  // (B, H, L, Dv), backward only
  int64_t q_sb, q_sh, k_sb, k_sh, v_sb, v_sh;  // batch and head strides
  int64_t g_sb, g_sh, g_sl, g_sd;              // dout's strides: batch, head, row, element
  const int32_t* lo;  // (Bl, Hl, L) first key of each row
  const int32_t* hi;  // (Bl, Hl, L) one past its last key
  int64_t lo_sb, lo_sh;   // batch and head strides of lo/hi (0 where broadcast)
  const float* slopes;    // (Bs, H) ALiBi slopes, or null
  int64_t slope_sb;       // batch stride of slopes (0 where broadcast)
  float scale, softcap;   // softcap 0: none
  int pos_off;            // global position of key 0 minus that of query row 0
  int Bl, Hl;             // batch and head sizes of lo/hi (1 or B, 1 or H)
  bool stream_out;        // forward: out rows are whole aligned vectors, written past the caches

  const float* q_rows(int64_t b, int64_t h) const { return q + b * q_sb + h * q_sh; }
  const float* k_rows(int64_t b, int64_t hk) const { return k + b * k_sb + hk * k_sh; }
  const float* v_rows(int64_t b, int64_t hk) const { return v + b * v_sb + hk * v_sh; }
  const float* dout_rows(int64_t b, int64_t h) const { return dout + b * g_sb + h * g_sh; }
};

// Each query panel's union of key intervals, per (b|1, h|1) of lo/hi: [klo, khi) and live rows.
struct Panels {
  int Bl = 1, Hl = 1, P = 0;
  std::vector<int32_t> klo, khi, live;
  int64_t at(int b, int h, int p) const {
    return ((int64_t)(Bl > 1 ? b : 0) * Hl + (Hl > 1 ? h : 0)) * P + p;
  }
};

Panels make_panels(const Problem& pr);
double fma_loop(int64_t iters);  // iters rounds of independent FMAs on registers; returns flops

// forward: item = (b·H + h)·P + panel; out (B, H, L, Dv), lse (B, H, L). bad (or null): set
// when a query row of the panel or a value row it reads holds NaN/Inf (seen in its outputs)
size_t fwd_scratch(const Problem& pr);
void fwd_item(const Problem& pr, const Panels& pn, int64_t item, float* out, float* lse,
              float* scratch, std::atomic<bool>* bad = nullptr);

// backward. lse, delta (B, H, L) contiguous; dout in the Problem.
// dQ pass: item = (b·H + h)·P + panel; dq (B, H, L, D)
size_t dq_scratch(const Problem& pr);
void dq_item(const Problem& pr, const Panels& pn, const float* lse, const float* delta,
             int64_t item, float* dq, float* scratch);
// dK/dV pass: item = (b·Hkv + hk)·nKP + key panel; dk (B, Hkv, S, D), dv (B, Hkv, S, Dv).
// dqacc (B, H, P·BQ, ldk), or null: dS @ K is also added there, which makes the dQ pass
// unnecessary; only race-free when one thread runs every key panel of a (b, hk) in turn
size_t dkdv_scratch(const Problem& pr);
void dkdv_item(const Problem& pr, const Panels& pn, const float* lse, const float* delta,
               int64_t item, float* dk, float* dv, float* dqacc, float* scratch);

// exact rows of the weights from a forward's lse (weights.cpp): q (B, H, ·, D) holding the
// requested rows' queries, k (B, Hkv, S, ldk = D) holding keys [k0, k0 + S) of the call
struct WeightRows {
  int R, L, S_out;        // requested rows, the call's queries and keys (an out row's length)
  int k0;                 // the call's key index of k's row 0
  const int64_t* idx;     // (R,) each requested row's index in [0, L)
  const int64_t* q_at;    // (R,) the row of q holding its query
  const float* lse;       // (B, H, L) contiguous
};
size_t weights_scratch(const Problem& pr);
// item = (b·H + h)·ceil(R/RQ) + group; out (B, H, R, S_out) zeros, written where attended
void weights_item(const Problem& pr, const WeightRows& wr, int64_t item, float* out,
                  float* scratch);

}  // namespace attnlab_k

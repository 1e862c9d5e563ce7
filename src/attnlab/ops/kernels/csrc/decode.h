// The decode kernel: a few query rows (L <= 16, a decoding step or a short speculative run)
// against a long key/value cache, read once per step, as stored (float32, bfloat16 or float16).
// Glossary as interval.h: B batch, H query heads, Hkv key/value heads, G = H / Hkv, L queries,
// S keys, D, Dv head dims; query row i attends keys lo[i] <= j < hi[i].
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <tuple>

namespace attnlab_k {

// The query heads of one key/value head are computed together (GQA packed): each cache row is
// read once per step for all G·L rows. The keys of a (batch, kv head) are split into chunks
// (flash-decoding), one work item each on the kernel's queue; the partial results of a head's
// chunks are merged exactly through their log-sum-exp by the item that finishes last.
//
// q (B, H, L, D) contiguous; q, k (B, Hkv, S, D), v (B, Hkv, S, Dv): float32, bfloat16 or
// float16 (q converted in registers as the cache), k and v with unit stride along the head dim,
// any other strides (a slice of a preallocated cache); lo, hi (B|1, H|1, L) int32, or both
// none: every row attends every key (a call without a mask); slopes
// (B|1, H) float32 or none. Returns out (B, H, L, Dv) in q's dtype (accumulated in float32),
// lse (B, H, L) float32 (a row with no key: 0 and -inf), and, with check, whether every query
// row and every cache row the call read is finite (false without check: nothing claimed).
std::tuple<at::Tensor, at::Tensor, bool> decode(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v,
                                                const std::optional<at::Tensor>& lo,
                                                const std::optional<at::Tensor>& hi,
                                                const std::optional<at::Tensor>& slopes,
                                                double scale, double softcap, int64_t pos_off,
                                                int64_t chunk, bool check);

// which conversion of bfloat16 rows this build runs: 2 = AVX-512 BF16 instructions (chosen at
// run time where the CPU has them), 1 = integer shift, 0 = scalar
int64_t decode_bf16_path();

}  // namespace attnlab_k

// The cheap path's probe (ops/cheap.py): one call per attention call, before anything else, that
// says under which layout a plan is kept and whether the inputs' values are finite.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace attnlab_k {

// The exact layout of q, k, v — each one's sizes, strides, dtype, device and requires_grad —
// and the grad mode, as one string (equal strings: equal layouts), ended by a verdict on their
// values: 'F' no NaN/Inf in the tensors checked, 'N' a NaN/Inf in one of them, 'U' not decided
// here. check: 0 checks nothing ('U'); n > 0 checks q, k and v, -n the query alone, each when it
// is float32, bfloat16 or float16 on the CPU, of unit-stride rows and at most n values (else
// 'U'), on this thread, read in place. "" for a tensor with no plain layout (sparse, nested, a functorch wrapper, no
// storage): such a call keeps no plan.
std::string probe(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t check);

// probe's two halves (serve.cpp: the layout first, the values checked before SDPA's kernel, or
// after it where the probe does not decide): the layout string without the verdict ("" as probe's); whether `check` decides (the verdict is 'F'
// or 'N', not 'U'); and, where it decides, whether the tensors it checks are all finite
std::string layout(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);
bool decides(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t check);
bool all_finite3(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t check);

// no NaN or Inf in x (checkable by the probe: float32, bfloat16 or float16 on the CPU), read in
// place on this thread, in spans of memory order for any strides
bool values_finite(const at::Tensor& x);

// no NaN or Inf in row L - 1 of x (.., L, n) (float32, bfloat16 or float16 on the CPU), for
// every index of its leading dims, read in place on this thread: an output's last row, which in
// a square causal call sees every key and value (serve.cpp)
bool last_row_finite(const at::Tensor& x);

// no NaN or Inf in x (float32, bfloat16 or float16, contiguous, on the CPU), read on the kernel's
// work queue (the op `all_finite`:
// a plan's check of an input too large for the probe, ops/cheap.py, serve.cpp)
bool all_finite(const at::Tensor& x);

}  // namespace attnlab_k

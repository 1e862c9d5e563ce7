// The cheap path's probe (probe.h): a small call's signature and NaN/Inf check in one op call,
// where three Python checks and a Python signature cost more than PyTorch's kernel at L = 1.
#include "probe.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/DispatchKeySet.h>

#include <algorithm>
#include <atomic>
#include <utility>
#include <vector>

#include "queue.h"
#include "vec.h"

namespace attnlab_k {

namespace {

// a tensor whose layout the signature states and whose values can be read where it says
bool plain(const at::Tensor& x) {
  static const c10::DispatchKeySet wrapped({c10::DispatchKey::FuncTorchBatched,
                                            c10::DispatchKey::FuncTorchGradWrapper,
                                            c10::DispatchKey::Python});
  return x.defined() && x.layout() == c10::kStrided && !x.is_nested() && x.has_storage() &&
         !x.key_set().has_any(wrapped);
}

// the probe reads x itself: float32, bfloat16 or float16 on the CPU, at most `most` values, rows
// (the last dim) of unit stride
bool checkable(const at::Tensor& x, int64_t most) {
  const auto t = x.scalar_type();
  return (t == at::kFloat || t == at::kBFloat16 || t == at::kHalf) && x.device().is_cpu() &&
         x.numel() <= most && (x.dim() == 0 || x.size(-1) <= 1 || x.stride(-1) == 1);
}

// no NaN/Inf among n 16-bit floats whose exponent bits are `ones` (all set: Inf or NaN): the
// largest magnitude's bits below `ones` (a max over 16-bit lanes, which the compiler vectorizes;
// an OR of per-value tests took twice as long: 3.4 against 1.6 µs for 192 KB)
bool finite_bits(const uint16_t* p, int64_t n, uint16_t ones) {
  uint16_t most = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t m = p[i] & 0x7FFF;
    most = m > most ? m : most;
  }
  return most < ones;
}

// no NaN/Inf in the n values of dtype t (float32, bfloat16, float16) at p
bool finite_values(at::ScalarType t, const void* p, int64_t n) {
  switch (t) {
    case at::kFloat: return finite_span((const float*)p, n);  // (a 32-bit max as below: slower)
    case at::kBFloat16: return finite_bits((const uint16_t*)p, n, 0x7F80);
    default: return finite_bits((const uint16_t*)p, n, 0x7C00);  // float16
  }
}

// no NaN/Inf among the values of dtype t laid out from p by sizes and strides (in elements of
// `size` bytes), read in place in spans of memory order: the dims (stride, size) sorted by
// stride, those of size 1 and broadcast ones (stride 0: their values read once) left out, each
// merged into the one below where together they are one span (q of one qkv projection's (B, L,
// 3·H·D) block viewed as (B, H, L, D) is L spans of H·D)
bool finite_strided(at::ScalarType t, const char* p, c10::IntArrayRef sizes,
                    c10::IntArrayRef strides, int64_t size) {
  std::vector<std::pair<int64_t, int64_t>> dims;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) return true;  // no values
    if (sizes[i] > 1 && strides[i] != 0) dims.emplace_back(strides[i], sizes[i]);
  }
  std::sort(dims.begin(), dims.end());
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const auto& d : dims) {
    if (!spans.empty() && spans.back().first * spans.back().second == d.first)
      spans.back().second *= d.second;  // the inner dim's stride, both sizes
    else
      spans.push_back(d);
  }
  int64_t n = 1;  // values a span (unit stride)
  if (!spans.empty() && spans.front().first == 1) {
    n = spans.front().second;
    spans.erase(spans.begin());
  }
  const int64_t nd = (int64_t)spans.size();
  std::vector<int64_t> at(nd, 0);  // index over the outer dims, innermost first
  for (;;) {
    int64_t off = 0;
    for (int64_t i = 0; i < nd; ++i) off += at[i] * spans[i].first;
    if (!finite_values(t, p + off * size, n)) return false;
    int64_t i = 0;
    for (; i < nd && ++at[i] == spans[i].second; ++i) at[i] = 0;  // the next span
    if (i == nd) return true;  // past the last
  }
}

// v (>= -1) appended as ASCII, six bits a char low first: 64 + bits while more follow, then
// 32 + the last (< 32). No division (a small call's whole budget is a few µs), each number ends
// where it ends, and a string of them is plain ASCII: the Python str is made by a copy
void put(std::string& s, int64_t v) {
  uint64_t u = (uint64_t)(v + 1);  // -1 (a CPU device's index) -> 0
  while (u >= 32) {
    s.push_back((char)(64 + (u & 63)));
    u >>= 6;
  }
  s.push_back((char)(32 + u));  // the last group: 0..31, below the continuation chars
}

}  // namespace

// a permutation of a contiguous block (a projection's (B, L, H, D) viewed as (B, H, L, D)) is
// one span from its first value, read in memory order; any other layout, `finite_strided`
bool values_finite(const at::Tensor& x) {
  const char* p = (const char*)x.data_ptr();
  if (x.is_non_overlapping_and_dense()) return finite_values(x.scalar_type(), p, x.numel());
  return finite_strided(x.scalar_type(), p, x.sizes(), x.strides(), x.element_size());
}

bool last_row_finite(const at::Tensor& x) {
  TORCH_CHECK(x.dim() >= 2, "last_row_finite: a tensor (.., L, n)");
  if (x.numel() == 0) return true;
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  std::vector<int64_t> strides(x.strides().begin(), x.strides().end());
  const char* p = (const char*)x.data_ptr() + (x.size(-2) - 1) * x.stride(-2) * x.element_size();
  sizes.erase(sizes.end() - 2);  // (.., L, n) -> (.., n) at row L - 1
  strides.erase(strides.end() - 2);
  return finite_strided(x.scalar_type(), p, sizes, strides, x.element_size());
}

std::string layout(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const at::Tensor* xs[3] = {&q, &k, &v};
  std::string s;
  s.reserve(64);
  for (const at::Tensor* x : xs) {  // dim, sizes, strides, dtype, device, requires_grad
    if (!plain(*x)) return std::string();
    put(s, x->dim());
    for (int64_t d : x->sizes()) put(s, d);
    for (int64_t d : x->strides()) put(s, d);
    put(s, (int64_t)x->scalar_type());
    put(s, (int64_t)x->device().type());
    put(s, (int64_t)x->device().index());
    put(s, x->requires_grad());
  }
  put(s, at::GradMode::is_enabled());
  return s;
}

bool decides(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t check) {
  const at::Tensor* xs[3] = {&q, &k, &v};
  const int n = check == 0 ? 0 : check < 0 ? 1 : 3;  // the tensors checked: q, or q, k, v
  const int64_t most = check < 0 ? -check : check;
  for (int i = 0; i < n; ++i)
    if (!checkable(*xs[i], most)) return false;
  return n > 0;
}

bool all_finite3(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t check) {
  const at::Tensor* xs[3] = {&q, &k, &v};
  const int n = check < 0 ? 1 : 3;
  for (int i = 0; i < n; ++i)
    if (!values_finite(*xs[i])) return false;
  return true;
}

bool all_finite(const at::Tensor& x) {
  const auto t = x.scalar_type();
  TORCH_CHECK((t == at::kFloat || t == at::kBFloat16 || t == at::kHalf) && x.is_contiguous() &&
                  x.device().is_cpu(),
              "all_finite: float32, bfloat16 or float16, contiguous, on the CPU");
  const char* p = (const char*)x.data_ptr();
  const int64_t size = x.element_size();
  std::atomic<bool> bad{false};
  run_ranges(x.numel(), GLUE_CHUNK, stream_ns(1), [&](int64_t b, int64_t e) {
    if (!finite_values(t, p + b * size, e - b)) bad.store(true);
  });
  return !bad.load();
}

std::string probe(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t check) {
  std::string s = layout(q, k, v);
  if (s.empty()) return s;
  s.push_back(!decides(q, k, v, check) ? 'U' : all_finite3(q, k, v, check) ? 'F' : 'N');
  return s;
}

}  // namespace attnlab_k

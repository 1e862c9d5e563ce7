// What decode_entry.cpp shares with the step plans' table (decode_serve.cpp).
#pragma once
#include <ATen/core/Tensor.h>

#include <string>

namespace attnlab_k {

// A decode step's signature without its cache length, appended to s (ops/decode_steps.py's
// `find`): the query's dims, sizes, strides, dtype, device and requires_grad, the same of key and
// value but their cache length and strides, and the grad mode. 1: appended; 0: not decode-shaped
// (more than max_rows query rows, or fewer than 2 dims); -1: a tensor without strides (sparse,
// nested), whose signature is Python's. Tensors of a plain call only (python_entry.h's
// `plain_tensors`: no functorch wrapper).
int step_key(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, long max_rows,
             std::string& s);

}  // namespace attnlab_k

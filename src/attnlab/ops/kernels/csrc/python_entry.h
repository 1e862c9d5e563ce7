// What the C entries called from Python (serve.cpp, decode_entry.cpp) take on themselves: a
// call whose first three arguments are exactly torch.Tensor (no subclass), with no torch function
// mode and no functorch transform active; any other call they hand back to the Python path.
#pragma once
#include <torch/csrc/python_headers.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/python_variable.h>

namespace attnlab_k {

inline bool plain_call(PyObject* const* a) {
  return THPVariable_CheckExact(a[0]) && THPVariable_CheckExact(a[1]) &&
         THPVariable_CheckExact(a[2]) && !at::impl::torch_function_mode_enabled() &&
         !c10::impl::tls_is_dispatch_key_included(
             c10::DispatchKey::FuncTorchDynamicLayerFrontMode);
}

}  // namespace attnlab_k

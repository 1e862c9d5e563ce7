// What the C entries called from Python (serve.cpp, decode_entry.cpp) take on themselves: a
// call whose first three arguments are exactly torch.Tensor (no subclass), with no torch function
// mode and no functorch transform active (a signature read in C: no functorch transform); any
// other call they hand back to the Python path.
#pragma once
#include <torch/csrc/python_headers.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/python_variable.h>

namespace attnlab_k {

// three exact tensors, no functorch transform (whose wrappers' sizes are not the call's)
inline bool plain_tensors(PyObject* const* a) {
  return THPVariable_CheckExact(a[0]) && THPVariable_CheckExact(a[1]) &&
         THPVariable_CheckExact(a[2]) &&
         !c10::impl::tls_is_dispatch_key_included(
             c10::DispatchKey::FuncTorchDynamicLayerFrontMode);
}

// ... and no torch function mode (which must see the call)
inline bool plain_call(PyObject* const* a) {
  return plain_tensors(a) && !at::impl::torch_function_mode_enabled();
}

// a tuple of n new CPython functions, one for each of defs[0..n) (an entry's handout), or nullptr
// with an error set
inline PyObject* functions(PyMethodDef* defs, int n) {
  PyObject* fns = PyTuple_New(n);
  if (!fns) return nullptr;
  for (int i = 0; i < n; ++i) {
    PyObject* f = PyCFunction_New(&defs[i], nullptr);
    if (!f) {
      Py_DECREF(fns);
      return nullptr;
    }
    PyTuple_SET_ITEM(fns, i, f);
  }
  return fns;
}

}  // namespace attnlab_k

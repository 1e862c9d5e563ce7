// The decode step's entry in C (ops/decode_steps.py's step without a mask): the decode kernel
// called as a CPython function, not as the torch op. From Python a torch op's call (its
// arguments made IValues, the dispatcher, the boxed kernel, its outputs wrapped) cost 35-40 µs
// once the kernel's sweep of a cache had left that code cold (a call with B = 0, which returns
// at once: 38 µs), where a 4k-key bfloat16 step takes ~0.5 ms.
//
// Not a torch op: a CPython function (METH_FASTCALL, called with the GIL held; the kernel runs
// without it, as a torch op's call does) handed to Python by `attnlab_decode_entry` (ctypes):
//   key(query, key, value, max_rows) -> bytes: a decode step's signature without its cache
//        length (ops/decode_steps.py's `find`): the query's dims, sizes, strides, dtype, device
//        and requires_grad, the same of key and value but their cache length and strides, and
//        the grad mode, read without the ~20 Python attribute calls that cost ~24 µs once the
//        kernel's sweep had left them cold; False where the query has more than max_rows rows
//        (not decode-shaped); None for a call `plain_tensors` does not take, or a tensor
//        without strides (the Python signature then, as before)
//   step(query, key, value, scale, softcap, min_keys) -> (out, lse, finite): the op's
//        decode(q, k, v, None, None, None, scale, softcap, 0, 0, True), its errors as the op's
//        (RuntimeError); or None where the op's call would not be the kernel's alone (an input
//        that is not exactly a torch.Tensor, a torch function mode, a Python dispatch mode or a
//        functorch transform active) or the call is not a step the op serves as it is (the
//        caller then decides in Python)
#include <torch/csrc/python_headers.h>

#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <string>
#include <tuple>

#include "decode.h"
#include "decode_entry.h"
#include "plan_key.h"
#include "python_entry.h"

namespace attnlab_k {
namespace {

// a tensor's dtype, device and requires_grad
void put_kind(std::string& s, const at::Tensor& t) {
  put_bits(s, (int8_t)t.scalar_type());
  put_bits(s, (int8_t)t.device().type());
  put_bits(s, (int8_t)t.device().index());
  put_bits(s, (int8_t)t.requires_grad());
}

}  // namespace

int step_key(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, long max_rows,
             std::string& s) {
  for (const at::Tensor* t : {&q, &k, &v})
    if (t->layout() != at::kStrided || t->is_nested()) return -1;
  if (q.dim() < 2 || q.size(-2) > max_rows) return 0;
  s.reserve(s.size() + 160);
  put_bits(s, (int8_t)q.dim());
  for (int64_t i = 0; i < q.dim(); ++i) put_bits(s, q.size(i)), put_bits(s, q.stride(i));
  put_kind(s, q);
  for (const at::Tensor* t : {&k, &v}) {  // their shapes but the cache length, no strides
    put_bits(s, (int8_t)t->dim());
    for (int64_t i = 0; i < t->dim(); ++i)
      if (i != t->dim() - 2) put_bits(s, t->size(i));
    put_kind(s, *t);
  }
  put_bits(s, (int8_t)at::GradMode::is_enabled());
  return 1;
}

namespace {

PyObject* step(PyObject*, PyObject* const* a, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  if (n != 6) {
    PyErr_SetString(PyExc_TypeError,
                    "step: 6 arguments (query, key, value, scale, softcap, min_keys)");
    return nullptr;
  }
  // (a dispatch mode too: the op's call is dispatched, this one not)
  if (!plain_call(a) || c10::impl::dispatch_mode_enabled()) Py_RETURN_NONE;
  const double scale = PyFloat_AsDouble(a[3]), softcap = PyFloat_AsDouble(a[4]);
  const long min_keys = PyLong_AsLong(a[5]);
  if (PyErr_Occurred()) return nullptr;
  const at::Tensor& q = THPVariable_Unpack(a[0]);
  const at::Tensor& k = THPVariable_Unpack(a[1]);
  const at::Tensor& v = THPVariable_Unpack(a[2]);
  // a step the op serves as it is (ops/decode_steps.py's lean step): 4-d, key and value of one
  // length, at least min_keys, one batch, unit stride along the head dims; else None
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || k.size(2) != v.size(2) ||
      k.size(2) < min_keys || k.size(0) != q.size(0) || v.size(0) != q.size(0) ||
      k.stride(3) != 1 || v.stride(3) != 1)
    Py_RETURN_NONE;
  std::tuple<at::Tensor, at::Tensor, bool> got;
  {
    pybind11::gil_scoped_release no_gil;
    RECORD_FUNCTION("attnlab::decode", std::vector<c10::IValue>({q, k, v}));
    got = decode(q, k, v, std::nullopt, std::nullopt, std::nullopt, scale, softcap, 0, 0, true);
  }
  PyObject* out = THPVariable_Wrap(std::move(std::get<0>(got)));
  if (!out) return nullptr;
  PyObject* lse = THPVariable_Wrap(std::move(std::get<1>(got)));
  if (!lse) {
    Py_DECREF(out);
    return nullptr;
  }
  PyObject* finite = std::get<2>(got) ? Py_True : Py_False;
  Py_INCREF(finite);
  PyObject* res = PyTuple_New(3);
  if (!res) {
    Py_DECREF(out), Py_DECREF(lse), Py_DECREF(finite);
    return nullptr;
  }
  PyTuple_SET_ITEM(res, 0, out);
  PyTuple_SET_ITEM(res, 1, lse);
  PyTuple_SET_ITEM(res, 2, finite);
  return res;
  END_HANDLE_TH_ERRORS
}

PyObject* key(PyObject*, PyObject* const* a, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  if (n != 4) {
    PyErr_SetString(PyExc_TypeError, "key: 4 arguments (query, key, value, max_rows)");
    return nullptr;
  }
  if (!plain_tensors(a)) Py_RETURN_NONE;  // (metadata only: the same under a mode)
  const long max_rows = PyLong_AsLong(a[3]);
  if (PyErr_Occurred()) return nullptr;
  std::string s;
  const int got = step_key(THPVariable_Unpack(a[0]), THPVariable_Unpack(a[1]),
                           THPVariable_Unpack(a[2]), max_rows, s);
  if (got < 0) Py_RETURN_NONE;
  if (got == 0) Py_RETURN_FALSE;  // not decode-shaped
  return PyBytes_FromStringAndSize(s.data(), (Py_ssize_t)s.size());
  END_HANDLE_TH_ERRORS
}

PyMethodDef kMethods[] = {
    {"step", (PyCFunction)(void (*)(void))step, METH_FASTCALL,
     "step(query, key, value, scale, softcap, min_keys) -> (out, lse, finite) | None"},
    {"key", (PyCFunction)(void (*)(void))key, METH_FASTCALL,
     "key(query, key, value, max_rows) -> bytes | False | None"},
};

}  // namespace
}  // namespace attnlab_k

// this build's (step, key), a new reference (called through ctypes' PyDLL, the GIL held)
extern "C" PyObject* attnlab_decode_entry() {
  return attnlab_k::functions(attnlab_k::kMethods, 2);
}

// The decode step's entry in C (ops/decode_steps.py's step without a mask): the decode kernel
// called as a CPython function, not as the torch op. From Python a torch op's call (its
// arguments made IValues, the dispatcher, the boxed kernel, its outputs wrapped) cost 35-40 µs
// once the kernel's sweep of a cache had left that code cold (a call with B = 0, which returns
// at once: 38 µs), where a 4k-key bfloat16 step takes ~0.5 ms.
//
// Not a torch op: a CPython function (METH_FASTCALL, called with the GIL held; the kernel runs
// without it, as a torch op's call does) handed to Python by `attnlab_decode_entry` (ctypes):
//   step(query, key, value, scale, softcap) -> (out, lse, finite): the op's
//        decode(q, k, v, None, None, None, scale, softcap, 0, 0, True), its errors as the op's
//        (RuntimeError); or None where the op's call would not be the kernel's alone: an input
//        that is not exactly a torch.Tensor, a torch function mode, a Python dispatch mode or a
//        functorch transform active (the caller then calls the op)
#include <torch/csrc/python_headers.h>

#include <ATen/record_function.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <tuple>

#include "decode.h"
#include "python_entry.h"

namespace attnlab_k {
namespace {

PyObject* step(PyObject*, PyObject* const* a, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  if (n != 5) {
    PyErr_SetString(PyExc_TypeError, "step: 5 arguments (query, key, value, scale, softcap)");
    return nullptr;
  }
  // (a dispatch mode too: the op's call is dispatched, this one not)
  if (!plain_call(a) || c10::impl::dispatch_mode_enabled()) Py_RETURN_NONE;
  const double scale = PyFloat_AsDouble(a[3]), softcap = PyFloat_AsDouble(a[4]);
  if (PyErr_Occurred()) return nullptr;
  const at::Tensor& q = THPVariable_Unpack(a[0]);
  const at::Tensor& k = THPVariable_Unpack(a[1]);
  const at::Tensor& v = THPVariable_Unpack(a[2]);
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

PyMethodDef kStep = {"step", (PyCFunction)(void (*)(void))step, METH_FASTCALL,
                     "step(query, key, value, scale, softcap) -> (out, lse, finite) | None"};

}  // namespace
}  // namespace attnlab_k

// this build's `step`, a new reference (called through ctypes' PyDLL, the GIL held)
extern "C" PyObject* attnlab_decode_entry() { return PyCFunction_New(&attnlab_k::kStep, nullptr); }

// What the C tables of plans (serve.cpp, decode_serve.cpp) key a plan on besides its tensors' layout:
// the call's scalar arguments and mask object (`scalars_key`), exactly or not at all, and the
// kernel's switches (ATTNLAB_KERNEL, ATTNLAB_KERNEL_ISA), whose values a plan holds and is served
// only while they are the same (`same_switch`), read from os.environ's own dict (or os.environ
// itself where there is none). Called with the GIL held.
#pragma once
#include <torch/csrc/python_headers.h>

#include <torch/csrc/utils/object_ptr.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace attnlab_k {

// x's bits appended to s
template <class T>
inline void put_bits(std::string& s, T x) {
  char bits[sizeof x];
  std::memcpy(bits, &x, sizeof x);
  s.append(bits, sizeof x);
}

// The scalars of an attention call appended to s, for the values a C plan is kept and served
// for: dropout_p 0 (a float 0.0 or an int 0), is_causal, enable_gqa and return_lse bools, scale
// and softcap None or a float (its bits), the mask's address (0 for None; the plan holds the
// mask, so the address stays its own); false for any others (the Python path, which keys on them
// by equality, keeps those calls)
inline bool scalars_key(std::string& s, PyObject* dropout_p, PyObject* is_causal, PyObject* scale,
                        PyObject* gqa, PyObject* mask, PyObject* softcap, PyObject* lse) {
  const bool no_dropout = (PyFloat_CheckExact(dropout_p) && PyFloat_AS_DOUBLE(dropout_p) == 0.0) ||
                          (PyLong_CheckExact(dropout_p) && PyObject_Not(dropout_p) == 1);
  auto flag = [](PyObject* x) { return x == Py_True || x == Py_False; };
  auto number = [](PyObject* x) { return x == Py_None || PyFloat_CheckExact(x); };
  if (!no_dropout || !flag(is_causal) || !flag(gqa) || !flag(lse) || !number(scale) ||
      !number(softcap))
    return false;
  s.push_back(is_causal == Py_True ? 'c' : '-');
  s.push_back(gqa == Py_True ? 'g' : '-');
  s.push_back(lse == Py_True ? 'l' : '-');
  for (PyObject* x : {scale, softcap}) {
    if (x == Py_None) {
      s.push_back('d');
    } else {
      s.push_back('s');
      put_bits(s, PyFloat_AS_DOUBLE(x));
    }
  }
  put_bits(s, mask == Py_None ? (uintptr_t)0 : (uintptr_t)mask);
  return true;
}

// the switch `name`'s value in env now (a new reference; nullptr: unset), or an error set
inline PyObject* env_value(PyObject* env, PyObject* name, bool* failed) {
  *failed = false;
  if (PyDict_CheckExact(env)) {  // os.environ's own dict (POSIX)
    PyObject* v = PyDict_GetItemWithError(env, name);
    *failed = v == nullptr && PyErr_Occurred();
    Py_XINCREF(v);
    return v;
  }
  PyObject* v = PyObject_GetItem(env, name);  // os.environ itself: a new object each time
  if (v == nullptr) {
    if (PyErr_ExceptionMatches(PyExc_KeyError)) PyErr_Clear();
    else *failed = true;
  }
  return v;
}

// 1 the switch's value is the one kept (nullptr: unset), 0 not, -1 an error set
inline int same_switch(PyObject* env, PyObject* kept, PyObject* name) {
  bool failed;
  THPObjectPtr now(env_value(env, name, &failed));
  if (failed) return -1;
  if (now.get() == kept) return 1;
  if (!now || kept == nullptr) return 0;
  return PyObject_RichCompareBool(now.get(), kept, Py_EQ);
}

}  // namespace attnlab_k

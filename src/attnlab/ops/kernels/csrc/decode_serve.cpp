// The decode step plans' table in C (ops/decode_steps.py): a step of a kept plan without a mask
// (its `lean` step) served in one CPython call from the top of `attention` — the step's S-free
// signature (decode_entry.h's `step_key`), the plan's lookup under it and the call's scalars,
// mask object and the kernel's switches (plan_key.h), and the plan's build's C step — where the
// cheap path's probe, Python's signature, lookup and the step's call cost 10-15 µs of Python a
// step once the kernel's sweep of the cache had left that code cold.
//
// Not a torch op: three CPython functions (METH_FASTCALL, the GIL held) handed to Python once by
// `attnlab_decode_serve_entry` (ctypes, ops/decode_steps.py's `_table`):
//   serve(query, key, value, dropout_p, is_causal, scale, enable_gqa, mask, softcap, return_lse)
//     -> out, or (out, lse) with return_lse True: a plan kept under this call's signature and
//        scalars, the kernel's switches as when it was kept, its step took the call (decode_entry's
//        `step`: exact tensors, no mode or transform, a step the op serves as it is) and every
//        query and cache row it read was finite; else None (nothing served: the Python path
//        decides as without this table; a step with a row not finite runs again there, by the
//        NaN/Inf rules). The step's errors are raised as its own.
//   keep(key, dropout_p, is_causal, scale, enable_gqa, mask, softcap, return_lse, kernel, isa,
//        step, run_scale, run_softcap, least) -> bool: keep a plan (False: scalars it does not
//        serve). key: the step's signature bytes (decode.key_entry's); kernel, isa: the
//        switches' values under which the plan was made (None: unset); step: its build's C step;
//        run_scale, run_softcap, least: the floats and the int (its min_keys: the fewest keys
//        "auto" gives the decode kernel) it is called with. The plan holds the mask (its address is
//        part of the key), the switches' values and the step, never an input.
//   clear() -> None
// At most `most` plans are kept, the least recently served dropped first.
#include <torch/csrc/python_headers.h>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/object_ptr.h>

#include <list>
#include <string>
#include <unordered_map>

#include "decode_entry.h"
#include "plan_key.h"
#include "python_entry.h"

namespace attnlab_k {
namespace {

struct Plan {  // every pointer held (strong); kernel, isa nullptr where the switch was unset
  PyObject* step = nullptr;  // the build's C step (decode_entry.cpp)
  PyObject* scale = nullptr;  // floats: step's scale and softcap
  PyObject* softcap = nullptr;
  PyObject* least = nullptr;  // an int: step's min_keys
  PyObject* mask = nullptr;
  PyObject* kernel = nullptr;
  PyObject* isa = nullptr;
};

struct Kept {
  Plan plan;
  std::list<std::string>::iterator at;  // its key in `order`
};

// the table and its settings: read and written only with the GIL held
struct State {
  std::unordered_map<std::string, Kept> plans;
  std::list<std::string> order;  // keys, least recently served first
  size_t most = 64;
  long max_rows = 16;
  PyObject* env = nullptr;  // os.environ's own dict (or os.environ), its keys
  PyObject* kernel_key = nullptr;
  PyObject* isa_key = nullptr;
};
State st;

void drop(Plan& p) {
  for (PyObject* x : {p.step, p.scale, p.softcap, p.least, p.mask, p.kernel, p.isa})
    Py_XDECREF(x);
}

// the least recently served plan out of the table (it has one)
void drop_oldest() {
  auto old = st.plans.find(st.order.front());
  drop(old->second.plan);
  st.plans.erase(old);
  st.order.pop_front();
}

PyObject* serve(PyObject*, PyObject* const* a, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  if (n != 10) {
    PyErr_SetString(PyExc_TypeError, "serve: 10 arguments");
    return nullptr;
  }
  if (st.plans.empty() || !plain_call(a)) Py_RETURN_NONE;
  std::string s;
  if (step_key(THPVariable_Unpack(a[0]), THPVariable_Unpack(a[1]), THPVariable_Unpack(a[2]),
               st.max_rows, s) != 1 ||
      !scalars_key(s, a[3], a[4], a[5], a[6], a[7], a[8], a[9]))
    Py_RETURN_NONE;
  auto it = st.plans.find(s);
  if (it == st.plans.end()) Py_RETURN_NONE;
  const Plan& p = it->second.plan;
  const int k_same = same_switch(st.env, p.kernel, st.kernel_key);
  const int i_same = k_same == 1 ? same_switch(st.env, p.isa, st.isa_key) : k_same;
  if (i_same < 0) return nullptr;
  if (i_same == 0) Py_RETURN_NONE;
  st.order.splice(st.order.end(), st.order, it->second.at);  // the most recently served
  // held through the call: the step releases the GIL, and the table may change meanwhile
  THPObjectPtr step(Py_NewRef(p.step)), scale(Py_NewRef(p.scale)), softcap(Py_NewRef(p.softcap)),
      least(Py_NewRef(p.least));
  PyObject* args[6] = {a[0], a[1], a[2], scale.get(), softcap.get(), least.get()};
  THPObjectPtr got(PyObject_Vectorcall(step.get(), args, 6, nullptr));
  if (!got) return nullptr;
  // (out, lse, finite), or None: not taken
  if (!PyTuple_CheckExact(got.get()) || PyTuple_GET_SIZE(got.get()) != 3 ||
      PyTuple_GET_ITEM(got.get(), 2) != Py_True)
    Py_RETURN_NONE;
  if (a[9] == Py_True) return PyTuple_Pack(2, PyTuple_GET_ITEM(got.get(), 0),
                                           PyTuple_GET_ITEM(got.get(), 1));
  return Py_NewRef(PyTuple_GET_ITEM(got.get(), 0));
  END_HANDLE_TH_ERRORS
}

PyObject* keep(PyObject*, PyObject* const* a, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  if (n != 14 || !PyBytes_CheckExact(a[0])) {
    PyErr_SetString(PyExc_TypeError, "keep: 14 arguments, the step's signature bytes first");
    return nullptr;
  }
  std::string s(PyBytes_AS_STRING(a[0]), (size_t)PyBytes_GET_SIZE(a[0]));
  if (!scalars_key(s, a[1], a[2], a[3], a[4], a[5], a[6], a[7]) || !PyCallable_Check(a[10]) ||
      !PyFloat_CheckExact(a[11]) || !PyFloat_CheckExact(a[12]) || !PyLong_CheckExact(a[13]))
    Py_RETURN_FALSE;
  Plan p;
  p.step = Py_NewRef(a[10]);
  p.scale = Py_NewRef(a[11]);
  p.softcap = Py_NewRef(a[12]);
  p.least = Py_NewRef(a[13]);
  p.mask = a[5] == Py_None ? nullptr : Py_NewRef(a[5]);
  p.kernel = a[8] == Py_None ? nullptr : Py_NewRef(a[8]);
  p.isa = a[9] == Py_None ? nullptr : Py_NewRef(a[9]);
  auto it = st.plans.find(s);
  if (it != st.plans.end()) {
    drop(it->second.plan);
    it->second.plan = p;
    st.order.splice(st.order.end(), st.order, it->second.at);
  } else {
    st.order.push_back(s);
    st.plans.emplace(s, Kept{p, std::prev(st.order.end())});
  }
  while (st.plans.size() > st.most) drop_oldest();
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

PyObject* clear(PyObject*, PyObject* const*, Py_ssize_t) {
  while (!st.order.empty()) drop_oldest();
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"serve", (PyCFunction)(void (*)(void))serve, METH_FASTCALL,
     "serve(query, key, value, dropout_p, is_causal, scale, enable_gqa, mask, softcap, return_lse)"
     " -> out | (out, lse) | None"},
    {"keep", (PyCFunction)(void (*)(void))keep, METH_FASTCALL,
     "keep(key, dropout_p, is_causal, scale, enable_gqa, mask, softcap, return_lse, kernel, isa, "
     "step, run_scale, run_softcap, least) -> bool"},
    {"clear", (PyCFunction)(void (*)(void))clear, METH_FASTCALL, "clear() -> None"},
};

}  // namespace
}  // namespace attnlab_k

// (serve, keep, clear) of this build's table, its settings (re)set: `env` and its two keys where
// the kernel's switches are read, `max_rows` a decode step's query rows at most, `most` the plans
// kept. Called through ctypes' PyDLL (the GIL held); a new reference.
extern "C" PyObject* attnlab_decode_serve_entry(PyObject* env, PyObject* kernel_key,
                                                PyObject* isa_key, long long max_rows,
                                                long long most) {
  using attnlab_k::st;
  for (PyObject* x : {env, kernel_key, isa_key}) Py_INCREF(x);  // held for the process
  st.env = env;
  st.kernel_key = kernel_key;
  st.isa_key = isa_key;
  st.max_rows = (long)max_rows;
  st.most = most > 0 ? (size_t)most : 1;
  return attnlab_k::functions(attnlab_k::kMethods, 3);
}

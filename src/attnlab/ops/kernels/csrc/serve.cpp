// The cheap path's entry in C (ops/cheap.py): a repeated small call that runs SDPA's kernel as it
// is, served in one C call from Python — the probe (probe.cpp), the plan's lookup, SDPA's ATen op
// and, with a gradient, the second-order pre-hook on SDPA's node — where torch.ops' invocation of
// the probe, the Python signature and lookup, SDPA's Python argument parser and a Python hook cost
// more than PyTorch's kernel at L = 1.
//
// Not a torch op: three CPython functions (METH_FASTCALL, the GIL held) handed to Python once by
// `attnlab_cheap_entry` (ctypes, kernels/build.py's `c_entry`):
//   serve(query, key, value, dropout_p, is_causal, scale, enable_gqa, mask, softcap, return_lse)
//     -> the output (a plan kept under this signature and scalars, the inputs finite), or the
//        probe's string, as its op gives it (no plan served the call: none kept, or an input not
//        finite; ops/cheap.py's `find` takes it as the layout), or None
//        (not probed: an input that is not exactly a torch.Tensor, a torch function mode or a
//        functorch transform active: the Python path decides as without this entry)
//   keep(layout, dropout_p, is_causal, scale, enable_gqa, mask, softcap, return_lse, kernel, isa,
//        hooked, causal, run_scale, gqa) -> bool: keep a plan (False: scalars it does not serve)
//   clear() -> None
// A plan is served under the probe's finite verdict 'F' (the inputs checked before the kernel; a
// square causal call's values through its output's last row after it, which sees every value),
// or under 'U' where each input checked is float32, bfloat16 or float16 and contiguous (too
// large for the probe: checked after the kernel, on the work queue, as `run_sdpa` does; one not
// finite: the probe's string, and the Python plan runs the call again by its rules), for the
// exact scalars it was kept with (is_causal and enable_gqa bools, scale None or a float, dropout_p 0, no softcap, no lse),
// the same mask object (held: its address is part of the key) and the same values of the kernel's
// switches (ATTNLAB_KERNEL, ATTNLAB_KERNEL_ISA) as when it was kept.
#include <torch/csrc/python_headers.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/dynamo/compiled_autograd.h>
#include <torch/csrc/utils/object_ptr.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <unordered_map>
#include <vector>

#include "probe.h"
#include "python_entry.h"
#include "plan_key.h"

namespace attnlab_k {
namespace {

// PyTorch's CPU flash node (ops/sdpa.py's _NODE): its backward has no derivative; the hook gives it
const char* const kFlashNode = "ScaledDotProductFlashAttentionForCpuBackward0";

struct Plan {
  bool causal = false, gqa = false;
  bool hooked = false;  // sdpa.flash's plan: the second-order pre-hook on SDPA's flash node
  std::optional<double> scale;  // passed to SDPA as it is (None: SDPA's own default)
  PyObject* mask = nullptr;  // held (strong): its address is part of the key
  PyObject* kernel = nullptr;  // the switches' values when kept (strong), nullptr where unset
  PyObject* isa = nullptr;
};

// the table and its settings: read and written only with the GIL held
struct State {
  std::unordered_map<std::string, Plan> plans;
  std::deque<std::string> order;  // keys, oldest first (at most `most` kept)
  size_t most = 256;
  int64_t pre_max = 0;  // the probe's float limit (cheap.PRE_MAX)
  PyObject* env = nullptr;  // os.environ's own dict (or os.environ), its keys
  PyObject* kernel_key = nullptr;
  PyObject* isa_key = nullptr;
  PyObject* twice = nullptr;  // ops/sdpa.py's `_twice`
};
State st;

void drop(Plan& p) {
  Py_XDECREF(p.mask);
  Py_XDECREF(p.kernel);
  Py_XDECREF(p.isa);
}

// the plan at `it` out of the table, and its key out of the eviction order (a key left there
// would drop a plan kept later under it before older ones)
void forget(std::unordered_map<std::string, Plan>::iterator it) {
  drop(it->second);
  auto at = std::find(st.order.begin(), st.order.end(), it->first);
  if (at != st.order.end()) st.order.erase(at);
  st.plans.erase(it);
}

// the scalars a plan is served for, appended to the probe's string (`scalars_key`, without a
// softcap or the lse); false for any others (the Python path keys on them exactly: those calls
// stay there)
bool key_of(std::string& s, PyObject* dropout_p, PyObject* is_causal, PyObject* scale,
            PyObject* gqa, PyObject* mask, PyObject* softcap, PyObject* lse) {
  return softcap == Py_None && lse == Py_False &&
         scalars_key(s, dropout_p, is_causal, scale, gqa, mask, softcap, lse);
}

// The second order of SDPA's flash node (ops/sdpa.py's `flash`): in a backward asked to build a
// graph (grad mode on inside it), `_twice`, which puts the math path's recomputation in place of
// the node's gradients; else nothing, without entering Python.
struct Twice : torch::autograd::FunctionPreHook {
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (!at::GradMode::is_enabled()) return grads;
    pybind11::gil_scoped_acquire gil;
    THPObjectPtr args(PyTuple_New((Py_ssize_t)grads.size()));
    if (!args) throw python_error();
    for (size_t i = 0; i < grads.size(); ++i) {
      PyObject* g = grads[i].defined() ? THPVariable_Wrap(grads[i]) : (Py_INCREF(Py_None), Py_None);
      if (!g) throw python_error();
      PyTuple_SET_ITEM(args.get(), (Py_ssize_t)i, g);
    }
    THPObjectPtr got(PyObject_CallOneArg(st.twice, args.get()));
    if (!got) throw python_error();
    TORCH_CHECK(got.get() == Py_None, "attnlab: the second-order pre-hook returns None");
    return grads;
  }

  // compiled autograd (torch._dynamo) calls `_twice` itself, as it does a Python pre-hook's
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override {
    pybind11::gil_scoped_acquire gil;
    Py_INCREF(st.twice);
    args.add_pre_hook(c10::SafePyObject(st.twice, getPyInterpreter()));
  }
};

PyObject* serve(PyObject*, PyObject* const* a, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  if (n != 10) {
    PyErr_SetString(PyExc_TypeError, "serve: 10 arguments");
    return nullptr;
  }
  if (!plain_call(a)) Py_RETURN_NONE;
  const at::Tensor& q = THPVariable_Unpack(a[0]);
  const at::Tensor& k = THPVariable_Unpack(a[1]);
  const at::Tensor& v = THPVariable_Unpack(a[2]);
  // the query checked, and with any mask the keys and values (ops/cheap.py's `find`)
  const int64_t check = a[4] == Py_False && a[7] == Py_None ? -st.pre_max : st.pre_max;
  std::string s = layout(q, k, v);
  const size_t n_layout = s.size();
  if (n_layout == 0) return PyUnicode_FromStringAndSize("", 0);
  const bool decided = decides(q, k, v, check);
  // the probe's string: the layout and the verdict (checked now where no plan ran the kernel)
  auto verdict = [&](int finite) {
    s.resize(n_layout);
    s.push_back(!decided ? 'U' : (finite < 0 ? all_finite3(q, k, v, check) : finite) ? 'F' : 'N');
    return PyUnicode_FromStringAndSize(s.data(), (Py_ssize_t)s.size());
  };
  s.push_back(decided ? 'F' : 'U');
  if (st.plans.empty() || !key_of(s, a[3], a[4], a[5], a[6], a[7], a[8], a[9]))
    return verdict(-1);
  auto it = st.plans.find(s);
  if (it == st.plans.end()) return verdict(-1);
  const at::Tensor* checked[3] = {&q, &k, &v};
  const int n_checked = check < 0 ? 1 : 3;
  if (!decided)  // checked after the kernel by `all_finite`, as the Python plan's `run_sdpa` does
    for (int i = 0; i < n_checked; ++i)
      if ((checked[i]->scalar_type() != at::kFloat && checked[i]->scalar_type() != at::kBFloat16 &&
           checked[i]->scalar_type() != at::kHalf) ||
          !checked[i]->is_contiguous() || !checked[i]->device().is_cpu())
        return verdict(-1);  // (its other checks: the Python plan's)
  const int k_same = same_switch(st.env, it->second.kernel, st.kernel_key);
  const int i_same = k_same == 1 ? same_switch(st.env, it->second.isa, st.isa_key) : k_same;
  if (i_same < 0) return nullptr;
  if (i_same == 0) return verdict(-1);
  const Plan p = it->second;  // copied: the table may change while the GIL is released
  // (s, the key, is kept as it is until the call returns)
  bool finite, shown = true;  // shown: no NaN/Inf in the output's last rows, where looked at
  at::Tensor out;
  // SDPA's node (out's own, or under its view): a shared_ptr up to torch 2.12, an intrusive_ptr
  // from 2.13, whichever `grad_fn` gives
  std::decay_t<decltype(std::declval<const at::Tensor&>().grad_fn())> node;
  // A square causal call's last query row sees every key: a NaN/Inf in a value row reaches its
  // output through the weight times it (a zero weight too: 0 · Inf is NaN), so the values are
  // checked there, after the kernel; the query and keys before it (a NaN/Inf query row, or an
  // Inf key whose scores are all -inf, can leave the output finite)
  const bool square = decided && check > 0 && p.causal && q.size(-2) == k.size(-2);
  {
    pybind11::gil_scoped_release no_gil;  // as PyTorch's own binding of SDPA
    // inputs the probe decides are checked before the kernel (after it, when its reads have left
    // them in cache, measured no faster), larger ones after it, one by one on the work queue
    finite = !decided || (square ? values_finite(q) && values_finite(k)
                                 : all_finite3(q, k, v, check));
    if (finite && p.hooked && q.dim() < 4) {  // (L, D), (H, L, D): as views (1, .., n) on the
      // flash node, the output viewed back (ops/sdpa.py's `flash`; fewer dims: SDPA's math path)
      auto lift = [](const at::Tensor& x) {
        std::vector<int64_t> sizes(4 - x.dim(), 1);
        sizes.insert(sizes.end(), x.sizes().begin(), x.sizes().end());
        return x.view(sizes);
      };
      std::vector<int64_t> shape(q.sizes().begin(), q.sizes().end());
      shape.back() = v.size(-1);  // (.., L, Dv)
      out = at::scaled_dot_product_attention(lift(q), lift(k), lift(v), std::nullopt, 0.0,
                                             p.causal, p.scale, p.gqa);
      node = out.grad_fn();
      out = out.view(shape);
    } else if (finite) {
      out = at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, p.causal, p.scale, p.gqa);
      node = out.grad_fn();
    }
    for (int i = 0; !decided && finite && i < n_checked; ++i) finite = all_finite(*checked[i]);
    if (finite && square) shown = last_row_finite(out);
  }
  if (!finite) return verdict(0);  // 'N', or 'U' where undecided: the Python plan's rules
  if (!shown) return verdict(-1);  // 'N' (a value not finite), or 'F' (finite values overflowed)
  if (p.hooked) {
    if (node) {
      if (node->name() != kFlashNode) {  // another node: the Python plan's own fallback
        auto gone = st.plans.find(s);
        if (gone != st.plans.end()) forget(gone);
        return verdict(1);
      }
      node->add_pre_hook(std::make_unique<Twice>());
    }
  }
  return THPVariable_Wrap(std::move(out));
  END_HANDLE_TH_ERRORS
}

PyObject* keep(PyObject*, PyObject* const* a, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  if (n != 14 || !PyUnicode_Check(a[0])) {
    PyErr_SetString(PyExc_TypeError, "keep: 14 arguments, the probe's string first");
    return nullptr;
  }
  Py_ssize_t len = 0;
  const char* layout = PyUnicode_AsUTF8AndSize(a[0], &len);
  if (!layout) return nullptr;
  std::string s(layout, (size_t)len);
  if (s.empty() || (s.back() != 'F' && s.back() != 'U') ||
      !key_of(s, a[1], a[2], a[3], a[4], a[5], a[6], a[7]) ||
      (a[13] != Py_True && a[13] != Py_False) || (a[11] != Py_True && a[11] != Py_False) ||
      (a[12] != Py_None && !PyFloat_CheckExact(a[12])))
    Py_RETURN_FALSE;
  Plan p;
  p.hooked = PyObject_IsTrue(a[10]) == 1;
  p.causal = a[11] == Py_True;
  p.gqa = a[13] == Py_True;
  if (a[12] != Py_None) p.scale = PyFloat_AS_DOUBLE(a[12]);
  PyObject* held[3] = {a[5], a[8], a[9]};  // mask, kernel, isa: None -> nullptr
  for (PyObject*& x : held) {
    if (x == Py_None) x = nullptr;
    Py_XINCREF(x);
  }
  p.mask = held[0];
  p.kernel = held[1];
  p.isa = held[2];
  auto it = st.plans.find(s);
  if (it != st.plans.end()) {
    drop(it->second);
    it->second = p;
  } else {
    st.plans.emplace(s, p);
    st.order.push_back(s);
  }
  while (st.plans.size() > st.most && !st.order.empty()) {  // the oldest dropped
    auto old = st.plans.find(st.order.front());
    if (old == st.plans.end()) st.order.pop_front();  // (every key has its plan: not reached)
    else forget(old);
  }
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

PyObject* clear(PyObject*, PyObject* const*, Py_ssize_t) {
  for (auto& kv : st.plans) drop(kv.second);
  st.plans.clear();
  st.order.clear();
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"serve", (PyCFunction)(void (*)(void))serve, METH_FASTCALL,
     "serve(query, key, value, dropout_p, is_causal, scale, enable_gqa, mask, softcap, "
     "return_lse) -> Tensor | str | None"},
    {"keep", (PyCFunction)(void (*)(void))keep, METH_FASTCALL,
     "keep(layout, dropout_p, is_causal, scale, enable_gqa, mask, softcap, return_lse, kernel, "
     "isa, hooked, causal, run_scale, gqa) -> bool"},
    {"clear", (PyCFunction)(void (*)(void))clear, METH_FASTCALL, "clear() -> None"},
};

}  // namespace
}  // namespace attnlab_k

// (serve, keep, clear) of this build, its settings (re)set: `twice` the second-order pre-hook's
// Python half, `env` and its two keys where the kernel's switches are read, `pre_max` the probe's
// float limit, `most` the plans kept. Called through ctypes' PyDLL (the GIL held); a new reference.
extern "C" PyObject* attnlab_cheap_entry(PyObject* twice, PyObject* env, PyObject* kernel_key,
                                         PyObject* isa_key, long long pre_max, long long most) {
  using attnlab_k::st;
  for (PyObject* x : {twice, env, kernel_key, isa_key}) Py_INCREF(x);  // held for the process
  st.twice = twice;
  st.env = env;
  st.kernel_key = kernel_key;
  st.isa_key = isa_key;
  st.pre_max = pre_max;
  st.most = most > 0 ? (size_t)most : 1;
  return attnlab_k::functions(attnlab_k::kMethods, 3);
}

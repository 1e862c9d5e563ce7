// The tensor boundary of the interval kernel: checks of the (already prepared) inputs, the outputs,
// and each pass's items on the work queue (queue.h).
// Registered as torch ops in the namespace ATTNLAB_NS (one per ISA build).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <atomic>
#include <numeric>
#include <optional>
#include <tuple>
#include <vector>


#include "decode.h"
#include "interval.h"
#include "pool.h"
#include "probe.h"
#include "queue.h"
#include "tiles.h"
#include "vec.h"

using at::Tensor;
using namespace attnlab_k;

namespace {

void expect(const Tensor& t, const char* name, int dims) {
  TORCH_CHECK(t.dim() == dims && t.is_contiguous(), name, ": expected a contiguous ", dims,
              "-d tensor, got ", t.sizes());
  TORCH_CHECK(t.device().is_cpu(), name, ": expected a CPU tensor");
}

// a 4-d tensor whose every head's rows are contiguous (row stride = the last size, unit stride
// within a row): the kernel reads it in place with its batch and head strides (a view of a
// context-parallel shard's rows, a head-sliced gradient), nothing copied
void expect_rows(const Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 4 && (t.size(3) <= 1 || t.stride(3) == 1) &&
                  (t.size(2) <= 1 || t.stride(2) == t.size(3)),
              name, ": expected a 4-d tensor whose rows are contiguous, got sizes ", t.sizes(),
              " strides ", t.strides());
  TORCH_CHECK(t.device().is_cpu(), name, ": expected a CPU tensor");
}

// the per-row intervals (B|1, H|1, L) int32, ALiBi slopes (B|1, H) and the score's scalars of a
// Problem whose B, H (and L) are set
void set_rows(Problem& pr, const Tensor& lo, const Tensor& hi, int64_t L,
              const std::optional<Tensor>& slopes, double scale, double softcap,
              int64_t pos_off) {
  expect(lo, "lo", 3);
  expect(hi, "hi", 3);
  TORCH_CHECK(lo.scalar_type() == at::kInt && hi.scalar_type() == at::kInt &&
                  lo.sizes() == hi.sizes(), "lo, hi: int32 of one shape");
  pr.Bl = lo.size(0);
  pr.Hl = lo.size(1);
  TORCH_CHECK((pr.Bl == 1 || pr.Bl == pr.B) && (pr.Hl == 1 || pr.Hl == pr.H) && lo.size(2) == L,
              "lo: expected (B|1, H|1, L), got ", lo.sizes());
  pr.lo_sb = pr.Bl > 1 ? lo.stride(0) : 0;
  pr.lo_sh = pr.Hl > 1 ? lo.stride(1) : 0;
  pr.lo = lo.data_ptr<int32_t>();
  pr.hi = hi.data_ptr<int32_t>();
  pr.slopes = nullptr;
  pr.slope_sb = 0;
  if (slopes.has_value()) {
    const Tensor& s = *slopes;
    expect(s, "slopes", 2);
    TORCH_CHECK(s.scalar_type() == at::kFloat && (s.size(0) == 1 || s.size(0) == pr.B) &&
                    s.size(1) == pr.H, "slopes: expected float32 (B|1, H), got ", s.sizes());
    pr.slopes = s.data_ptr<float>();
    pr.slope_sb = s.size(0) > 1 ? s.stride(0) : 0;
  }
  pr.scale = (float)scale;
  pr.softcap = (float)softcap;
  pr.pos_off = (int)pos_off;
}

// what both entries read alike from q (B, H, ·, D), float32 rows already checked, and their keys
// (B, Hkv, ...): the sizes B, H, D, Hkv and q's address and strides; the rest is each entry's own
Problem from_q(const Tensor& q, const Tensor& k) {
  Problem pr{};
  pr.B = q.size(0);
  pr.H = q.size(1);
  pr.D = q.size(3);
  pr.Hkv = k.size(1);
  pr.q = q.data_ptr<float>();
  pr.q_sb = q.stride(0);
  pr.q_sh = q.stride(1);
  return pr;
}

Problem make_problem(const Tensor& q, const Tensor& kt, const Tensor& v, const Tensor& lo,
                     const Tensor& hi, const std::optional<Tensor>& slopes, double scale,
                     double softcap, int64_t pos_off, int64_t Dv) {
  expect_rows(q, "q");
  expect(kt, "kt", 5);
  expect_rows(v, "v");
  TORCH_CHECK(q.scalar_type() == at::kFloat && kt.scalar_type() == at::kFloat &&
                  v.scalar_type() == at::kFloat, "q, kt, v: expected float32");
  Problem pr = from_q(q, kt);
  pr.L = q.size(2);
  pr.S = v.size(2);
  pr.Dv = Dv;
  pr.S16 = kt.size(2) * PAD;
  pr.ldv = v.size(3);
  pr.ldk = (pr.D + PAD - 1) / PAD * PAD;
  TORCH_CHECK(kt.size(0) == pr.B && kt.size(3) == pr.D && kt.size(4) == PAD && pr.S16 >= pr.S,
              "kt: expected (B, Hkv, S16/PAD, D, PAD), got ", kt.sizes());
  TORCH_CHECK(v.size(0) == pr.B && v.size(1) == pr.Hkv && pr.ldv % PAD == 0 && pr.ldv >= Dv,
              "v: expected (B, Hkv, S, Dv padded), got ", v.sizes());
  TORCH_CHECK(pr.Hkv > 0 && pr.H % pr.Hkv == 0, "H must be a multiple of Hkv");
  set_rows(pr, lo, hi, pr.L, slopes, scale, softcap, pos_off);
  pr.kt = kt.data_ptr<float>();
  pr.v = v.data_ptr<float>();
  pr.v_sb = v.stride(0);
  pr.v_sh = v.stride(1);
  return pr;
}

// a result this large is written past the caches (streaming stores): it would not stay in them,
// and a cached store first reads every line it writes (transposing 32 MiB of keys: 5 ms -> 1.3)
constexpr int64_t STREAM_BYTES = int64_t(8) << 20;

// every large result and temporary comes from the pool (pool.h), advised to huge pages
Tensor empty_big(at::IntArrayRef sizes, const at::TensorOptions& opts) {
  return pooled_empty(sizes, opts);
}

Tensor zeros_big(at::IntArrayRef sizes, const at::TensorOptions& opts) {
  Tensor t = empty_big(sizes, opts);
  std::memset(t.data_ptr(), 0, t.numel() * t.element_size());
  return t;
}

std::vector<double> query_costs(const Problem& pr, const Panels& pn) {
  std::vector<double> cost((int64_t)pr.B * pr.H * pn.P);
  for (int b = 0; b < pr.B; ++b)
    for (int h = 0; h < pr.H; ++h)
      for (int p = 0; p < pn.P; ++p) {
        const int64_t at = pn.at(b, h, p);
        cost[((int64_t)b * pr.H + h) * pn.P + p] =
            (double)pn.live[at] * std::max(0, pn.khi[at] - pn.klo[at]);
      }
  return cost;
}

// check: also whether every query row of a panel with work and every value row a group read is
// finite (false when not checked: nothing is claimed); with keys_last_checked's keys, whether
// the call read any NaN/Inf
std::tuple<Tensor, Tensor, bool> fwd(const Tensor& q, const Tensor& kt, const Tensor& v,
                                     const Tensor& lo, const Tensor& hi,
                                     const std::optional<Tensor>& slopes, double scale,
                                     double softcap, int64_t pos_off, int64_t Dv, bool check) {
  Problem pr = make_problem(q, kt, v, lo, hi, slopes, scale, softcap, pos_off, Dv);
  Tensor out = empty_big({pr.B, pr.H, pr.L, pr.Dv}, q.options());
  Tensor lse = at::empty({pr.B, pr.H, pr.L}, q.options());
  const Panels pn = make_panels(pr);
  float* o = out.data_ptr<float>();
  float* l = lse.data_ptr<float>();
  pr.stream_out = out.numel() * 4 >= STREAM_BYTES && pr.Dv % W == 0 &&
                  reinterpret_cast<uintptr_t>(o) % 64 == 0;
  std::atomic<bool> bad{false};
  const std::vector<double> cost = query_costs(pr, pn);
  run_items(by_cost(cost), fwd_scratch(pr), [&](int64_t item, float* buf) {
    fwd_item(pr, pn, item, o, l, buf, check ? &bad : nullptr);
  }, compute_ns(total(cost), pr.D + pr.Dv));  // S = QKᵀ, O += PV
  return {out, lse, check && !bad.load()};
}

std::tuple<Tensor, Tensor, Tensor> bwd(const Tensor& q, const Tensor& k, const Tensor& kt,
                                       const Tensor& v, const Tensor& vt, const Tensor& lo,
                                       const Tensor& hi, const std::optional<Tensor>& slopes,
                                       const Tensor& lse, const Tensor& delta, const Tensor& dout,
                                       double scale, double softcap, int64_t pos_off,
                                       int64_t mode) {
  const int64_t Dv = dout.size(3);
  Problem pr = make_problem(q, kt, v, lo, hi, slopes, scale, softcap, pos_off, Dv);
  expect_rows(k, "k");
  expect(vt, "vt", 5);
  expect(lse, "lse", 3);
  expect(delta, "delta", 3);
  TORCH_CHECK(dout.dim() == 4 && dout.device().is_cpu(), "dout: expected a 4-d CPU tensor, got ",
              dout.sizes());
  TORCH_CHECK(k.size(2) == pr.S && k.size(3) == pr.ldk, "k: expected (B, Hkv, S, D padded)");
  TORCH_CHECK(vt.size(2) * PAD == pr.S16 && vt.size(3) == Dv, "vt: expected (B, Hkv, S16/PAD, Dv, PAD)");
  TORCH_CHECK(dout.size(2) == pr.L && lse.size(2) == pr.L && delta.size(2) == pr.L,
              "dout, lse, delta: one row per query");
  TORCH_CHECK(k.size(0) == pr.B && k.size(1) == pr.Hkv && dout.size(0) == pr.B &&
                  dout.size(1) == pr.H && lse.size(0) == pr.B && lse.size(1) == pr.H &&
                  delta.size(0) == pr.B && delta.size(1) == pr.H,
              "k, dout, lse, delta: expected the batch and heads of kt and q");
  pr.k = k.data_ptr<float>();
  pr.k_sb = k.stride(0);
  pr.k_sh = k.stride(1);
  pr.vt = vt.data_ptr<float>();
  pr.dout = dout.data_ptr<float>();
  pr.g_sb = dout.stride(0);
  pr.g_sh = dout.stride(1);
  pr.g_sl = dout.stride(2);
  pr.g_sd = dout.stride(3);
  Tensor dq = empty_big({pr.B, pr.H, pr.L, pr.D}, q.options());
  Tensor dk = empty_big({pr.B, pr.Hkv, pr.S, pr.D}, q.options());
  Tensor dv = empty_big({pr.B, pr.Hkv, pr.S, pr.Dv}, q.options());
  const Panels pn = make_panels(pr);
  const float* pl = lse.data_ptr<float>();
  const float* pd = delta.data_ptr<float>();
  float* odq = dq.data_ptr<float>();
  float* odk = dk.data_ptr<float>();
  float* odv = dv.data_ptr<float>();
  // dK/dV items: the rows x keys they overlap, summed over the query heads of a key/value head
  const int nkp = (pr.S + KP - 1) / KP, G = pr.H / pr.Hkv;
  std::vector<double> kcost((int64_t)pr.B * pr.Hkv * nkp, 0.0);
  for (int b = 0; b < pr.B; ++b)
    for (int h = 0; h < pr.H; ++h)
      for (int p = 0; p < pn.P; ++p) {
        const int64_t at = pn.at(b, h, p);
        if (pn.live[at] == 0) continue;
        for (int kp = pn.klo[at] / KP; kp * KP < pn.khi[at]; ++kp) {
          const int w = std::min(pn.khi[at], (kp + 1) * KP) - std::max(pn.klo[at], kp * KP);
          kcost[((int64_t)b * pr.Hkv + h / G) * nkp + kp] += (double)pn.live[at] * w;
        }
      }
  // mode 1 (fused): one item per (b, hk) runs its key panels in turn and adds dS @ K into a
  // dQ accumulator its own, so S and dP are computed once (5 products, not 7); it needs enough
  // (b, hk) items to keep the threads busy. mode 2 (split): a dQ pass after the dK/dV pass.
  // mode 0 picks fused for one thread or at least two items per thread.
  const int64_t T = at::get_num_threads(), nkv = (int64_t)pr.B * pr.Hkv;
  if (mode == 1 || (mode == 0 && (T == 1 || nkv >= 2 * T))) {
    const int64_t Lp = (int64_t)pn.P * BQ, ldk = pr.ldk;
    Tensor acc = zeros_big({pr.B, pr.H, Lp, ldk}, q.options());  // (B, H, P·BQ, ldk)
    float* pa = acc.data_ptr<float>();
    std::vector<double> hcost(nkv, 0.0);
    for (int64_t i = 0; i < (int64_t)kcost.size(); ++i) hcost[i / nkp] += kcost[i];
    const double work = compute_ns(total(hcost), 3 * pr.D + 2 * pr.Dv);  // S, dP, dV, dK, dQ
    run_items(by_cost(hcost), dkdv_scratch(pr), [&](int64_t kv, float* buf) {
      for (int kp = 0; kp < nkp; ++kp)  // a panel no row attends still writes its zeros
        dkdv_item(pr, pn, pl, pd, kv * nkp + kp, odk, odv, pa, buf);
      const int64_t b = kv / pr.Hkv, hk = kv % pr.Hkv;
      for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {  // dQ = acc · scale
        const float* a = pa + (b * pr.H + h) * Lp * ldk;
        float* o = odq + (b * pr.H + h) * pr.L * pr.D;
        for (int64_t i = 0; i < pr.L; ++i)
          for (int d = 0; d < pr.D; ++d) o[i * pr.D + d] = a[i * ldk + d] * pr.scale;
      }
    }, work);
    return {dq, dk, dv};
  }
  run_items(by_cost(kcost), dkdv_scratch(pr), [&](int64_t item, float* buf) {
    dkdv_item(pr, pn, pl, pd, item, odk, odv, nullptr, buf);
  }, compute_ns(total(kcost), 2 * pr.D + 2 * pr.Dv));  // S, dP, dV, dK
  const std::vector<double> qcost = query_costs(pr, pn);
  run_items(by_cost(qcost), dq_scratch(pr), [&](int64_t item, float* buf) {
    dq_item(pr, pn, pl, pd, item, odq, buf);
  }, compute_ns(total(qcost), 2 * pr.D + pr.Dv));  // S, dP, dQ
  return {dq, dk, dv};
}

// (B, H, R, S_out) exact rows of the weights (weights.cpp): idx (R,) int64 the requested rows,
// q (B, H, ·, D) with row q_at[r] holding row r's query (q_at None: idx, q the call's queries),
// k (B, Hkv, S, D) keys [k0, k0 + S) of the call (every requested row's interval among them),
// lse (B, H, L), lo/hi (B|1, H|1, L) the call's intervals
Tensor weights(const Tensor& q, const Tensor& k, const Tensor& idx,
               const std::optional<Tensor>& q_at, const Tensor& lse, const Tensor& lo,
               const Tensor& hi, const std::optional<Tensor>& slopes, double scale,
               double softcap, int64_t pos_off, int64_t k0, int64_t S_out) {
  expect_rows(q, "q");
  expect_rows(k, "k");
  expect(idx, "idx", 1);
  expect(lse, "lse", 3);
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
                  lse.scalar_type() == at::kFloat && idx.scalar_type() == at::kLong,
              "q, k, lse: expected float32; idx: int64");
  Problem pr = from_q(q, k);
  pr.S = k.size(2);
  pr.ldk = pr.D;
  const int64_t R = idx.size(0), L = lse.size(2);
  const Tensor& rows = q_at.has_value() ? *q_at : idx;
  expect(rows, "q_at", 1);
  TORCH_CHECK(rows.scalar_type() == at::kLong && rows.size(0) == R, "q_at: expected int64 (R,)");
  const int64_t* pq = rows.data_ptr<int64_t>();
  TORCH_CHECK(k.size(0) == pr.B && k.size(3) == pr.D && pr.Hkv > 0 && pr.H % pr.Hkv == 0,
              "k: expected (B, Hkv, S, D) with H a multiple of Hkv, got ", k.sizes());
  TORCH_CHECK(lse.size(0) == pr.B && lse.size(1) == pr.H,
              "lse: expected (B, H, L), got ", lse.sizes());
  set_rows(pr, lo, hi, L, slopes, scale, softcap, pos_off);
  TORCH_CHECK(k0 >= 0 && k0 + pr.S <= S_out, "k0: keys [k0, k0 + S) must lie in [0, S_out)");
  const int64_t* pi = idx.data_ptr<int64_t>();
  const int32_t *plo = pr.lo, *phi = pr.hi;
  double entries = 0;  // (row, key) pairs scored, for the helpers' count
  for (int64_t r = 0; r < R; ++r) {  // every row's interval inside the keys given
    TORCH_CHECK(pi[r] >= 0 && pi[r] < L, "idx: row ", pi[r], " outside [0, ", L, ")");
    TORCH_CHECK(pq[r] >= 0 && pq[r] < q.size(2), "q_at: row ", pq[r], " outside [0, ",
                q.size(2), ")");
    for (int64_t bh = 0; bh < (int64_t)pr.Bl * pr.Hl; ++bh) {
      const int32_t a = plo[bh * L + pi[r]], e = phi[bh * L + pi[r]];
      TORCH_CHECK(a >= e || (a >= k0 && e <= k0 + pr.S), "k: row ", pi[r], "'s keys [", a,
                  ", ", e, ") are not among the keys given [", k0, ", ", k0 + pr.S, ")");
      entries += std::max(0, e - a);
    }
  }
  pr.k = k.data_ptr<float>();
  pr.k_sb = k.stride(0);
  pr.k_sh = k.stride(1);
  const WeightRows wr{(int)R, (int)L, (int)S_out, (int)k0, pi, pq, lse.data_ptr<float>()};
  Tensor out = lazy_zeros({pr.B, pr.H, R, S_out}, q.options());  // written only where attended
  float* po = out.data_ptr<float>();
  const int64_t items = (int64_t)pr.B * pr.H * ((R + RQ - 1) / RQ);
  std::vector<int64_t> order(items);
  std::iota(order.begin(), order.end(), 0);
  // entries counted per (b|1, h|1) interval: as many (b, h) pairs share each
  const double work = compute_ns(entries * pr.B * pr.H / ((int64_t)pr.Bl * pr.Hl), pr.D);
  run_items(order, weights_scratch(pr),
            [&](int64_t item, float* buf) { weights_item(pr, wr, item, po, buf); }, work);
  return out;
}

// (B, Hkv, S, n) -> (B, Hkv, S16/PAD, n, PAD): Kᵀ in chunks of PAD keys, zero keys past S
// (tiles.h: chunked); whole chunks as blocks transposed in registers, in parallel over runs of
// chunks.
// (PyTorch's strided copy of the same runs ~6x slower than even a plain loop.)
// bad (or null): set when x holds a NaN/Inf, checked as each chunk is read
Tensor keys_last_into(const Tensor& x, std::atomic<bool>* bad) {
  expect_rows(x, "x");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "x: expected float32");
  const int64_t BH = x.size(0) * x.size(1), H = x.size(1), S = x.size(2), n = x.size(3);
  const int64_t sb = x.stride(0), sh = x.stride(1);
  const int64_t nc = (S + PAD - 1) / PAD, per = 64;  // chunks per work item
  const int64_t runs = (nc + per - 1) / per;
  Tensor out = empty_big({x.size(0), x.size(1), nc, n, PAD}, x.options());
  const float* src = x.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const bool stream = x.numel() * 4 >= STREAM_BYTES &&
                      reinterpret_cast<uintptr_t>(dst) % 64 == 0;
  std::vector<int64_t> order(BH * runs);
  std::iota(order.begin(), order.end(), 0);
  run_items(order, 0, [&](int64_t item, float*) {
    const int64_t bh = item / runs, c1 = std::min(nc, (item % runs + 1) * per);
    for (int64_t c = (item % runs) * per; c < c1; ++c) {
      const float* xs = src + (bh / H) * sb + (bh % H) * sh + c * PAD * n;  // PAD rows of n
      float* o = dst + (bh * nc + c) * n * PAD;        // (n, PAD)
      if (c + 2 < c1)  // the chunk after next: its lines arrive while these are transposed
        for (int64_t l = 0; l < PAD * n; l += 16) __builtin_prefetch(xs + 2 * PAD * n + l);
      const int rows = (int)std::min<int64_t>(PAD, S - c * PAD);
      key_chunk(xs, n, rows, o, stream);
      if (bad && !finite_span(xs, rows * n)) bad->store(true, std::memory_order_relaxed);
    }
    vfence();
  }, stream_ns(2.0 * x.numel()));  // read and written once
  return out;
}

Tensor keys_last(const Tensor& x) { return keys_last_into(x, nullptr); }

// (keys_last(x), no NaN/Inf in x): the check rides on the transpose's reads
std::tuple<Tensor, bool> keys_last_checked(const Tensor& x) {
  std::atomic<bool> bad{false};
  Tensor kt = keys_last_into(x, &bad);
  return {kt, !bad.load()};
}

// (B, H, S, n) float32 whose every head's rows are contiguous -> (B, H, S, width) with zeros past
// n: the padded rows the kernel reads (head dims not a multiple of PAD), made on the kernel's
// queue. PyTorch's strided copy of the same runs on OpenMP, whose threads then spin against the
// kernel's own (D = 24 at 2 threads: the forward took as long as on one).
Tensor rows_padded(const Tensor& x, int64_t width) {
  expect_rows(x, "x");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "x: expected float32");
  const int64_t H = x.size(1), S = x.size(2), n = x.size(3);
  TORCH_CHECK(width >= n, "width: expected at least the rows' ", n, " values, got ", width);
  Tensor out = empty_big({x.size(0), H, S, width}, x.options());
  const float* src = x.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const int64_t sb = x.stride(0), sh = x.stride(1);
  run_ranges(x.size(0) * H * S, std::max<int64_t>(1, GLUE_CHUNK / std::max<int64_t>(width, 1)),
             stream_ns((double)(n + width)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {  // row r of head bh = r / S
      const int64_t bh = r / S;
      const float* xs = src + (bh / H) * sb + (bh % H) * sh + (r % S) * n;
      float* o = dst + r * width;
      std::copy(xs, xs + n, o);
      std::fill(o + n, o + width, 0.0f);
    }
  });
  return out;
}


// where each row of x starts: a row index -> element offset, for any strides of the leading dims
struct RowIndex {
  std::vector<int64_t> size, stride;  // the leading dims, innermost last
  explicit RowIndex(const Tensor& x) {
    for (int64_t i = 0; i + 1 < x.dim(); ++i) {
      size.push_back(x.size(i));
      stride.push_back(x.stride(i));
    }
  }
  int64_t at(int64_t r) const {
    int64_t off = 0;
    for (int64_t i = (int64_t)size.size() - 1; i >= 0; --i) {
      off += r % size[i] * stride[i];
      r /= size[i];
    }
    return off;
  }
};

// Σ x[k·sx]·y[k·sy] over k < n: vectors where both strides are 1; a row of one value repeated
// (stride 0) is that value times the other row's sum
static inline float row_dot_1(const float* x, int64_t sx, const float* y, int64_t sy, int64_t n) {
  if (sx == 0) {
    std::swap(x, y);
    std::swap(sx, sy);
  }
  vf acc = vzero();
  int64_t k = 0;
  if (sy == 0) {
    if (sx == 1)
      for (; k + W <= n; k += W) acc = vadd(acc, vload(x + k));
    float t = hsum(acc);
    for (; k < n; ++k) t += x[k * sx];
    return t * y[0];
  }
  if (sx == 1 && sy == 1)
    for (; k + W <= n; k += W) acc = vfma(vload(x + k), vload(y + k), acc);
  float t = hsum(acc);
  for (; k < n; ++k) t += x[k * sx] * y[k * sy];
  return t;
}

// (...) the dot products of the rows of a and b, float32 CPU tensors of one shape (..., n), any
// strides: the backward's delta = rowsum(dO ∘ O), read in place (dO may be the gradient of a sum:
// one value expanded)
Tensor row_dot(const Tensor& a, const Tensor& b) {
  TORCH_CHECK(a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat &&
                  a.sizes() == b.sizes() && a.dim() >= 1 && a.device().is_cpu() &&
                  b.device().is_cpu(),
              "row_dot: two float32 CPU tensors of one shape, got ", a.sizes(), " and ",
              b.sizes());
  const int64_t n = a.size(-1), N = n ? a.numel() / n : 0;
  Tensor out = at::empty(a.sizes().slice(0, a.dim() - 1), a.options());
  const float *pa = a.data_ptr<float>(), *pb = b.data_ptr<float>();
  const int64_t sa = a.stride(-1), sb = b.stride(-1);
  const RowIndex ia(a), ib(b);
  float* po = out.data_ptr<float>();
  run_ranges(N, std::max<int64_t>(1, GLUE_CHUNK / std::max<int64_t>(n, 1)), stream_ns(2 * n),
             [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) po[r] = row_dot_1(pa + ia.at(r), sa, pb + ib.at(r), sb, n);
  });
  return out;
}

int64_t simd_width() { return W; }

// vexp (fn 0) or vtanh (fn 1) of every float of x (n,), computed by this build's own vec.h code
// W lanes at a time: what tests/ops/test_kernel_math.py measures against float64
Tensor math_probe(const Tensor& x, int64_t fn) {
  expect(x, "x", 1);
  TORCH_CHECK(x.scalar_type() == at::kFloat, "x: expected float32");
  TORCH_CHECK(fn == 0 || fn == 1, "fn: expected 0 (vexp) or 1 (vtanh), got ", fn);
  Tensor out = at::empty({x.numel()}, x.options());
  const float* p = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); i += W) {
    const int w = (int)std::min<int64_t>(W, x.numel() - i);
    float lane[W] = {};
    std::copy(p + i, p + i + w, lane);
    vstore(lane, fn == 0 ? vexp(vload(lane)) : vtanh(vload(lane)));
    std::copy(lane, lane + w, o + i);
  }
  return out;
}

// The FMA ceiling of one core for this build: `iters` rounds of independent multiply-adds on
// registers (no memory), what a perfectly fed GEMM would do; returns the flops, the caller times it
double fma_ceiling(int64_t iters) { return fma_loop(iters); }

// the bytes of freed blocks the pool holds for the next calls (pool.h)
int64_t pool_cached_bytes() { return (int64_t)Pool::get().cached_bytes(); }

// return cached blocks to the system until at most `keep` bytes stay (pool.h); the bytes freed
int64_t pool_trim(int64_t keep) { return (int64_t)Pool::get().trim(keep > 0 ? (size_t)keep : 0); }

// float32 zeros of `size` on the CPU, a large one from the pool: memory freed by an earlier
// call, so no page of it faults in again (a context-parallel call's accumulators)
Tensor pool_zeros(at::IntArrayRef size) { return zeros_big(size, at::TensorOptions().dtype(at::kFloat)); }

}  // namespace

#define ATTNLAB_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
ATTNLAB_LIBRARY(ATTNLAB_NS, m) {
  m.def("fwd(Tensor q, Tensor kt, Tensor v, Tensor lo, Tensor hi, Tensor? slopes, float scale, "
        "float softcap, int pos_off, int Dv, bool check=False) -> (Tensor, Tensor, bool)", &fwd);
  m.def("bwd(Tensor q, Tensor k, Tensor kt, Tensor v, Tensor vt, Tensor lo, Tensor hi, "
        "Tensor? slopes, Tensor lse, Tensor delta, Tensor dout, float scale, float softcap, "
        "int pos_off, int mode) -> (Tensor, Tensor, Tensor)", &bwd);
  m.def("keys_last(Tensor x) -> Tensor", &keys_last);
  m.def("rows_padded(Tensor x, int width) -> Tensor", &rows_padded);
  m.def("keys_last_checked(Tensor x) -> (Tensor, bool)", &keys_last_checked);
  m.def("weights(Tensor q, Tensor k, Tensor idx, Tensor? q_at, Tensor lse, Tensor lo, Tensor hi, "
        "Tensor? slopes, float scale, float softcap, int pos_off, int k0, int S_out) -> Tensor",
        &weights);
  m.def("simd_width() -> int", &simd_width);
  m.def("math_probe(Tensor x, int fn) -> Tensor", &math_probe);
  m.def("all_finite(Tensor x) -> bool", &all_finite);
  m.def("row_dot(Tensor a, Tensor b) -> Tensor", &row_dot);
  m.def("fma_ceiling(int iters) -> float", &fma_ceiling);
  m.def("pool_cached_bytes() -> int", &pool_cached_bytes);
  m.def("pool_trim(int keep) -> int", &pool_trim);
  m.def("pool_zeros(int[] size) -> Tensor", &pool_zeros);
  m.def("decode(Tensor q, Tensor k, Tensor v, Tensor? lo, Tensor? hi, Tensor? slopes, float scale, "
        "float softcap, int pos_off, int chunk=0, bool check=False) -> (Tensor, Tensor, bool)",
        &attnlab_k::decode);
  m.def("decode_bf16_path() -> int", &attnlab_k::decode_bf16_path);
  m.def("probe(Tensor q, Tensor k, Tensor v, int check) -> str", &attnlab_k::probe);
}

// The work queue of every pass: one call's items, handed out costliest first to the calling
// thread and its helpers; the call waits for the items claimed, never for a thread.
#pragma once
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

namespace attnlab_k {

// items in order of decreasing cost, so the last ones to start are short (dynamic balance)
inline std::vector<int64_t> by_cost(const std::vector<double>& cost) {
  std::vector<int64_t> order(cost.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return cost[a] > cost[b]; });
  return order;
}

// one call's work items, shared with helper tasks that may start after the call has returned
struct Queue {
  std::atomic<int64_t> next{0}, done{0};
  int64_t n = 0;
  std::mutex mu;
  std::condition_variable cv;
};

// A helper is woken for each HELPER_NS of a pass's work (one thread's time, estimated): waking
// one costs tens of microseconds, more than the whole pass of a small call (L = 16 causal: a
// second thread made the call 1.5x slower)
constexpr double HELPER_NS = 200e3;

// the CPU the calling thread runs on now (-1 where unknown)
inline int caller_cpu() {
#if defined(__linux__)
  return sched_getcpu();
#else
  return -1;
#endif
}

// A helper keeps off its caller's CPU while it works (Linux; elsewhere nothing). Woken while no
// CPU is idle (other processes, a niced build, PyTorch's OpenMP threads spinning after their
// region), a helper is put on its waker's CPU, where it preempts the caller or waits behind it:
// a 2-thread decode step (GQA 32/8, D = 64, 4k, 2-vCPU VM beside niced builds) had its helper on
// the caller's CPU in all 22 calls where it started in time, the caller off its CPU a median
// 862 us of a 1082 us call while the helper computed the step alone; after torch.sum the helper
// started a median 1.3 ms late, behind the caller. Off that CPU a helper takes its share of the
// other CPUs' time instead. Its CPU mask is put back when it is done (PyTorch's pool threads
// serve other work too). Both queues run it: the decode kernel's (decode.cpp) and run_items.
class OffCpu {
 public:
  explicit OffCpu(int cpu) {
#if defined(__linux__)
    if (cpu < 0 || cpu >= CPU_SETSIZE || sched_getaffinity(0, sizeof old_, &old_) != 0 ||
        !CPU_ISSET(cpu, &old_) || CPU_COUNT(&old_) < 2)
      return;
    cpu_set_t m = old_;
    CPU_CLR(cpu, &m);
    moved_ = sched_setaffinity(0, sizeof m, &m) == 0;
#else
    (void)cpu;
#endif
  }
  ~OffCpu() {
#if defined(__linux__)
    if (moved_) sched_setaffinity(0, sizeof old_, &old_);
#endif
  }
  OffCpu(const OffCpu&) = delete;
  OffCpu& operator=(const OffCpu&) = delete;

 private:
#if defined(__linux__)
  cpu_set_t old_;
#endif
  bool moved_ = false;
};

// one thread's time for `entries` (row, key) pairs at `macs` multiply-adds each: ~100 GF/s, the
// order of this kernel's speed, plus ~1 ns a pair for its softmax (exp, max, sum, masks), which
// dominates at small head dims (D = 32: 2.4 ns a pair measured, 1.3 of them multiply-adds); a
// guess within 2x on the CPUs it builds for, enough to count helpers
inline double compute_ns(double entries, double macs) {
  return entries * (macs * 2.0 / 100.0 + 1.0);
}

// every thread pulls the next item from a shared counter until none is left, so a thread the OS
// preempts holds up at most one item. The caller works too and then waits only for the items
// claimed, never for a thread: a helper the OS starts late (a busy machine) finds the queue empty
// and returns without the caller ever waiting for it (a parallel region's join would).
// work_ns: the pass's estimated time on one thread, which bounds the helpers woken
template <class F>
void run_items(const std::vector<int64_t>& order, size_t scratch, F f, double work_ns = 1e18) {
  const int64_t n = order.size();
  const int64_t T = std::min<int64_t>({at::get_num_threads(), n,
                                       1 + (int64_t)std::min(work_ns / HELPER_NS, 1e9)});
  auto qu = std::make_shared<Queue>();
  qu->n = n;
  // order and f are touched only for a claimed item, and the caller outlives every claimed item
  const int cpu = caller_cpu();
  auto pull = [qu, &order, &f, scratch, cpu](bool helper) {
    if (qu->next.load() >= qu->n) return;
    std::optional<OffCpu> away;  // a helper: off the caller's CPU (OffCpu)
    if (helper) away.emplace(cpu);
    std::vector<float> buf(scratch + 16);
    for (int64_t i; (i = qu->next.fetch_add(1)) < qu->n;) {
      f(order[i], buf.data());
      if (qu->done.fetch_add(1) + 1 == qu->n) {
        std::lock_guard<std::mutex> g(qu->mu);
        qu->cv.notify_all();
      }
    }
  };
  for (int64_t t = 1; t < T; ++t) at::launch([pull] { pull(true); });
  pull(false);
  std::unique_lock<std::mutex> lk(qu->mu);
  qu->cv.wait(lk, [&] { return qu->done.load() >= n; });
}

// The glue's reductions, on the kernel's queue rather than PyTorch's OpenMP: an OpenMP region's
// threads spin after it ends, and on a busy machine they spin against the kernel's own threads
// (window 256 @ 4k, one busy process: 2 threads took 2.4x the CPU time of one thread)
constexpr int64_t GLUE_CHUNK = int64_t(1) << 16;  // floats per work item

// f(begin, end) over [0, n) in pieces of per; ns_each: one thread's time for one of the n
template <class F>
void run_ranges(int64_t n, int64_t per, double ns_each, F f) {
  std::vector<int64_t> order((n + per - 1) / per);
  std::iota(order.begin(), order.end(), 0);
  run_items(order, 0, [&](int64_t i, float*) { f(i * per, std::min(n, (i + 1) * per)); },
            n * ns_each);
}

// one thread's time for a pass over `floats` in memory: ~16 GB/s, streaming
inline double stream_ns(double floats) { return floats * 0.25; }

inline double total(const std::vector<double>& x) {
  return std::accumulate(x.begin(), x.end(), 0.0);
}

}  // namespace attnlab_k

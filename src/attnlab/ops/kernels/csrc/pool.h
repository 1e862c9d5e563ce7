// Large buffers of the kernel (its outputs, Kᵀ and Vᵀ, the dQ accumulator) come from a small cache
// of freed blocks. Without it each large tensor is fresh memory from the OS (glibc maps blocks of
// 32 MiB and more anew and unmaps them on free), and the first touch of fresh memory costs a page
// fault and a zeroing per page: 32 MiB take 3-6 ms, a tenth of a window forward at 16k. Smaller
// blocks come from glibc's heap, which returns its free top to the OS and faults it in again: a
// context-parallel call's one-head buffers of 2 MiB faulted 117 MiB of pages per call. A loop
// over layers and steps asks for the same sizes again and again, so freed blocks serve the next
// call. Only freed blocks are kept, at most POOL_BYTES of them; a block serves a request of 3/4 of
// its size or more. ATTNLAB_KERNEL_POOL=0 turns the cache off (every block is returned at once).
#pragma once
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <unordered_map>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace attnlab_k {

constexpr size_t POOL_MIN = size_t(1) << 20;    // smaller blocks are glibc's
constexpr size_t POOL_BYTES = size_t(512) << 20;  // freed bytes kept at most
constexpr size_t HUGE_PAGE = size_t(2) << 20;

class Pool final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    void* p = take(n);
    return {p, p, &Pool::give_back, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Pool::give_back; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  // the one pool of the library; never destroyed, since tensors may outlive static destructors
  static Pool& get() {
    static Pool* pool = new Pool();
    return *pool;
  }
  size_t cached_bytes() {
    std::lock_guard<std::mutex> g(mu_);
    return free_bytes_;
  }
  // returns freed blocks to the system, oldest first, until at most `keep` bytes stay cached; a
  // caller whose next buffers differ in size from the freed ones (a context-parallel call
  // between its passes) keeps them from sitting resident beside fresh ones. Returns bytes freed.
  size_t trim(size_t keep) {
    std::lock_guard<std::mutex> g(mu_);
    size_t freed = 0;
    while (free_bytes_ > keep && !free_.empty()) {
      auto& [q, m] = free_.back();
      free_bytes_ -= m;
      freed += m;
      size_.erase(q);
      std::free(q);
      free_.pop_back();
    }
    return freed;
  }

 private:
  Pool() {
    const char* e = std::getenv("ATTNLAB_KERNEL_POOL");
    enabled_ = !(e && (std::strcmp(e, "0") == 0 || std::strcmp(e, "off") == 0));
  }

  void* take(size_t n) {
    const size_t want = (n + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    {
      std::lock_guard<std::mutex> g(mu_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it)  // the smallest block that fits
        if (it->second >= want && it->second / 4 * 3 <= want &&
            (best == free_.end() || it->second < best->second))
          best = it;
      if (best != free_.end()) {
        void* p = best->first;
        free_bytes_ -= best->second;
        free_.erase(best);
        return p;
      }
    }
    void* p = std::aligned_alloc(HUGE_PAGE, want);  // whole huge pages
    if (!p) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    madvise(p, want, MADV_HUGEPAGE);  // advice only: where it is ignored nothing changes
#endif
    std::lock_guard<std::mutex> g(mu_);
    size_[p] = want;
    return p;
  }

  static void give_back(void* p) {
    if (!p) return;
    Pool& pool = get();
    std::lock_guard<std::mutex> g(pool.mu_);
    const size_t n = pool.size_.at(p);
    if (!pool.enabled_ || n > POOL_BYTES) {
      pool.size_.erase(p);
      std::free(p);
      return;
    }
    pool.free_.emplace_front(p, n);  // most recent first; the oldest leave first
    pool.free_bytes_ += n;
    while (pool.free_bytes_ > POOL_BYTES) {
      auto& [q, m] = pool.free_.back();
      pool.free_bytes_ -= m;
      pool.size_.erase(q);
      std::free(q);
      pool.free_.pop_back();
    }
  }

  std::mutex mu_;
  bool enabled_ = true;
  std::list<std::pair<void*, size_t>> free_;  // freed blocks, most recent first
  std::unordered_map<void*, size_t> size_;     // every live or freed block: its size
  size_t free_bytes_ = 0;
};

// at::empty, with tensors of POOL_MIN bytes or more from the pool. Under a Python dispatch mode
// (a memory ledger, a tracer) every tensor comes from at::empty, so that the mode sees it.
inline at::Tensor pooled_empty(at::IntArrayRef sizes, const at::TensorOptions& opts) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  if ((size_t)n * opts.dtype().itemsize() < POOL_MIN || c10::impl::dispatch_mode_enabled())
    return at::empty(sizes, opts);
  return at::detail::empty_generic(sizes, &Pool::get(),
                                   c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   c10::typeMetaToScalarType(opts.dtype()), std::nullopt);
}

// at::zeros for a result the kernel writes only in part (a row of weights at 16k writes 1 or 2 of
// its 16 pages per head): from 256 KiB up an anonymous mapping, whose pages the OS zeroes on their
// first touch, so only the pages written fault in (at::zeros faults in and clears all of them:
// ~1.6 us a page on a VM, 0.2 ms for one 8-head row of 16k keys)
constexpr size_t LAZY_MIN = size_t(256) << 10;

inline at::Tensor lazy_zeros(at::IntArrayRef sizes, const at::TensorOptions& opts) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  const size_t bytes = (size_t)n * opts.dtype().itemsize();
#if defined(__linux__)
  if (bytes >= LAZY_MIN && !c10::impl::dispatch_mode_enabled()) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED)
      return at::from_blob(p, sizes, [bytes](void* q) { munmap(q, bytes); }, opts);
  }
#endif
  return at::zeros(sizes, opts);
}

}  // namespace attnlab_k

// The decode kernel's helper threads: its own, not PyTorch's inter-op pool (at::launch). A
// decode step at 4k-8k keys lasts 0.3-2 ms, and waking a helper is slow where an idle CPU halts
// (a KVM guest): a futex wake costs the waking thread 10-15 us and the sleeper starts 23-42 us
// later (medians, two pinned threads of a C++ test on the 2-vCPU guest). at::launch notifies
// while it holds its pool's lock (c10::ThreadPool::run), which the woken thread then waits for,
// and copies the caller's thread-local state: in a 2-thread decode step (GQA 32/8, 4k-8k keys,
// the benchmark's rotation) the caller spent a median 45 us in it and the helper began its first
// item 101 us into the call; here, the job queued under the lock and the sleeper woken after it
// (and only when one sleeps), 41 and 82 us, and the 4k-8k two-thread steps took a median 0.975
// of their time (16 rows, six runs each in turn). The threads are started on first use, one per
// helper a call asks for, never end, and serve nothing else; a forked child starts its own. A
// helper touches no Python object and throws nothing out: the caller never waits for it and
// computes whatever it left.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#include <unistd.h>
#endif

namespace attnlab_k {

class Helpers {
 public:
  // runs job on one of the helper threads, `want` of which exist from now on (fewer where the
  // system refuses a thread; with none the job is dropped here, on the caller's thread, and the
  // caller does all the work)
  static void post(std::function<void()> job, int want) {
    Helpers& h = get();
    bool wake;
    {
      std::lock_guard<std::mutex> g(h.mu_);
      while (h.threads_ < want && h.start()) ++h.threads_;
      if (h.threads_ == 0) return;
      h.jobs_.push_back(std::move(job));
      wake = h.sleeping_ > 0;
    }
    if (wake) h.cv_.notify_one();  // after the lock: the woken thread finds it free
  }

 private:
  // the process's helpers; never destroyed (a helper may run while static destructors do), and
  // made anew in a forked child, which has none of its parent's threads (no lock taken here: a
  // lock another thread held at the fork would stay held in the child)
  static Helpers& get() {
    static std::atomic<Helpers*> cur{nullptr};
    Helpers* h = cur.load(std::memory_order_acquire);
    if (h && h->pid_ == pid()) return *h;
    Helpers* made = new Helpers();
    if (cur.compare_exchange_strong(h, made, std::memory_order_acq_rel)) return *made;
    delete made;  // another thread made them first (h is theirs now)
    return *h;
  }
  static long pid() {
#if defined(__unix__) || defined(__APPLE__)
    return (long)getpid();
#else
    return 0;
#endif
  }
  bool start() {
    try {
      std::thread([this] { loop(); }).detach();
      return true;
    } catch (const std::system_error&) {
      return false;
    }
  }
  void loop() {
#if defined(__linux__)
    pthread_setname_np(pthread_self(), "attnlab-helper");  // as tests and profilers see it
#endif
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      ++sleeping_;
      cv_.wait(lk, [this] { return !jobs_.empty(); });
      --sleeping_;
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      lk.unlock();
      try {
        job();
      } catch (...) {  // the caller computes what a helper did not
      }
      job = nullptr;  // what it held (a call's Shared) let go of outside the lock
      lk.lock();
    }
  }

  long pid_ = pid();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  int threads_ = 0, sleeping_ = 0;
};

}  // namespace attnlab_k

// How the native decoder step (decoder_step.cpp) and the head's VNNI rows (int4_amx.cpp) spread one op over the
// threads torch is given (at::get_num_threads()), chosen by `set_step_threading` (backend/kernels/load.py):
//   fork    at::parallel_for per op (an OpenMP fork/join each), and a step of under 16 tokens on the calling
//           thread alone (the first design, kept for comparison);
//   pool    a team of threads made once (`pool_team`): each op is posted to them, no fork/join; idle workers spin
//           a little, then sleep on a futex;
//   region  one OpenMP region per decoder step (one fork/join), whose other threads serve the step's ops as the
//           pool's workers do, so no second set of threads competes with torch's own OpenMP threads.
// An op is n items (column blocks of a projection, (token, query head) pairs of the attention, rows) handed
// out in runs from one atomic counter: a thread takes the next run, max(grain, left / (split * threads)) items,
// until none is left. Which thread runs an item, and in which run, changes nothing in it: every item is one
// fixed sequence of operations on one thread (int4_amx.cpp's header), so the bits are the same whatever the
// threads, the runs or a step's other tokens. The caller claims runs like any worker and waits only for runs
// already claimed, never for a worker still asleep: a worker the OS left off its core (or one lost to fork())
// costs the op its help, not a wait (a region's end, once a step, still waits for its threads to arrive).
#pragma once
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <mutex>
#include <thread>

namespace te {

enum class Threading : int { kFork = 0, kPool = 1, kRegion = 2 };

struct ThreadingConfig {
  std::atomic<int> mode{static_cast<int>(Threading::kRegion)};  // backend/kernels/load.py sets it
  std::atomic<int> spin_us{100};  // how long an idle worker spins before it sleeps
  std::atomic<int> split{1};      // runs are at most left / (split * threads) items (measured: 1 beats 2 and 4)
  std::atomic<int64_t> worker_items{0};  // items run by a team's workers, not its callers (tests read it)
};

inline ThreadingConfig& threading() {
  static ThreadingConfig config;
  return config;
}

inline Threading threading_mode() { return static_cast<Threading>(threading().mode.load(std::memory_order_relaxed)); }

class Team {
 public:
  // fn(begin, end) over [0, n) on up to `threads` threads, the caller one of them; returns when all n are done
  // (one caller at a time: a second one, or a job's own call, runs its items alone)
  template <class F>
  void run(int64_t n, int64_t grain, int threads, const F& fn) {
    if (n <= 0) return;
    if (threads <= 1 || n <= grain || running_.exchange(true)) {
      fn(int64_t{0}, n);
      return;
    }
    const uint32_t g = ++generation_;
    jobs_[g & 1] = {&call<F>, &fn, n, std::max<int64_t>(grain, 1), int64_t{threads} * threading().split.load()};
    claim_.store(static_cast<uint64_t>(g) << 32);  // publishes jobs_[g & 1] to whoever reads this claim
    post(g);
    work(g, false);
    for (int spins = 0; busy_.load() != 0; ++spins) {  // runs another thread claimed and has not finished
      _mm_pause();
      if (spins % 4096 == 4095) std::this_thread::yield();
    }
    running_.store(false);
  }

  // a worker: serves each job posted after `seen` until `open` reads false after a post
  void serve(uint32_t seen, const std::atomic<bool>& open) {
    for (;;) {
      seen = await(seen);
      if (!open.load()) return;
      work(seen, true);
    }
  }

  uint32_t posted() const { return posted_.load(); }

  // wakes the workers to read `open` (set false first): they return from serve
  void post_close() { post(++generation_); }

 private:
  struct Job {
    void (*call)(const void*, int64_t, int64_t);
    const void* fn;
    int64_t n, grain, parts;
  };
  template <class F>
  static void call(const void* fn, int64_t begin, int64_t end) {
    (*static_cast<const F*>(fn))(begin, end);
  }

  void post(uint32_t g) {
    posted_.store(g);
    if (sleepers_.load() > 0) syscall(SYS_futex, &posted_, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
  }

  // runs of job g until none is left (or g is over). busy_ counts this thread first, so a caller that saw
  // every run claimed and then busy_ == 0 knows every claimed run has finished (all seq_cst). Job g is read only
  // while the claim says g, from its own slot: the caller writes job g + 1 into the other one, and job g + 2
  // into this one only after g + 1 is done, which a thread here (counted in busy_) holds back
  void work(uint32_t g, bool worker) {
    busy_.fetch_add(1);
    const Job& job = jobs_[g & 1];
    int64_t items = 0;
    for (uint64_t c = claim_.load();;) {
      const int64_t next = static_cast<int64_t>(c & 0xFFFFFFFFu);
      if (static_cast<uint32_t>(c >> 32) != g || next >= job.n) break;
      const int64_t end = std::min(job.n, next + std::max(job.grain, (job.n - next) / job.parts));
      if (claim_.compare_exchange_weak(c, (static_cast<uint64_t>(g) << 32) | static_cast<uint64_t>(end)))
        job.call(job.fn, next, end);  // c is reloaded by a failed exchange
      else
        continue;
      items += end - next;
      c = claim_.load();
    }
    if (worker && items > 0) threading().worker_items.fetch_add(items, std::memory_order_relaxed);
    busy_.fetch_sub(1);
  }

  // the next posted generation after `seen`: spin for spin_us, then sleep on the futex
  uint32_t await(uint32_t seen) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(threading().spin_us.load());
    for (int spins = 0;; ++spins) {
      const uint32_t now = posted_.load();
      if (now != seen) return now;
      _mm_pause();
      if (spins % 256 == 255 && std::chrono::steady_clock::now() > until) break;
    }
    for (;;) {
      sleepers_.fetch_add(1);
      const uint32_t now = posted_.load();
      if (now == seen) syscall(SYS_futex, &posted_, FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
      sleepers_.fetch_sub(1);
      const uint32_t after = posted_.load();
      if (after != seen) return after;
    }
  }

  Job jobs_[2]{};  // job g in jobs_[g & 1]
  uint32_t generation_ = 0;  // the caller's: jobs posted so far
  std::atomic<bool> running_{false};  // a caller is in run
  alignas(64) std::atomic<uint64_t> claim_{0};  // generation << 32 | the next unclaimed item
  alignas(64) std::atomic<int32_t> busy_{0};
  alignas(64) std::atomic<uint32_t> posted_{0};  // the futex word: the latest generation posted
  std::atomic<int32_t> sleepers_{0};
};

// the pool: one team whose workers are made once, as many as the most threads asked for less one (never freed:
// its detached workers sleep on it until the process ends)
inline Team& pool_team(int threads) {
  static Team& team = *new Team;
  static std::atomic<bool>& open = *new std::atomic<bool>(true);
  static std::mutex lock;
  static std::atomic<int> workers{0};
  if (threads - 1 > workers.load()) {
    std::lock_guard<std::mutex> guard(lock);
    for (; workers.load() < threads - 1; ++workers)
      std::thread([seen = team.posted()] { team.serve(seen, open); }).detach();
  }
  return team;
}

// body() on the calling thread while the other threads of one OpenMP region (torch's, through at::parallel_for)
// serve `team`'s jobs; they leave when body returns or throws
template <class Body>
void in_region(int threads, Team& team, const Body& body) {
  std::atomic<bool> open{true};
  const uint32_t start = team.posted();
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t) {
    if (begin != 0) return team.serve(start, open);
    struct Close {
      std::atomic<bool>& open;
      Team& team;
      ~Close() {
        open.store(false);
        team.post_close();
      }
    } close{open, team};
    body();
  });
}

}  // namespace te

#include "thread_pool.h"

#include <fenv.h>

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

namespace lbopt {
namespace {

int default_threads() {
  if (const char* env = getenv("LBOPT_NUM_THREADS")) {
    const int n = atoi(env);
    if (n >= 1) return n;
  }
  // The cores this process may run on (taskset, cgroups' cpusets), not all cores of the machine.
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? int(hw) : 1;
}

class Pool {
 public:
  void run(int64_t n_tasks, TaskFn fn, void* ctx) {
    std::unique_lock<std::mutex> busy(run_mutex_, std::try_to_lock);
    if (!busy.owns_lock() || n_tasks == 1 || size_ == 1) {
      for (int64_t t = 0; t < n_tasks; ++t) fn(ctx, t);
      return;
    }
    ensure_workers();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fn_ = fn;
      ctx_ = ctx;
      n_tasks_ = n_tasks;
      next_.store(0);
      active_ = int(workers_.size());
      ++generation_;
    }
    wake_.notify_all();
    work();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return active_ == 0; });
  }

  void resize(int n) {
    std::lock_guard<std::mutex> busy(run_mutex_);  // waits for a running call to finish
    stop_workers();
    size_ = n >= 1 ? n : default_threads();
  }

  int size() const { return size_.load(); }

  // fork() copies only the forking thread: a child that kept the pool's workers and locks would wait for threads
  // it does not have. The pool is held idle while the process is copied (a fork waits for a running call), and
  // the child starts with fresh locks and no workers; its next parallel call starts its own.
  void before_fork() {
    run_mutex_.lock();
    mutex_.lock();
  }
  void after_fork_in_parent() {
    mutex_.unlock();
    run_mutex_.unlock();
  }
  void after_fork_in_child() {
    new std::vector<std::thread>(std::move(workers_));  // threads of the parent: never joined, never destroyed
    workers_.clear();
    new (&run_mutex_) std::mutex;
    new (&mutex_) std::mutex;
    new (&wake_) std::condition_variable;
    new (&done_) std::condition_variable;
    active_ = 0;
  }

 private:
  void work() {
    for (int64_t t; (t = next_.fetch_add(1)) < n_tasks_;) fn_(ctx_, t);
  }

  void worker_loop() {
    fesetenv(FE_DFL_ENV);  // a worker inherits its creator's environment (see fp_env.h)
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      work();
      std::lock_guard<std::mutex> lock(mutex_);
      if (--active_ == 0) done_.notify_one();
    }
  }

  void ensure_workers() {
    while (int(workers_.size()) < size_.load() - 1) workers_.emplace_back([this] { worker_loop(); });
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& w : workers_) w.join();
    workers_.clear();
    stop_ = false;
  }

  std::mutex run_mutex_;  // one parallel region at a time
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  std::atomic<int> size_{default_threads()};
  uint64_t generation_ = 0;
  bool stop_ = false;
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_tasks_ = 0;
  std::atomic<int64_t> next_{0};
  int active_ = 0;
};

// Never destroyed: joining threads from a static destructor at process exit can deadlock, and the library is
// linked with -z nodelete so it is never unloaded under running workers.
Pool& pool() {
  static Pool* p = [] {
    Pool* made = new Pool;
    pthread_atfork([] { pool().before_fork(); }, [] { pool().after_fork_in_parent(); },
                   [] { pool().after_fork_in_child(); });
    return made;
  }();
  return *p;
}

}  // namespace

void parallel_for(int64_t n_tasks, TaskFn fn, void* ctx) {
  if (n_tasks > 0) pool().run(n_tasks, fn, ctx);
}

void set_num_threads(int n) { pool().resize(n); }

int num_threads() { return pool().size(); }

}  // namespace lbopt

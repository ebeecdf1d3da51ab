// The library's own CPU thread pool (no OpenMP: a plugin inside PyTorch must not fight its OpenMP runtime).
// Workers start on first use and stay warm between calls; the calling thread works too.
#pragma once
#include <stdint.h>

namespace lbopt {

using TaskFn = void (*)(void* ctx, int64_t task);

// Run fn(ctx, t) for every t in [0, n_tasks), spread over the pool, and return when all are done. A call made
// while another thread's call occupies the pool runs on the calling thread alone; results do not depend on the
// split, only the speed does.
void parallel_for(int64_t n_tasks, TaskFn fn, void* ctx);

// n >= 1 threads in all (the caller included); 0 restores the default (LBOPT_NUM_THREADS, else all cores).
void set_num_threads(int n);
int num_threads();

}  // namespace lbopt

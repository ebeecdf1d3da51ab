// The CPU backend: spreads the work blocks of all slots of a call over the thread pool.
#include <string.h>

#include <algorithm>
#include <vector>

#include "../kernels/cpu/kernels_cpu.h"
#include "backend.h"
#include "error.h"
#include "fp_env.h"
#include "thread_pool.h"

namespace lbopt {
namespace {

// About 64K elements per task: large enough to amortize scheduling, small enough to balance two to dozens of
// threads over a call of many small tensors.
constexpr int64_t kTaskElements = 1 << 16;

struct Task {
  uint32_t slot;
  int64_t block_begin, block_end;
};

// Split the blocks of every slot not skipped into tasks; reused per thread so a warm step allocates nothing.
std::vector<Task>& make_tasks(const StepPlan& plan, const std::vector<uint8_t>& skip) {
  thread_local std::vector<Task> tasks;
  tasks.clear();
  const int64_t block = work_block_size(plan.kind);
  const int64_t per_task = std::max<int64_t>(1, kTaskElements / block);
  for (size_t s = 0; s < plan.slots.size(); ++s) {
    const int64_t n_blocks = skip[s] ? 0 : (plan.slots[s].numel + block - 1) / block;
    for (int64_t b = 0; b < n_blocks; b += per_task)
      tasks.push_back({uint32_t(s), b, std::min(n_blocks, b + per_task)});
  }
  return tasks;
}

struct NonfiniteScan {
  const StepPlan* plan;
  const std::vector<Task>* tasks;
  std::vector<uint8_t>* task_bad;  // one entry per task: no two threads write the same byte
};

struct StepRun {
  const StepPlan* plan;
  const std::vector<Task>* tasks;
  cpu::StepFlags flags;
};

lbopt_status cpu_step(const StepPlan& plan) {
  const DefaultFpEnv fp_env;
  const size_t n = plan.slots.size();
  if (plan.found_inf && *plan.found_inf != 0.0f) {  // AMP overflow: no param or state is written
    if (plan.skipped) memset(plan.skipped, 1, n);
    return LBOPT_OK;
  }
  thread_local std::vector<uint8_t> skip;
  skip.assign(n, 0);

  if (plan.flags & LBOPT_FLAG_SKIP_NONFINITE) {  // a pass over the grads before anything is written
    std::vector<Task>& tasks = make_tasks(plan, skip);
    thread_local std::vector<uint8_t> task_bad;
    task_bad.assign(tasks.size(), 0);
    NonfiniteScan scan{&plan, &tasks, &task_bad};
    parallel_for(int64_t(tasks.size()), [](void* ctx, int64_t t) {
      auto* sc = static_cast<NonfiniteScan*>(ctx);
      const Task& task = (*sc->tasks)[size_t(t)];
      const StepSlot& slot = sc->plan->slots[task.slot];
      const int64_t bs = work_block_size(sc->plan->kind);
      (*sc->task_bad)[size_t(t)] = cpu::has_nonfinite(slot.grad, slot.grad_dtype, task.block_begin * bs,
                                                      std::min(slot.numel, task.block_end * bs));
    }, &scan);
    for (size_t t = 0; t < tasks.size(); ++t) skip[tasks[t].slot] |= task_bad[t];
  }

  StepRun run{&plan, &make_tasks(plan, skip),
              {plan.hyper, plan.kind, (plan.flags & LBOPT_FLAG_BF16_STOCHASTIC_ROUND) != 0,
               plan.stochastic_states, plan.seed}};
  parallel_for(int64_t(run.tasks->size()), [](void* ctx, int64_t t) {
    auto* r = static_cast<StepRun*>(ctx);
    const Task& task = (*r->tasks)[size_t(t)];
    cpu::step_blocks(r->plan->slots[task.slot], r->flags, task.block_begin, task.block_end);
  }, &run);
  if (plan.skipped) memcpy(plan.skipped, skip.data(), n);
  return LBOPT_OK;
}

struct ConvertRun {
  const ConvertPlan* plan;
  StateCodec codec;
  int64_t per_task;
  int64_t n_blocks;
};

template <bool kToState>
lbopt_status cpu_convert(const ConvertPlan& plan) {
  const DefaultFpEnv fp_env;
  const int64_t block = work_block_size(plan.kind);
  ConvertRun run{&plan, StateCodec{plan.kind, plan.moment}, std::max<int64_t>(1, kTaskElements / block),
                 (plan.numel + block - 1) / block};
  parallel_for((run.n_blocks + run.per_task - 1) / run.per_task, [](void* ctx, int64_t t) {
    auto* r = static_cast<ConvertRun*>(ctx);
    const int64_t b0 = t * r->per_task, b1 = std::min(r->n_blocks, b0 + r->per_task);
    if (kToState) cpu::quantize_blocks(r->codec, r->plan->values, r->plan->state, r->plan->numel, b0, b1);
    else cpu::dequantize_blocks(r->codec, r->plan->state, r->plan->values, r->plan->numel, b0, b1);
  }, &run);
  return LBOPT_OK;
}

lbopt_status cpu_quantize(const ConvertPlan& plan) { return cpu_convert<true>(plan); }

lbopt_status cpu_dequantize(const ConvertPlan& plan) { return cpu_convert<false>(plan); }

lbopt_status cpu_state_init(const ConvertPlan& plan) {
  const lbopt_layout layout = layout_of(plan.kind, plan.numel);
  if (layout.codes_bytes) memset(plan.state.codes, 0, size_t(layout.codes_bytes));
  if (layout.scales_numel) memset(plan.state.scales, 0, size_t(layout.scales_numel) * sizeof(float));
  return LBOPT_OK;
}

DeviceCount cpu_devices() { return {1, ""}; }

// Host memory: validation has checked everything a host plan holds.
lbopt_status cpu_check_step(const StepPlan&) { return LBOPT_OK; }
lbopt_status cpu_check_convert(const ConvertPlan&, const char*, const char*) { return LBOPT_OK; }

}  // namespace

const Backend& cpu_backend() {
  static const Backend b{"cpu",          DeviceClass::kHost, cpu_devices,     cpu_check_step, cpu_check_convert,
                         cpu_step,       cpu_quantize,       cpu_dequantize,  cpu_state_init};
  return b;
}

}  // namespace lbopt

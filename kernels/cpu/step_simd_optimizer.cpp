// The SIMD step of one optimizer, LBOPT_SIMD_OPTIMIZER (its type in optimizers.h), for every state kind and
// Highway target (runtime dispatch). meson.build compiles this unit once per optimizer: the step loops are most
// of the library's compile time, and units of their own build in parallel. step_simd.cpp dispatches to them.
#ifndef LBOPT_SIMD_OPTIMIZER
#error "LBOPT_SIMD_OPTIMIZER names the optimizer this unit compiles (meson.build sets it)"
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/step_simd_optimizer.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/cpu/step_loops-inl.h"

HWY_BEFORE_NAMESPACE();
namespace lbopt::cpu {
namespace HWY_NAMESPACE {
namespace {  // every unit has its own StepOptimizer

#if LBOPT_EXACT_FMA
template <class Opt, class... Ks>
constexpr std::array<StepFn, sizeof...(Ks)> loops_of(TypeList<Ks...>) {
  return {&StepLoops<Opt, Ks>::run...};
}

int64_t StepOptimizer(const StepSlot& slot, const StepFlags& flags, int64_t b0, int64_t b1) {
  static constexpr auto kLoops = loops_of<LBOPT_SIMD_OPTIMIZER>(Kinds());
  return kLoops[size_t(flags.kind)](slot, flags, b0, b1);
}
#else
int64_t StepOptimizer(const StepSlot&, const StepFlags&, int64_t b0, int64_t) { return b0; }
#endif

}  // namespace
}  // namespace HWY_NAMESPACE
}  // namespace lbopt::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lbopt::cpu {

HWY_EXPORT(StepOptimizer);

template <>
int64_t step_blocks_simd_of<LBOPT_SIMD_OPTIMIZER>(const StepSlot& slot, const StepFlags& flags, int64_t b0,
                                                  int64_t b1) {
  return HWY_DYNAMIC_DISPATCH(StepOptimizer)(slot, flags, b0, b1);
}

}  // namespace lbopt::cpu
#endif  // HWY_ONCE

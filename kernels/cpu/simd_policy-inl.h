// The SIMD kernels' choices per Highway target and per loop, one line of reason each; the measured effect of
// every choice is in docs/benchmarks.md, "CPU loop choices", under the name given here in bold. Included once per
// target by the SIMD units (foreach_target sources), after <hwy/highway.h> and outside any namespace.
#if defined(LBOPT_KERNELS_CPU_SIMD_POLICY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LBOPT_KERNELS_CPU_SIMD_POLICY_INL_H_
#undef LBOPT_KERNELS_CPU_SIMD_POLICY_INL_H_
#else
#define LBOPT_KERNELS_CPU_SIMD_POLICY_INL_H_
#endif

#include <hwy/highway.h>

#include "kernels/state_kinds.h"
#include "kernels/step_args.h"

// Only targets with a fused multiply-add run the SIMD kernels: their results are then bit-identical to the
// portable kernels' (tests/cpu/test_simd.cpp); other targets leave every block to the portable kernels.
#undef LBOPT_EXACT_FMA
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_NEON || \
    HWY_TARGET == HWY_SVE || HWY_TARGET == HWY_SVE2 || HWY_TARGET == HWY_SVE_256 || HWY_TARGET == HWY_SVE2_128
#define LBOPT_EXACT_FMA 1
#else
#define LBOPT_EXACT_FMA 0
#endif

// **bf16 store**: AVX512_BF16's vcvtneps2bf16, where the CPU has it (Highway 1.0.3 has no target for it, so the
// instruction is written in assembly: simd_values-inl.h).
#undef LBOPT_BF16_CONVERT
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define LBOPT_BF16_CONVERT 1
#else
#define LBOPT_BF16_CONVERT 0
#endif

// **shaped loops**: not in the sanitizer builds, which compile the general loops alone (the same code without
// the constants): the shaped ones quadrupled their compile time.
#undef LBOPT_SHAPED_LOOPS
#if defined(__SANITIZE_ADDRESS__)
#define LBOPT_SHAPED_LOOPS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LBOPT_SHAPED_LOOPS 0
#endif
#endif
#ifndef LBOPT_SHAPED_LOOPS
#define LBOPT_SHAPED_LOOPS 1
#endif

// Choices that need a target's intrinsics, as macros for the #if around them:
// **4-bit decode** and **4-bit pack**: x86 byte shuffles and packs take fewer instructions than the generic forms
#undef LBOPT_X86_NIBBLES
#define LBOPT_X86_NIBBLES (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2)
// **8-bit decode**: eight scalar loads joined by shuffles beat a gather on Zen 3; Intel's AVX-512 gathers faster
#undef LBOPT_SCALAR_LOOKUP256
#define LBOPT_SCALAR_LOOKUP256 (HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2)

HWY_BEFORE_NAMESPACE();
namespace lbopt::cpu {
namespace HWY_NAMESPACE {

// What an instantiation of the step loop fixes at compile time: the dtypes of param and grad and the state count,
// or -1 for "read from the slot", and whether the gradient factor is 1 (its exact product then left out). With no
// dtype or state-count branch left in the vector loop, the compiler keeps its constants in registers.
template <int kDtype, int kStates, bool kUnitGrad = false, int kGradDtype = kDtype>
struct Shape {
  static constexpr int dtype = kDtype, grad_dtype = kGradDtype, states = kStates;
  static constexpr bool unit_grad = kUnitGrad;
};
using AnyShape = Shape<-1, -1>;

// The choices of this target.
struct TargetPolicy {
  static constexpr bool x86 = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2;
  static constexpr bool x86_avx512 = HWY_ARCH_X86 && HWY_TARGET < HWY_AVX2;
  static constexpr bool x86_avx2 = HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2;
  // **unsigned 4-bit decode**: (code + 1) s / 16 by arithmetic, where a 16-entry table costs two permutes and a blend
  static constexpr bool linear_decode4 = x86_avx2;
  // How far ahead of the elements being updated a **prefetch** reaches, in elements
  static constexpr int64_t prefetch_ahead = 1024;
};

// The choices of the step loop of optimizer Opt, kind K and shape S on this target.
template <class Opt, class K, class S>
struct LoopPolicy {
  static constexpr bool quantized = !K::float_codes;
  // **prefetch**: the shaped loops only (the general loops, whose sizes are read at run time, ran slower with it)
  static constexpr bool prefetch = S::dtype >= 0;
  // **pipelined encode**: an update bound by its divider and an encode by integer and permute work fill each
  // other's idle units on AVX-512, but for the loops that gain more from the two-pass update; on AVX2 (Zen 3)
  // only one-state 8-bit loops gain (the gathers' latency hidden); unmeasured targets encode after the update
  static constexpr bool pipelined =
      TargetPolicy::x86_avx512 ? quantized && !(Opt::kTwoPass && (S::dtype == kBfloat16 || S::dtype == kFloat16 ||
                                                                  (S::states >= 3 && K::id != kStateFp8)))
      : TargetPolicy::x86_avx2 ? K::id == kState8Bit && S::states < 3 && !Opt::kTwoPass
                               : false;
  // **two-pass update**: update_states in the update loop, update_param beside the encode, so that the divisions
  // of both loops overlap on the divider; x86, where a block is encoded after its update
  static constexpr bool two_pass = TargetPolicy::x86 && Opt::kTwoPass && quantized && !pipelined;
};

}  // namespace HWY_NAMESPACE
}  // namespace lbopt::cpu
HWY_AFTER_NAMESPACE();

#endif  // include guard

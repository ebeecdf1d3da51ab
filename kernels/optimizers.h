// The optimizers of the step engine: Optimizers below is the only list of them. Each lives in one file under optim/
// (its descriptor, its scalars and their derivation from the hyper-parameters, its states and its element update);
// the scalars union, with_optimizer and make_scalars follow from the list.
#ifndef LBOPT_OPTIMIZERS_H
#define LBOPT_OPTIMIZERS_H
#include <type_traits>

#include "optim/adamw.h"
#include "optim/ademamix.h"
#include "optim/lion.h"
#include "optim/muon.h"
#include "optim/sgd.h"
#include "type_list.h"

namespace lbopt {

// In lbopt_optimizer order (OptimizerId): an optimizer's index is its id.
using Optimizers = TypeList<AdamW, Sgd, Lion, AdEMAMix, Muon>;
static_assert(Optimizers::size == kNumOptimizers, "one list entry per OptimizerId");

// One slot's derived scalars, whichever the optimizer: a union of every optimizer's Scalars.
template <class... Opts>
union ScalarsUnion;
template <>
union ScalarsUnion<> {};
template <class First, class... Rest>
union ScalarsUnion<First, Rest...> {
  typename First::Scalars first;
  ScalarsUnion<Rest...> rest;

  template <class Opt>
  LBOPT_HD const typename Opt::Scalars& get() const {
    if constexpr (std::is_same<Opt, First>::value) return first;
    else return rest.template get<Opt>();
  }
  template <class Opt>
  LBOPT_HD void set(const typename Opt::Scalars& s) {
    if constexpr (std::is_same<Opt, First>::value) first = s;
    else rest.template set<Opt>(s);
  }
};

template <class List>
struct ScalarsOf;
template <class... Opts>
struct ScalarsOf<TypeList<Opts...>> {
  using type = ScalarsUnion<Opts...>;
};
using OptScalars = ScalarsOf<Optimizers>::type;

// f(Opt{}) for the optimizer of that id (validation accepts no other; any other id is AdamW's).
template <class F>
LBOPT_HD decltype(auto) with_optimizer(int id, F&& f) {
  return with_entry<Optimizers>(id, static_cast<F&&>(f));
}

// The scalars a step derives from the hyper-parameters, lr and step count: once per slot on the host for a
// by-value lr, on the device for the capturable step; both run this function.
LBOPT_HD OptScalars make_scalars(const Hyper& h, double lr, int64_t step) {
  OptScalars s;
  with_optimizer(h.optimizer, [&](auto opt) {
    using Opt = decltype(opt);
    s.template set<Opt>(Opt::make(h, lr, step));
  });
  return s;
}

// The states a step of these hyper-parameters reads and writes (a prefix of the slot's states).
LBOPT_HD int active_states(const Hyper& h) {
  return with_optimizer(h.optimizer, [&](auto opt) { return decltype(opt)::states(h); });
}

// x / c, IEEE's correctly rounded quotient, for a divisor c fixed for the step and r = reciprocal_rn(c), by
// multiplications: RN(x * r) is within two ulps of x / c, one correction brings it within one, and a second
// rounds it correctly (Markstein's theorem: r within half an ulp of 1 / c). Exact for x = +0, +-inf and NaN
// (-0 gives +0), and for |x| >= 2^-99, 2^-27 <= c <= 2^27 and |x / c| in [2^-126, 2^127): there no intermediate
// underflows or overflows (tests/unit/test_div_by_scalar.cpp: every significand of x at the ends of that range
// and inside it, and random pairs). A GPU spends a reciprocal, seven fused multiply-adds and a branch to a slow
// path on a division; a CPU's vector divider is faster than this sequence (docs/benchmarks.md).
LBOPT_HD float div_by_reciprocal(float x, float c, float r) {
  float q = x * r;
  q = fmaf(fmaf(-c, q, x), r, q);
  q = fmaf(fmaf(-c, q, x), r, q);
  return isinf(x) ? x : q;  // inf * r - inf * c is NaN
}

// The element operations of the scalar (portable and CUDA) kernels; the SIMD kernels supply vector ones with
// the same rounding.
struct ScalarOps {
  using V = float;
  LBOPT_HD static float set(float x) { return x; }
  LBOPT_HD static float add(float a, float b) { return a + b; }
  LBOPT_HD static float sub(float a, float b) { return a - b; }
  LBOPT_HD static float mul(float a, float b) { return a * b; }
  LBOPT_HD static float div(float a, float b) { return a / b; }
  // x / c for a divisor fixed for the step, r = reciprocal_rn(c): the same quotient on every backend
  LBOPT_HD static float div_by_scalar(float x, float c, float r) {
#ifdef __CUDA_ARCH__
    return div_by_reciprocal(x, c, r);
#else
    (void)r;
    return x / c;
#endif
  }
  LBOPT_HD static float fma(float a, float b, float c) { return fmaf(a, b, c); }  // a * b + c, one rounding
  LBOPT_HD static float sqrt(float a) { return sqrtf(a); }
  // fmaxf spelled out, so that every backend agrees on zeros too: a NaN operand yields the other, and of equal
  // operands (-0 and +0) the first (glibc's fmaxf does that; x86's maxps returns the second)
  LBOPT_HD static float max(float a, float b) { return a >= b || b != b ? a : b; }
  // torch.sign: -1, 0 (of either sign, kept) or 1; NaN stays NaN
  LBOPT_HD static float sign(float a) { return a == 0.0f || isnan(a) ? a : copysignf(1.0f, a); }
};

}  // namespace lbopt
#endif  // LBOPT_OPTIMIZERS_H

// The optimizers of the step engine: the only list of them. Each lives in one file under optim/ (its scalars,
// their derivation from the hyper-parameters, its states and its element update); adding one adds that file and
// a line in each table below.
#ifndef LBOPT_OPTIMIZERS_H
#define LBOPT_OPTIMIZERS_H
#include "optim/adamw.h"
#include "optim/ademamix.h"
#include "optim/lion.h"
#include "optim/sgd.h"

namespace lbopt {

// One slot's derived scalars, whichever the optimizer.
union OptScalars {
  AdamW::Scalars adamw;
  Sgd::Scalars sgd;
  Lion::Scalars lion;
  AdEMAMix::Scalars ademamix;

  template <class Opt>
  LBOPT_HD const typename Opt::Scalars& get() const;
};
template <> LBOPT_HD const AdamW::Scalars& OptScalars::get<AdamW>() const { return adamw; }
template <> LBOPT_HD const Sgd::Scalars& OptScalars::get<Sgd>() const { return sgd; }
template <> LBOPT_HD const Lion::Scalars& OptScalars::get<Lion>() const { return lion; }
template <> LBOPT_HD const AdEMAMix::Scalars& OptScalars::get<AdEMAMix>() const { return ademamix; }

// f(Opt{}) for the optimizer of that id (validation accepts no other). Host code passes host-only callables (the
// CUDA launcher), device code device ones: nvcc is told not to check which side f runs on.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class F>
LBOPT_HD decltype(auto) with_optimizer(int id, F&& f) {
  switch (id) {
    case kSgd: return f(Sgd{});
    case kLion: return f(Lion{});
    case kAdEMAMix: return f(AdEMAMix{});
    default: return f(AdamW{});
  }
}

// The scalars a step derives from the hyper-parameters, lr and step count: once per slot on the host for a
// by-value lr, on the device for the capturable step; both run this function.
LBOPT_HD OptScalars make_scalars(const Hyper& h, double lr, int64_t step) {
  OptScalars s;
  switch (h.optimizer) {
    case kSgd: s.sgd = Sgd::make(h, lr, step); break;
    case kLion: s.lion = Lion::make(h, lr, step); break;
    case kAdEMAMix: s.ademamix = AdEMAMix::make(h, lr, step); break;
    default: s.adamw = AdamW::make(h, lr, step);
  }
  return s;
}

// The states a step of these hyper-parameters reads and writes (a prefix of the slot's states).
LBOPT_HD int active_states(const Hyper& h) {
  return with_optimizer(h.optimizer, [&](auto opt) { return decltype(opt)::states(h); });
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

// AdamW / Adam (with AMSGrad), in the operation order of torch.optim.AdamW's reference (single-tensor)
// implementation, so that fp32 states reproduce it bit for bit and low-bit states differ from it only by
// quantization. States: m (exp_avg), v (exp_avg_sq), and vmax (max_exp_avg_sq) with AMSGrad.
#ifndef LBOPT_OPTIM_ADAMW_H
#define LBOPT_OPTIM_ADAMW_H
#include "hyper.h"

namespace lbopt {

struct AdamW {
  static constexpr const char* kName = "adamw";
  static constexpr int kMinStates = 2;  // states(h)'s least value
  static constexpr int kMaxStates = 3;
  static constexpr const char* kStateNames[kMaxStates] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  // v and vmax on the unsigned maps (4-bit: torchao's linear one)
  LBOPT_HD static constexpr Moment moment(const Hyper&, int i) { return i > 0 ? kMomentSecond : kMomentFirst; }
  static constexpr bool kTwoPass = true;  // update_states and update_param below
  // Whether its first-moment codes round stochastically by default (on kinds whose stochastic_codes says so): no.
  // Its 4-bit states train as its fp32 ones rounded to nearest (docs/optimizers.md), and the codes stay torchao's
  // and bitsandbytes' step for step
  static constexpr bool kStochasticStates = false;

  static constexpr const char* kTitle = "AdamW/Adam";  // in its registry operators' docs
  static constexpr const char* kStateless = nullptr;     // no setting keeps no state
  static constexpr Param kParams[] = {
      {"beta1", ValueRange::kUnitOpen, 0.9},
      {"beta2", ValueRange::kUnitOpen, 0.999},
      {"eps", ValueRange::kNonneg, 1e-8},
      {"weight_decay", ValueRange::kNonneg, 0.01},
  };
  static constexpr const char* kFlagNames[] = {"adam", "amsgrad"};
  static bool refuses(const Hyper&, char*, size_t) { return false; }

  struct Scalars {
    float decay_factor;      // 1 - lr * weight_decay (AdamW, decoupled)
    float wd;                // weight_decay (Adam, coupled into the gradient)
    float one_minus_beta1;   // the lerp weight of m
    float beta2;
    float one_minus_beta2;
    float neg_step_size;     // -lr / (1 - beta1^step)
    float sqrt_bc2;          // sqrt(1 - beta2^step)
    float inv_sqrt_bc2;      // reciprocal_rn(sqrt_bc2), for O::div_by_scalar
    float eps;
    bool coupled_decay;
    bool amsgrad;
    bool lerp_from_m;        // one_minus_beta1 < 0.5: torch.lerp's branch (see update)
  };
  using Flags = FlagList<&Scalars::coupled_decay, &Scalars::lerp_from_m>;  // amsgrad: the state count says it

  LBOPT_HD static int states(const Hyper& h) { return h.amsgrad ? 3 : 2; }

  LBOPT_HD static Scalars make(const Hyper& h, double lr, int64_t step) {
    Scalars s;
    s.decay_factor = float(1.0 - lr * h.weight_decay);
    s.wd = float(h.weight_decay);
    s.one_minus_beta1 = float(1.0 - h.beta1);
    s.beta2 = float(h.beta2);
    s.one_minus_beta2 = float(1.0 - h.beta2);
    s.neg_step_size = float(-(lr / bias_correction(h.beta1, step)));
    s.sqrt_bc2 = float(pow(bias_correction(h.beta2, step), 0.5));  // as Python's bc2 ** 0.5
    s.inv_sqrt_bc2 = reciprocal_rn(s.sqrt_bc2);
    s.eps = float(h.eps);
    s.coupled_decay = h.coupled_decay;
    s.amsgrad = h.amsgrad;
    s.lerp_from_m = s.one_minus_beta1 < 0.5f;
    return s;
  }
};

}  // namespace lbopt
#endif  // LBOPT_OPTIM_ADAMW_H

#ifdef LBOPT_DEFINE_UPDATES
// The update in two parts (Opt::kTwoPass): update_states moves the moments and returns the square root of the
// second moment the update uses, update_param applies the update to p from it and the new m. update runs one after
// the other, with the same operations in the same order; the SIMD kernels may run update_param in a later pass
// over the block (step_loops-inl.h). vmax only with AMSGrad; g: the gradient times grad_factor.
template <class O>
LBOPT_HD typename O::V update_states(const ::lbopt::AdamW::Scalars& s, typename O::V p, typename O::V g,
                                     typename O::V& m, typename O::V& v, typename O::V& vmax) {
  if (s.coupled_decay) g = O::fma(O::set(s.wd), p, g);  // torch's grad.add(param, alpha=wd): one rounding
  m = torch_lerp<O>(m, g, s.one_minus_beta1, s.lerp_from_m);  // exp_avg.lerp_(grad, 1 - beta1)
  v = O::fma(O::mul(O::set(s.one_minus_beta2), g), g, O::mul(v, O::set(s.beta2)));
  if (s.amsgrad) vmax = O::max(vmax, v);
  return O::sqrt(s.amsgrad ? vmax : v);
}

// p after update_states, whose result is root; m: the new first moment. The decoupled decay of p is independent
// of the moments.
template <class O>
LBOPT_HD void update_param(const ::lbopt::AdamW::Scalars& s, typename O::V& p, typename O::V root, typename O::V m,
                           typename O::V, typename O::V) {
  if (!s.coupled_decay) p = O::mul(p, O::set(s.decay_factor));
  // root / sqrt_bc2, within div_by_reciprocal's exact range: root is the square root of a float, so 0 (-0 comes
  // back +0, which adds to eps alike), in [2^-75, 2^64], inf or NaN; sqrt_bc2 is in [2^-27, 1]
  const auto denom = O::add(O::div_by_scalar(root, s.sqrt_bc2, s.inv_sqrt_bc2), O::set(s.eps));
  p = O::add(p, O::div(O::mul(O::set(s.neg_step_size), m), denom));
}

template <class O>
LBOPT_HD void update(const ::lbopt::AdamW::Scalars& s, typename O::V& p, typename O::V g, typename O::V& m,
                     typename O::V& v, typename O::V& vmax) {
  const auto root = update_states<O>(s, p, g, m, v, vmax);
  update_param<O>(s, p, root, m, v, vmax);
}
#endif

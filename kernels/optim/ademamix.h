// AdEMAMix (Pagliardini et al. 2024, "The AdEMAMix Optimizer: Better, Faster, Older"), as bitsandbytes implements
// it: a fast EMA m1 (beta1, bias-corrected) and a slow one m2 (beta3, not bias-corrected) of the gradient mixed
// with weight alpha over Adam's denominator, weight decay added to the update, and the optional warm-ups of alpha
// (linear over t_alpha steps) and beta3 (over t_beta3 steps). States: m1, m2, nu.
#ifndef LBOPT_OPTIM_ADEMAMIX_H
#define LBOPT_OPTIM_ADEMAMIX_H
#include "hyper.h"

namespace lbopt {

struct AdEMAMix {
  static constexpr const char* kName = "ademamix";
  static constexpr int kMinStates = 3;  // states(h)'s least value
  static constexpr int kMaxStates = 3;
  static constexpr const char* kStateNames[kMaxStates] = {"m1", "m2", "nu"};
  // nu on the signed map's non-negative codes: on the unsigned linear 4-bit map, whose least value is 1/16 of the
  // block's absmax, small nu damp their elements' updates (docs/optimizers.md, "Which state kind to train with")
  LBOPT_HD static constexpr Moment moment(const Hyper& h, int i) {
    return i < 2 ? kMomentFirst : h.nu_linear_map ? kMomentSecond : kMomentSecondSigned;
  }
  static constexpr bool kTwoPass = true;  // update_states and update_param below
  // Whether its first-moment codes round stochastically by default (on kinds whose stochastic_codes says so): yes.
  // Rounded to nearest, the averages lag their fp32 values (docs/optimizers.md, "Which state kind to train with")
  static constexpr bool kStochasticStates = true;

  static constexpr const char* kTitle = "AdEMAMix";
  static constexpr const char* kStateless = nullptr;
  static constexpr Param kParams[] = {
      {"beta1", ValueRange::kUnitOpen, 0.9},
      {"beta2", ValueRange::kUnitOpen, 0.999},
      {"beta3", ValueRange::kUnitOpen, 0.9999},
      {"alpha", ValueRange::kNonneg, 5.0},
      {"t_alpha", ValueRange::kNonneg, 0.0},  // 0: no warm-up
      {"t_beta3", ValueRange::kNonneg, 0.0},
      {"eps", ValueRange::kNonneg, 1e-8},
      {"weight_decay", ValueRange::kNonneg, 0.01},
  };
  static constexpr const char* kFlagNames[] = {"nu_linear_map"};  // read by moment(), not by the update
  static bool refuses(const Hyper& h, char* msg, size_t size) {
    if (!(h.t_beta3 > 0.0) || (h.beta1 > 0.0 && h.beta3 > 0.0)) return false;
    snprintf(msg, size, "config.t_beta3 = %g: the beta3 warm-up needs config.beta1 > 0 and config.beta3 > 0 (they "
             "are %g and %g)", h.t_beta3, h.beta1, h.beta3);
    return true;
  }

  struct Scalars {
    float beta1, one_minus_beta1;
    float beta2, one_minus_beta2;
    float beta3, one_minus_beta3;  // after its warm-up
    float alpha;                   // after its warm-up
    float inv_bc1;                 // 1 / (1 - beta1^step)
    float inv_sqrt_bc2;            // 1 / sqrt(1 - beta2^step)
    float eps;
    float wd;
    float neg_lr;
  };
  using Flags = FlagList<>;

  LBOPT_HD static int states(const Hyper&) { return 3; }

  // The warm-ups of bitsandbytes' AdEMAMix, in double precision.
  LBOPT_HD static double alpha_at(const Hyper& h, int64_t step) {
    return h.t_alpha > 0 ? fmin(double(step) * h.alpha / h.t_alpha, h.alpha) : h.alpha;
  }
  LBOPT_HD static double beta3_at(const Hyper& h, int64_t step) {
    if (!(h.t_beta3 > 0)) return h.beta3;
    const double ln1 = log(h.beta1), ln3 = log(h.beta3), f = double(step) / h.t_beta3;
    return fmin(exp(ln1 * ln3 / ((1.0 - f) * ln3 + f * ln1)), h.beta3);
  }

  LBOPT_HD static Scalars make(const Hyper& h, double lr, int64_t step) {
    Scalars s;
    const double beta3 = beta3_at(h, step);
    s.beta1 = float(h.beta1);
    s.one_minus_beta1 = float(1.0 - h.beta1);
    s.beta2 = float(h.beta2);
    s.one_minus_beta2 = float(1.0 - h.beta2);
    s.beta3 = float(beta3);
    s.one_minus_beta3 = float(1.0 - beta3);
    s.alpha = float(alpha_at(h, step));
    s.inv_bc1 = float(1.0 / bias_correction(h.beta1, step));
    s.inv_sqrt_bc2 = float(1.0 / sqrt(bias_correction(h.beta2, step)));
    s.eps = float(h.eps);
    s.wd = float(h.weight_decay);
    s.neg_lr = float(-lr);
    return s;
  }
};

}  // namespace lbopt
#endif  // LBOPT_OPTIM_ADEMAMIX_H

#ifdef LBOPT_DEFINE_UPDATES
// The update in two parts (Opt::kTwoPass, as AdamW's): update_states moves the states and returns the update's
// denominator, update_param divides by it and applies the update to p.
// m1, m2, nu: the states (unused ones are ignored); g: the gradient times grad_factor.
template <class O>
LBOPT_HD typename O::V update_states(const ::lbopt::AdEMAMix::Scalars& s, typename O::V, typename O::V g,
                                     typename O::V& m1, typename O::V& m2, typename O::V& nu) {
  m1 = O::fma(O::set(s.one_minus_beta1), g, O::mul(m1, O::set(s.beta1)));
  m2 = O::fma(O::set(s.one_minus_beta3), g, O::mul(m2, O::set(s.beta3)));
  nu = O::fma(O::mul(O::set(s.one_minus_beta2), g), g, O::mul(nu, O::set(s.beta2)));
  // bias corrections as products (divisions cost a vector unit's throughput; no peer's rounding to keep here)
  return O::fma(O::sqrt(nu), O::set(s.inv_sqrt_bc2), O::set(s.eps));
}

template <class O>
LBOPT_HD void update_param(const ::lbopt::AdEMAMix::Scalars& s, typename O::V& p, typename O::V denom,
                           typename O::V m1, typename O::V m2, typename O::V) {
  auto u = O::div(O::fma(O::set(s.alpha), m2, O::mul(m1, O::set(s.inv_bc1))), denom);
  u = O::fma(O::set(s.wd), p, u);
  p = O::fma(O::set(s.neg_lr), u, p);
}

template <class O>
LBOPT_HD void update(const ::lbopt::AdEMAMix::Scalars& s, typename O::V& p, typename O::V g, typename O::V& m1,
                     typename O::V& m2, typename O::V& nu) {
  const auto u = update_states<O>(s, p, g, m1, m2, nu);
  update_param<O>(s, p, u, m1, m2, nu);
}
#endif

// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"), with the update of bitsandbytes'
// Lion: decoupled weight decay, the sign of an interpolation of momentum and gradient, then the momentum's own
// EMA with beta2. State: exp_avg.
#ifndef LBOPT_OPTIM_LION_H
#define LBOPT_OPTIM_LION_H
#include "hyper.h"

namespace lbopt {

struct Lion {
  static constexpr const char* kName = "lion";
  static constexpr int kMinStates = 1;  // states(h)'s least value
  static constexpr int kMaxStates = 1;
  static constexpr const char* kStateNames[kMaxStates] = {"exp_avg"};
  LBOPT_HD static constexpr Moment moment(const Hyper&, int) { return kMomentFirst; }
  static constexpr bool kTwoPass = false;  // one update: no division to move to a second pass
  // Whether its first-moment codes round stochastically by default (on kinds whose stochastic_codes says so): yes.
  // Rounded to nearest, its momentum lags its fp32 value (docs/optimizers.md, "Which state kind to train with")
  static constexpr bool kStochasticStates = true;

  static constexpr const char* kTitle = "Lion";
  static constexpr const char* kStateless = nullptr;
  static constexpr Param kParams[] = {
      {"beta1", ValueRange::kUnitOpen, 0.9},
      {"beta2", ValueRange::kUnitOpen, 0.99},  // bitsandbytes' and the Lion paper's
      {"weight_decay", ValueRange::kNonneg, 0.0},
  };
  static constexpr const char* kFlagNames[] = {nullptr};  // none
  static bool refuses(const Hyper&, char*, size_t) { return false; }

  struct Scalars {
    float decay_factor;  // 1 - lr * weight_decay
    float beta1, one_minus_beta1;
    float beta2, one_minus_beta2;
    float neg_lr;
  };
  using Flags = FlagList<>;

  LBOPT_HD static int states(const Hyper&) { return 1; }

  LBOPT_HD static Scalars make(const Hyper& h, double lr, int64_t) {
    Scalars s;
    s.decay_factor = float(1.0 - lr * h.weight_decay);
    s.beta1 = float(h.beta1);
    s.one_minus_beta1 = float(1.0 - h.beta1);
    s.beta2 = float(h.beta2);
    s.one_minus_beta2 = float(1.0 - h.beta2);
    s.neg_lr = float(-lr);
    return s;
  }
};

}  // namespace lbopt
#endif  // LBOPT_OPTIM_LION_H

#ifdef LBOPT_DEFINE_UPDATES
// m, s1, s2: the states (unused ones are ignored); g: the gradient times grad_factor.
template <class O>
LBOPT_HD void update(const ::lbopt::Lion::Scalars& s, typename O::V& p, typename O::V g,
                     typename O::V& m, typename O::V&, typename O::V&) {
  p = O::mul(p, O::set(s.decay_factor));
  const auto c = O::fma(O::set(s.one_minus_beta1), g, O::mul(m, O::set(s.beta1)));
  p = O::fma(O::set(s.neg_lr), O::sign(c), p);
  m = O::fma(O::set(s.one_minus_beta2), g, O::mul(m, O::set(s.beta2)));
}
#endif

// SGD with momentum, dampening, Nesterov and coupled weight decay, as torch.optim.SGD. State: the momentum
// buffer (none without momentum); on the first step it becomes the gradient itself, undamped, as in torch.
#ifndef LBOPT_OPTIM_SGD_H
#define LBOPT_OPTIM_SGD_H
#include "hyper.h"

namespace lbopt {

struct Sgd {
  static constexpr const char* kName = "sgd";
  static constexpr int kMinStates = 0;  // states(h)'s least value
  static constexpr int kMaxStates = 1;
  static constexpr const char* kStateNames[kMaxStates] = {"momentum_buffer"};
  LBOPT_HD static constexpr Moment moment(const Hyper&, int) { return kMomentFirst; }
  static constexpr bool kTwoPass = false;  // one update: no division to move to a second pass
  // Whether its first-moment codes round stochastically by default (on kinds whose stochastic_codes says so): yes.
  // Rounded to nearest, its momentum lags its fp32 value (docs/optimizers.md, "Which state kind to train with")
  static constexpr bool kStochasticStates = true;

  static constexpr const char* kTitle = "SGD (momentum, Nesterov)";
  static constexpr const char* kStateless = "momentum = 0";  // the setting under which a step keeps no state
  static constexpr Param kParams[] = {
      {"momentum", ValueRange::kNonneg, 0.9},
      {"dampening", ValueRange::kUnitClosed, 0.0},
      {"weight_decay", ValueRange::kNonneg, 0.0},
  };
  static constexpr const char* kFlagNames[] = {"nesterov"};
  static bool refuses(const Hyper& h, char* msg, size_t size) {
    if (!h.nesterov || (h.momentum > 0.0 && h.dampening == 0.0)) return false;
    snprintf(msg, size, "config.flags: LBOPT_FLAG_NESTEROV needs config.momentum > 0 and config.dampening = 0 "
             "(they are %g and %g)", h.momentum, h.dampening);
    return true;
  }

  struct Scalars {
    float wd;
    float momentum;
    float one_minus_dampening;
    float neg_lr;
    bool has_wd;        // torch adds wd * p only when wd != 0 (0 * Inf would be NaN)
    bool has_momentum;
    bool first;         // step 1: the buffer starts as the gradient
    bool nesterov;
  };
  using Flags = FlagList<&Scalars::has_wd, &Scalars::nesterov>;  // has_momentum: the state count says it

  LBOPT_HD static int states(const Hyper& h) { return h.momentum != 0.0 ? 1 : 0; }

  LBOPT_HD static Scalars make(const Hyper& h, double lr, int64_t step) {
    Scalars s;
    s.wd = float(h.weight_decay);
    s.momentum = float(h.momentum);
    s.one_minus_dampening = float(1.0 - h.dampening);
    s.neg_lr = float(-lr);
    s.has_wd = h.weight_decay != 0.0;
    s.has_momentum = h.momentum != 0.0;
    s.first = step == 1;
    s.nesterov = h.nesterov;
    return s;
  }
};

}  // namespace lbopt
#endif  // LBOPT_OPTIM_SGD_H

#ifdef LBOPT_DEFINE_UPDATES
// buf, s1, s2: the states (unused ones are ignored); g: the gradient times grad_factor.
template <class O>
LBOPT_HD void update(const ::lbopt::Sgd::Scalars& s, typename O::V& p, typename O::V g,
                     typename O::V& buf, typename O::V&, typename O::V&) {
  if (s.has_wd) g = O::fma(O::set(s.wd), p, g);  // d_p.add(param, alpha=wd)
  if (s.has_momentum) {
    // buf.mul_(momentum).add_(d_p, alpha=1 - dampening)
    buf = s.first ? g : O::fma(O::set(s.one_minus_dampening), g, O::mul(buf, O::set(s.momentum)));
    g = s.nesterov ? O::fma(O::set(s.momentum), buf, g) : buf;
  }
  p = O::fma(O::set(s.neg_lr), g, p);  // param.add_(d_p, alpha=-lr)
}
#endif

// Muon's momentum (Jordan et al. 2024), in the operation order of torch.optim.Muon: the step moves the momentum
// and writes the update direction into the slot's param tensor, whose contents it does not read. The framework
// then orthogonalizes the direction (Newton-Schulz: matrix products, which belong to it) and applies it with its
// own lr and weight decay, so neither is read here. State: momentum_buffer.
#ifndef LBOPT_OPTIM_MUON_H
#define LBOPT_OPTIM_MUON_H
#include "hyper.h"

namespace lbopt {

struct Muon {
  static constexpr const char* kName = "muon";
  static constexpr int kMinStates = 1;  // states(h)'s least value
  static constexpr int kMaxStates = 1;
  static constexpr const char* kStateNames[kMaxStates] = {"momentum_buffer"};
  LBOPT_HD static constexpr Moment moment(const Hyper&, int) { return kMomentFirst; }
  static constexpr bool kTwoPass = false;  // one update: no division
  // Whether its first-moment codes round stochastically by default (on kinds whose stochastic_codes says so): yes,
  // as SGD's momentum, which lags its fp32 value rounded to nearest (docs/optimizers.md)
  static constexpr bool kStochasticStates = true;

  static constexpr const char* kTitle = "Muon momentum (direction out in param)";
  static constexpr const char* kStateless = nullptr;
  static constexpr Param kParams[] = {
      {"momentum", ValueRange::kNonneg, 0.95},  // torch.optim.Muon's
  };
  static constexpr const char* kFlagNames[] = {"nesterov"};
  static bool refuses(const Hyper&, char*, size_t) { return false; }

  // torch.lerp's weights as float32, and its branch for each (|w| < 0.5: from the start)
  struct Scalars {
    float buf_weight;  // 1 - momentum: buf.lerp_(grad, 1 - momentum)
    float dir_weight;  // momentum: grad.lerp(buf, momentum)
    bool buf_small;
    bool dir_small;
    bool nesterov;
  };
  using Flags = FlagList<&Scalars::nesterov>;  // the lerp branches: one per call, predicted

  LBOPT_HD static int states(const Hyper&) { return 1; }

  LBOPT_HD static Scalars make(const Hyper& h, double, int64_t) {
    Scalars s;
    s.buf_weight = float(1.0 - h.momentum);
    s.dir_weight = float(h.momentum);
    s.buf_small = fabsf(s.buf_weight) < 0.5f;
    s.dir_small = fabsf(s.dir_weight) < 0.5f;
    s.nesterov = h.nesterov;
    return s;
  }
};

}  // namespace lbopt
#endif  // LBOPT_OPTIM_MUON_H

#ifdef LBOPT_DEFINE_UPDATES
// buf: the momentum; p: the direction out (its value in is not used); g: the gradient times grad_factor.
template <class O>
LBOPT_HD void update(const ::lbopt::Muon::Scalars& s, typename O::V& p, typename O::V g, typename O::V& buf,
                     typename O::V&, typename O::V&) {
  buf = torch_lerp<O>(buf, g, s.buf_weight, s.buf_small);
  p = s.nesterov ? torch_lerp<O>(g, buf, s.dir_weight, s.dir_small) : buf;
}
#endif

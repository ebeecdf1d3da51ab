// The validated hyper-parameters of one step call, as every optimizer's scalar derivation reads them (on the host
// for a by-value lr, on the device for the capturable step). src/validate.cpp fills it from the caller's config.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "../hd.h"
#include "../state_kinds.h"

namespace lbopt {

// Values match lbopt_optimizer.
enum OptimizerId : int { kAdamW = 0, kSgd = 1, kLion = 2, kAdEMAMix = 3, kMuon = 4, kNumOptimizers = 5 };

// States per slot at most (AdamW with AMSGrad, AdEMAMix).
constexpr int kMaxStates = 3;

struct Hyper {
  int optimizer = kAdamW;
  double beta1 = 0, beta2 = 0, beta3 = 0, eps = 0, weight_decay = 0;
  double momentum = 0, dampening = 0;  // SGD
  double alpha = 0, t_alpha = 0, t_beta3 = 0;  // AdEMAMix; a warm-up length of 0 is none
  bool coupled_decay = false, amsgrad = false;  // AdamW
  bool nesterov = false;                        // SGD
  bool nu_linear_map = false;                   // AdEMAMix: nu on the unsigned map (Opt::moment)
  bool maximize = false;
};

// Hyper-parameters with nu_linear_map set, for kernels that choose a state's moment at compile time.
constexpr Hyper nu_linear_hyper() {
  Hyper h;
  h.nu_linear_map = true;
  return h;
}

// ---- an optimizer's descriptor: the facts validation, the config defaults and the registry derive from ----------
// Each optimizer names itself (kName, and kTitle for docs), says under which setting a step keeps no state
// (kStateless, or nullptr), and lists the hyper-parameters it reads (kParams: name, range, default, in the order of its registry
// operators' attributes), the flags it reads (kFlagNames) and refuses() for what no single range says. The names
// are those of lbopt_optimizer_config's fields and the registry's attributes (src/config_fields.h maps them).

// The values a hyper-parameter may take.
enum class ValueRange : int {
  kUnitOpen,    // [0, 1)
  kUnitClosed,  // [0, 1]
  kNonneg,      // finite and >= 0
};

struct Param {
  const char* name;
  ValueRange range;
  double default_value;
};

// The bool fields of an optimizer's Scalars that its update branches on, as pointers to members: the SIMD step
// (kernels/cpu/step_loops-inl.h) runs a loop per combination of their values, each with no branch on them.
template <auto... kFields>
struct FlagList {};

// 1 - beta^step in double precision: the bias corrections of the Adam family.
LBOPT_HD double bias_correction(double beta, int64_t step) { return 1.0 - pow(beta, double(step)); }

// RN(1 / c), the float nearest the reciprocal of a positive normal float c whose reciprocal is normal (what
// div_by_reciprocal in optimizers.h needs). float(1.0 / c) rounds twice, to double then to float, and may land a
// float off; of it and its neighbours, the one with the least residual |1 - r * c|, exact in double (r * c has 48
// bits, and 1 - r * c is exact by Sterbenz's lemma).
LBOPT_HD float reciprocal_rn(float c) {
  const float r = float(1.0 / double(c));
  const float candidates[3] = {nextafterf(r, 0.0f), r, nextafterf(r, INFINITY)};
  float best = r;
  for (float x : candidates)
    if (fabs(1.0 - double(x) * double(c)) < fabs(1.0 - double(best) * double(c))) best = x;
  return best;
}

// The factor every gradient is multiplied by first: 1 / grad_scale in float32 (GradScaler's inv_scale, exact for
// its powers of two), negated to ascend.
LBOPT_HD float grad_factor(double grad_scale, bool maximize) {
  return float(1.0 / grad_scale) * (maximize ? -1.0f : 1.0f);
}

}  // namespace lbopt

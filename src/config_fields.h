// lbopt_optimizer_config's fields by name: the names the optimizers' descriptors (kernels/optim/*.h) and the
// registry's attributes use. One name means one field everywhere.
#pragma once
#include <stdint.h>
#include <string.h>

#include "../kernels/optimizers.h"
#include "lbopt.h"

namespace lbopt {

using Config = lbopt_optimizer_config;

struct ConfigField {
  const char* name;
  int32_t type;                     // lbopt_attr_type
  double Config::*value = nullptr;  // DOUBLE
  uint32_t flag = 0;                // BOOL: the LBOPT_FLAG_ it sets
};
constexpr ConfigField kConfigFields[] = {
    {"beta1", LBOPT_ATTR_DOUBLE, &Config::beta1},
    {"beta2", LBOPT_ATTR_DOUBLE, &Config::beta2},
    {"beta3", LBOPT_ATTR_DOUBLE, &Config::beta3},
    {"alpha", LBOPT_ATTR_DOUBLE, &Config::alpha},
    {"t_alpha", LBOPT_ATTR_DOUBLE, &Config::t_alpha},
    {"t_beta3", LBOPT_ATTR_DOUBLE, &Config::t_beta3},
    {"eps", LBOPT_ATTR_DOUBLE, &Config::eps},
    {"weight_decay", LBOPT_ATTR_DOUBLE, &Config::weight_decay},
    {"momentum", LBOPT_ATTR_DOUBLE, &Config::momentum},
    {"dampening", LBOPT_ATTR_DOUBLE, &Config::dampening},
    {"adam", LBOPT_ATTR_BOOL, nullptr, LBOPT_FLAG_ADAM_COUPLED_DECAY},
    {"amsgrad", LBOPT_ATTR_BOOL, nullptr, LBOPT_FLAG_AMSGRAD},
    {"nesterov", LBOPT_ATTR_BOOL, nullptr, LBOPT_FLAG_NESTEROV},
    {"nu_linear_map", LBOPT_ATTR_BOOL, nullptr, LBOPT_FLAG_NU_LINEAR_MAP},
    {"maximize", LBOPT_ATTR_BOOL, nullptr, LBOPT_FLAG_MAXIMIZE},
    {"bf16_stochastic_round", LBOPT_ATTR_BOOL, nullptr, LBOPT_FLAG_BF16_STOCHASTIC_ROUND},
    {"skip_nonfinite", LBOPT_ATTR_BOOL, nullptr, LBOPT_FLAG_SKIP_NONFINITE},
    {"state_stochastic_round", LBOPT_ATTR_BOOL, nullptr, LBOPT_FLAG_STATE_STOCHASTIC_ROUND},
    {"state_nearest_round", LBOPT_ATTR_BOOL, nullptr, LBOPT_FLAG_STATE_NEAREST_ROUND},
    {"seed", LBOPT_ATTR_INT64},  // the only integer field
};

// The flags every optimizer reads.
constexpr const char* kCommonFlagNames[] = {"maximize", "bf16_stochastic_round", "skip_nonfinite",
                                            "state_stochastic_round", "state_nearest_round"};

constexpr bool same(const char* a, const char* b) {
  while (*a && *a == *b) ++a, ++b;
  return *a == *b;
}

// The field of that name; NULL for lr and step (arguments of the call, not of the config).
constexpr const ConfigField* config_field(const char* name) {
  for (const ConfigField& f : kConfigFields)
    if (same(f.name, name)) return &f;
  return nullptr;
}

// The LBOPT_FLAG_ bits an optimizer reads: the common ones and its descriptor's.
template <class Opt>
constexpr uint32_t flags_of() {
  uint32_t bits = 0;
  for (const char* name : kCommonFlagNames) bits |= config_field(name)->flag;
  for (const char* name : Opt::kFlagNames)
    if (name) bits |= config_field(name)->flag;
  return bits;
}

// Every name a descriptor lists is a config field of its kind.
template <class Opt>
constexpr bool descriptor_known() {
  for (const Param& p : Opt::kParams)
    if (!config_field(p.name) || config_field(p.name)->type != LBOPT_ATTR_DOUBLE) return false;
  for (const char* name : Opt::kFlagNames)
    if (name && (!config_field(name) || config_field(name)->type != LBOPT_ATTR_BOOL)) return false;
  return true;
}
static_assert(descriptor_known<AdamW>() && descriptor_known<Sgd>() && descriptor_known<Lion>() &&
                  descriptor_known<AdEMAMix>() && descriptor_known<Muon>(),
              "every name in an optimizer's descriptor is a field of lbopt_optimizer_config");

}  // namespace lbopt

// The defaults of lbopt_adamw_config_init, which the registry's step schemas advertise as theirs.
#pragma once

namespace lbopt {

constexpr double kDefaultBeta1 = 0.9;
constexpr double kDefaultBeta2 = 0.999;
constexpr double kDefaultEps = 1e-8;
constexpr double kDefaultWeightDecay = 0.01;

}  // namespace lbopt

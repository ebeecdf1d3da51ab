// The defaults of lbopt_optimizer_config_init (and so of lbopt_adamw_config_init), which the registry's step
// schemas advertise as theirs.
#pragma once
#include "lbopt.h"

namespace lbopt {

inline lbopt_optimizer_config default_config(lbopt_optimizer optimizer) {
  lbopt_optimizer_config c{};
  c.struct_size = sizeof c;
  c.optimizer = optimizer;
  c.state_kind = LBOPT_STATE_4BIT;
  c.beta1 = 0.9;
  c.beta2 = optimizer == LBOPT_OPTIMIZER_LION ? 0.99 : 0.999;  // bitsandbytes' and the Lion paper's
  c.beta3 = 0.9999;
  c.eps = 1e-8;
  c.weight_decay = optimizer == LBOPT_OPTIMIZER_SGD || optimizer == LBOPT_OPTIMIZER_LION ? 0.0 : 0.01;
  c.momentum = 0.9;
  c.alpha = 5.0;
  return c;
}

}  // namespace lbopt

// The defaults of lbopt_optimizer_config_init (and so of lbopt_adamw_config_init), which the registry's step
// schemas advertise as theirs: each optimizer's descriptor (kernels/optim/*.h) for the fields it reads; a field it
// does not read takes the default of the first optimizer (by lbopt_optimizer value) that reads it.
#pragma once
#include "config_fields.h"

namespace lbopt {

template <class Opt>
void set_defaults(Config* c) {
  for (const Param& p : Opt::kParams) c->*(config_field(p.name)->value) = p.default_value;
}

inline lbopt_optimizer_config default_config(lbopt_optimizer optimizer) {
  Config c{};
  c.struct_size = sizeof c;
  c.optimizer = optimizer;
  c.state_kind = LBOPT_STATE_4BIT;
  for (int id = kNumOptimizers - 1; id >= 0; --id)  // the first reader's value last
    with_optimizer(id, [&c](auto opt) { set_defaults<decltype(opt)>(&c); });
  with_optimizer(int(optimizer), [&c](auto opt) { set_defaults<decltype(opt)>(&c); });
  return c;
}

// Whether a step's first-moment codes round stochastically: as flags say (LBOPT_FLAG_STATE_STOCHASTIC_ROUND or
// LBOPT_FLAG_STATE_NEAREST_ROUND), else where both the optimizer (Opt::kStochasticStates) and the kind
// (K::stochastic_codes) choose it.
inline bool stochastic_states(uint32_t flags, int optimizer, int kind) {
  if (flags & LBOPT_FLAG_STATE_STOCHASTIC_ROUND) return true;
  if (flags & LBOPT_FLAG_STATE_NEAREST_ROUND) return false;
  return with_optimizer(optimizer, [kind](auto opt) {
    return decltype(opt)::kStochasticStates && with_kind(kind, [](auto k) { return decltype(k)::stochastic_codes; });
  });
}

}  // namespace lbopt

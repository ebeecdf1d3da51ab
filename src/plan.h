// What validation hands a backend: the plan of one call, raw pointers and values only, every argument already
// checked (src/validate.h makes them; src/backend.h runs them).
#pragma once
#include <stdint.h>

#include <vector>

#include "../kernels/step_args.h"
#include "lbopt.h"

namespace lbopt {

enum class DeviceClass { kHost, kCuda };

struct Device {
  DeviceClass cls = DeviceClass::kHost;
  int id = 0;
};

struct StepPlan {
  Device device;
  int kind = 0;
  Hyper hyper;
  uint32_t flags = 0;
  bool stochastic_states = false;  // the first-moment codes round stochastically (defaults.h's stochastic_states)
  uint64_t seed = 0;
  double lr = 0;
  std::vector<StepSlot> slots;
  const void* lr_scalar = nullptr;    // capturable: lr and step read from these at run time (then lr and
  const void* step_scalar = nullptr;  // the slots' steps are filled in by the backend)
  bool lr_is_double = false;
  bool step_is_int64 = false;
  const float* grad_scale = nullptr;  // optional scalars, on the plan's device
  const float* found_inf = nullptr;
  uint8_t* skipped = nullptr;         // optional [n_slots] out
  void* stream = nullptr;
  bool devices_known = false;  // LBOPT_STEP_DEVICES_KNOWN: the caller vouches for every pointer's device
  const char* const* state_fields = nullptr;  // how messages name the slots' states (validate_step's argument)
};

struct ConvertPlan {
  Device device;
  int kind = 0;
  Moment moment = kMomentFirst;
  int64_t numel = 0;
  float* values = nullptr;  // the float32 side
  StateRef state;
  void* stream = nullptr;
};

// Sizes of one state of a valid kind (numel in [0, INT64_MAX / 4]).
lbopt_layout layout_of(int kind, int64_t numel);

}  // namespace lbopt

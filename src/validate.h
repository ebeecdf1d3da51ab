// Validation of every argument of a call, before anything is written, and translation of the caller's
// DLTensors into the raw plan a backend runs. Only this file looks inside caller-provided structs.
#pragma once
#include <stddef.h>
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
};

struct ConvertPlan {
  Device device;
  int kind = 0;
  bool second_moment = false;
  int64_t numel = 0;
  float* values = nullptr;  // the float32 side
  StateRef state;
  void* stream = nullptr;
};

// lr_scalar / step_scalar: the capturable variant's device scalars (NULL for the by-value step). state_fields:
// how messages name a slot's states ("m", "v", "vmax" for lbopt_adamw_slot, "states[k]" for lbopt_slot).
lbopt_status validate_step(const lbopt_optimizer_config* config, double lr, const DLTensor* lr_scalar,
                           const DLTensor* step_scalar, const lbopt_slot* slots, size_t n_slots,
                           const lbopt_step_options* options, const char* const* state_fields, StepPlan* plan);

extern const char* const kSlotStateFields[kMaxStates];   // "states[0]", ...
extern const char* const kAdamwStateFields[kMaxStates];  // "m", "v", "vmax"

// An AdamW-entry-point call as the generic one: the config checked (with a by-value lr where lr is given), then
// the slots checked for their own struct size and translated (the generic validation checks the rest).
lbopt_status adamw_as_generic(const lbopt_adamw_config* config, const double* lr, const lbopt_adamw_slot* slots,
                              size_t n_slots, lbopt_optimizer_config* out_config, std::vector<lbopt_slot>* out_slots);

// to_state: quantize (values read, state written); otherwise dequantize.
lbopt_status validate_convert(lbopt_state_kind kind, lbopt_moment moment, const DLTensor* values, lbopt_state state,
                              bool to_state, void* stream, ConvertPlan* plan);

lbopt_status validate_state_init(lbopt_state_kind kind, int64_t numel, lbopt_state state, void* stream,
                                 ConvertPlan* plan);

lbopt_status validate_kind(lbopt_state_kind kind, const char* name);

// The per-slot scalars of a validated by-value step (lr and step known on the host), derived once in double
// precision and in the default floating-point environment, for either backend: a host grad_scale is folded in,
// CUDA kernels read theirs on the device and apply it. The validate-only entry point skips this.
void derive_scalars(StepPlan* plan);

// The config and a by-value lr, checked as lbopt_step checks them.
lbopt_status validate_config(const lbopt_optimizer_config* config, double lr);

// The hyper-parameters of a config that validate_config accepted.
Hyper hyper_of(const lbopt_optimizer_config& config);

// Sizes of one state of a valid kind (numel in [0, INT64_MAX / 4]).
lbopt_layout layout_of(int kind, int64_t numel);

}  // namespace lbopt

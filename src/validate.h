// Validation of every argument of a call, before anything is written, and translation of the caller's
// DLTensors into the raw plan a backend runs. Only this file looks inside caller-provided structs.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <vector>

#include "lbopt.h"
#include "plan.h"

namespace lbopt {

// capturable: lr and step come from the device scalars lr_scalar and step_scalar (ignored otherwise), not from the
// by-value lr and the slots' steps. state_fields: how messages name a slot's states ("m", "v", "vmax" for
// lbopt_adamw_slot, "states[k]" for lbopt_slot).
lbopt_status validate_step(const lbopt_optimizer_config* config, double lr, bool capturable,
                           const DLTensor* lr_scalar, const DLTensor* step_scalar, const lbopt_slot* slots,
                           size_t n_slots, const lbopt_step_options* options, const char* const* state_fields,
                           StepPlan* plan);

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

// lbopt_optimizer_config_set's checks; *field: the field or flag to set.
struct ConfigField;
lbopt_status validate_config_set(const lbopt_optimizer_config* config, const char* name, double value,
                                 const ConfigField** field);

// The hyper-parameters of a config that validate_config accepted.
Hyper hyper_of(const lbopt_optimizer_config& config);

// lbopt_state_layout's arguments: out, of out_size bytes, and a state's kind and numel.
lbopt_status validate_layout_args(lbopt_state_kind kind, int64_t numel, const void* out, size_t out_size);

// A struct the caller sized for the library to fill (its pointer named name, its size field size_name): not NULL,
// and at least own bytes, the smallest size of that struct this library knows (it fills what size covers).
lbopt_status validate_out_struct(const void* out, const char* name, size_t size, const char* size_name, size_t own);

// lbopt_step_options as lbopt 0.3 laid it out, without flags: what callers built against that header pass.
constexpr size_t kStepOptionsSize03 = offsetof(lbopt_step_options, flags);
// Every bit of lbopt_step_options.flags this library knows.
constexpr uint32_t kStepFlags = LBOPT_STEP_DEVICES_KNOWN;

lbopt_status validate_optimizer(lbopt_optimizer optimizer);

// lbopt_optimizer_states' out arguments.
lbopt_status validate_states_out(const lbopt_state_info* states, const size_t* n_states);

lbopt_status validate_num_threads(int n);

// The operator registry's arguments (validate_registry.cpp). validate_op: op is one of the n_ops operators at ops
// (id: its index). validate_op_attrs: attrs by name and type against op's schema; out[k] (out_size >= op.n_attrs):
// schema attribute k's value, its default where attrs has none.
lbopt_status validate_op(const lbopt_op_info* op, const lbopt_op_info* ops, size_t n_ops, size_t* id);
lbopt_status validate_op_tensors(const lbopt_op_info& op, const DLTensor* const* tensors, size_t n_tensors);
lbopt_status validate_op_attrs(const lbopt_op_info& op, const lbopt_attr* attrs, size_t n_attrs, lbopt_attr* out,
                               size_t out_size);
// The string attributes "kind" ("4bit", ...) and "moment" ("m", "v").
lbopt_status validate_kind_name(const char* s, lbopt_state_kind* out);
lbopt_status validate_moment_name(const char* s, lbopt_moment* out);
// lbopt.state_layout's output: a compact, aligned int64 [4] CPU tensor; values: its first element.
lbopt_status validate_layout_out(const DLTensor* out, int64_t** values);

}  // namespace lbopt

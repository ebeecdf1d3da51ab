// The C entry points: argument checks (validate.cpp), then a backend call. Nothing else lives here, and no C++
// exception leaves: anything thrown becomes a status.
#include <math.h>
#include <string.h>

#include <array>
#include <new>
#include <vector>

#include "../kernels/quant.h"
#include "backend.h"
#include "defaults.h"
#include "error.h"
#include "lbopt.h"
#include "thread_pool.h"
#include "validate.h"

namespace lbopt {
namespace {

template <class F>
lbopt_status guarded(F&& body) {
  clear_error();
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(LBOPT_ERR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return fail(LBOPT_ERR_INTERNAL, "unexpected exception: %s", e.what());
  } catch (...) {
    return fail(LBOPT_ERR_INTERNAL, "unexpected exception");
  }
}

// Write a struct the caller sized: zero all size bytes, then the fields this library knows, and struct_size.
template <class T>
void fill(T* out, size_t size, T value) {
  const size_t own = size < sizeof(T) ? size : sizeof(T);  // a caller built against an older, smaller struct
  value.struct_size = uint32_t(own);
  memset(out, 0, size);
  memcpy(out, &value, own);
}

// capturable: lr_t and step_t give lr and step (validate_step).
lbopt_status run_step(const lbopt_optimizer_config* config, double lr, bool capturable, const DLTensor* lr_t,
                      const DLTensor* step_t, const lbopt_slot* slots, size_t n_slots,
                      const lbopt_step_options* options, const char* const* fields) {
  thread_local StepPlan plan;  // reused: a warm step allocates nothing
  LBOPT_TRY(validate_step(config, lr, capturable, lr_t, step_t, slots, n_slots, options, fields, &plan));
  derive_scalars(&plan);
  return backend_for(plan.device).step(plan);
}

lbopt_status run_capturable(const lbopt_optimizer_config* config, const DLTensor* lr, const DLTensor* step,
                            const lbopt_slot* slots, size_t n_slots, const lbopt_step_options* options,
                            const char* const* fields) {
  return run_step(config, 0.0, true, lr, step, slots, n_slots, options, fields);
}

// The checks of a step alone (the _validate entry points).
lbopt_status check_step(const lbopt_optimizer_config* config, double lr, const lbopt_slot* slots, size_t n_slots,
                        const lbopt_step_options* options, const char* const* fields) {
  thread_local StepPlan plan;
  return validate_step(config, lr, false, nullptr, nullptr, slots, n_slots, options, fields, &plan);
}

// An AdamW entry point's arguments in the generic form (the slots in a per-thread buffer, reused).
struct AdamwCall {
  lbopt_optimizer_config config{};
  lbopt_status status;
  // lr: the by-value lr, NULL for the capturable step (whose lr is a tensor)
  AdamwCall(const lbopt_adamw_config* c, const double* lr, const lbopt_adamw_slot* s, size_t n)
      : status(adamw_as_generic(c, lr, s, n, &config, &buffer())) {}
  const lbopt_slot* slots() const { return buffer().empty() ? nullptr : buffer().data(); }
  static std::vector<lbopt_slot>& buffer() {
    thread_local std::vector<lbopt_slot> b;
    return b;
  }
};

// Each optimizer's lbopt_field_info entries, from its descriptor.
struct FieldTable {
  lbopt_field_info v[16];
  size_t n = 0;
};

template <class Opt>
FieldTable field_table() {
  FieldTable t;
  for (const Param& p : Opt::kParams) {
    const double max = p.range == ValueRange::kNonneg ? INFINITY : 1.0;
    t.v[t.n++] = {p.name, LBOPT_ATTR_DOUBLE, 0, p.default_value, 0.0, max, p.range == ValueRange::kUnitClosed, 0};
  }
  for (const char* name : Opt::kFlagNames)
    if (name) t.v[t.n++] = {name, LBOPT_ATTR_BOOL, config_field(name)->flag, 0.0, 0.0, 0.0, 0, 0};
  return t;
}

const FieldTable& fields_of(int optimizer) {
  static const std::array<FieldTable, kNumOptimizers> tables = [] {
    std::array<FieldTable, kNumOptimizers> t;
    for (int id = 0; id < kNumOptimizers; ++id)
      with_optimizer(id, [&](auto opt) { t[size_t(id)] = field_table<decltype(opt)>(); });
    return t;
  }();
  return tables[size_t(optimizer)];
}

}  // namespace
}  // namespace lbopt

using namespace lbopt;

extern "C" {

lbopt_status lbopt_state_layout(lbopt_state_kind kind, int64_t numel, lbopt_layout* out, size_t out_size) {
  return guarded([&] {
    LBOPT_TRY(validate_layout_args(kind, numel, out, out_size));
    fill(out, out_size, layout_of(kind, numel));
    return LBOPT_OK;
  });
}

lbopt_status lbopt_state_init(lbopt_state_kind kind, int64_t numel, lbopt_state state, void* stream) {
  return guarded([&] {
    ConvertPlan plan;
    LBOPT_TRY(validate_state_init(kind, numel, state, stream, &plan));
    return backend_for(plan.device).state_init(plan);
  });
}

lbopt_status lbopt_quantize(lbopt_state_kind kind, lbopt_moment moment, const DLTensor* src, lbopt_state dst,
                            void* stream) {
  return guarded([&] {
    ConvertPlan plan;
    LBOPT_TRY(validate_convert(kind, moment, src, dst, true, stream, &plan));
    return backend_for(plan.device).quantize(plan);
  });
}

lbopt_status lbopt_dequantize(lbopt_state_kind kind, lbopt_moment moment, lbopt_state src, const DLTensor* dst,
                              void* stream) {
  return guarded([&] {
    ConvertPlan plan;
    LBOPT_TRY(validate_convert(kind, moment, dst, src, false, stream, &plan));
    return backend_for(plan.device).dequantize(plan);
  });
}

lbopt_status lbopt_adamw_config_init(lbopt_adamw_config* config, size_t struct_size) {
  return guarded([&] {
    LBOPT_TRY(validate_out_struct(config, "config", struct_size, "struct_size", sizeof(lbopt_adamw_config)));
    const lbopt_optimizer_config d = default_config(LBOPT_OPTIMIZER_ADAMW);
    lbopt_adamw_config c{};
    c.state_kind = d.state_kind;
    c.beta1 = d.beta1;
    c.beta2 = d.beta2;
    c.eps = d.eps;
    c.weight_decay = d.weight_decay;
    fill(config, struct_size, c);
    return LBOPT_OK;
  });
}

lbopt_status lbopt_optimizer_config_init(lbopt_optimizer_config* config, size_t struct_size,
                                         lbopt_optimizer optimizer) {
  return guarded([&] {
    LBOPT_TRY(validate_out_struct(config, "config", struct_size, "struct_size", sizeof(lbopt_optimizer_config)));
    LBOPT_TRY(validate_optimizer(optimizer));
    fill(config, struct_size, default_config(optimizer));
    return LBOPT_OK;
  });
}

lbopt_status lbopt_optimizer_config_validate(const lbopt_optimizer_config* config, double lr) {
  return guarded([&] { return validate_config(config, lr); });
}

lbopt_status lbopt_optimizer_config_set(lbopt_optimizer_config* config, const char* name, double value) {
  return guarded([&] {
    const ConfigField* f = nullptr;
    LBOPT_TRY(validate_config_set(config, name, value, &f));
    if (f->value) config->*(f->value) = value;
    else config->flags = value != 0.0 ? config->flags | f->flag : config->flags & ~f->flag;
    return LBOPT_OK;
  });
}

const char* lbopt_optimizer_name(lbopt_optimizer optimizer) {
  if (int(optimizer) < 0 || int(optimizer) >= kNumOptimizers) return nullptr;
  return with_optimizer(int(optimizer), [](auto opt) { return decltype(opt)::kName; });
}

const char* lbopt_state_kind_name(lbopt_state_kind kind) {
  return int(kind) >= 0 && int(kind) < kNumStateKinds ? state_kind_name(int(kind)) : nullptr;
}

lbopt_status lbopt_optimizer_states(const lbopt_optimizer_config* config, lbopt_state_info states[LBOPT_MAX_STATES],
                                    size_t* n_states) {
  return guarded([&] {
    LBOPT_TRY(validate_states_out(states, n_states));
    LBOPT_TRY(validate_config(config, 0.0));
    const Hyper h = hyper_of(*config);
    const int n = active_states(h);
    with_optimizer(h.optimizer, [&](auto opt) {
      using Opt = decltype(opt);
      for (int k = 0; k < n; ++k)
        states[k] = {Opt::kStateNames[k], int32_t(Opt::moment(h, k))};
    });
    *n_states = size_t(n);
    return LBOPT_OK;
  });
}

lbopt_status lbopt_optimizer_fields(lbopt_optimizer optimizer, const lbopt_field_info** fields, size_t* n_fields) {
  return guarded([&] {
    if (!fields || !n_fields)
      return fail(LBOPT_ERR_NULL_POINTER, "%s: pointer is NULL", fields ? "n_fields" : "fields");
    if (!lbopt_optimizer_name(optimizer))
      return fail(LBOPT_ERR_INVALID_VALUE, "optimizer = %d is not an lbopt_optimizer", int(optimizer));
    const FieldTable& t = fields_of(optimizer);
    *fields = t.v;
    *n_fields = t.n;
    return LBOPT_OK;
  });
}

lbopt_status lbopt_step_options_init(lbopt_step_options* options, size_t struct_size) {
  return guarded([&] {
    // lbopt 0.3's struct (without flags), or this one and any larger
    const size_t known = struct_size == kStepOptionsSize03 ? kStepOptionsSize03 : sizeof(lbopt_step_options);
    LBOPT_TRY(validate_out_struct(options, "options", struct_size, "struct_size", known));
    fill(options, struct_size, lbopt_step_options{});
    return LBOPT_OK;
  });
}

lbopt_status lbopt_step(const lbopt_optimizer_config* config, double lr, const lbopt_slot* slots, size_t n_slots,
                        const lbopt_step_options* options) {
  return guarded(
      [&] { return run_step(config, lr, false, nullptr, nullptr, slots, n_slots, options, kSlotStateFields); });
}

lbopt_status lbopt_step_validate(const lbopt_optimizer_config* config, double lr, const lbopt_slot* slots,
                                 size_t n_slots, const lbopt_step_options* options) {
  return guarded([&] { return check_step(config, lr, slots, n_slots, options, kSlotStateFields); });
}

lbopt_status lbopt_step_capturable(const lbopt_optimizer_config* config, const DLTensor* lr, const DLTensor* step,
                                   const lbopt_slot* slots, size_t n_slots, const lbopt_step_options* options) {
  return guarded([&] { return run_capturable(config, lr, step, slots, n_slots, options, kSlotStateFields); });
}

lbopt_status lbopt_adamw_step(const lbopt_adamw_config* config, double lr, const lbopt_adamw_slot* slots,
                              size_t n_slots, const lbopt_step_options* options) {
  return guarded([&] {
    const AdamwCall call(config, &lr, slots, n_slots);
    LBOPT_TRY(call.status);
    return run_step(&call.config, lr, false, nullptr, nullptr, call.slots(), n_slots, options, kAdamwStateFields);
  });
}

lbopt_status lbopt_adamw_config_validate(const lbopt_adamw_config* config, double lr) {
  return guarded([&] {
    return AdamwCall(config, &lr, nullptr, 0).status;
  });
}

lbopt_status lbopt_adamw_step_validate(const lbopt_adamw_config* config, double lr, const lbopt_adamw_slot* slots,
                                       size_t n_slots, const lbopt_step_options* options) {
  return guarded([&] {
    const AdamwCall call(config, &lr, slots, n_slots);
    LBOPT_TRY(call.status);
    return check_step(&call.config, lr, call.slots(), n_slots, options, kAdamwStateFields);
  });
}

lbopt_status lbopt_adamw_step_capturable(const lbopt_adamw_config* config, const DLTensor* lr, const DLTensor* step,
                                         const lbopt_adamw_slot* slots, size_t n_slots,
                                         const lbopt_step_options* options) {
  return guarded([&] {
    const AdamwCall call(config, nullptr, slots, n_slots);
    LBOPT_TRY(call.status);
    return run_capturable(&call.config, lr, step, call.slots(), n_slots, options, kAdamwStateFields);
  });
}

lbopt_status lbopt_set_num_threads(int n) {
  return guarded([&] {
    LBOPT_TRY(validate_num_threads(n));
    set_num_threads(n);
    return LBOPT_OK;
  });
}

int lbopt_get_num_threads(void) { return num_threads(); }

}  // extern "C"

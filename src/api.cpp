// The C entry points: argument checks (validate.cpp), then a backend call. Nothing else lives here, and no C++
// exception leaves: anything thrown becomes a status.
#include <string.h>

#include <new>

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

// This release's structs are the first of their kind, so no smaller size is known yet.
lbopt_status check_out_size(size_t size, size_t own, const char* name) {
  if (size < own) return fail(LBOPT_ERR_STRUCT_SIZE, "%s = %zu, this library needs at least %zu", name, size, own);
  return LBOPT_OK;
}

// Write a struct the caller sized: zero all size bytes, then the fields this library knows, and struct_size.
template <class T>
void fill(T* out, size_t size, T value) {
  value.struct_size = uint32_t(sizeof(T));
  memset(out, 0, size);
  memcpy(out, &value, sizeof(T));
}

}  // namespace
}  // namespace lbopt

using namespace lbopt;

extern "C" {

lbopt_status lbopt_state_layout(lbopt_state_kind kind, int64_t numel, lbopt_layout* out, size_t out_size) {
  return guarded([&] {
    if (!out) return fail(LBOPT_ERR_NULL_POINTER, "out: pointer is NULL");
    LBOPT_TRY(check_out_size(out_size, sizeof(lbopt_layout), "out_size"));
    LBOPT_TRY(validate_kind(kind, "kind"));
    if (numel < 0 || numel > INT64_MAX / 4)
      return fail(LBOPT_ERR_INVALID_VALUE, "numel = %lld is outside [0, INT64_MAX / 4]", (long long)numel);
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
    if (!config) return fail(LBOPT_ERR_NULL_POINTER, "config: pointer is NULL");
    LBOPT_TRY(check_out_size(struct_size, sizeof(lbopt_adamw_config), "struct_size"));
    lbopt_adamw_config c{};
    c.state_kind = LBOPT_STATE_4BIT;
    c.beta1 = kDefaultBeta1;
    c.beta2 = kDefaultBeta2;
    c.eps = kDefaultEps;
    c.weight_decay = kDefaultWeightDecay;
    fill(config, struct_size, c);
    return LBOPT_OK;
  });
}

lbopt_status lbopt_step_options_init(lbopt_step_options* options, size_t struct_size) {
  return guarded([&] {
    if (!options) return fail(LBOPT_ERR_NULL_POINTER, "options: pointer is NULL");
    LBOPT_TRY(check_out_size(struct_size, sizeof(lbopt_step_options), "struct_size"));
    fill(options, struct_size, lbopt_step_options{});
    return LBOPT_OK;
  });
}

lbopt_status lbopt_adamw_step(const lbopt_adamw_config* config, double lr, const lbopt_adamw_slot* slots,
                              size_t n_slots, const lbopt_step_options* options) {
  return guarded([&] {
    thread_local StepPlan plan;  // reused: a warm step allocates nothing
    LBOPT_TRY(validate_step(config, lr, nullptr, nullptr, slots, n_slots, options, &plan));
    derive_scalars(&plan);
    return backend_for(plan.device).adamw_step(plan);
  });
}

lbopt_status lbopt_adamw_config_validate(const lbopt_adamw_config* config, double lr) {
  return guarded([&] { return validate_config(config, lr); });
}

lbopt_status lbopt_adamw_step_validate(const lbopt_adamw_config* config, double lr, const lbopt_adamw_slot* slots,
                                       size_t n_slots, const lbopt_step_options* options) {
  return guarded([&] {
    thread_local StepPlan plan;
    return validate_step(config, lr, nullptr, nullptr, slots, n_slots, options, &plan);
  });
}

lbopt_status lbopt_adamw_step_capturable(const lbopt_adamw_config* config, const DLTensor* lr, const DLTensor* step,
                                         const lbopt_adamw_slot* slots, size_t n_slots,
                                         const lbopt_step_options* options) {
  return guarded([&] {
    if (!lr) return fail(LBOPT_ERR_NULL_POINTER, "lr: tensor pointer is NULL");
    if (!step) return fail(LBOPT_ERR_NULL_POINTER, "step: tensor pointer is NULL");
    thread_local StepPlan plan;
    LBOPT_TRY(validate_step(config, 0.0, lr, step, slots, n_slots, options, &plan));
    derive_scalars(&plan);
    return backend_for(plan.device).adamw_step(plan);
  });
}

lbopt_status lbopt_set_num_threads(int n) {
  return guarded([&] {
    if (n < 0) return fail(LBOPT_ERR_INVALID_VALUE, "n = %d must be >= 0 (0 restores the default)", n);
    set_num_threads(n);
    return LBOPT_OK;
  });
}

int lbopt_get_num_threads(void) { return num_threads(); }

}  // extern "C"

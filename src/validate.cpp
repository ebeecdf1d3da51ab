#include "validate.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>

#include "../kernels/quant.h"
#include "backend.h"
#include "defaults.h"
#include "error.h"
#include "fp_env.h"

namespace lbopt {
namespace {

enum class Access { kRead, kWrite };

// What a tensor argument may be.
enum class Want { kParam, kCodes, kScales, kFloat32, kFlags, kScalar, kStep };

// The name of an argument, formatted only when a message needs it (a call validates thousands of tensors):
// {"slots", 3, "m", "codes"} reads "slots[3].m.codes".
struct ArgName {
  const char* base;
  int64_t index = -1;
  const char* field = nullptr;
  const char* sub = nullptr;

  ArgName with_sub(const char* s) const { return {base, index, field, s}; }
};

// An ArgName as text, for the duration of one fail() call: fail(..., "%s", Text(name).c_str()).
class Text {
 public:
  explicit Text(const ArgName& n) {
    int len = n.index >= 0 ? snprintf(buf_, sizeof buf_, "%s[%lld]", n.base, (long long)n.index)
                           : snprintf(buf_, sizeof buf_, "%s", n.base);
    for (const char* part : {n.field, n.sub})
      if (part && len < int(sizeof buf_)) len += snprintf(buf_ + len, sizeof buf_ - size_t(len), ".%s", part);
  }
  const char* c_str() const { return buf_; }

 private:
  char buf_[64];
};

struct Range {
  uintptr_t begin, end;
  bool written;
  ArgName name;
};

const char* dtype_name(DLDataType t, char* buf, size_t size) {
  static const char* const codes[] = {"int", "uint", "float", "handle", "bfloat", "complex", "bool"};
  const char* base = t.code < sizeof codes / sizeof codes[0] ? codes[t.code] : "code?";
  if (t.lanes == 1) snprintf(buf, size, "%s%u", base, unsigned(t.bits));
  else snprintf(buf, size, "%s%ux%u", base, unsigned(t.bits), unsigned(t.lanes));
  return buf;
}

bool is(DLDataType t, uint8_t code, uint8_t bits) { return t.code == code && t.bits == bits && t.lanes == 1; }

bool to_dtype(DLDataType t, Dtype* out) {
  if (is(t, kDLFloat, 32)) *out = kFloat32;
  else if (is(t, kDLBfloat, 16)) *out = kBfloat16;
  else if (is(t, kDLFloat, 16)) *out = kFloat16;
  else return false;
  return true;
}

// The kernels walk memory linearly, so any layout whose elements fill one gap-free range is served: the extents
// taken in order of increasing stride must be compact (channels_last, a transpose, any permutation). Extent-1
// dimensions may carry any stride. Negative strides are refused: torch never makes them, and a caller with a
// reversed view can pass its ascending twin.
lbopt_status check_dense(const DLTensor* t, const ArgName& arg) {
  thread_local std::vector<int> dims;  // reused: validation allocates nothing once warm
  dims.clear();
  for (int d = 0; d < t->ndim; ++d) {
    if (t->shape[d] == 1) continue;
    if (t->strides[d] < 0)
      return fail(LBOPT_ERR_STRIDE, "%s: strides[%d] = %lld is negative; strides must be >= 0", Text(arg).c_str(), d,
                  (long long)t->strides[d]);
    dims.push_back(d);
  }
  // innermost first; among equal strides the later dimension first, so row-major tensors name their last dim
  std::sort(dims.begin(), dims.end(), [t](int a, int b) {
    return t->strides[a] != t->strides[b] ? t->strides[a] < t->strides[b] : a > b;
  });
  int64_t expected = 1;
  for (int d : dims) {
    if (t->strides[d] != expected)
      return fail(LBOPT_ERR_STRIDE, "%s: strides[%d] = %lld, a dense layout needs %lld (the strides must be those of "
                  "a compact tensor in some dimension order)", Text(arg).c_str(), d, (long long)t->strides[d],
                  (long long)expected);
    expected *= t->shape[d];
  }
  return LBOPT_OK;
}

// Row-major strides where a tensor has none (of a tensor with elements: the product cannot overflow).
int64_t stride_of(const DLTensor& t, int d) {
  if (t.strides) return t.strides[d];
  int64_t s = 1;
  for (int e = t.ndim - 1; e > d; --e) s *= t.shape[e];
  return s;
}

// A grad must lie in memory as its param does (its shape was checked equal): element i of the one is element i
// of the other, and the states follow the same order. Empty tensors may carry any strides.
lbopt_status check_same_layout(const DLTensor& param, const DLTensor& grad, int64_t numel, size_t slot) {
  if ((!param.strides && !grad.strides) || numel == 0) return LBOPT_OK;
  for (int d = 0; d < param.ndim; ++d) {
    if (param.shape[d] == 1) continue;
    const int64_t sp = stride_of(param, d), sg = stride_of(grad, d);
    if (sp != sg)
      return fail(LBOPT_ERR_STRIDE, "slots[%zu].grad: strides[%d] = %lld, its param's is %lld; a grad must have its "
                  "param's memory layout", slot, d, (long long)sg, (long long)sp);
  }
  return LBOPT_OK;
}

// Checks every tensor of one call against the same device and collects byte ranges for the overlap check.
class CallChecker {
 public:
  CallChecker() : ranges_(ranges()) { ranges_.clear(); }

  struct View {
    uint8_t* data = nullptr;
    int64_t numel = 0;
    DLDataType dtype{};
  };

  lbopt_status tensor(const DLTensor* t, const ArgName& arg, Want want, Access access, View* out) {
    if (!t) return fail(LBOPT_ERR_NULL_POINTER, "%s: tensor pointer is NULL", Text(arg).c_str());
    char buf[48];
    // dtype
    const DLDataType dt = t->dtype;
    Dtype unused;
    const bool dtype_ok = want == Want::kParam ? to_dtype(dt, &unused)
                          : want == Want::kCodes ? (is(dt, kDLUInt, 8) || is(dt, kDLFloat, 32))
                          : want == Want::kFlags ? is(dt, kDLUInt, 8)
                          : want == Want::kScalar ? (is(dt, kDLFloat, 32) || is(dt, kDLFloat, 64))
                          : want == Want::kStep ? (is(dt, kDLInt, 64) || is(dt, kDLFloat, 32))
                                                 : is(dt, kDLFloat, 32);
    if (!dtype_ok) {
      const char* allowed = want == Want::kParam ? "float32, bfloat16 or float16"
                            : want == Want::kCodes ? "uint8 (quantized) or float32 (LBOPT_STATE_FP32)"
                            : want == Want::kFlags ? "uint8"
                            : want == Want::kScalar ? "float32 or float64"
                            : want == Want::kStep ? "int64 or float32"
                                                   : "float32";
      return fail(LBOPT_ERR_DTYPE, "%s: dtype %s is not supported here (expected %s)", Text(arg).c_str(),
                  dtype_name(dt, buf, sizeof buf), allowed);
    }
    // shape and element count
    if (t->ndim < 0) return fail(LBOPT_ERR_SHAPE, "%s: ndim %d is negative", Text(arg).c_str(), t->ndim);
    if (t->ndim > 0 && !t->shape) return fail(LBOPT_ERR_NULL_POINTER, "%s: shape is NULL with ndim %d", Text(arg).c_str(), t->ndim);
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; ++d) {
      const int64_t n = t->shape[d];
      if (n < 0) return fail(LBOPT_ERR_SHAPE, "%s: shape[%d] = %lld is negative", Text(arg).c_str(), d, (long long)n);
      // (an overflow test, not a division: a 64-bit divide per dim was most of the check of a small tensor)
      if (__builtin_mul_overflow(numel, n, &numel))
        return fail(LBOPT_ERR_SHAPE, "%s: element count overflows int64", Text(arg).c_str());
    }
    // strides: NULL (compact row-major) or any dense, non-overlapping layout
    if (t->strides && numel > 0) LBOPT_TRY(check_dense(t, arg));
    const int64_t elem = dt.bits / 8;
    int64_t bytes;
    if (__builtin_mul_overflow(numel, elem, &bytes))
      return fail(LBOPT_ERR_SHAPE, "%s: byte size overflows int64", Text(arg).c_str());
    // device
    Device dev;
    switch (t->device.device_type) {
      case kDLCPU:
      case kDLCUDAHost: dev = {DeviceClass::kHost, 0}; break;
      case kDLCUDA: dev = {DeviceClass::kCuda, t->device.device_id}; break;
      default:
        return fail(LBOPT_ERR_DEVICE, "%s: device type %d is not supported (CPU, CUDAHost or CUDA)", Text(arg).c_str(),
                    int(t->device.device_type));
    }
    if (!have_device_) {
      device_ = dev;
      have_device_ = true;
      first_arg_ = arg;
    } else if (dev.cls != device_.cls || dev.id != device_.id) {
      return fail(LBOPT_ERR_DEVICE, "%s: on %s:%d but %s is on %s:%d; one call uses one device", Text(arg).c_str(),
                  dev.cls == DeviceClass::kCuda ? "cuda" : "cpu", dev.id,
                  Text(first_arg_).c_str(), device_.cls == DeviceClass::kCuda ? "cuda" : "cpu", device_.id);
    }
    // data and alignment
    if (!t->data && numel > 0) return fail(LBOPT_ERR_NULL_POINTER, "%s: data is NULL", Text(arg).c_str());
    const uintptr_t addr = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
    if (addr < reinterpret_cast<uintptr_t>(t->data))
      return fail(LBOPT_ERR_ALIGNMENT, "%s: byte_offset %llu wraps the address space", Text(arg).c_str(),
                  (unsigned long long)t->byte_offset);
    if ((addr & uintptr_t(elem - 1)) != 0)  // elem is a power of two
      return fail(LBOPT_ERR_ALIGNMENT, "%s: data + byte_offset (%llu) is not aligned to its %lld-byte elements",
                  Text(arg).c_str(), (unsigned long long)t->byte_offset, (long long)elem);
    if (numel > 0) {
      ranges_.push_back(Range{addr, addr + uintptr_t(bytes), access == Access::kWrite, arg});
    }
    out->data = reinterpret_cast<uint8_t*>(addr);
    out->numel = numel;
    out->dtype = dt;
    return LBOPT_OK;
  }

  // After all tensors: no written range may overlap any other range. Sorted by start, an overlap exists iff some
  // range starts before the furthest end seen so far, with either side written.
  // The ranges are sorted as compact (start, argument index) keys, not moved: a call of thousands of tensors
  // sorts tens of thousands of them. Ties go in argument order, so a message names the same two buffers whatever
  // else the call holds.
  lbopt_status check_overlaps() {
    const std::vector<Range>& rs = ranges_;
    thread_local std::vector<std::pair<uintptr_t, uint32_t>> order;
    order.resize(rs.size());
    for (size_t i = 0; i < rs.size(); ++i) order[i] = {rs[i].begin, uint32_t(i)};
    std::sort(order.begin(), order.end());
    const Range* far_any = nullptr;
    const Range* far_written = nullptr;
    for (const auto& key : order) {
      const Range& r = rs[key.second];
      const Range* hit = nullptr;
      if (far_written && r.begin < far_written->end) hit = far_written;
      else if (r.written && far_any && r.begin < far_any->end) hit = far_any;
      if (hit)
        return fail(LBOPT_ERR_OVERLAP, "%s overlaps %s; written buffers must not alias", Text(r.name).c_str(),
                    Text(hit->name).c_str());
      if (!far_any || r.end > far_any->end) far_any = &r;
      if (r.written && (!far_written || r.end > far_written->end)) far_written = &r;
    }
    return LBOPT_OK;
  }

  // A device needs a backend that serves its class and a device of that id (each backend is asked once per
  // process); host tensors are served whatever their device id.
  lbopt_status device_supported() const {
    if (!have_device_ || device_.cls == DeviceClass::kHost) return LBOPT_OK;
    const Backend* backend = find_backend(device_.cls);
    if (!backend)
      return fail(LBOPT_ERR_UNSUPPORTED, "%s: device cuda:%d, but this build of lbopt has no CUDA backend",
                  Text(first_arg_).c_str(), device_.id);
    const DeviceCount count = backend->devices();
    if (count.devices == 0)
      return fail(LBOPT_ERR_UNSUPPORTED, "%s: device %s:%d, but %s", Text(first_arg_).c_str(), backend->name,
                  device_.id, count.reason);
    if (device_.id < 0 || device_.id >= count.devices)
      return fail(LBOPT_ERR_DEVICE, "%s: device %s:%d does not exist (%d %s devices)", Text(first_arg_).c_str(),
                  backend->name, device_.id, count.devices, backend->name);
    return LBOPT_OK;
  }

  Device device() const { return device_; }

 private:
  // Reused between calls: validation allocates nothing once warm.
  static std::vector<Range>& ranges() {
    thread_local std::vector<Range> r;
    return r;
  }

  std::vector<Range>& ranges_;  // (a thread-local lookup costs a call in a shared library: once per checker)
  Device device_{};
  bool have_device_ = false;
  ArgName first_arg_{""};
};

// Codes and scales of one state, sized for kind and numel.
lbopt_status check_state(CallChecker& ck, int kind, int64_t numel, lbopt_state st, const ArgName& arg,
                         Access access, StateRef* out) {
  if (numel > INT64_MAX / 4)
    return fail(LBOPT_ERR_SHAPE, "%s: a state of %lld elements is too large", Text(arg).c_str(), (long long)numel);
  const lbopt_layout layout = layout_of(kind, numel);
  CallChecker::View codes, scales;
  const ArgName codes_arg = arg.with_sub("codes"), scales_arg = arg.with_sub("scales");
  LBOPT_TRY(ck.tensor(st.codes, codes_arg, Want::kCodes, access, &codes));
  const bool want_float = layout.codes_dtype.code == kDLFloat;
  if (is(codes.dtype, kDLFloat, 32) != want_float)
    return fail(LBOPT_ERR_DTYPE, "%s: dtype must be %s for this state kind", Text(codes_arg).c_str(),
                want_float ? "float32" : "uint8");
  if (codes.numel != layout.codes_numel)
    return fail(LBOPT_ERR_BUFFER_SIZE, "%s: has %lld elements, the state of %lld elements needs %lld",
                Text(codes_arg).c_str(), (long long)codes.numel, (long long)numel, (long long)layout.codes_numel);
  if (layout.block_size == 0) {
    if (st.scales)
      return fail(LBOPT_ERR_INVALID_VALUE, "%s: must be NULL for LBOPT_STATE_FP32", Text(scales_arg).c_str());
  } else {
    if (!st.scales) return fail(LBOPT_ERR_NULL_POINTER, "%s: tensor pointer is NULL", Text(scales_arg).c_str());
    LBOPT_TRY(ck.tensor(st.scales, scales_arg, Want::kScales, access, &scales));
    if (scales.numel != layout.scales_numel)
      return fail(LBOPT_ERR_BUFFER_SIZE, "%s: has %lld elements, the state of %lld elements needs %lld",
                  Text(scales_arg).c_str(), (long long)scales.numel, (long long)numel,
                  (long long)layout.scales_numel);
  }
  out->codes = codes.data;
  out->scales = reinterpret_cast<float*>(scales.data);
  return LBOPT_OK;
}

// A state's element count: its codes' byte count (numel * 4 for fp32 states) must fit int64_t.
lbopt_status check_numel(int64_t numel) {
  if (numel < 0 || numel > INT64_MAX / 4)
    return fail(LBOPT_ERR_INVALID_VALUE, "numel = %lld is outside [0, INT64_MAX / 4]", (long long)numel);
  return LBOPT_OK;
}

lbopt_status check_finite_nonneg(double x, const char* name) {
  if (!(x >= 0.0 && isfinite(x))) return fail(LBOPT_ERR_INVALID_VALUE, "%s = %g must be finite and >= 0", name, x);
  return LBOPT_OK;
}

lbopt_status check_range(double x, const Param& p) {
  const bool ok = p.range == ValueRange::kUnitOpen ? x >= 0.0 && x < 1.0
                  : p.range == ValueRange::kUnitClosed ? x >= 0.0 && x <= 1.0
                  : x >= 0.0 && isfinite(x);
  if (ok) return LBOPT_OK;
  if (p.range == ValueRange::kNonneg)
    return fail(LBOPT_ERR_INVALID_VALUE, "config.%s = %g must be finite and >= 0", p.name, x);
  return fail(LBOPT_ERR_INVALID_VALUE, "config.%s = %g is outside [0, 1%c", p.name, x,
              p.range == ValueRange::kUnitOpen ? ')' : ']');
}

constexpr uint32_t kKnownFlags = LBOPT_FLAGS_ALL | LBOPT_FLAG_NESTEROV | LBOPT_FLAG_NU_LINEAR_MAP;

// An optimizer's fields, flags and rules as its descriptor gives them; fields it does not read are not checked.
template <class Opt>
lbopt_status check_optimizer_fields(const lbopt_optimizer_config& c) {
  for (const Param& p : Opt::kParams) LBOPT_TRY(check_range(c.*(config_field(p.name)->value), p));
  const uint32_t allowed = flags_of<Opt>();
  if (c.flags & ~allowed)
    return fail(LBOPT_ERR_INVALID_VALUE, "config.flags = 0x%x has bits 0x%x that %s does not know", c.flags,
                c.flags & ~allowed, Opt::kName);
  char msg[256];
  if (Opt::refuses(hyper_of(c), msg, sizeof msg)) return fail(LBOPT_ERR_INVALID_VALUE, "%s", msg);
  return LBOPT_OK;
}

// A config's size and optimizer, before anything reads its fields.
lbopt_status check_config_header(const lbopt_optimizer_config* c) {
  if (!c) return fail(LBOPT_ERR_NULL_POINTER, "config: pointer is NULL");
  if (c->struct_size != sizeof(lbopt_optimizer_config))
    return fail(LBOPT_ERR_STRUCT_SIZE, "config.struct_size = %u, this library knows %zu (use "
                "lbopt_optimizer_config_init)", c->struct_size, sizeof(lbopt_optimizer_config));
  if (!lbopt_optimizer_name(c->optimizer))
    return fail(LBOPT_ERR_INVALID_VALUE, "config.optimizer = %d is not an lbopt_optimizer", int(c->optimizer));
  return LBOPT_OK;
}

lbopt_status check_config(const lbopt_optimizer_config* c) {
  LBOPT_TRY(check_config_header(c));
  LBOPT_TRY(validate_kind(c->state_kind, "config.state_kind"));
  if (c->flags & ~kKnownFlags)
    return fail(LBOPT_ERR_INVALID_VALUE, "config.flags = 0x%x has unknown bits 0x%x", c->flags,
                c->flags & ~kKnownFlags);
  constexpr uint32_t kRoundings = LBOPT_FLAG_STATE_STOCHASTIC_ROUND | LBOPT_FLAG_STATE_NEAREST_ROUND;
  if ((c->flags & kRoundings) == kRoundings)
    return fail(LBOPT_ERR_INVALID_VALUE, "config.flags = 0x%x: LBOPT_FLAG_STATE_STOCHASTIC_ROUND and "
                "LBOPT_FLAG_STATE_NEAREST_ROUND exclude each other", c->flags);
  return with_optimizer(int(c->optimizer), [c](auto opt) { return check_optimizer_fields<decltype(opt)>(*c); });
}

// Appends ", word" (or the first word) to a message's list of names.
void append(char* list, size_t size, const char* word) {
  const size_t n = strlen(list);
  snprintf(list + n, size - n, "%s%s", n ? ", " : "", word);
}

// lbopt_optimizer_config_set: `name` one of the fields or flags that optimizer Opt reads, and `value` in that
// field's range (a flag: 0 or 1). Rules across fields stay check_config's: they hold only once all are set.
template <class Opt>
lbopt_status check_config_set(const char* name, double value, const ConfigField** field) {
  for (const Param& p : Opt::kParams)
    if (same(p.name, name)) return *field = config_field(name), check_range(value, p);
  bool flag = false;
  for (const char* f : kCommonFlagNames) flag |= same(f, name);
  for (const char* f : Opt::kFlagNames) flag |= f && same(f, name);
  if (!flag) {
    char known[256] = "";
    for (const Param& p : Opt::kParams) append(known, sizeof known, p.name);
    for (const char* f : Opt::kFlagNames)
      if (f) append(known, sizeof known, f);
    for (const char* f : kCommonFlagNames) append(known, sizeof known, f);
    return fail(LBOPT_ERR_INVALID_VALUE, "name = \"%s\" is not a field or flag that %s reads (%s)", name, Opt::kName,
                known);
  }
  if (value != 0.0 && value != 1.0)
    return fail(LBOPT_ERR_INVALID_VALUE, "config.%s = %g: a flag is set by 1 and cleared by 0", name, value);
  *field = config_field(name);
  return LBOPT_OK;
}

lbopt_status check_scalar(CallChecker& ck, const DLTensor* t, const char* name, const float** out) {
  if (!t) return LBOPT_OK;
  CallChecker::View v;
  LBOPT_TRY(ck.tensor(t, ArgName{name}, Want::kFloat32, Access::kRead, &v));
  if (v.numel != 1) return fail(LBOPT_ERR_SHAPE, "%s: has %lld elements, expected 1", name, (long long)v.numel);
  *out = reinterpret_cast<const float*>(v.data);
  return LBOPT_OK;
}

lbopt_status check_lr(double lr) { return check_finite_nonneg(lr, "lr"); }

// Host scalars are read and checked here, so that a validated host plan cannot fail; on CUDA the kernels read
// them and refuse bad values on the device. The capturable lr and step become the plan's by-value ones.
lbopt_status read_host_scalars(StepPlan* plan) {
  if (plan->lr_scalar) {
    const double lr = plan->lr_is_double ? *static_cast<const double*>(plan->lr_scalar)
                                         : double(*static_cast<const float*>(plan->lr_scalar));
    const double step = plan->step_is_int64 ? double(*static_cast<const int64_t*>(plan->step_scalar))
                                            : double(*static_cast<const float*>(plan->step_scalar));
    LBOPT_TRY(check_lr(lr));
    if (!(step >= 1.0 && step < 9.2e18 && step == floor(step)))
      return fail(LBOPT_ERR_INVALID_VALUE, "step = %g must be a whole number >= 1", step);
    plan->lr = lr;
    for (StepSlot& slot : plan->slots) slot.step = int64_t(step);
    plan->lr_scalar = plan->step_scalar = nullptr;
  }
  if (plan->grad_scale) {
    const double gs = *plan->grad_scale;
    if (!(gs > 0.0 && isfinite(gs) && isfinite(float(1.0 / gs))))
      return fail(LBOPT_ERR_INVALID_VALUE, "options.grad_scale = %g must be finite and > 0 with a finite float "
                  "reciprocal", gs);
  }
  return LBOPT_OK;
}

}  // namespace

const char* const kSlotStateFields[kMaxStates] = {"states[0]", "states[1]", "states[2]"};
const char* const kAdamwStateFields[kMaxStates] = {"m", "v", "vmax"};

void derive_scalars(StepPlan* plan) {
  if (plan->lr_scalar) return;  // the capturable CUDA step: the kernels derive them from the device lr and step
  const DefaultFpEnv fp_env;
  const double grad_scale =
      plan->device.cls == DeviceClass::kHost && plan->grad_scale ? double(*plan->grad_scale) : 1.0;
  const float factor = grad_factor(grad_scale, plan->hyper.maximize);
  for (StepSlot& slot : plan->slots) {
    slot.grad_factor = factor;
    slot.scalars = make_scalars(plan->hyper, plan->lr, slot.step);
  }
}

Hyper hyper_of(const lbopt_optimizer_config& c) {
  Hyper h;
  h.optimizer = int(c.optimizer);
  h.beta1 = c.beta1;
  h.beta2 = c.beta2;
  h.beta3 = c.beta3;
  h.eps = c.eps;
  h.weight_decay = c.weight_decay;
  h.momentum = c.momentum;
  h.dampening = c.dampening;
  h.alpha = c.alpha;
  h.t_alpha = c.t_alpha;
  h.t_beta3 = c.t_beta3;
  h.coupled_decay = c.flags & LBOPT_FLAG_ADAM_COUPLED_DECAY;
  h.amsgrad = c.flags & LBOPT_FLAG_AMSGRAD;
  h.nesterov = c.flags & LBOPT_FLAG_NESTEROV;
  h.nu_linear_map = c.flags & LBOPT_FLAG_NU_LINEAR_MAP;
  h.maximize = c.flags & LBOPT_FLAG_MAXIMIZE;
  return h;
}

lbopt_status adamw_as_generic(const lbopt_adamw_config* config, const double* lr, const lbopt_adamw_slot* slots,
                              size_t n_slots, lbopt_optimizer_config* out_config, std::vector<lbopt_slot>* out_slots) {
  if (!config) return fail(LBOPT_ERR_NULL_POINTER, "config: pointer is NULL");
  if (config->struct_size != sizeof(lbopt_adamw_config))
    return fail(LBOPT_ERR_STRUCT_SIZE, "config.struct_size = %u, this library knows %zu (use lbopt_adamw_config_init)",
                config->struct_size, sizeof(lbopt_adamw_config));
  if (config->flags & ~LBOPT_FLAGS_ALL)
    return fail(LBOPT_ERR_INVALID_VALUE, "config.flags = 0x%x has unknown bits 0x%x", config->flags,
                config->flags & ~LBOPT_FLAGS_ALL);
  lbopt_optimizer_config c = default_config(LBOPT_OPTIMIZER_ADAMW);
  c.state_kind = config->state_kind;
  c.beta1 = config->beta1;
  c.beta2 = config->beta2;
  c.eps = config->eps;
  c.weight_decay = config->weight_decay;
  c.flags = config->flags;
  c.seed = config->seed;
  *out_config = c;
  out_slots->clear();
  LBOPT_TRY(lr ? validate_config(&c, *lr) : check_config(&c));  // the config before the slots, as in 0.2
  if (!slots) return LBOPT_OK;  // the generic validation names a NULL slots pointer
  out_slots->reserve(n_slots);
  for (size_t i = 0; i < n_slots; ++i) {
    const lbopt_adamw_slot& s = slots[i];
    if (s.struct_size != sizeof(lbopt_adamw_slot))
      return fail(LBOPT_ERR_STRUCT_SIZE, "slots[%zu].struct_size = %u, this library knows %zu", i, s.struct_size,
                  sizeof(lbopt_adamw_slot));
    out_slots->push_back(lbopt_slot{sizeof(lbopt_slot), s.param, s.grad, {s.m, s.v, s.vmax}, s.step});
  }
  return LBOPT_OK;
}

lbopt_layout layout_of(int kind, int64_t numel) {
  lbopt_layout l{};
  l.struct_size = sizeof(lbopt_layout);
  with_kind(kind, [&](auto k) {
    using K = decltype(k);
    l.block_size = K::block;
    // float32 values, or bytes of codes (a 4-bit state's odd last element in a byte of its own)
    l.codes_dtype = K::float_codes ? DLDataType{kDLFloat, 32, 1} : DLDataType{kDLUInt, 8, 1};
    l.codes_bytes = K::code_bits >= 8 ? numel * (K::code_bits / 8) : (numel + 1) / 2;
    l.codes_numel = K::float_codes ? numel : l.codes_bytes;
    l.scales_numel = K::block ? numel / K::block + (numel % K::block != 0) : 0;
  });
  return l;
}

lbopt_status validate_kind(lbopt_state_kind kind, const char* name) {
  if (int(kind) < 0 || int(kind) >= kNumStateKinds)
    return fail(LBOPT_ERR_INVALID_VALUE, "%s = %d is not an lbopt_state_kind", name, int(kind));
  return LBOPT_OK;
}

lbopt_status validate_config(const lbopt_optimizer_config* config, double lr) {
  LBOPT_TRY(check_config(config));
  return check_lr(lr);
}

lbopt_status validate_config_set(const lbopt_optimizer_config* c, const char* name, double value,
                                 const ConfigField** field) {
  LBOPT_TRY(check_config_header(c));
  if (!name) return fail(LBOPT_ERR_NULL_POINTER, "name: pointer is NULL");
  return with_optimizer(int(c->optimizer),
                        [&](auto opt) { return check_config_set<decltype(opt)>(name, value, field); });
}

lbopt_status validate_step(const lbopt_optimizer_config* config, double lr, bool capturable,
                           const DLTensor* lr_scalar, const DLTensor* step_scalar, const lbopt_slot* slots,
                           size_t n_slots, const lbopt_step_options* options, const char* const* state_fields,
                           StepPlan* plan) {
  if (capturable) LBOPT_TRY(check_config(config));
  else LBOPT_TRY(validate_config(config, lr));
  if (capturable && !lr_scalar) return fail(LBOPT_ERR_NULL_POINTER, "lr: tensor pointer is NULL");
  if (capturable && !step_scalar) return fail(LBOPT_ERR_NULL_POINTER, "step: tensor pointer is NULL");
  if (n_slots == 0) return fail(LBOPT_ERR_INVALID_VALUE, "n_slots: is 0; a step needs at least one slot");
  if (!slots) return fail(LBOPT_ERR_NULL_POINTER, "slots: pointer is NULL with n_slots = %zu", n_slots);
  if (options && options->struct_size != sizeof(lbopt_step_options) && options->struct_size != kStepOptionsSize03)
    return fail(LBOPT_ERR_STRUCT_SIZE, "options.struct_size = %u, this library knows %zu and %zu (use "
                "lbopt_step_options_init)", options->struct_size, sizeof(lbopt_step_options), kStepOptionsSize03);
  const uint32_t option_flags = options && options->struct_size == sizeof(lbopt_step_options) ? options->flags : 0;
  if (option_flags & ~kStepFlags)
    return fail(LBOPT_ERR_INVALID_VALUE, "options.flags = 0x%x has bits this library does not know (0x%x)",
                option_flags, option_flags & ~kStepFlags);

  const int kind = config->state_kind;
  const Hyper hyper = hyper_of(*config);
  const int n_states = active_states(hyper);
  CallChecker ck;
  plan->slots.clear();
  plan->slots.reserve(n_slots);
  for (size_t i = 0; i < n_slots; ++i) {
    const auto arg = [i](const char* field) { return ArgName{"slots", int64_t(i), field}; };
    const lbopt_slot& s = slots[i];
    if (s.struct_size != sizeof(lbopt_slot))
      return fail(LBOPT_ERR_STRUCT_SIZE, "slots[%zu].struct_size = %u, this library knows %zu", i, s.struct_size,
                  sizeof(lbopt_slot));
    if (!capturable && s.step < 1)
      return fail(LBOPT_ERR_INVALID_VALUE, "slots[%zu].step = %lld must be >= 1", i, (long long)s.step);
    StepSlot out;
    CallChecker::View p, g;
    LBOPT_TRY(ck.tensor(s.param, arg("param"), Want::kParam, Access::kWrite, &p));
    LBOPT_TRY(ck.tensor(s.grad, arg("grad"), Want::kParam, Access::kRead, &g));
    if (s.param->ndim != s.grad->ndim ||
        (s.param->ndim > 0 && memcmp(s.param->shape, s.grad->shape, sizeof(int64_t) * size_t(s.param->ndim)) != 0))
      return fail(LBOPT_ERR_SHAPE, "slots[%zu].grad: shape differs from the param's (%d-d, %lld elements vs %d-d, "
                  "%lld elements)", i, s.grad->ndim, (long long)g.numel, s.param->ndim, (long long)p.numel);
    LBOPT_TRY(check_same_layout(*s.param, *s.grad, p.numel, i));
    to_dtype(p.dtype, &out.param_dtype);
    to_dtype(g.dtype, &out.grad_dtype);
    out.param = p.data;
    out.grad = g.data;
    out.numel = p.numel;
    out.step = s.step;
    for (int k = 0; k < kMaxStates; ++k) {
      if (k < n_states) {
        LBOPT_TRY(check_state(ck, kind, p.numel, s.states[k], arg(state_fields[k]), Access::kWrite, &out.states[k]));
      } else if (s.states[k].codes || s.states[k].scales) {
        return fail(LBOPT_ERR_INVALID_VALUE, "slots[%zu].%s: given, but a %s step of this config uses %d "
                    "state(s); pass {NULL, NULL}", i, state_fields[k], lbopt_optimizer_name(config->optimizer), n_states);
      }
    }
    plan->slots.push_back(out);
  }
  plan->grad_scale = plan->found_inf = nullptr;
  plan->skipped = nullptr;
  plan->stream = nullptr;
  plan->lr_scalar = plan->step_scalar = nullptr;
  if (capturable) {
    CallChecker::View v;
    LBOPT_TRY(ck.tensor(lr_scalar, ArgName{"lr"}, Want::kScalar, Access::kRead, &v));
    if (v.numel != 1) return fail(LBOPT_ERR_SHAPE, "lr: has %lld elements, expected 1", (long long)v.numel);
    plan->lr_scalar = v.data;
    plan->lr_is_double = v.dtype.bits == 64;
    LBOPT_TRY(ck.tensor(step_scalar, ArgName{"step"}, Want::kStep, Access::kRead, &v));
    if (v.numel != 1) return fail(LBOPT_ERR_SHAPE, "step: has %lld elements, expected 1", (long long)v.numel);
    plan->step_scalar = v.data;
    plan->step_is_int64 = v.dtype.code == kDLInt;
  }
  if (options) {
    LBOPT_TRY(check_scalar(ck, options->grad_scale, "options.grad_scale", &plan->grad_scale));
    LBOPT_TRY(check_scalar(ck, options->found_inf, "options.found_inf", &plan->found_inf));
    if (options->skipped) {
      CallChecker::View v;
      LBOPT_TRY(ck.tensor(options->skipped, ArgName{"options.skipped"}, Want::kFlags, Access::kWrite, &v));
      if (v.numel != int64_t(n_slots))
        return fail(LBOPT_ERR_SHAPE, "options.skipped: has %lld elements, expected n_slots = %zu", (long long)v.numel,
                    n_slots);
      plan->skipped = v.data;
    }
    plan->stream = options->stream;
  }
  plan->devices_known = (option_flags & LBOPT_STEP_DEVICES_KNOWN) != 0;
  LBOPT_TRY(ck.check_overlaps());
  LBOPT_TRY(ck.device_supported());
  plan->device = ck.device();
  plan->lr = lr;
  if (plan->device.cls == DeviceClass::kHost) LBOPT_TRY(read_host_scalars(plan));
  plan->kind = kind;
  plan->hyper = hyper;
  plan->flags = config->flags;
  plan->stochastic_states = stochastic_states(config->flags, config->optimizer, kind);
  plan->seed = config->seed;
  plan->state_fields = state_fields;
  LBOPT_TRY(backend_for(plan->device).check_step(*plan));
  return LBOPT_OK;
}

lbopt_status validate_convert(lbopt_state_kind kind, lbopt_moment moment, const DLTensor* values, lbopt_state state,
                              bool to_state, void* stream, ConvertPlan* plan) {
  LBOPT_TRY(validate_kind(kind, "kind"));
  if (int(moment) < 0 || int(moment) >= kNumMoments)
    return fail(LBOPT_ERR_INVALID_VALUE, "moment = %d is not an lbopt_moment", int(moment));
  CallChecker ck;
  CallChecker::View v;
  LBOPT_TRY(ck.tensor(values, ArgName{to_state ? "src" : "dst"}, Want::kFloat32,
                      to_state ? Access::kRead : Access::kWrite, &v));
  LBOPT_TRY(check_state(ck, kind, v.numel, state, ArgName{to_state ? "dst" : "src"},
                        to_state ? Access::kWrite : Access::kRead, &plan->state));
  LBOPT_TRY(ck.check_overlaps());
  LBOPT_TRY(ck.device_supported());
  plan->device = ck.device();
  plan->kind = kind;
  plan->moment = Moment(moment);
  plan->numel = v.numel;
  plan->values = reinterpret_cast<float*>(v.data);
  // Host values that would poison a block scale or have no code are refused here; on CUDA the kernel cannot refuse
  // without synchronizing and stores them as 0, as the step does.
  if (to_state && plan->device.cls == DeviceClass::kHost) {
    for (int64_t i = 0; i < plan->numel; ++i) {
      const float x = plan->values[i];
      if (!isfinite(x)) return fail(LBOPT_ERR_NONFINITE, "src[%lld] = %g is not finite", (long long)i, x);
      if (plan->moment != kMomentFirst && x < 0.0f)
        return fail(LBOPT_ERR_INVALID_VALUE, "src[%lld] = %g is negative; a second-moment state is >= 0",
                    (long long)i, x);
    }
  }
  plan->stream = stream;
  LBOPT_TRY(backend_for(plan->device).check_convert(*plan, to_state ? "src" : "dst", to_state ? "dst" : "src"));
  return LBOPT_OK;
}

lbopt_status validate_state_init(lbopt_state_kind kind, int64_t numel, lbopt_state state, void* stream,
                                 ConvertPlan* plan) {
  LBOPT_TRY(validate_kind(kind, "kind"));
  LBOPT_TRY(check_numel(numel));
  CallChecker ck;
  LBOPT_TRY(check_state(ck, kind, numel, state, ArgName{"state"}, Access::kWrite, &plan->state));
  LBOPT_TRY(ck.check_overlaps());
  LBOPT_TRY(ck.device_supported());
  plan->device = ck.device();
  plan->kind = kind;
  plan->numel = numel;
  plan->stream = stream;
  LBOPT_TRY(backend_for(plan->device).check_convert(*plan, nullptr, "state"));
  return LBOPT_OK;
}

lbopt_status validate_layout_args(lbopt_state_kind kind, int64_t numel, const void* out, size_t out_size) {
  LBOPT_TRY(validate_out_struct(out, "out", out_size, "out_size", sizeof(lbopt_layout)));
  LBOPT_TRY(validate_kind(kind, "kind"));
  return check_numel(numel);
}

lbopt_status validate_out_struct(const void* out, const char* name, size_t size, const char* size_name, size_t own) {
  if (!out) return fail(LBOPT_ERR_NULL_POINTER, "%s: pointer is NULL", name);
  if (size < own) return fail(LBOPT_ERR_STRUCT_SIZE, "%s = %zu, this library needs at least %zu", size_name, size, own);
  return LBOPT_OK;
}

lbopt_status validate_optimizer(lbopt_optimizer optimizer) {
  if (int(optimizer) < 0 || int(optimizer) >= kNumOptimizers)
    return fail(LBOPT_ERR_INVALID_VALUE, "optimizer = %d is not an lbopt_optimizer", int(optimizer));
  return LBOPT_OK;
}

lbopt_status validate_states_out(const lbopt_state_info* states, const size_t* n_states) {
  if (!states) return fail(LBOPT_ERR_NULL_POINTER, "states: pointer is NULL");
  if (!n_states) return fail(LBOPT_ERR_NULL_POINTER, "n_states: pointer is NULL");
  return LBOPT_OK;
}

lbopt_status validate_num_threads(int n) {
  if (n < 0) return fail(LBOPT_ERR_INVALID_VALUE, "n = %d must be >= 0 (0 restores the default)", n);
  return LBOPT_OK;
}

}  // namespace lbopt

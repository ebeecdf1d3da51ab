// The operator registry: static schemas, and one generic invoke that resolves attributes by name and forwards to
// the typed entry points (which do all tensor validation), so both paths share every check and every result.
#include <math.h>
#include <string.h>

#include <utility>

#include "defaults.h"
#include "error.h"
#include "lbopt.h"

namespace lbopt {
namespace {

constexpr uint32_t kParam = LBOPT_DTYPE_FLOAT32 | LBOPT_DTYPE_BFLOAT16 | LBOPT_DTYPE_FLOAT16;
constexpr uint32_t kCodes = LBOPT_DTYPE_UINT8 | LBOPT_DTYPE_FLOAT32;

const lbopt_tensor_arg kStepTensors[] = {
    {"param", LBOPT_ROLE_INOUT, kParam, 0, "any shape"},
    {"grad", LBOPT_ROLE_IN, kParam, 0, "same shape as param"},
    {"m_codes", LBOPT_ROLE_INOUT, kCodes, 0, "lbopt_state_layout(kind, numel(param)).codes_numel"},
    {"m_scales", LBOPT_ROLE_INOUT, LBOPT_DTYPE_FLOAT32, 1, "scales_numel; absent for fp32"},
    {"v_codes", LBOPT_ROLE_INOUT, kCodes, 0, "as m_codes"},
    {"v_scales", LBOPT_ROLE_INOUT, LBOPT_DTYPE_FLOAT32, 1, "as m_scales"},
    {"vmax_codes", LBOPT_ROLE_INOUT, kCodes, 1, "as m_codes; with amsgrad only"},
    {"vmax_scales", LBOPT_ROLE_INOUT, LBOPT_DTYPE_FLOAT32, 1, "as m_scales; with amsgrad only"},
    {"skipped", LBOPT_ROLE_OUT, LBOPT_DTYPE_UINT8, 1, "[1]: 1 when the step was skipped"},
};

// The tensor-lr step: lr and step are scalar tensors read when the step runs, so a compiled or captured program
// (torch.compile, CUDA graphs, jax.jit) that calls it keeps one lr-independent form.
const lbopt_tensor_arg kCapturableTensors[] = {
    kStepTensors[0], kStepTensors[1], kStepTensors[2], kStepTensors[3], kStepTensors[4], kStepTensors[5],
    kStepTensors[6], kStepTensors[7],
    {"lr", LBOPT_ROLE_IN, LBOPT_DTYPE_FLOAT32 | LBOPT_DTYPE_FLOAT64, 0, "one element, on the param's device"},
    {"step", LBOPT_ROLE_IN, LBOPT_DTYPE_INT64 | LBOPT_DTYPE_FLOAT32, 0, "one element: the step this call makes"},
    kStepTensors[8],
};

// Step attributes: lr and step by value, then the hyper-parameters that the tensor-lr step shares.
const lbopt_attr_arg kStepAttrs[] = {
    {"lr", LBOPT_ATTR_DOUBLE, 1, 0.0, 0, nullptr},
    {"step", LBOPT_ATTR_INT64, 1, 0.0, 0, nullptr},
    {"beta1", LBOPT_ATTR_DOUBLE, 0, default_config(LBOPT_OPTIMIZER_ADAMW).beta1, 0, nullptr},
    {"beta2", LBOPT_ATTR_DOUBLE, 0, default_config(LBOPT_OPTIMIZER_ADAMW).beta2, 0, nullptr},
    {"eps", LBOPT_ATTR_DOUBLE, 0, default_config(LBOPT_OPTIMIZER_ADAMW).eps, 0, nullptr},
    {"weight_decay", LBOPT_ATTR_DOUBLE, 0, default_config(LBOPT_OPTIMIZER_ADAMW).weight_decay, 0, nullptr},
    {"adam", LBOPT_ATTR_BOOL, 0, 0.0, 0, nullptr},
    {"amsgrad", LBOPT_ATTR_BOOL, 0, 0.0, 0, nullptr},
    {"maximize", LBOPT_ATTR_BOOL, 0, 0.0, 0, nullptr},
    {"bf16_stochastic_round", LBOPT_ATTR_BOOL, 0, 0.0, 0, nullptr},
    {"skip_nonfinite", LBOPT_ATTR_BOOL, 0, 0.0, 0, nullptr},
    {"seed", LBOPT_ATTR_INT64, 0, 0.0, 0, nullptr},
};

const lbopt_tensor_arg kQuantizeTensors[] = {
    {"src", LBOPT_ROLE_IN, LBOPT_DTYPE_FLOAT32, 0, "any shape"},
    {"codes", LBOPT_ROLE_OUT, kCodes, 0, "lbopt_state_layout(kind, numel(src)).codes_numel"},
    {"scales", LBOPT_ROLE_OUT, LBOPT_DTYPE_FLOAT32, 1, "scales_numel; absent for fp32"},
};
const lbopt_tensor_arg kDequantizeTensors[] = {
    {"codes", LBOPT_ROLE_IN, kCodes, 0, "lbopt_state_layout(kind, numel(dst)).codes_numel"},
    {"scales", LBOPT_ROLE_IN, LBOPT_DTYPE_FLOAT32, 1, "scales_numel; absent for fp32"},
    {"dst", LBOPT_ROLE_OUT, LBOPT_DTYPE_FLOAT32, 0, "any shape"},
};
const lbopt_attr_arg kConvertAttrs[] = {
    {"kind", LBOPT_ATTR_STRING, 1, 0.0, 0, nullptr},
    {"moment", LBOPT_ATTR_STRING, 0, 0.0, 0, "m"},
};

const lbopt_tensor_arg kInitTensors[] = {
    {"codes", LBOPT_ROLE_OUT, kCodes, 0, "lbopt_state_layout(kind, numel).codes_numel"},
    {"scales", LBOPT_ROLE_OUT, LBOPT_DTYPE_FLOAT32, 1, "scales_numel; absent for fp32"},
};
const lbopt_tensor_arg kLayoutTensors[] = {
    {"out", LBOPT_ROLE_OUT, LBOPT_DTYPE_INT64, 0, "[4] on the CPU: codes_numel, codes_bytes, scales_numel, block_size"},
};
const lbopt_attr_arg kSizedAttrs[] = {
    {"kind", LBOPT_ATTR_STRING, 1, 0.0, 0, nullptr},
    {"numel", LBOPT_ATTR_INT64, 1, 0.0, 0, nullptr},
};

const lbopt_attr_arg* const kHyperAttrs = kStepAttrs + 2;
constexpr size_t kNumHyperAttrs = sizeof(kStepAttrs) / sizeof(kStepAttrs[0]) - 2;

enum OpId {
  kStep4, kStep8, kStepFp8, kStepFp32, kQuantize, kDequantize, kStateInit, kStateLayout,
  kCapturable4, kCapturable8, kCapturableFp8, kCapturableFp32, kOpCount
};

#define LBOPT_ARRAY(a) sizeof(a) / sizeof((a)[0]), a
const lbopt_op_info kOps[kOpCount] = {
    {sizeof(lbopt_op_info), "lbopt.adamw_step.4bit", 1, "Fused AdamW/Adam step, 4-bit states",
     LBOPT_ARRAY(kStepTensors), LBOPT_ARRAY(kStepAttrs)},
    {sizeof(lbopt_op_info), "lbopt.adamw_step.8bit", 1, "Fused AdamW/Adam step, 8-bit states",
     LBOPT_ARRAY(kStepTensors), LBOPT_ARRAY(kStepAttrs)},
    {sizeof(lbopt_op_info), "lbopt.adamw_step.fp8", 1, "Fused AdamW/Adam step, float8 e4m3 states",
     LBOPT_ARRAY(kStepTensors), LBOPT_ARRAY(kStepAttrs)},
    {sizeof(lbopt_op_info), "lbopt.adamw_step.fp32", 1, "Fused AdamW/Adam step, fp32 states",
     LBOPT_ARRAY(kStepTensors), LBOPT_ARRAY(kStepAttrs)},
    {sizeof(lbopt_op_info), "lbopt.quantize", 1, "float32 -> state (moment 'm' or 'v')",
     LBOPT_ARRAY(kQuantizeTensors), LBOPT_ARRAY(kConvertAttrs)},
    {sizeof(lbopt_op_info), "lbopt.dequantize", 1, "state -> float32 (moment 'm' or 'v')",
     LBOPT_ARRAY(kDequantizeTensors), LBOPT_ARRAY(kConvertAttrs)},
    {sizeof(lbopt_op_info), "lbopt.state_init", 1, "zero a state (decodes to 0)", LBOPT_ARRAY(kInitTensors),
     LBOPT_ARRAY(kSizedAttrs)},
    {sizeof(lbopt_op_info), "lbopt.state_layout", 1, "sizes of one state of numel elements",
     LBOPT_ARRAY(kLayoutTensors), LBOPT_ARRAY(kSizedAttrs)},
    {sizeof(lbopt_op_info), "lbopt.adamw_step_capturable.4bit", 1,
     "Fused AdamW/Adam step, 4-bit states, lr and step read from scalar tensors", LBOPT_ARRAY(kCapturableTensors),
     kNumHyperAttrs, kHyperAttrs},
    {sizeof(lbopt_op_info), "lbopt.adamw_step_capturable.8bit", 1,
     "Fused AdamW/Adam step, 8-bit states, lr and step read from scalar tensors", LBOPT_ARRAY(kCapturableTensors),
     kNumHyperAttrs, kHyperAttrs},
    {sizeof(lbopt_op_info), "lbopt.adamw_step_capturable.fp8", 1,
     "Fused AdamW/Adam step, float8 e4m3 states, lr and step read from scalar tensors",
     LBOPT_ARRAY(kCapturableTensors), kNumHyperAttrs, kHyperAttrs},
    {sizeof(lbopt_op_info), "lbopt.adamw_step_capturable.fp32", 1,
     "Fused AdamW/Adam step, fp32 states, lr and step read from scalar tensors", LBOPT_ARRAY(kCapturableTensors),
     kNumHyperAttrs, kHyperAttrs},
};
#undef LBOPT_ARRAY

const char* type_name(int32_t t) {
  static const char* names[] = {"DOUBLE", "INT64", "BOOL", "STRING"};
  return t >= 0 && t < 4 ? names[t] : "unknown";
}

constexpr size_t kMaxAttrs = 16;
static_assert(sizeof(kStepAttrs) / sizeof(kStepAttrs[0]) <= kMaxAttrs, "Attrs holds every attribute of an op");

// Attribute values of one invoke, in schema order, defaults filled in.
struct Attrs {
  lbopt_attr v[kMaxAttrs];
  const lbopt_attr& operator[](size_t i) const { return v[i]; }
};

lbopt_status resolve(const lbopt_op_info& op, const lbopt_attr* attrs, size_t n_attrs, Attrs* out) {
  bool seen[kMaxAttrs] = {};
  if (n_attrs && !attrs) return fail(LBOPT_ERR_NULL_POINTER, "attrs: NULL with n_attrs = %zu", n_attrs);
  for (size_t i = 0; i < n_attrs; ++i) {
    const lbopt_attr& a = attrs[i];
    if (!a.name) return fail(LBOPT_ERR_NULL_POINTER, "attrs[%zu].name: NULL", i);
    size_t k = 0;
    while (k < op.n_attrs && strcmp(op.attrs[k].name, a.name) != 0) ++k;
    if (k == op.n_attrs)
      return fail(LBOPT_ERR_INVALID_VALUE, "attrs[%zu]: unknown attribute '%s' for %s", i, a.name, op.name);
    if (seen[k]) return fail(LBOPT_ERR_INVALID_VALUE, "attrs[%zu]: attribute '%s' given twice", i, a.name);
    if (a.type != op.attrs[k].type)
      return fail(LBOPT_ERR_DTYPE, "attrs[%zu] '%s': type %s, %s takes %s", i, a.name, type_name(a.type), op.name,
                  type_name(op.attrs[k].type));
    if (a.type == LBOPT_ATTR_STRING && !a.s) return fail(LBOPT_ERR_NULL_POINTER, "attrs[%zu] '%s': NULL string", i, a.name);
    if (a.type == LBOPT_ATTR_BOOL && a.i != 0 && a.i != 1)
      return fail(LBOPT_ERR_INVALID_VALUE, "attrs[%zu] '%s': bool %lld is not 0 or 1", i, a.name, (long long)a.i);
    seen[k] = true;
    out->v[k] = a;
  }
  for (size_t k = 0; k < op.n_attrs; ++k) {
    if (seen[k]) continue;
    const lbopt_attr_arg& s = op.attrs[k];
    if (s.required) return fail(LBOPT_ERR_INVALID_VALUE, "attribute '%s' of %s is required", s.name, op.name);
    out->v[k] = lbopt_attr{s.name, s.type, s.default_double, s.default_int, s.default_string};
  }
  return LBOPT_OK;
}

lbopt_status kind_of(const char* s, lbopt_state_kind* out) {
  static const char* names[] = {"4bit", "8bit", "fp8", "fp32"};
  for (int k = 0; k < 4; ++k)
    if (strcmp(s, names[k]) == 0) {
      *out = lbopt_state_kind(k);
      return LBOPT_OK;
    }
  return fail(LBOPT_ERR_INVALID_VALUE, "attribute 'kind' = '%s' is not 4bit, 8bit, fp8 or fp32", s);
}

lbopt_status moment_of(const char* s, lbopt_moment* out) {
  if (strcmp(s, "m") == 0) *out = LBOPT_MOMENT_FIRST;
  else if (strcmp(s, "v") == 0) *out = LBOPT_MOMENT_SECOND;
  else return fail(LBOPT_ERR_INVALID_VALUE, "attribute 'moment' = '%s' is not 'm' or 'v'", s);
  return LBOPT_OK;
}

// An attribute of a resolved invoke, by name (every name asked for is in the op's schema).
const lbopt_attr& attr(const lbopt_op_info& op, const Attrs& a, const char* name) {
  size_t k = 0;
  while (strcmp(op.attrs[k].name, name) != 0) ++k;
  return a[k];
}

// lr_t / step_t: the tensor-lr step's scalars (NULL for the by-value step, which reads the attributes).
lbopt_status invoke_step(const lbopt_op_info& op, lbopt_state_kind kind, const DLTensor* const* t, const Attrs& a,
                         const DLTensor* lr_t, const DLTensor* step_t, const DLTensor* skipped, void* stream) {
  lbopt_adamw_config cfg;
  LBOPT_TRY(lbopt_adamw_config_init(&cfg, sizeof cfg));
  cfg.state_kind = kind;
  cfg.beta1 = attr(op, a, "beta1").f;
  cfg.beta2 = attr(op, a, "beta2").f;
  cfg.eps = attr(op, a, "eps").f;
  cfg.weight_decay = attr(op, a, "weight_decay").f;
  cfg.flags = 0;
  for (const auto& [name, flag] : {std::pair<const char*, uint32_t>{"adam", LBOPT_FLAG_ADAM_COUPLED_DECAY},
                                   {"amsgrad", LBOPT_FLAG_AMSGRAD}, {"maximize", LBOPT_FLAG_MAXIMIZE},
                                   {"bf16_stochastic_round", LBOPT_FLAG_BF16_STOCHASTIC_ROUND},
                                   {"skip_nonfinite", LBOPT_FLAG_SKIP_NONFINITE}})
    if (attr(op, a, name).i) cfg.flags |= flag;
  cfg.seed = uint64_t(attr(op, a, "seed").i);
  const int64_t step = lr_t ? 1 : attr(op, a, "step").i;  // the capturable step ignores the slot's
  const lbopt_adamw_slot slot{sizeof slot, t[0], t[1], {t[2], t[3]}, {t[4], t[5]}, {t[6], t[7]}, step};
  lbopt_step_options opts;
  LBOPT_TRY(lbopt_step_options_init(&opts, sizeof opts));
  opts.skipped = skipped;
  opts.stream = stream;
  if (lr_t) return lbopt_adamw_step_capturable(&cfg, lr_t, step_t, &slot, 1, &opts);
  return lbopt_adamw_step(&cfg, attr(op, a, "lr").f, &slot, 1, &opts);
}

lbopt_status invoke(OpId id, const lbopt_op_info& op, const DLTensor* const* t, const Attrs& a, void* stream) {
  lbopt_state_kind kind = LBOPT_STATE_4BIT;
  lbopt_moment moment = LBOPT_MOMENT_FIRST;
  switch (id) {
    case kStep4:
    case kStep8:
    case kStepFp8:
    case kStepFp32: return invoke_step(op, lbopt_state_kind(id - kStep4), t, a, nullptr, nullptr, t[8], stream);
    case kCapturable4:
    case kCapturable8:
    case kCapturableFp8:
    case kCapturableFp32:
      return invoke_step(op, lbopt_state_kind(id - kCapturable4), t, a, t[8], t[9], t[10], stream);
    case kQuantize:
      LBOPT_TRY(kind_of(a[0].s, &kind));
      LBOPT_TRY(moment_of(a[1].s, &moment));
      return lbopt_quantize(kind, moment, t[0], lbopt_state{t[1], t[2]}, stream);
    case kDequantize:
      LBOPT_TRY(kind_of(a[0].s, &kind));
      LBOPT_TRY(moment_of(a[1].s, &moment));
      return lbopt_dequantize(kind, moment, lbopt_state{t[0], t[1]}, t[2], stream);
    case kStateInit:
      LBOPT_TRY(kind_of(a[0].s, &kind));
      return lbopt_state_init(kind, a[1].i, lbopt_state{t[0], t[1]}, stream);
    case kStateLayout: {
      LBOPT_TRY(kind_of(a[0].s, &kind));
      const DLTensor* out = t[0];
      const uintptr_t addr = uintptr_t(out->data) + out->byte_offset;
      if (out->device.device_type != kDLCPU || out->dtype.code != kDLInt || out->dtype.bits != 64 ||
          out->dtype.lanes != 1 || out->ndim != 1 || !out->shape || out->shape[0] != 4 || !out->data ||
          (out->strides && out->strides[0] != 1) || addr < uintptr_t(out->data) || addr % 8 != 0)
        return fail(LBOPT_ERR_SHAPE, "tensors[0] (out): must be a compact, aligned int64 [4] CPU tensor");
      lbopt_layout l;
      LBOPT_TRY(lbopt_state_layout(kind, a[1].i, &l, sizeof l));
      int64_t* o = reinterpret_cast<int64_t*>(addr);
      o[0] = l.codes_numel;
      o[1] = l.codes_bytes;
      o[2] = l.scales_numel;
      o[3] = l.block_size;
      return LBOPT_OK;
    }
    case kOpCount: break;
  }
  return fail(LBOPT_ERR_INTERNAL, "operator id %d has no implementation", int(id));
}

}  // namespace
}  // namespace lbopt

using namespace lbopt;

extern "C" size_t lbopt_op_count(void) { return kOpCount; }

extern "C" const lbopt_op_info* lbopt_op_schema(size_t i) { return i < size_t(kOpCount) ? &kOps[i] : nullptr; }

extern "C" const lbopt_op_info* lbopt_op_find(const char* name) {
  if (!name) return nullptr;
  for (const lbopt_op_info& op : kOps)
    if (strcmp(op.name, name) == 0) return &op;
  return nullptr;
}

extern "C" lbopt_status lbopt_op_invoke(const lbopt_op_info* op, const DLTensor* const* tensors, size_t n_tensors,
                                        const lbopt_attr* attrs, size_t n_attrs, void* stream) {
  clear_error();
  if (!op) return fail(LBOPT_ERR_NULL_POINTER, "op: NULL");
  const ptrdiff_t id = op - kOps;
  if (id < 0 || id >= kOpCount) return fail(LBOPT_ERR_INVALID_VALUE, "op: not an operator of this library");
  if (n_tensors != op->n_tensors)
    return fail(LBOPT_ERR_INVALID_VALUE, "n_tensors = %zu, %s takes %zu", n_tensors, op->name, op->n_tensors);
  if (!tensors) return fail(LBOPT_ERR_NULL_POINTER, "tensors: NULL");
  for (size_t i = 0; i < n_tensors; ++i)
    if (!tensors[i] && !op->tensors[i].optional)
      return fail(LBOPT_ERR_NULL_POINTER, "tensors[%zu] (%s): NULL, and %s requires it", i, op->tensors[i].name,
                  op->name);
  Attrs values;
  LBOPT_TRY(resolve(*op, attrs, n_attrs, &values));
  return invoke(OpId(id), *op, tensors, values, stream);
}

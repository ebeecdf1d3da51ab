// The operator registry: schemas, and one generic invoke that resolves attributes by name and forwards to the typed
// entry points (which do all tensor validation), so both paths share every check and every result.
#include <stdio.h>
#include <string.h>

#include <type_traits>

#include "../kernels/optimizers.h"
#include "../kernels/quant.h"
#include "config_fields.h"
#include "defaults.h"
#include "error.h"
#include "lbopt.h"
#include "validate.h"

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

// The by-value step's lr and step; the hyper-parameters that follow come from the optimizer's descriptor.
const lbopt_attr_arg kLrAttr = {"lr", LBOPT_ATTR_DOUBLE, 1, 0.0, 0, nullptr};
const lbopt_attr_arg kStepAttr = {"step", LBOPT_ATTR_INT64, 1, 0.0, 0, nullptr};

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

// The operators of 0.1 and 0.2, written out: their tensor names (m, v, vmax) and order predate lbopt_step, and
// bindings depend on them. They keep their indices; the generated step operators follow. The AdamW steps'
// attributes are AdamW's descriptor's, set when the registry is built.
enum OpId {
  kStep4, kStep8, kStepFp8, kStepFp32, kQuantize, kDequantize, kStateInit, kStateLayout,
  kCapturable4, kCapturable8, kCapturableFp8, kCapturableFp32, kNumFixedOps
};

#define LBOPT_ARRAY(a) sizeof(a) / sizeof((a)[0]), a
const lbopt_op_info kFixedOps[kNumFixedOps] = {
    {sizeof(lbopt_op_info), "lbopt.adamw_step.4bit", 1, "Fused AdamW/Adam step, 4-bit states",
     LBOPT_ARRAY(kStepTensors), 0, nullptr},
    {sizeof(lbopt_op_info), "lbopt.adamw_step.8bit", 1, "Fused AdamW/Adam step, 8-bit states",
     LBOPT_ARRAY(kStepTensors), 0, nullptr},
    {sizeof(lbopt_op_info), "lbopt.adamw_step.fp8", 1, "Fused AdamW/Adam step, float8 e4m3 states",
     LBOPT_ARRAY(kStepTensors), 0, nullptr},
    {sizeof(lbopt_op_info), "lbopt.adamw_step.fp32", 1, "Fused AdamW/Adam step, fp32 states",
     LBOPT_ARRAY(kStepTensors), 0, nullptr},
    {sizeof(lbopt_op_info), "lbopt.quantize", 1, "float32 -> state (moment 'm', 'v' or 'v_signed')",
     LBOPT_ARRAY(kQuantizeTensors), LBOPT_ARRAY(kConvertAttrs)},
    {sizeof(lbopt_op_info), "lbopt.dequantize", 1, "state -> float32 (moment 'm', 'v' or 'v_signed')",
     LBOPT_ARRAY(kDequantizeTensors), LBOPT_ARRAY(kConvertAttrs)},
    {sizeof(lbopt_op_info), "lbopt.state_init", 1, "zero a state (decodes to 0)", LBOPT_ARRAY(kInitTensors),
     LBOPT_ARRAY(kSizedAttrs)},
    {sizeof(lbopt_op_info), "lbopt.state_layout", 1, "sizes of one state of numel elements",
     LBOPT_ARRAY(kLayoutTensors), LBOPT_ARRAY(kSizedAttrs)},
    {sizeof(lbopt_op_info), "lbopt.adamw_step_capturable.4bit", 1,
     "Fused AdamW/Adam step, 4-bit states, lr and step read from scalar tensors", LBOPT_ARRAY(kCapturableTensors),
     0, nullptr},
    {sizeof(lbopt_op_info), "lbopt.adamw_step_capturable.8bit", 1,
     "Fused AdamW/Adam step, 8-bit states, lr and step read from scalar tensors", LBOPT_ARRAY(kCapturableTensors),
     0, nullptr},
    {sizeof(lbopt_op_info), "lbopt.adamw_step_capturable.fp8", 1,
     "Fused AdamW/Adam step, float8 e4m3 states, lr and step read from scalar tensors",
     LBOPT_ARRAY(kCapturableTensors), 0, nullptr},
    {sizeof(lbopt_op_info), "lbopt.adamw_step_capturable.fp32", 1,
     "Fused AdamW/Adam step, fp32 states, lr and step read from scalar tensors", LBOPT_ARRAY(kCapturableTensors),
     0, nullptr},
};
#undef LBOPT_ARRAY

// Every optimizer but AdamW (whose operators are the fixed ones above) gets step operators generated when the
// registry is built, all from the engine: op names from lbopt_optimizer_name and lbopt_state_kind_name, docs from
// the descriptor's kTitle, the state tensors from its state names (those lbopt_optimizer_states reports), optional
// under its kStateless setting, the attributes from its descriptor (its params, then its flags; types from
// kConfigFields, defaults from default_config). Tensors: param, grad, (codes, scales) per state, [lr, step,]
// skipped; attributes: [lr, step,] the optimizer's own, then kCommonAttrs.
constexpr const char* kCommonAttrs[] = {"maximize", "bf16_stochastic_round", "skip_nonfinite",
                                        "state_stochastic_round", "state_nearest_round", "seed"};

constexpr size_t kNumKinds = kNumStateKinds;  // state_kinds.h's count, as the size_t the op tables index by
constexpr size_t kNumFamilies = size_t(kNumOptimizers) - 1;  // every optimizer but AdamW (id 0)
constexpr size_t kOpsPerFamily = 2 * kNumKinds;  // by-value, then capturable, each for every kind
constexpr size_t kOpCount = kNumFixedOps + kNumFamilies * kOpsPerFamily;

constexpr size_t kMaxAttrs = 20;

// The step attributes of an optimizer: lr and step, its descriptor's params, then its flags, then kCommonAttrs,
// with the types of kConfigFields and the defaults of default_config.
struct StepAttrs {
  lbopt_attr_arg v[kMaxAttrs];
  size_t n = 0;
};

lbopt_attr_arg schema_of(const ConfigField& f, const Config& defaults) {
  lbopt_attr_arg a{f.name, f.type, 0, 0.0, 0, nullptr};
  if (f.type == LBOPT_ATTR_DOUBLE) a.default_double = defaults.*f.value;
  else if (f.type == LBOPT_ATTR_BOOL) a.default_int = (defaults.flags & f.flag) != 0;
  else a.default_int = int64_t(defaults.seed);
  return a;
}

template <class Opt>
void step_attrs(const Config& defaults, StepAttrs* a) {
  static_assert(2 + sizeof Opt::kParams / sizeof(Param) + sizeof Opt::kFlagNames / sizeof(char*) +
                        sizeof kCommonAttrs / sizeof(char*) <= kMaxAttrs,
                "StepAttrs holds every attribute of a step operator");
  a->v[a->n++] = kLrAttr;
  a->v[a->n++] = kStepAttr;
  for (const Param& p : Opt::kParams) a->v[a->n++] = schema_of(*config_field(p.name), defaults);
  for (const char* name : Opt::kFlagNames)
    if (name) a->v[a->n++] = schema_of(*config_field(name), defaults);
  for (const char* name : kCommonAttrs) a->v[a->n++] = schema_of(*config_field(name), defaults);
}

StepAttrs step_attrs(lbopt_optimizer optimizer) {
  StepAttrs a;
  with_optimizer(optimizer, [&a, optimizer](auto opt) { step_attrs<decltype(opt)>(default_config(optimizer), &a); });
  return a;
}

// One family's schemas: the text and arrays its operators point into.
struct FamilySchemas {
  char state_names[2 * LBOPT_MAX_STATES][32];  // <state>_codes, <state>_scales
  char codes_shape[96];
  lbopt_tensor_arg tensors[2][2 + 2 * LBOPT_MAX_STATES + 3];  // [capturable]
  StepAttrs attrs;  // lr and step, then those the capturable operators take too
  char names[kOpsPerFamily][48], docs[kOpsPerFamily][112];
};

// What invoking a generated operator needs beyond its schema.
struct StepOp {
  lbopt_optimizer optimizer;
  lbopt_state_kind kind;
  bool capturable;
  size_t n_states;
};

void build(lbopt_optimizer optimizer, FamilySchemas* s, lbopt_op_info* ops, StepOp* steps) {
  // The engine's names, not lbopt_optimizer_states: that is a status-returning call, and building the registry
  // inside lbopt_op_find must not clear the caller's lbopt_last_error().
  const char *title = nullptr, *stateless = nullptr;
  const size_t n_states = with_optimizer(optimizer, [&](auto opt) {
    using Opt = decltype(opt);
    title = Opt::kTitle;
    stateless = Opt::kStateless;
    for (int k = 0; k < Opt::kMaxStates; ++k) {
      snprintf(s->state_names[2 * k], sizeof s->state_names[0], "%s_codes", Opt::kStateNames[k]);
      snprintf(s->state_names[2 * k + 1], sizeof s->state_names[0], "%s_scales", Opt::kStateNames[k]);
    }
    return size_t(Opt::kMaxStates);
  });
  snprintf(s->codes_shape, sizeof s->codes_shape, "lbopt_state_layout(kind, numel(param)).codes_numel%s%s",
           stateless ? "; absent with " : "", stateless ? stateless : "");
  size_t n_tensors = 0;
  for (int cap = 0; cap < 2; ++cap) {
    lbopt_tensor_arg* t = s->tensors[cap];
    size_t n = 0;
    t[n++] = kStepTensors[0];  // param
    t[n++] = kStepTensors[1];  // grad
    for (size_t k = 0; k < n_states; ++k) {
      t[n++] = {s->state_names[2 * k], LBOPT_ROLE_INOUT, kCodes, stateless != nullptr, s->codes_shape};
      t[n++] = {s->state_names[2 * k + 1], LBOPT_ROLE_INOUT, LBOPT_DTYPE_FLOAT32, 1, kStepTensors[3].shape};
    }
    if (cap) {
      t[n++] = kCapturableTensors[8];  // lr
      t[n++] = kCapturableTensors[9];  // step
    }
    t[n++] = kStepTensors[8];  // skipped
    if (!cap) n_tensors = n;
  }
  s->attrs = step_attrs(optimizer);
  const char* name = lbopt_optimizer_name(optimizer);
  for (size_t i = 0; i < kOpsPerFamily; ++i) {
    const bool cap = i >= kNumKinds;
    const lbopt_state_kind kind = lbopt_state_kind(i % kNumKinds);
    snprintf(s->names[i], sizeof s->names[i], "lbopt.%s_step%s.%s", name, cap ? "_capturable" : "",
             lbopt_state_kind_name(kind));
    snprintf(s->docs[i], sizeof s->docs[i], "Fused %s step, %s states%s", title, state_kind_doc(kind),
             cap ? ", lr and step read from scalar tensors" : "");
    const size_t skip = cap ? 2 : 0;  // the capturable operators take lr and step as tensors, not attributes
    ops[i] = {sizeof(lbopt_op_info), s->names[i], 1, s->docs[i], n_tensors + skip, s->tensors[cap],
              s->attrs.n - skip, s->attrs.v + skip};
    steps[i] = {optimizer, kind, cap, n_states};
  }
}

// Every operator, built on first use. Trivially destructible, so the schemas stay valid while static objects are
// destroyed (a host may still walk them from its own destructors). The fixed ones are copied in, so that one
// array holds all and an lbopt_op_info pointer gives its index.
struct Registry {
  lbopt_op_info ops[kOpCount];
  StepOp steps[kOpCount - kNumFixedOps];
  FamilySchemas families[kNumFamilies];
  StepAttrs adamw_attrs;
  Registry() : ops{}, steps{}, families{}, adamw_attrs(step_attrs(LBOPT_OPTIMIZER_ADAMW)) {
    for (size_t i = 0; i < kNumFixedOps; ++i) ops[i] = kFixedOps[i];
    for (size_t i = kStep4; i <= kStepFp32; ++i) ops[i].n_attrs = adamw_attrs.n, ops[i].attrs = adamw_attrs.v;
    for (size_t i = kCapturable4; i <= kCapturableFp32; ++i)  // lr and step are tensors there
      ops[i].n_attrs = adamw_attrs.n - 2, ops[i].attrs = adamw_attrs.v + 2;
    for (size_t f = 0; f < kNumFamilies; ++f)
      build(lbopt_optimizer(f + 1), &families[f], ops + kNumFixedOps + f * kOpsPerFamily, steps + f * kOpsPerFamily);
  }
};
static_assert(std::is_trivially_destructible<Registry>::value, "no destructor runs at exit");

const Registry& registry() {
  static const Registry r;  // thread-safe initialization
  return r;
}

// Attribute values of one invoke, in schema order, defaults filled in.
struct Attrs {
  lbopt_attr v[kMaxAttrs];
  const lbopt_attr& operator[](size_t i) const { return v[i]; }
};

// An attribute of a resolved invoke, by name (every name asked for is in the op's schema).
const lbopt_attr& attr(const lbopt_op_info& op, const Attrs& a, const char* name) {
  size_t k = 0;
  while (strcmp(op.attrs[k].name, name) != 0) ++k;
  return a[k];
}

// The config an invoke describes: the optimizer's defaults, then every attribute of the op (given or defaulted)
// on the field of its name.
lbopt_status config_of(lbopt_optimizer optimizer, lbopt_state_kind kind, const lbopt_op_info& op, const Attrs& a,
                       Config* c) {
  LBOPT_TRY(lbopt_optimizer_config_init(c, sizeof *c, optimizer));
  c->state_kind = kind;
  for (size_t k = 0; k < op.n_attrs; ++k) {
    const ConfigField* f = config_field(op.attrs[k].name);
    if (!f) continue;
    if (f->type == LBOPT_ATTR_DOUBLE) c->*(f->value) = a[k].f;
    else if (f->type == LBOPT_ATTR_BOOL) c->flags = a[k].i ? c->flags | f->flag : c->flags & ~f->flag;
    else c->seed = uint64_t(a[k].i);
  }
  return LBOPT_OK;
}

lbopt_status options_of(const DLTensor* skipped, void* stream, lbopt_step_options* o) {
  LBOPT_TRY(lbopt_step_options_init(o, sizeof *o));
  o->skipped = skipped;
  o->stream = stream;
  return LBOPT_OK;
}

// The AdamW operators call the AdamW entry points, whose messages name the states m, v and vmax as these
// operators' tensors do. lr_t / step_t: the tensor-lr step's scalars (NULL for the by-value step).
lbopt_status invoke_adamw(const lbopt_op_info& op, lbopt_state_kind kind, const DLTensor* const* t, const Attrs& a,
                          const DLTensor* lr_t, const DLTensor* step_t, const DLTensor* skipped, void* stream) {
  Config c;
  LBOPT_TRY(config_of(LBOPT_OPTIMIZER_ADAMW, kind, op, a, &c));
  lbopt_adamw_config cfg;
  LBOPT_TRY(lbopt_adamw_config_init(&cfg, sizeof cfg));
  cfg.state_kind = c.state_kind;
  cfg.beta1 = c.beta1;
  cfg.beta2 = c.beta2;
  cfg.eps = c.eps;
  cfg.weight_decay = c.weight_decay;
  cfg.flags = c.flags;
  cfg.seed = c.seed;
  const int64_t step = lr_t ? 1 : attr(op, a, "step").i;  // the capturable step ignores the slot's
  const lbopt_adamw_slot slot{sizeof slot, t[0], t[1], {t[2], t[3]}, {t[4], t[5]}, {t[6], t[7]}, step};
  lbopt_step_options opts;
  LBOPT_TRY(options_of(skipped, stream, &opts));
  if (lr_t) return lbopt_adamw_step_capturable(&cfg, lr_t, step_t, &slot, 1, &opts);
  return lbopt_adamw_step(&cfg, attr(op, a, "lr").f, &slot, 1, &opts);
}

// A generated step operator: one slot of lbopt_step (or lbopt_step_capturable). States the config does not use
// (SGD without momentum) arrive as NULL tensors, which is the {NULL, NULL} lbopt_step wants for them.
lbopt_status invoke_step(const StepOp& s, const lbopt_op_info& op, const DLTensor* const* t, const Attrs& a,
                         void* stream) {
  Config cfg;
  LBOPT_TRY(config_of(s.optimizer, s.kind, op, a, &cfg));
  lbopt_slot slot{};
  slot.struct_size = sizeof slot;
  slot.param = t[0];
  slot.grad = t[1];
  for (size_t k = 0; k < s.n_states; ++k) slot.states[k] = {t[2 + 2 * k], t[3 + 2 * k]};
  slot.step = s.capturable ? 1 : attr(op, a, "step").i;
  lbopt_step_options opts;
  LBOPT_TRY(options_of(t[op.n_tensors - 1], stream, &opts));
  const DLTensor* const* scalars = t + 2 + 2 * s.n_states;  // lr, step of the capturable form
  if (s.capturable) return lbopt_step_capturable(&cfg, scalars[0], scalars[1], &slot, 1, &opts);
  return lbopt_step(&cfg, attr(op, a, "lr").f, &slot, 1, &opts);
}

lbopt_status invoke(size_t id, const lbopt_op_info& op, const DLTensor* const* t, const Attrs& a, void* stream) {
  if (id >= kNumFixedOps) return invoke_step(registry().steps[id - kNumFixedOps], op, t, a, stream);
  lbopt_state_kind kind = LBOPT_STATE_4BIT;
  lbopt_moment moment = LBOPT_MOMENT_FIRST;
  switch (OpId(id)) {
    case kStep4:
    case kStep8:
    case kStepFp8:
    case kStepFp32: return invoke_adamw(op, lbopt_state_kind(id - kStep4), t, a, nullptr, nullptr, t[8], stream);
    case kCapturable4:
    case kCapturable8:
    case kCapturableFp8:
    case kCapturableFp32:
      return invoke_adamw(op, lbopt_state_kind(id - kCapturable4), t, a, t[8], t[9], t[10], stream);
    case kQuantize:
      LBOPT_TRY(validate_kind_name(attr(op, a, "kind").s, &kind));
      LBOPT_TRY(validate_moment_name(attr(op, a, "moment").s, &moment));
      return lbopt_quantize(kind, moment, t[0], lbopt_state{t[1], t[2]}, stream);
    case kDequantize:
      LBOPT_TRY(validate_kind_name(attr(op, a, "kind").s, &kind));
      LBOPT_TRY(validate_moment_name(attr(op, a, "moment").s, &moment));
      return lbopt_dequantize(kind, moment, lbopt_state{t[0], t[1]}, t[2], stream);
    case kStateInit:
      LBOPT_TRY(validate_kind_name(attr(op, a, "kind").s, &kind));
      return lbopt_state_init(kind, attr(op, a, "numel").i, lbopt_state{t[0], t[1]}, stream);
    case kStateLayout: {
      LBOPT_TRY(validate_kind_name(attr(op, a, "kind").s, &kind));
      int64_t* o = nullptr;
      LBOPT_TRY(validate_layout_out(t[0], &o));
      lbopt_layout l;
      LBOPT_TRY(lbopt_state_layout(kind, attr(op, a, "numel").i, &l, sizeof l));
      o[0] = l.codes_numel;
      o[1] = l.codes_bytes;
      o[2] = l.scales_numel;
      o[3] = l.block_size;
      return LBOPT_OK;
    }
    case kNumFixedOps: break;
  }
  return fail(LBOPT_ERR_INTERNAL, "operator id %zu has no implementation", id);
}

}  // namespace
}  // namespace lbopt

using namespace lbopt;

extern "C" size_t lbopt_op_count(void) { return kOpCount; }

extern "C" const lbopt_op_info* lbopt_op_schema(size_t i) { return i < kOpCount ? &registry().ops[i] : nullptr; }

extern "C" const lbopt_op_info* lbopt_op_find(const char* name) {
  if (!name) return nullptr;
  for (const lbopt_op_info& op : registry().ops)
    if (strcmp(op.name, name) == 0) return &op;
  return nullptr;
}

extern "C" lbopt_status lbopt_op_invoke(const lbopt_op_info* op, const DLTensor* const* tensors, size_t n_tensors,
                                        const lbopt_attr* attrs, size_t n_attrs, void* stream) {
  clear_error();
  size_t id = 0;
  LBOPT_TRY(validate_op(op, registry().ops, kOpCount, &id));
  LBOPT_TRY(validate_op_tensors(*op, tensors, n_tensors));
  Attrs values;
  LBOPT_TRY(validate_op_attrs(*op, attrs, n_attrs, values.v, kMaxAttrs));
  return invoke(id, *op, tensors, values, stream);
}

/*
 * lbopt: low-bit (4-bit, 8-bit, FP8) optimizer steps (AdamW/Adam, SGD with momentum, Lion, AdEMAMix) behind a
 * stable C ABI.
 *
 * A caller hands its own buffers over as DLPack DLTensors (borrowed, never owned), passes the learning rate as
 * a host double on every call, and gets a fused, in-place step. Every function returns an lbopt_status (or a
 * plain value that cannot fail); after a failure lbopt_last_error() says precisely what was wrong, and no
 * buffer has been written. See docs/abi.md for the full contract.
 *
 * C99. The only dependency is <dlpack/dlpack.h>.
 */
#ifndef LBOPT_H
#define LBOPT_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

/* ABI version. The major is the SONAME (liblbopt.so.<major>); symbols are never removed or changed within a
 * major, new ones are added in new version-script nodes. meson.build reads these macros. */
#define LBOPT_VERSION_MAJOR 0
#define LBOPT_VERSION_MINOR 4
#define LBOPT_VERSION_PATCH 0
#define LBOPT_MAKE_VERSION(major, minor, patch) \
  ((uint32_t)(((uint32_t)(major) << 16) | ((uint32_t)(minor) << 8) | (uint32_t)(patch)))
#define LBOPT_VERSION LBOPT_MAKE_VERSION(LBOPT_VERSION_MAJOR, LBOPT_VERSION_MINOR, LBOPT_VERSION_PATCH)

#if defined(_WIN32) && defined(LBOPT_BUILDING)
#define LBOPT_API __declspec(dllexport)
#elif defined(_WIN32)
#define LBOPT_API __declspec(dllimport)
#elif defined(__GNUC__)
#define LBOPT_API __attribute__((visibility("default")))
#else
#define LBOPT_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------------------- */
/* Status codes. Values are explicit and never reused. Anything but LBOPT_OK means nothing was written. */
typedef enum lbopt_status {
  LBOPT_OK = 0,
  LBOPT_ERR_NULL_POINTER = 1,     /* a required pointer (struct, tensor, data, shape) is NULL */
  LBOPT_ERR_STRUCT_SIZE = 2,      /* struct_size is not one this library knows */
  LBOPT_ERR_INVALID_VALUE = 3,    /* a hyper-parameter, enum, flag or count is out of range */
  LBOPT_ERR_DTYPE = 4,            /* unsupported dtype, or dtypes that must agree do not */
  LBOPT_ERR_DEVICE = 5,           /* tensors of one call on different devices, or a device type not accepted */
  LBOPT_ERR_SHAPE = 6,            /* shapes or element counts that must agree do not, or a negative dim */
  LBOPT_ERR_STRIDE = 7,           /* strides of no dense layout, or a grad laid out unlike its param */
  LBOPT_ERR_ALIGNMENT = 8,        /* data + byte_offset not aligned to the element size */
  LBOPT_ERR_BUFFER_SIZE = 9,      /* codes or scales buffer of the wrong size for the state kind and numel */
  LBOPT_ERR_OVERLAP = 10,         /* a buffer that is written overlaps another buffer of the call */
  LBOPT_ERR_NONFINITE = 11,       /* NaN/Inf in a tensor to be quantized (it would poison a block scale) */
  LBOPT_ERR_UNSUPPORTED = 12,     /* well-formed, but this build or machine cannot do it (e.g. no CUDA) */
  LBOPT_ERR_CUDA = 13,            /* a CUDA runtime error; lbopt_last_error() carries the CUDA text */
  LBOPT_ERR_OUT_OF_MEMORY = 14,   /* an internal allocation failed */
  LBOPT_ERR_INTERNAL = 15,        /* a bug in lbopt; please report the message */
  LBOPT_STATUS_INT32_ = 0x7fffffff, /* not statuses: the enum spans every int32, whatever a caller passes */
  LBOPT_STATUS_INT32_MIN_ = -0x7fffffff - 1
} lbopt_status;

/* Static text naming a status ("LBOPT_ERR_DTYPE: ..."); never NULL. */
LBOPT_API const char* lbopt_status_string(lbopt_status status);

/* The calling thread's message for the last status-returning lbopt call it made: "" after a success, a precise
 * sentence naming the argument after a failure. Valid until the thread's next such call; never NULL. */
LBOPT_API const char* lbopt_last_error(void);

/* ---------------------------------------------------------------------------------------------------------- */
/* Version and build. */

/* LBOPT_VERSION of the loaded library; compare its major with LBOPT_VERSION_MAJOR of your header. */
LBOPT_API uint32_t lbopt_version(void);
/* "MAJOR.MINOR.PATCH". */
LBOPT_API const char* lbopt_version_string(void);
/* A one-line JSON object: version, abi major, CPU kernel target, threads, whether CUDA is compiled in and
 * usable on this machine, CUDA architectures. Thread-local storage, valid until the thread's next call of this
 * function; never NULL. */
LBOPT_API const char* lbopt_build_info(void);

/* ---------------------------------------------------------------------------------------------------------- */
/* Optimizer state formats. */

typedef enum lbopt_state_kind {
  LBOPT_STATE_4BIT = 0, /* block 128: m on the signed dynamic 4-bit map, v on k/16 (k = 1..16); 2 codes/byte */
  LBOPT_STATE_8BIT = 1, /* block 256: m on the signed dynamic 8-bit map, v on the unsigned dynamic 8-bit map */
  LBOPT_STATE_FP8 = 2,  /* block 256: float8 e4m3fn codes (saturating), scale = absmax / 448 */
  LBOPT_STATE_FP32 = 3, /* plain float32 state, no scales */
  LBOPT_STATE_KIND_INT32_ = 0x7fffffff, /* not kinds: the enum spans every int32, whatever a caller passes */
  LBOPT_STATE_KIND_INT32_MIN_ = -0x7fffffff - 1
} lbopt_state_kind;

/* "4bit", "8bit", "fp8", "fp32": the names bindings use for the kinds; NULL for a value that is no kind.
 * Since 0.3. */
LBOPT_API const char* lbopt_state_kind_name(lbopt_state_kind kind);

/* Which moment a state holds: it selects the codebook (signed for m, non-negative for v and AMSGrad's vmax). */
typedef enum lbopt_moment {
  LBOPT_MOMENT_FIRST = 0, /* m, exp_avg */
  LBOPT_MOMENT_SECOND = 1, /* v, exp_avg_sq, and max_exp_avg_sq */
  LBOPT_MOMENT_SECOND_SIGNED = 2, /* a non-negative state on the 4-bit signed map's non-negative codes, a positive
                                     value never on the code of 0 (AdEMAMix's nu); as LBOPT_MOMENT_SECOND for
                                     the other kinds. Since 0.4 */
  LBOPT_MOMENT_INT32_ = 0x7fffffff, /* not moments: the enum spans every int32, whatever a caller passes */
  LBOPT_MOMENT_INT32_MIN_ = -0x7fffffff - 1
} lbopt_moment;

/* Sizes a caller allocates for one state (one moment) of a tensor with numel elements. */
typedef struct lbopt_layout {
  uint32_t struct_size;   /* bytes of this struct the library filled */
  DLDataType codes_dtype; /* uint8 for quantized kinds, float32 for LBOPT_STATE_FP32 */
  int64_t codes_numel;    /* elements of the codes tensor (4-bit: ceil(numel / 2)) */
  int64_t codes_bytes;
  int64_t scales_numel;   /* float32 scales, one per block (0 for LBOPT_STATE_FP32) */
  int64_t block_size;     /* elements per scale block (0 for LBOPT_STATE_FP32) */
} lbopt_layout;

/* Structs the library fills take the caller's sizeof: a caller built against an older, smaller struct is never
 * written past its end, and fields the library does not know are zeroed. */
LBOPT_API lbopt_status lbopt_state_layout(lbopt_state_kind kind, int64_t numel, lbopt_layout* out, size_t out_size);

/* One optimizer state: codes plus (for quantized kinds) float32 scales. Both are dense tensors of exactly
 * the sizes lbopt_state_layout gives, read in memory order; their shapes are free. */
typedef struct lbopt_state {
  const DLTensor* codes;
  const DLTensor* scales; /* NULL for LBOPT_STATE_FP32 */
} lbopt_state;

/* Zero a state (codes and scales), which decodes to exactly 0: the state of a parameter never stepped.
 * stream: a cudaStream_t for CUDA tensors, ignored on CPU. */
LBOPT_API lbopt_status lbopt_state_init(lbopt_state_kind kind, int64_t numel, lbopt_state state, void* stream);

/* Quantize a float32 tensor (any dense layout, read or written in memory order) into a state, and back. For
 * checkpoints, inspection, conversion from or to a torch.optim.AdamW state, or moving between bit widths.
 * quantize refuses NaN/Inf (LBOPT_ERR_NONFINITE) and, for LBOPT_MOMENT_SECOND, negative values
 * (LBOPT_ERR_INVALID_VALUE), before writing anything. */
LBOPT_API lbopt_status lbopt_quantize(lbopt_state_kind kind, lbopt_moment moment, const DLTensor* src,
                                      lbopt_state dst, void* stream);
LBOPT_API lbopt_status lbopt_dequantize(lbopt_state_kind kind, lbopt_moment moment, lbopt_state src,
                                        const DLTensor* dst, void* stream);

/* ---------------------------------------------------------------------------------------------------------- */
/* The AdamW / Adam step. */

/* Flags of lbopt_adamw_config. Unknown bits are an error. */
#define LBOPT_FLAG_ADAM_COUPLED_DECAY 0x1u  /* Adam (L2: g += wd * p) instead of AdamW (p -= lr * wd * p) */
#define LBOPT_FLAG_AMSGRAD 0x2u             /* keep vmax = max(vmax, v) in slot.vmax and divide by it */
#define LBOPT_FLAG_MAXIMIZE 0x4u            /* ascend: use -g */
#define LBOPT_FLAG_BF16_STOCHASTIC_ROUND 0x8u /* round bfloat16 params stochastically (keyed by seed, step,
                                                  element index), not to nearest; other dtypes unaffected */
#define LBOPT_FLAG_SKIP_NONFINITE 0x10u     /* a slot whose grad has NaN/Inf is left untouched and reported in
                                               options.skipped; without it NaN/Inf reaches the param (as in
                                               torch) but never a quantized state (stored as 0 there) */
#define LBOPT_FLAG_NESTEROV 0x20u           /* SGD (lbopt_step only): Nesterov momentum; needs momentum > 0
                                               and dampening = 0. Since 0.3 */
#define LBOPT_FLAG_STATE_STOCHASTIC_ROUND 0x40u /* round the codes of quantized first-moment states (exp_avg, SGD's
                                                  momentum, AdEMAMix's m1 and m2) stochastically, unbiased (keyed
                                                  by seed, step, state, element); second moments always round to
                                                  nearest. Since 0.4 */
#define LBOPT_FLAG_STATE_NEAREST_ROUND 0x80u /* round them to nearest. Neither flag: the default of the optimizer
                                               and kind, stochastic for SGD, Lion and AdEMAMix with 4-bit and FP8
                                               states, nearest otherwise; both: refused. Since 0.4 */
#define LBOPT_FLAG_NU_LINEAR_MAP 0x100u /* AdEMAMix (lbopt_step only): keep nu on the unsigned map (4-bit: the
                                              linear one, as lbopt 0.3 did) instead of LBOPT_MOMENT_SECOND_SIGNED.
                                              Since 0.4 */
#define LBOPT_FLAGS_ALL 0xDFu               /* the flags lbopt_adamw_config knows */

typedef struct lbopt_adamw_config {
  uint32_t struct_size;       /* sizeof(lbopt_adamw_config); set by lbopt_adamw_config_init */
  lbopt_state_kind state_kind; /* default LBOPT_STATE_4BIT */
  double beta1;               /* [0, 1), default 0.9 */
  double beta2;               /* [0, 1), default 0.999 */
  double eps;                 /* finite, >= 0, default 1e-8 (0 as torch: 0/0 where v = 0) */
  double weight_decay;        /* >= 0, default 0.01 */
  uint32_t flags;             /* LBOPT_FLAG_*, default 0 (AdamW) */
  uint64_t seed;              /* stochastic rounding key, default 0 */
} lbopt_adamw_config;

/* Fill *config with the defaults above; struct_size: sizeof(lbopt_adamw_config) as the caller sees it. */
LBOPT_API lbopt_status lbopt_adamw_config_init(lbopt_adamw_config* config, size_t struct_size);

/* One parameter tensor and its states. Params and grads are float32, bfloat16 or float16 (the grad dtype may
 * differ from the param dtype) with identical shapes and identical strides. Any dense layout is accepted (the
 * strides of a compact tensor in some dimension order: row-major, channels_last, transposed); the step runs over
 * memory in order, so element k of a state belongs to the param element at memory position k. The step count is
 * the one this step makes (1 on the first call); bias corrections are derived from it in double precision. */
typedef struct lbopt_adamw_slot {
  uint32_t struct_size;  /* sizeof(lbopt_adamw_slot); the same in every slot of a call */
  const DLTensor* param; /* read and written */
  const DLTensor* grad;  /* read */
  lbopt_state m;         /* read and written */
  lbopt_state v;         /* read and written */
  lbopt_state vmax;      /* read and written with LBOPT_FLAG_AMSGRAD; must be {NULL, NULL} without it */
  int64_t step;          /* >= 1 */
} lbopt_adamw_slot;

/* Per-call options; pass NULL for none. */
typedef struct lbopt_step_options {
  uint32_t struct_size;       /* sizeof(lbopt_step_options); set by lbopt_step_options_init */
  const DLTensor* grad_scale; /* optional float32 scalar on the step's device, finite and > 0: grads are
                                 multiplied by its reciprocal (exact for GradScaler's powers of two) (AMP) */
  const DLTensor* found_inf;  /* optional float32 scalar: when nonzero no param or state is written (AMP) */
  const DLTensor* skipped;    /* optional out: uint8 [n_slots] on the step's device; 1 where a slot was not
                                 stepped (non-finite grad with LBOPT_FLAG_SKIP_NONFINITE, or found_inf), else 0.
                                 A caller counting steps per slot should not count those. */
  void* stream;               /* cudaStream_t for CUDA tensors; ignored on CPU */
  uint32_t flags;             /* LBOPT_STEP_* (since 0.4; a caller built against 0.3 passes the smaller
                                 struct_size of the struct without it, which means no flags) */
} lbopt_step_options;

/* options.flags: the caller vouches that the memory of every tensor lies on the device its DLTensor names, as a
 * framework knows of its own tensors. A CUDA step then skips the runtime query of each pointer (one
 * cudaPointerGetAttributes per tensor and call); memory elsewhere than claimed is then undefined behaviour instead
 * of LBOPT_ERR_DEVICE. No effect on host tensors. */
#define LBOPT_STEP_DEVICES_KNOWN 1u

/* Zero *options and set struct_size; struct_size: sizeof(lbopt_step_options) as the caller sees it. */
LBOPT_API lbopt_status lbopt_step_options_init(lbopt_step_options* options, size_t struct_size);

/* One fused in-place step over n_slots tensors with learning rate lr (finite, >= 0). All tensors of the call
 * live on one device. The whole call is validated before the first byte is written. */
LBOPT_API lbopt_status lbopt_adamw_step(const lbopt_adamw_config* config, double lr, const lbopt_adamw_slot* slots,
                                        size_t n_slots, const lbopt_step_options* options);

/* The checks lbopt_adamw_step makes of config and lr, alone: a framework checks its hyper-parameters when they
 * are set (at construction, or when a param group changes) with the library's own rules and messages. Since
 * 0.2. */
LBOPT_API lbopt_status lbopt_adamw_config_validate(const lbopt_adamw_config* config, double lr);

/* Every check lbopt_adamw_step makes on the same arguments, and nothing else: no buffer is read beyond host
 * scalars (grad_scale) and none is written. LBOPT_OK means that lbopt_adamw_step would accept the call; on host
 * tensors it then cannot fail, on CUDA only a CUDA runtime error can. A caller that splits one logical step into
 * several calls (param groups with their own hyper-parameters, several state kinds) validates them all first,
 * so that a refused step leaves everything untouched. Since 0.2. */
LBOPT_API lbopt_status lbopt_adamw_step_validate(const lbopt_adamw_config* config, double lr,
                                                 const lbopt_adamw_slot* slots, size_t n_slots,
                                                 const lbopt_step_options* options);

/* The same step with lr and the step count read from scalars on the step's device at run time, not passed by
 * value: a CUDA graph captured once replays with whatever lr and step the caller wrote there (graphs freeze
 * by-value arguments). lr: float32 or float64, finite and >= 0; step: int64 or float32, >= 1, the count this step
 * makes for every slot (slots[i].step is ignored). Bias corrections are computed from them in double precision
 * on the device. On CPU tensors the values are read and checked on the host; on CUDA an out-of-range lr or step
 * is seen only by the kernels, which then write no param or state and mark every slot in options.skipped. */
LBOPT_API lbopt_status lbopt_adamw_step_capturable(const lbopt_adamw_config* config, const DLTensor* lr,
                                                   const DLTensor* step, const lbopt_adamw_slot* slots,
                                                   size_t n_slots, const lbopt_step_options* options);

/* ---------------------------------------------------------------------------------------------------------- */
/* Every optimizer: one generic step (since 0.3). An optimizer is a value of lbopt_optimizer and a config of one
 * size-versioned struct whose fields each optimizer reads or ignores; a slot carries up to LBOPT_MAX_STATES
 * states, the optimizer's own first (lbopt_optimizer_states lists them). The AdamW entry points above are this
 * step with LBOPT_OPTIMIZER_ADAMW and give identical results. */

typedef enum lbopt_optimizer {
  LBOPT_OPTIMIZER_ADAMW = 0,    /* AdamW / Adam (LBOPT_FLAG_ADAM_COUPLED_DECAY), AMSGrad: states exp_avg,
                                   exp_avg_sq (+ max_exp_avg_sq) */
  LBOPT_OPTIMIZER_SGD = 1,      /* torch.optim.SGD: momentum, dampening, LBOPT_FLAG_NESTEROV, coupled weight
                                   decay; state momentum_buffer (none when momentum = 0) */
  LBOPT_OPTIMIZER_LION = 2,     /* Lion (bitsandbytes' update), decoupled weight decay; state exp_avg */
  LBOPT_OPTIMIZER_ADEMAMIX = 3, /* AdEMAMix (bitsandbytes' update): states m1, m2, nu */
  LBOPT_OPTIMIZER_MUON = 4,     /* Muon's momentum, as torch.optim.Muon: momentum, LBOPT_FLAG_NESTEROV; state
                                   momentum_buffer. Writes the update direction into slot.param (not read) for the
                                   caller to orthogonalize and apply; lr is checked but not read. Since 0.4 */
  LBOPT_OPTIMIZER_INT32_ = 0x7fffffff, /* not optimizers: the enum spans every int32, whatever a caller passes */
  LBOPT_OPTIMIZER_INT32_MIN_ = -0x7fffffff - 1
} lbopt_optimizer;

#define LBOPT_MAX_STATES 3

typedef struct lbopt_optimizer_config {
  uint32_t struct_size;        /* sizeof(lbopt_optimizer_config); set by lbopt_optimizer_config_init */
  lbopt_optimizer optimizer;
  lbopt_state_kind state_kind; /* default LBOPT_STATE_4BIT */
  uint32_t flags;              /* LBOPT_FLAG_*: ADAM_COUPLED_DECAY and AMSGRAD for AdamW only, NESTEROV for SGD
                                  only; MAXIMIZE, BF16_STOCHASTIC_ROUND, SKIP_NONFINITE, STATE_STOCHASTIC_ROUND
                                  and STATE_NEAREST_ROUND for all; default 0 */
  uint64_t seed;               /* stochastic rounding key, default 0 */
  double beta1;                /* [0, 1). AdamW 0.9, Lion 0.9, AdEMAMix 0.9 (the fast EMA) */
  double beta2;                /* [0, 1). AdamW 0.999, Lion 0.99 (the momentum's EMA), AdEMAMix 0.999 */
  double beta3;                /* [0, 1), AdEMAMix: the slow EMA, default 0.9999 */
  double eps;                  /* finite, >= 0. AdamW and AdEMAMix, default 1e-8 */
  double weight_decay;         /* finite, >= 0. AdamW 0.01, SGD 0 (coupled, as torch), Lion 0, AdEMAMix 0.01 */
  double momentum;             /* finite, >= 0, SGD: default 0.9 (0: plain SGD, no state) */
  double dampening;            /* [0, 1], SGD: default 0 */
  double alpha;                /* finite, >= 0, AdEMAMix: the slow EMA's weight, default 5 */
  double t_alpha;              /* finite, >= 0, AdEMAMix: steps of alpha's linear warm-up, 0 (default): none */
  double t_beta3;              /* finite, >= 0, AdEMAMix: steps of beta3's warm-up, 0 (default): none; needs
                                  beta1 > 0 and beta3 > 0 */
} lbopt_optimizer_config;

/* Fill *config with optimizer's defaults above; struct_size: sizeof(lbopt_optimizer_config) as the caller sees
 * it. */
LBOPT_API lbopt_status lbopt_optimizer_config_init(lbopt_optimizer_config* config, size_t struct_size,
                                                   lbopt_optimizer optimizer);

/* The checks lbopt_step makes of config and lr, alone. */
LBOPT_API lbopt_status lbopt_optimizer_config_validate(const lbopt_optimizer_config* config, double lr);

/* "adamw", "sgd", "lion", "ademamix"; NULL for a value that is no optimizer. */
LBOPT_API const char* lbopt_optimizer_name(lbopt_optimizer optimizer);

/* One state of an optimizer: its name (as in a torch state dict) and the codebook it is stored on. */
typedef struct lbopt_state_info {
  const char* name;   /* static text */
  int32_t moment;     /* lbopt_moment: for lbopt_quantize / lbopt_dequantize of this state */
} lbopt_state_info;

/* The states a step of this config reads and writes, in slot order: *n_states of them (0 to LBOPT_MAX_STATES),
 * described in states[0 .. *n_states). The config is validated as lbopt_step validates it. */
LBOPT_API lbopt_status lbopt_optimizer_states(const lbopt_optimizer_config* config,
                                              lbopt_state_info states[LBOPT_MAX_STATES], size_t* n_states);

/* One hyper-parameter or flag an optimizer reads (lbopt_optimizer_fields; since 0.4). */
typedef struct lbopt_field_info {
  const char* name;      /* static text: the lbopt_optimizer_config field, or the flag's registry attribute */
  int32_t type;          /* lbopt_attr_type (below): LBOPT_ATTR_DOUBLE for a field, LBOPT_ATTR_BOOL for a flag */
  uint32_t flag;         /* a flag's LBOPT_FLAG_ bit; 0 for a field */
  double default_value;  /* the field's value after lbopt_optimizer_config_init; 0 for a flag (unset) */
  double min;            /* a field's accepted values: min <= x, and x < max (x <= max if max_inclusive); */
  double max;            /* an infinite max means any finite value */
  int32_t max_inclusive;
  int32_t reserved;      /* 0 */
} lbopt_field_info;

/* The fields and flags `optimizer` reads beyond state_kind, seed and the flags every optimizer reads (MAXIMIZE,
 * BF16_STOCHASTIC_ROUND, SKIP_NONFINITE, STATE_STOCHASTIC_ROUND, STATE_NEAREST_ROUND): *n_fields entries at *fields (static storage), fields first, in the
 * order of its registry step operators' attributes. Rules across fields (SGD's Nesterov needs momentum > 0 and
 * dampening = 0; AdEMAMix's beta3 warm-up needs beta1 > 0 and beta3 > 0) are lbopt_optimizer_config_validate's.
 * Since 0.4. */
LBOPT_API lbopt_status lbopt_optimizer_fields(lbopt_optimizer optimizer, const lbopt_field_info** fields,
                                              size_t* n_fields);

/* Set one field or flag of *config by the name lbopt_optimizer_fields gives it, or one of the flags every
 * optimizer reads ("maximize", "bf16_stochastic_round", "skip_nonfinite", "state_stochastic_round",
 * "state_nearest_round"): a field takes value, a flag is set by 1 and cleared by 0. A framework binding that knows
 * its options by name (from lbopt_optimizer_fields) builds a config with it and never names the struct's members.
 * Refused, writing nothing: a name config->optimizer does not read (LBOPT_ERR_INVALID_VALUE, the message lists
 * those it reads), a value outside the field's range or a flag value other than 0 or 1. Rules across fields are
 * lbopt_optimizer_config_validate's, since they hold only once every field is set. Since 0.4. */
LBOPT_API lbopt_status lbopt_optimizer_config_set(lbopt_optimizer_config* config, const char* name, double value);

/* One parameter tensor and its states, as lbopt_adamw_slot: states[0 .. n) are the optimizer's (n from
 * lbopt_optimizer_states), the rest {NULL, NULL}. */
typedef struct lbopt_slot {
  uint32_t struct_size;  /* sizeof(lbopt_slot); the same in every slot of a call */
  const DLTensor* param; /* read and written */
  const DLTensor* grad;  /* read */
  lbopt_state states[LBOPT_MAX_STATES]; /* read and written */
  int64_t step;          /* >= 1: the count this step makes */
} lbopt_slot;

/* The step, its validation alone, and its capturable form: as lbopt_adamw_step, lbopt_adamw_step_validate and
 * lbopt_adamw_step_capturable, for any optimizer. */
LBOPT_API lbopt_status lbopt_step(const lbopt_optimizer_config* config, double lr, const lbopt_slot* slots,
                                  size_t n_slots, const lbopt_step_options* options);
LBOPT_API lbopt_status lbopt_step_validate(const lbopt_optimizer_config* config, double lr, const lbopt_slot* slots,
                                           size_t n_slots, const lbopt_step_options* options);
LBOPT_API lbopt_status lbopt_step_capturable(const lbopt_optimizer_config* config, const DLTensor* lr,
                                             const DLTensor* step, const lbopt_slot* slots, size_t n_slots,
                                             const lbopt_step_options* options);

/* ---------------------------------------------------------------------------------------------------------- */
/* Operator registry: a host framework that has never seen this header can dlopen the library, walk the operators
 * and their schemas, register them in its own dispatcher and call them through one generic entry point. Every
 * operator validates like the typed call it wraps and gives bit-identical results. Schemas are static data. */

typedef enum lbopt_arg_role { LBOPT_ROLE_IN = 0, LBOPT_ROLE_OUT = 1, LBOPT_ROLE_INOUT = 2 } lbopt_arg_role;

typedef enum lbopt_attr_type {
  LBOPT_ATTR_DOUBLE = 0,
  LBOPT_ATTR_INT64 = 1,
  LBOPT_ATTR_BOOL = 2, /* passed in lbopt_attr.i, 0 or 1 */
  LBOPT_ATTR_STRING = 3
} lbopt_attr_type;

/* Bits of lbopt_tensor_arg.dtypes. */
#define LBOPT_DTYPE_FLOAT32 0x1u
#define LBOPT_DTYPE_BFLOAT16 0x2u
#define LBOPT_DTYPE_FLOAT16 0x4u
#define LBOPT_DTYPE_UINT8 0x8u
#define LBOPT_DTYPE_INT64 0x10u
#define LBOPT_DTYPE_FLOAT64 0x20u /* since 0.2 */

typedef struct lbopt_tensor_arg {
  const char* name;
  int32_t role;       /* lbopt_arg_role */
  uint32_t dtypes;    /* LBOPT_DTYPE_* bits allowed */
  int32_t optional;   /* 1: may be NULL in lbopt_op_invoke's tensor array */
  const char* shape;  /* the shape relation, in words ("same shape as param", "lbopt_state_layout codes") */
} lbopt_tensor_arg;

typedef struct lbopt_attr_arg {
  const char* name;
  int32_t type;       /* lbopt_attr_type */
  int32_t required;   /* 1: no default */
  double default_double;
  int64_t default_int; /* INT64 and BOOL defaults */
  const char* default_string;
} lbopt_attr_arg;

typedef struct lbopt_op_info {
  uint32_t struct_size;
  const char* name;     /* "lbopt.adamw_step.4bit", "lbopt.quantize", ... */
  int32_t version;      /* bumped when the operator's semantics change */
  const char* doc;
  size_t n_tensors;
  const lbopt_tensor_arg* tensors; /* in the order lbopt_op_invoke takes them */
  size_t n_attrs;
  const lbopt_attr_arg* attrs;
} lbopt_op_info;

/* An attribute value for lbopt_op_invoke, matched to the schema by name. */
typedef struct lbopt_attr {
  const char* name;
  int32_t type;   /* must equal the schema's type */
  double f;       /* DOUBLE */
  int64_t i;      /* INT64, BOOL */
  const char* s;  /* STRING */
} lbopt_attr;

LBOPT_API size_t lbopt_op_count(void);
/* The i-th operator (i < lbopt_op_count()), or NULL. */
LBOPT_API const lbopt_op_info* lbopt_op_schema(size_t i);
/* The operator of that name, or NULL. */
LBOPT_API const lbopt_op_info* lbopt_op_find(const char* name);
/* Run op on tensors (n_tensors == op->n_tensors, NULL only where optional) with attributes (any order; each name
 * at most once; omitted ones take their defaults; a required one missing, an unknown name or a wrong type is
 * LBOPT_ERR_INVALID_VALUE / LBOPT_ERR_DTYPE). stream: as options.stream of the typed calls. */
LBOPT_API lbopt_status lbopt_op_invoke(const lbopt_op_info* op, const DLTensor* const* tensors, size_t n_tensors,
                                       const lbopt_attr* attrs, size_t n_attrs, void* stream);

/* ---------------------------------------------------------------------------------------------------------- */
/* CPU threads: the library's own pool (no OpenMP, so it cannot fight a host framework's runtime). Default: the
 * LBOPT_NUM_THREADS environment variable, else the cores the process may run on (its CPU affinity). n >= 1; 0
 * restores the default. */
LBOPT_API lbopt_status lbopt_set_num_threads(int n);
LBOPT_API int lbopt_get_num_threads(void);

#ifdef __cplusplus
}
#endif

#endif /* LBOPT_H */

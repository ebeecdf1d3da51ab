// Invalid inputs to the C ABI, as a table: each row starts from a fully valid setup, applies one mutation, makes
// one call, and expects (1) the exact lbopt_status, (2) an lbopt_last_error() naming the offending argument and
// (3) not one byte written: the FNV hash of every buffer of the setup (params, grads, codes, scales, option
// tensors, conversion buffers, including their slack) is the same after the call as before it. A few rows are
// positive controls (LBOPT_OK), which prove that the unmutated setups are valid and that the hashes do see writes.
//
// Only the public header and tests/support/tensors.h are used.
#include <doctest/doctest.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <deque>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "lbopt.h"
#include "tensors.h"

namespace {

using test::bf16;
using test::Buffer;
using test::f16;
using test::f32;
using test::State;
using test::u8;

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

DLDataType i8() { return {kDLInt, 8, 1}; }
DLDataType i32() { return {kDLInt, 32, 1}; }
DLDataType f64() { return {kDLFloat, 64, 1}; }

// Which valid setup a row starts from.
enum class Base { k4Bit, k8Bit, kFp8, kFp32, kAmsgrad4Bit };

lbopt_state_kind kind_of(Base b) {
  switch (b) {
    case Base::k8Bit: return LBOPT_STATE_8BIT;
    case Base::kFp8: return LBOPT_STATE_FP8;
    case Base::kFp32: return LBOPT_STATE_FP32;
    default: return LBOPT_STATE_4BIT;
  }
}

const char* base_name(Base b) {
  switch (b) {
    case Base::k4Bit: return "4-bit";
    case Base::k8Bit: return "8-bit";
    case Base::kFp8: return "fp8";
    case Base::kFp32: return "fp32";
    case Base::kAmsgrad4Bit: return "4-bit + AMSGrad";
  }
  return "?";
}

// A fully valid two-slot step (slot 0: float32 param [300] with a bfloat16 grad; slot 1: bfloat16 param [3, 70]
// with a float16 grad), its options (grad_scale = 1, found_inf = 0, skipped [2]), plus buffers for the
// quantize / dequantize / state_init / state_layout calls. Every buffer is filled with random non-zero bytes
// first (slack included), then its view with valid values, so any write changes its hash.
struct Setup {
  lbopt_state_kind kind;
  bool amsgrad;
  std::mt19937_64 rng{0x5eed1b0b7ull};

  Buffer p0{f32(), {300}}, g0{bf16(), {300}};
  Buffer p1{bf16(), {3, 70}}, g1{f16(), {3, 70}};
  State m0, v0, x0, m1, v1, x1;  // x = vmax; attached to the slots only with AMSGrad
  Buffer grad_scale{f32(), {1}}, found_inf{f32(), {1}}, skipped{u8(), {2}};
  Buffer values{f32(), {300}};
  State q;  // the state that quantize writes and dequantize / state_init use
  Buffer layout_out{u8(), {int64_t(sizeof(lbopt_layout))}};
  std::deque<Buffer> extra;                  // buffers a mutation adds (hashed too)
  std::deque<std::vector<int64_t>> arrays;   // shapes and strides a mutation adds

  // The arguments of the calls; mutations change these.
  lbopt_adamw_config config{};
  double lr = 1e-3;
  lbopt_adamw_slot slots[2]{};
  lbopt_step_options options{};
  const lbopt_adamw_config* config_arg = &config;
  const lbopt_adamw_slot* slots_arg = slots;
  size_t n_slots = 2;
  const lbopt_step_options* options_arg = &options;

  int conv_kind;  // ints, so that rows can pass values outside the enums as a C caller could
  int moment = LBOPT_MOMENT_FIRST;
  const DLTensor* conv_values = &values.t;  // src of quantize, dst of dequantize
  lbopt_state conv_state;
  int64_t numel = 300;
  lbopt_layout* layout_arg;

  explicit Setup(Base base)
      : kind(kind_of(base)),
        amsgrad(base == Base::kAmsgrad4Bit),
        m0(kind, 300), v0(kind, 300), x0(kind, 300),
        m1(kind, 210), v1(kind, 210), x1(kind, 210),
        q(kind, 300),
        conv_kind(kind),
        conv_state(q.view()),
        layout_arg(reinterpret_cast<lbopt_layout*>(layout_out.t.data)) {
    for (auto& nb : buffers()) randomize(*const_cast<Buffer*>(nb.second));
    fill(p0); fill(g0); fill(p1); fill(g1); fill(values);
    fill_state(m0, false); fill_state(v0, true); fill_state(x0, true);
    fill_state(m1, false); fill_state(v1, true); fill_state(x1, true);
    fill_state(q, false);
    *grad_scale.as<float>() = 1.0f;
    *found_inf.as<float>() = 0.0f;
    skipped.as<uint8_t>()[0] = 0xAB;
    skipped.as<uint8_t>()[1] = 0xCD;

    REQUIRE(lbopt_adamw_config_init(&config, sizeof config) == LBOPT_OK);
    config.state_kind = kind;
    if (amsgrad) config.flags |= LBOPT_FLAG_AMSGRAD;
    REQUIRE(lbopt_step_options_init(&options, sizeof options) == LBOPT_OK);
    options.grad_scale = &grad_scale.t;
    options.found_inf = &found_inf.t;
    options.skipped = &skipped.t;
    const lbopt_state none{nullptr, nullptr};
    slots[0] = {sizeof(lbopt_adamw_slot), &p0.t, &g0.t, m0.view(), v0.view(), amsgrad ? x0.view() : none, 3};
    slots[1] = {sizeof(lbopt_adamw_slot), &p1.t, &g1.t, m1.view(), v1.view(), amsgrad ? x1.view() : none, 7};
  }
  Setup(const Setup&) = delete;
  Setup& operator=(const Setup&) = delete;

  // Every buffer, by name, in a fixed order.
  std::vector<std::pair<std::string, const Buffer*>> buffers() const {
    std::vector<std::pair<std::string, const Buffer*>> out = {
        {"p0", &p0}, {"g0", &g0}, {"p1", &p1}, {"g1", &g1},
        {"grad_scale", &grad_scale}, {"found_inf", &found_inf}, {"skipped", &skipped},
        {"values", &values}, {"layout_out", &layout_out}};
    const std::pair<const char*, const State*> states[] = {{"m0", &m0}, {"v0", &v0}, {"x0", &x0}, {"m1", &m1},
                                                           {"v1", &v1}, {"x1", &x1}, {"q", &q}};
    for (const auto& st : states) {
      out.push_back({std::string(st.first) + ".codes", st.second->codes.get()});
      if (st.second->scales) out.push_back({std::string(st.first) + ".scales", st.second->scales.get()});
    }
    for (size_t i = 0; i < extra.size(); ++i) out.push_back({"extra" + std::to_string(i), &extra[i]});
    return out;
  }

  // --- helpers for mutations ---
  void randomize(Buffer& b) { test::randomize(b, rng); }
  void fill(Buffer& b, bool nonneg = false) { fill_valid(b, rng, nonneg); }
  void fill_state(State& st, bool nonneg) { fill_valid_state(st, kind, rng, nonneg); }
  Buffer& add(DLDataType dtype, std::vector<int64_t> shape) {
    extra.emplace_back(dtype, std::move(shape));
    randomize(extra.back());
    fill(extra.back());
    return extra.back();
  }
  int64_t* array(std::vector<int64_t> a) {
    arrays.push_back(std::move(a));
    return arrays.back().data();
  }
  void set_device_all(DLDevice d) {
    for (auto& nb : buffers()) const_cast<Buffer*>(nb.second)->t.device = d;
  }

  // --- the calls ---
  lbopt_status step() { return lbopt_adamw_step(config_arg, lr, slots_arg, n_slots, options_arg); }
  lbopt_status quantize() {
    return lbopt_quantize(lbopt_state_kind(conv_kind), lbopt_moment(moment), conv_values, conv_state, nullptr);
  }
  lbopt_status dequantize() {
    return lbopt_dequantize(lbopt_state_kind(conv_kind), lbopt_moment(moment), conv_state, conv_values, nullptr);
  }
  lbopt_status state_init() { return lbopt_state_init(lbopt_state_kind(conv_kind), numel, conv_state, nullptr); }
  lbopt_status state_layout() { return lbopt_state_layout(lbopt_state_kind(conv_kind), numel, layout_arg, sizeof(lbopt_layout)); }
};

using Mutation = std::function<void(Setup&)>;
using Call = std::function<lbopt_status(Setup&)>;

const Call step = [](Setup& s) { return s.step(); };
const Call quantize = [](Setup& s) { return s.quantize(); };
const Call dequantize = [](Setup& s) { return s.dequantize(); };
const Call state_init = [](Setup& s) { return s.state_init(); };
const Call state_layout = [](Setup& s) { return s.state_layout(); };
const Mutation unchanged = [](Setup&) {};

// For LBOPT_OK rows: buffers (name prefixes) that must change and that may change; all others must not.
struct Writes {
  std::vector<std::string> must, may;
};
const Writes kStepWrites{{"p0", "p1", "skipped"}, {"m0.", "v0.", "x0.", "m1.", "v1.", "x1."}};

struct Case {
  const char* name;
  Base base;
  Mutation mutate;
  Call call;
  lbopt_status expected;
  std::vector<std::string> needles;  // substrings of lbopt_last_error() (the offending argument)
  Writes writes = {};                // only for LBOPT_OK rows
  bool needs_cpu_only_build = false;
};

const Base k4 = Base::k4Bit, k8 = Base::k8Bit, kF8 = Base::kFp8, kF32 = Base::kFp32, kAms = Base::kAmsgrad4Bit;

// clang-format off
const std::vector<Case>& cases() {
  static const std::vector<Case> table = {
    // ---- positive controls: the unmutated setups step, and the hashes see it ----
    {"control: valid 4-bit step", k4, unchanged, step, LBOPT_OK, {}, kStepWrites},
    {"control: valid 8-bit step", k8, unchanged, step, LBOPT_OK, {}, kStepWrites},
    {"control: valid fp8 step", kF8, unchanged, step, LBOPT_OK, {}, kStepWrites},
    {"control: valid fp32 step", kF32, unchanged, step, LBOPT_OK, {}, kStepWrites},
    {"control: valid AMSGrad step", kAms, unchanged, step, LBOPT_OK, {}, kStepWrites},
    {"control: options = NULL", k4, [](Setup& s) { s.options_arg = nullptr; }, step, LBOPT_OK, {},
     {{"p0", "p1"}, kStepWrites.may}},
    {"accepted: aligned non-zero byte_offset (param 64, grad 2)", k4,
     [](Setup& s) { s.p0.t.byte_offset = 64; s.fill(s.p0); s.g1.t.byte_offset = 2; s.fill(s.g1); },
     step, LBOPT_OK, {}, kStepWrites},
    {"accepted: explicit compact strides", k4,
     [](Setup& s) { s.p1.t.strides = s.array({70, 1});
                    s.g1.t.strides = s.array({70, 1}); },
     step, LBOPT_OK, {}, kStepWrites},
    {"accepted: eps = 0 (as torch)", k4, [](Setup& s) { s.config.eps = 0.0; }, step, LBOPT_OK, {}, kStepWrites},
    {"accepted: param and grad transposed alike {1, 3}", k4,
     [](Setup& s) { s.p1.t.strides = s.array({1, 3});
                    s.g1.t.strides = s.array({1, 3}); },
     step, LBOPT_OK, {}, kStepWrites},
    {"accepted: channels_last param and grad [2, 3, 5, 7] strides {105, 1, 21, 3}", k4,
     [](Setup& s) { s.p1.t.ndim = s.g1.t.ndim = 4; s.p1.t.shape = s.g1.t.shape = s.array({2, 3, 5, 7});
                    s.p1.t.strides = s.g1.t.strides = s.array({105, 1, 21, 3}); },
     step, LBOPT_OK, {}, kStepWrites},
    {"accepted: extent-1 dims differ in stride between param and grad", k4,
     [](Setup& s) { s.p1.t.ndim = s.g1.t.ndim = 3; s.p1.t.shape = s.g1.t.shape = s.array({3, 1, 70});
                    s.p1.t.strides = s.array({70, 1, 1}); s.g1.t.strides = s.array({70, 999, 1}); },
     step, LBOPT_OK, {}, kStepWrites},
    {"accepted: quantize src transposed", k4,
     [](Setup& s) { s.values.t.ndim = 2; s.values.t.shape = s.array({20, 15}); s.values.t.strides = s.array({1, 20}); },
     quantize, LBOPT_OK, {}, {{"q.codes", "q.scales"}, {}}},
    {"accepted: a kDLCUDAHost grad is host memory", k4, [](Setup& s) { s.g0.t.device = {kDLCUDAHost, 0}; },
     step, LBOPT_OK, {}, kStepWrites},
    {"accepted: read-only grads may alias each other", k4, [](Setup& s) { s.g1.t.data = s.g0.t.data; },
     step, LBOPT_OK, {}, kStepWrites},
    {"accepted: slots[0].v.codes right after slots[0].m.codes (adjacent, not overlapping)", k4,
     [](Setup& s) { Buffer& arena = s.add(u8(), {300});
                    s.m0.codes->t.data = arena.t.data;
                    s.v0.codes->t.data = arena.t.data; s.v0.codes->t.byte_offset = 150; },
     step, LBOPT_OK, {}, {{"p0", "p1", "skipped", "extra0"}, kStepWrites.may}},
    {"accepted: a zero-element slot 1 (shape {0, 70}) is left alone", k4,
     [](Setup& s) { s.p1.shape[0] = 0; s.g1.shape[0] = 0;
                    for (State* st : {&s.m1, &s.v1}) { st->codes->shape[0] = 0; st->scales->shape[0] = 0; } },
     step, LBOPT_OK, {}, {{"p0", "skipped"}, {"m0.", "v0."}}},
    {"control: quantize", k4, unchanged, quantize, LBOPT_OK, {}, {{"q.codes", "q.scales"}, {}}},
    {"control: dequantize", k4, unchanged, dequantize, LBOPT_OK, {}, {{"values"}, {}}},
    {"control: state_init", k8, unchanged, state_init, LBOPT_OK, {}, {{"q.codes", "q.scales"}, {}}},
    {"control: state_layout", kF8, unchanged, state_layout, LBOPT_OK, {}, {{"layout_out"}, {}}},

    // ---- config ----
    {"config = NULL", k4, [](Setup& s) { s.config_arg = nullptr; }, step, LBOPT_ERR_NULL_POINTER, {"config"}},
    {"config.struct_size too small", k4, [](Setup& s) { s.config.struct_size -= 8; }, step,
     LBOPT_ERR_STRUCT_SIZE, {"config.struct_size"}},
    {"config.struct_size = 0", k4, [](Setup& s) { s.config.struct_size = 0; }, step,
     LBOPT_ERR_STRUCT_SIZE, {"config.struct_size"}},
    {"config.state_kind = 4", k4, [](Setup& s) { s.config.state_kind = lbopt_state_kind(4); }, step,
     LBOPT_ERR_INVALID_VALUE, {"config.state_kind"}},
    {"config.state_kind = -1", k4, [](Setup& s) { s.config.state_kind = lbopt_state_kind(-1); }, step,
     LBOPT_ERR_INVALID_VALUE, {"config.state_kind"}},
    {"config.beta1 = 1", k4, [](Setup& s) { s.config.beta1 = 1.0; }, step,
     LBOPT_ERR_INVALID_VALUE, {"config.beta1"}},
    {"config.beta1 = NaN", k4, [](Setup& s) { s.config.beta1 = kNaN; }, step,
     LBOPT_ERR_INVALID_VALUE, {"config.beta1"}},
    {"config.beta2 = -0.1", k4, [](Setup& s) { s.config.beta2 = -0.1; }, step,
     LBOPT_ERR_INVALID_VALUE, {"config.beta2"}},
    {"config.eps = -1e-12", k4, [](Setup& s) { s.config.eps = -1e-12; }, step, LBOPT_ERR_INVALID_VALUE,
     {"config.eps"}},
    {"config.eps = NaN", k4, [](Setup& s) { s.config.eps = kNaN; }, step, LBOPT_ERR_INVALID_VALUE, {"config.eps"}},
    {"config.eps = +inf", k4, [](Setup& s) { s.config.eps = kInf; }, step, LBOPT_ERR_INVALID_VALUE, {"config.eps"}},
    {"config.weight_decay = -0.01", k4, [](Setup& s) { s.config.weight_decay = -0.01; }, step,
     LBOPT_ERR_INVALID_VALUE, {"config.weight_decay"}},
    {"config.weight_decay = +inf", k4, [](Setup& s) { s.config.weight_decay = kInf; }, step,
     LBOPT_ERR_INVALID_VALUE, {"config.weight_decay"}},
    {"config.flags with unknown bit 0x20", k4, [](Setup& s) { s.config.flags |= 0x20u; }, step,
     LBOPT_ERR_INVALID_VALUE, {"config.flags"}},
    {"config.flags with unknown bit 0x80000000", k4, [](Setup& s) { s.config.flags |= 0x80000000u; }, step,
     LBOPT_ERR_INVALID_VALUE, {"config.flags"}},
    {"8-bit buffers but config.state_kind = 4-bit", k8,
     [](Setup& s) { s.config.state_kind = LBOPT_STATE_4BIT; }, step, LBOPT_ERR_BUFFER_SIZE, {"slots[0].m.codes"}},

    // ---- lr ----
    {"lr = NaN", k4, [](Setup& s) { s.lr = kNaN; }, step, LBOPT_ERR_INVALID_VALUE, {"lr"}},
    {"lr = -1e-3", k4, [](Setup& s) { s.lr = -1e-3; }, step, LBOPT_ERR_INVALID_VALUE, {"lr"}},
    {"lr = +inf", k4, [](Setup& s) { s.lr = kInf; }, step, LBOPT_ERR_INVALID_VALUE, {"lr"}},

    // ---- slots array and slot structs ----
    {"slots = NULL with n_slots = 2", k4, [](Setup& s) { s.slots_arg = nullptr; }, step,
     LBOPT_ERR_NULL_POINTER, {"slots"}},
    {"n_slots = 0 with slots = NULL", k4, [](Setup& s) { s.slots_arg = nullptr; s.n_slots = 0; }, step,
     LBOPT_ERR_INVALID_VALUE, {"n_slots"}},
    {"slots[1].struct_size wrong", k4, [](Setup& s) { s.slots[1].struct_size += 8; }, step,
     LBOPT_ERR_STRUCT_SIZE, {"slots[1].struct_size"}},
    {"slots[1].step = 0", k4, [](Setup& s) { s.slots[1].step = 0; }, step, LBOPT_ERR_INVALID_VALUE,
     {"slots[1].step"}},
    {"slots[0].step = -5", k4, [](Setup& s) { s.slots[0].step = -5; }, step, LBOPT_ERR_INVALID_VALUE,
     {"slots[0].step"}},

    // ---- options ----
    {"options.struct_size wrong", k4, [](Setup& s) { s.options.struct_size = 4; }, step,
     LBOPT_ERR_STRUCT_SIZE, {"options.struct_size"}},
    {"options.struct_size between 0.3's and this one's", k4,
     [](Setup& s) { s.options.struct_size = offsetof(lbopt_step_options, flags) + 4; }, step,
     LBOPT_ERR_STRUCT_SIZE, {"options.struct_size"}},
    {"options.flags with an unknown bit", k4, [](Setup& s) { s.options.flags = LBOPT_STEP_DEVICES_KNOWN | 4u; },
     step, LBOPT_ERR_INVALID_VALUE, {"options.flags", "0x4"}},
    {"options.grad_scale with 2 elements", k4, [](Setup& s) { s.grad_scale.shape[0] = 2; }, step,
     LBOPT_ERR_SHAPE, {"options.grad_scale"}},
    {"options.grad_scale = 0", k4, [](Setup& s) { *s.grad_scale.as<float>() = 0.0f; }, step,
     LBOPT_ERR_INVALID_VALUE, {"options.grad_scale"}},
    {"options.grad_scale = NaN", k4, [](Setup& s) { *s.grad_scale.as<float>() = NAN; }, step,
     LBOPT_ERR_INVALID_VALUE, {"options.grad_scale"}},
    {"options.found_inf is bfloat16", k4, [](Setup& s) { s.found_inf.t.dtype = bf16(); }, step,
     LBOPT_ERR_DTYPE, {"options.found_inf"}},
    {"options.skipped with 3 elements", k4, [](Setup& s) { s.skipped.shape[0] = 3; }, step,
     LBOPT_ERR_SHAPE, {"options.skipped"}},
    {"options.skipped with 1 element", k4, [](Setup& s) { s.skipped.shape[0] = 1; }, step,
     LBOPT_ERR_SHAPE, {"options.skipped"}},
    {"options.skipped is float32", k4, [](Setup& s) { s.skipped.t.dtype = f32(); }, step,
     LBOPT_ERR_DTYPE, {"options.skipped"}},
    {"options.skipped writes into slots[0].grad", k4, [](Setup& s) { s.skipped.t.data = s.g0.t.data; }, step,
     LBOPT_ERR_OVERLAP, {"options.skipped", "slots[0].grad"}},

    // ---- NULL pointers ----
    {"slots[1].param = NULL", k4, [](Setup& s) { s.slots[1].param = nullptr; }, step,
     LBOPT_ERR_NULL_POINTER, {"slots[1].param"}},
    {"slots[0].grad = NULL", k4, [](Setup& s) { s.slots[0].grad = nullptr; }, step,
     LBOPT_ERR_NULL_POINTER, {"slots[0].grad"}},
    {"slots[1].m.codes data = NULL", k4, [](Setup& s) { s.m1.codes->t.data = nullptr; }, step,
     LBOPT_ERR_NULL_POINTER, {"slots[1].m.codes"}},
    {"slots[0].param data = NULL", k4, [](Setup& s) { s.p0.t.data = nullptr; }, step,
     LBOPT_ERR_NULL_POINTER, {"slots[0].param"}},
    {"slots[1].v.codes = NULL", k4, [](Setup& s) { s.slots[1].v.codes = nullptr; }, step,
     LBOPT_ERR_NULL_POINTER, {"slots[1].v.codes"}},
    {"slots[0].m.scales = NULL for a quantized kind", k4, [](Setup& s) { s.slots[0].m.scales = nullptr; }, step,
     LBOPT_ERR_NULL_POINTER, {"slots[0].m.scales"}},
    {"slots[1].param shape = NULL with ndim 2", k4, [](Setup& s) { s.p1.t.shape = nullptr; }, step,
     LBOPT_ERR_NULL_POINTER, {"slots[1].param"}},

    // ---- shapes ----
    {"slots[0].grad ndim = -1", k4, [](Setup& s) { s.g0.t.ndim = -1; }, step, LBOPT_ERR_SHAPE,
     {"slots[0].grad"}},
    {"slots[1].param shape[1] = -70", k4, [](Setup& s) { s.p1.shape[1] = -70; }, step, LBOPT_ERR_SHAPE,
     {"slots[1].param"}},
    {"slots[1].grad shape {70, 3} vs param {3, 70}", k4,
     [](Setup& s) { s.g1.shape = {70, 3}; s.g1.t.shape = s.g1.shape.data(); }, step, LBOPT_ERR_SHAPE,
     {"slots[1].grad"}},
    {"slots[1].grad flattened to {210}", k4,
     [](Setup& s) { s.g1.t.ndim = 1; s.g1.t.shape = s.array({210}); }, step, LBOPT_ERR_SHAPE, {"slots[1].grad"}},
    {"slots[0].param element count overflows int64", k4,
     [](Setup& s) { s.p0.t.ndim = 2; s.p0.t.shape = s.array({int64_t(1) << 40, int64_t(1) << 40}); }, step,
     LBOPT_ERR_SHAPE, {"slots[0].param"}},
    {"slots[0].param byte size overflows int64", k4,
     [](Setup& s) { s.p0.shape[0] = int64_t(1) << 62; }, step, LBOPT_ERR_SHAPE, {"slots[0].param"}},

    // ---- dtypes ----
    {"slots[0].param is int32", k4, [](Setup& s) { s.p0.t.dtype = i32(); }, step, LBOPT_ERR_DTYPE,
     {"slots[0].param"}},
    {"slots[1].param is float64", k4, [](Setup& s) { s.p1.t.dtype = f64(); }, step, LBOPT_ERR_DTYPE,
     {"slots[1].param"}},
    {"slots[1].grad is uint8", k4, [](Setup& s) { s.g1.t.dtype = u8(); }, step, LBOPT_ERR_DTYPE,
     {"slots[1].grad"}},
    {"slots[0].grad is float32x2 (lanes 2)", k4, [](Setup& s) { s.g0.t.dtype = {kDLFloat, 32, 2}; }, step,
     LBOPT_ERR_DTYPE, {"slots[0].grad"}},
    {"slots[0].m.codes is int8 (4-bit)", k4, [](Setup& s) { s.m0.codes->t.dtype = i8(); }, step,
     LBOPT_ERR_DTYPE, {"slots[0].m.codes"}},
    {"slots[1].v.codes is float32 (4-bit)", k4, [](Setup& s) { s.v1.codes->t.dtype = f32(); }, step,
     LBOPT_ERR_DTYPE, {"slots[1].v.codes"}},
    {"slots[1].v.codes is float32 (fp8)", kF8, [](Setup& s) { s.v1.codes->t.dtype = f32(); }, step,
     LBOPT_ERR_DTYPE, {"slots[1].v.codes"}},
    {"slots[0].v.codes is uint8 (fp32 kind)", kF32, [](Setup& s) { s.v0.codes->t.dtype = u8(); }, step,
     LBOPT_ERR_DTYPE, {"slots[0].v.codes"}},
    {"slots[1].m.scales is bfloat16", k4, [](Setup& s) { s.m1.scales->t.dtype = bf16(); }, step,
     LBOPT_ERR_DTYPE, {"slots[1].m.scales"}},

    // ---- devices ----
    {"slots[1].grad on cuda:0, the rest on cpu", k4, [](Setup& s) { s.g1.t.device = {kDLCUDA, 0}; }, step,
     LBOPT_ERR_DEVICE, {"slots[1].grad", "slots[0].param"}},  // names the tensor that set the device, too
    {"options.skipped on cuda:0, the rest on cpu", k4, [](Setup& s) { s.skipped.t.device = {kDLCUDA, 0}; },
     step, LBOPT_ERR_DEVICE, {"options.skipped"}},
    {"slots[0].m.scales on OpenCL", k4, [](Setup& s) { s.m0.scales->t.device = {kDLOpenCL, 0}; }, step,
     LBOPT_ERR_DEVICE, {"slots[0].m.scales"}},
    {"all on cuda:0 but slots[1].m.codes on cuda:1", k4,
     [](Setup& s) { s.set_device_all({kDLCUDA, 0}); s.m1.codes->t.device = {kDLCUDA, 1}; }, step,
     LBOPT_ERR_DEVICE, {"slots[1].m.codes"}},
    {"all on cuda:0 where CUDA cannot run", k4, [](Setup& s) { s.set_device_all({kDLCUDA, 0}); }, step,
     LBOPT_ERR_UNSUPPORTED, {"slots[0].param", "CUDA"}, {}, true},
    {"quantize: all on cuda:0 where CUDA cannot run", k4, [](Setup& s) { s.set_device_all({kDLCUDA, 0}); },
     quantize, LBOPT_ERR_UNSUPPORTED, {"src", "CUDA"}, {}, true},
    {"state_init: all on cuda:0 where CUDA cannot run", k4, [](Setup& s) { s.set_device_all({kDLCUDA, 0}); },
     state_init, LBOPT_ERR_UNSUPPORTED, {"state.codes", "CUDA"}, {}, true},

    // ---- strides and alignment ----
    {"slots[1].param transposed {1, 3}, its grad row-major", k4,
     [](Setup& s) { s.p1.t.strides = s.array({1, 3}); }, step, LBOPT_ERR_STRIDE,
     {"slots[1].grad: strides[0] = 70, its param's is 1"}},
    {"slots[1].grad expanded {0, 1}", k4,
     [](Setup& s) { s.g1.t.strides = s.array({0, 1}); }, step, LBOPT_ERR_STRIDE,
     {"slots[1].grad: strides[0] = 0, a dense layout needs 1"}},
    {"slots[1].param gapped {140, 2}", k4,
     [](Setup& s) { s.p1.t.strides = s.array({140, 2}); }, step, LBOPT_ERR_STRIDE,
     {"slots[1].param: strides[1] = 2, a dense layout needs 1"}},
    {"slots[1].param overlapping {1, 1}", k4,
     [](Setup& s) { s.p1.t.strides = s.array({1, 1}); }, step, LBOPT_ERR_STRIDE,
     {"slots[1].param: strides[0] = 1, a dense layout needs 70"}},
    {"slots[1].param negative {-70, 1}", k4,
     [](Setup& s) { s.p1.t.strides = s.array({-70, 1}); }, step, LBOPT_ERR_STRIDE,
     {"slots[1].param: strides[0] = -70 is negative"}},
    {"slots[0].m.codes strides {2}", k4,
     [](Setup& s) { s.m0.codes->t.strides = s.array({2}); }, step, LBOPT_ERR_STRIDE,
     {"slots[0].m.codes"}},
    {"slots[0].param byte_offset 2 (float32)", k4, [](Setup& s) { s.p0.t.byte_offset = 2; }, step,
     LBOPT_ERR_ALIGNMENT, {"slots[0].param"}},
    {"slots[1].grad data pointer odd (float16)", k4,
     [](Setup& s) { s.g1.t.data = static_cast<uint8_t*>(s.g1.t.data) + 1; }, step, LBOPT_ERR_ALIGNMENT,
     {"slots[1].grad"}},
    {"slots[0].v.scales byte_offset 6 (float32)", k4, [](Setup& s) { s.v0.scales->t.byte_offset = 6; }, step,
     LBOPT_ERR_ALIGNMENT, {"slots[0].v.scales"}},
    {"slots[0].param byte_offset wraps the address space", k4,
     [](Setup& s) { s.p0.t.byte_offset = ~uint64_t(0) - 3; }, step, LBOPT_ERR_ALIGNMENT, {"slots[0].param"}},

    // ---- buffer sizes ----
    {"slots[0].m.codes too small (149 of 150)", k4, [](Setup& s) { s.m0.codes->shape[0] = 149; }, step,
     LBOPT_ERR_BUFFER_SIZE, {"slots[0].m.codes"}},
    {"slots[1].v.codes too large (106 of 105)", k4, [](Setup& s) { s.v1.codes->shape[0] = 106; }, step,
     LBOPT_ERR_BUFFER_SIZE, {"slots[1].v.codes"}},
    {"slots[1].m.scales too small (1 of 2)", k4, [](Setup& s) { s.m1.scales->shape[0] = 1; }, step,
     LBOPT_ERR_BUFFER_SIZE, {"slots[1].m.scales"}},
    {"slots[0].v.scales too large (8-bit, 3 of 2)", k8, [](Setup& s) { s.v0.scales->shape[0] = 3; }, step,
     LBOPT_ERR_BUFFER_SIZE, {"slots[0].v.scales"}},
    {"slots[1].v.scales too large (fp8, 2 of 1)", kF8, [](Setup& s) { s.v1.scales->shape[0] = 2; }, step,
     LBOPT_ERR_BUFFER_SIZE, {"slots[1].v.scales"}},
    {"slots[0].m.codes too small (fp32 kind)", kF32, [](Setup& s) { s.m0.codes->shape[0] = 299; }, step,
     LBOPT_ERR_BUFFER_SIZE, {"slots[0].m.codes"}},

    // ---- overlap ----
    {"slots[0].grad aliases slots[0].param", k4, [](Setup& s) { s.g0.t.data = s.p0.t.data; }, step,
     LBOPT_ERR_OVERLAP, {"slots[0].param", "slots[0].grad"}},
    {"slots[1].m.codes shares slots[0].m.codes", k4, [](Setup& s) { s.m1.codes->t.data = s.m0.codes->t.data; },
     step, LBOPT_ERR_OVERLAP, {"slots[0].m.codes", "slots[1].m.codes"}},
    {"slots[0].v.codes partially overlaps slots[0].m.codes", k4,
     [](Setup& s) { s.v0.codes->t.data = s.m0.codes->t.data; s.v0.codes->t.byte_offset = 40; }, step,
     LBOPT_ERR_OVERLAP, {"slots[0].m.codes", "slots[0].v.codes"}},
    {"slots[1].param overlaps slots[0].v.scales", k4,
     [](Setup& s) { s.p1.t.data = s.v0.scales->t.data; s.p1.t.byte_offset = 4; }, step,
     LBOPT_ERR_OVERLAP, {"slots[1].param", "slots[0].v.scales"}},

    // ---- AMSGrad / vmax / FP32 scales ----
    {"slots[0].vmax given without LBOPT_FLAG_AMSGRAD", k4, [](Setup& s) { s.slots[0].vmax = s.x0.view(); }, step,
     LBOPT_ERR_INVALID_VALUE, {"slots[0].vmax"}},
    {"slots[1].vmax.scales alone given without AMSGrad", k4,
     [](Setup& s) { s.slots[1].vmax.scales = &s.x1.scales->t; }, step, LBOPT_ERR_INVALID_VALUE, {"slots[1].vmax"}},
    {"AMSGrad with slots[1].vmax = {NULL, NULL}", kAms, [](Setup& s) { s.slots[1].vmax = {nullptr, nullptr}; },
     step, LBOPT_ERR_NULL_POINTER, {"slots[1].vmax.codes"}},
    {"AMSGrad flag set on a setup without vmax", k4, [](Setup& s) { s.config.flags |= LBOPT_FLAG_AMSGRAD; },
     step, LBOPT_ERR_NULL_POINTER, {"slots[0].vmax.codes"}},
    {"AMSGrad with slots[0].vmax.codes too small", kAms, [](Setup& s) { s.x0.codes->shape[0] = 100; }, step,
     LBOPT_ERR_BUFFER_SIZE, {"slots[0].vmax.codes"}},
    {"AMSGrad with slots[0].vmax = slots[0].v", kAms, [](Setup& s) { s.slots[0].vmax = s.slots[0].v; }, step,
     LBOPT_ERR_OVERLAP, {"slots[0].vmax.", "slots[0].v."}},
    {"fp32 kind with slots[0].m.scales given", kF32,
     [](Setup& s) { s.slots[0].m.scales = &s.add(f32(), {3}).t; }, step, LBOPT_ERR_INVALID_VALUE,
     {"slots[0].m.scales"}},

    // ---- quantize / dequantize ----
    {"quantize: NaN in src", k4, [](Setup& s) { s.values.as<float>()[17] = NAN; }, quantize,
     LBOPT_ERR_NONFINITE, {"src[17]"}},
    {"quantize: -inf in src (8-bit)", k8, [](Setup& s) { s.values.as<float>()[299] = -INFINITY; }, quantize,
     LBOPT_ERR_NONFINITE, {"src[299]"}},
    {"quantize: negative value as LBOPT_MOMENT_SECOND", k4,
     [](Setup& s) { s.fill(s.values, true); s.values.as<float>()[123] = -0.5f; s.moment = LBOPT_MOMENT_SECOND; },
     quantize, LBOPT_ERR_INVALID_VALUE, {"src[123]"}},
    {"quantize: moment = 2", k4, [](Setup& s) { s.moment = 2; }, quantize,
     LBOPT_ERR_INVALID_VALUE, {"moment"}},
    {"quantize: kind = 7", k4, [](Setup& s) { s.conv_kind = 7; }, quantize,
     LBOPT_ERR_INVALID_VALUE, {"kind"}},
    {"quantize: src = NULL", k4, [](Setup& s) { s.conv_values = nullptr; }, quantize, LBOPT_ERR_NULL_POINTER,
     {"src"}},
    {"quantize: src is bfloat16", k4, [](Setup& s) { s.values.t.dtype = bf16(); }, quantize, LBOPT_ERR_DTYPE,
     {"src"}},
    {"quantize: dst.scales too small", k4, [](Setup& s) { s.q.scales->shape[0] = 2; }, quantize,
     LBOPT_ERR_BUFFER_SIZE, {"dst.scales"}},
    {"quantize: dst.codes overlaps src", k4, [](Setup& s) { s.q.codes->t.data = s.values.t.data; }, quantize,
     LBOPT_ERR_OVERLAP, {"dst.codes", "src"}},
    {"quantize: src on cuda:0, dst on cpu", k4, [](Setup& s) { s.values.t.device = {kDLCUDA, 0}; }, quantize,
     LBOPT_ERR_DEVICE, {"dst.codes", "src"}},
    {"dequantize: src.scales = NULL", k8, [](Setup& s) { s.conv_state.scales = nullptr; }, dequantize,
     LBOPT_ERR_NULL_POINTER, {"src.scales"}},
    {"dequantize: dst is float16", k4, [](Setup& s) { s.values.t.dtype = f16(); }, dequantize, LBOPT_ERR_DTYPE,
     {"dst"}},
    {"dequantize: kind mismatch (4-bit buffers read as fp8)", k4,
     [](Setup& s) { s.conv_kind = LBOPT_STATE_FP8; }, dequantize, LBOPT_ERR_BUFFER_SIZE, {"src.codes"}},
    {"dequantize: dst aliases src.codes", k4, [](Setup& s) { s.values.t.data = s.q.codes->t.data; },
     dequantize, LBOPT_ERR_OVERLAP, {"dst", "src.codes"}},

    // ---- state_init / state_layout / config_init / options_init / threads ----
    {"state_init: numel = -1", k4, [](Setup& s) { s.numel = -1; }, state_init, LBOPT_ERR_INVALID_VALUE,
     {"numel"}},
    {"state_init: numel 301 for buffers of 300", k4, [](Setup& s) { s.numel = 301; }, state_init,
     LBOPT_ERR_BUFFER_SIZE, {"state.codes"}},
    {"state_init: kind = 4", k4, [](Setup& s) { s.conv_kind = 4; }, state_init,
     LBOPT_ERR_INVALID_VALUE, {"kind"}},
    {"state_init: fp32 kind with scales", kF32, [](Setup& s) { s.conv_state.scales = &s.add(f32(), {2}).t; },
     state_init, LBOPT_ERR_INVALID_VALUE, {"state.scales"}},
    {"state_layout: numel = -1", k4, [](Setup& s) { s.numel = -1; }, state_layout, LBOPT_ERR_INVALID_VALUE,
     {"numel"}},
    {"state_layout: out = NULL", k4, [](Setup& s) { s.layout_arg = nullptr; }, state_layout,
     LBOPT_ERR_NULL_POINTER, {"out"}},
    {"state_layout: kind = -1", k4, [](Setup& s) { s.conv_kind = -1; }, state_layout,
     LBOPT_ERR_INVALID_VALUE, {"kind"}},
    {"adamw_config_init(NULL)", k4, unchanged, [](Setup&) { return lbopt_adamw_config_init(nullptr, sizeof(lbopt_adamw_config)); },
     LBOPT_ERR_NULL_POINTER, {"config"}},
    {"step_options_init(NULL)", k4, unchanged, [](Setup&) { return lbopt_step_options_init(nullptr, sizeof(lbopt_step_options)); },
     LBOPT_ERR_NULL_POINTER, {"options"}},
    {"state_layout: out_size smaller than lbopt_layout", k4, unchanged,
     [](Setup& s) { return lbopt_state_layout(LBOPT_STATE_4BIT, 300, s.layout_arg, sizeof(lbopt_layout) - 8); },
     LBOPT_ERR_STRUCT_SIZE, {"out_size"}},
    {"state_layout: numel > INT64_MAX / 4", kF32, [](Setup& s) { s.numel = INT64_MAX / 2; }, state_layout,
     LBOPT_ERR_INVALID_VALUE, {"numel"}},
    {"adamw_config_init: struct_size too small", k4, unchanged,
     [](Setup& s) { return lbopt_adamw_config_init(&s.config, 8); }, LBOPT_ERR_STRUCT_SIZE, {"struct_size"}},
    {"step_options_init: struct_size 0", k4, unchanged,
     [](Setup& s) { return lbopt_step_options_init(&s.options, 0); }, LBOPT_ERR_STRUCT_SIZE, {"struct_size"}},
    {"set_num_threads(-1)", k4, unchanged, [](Setup&) { return lbopt_set_num_threads(-1); },
     LBOPT_ERR_INVALID_VALUE, {"n = -1"}},
  };
  return table;
}
// clang-format on

bool matches(const std::vector<std::string>& prefixes, const std::string& name) {
  for (const std::string& p : prefixes)
    if (name.compare(0, p.size(), p) == 0) return true;
  return false;
}

// Whether CUDA tensors can be stepped here: a CUDA build on a machine with a device.
bool cuda_step_available() {
  const char* info = lbopt_build_info();
  return strstr(info, "\"cuda_compiled\":true") != nullptr && strstr(info, "\"cuda_devices\":0,") == nullptr;
}

void run_case(const Case& c) {
  INFO("case: " << std::string(c.name) << " (" << std::string(base_name(c.base)) << " setup)");
  Setup s(c.base);
  c.mutate(s);
  const auto named = s.buffers();
  std::vector<uint64_t> before;
  for (const auto& nb : named) before.push_back(test::hash(*nb.second));

  // lbopt_adamw_step_validate gives the step's verdict and message, and writes nothing; where the step fails on
  // its config or lr, lbopt_adamw_config_validate says the same
  const bool is_step = c.call.target_type() == step.target_type();
  if (is_step) {
    const lbopt_status v = lbopt_adamw_config_validate(s.config_arg, s.lr);
    const std::string message = lbopt_last_error();
    const bool config_case = c.needles.size() && (c.needles[0].rfind("config", 0) == 0 || c.needles[0].rfind("lr", 0) == 0);
    if (config_case) {
      CHECK(int(v) == int(c.expected));
      for (const std::string& needle : c.needles) CHECK(message.find(needle) != std::string::npos);
    } else if (c.expected == LBOPT_OK) {
      CHECK(v == LBOPT_OK);
    }
  }
  std::string validate_error;
  if (is_step) {
    const lbopt_status v = lbopt_adamw_step_validate(s.config_arg, s.lr, s.slots_arg, s.n_slots, s.options_arg);
    validate_error = lbopt_last_error();
    CHECK(int(v) == int(c.expected));
    for (size_t i = 0; i < named.size(); ++i) {
      INFO("buffer after validate: " << named[i].first);
      CHECK(test::hash(*named[i].second) == before[i]);
    }
  }

  const lbopt_status status = c.call(s);
  const char* raw_error = lbopt_last_error();
  REQUIRE(raw_error != nullptr);
  const std::string error = raw_error;
  INFO("status: " << std::string(lbopt_status_string(status)));
  INFO("expected: " << std::string(lbopt_status_string(c.expected)));
  INFO("lbopt_last_error: \"" << error << "\"");

  // (1) the exact status
  CHECK(int(status) == int(c.expected));
  if (is_step) CHECK(validate_error == error);
  // (2) a message naming the argument (and none after a success)
  if (c.expected == LBOPT_OK) {
    CHECK(error.empty());
  } else {
    CHECK_FALSE(error.empty());
    for (const std::string& needle : c.needles) {
      INFO("needle: \"" << needle << "\"");
      CHECK(error.find(needle) != std::string::npos);
    }
  }
  // (3) no buffer written after a failure; after a success exactly the expected ones
  for (size_t i = 0; i < named.size(); ++i) {
    INFO("buffer: " << named[i].first);
    const bool changed = test::hash(*named[i].second) != before[i];
    if (matches(c.writes.must, named[i].first)) CHECK(changed);
    else if (!matches(c.writes.may, named[i].first)) CHECK_FALSE(changed);
  }
}

struct StatusName {
  lbopt_status status;
  const char* name;
};

}  // namespace

TEST_SUITE("invalid inputs") {
  TEST_CASE("invalid inputs: the case table is well formed") {
    const auto& table = cases();
    CHECK(table.size() >= 30);
    std::set<std::string> names;
    int failing = 0;
    for (const Case& c : table) {
      INFO("case: " << std::string(c.name));
      CHECK(names.insert(c.name).second);  // names are unique, so a failure points at one row
      if (c.expected != LBOPT_OK) {
        ++failing;
        CHECK_FALSE(c.needles.empty());
        CHECK(c.writes.must.empty());
        CHECK(c.writes.may.empty());
      } else {
        CHECK_FALSE(c.writes.must.empty());  // a success must be seen to write
      }
    }
    CHECK(failing >= 30);
    MESSAGE(table.size() << " cases, " << failing << " of them invalid calls");
  }

  TEST_CASE("invalid inputs: each call fails with its status, names the argument, writes nothing") {
    const bool cpu_only = !cuda_step_available();
    for (const Case& c : cases()) {
      if (c.needs_cpu_only_build && !cpu_only) {
        MESSAGE("skipped (CUDA can run here): " << std::string(c.name));
        continue;
      }
      run_case(c);
    }
  }

  TEST_CASE("invalid inputs: set_num_threads(-1) keeps the thread count") {
    const int threads = lbopt_get_num_threads();
    CHECK(lbopt_set_num_threads(-1) == LBOPT_ERR_INVALID_VALUE);
    CHECK(lbopt_get_num_threads() == threads);
  }

  TEST_CASE("invalid inputs: a failure's message is replaced by the next call's") {
    Setup s(Base::k4Bit);
    s.lr = kNaN;
    REQUIRE(s.step() == LBOPT_ERR_INVALID_VALUE);
    CHECK(strlen(lbopt_last_error()) > 0);
    s.lr = 1e-3;
    REQUIRE(s.step() == LBOPT_OK);
    CHECK(std::string(lbopt_last_error()).empty());
  }

  TEST_CASE("invalid inputs: every status string is distinct and starts with its enum name") {
    const StatusName all[] = {
        {LBOPT_OK, "LBOPT_OK"},
        {LBOPT_ERR_NULL_POINTER, "LBOPT_ERR_NULL_POINTER"},
        {LBOPT_ERR_STRUCT_SIZE, "LBOPT_ERR_STRUCT_SIZE"},
        {LBOPT_ERR_INVALID_VALUE, "LBOPT_ERR_INVALID_VALUE"},
        {LBOPT_ERR_DTYPE, "LBOPT_ERR_DTYPE"},
        {LBOPT_ERR_DEVICE, "LBOPT_ERR_DEVICE"},
        {LBOPT_ERR_SHAPE, "LBOPT_ERR_SHAPE"},
        {LBOPT_ERR_STRIDE, "LBOPT_ERR_STRIDE"},
        {LBOPT_ERR_ALIGNMENT, "LBOPT_ERR_ALIGNMENT"},
        {LBOPT_ERR_BUFFER_SIZE, "LBOPT_ERR_BUFFER_SIZE"},
        {LBOPT_ERR_OVERLAP, "LBOPT_ERR_OVERLAP"},
        {LBOPT_ERR_NONFINITE, "LBOPT_ERR_NONFINITE"},
        {LBOPT_ERR_UNSUPPORTED, "LBOPT_ERR_UNSUPPORTED"},
        {LBOPT_ERR_CUDA, "LBOPT_ERR_CUDA"},
        {LBOPT_ERR_OUT_OF_MEMORY, "LBOPT_ERR_OUT_OF_MEMORY"},
        {LBOPT_ERR_INTERNAL, "LBOPT_ERR_INTERNAL"},
    };
    std::set<std::string> seen;
    for (const StatusName& sn : all) {
      const char* text = lbopt_status_string(sn.status);
      REQUIRE(text != nullptr);
      INFO("status " << int(sn.status) << ": \"" << std::string(text) << "\"");
      // the enum name, then ':' so that e.g. LBOPT_ERR_CUDA cannot pass as a prefix of something longer
      CHECK(std::string(text).rfind(std::string(sn.name) + ":", 0) == 0);
      CHECK(seen.insert(text).second);
    }
    const char* unknown = lbopt_status_string(lbopt_status(99));
    REQUIRE(unknown != nullptr);
    CHECK(seen.count(unknown) == 0);
  }
}

// SIMD CPU kernels (Google Highway, runtime dispatch): the same per-element arithmetic as adamw_element.h and the
// same per-value quantization as quant.h, a vector at a time, for whole scale blocks. Only targets with a fused
// multiply-add run them, so every result is bit-identical to the portable kernels (tests/cpu/test_simd.cpp); on
// other targets, for float16 params or grads, for stochastic rounding and for a partial last block the portable
// kernels run instead.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/adamw_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <string.h>

#include "kernels/cpu/kernels_cpu.h"

HWY_BEFORE_NAMESPACE();
namespace lbopt::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#undef LBOPT_EXACT_FMA  // this file is compiled once per target
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_NEON || \
    HWY_TARGET == HWY_SVE || HWY_TARGET == HWY_SVE2
#define LBOPT_EXACT_FMA 1
#else
#define LBOPT_EXACT_FMA 0
#endif

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

#if LBOPT_EXACT_FMA

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using DU16 = hn::Rebind<uint16_t, DF>;

// e4m3 decoding as a table, for the same gather as the codebooks.
const float* fp8_table() {
  static const auto* table = [] {
    static float t[256];
    for (int c = 0; c < 256; ++c) t[c] = fp8_e4m3_decode(uint8_t(c));
    return t;
  }();
  return table;
}

template <class V>
HWY_INLINE V load_elem(Dtype dt, const void* p, int64_t i) {
  const DF df;
  if (dt == kFloat32) return hn::LoadU(df, static_cast<const float*>(p) + i);
  const DU du;
  const DU16 du16;
  const auto bits = hn::PromoteTo(du, hn::LoadU(du16, static_cast<const uint16_t*>(p) + i));
  return hn::BitCast(df, hn::ShiftLeft<16>(bits));
}

template <class V>
HWY_INLINE void store_param(Dtype dt, void* p, int64_t i, V x) {
  const DF df;
  if (dt == kFloat32) return hn::StoreU(x, df, static_cast<float*>(p) + i);
  // float_to_bf16: round to nearest even, NaN stays a quiet NaN
  const DU du;
  const DI di;
  const DU16 du16;
  const auto b = hn::BitCast(du, x);
  const auto rounded = hn::ShiftRight<16>(hn::Add(b, hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(b),
                                                                                      hn::Set(du, 1u)))));
  const auto is_nan = hn::Gt(hn::And(b, hn::Set(du, 0x7fffffffu)), hn::Set(du, 0x7f800000u));
  const auto nan = hn::Or(hn::ShiftRight<16>(b), hn::Set(du, 0x40u));
  const auto out = hn::IfThenElse(is_nan, nan, rounded);
  hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di, out)), du16, static_cast<uint16_t*>(p) + i);
}

// Decode one whole block of a state into x.
void decode(const StateCodec& c, StateRef st, int64_t b, int64_t start, int64_t bs, float* x, int32_t* idx) {
  if (c.kind == kStateFp32) {
    memcpy(x, static_cast<const float*>(st.codes) + start, size_t(bs) * sizeof(float));
    return;
  }
  const uint8_t* codes = static_cast<const uint8_t*>(st.codes);
  if (c.kind == kState4Bit) {
    for (int64_t j = 0; j < bs / 2; ++j) {
      const uint8_t byte = codes[(start >> 1) + j];
      idx[2 * j] = byte >> 4;
      idx[2 * j + 1] = byte & 15;
    }
  } else {
    for (int64_t j = 0; j < bs; ++j) idx[j] = codes[start + j];
  }
  const DF df;
  const DI di;
  const float* table = c.kind == kStateFp8 ? fp8_table() : c.values;
  const auto scale = hn::Set(df, st.scales[b]);
  for (int64_t i = 0; i < bs; i += int64_t(hn::Lanes(df)))
    hn::Store(hn::Mul(hn::GatherIndex(df, table, hn::Load(di, idx + i)), scale), df, x + i);
}

// Requantize one whole block from x with a fresh absmax scale; non-finite values are stored as 0.
void encode(const StateCodec& c, StateRef st, int64_t b, int64_t start, int64_t bs, float* x, int32_t* idx) {
  if (c.kind == kStateFp32) {
    memcpy(static_cast<float*>(st.codes) + start, x, size_t(bs) * sizeof(float));
    return;
  }
  const DF df;
  const DI di;
  const int64_t n = int64_t(hn::Lanes(df));
  auto absmax = hn::Zero(df);
  for (int64_t i = 0; i < bs; i += n) {
    const auto v = hn::Load(df, x + i);
    const auto finite = hn::IfThenElseZero(hn::IsFinite(v), v);
    hn::Store(finite, df, x + i);
    absmax = hn::Max(absmax, hn::Abs(finite));
  }
  const float scale = c.scale_for(hn::GetLane(hn::MaxOfLanes(df, absmax)));
  st.scales[b] = scale;
  const auto vscale = hn::Set(df, scale);
  for (int64_t i = 0; i < bs; i += n) {
    const auto y = hn::Div(hn::Load(df, x + i), vscale);
    if (c.kind == kStateFp8) {  // the bit-level e4m3 rounding stays scalar, as StateCodec::encode
      hn::Store(y, df, x + i);
      for (int64_t k = 0; k < n; ++k) {
        uint32_t code = fp8_e4m3_encode(x[i + k]);
        if (c.guard_zero && code == 0 && x[i + k] > 0.0f) code = 1;
        idx[i + k] = int32_t(code);
      }
      continue;
    }
    auto code = hn::Zero(di);
    if (c.entries == 16) {  // count the midpoints <= y
      for (int k = 0; k < 15; ++k)
        code = hn::Add(code, hn::IfThenElseZero(hn::RebindMask(di, hn::Le(hn::Set(df, c.mids[k]), y)), hn::Set(di, 1)));
    } else {
      // codebook_encode's binary search over 256 midpoints: its first four steps only probe mids[16j + 15], so
      // they are a count over those 15 (broadcast, no gather); the last four steps gather.
      for (int j = 0; j < 15; ++j)
        code = hn::Add(code, hn::IfThenElseZero(hn::RebindMask(di, hn::Le(hn::Set(df, c.mids[16 * j + 15]), y)),
                                                hn::Set(di, 16)));
      for (int32_t step = 8; step > 0; step >>= 1) {
        const auto probe = hn::GatherIndex(df, c.mids, hn::Add(code, hn::Set(di, step - 1)));
        code = hn::Add(code, hn::IfThenElseZero(hn::RebindMask(di, hn::Le(probe, y)), hn::Set(di, step)));
      }
    }
    if (c.guard_zero) {
      const auto lift = hn::And(hn::Eq(code, hn::Zero(di)), hn::RebindMask(di, hn::Gt(y, hn::Zero(df))));
      code = hn::IfThenElse(lift, hn::Set(di, 1), code);
    }
    hn::Store(code, di, idx + i);
  }
  uint8_t* codes = static_cast<uint8_t*>(st.codes);
  if (c.kind == kState4Bit) {
    for (int64_t j = 0; j < bs / 2; ++j) codes[(start >> 1) + j] = uint8_t((idx[2 * j] << 4) | idx[2 * j + 1]);
  } else {
    for (int64_t j = 0; j < bs; ++j) codes[start + j] = uint8_t(idx[j]);
  }
}

int64_t StepFullBlocks(const StepSlot& slot, const StepFlags& flags, int64_t b0, int64_t b1) {
  const bool sr = flags.stochastic_round && slot.param_dtype == kBfloat16;
  if (sr || slot.param_dtype == kFloat16 || slot.grad_dtype == kFloat16) return b0;
  const int64_t bs = work_block_size(flags.kind);
  b1 = b1 < slot.numel / bs ? b1 : slot.numel / bs;  // whole blocks only
  const StateCodec cm = host_codec(flags.kind, false), cv = host_codec(flags.kind, true);
  const StepScalars& s = slot.scalars;
  const DF df;
  const int64_t n = int64_t(hn::Lanes(df));
  HWY_ALIGN float m[256], v[256], vm[256];
  HWY_ALIGN int32_t idx[256];
  const auto grad_factor = hn::Set(df, s.grad_factor), decay = hn::Set(df, s.decay_factor), wd = hn::Set(df, s.wd);
  const float w = s.one_minus_beta1;
  const auto vw = hn::Set(df, w < 0.5f ? w : -(1.0f - w));
  const auto beta2 = hn::Set(df, s.beta2), omb2 = hn::Set(df, s.one_minus_beta2);
  const auto nss = hn::Set(df, s.neg_step_size), sqrt_bc2 = hn::Set(df, s.sqrt_bc2), eps = hn::Set(df, s.eps);
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t start = b * bs;
    decode(cm, slot.m, b, start, bs, m, idx);
    decode(cv, slot.v, b, start, bs, v, idx);
    if (s.amsgrad) decode(cv, slot.vmax, b, start, bs, vm, idx);
    for (int64_t i = 0; i < bs; i += n) {
      auto p = load_elem<hn::Vec<DF>>(slot.param_dtype, slot.param, start + i);
      auto g = hn::Mul(load_elem<hn::Vec<DF>>(slot.grad_dtype, slot.grad, start + i), grad_factor);
      if (s.coupled_decay) g = hn::MulAdd(wd, p, g);
      else p = hn::Mul(p, decay);
      auto vm_ = hn::Load(df, m + i);
      const auto diff = hn::Sub(g, vm_);
      vm_ = hn::MulAdd(vw, diff, w < 0.5f ? vm_ : g);  // torch.lerp, as adamw_element
      auto vv = hn::MulAdd(hn::Mul(omb2, g), g, hn::Mul(hn::Load(df, v + i), beta2));
      auto used = vv;
      if (s.amsgrad) {
        const auto mx = hn::Max(hn::Load(df, vm + i), vv);
        hn::Store(mx, df, vm + i);
        used = mx;
      }
      const auto denom = hn::Add(hn::Div(hn::Sqrt(used), sqrt_bc2), eps);
      p = hn::Add(p, hn::Div(hn::Mul(nss, vm_), denom));
      store_param(slot.param_dtype, slot.param, start + i, p);
      hn::Store(vm_, df, m + i);
      hn::Store(vv, df, v + i);
    }
    encode(cm, slot.m, b, start, bs, m, idx);
    encode(cv, slot.v, b, start, bs, v, idx);
    if (s.amsgrad) encode(cv, slot.vmax, b, start, bs, vm, idx);
  }
  return b1 > b0 ? b1 : b0;
}

#else

int64_t StepFullBlocks(const StepSlot&, const StepFlags&, int64_t b0, int64_t) { return b0; }

#endif  // LBOPT_EXACT_FMA

}  // namespace HWY_NAMESPACE
}  // namespace lbopt::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <stdlib.h>

namespace lbopt::cpu {

HWY_EXPORT(StepFullBlocks);
HWY_EXPORT(TargetName);

namespace {
// LBOPT_CPU_KERNELS=portable turns the SIMD kernels off (read on every call: tests compare both in one process).
bool simd_enabled() {
  const char* env = getenv("LBOPT_CPU_KERNELS");
  return !(env && strcmp(env, "portable") == 0);
}
}  // namespace

int64_t adamw_blocks_simd(const StepSlot& slot, const StepFlags& flags, int64_t block_begin, int64_t block_end) {
  if (!simd_enabled()) return block_begin;
  return HWY_DYNAMIC_DISPATCH(StepFullBlocks)(slot, flags, block_begin, block_end);
}

const char* simd_target() { return simd_enabled() ? HWY_DYNAMIC_DISPATCH(TargetName)() : "portable"; }

}  // namespace lbopt::cpu
#endif  // HWY_ONCE

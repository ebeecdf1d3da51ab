// The SIMD kernels' vector types and their element operations: param and grad loads and stores in every dtype
// (with dtype_convert.h's rounding and random bits), optimizers.h's ScalarOps on vectors, and the per-block absmax.
// Included once per target by the SIMD units, after simd_policy-inl.h, outside any namespace.
#if defined(LBOPT_KERNELS_CPU_SIMD_VALUES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LBOPT_KERNELS_CPU_SIMD_VALUES_INL_H_
#undef LBOPT_KERNELS_CPU_SIMD_VALUES_INL_H_
#else
#define LBOPT_KERNELS_CPU_SIMD_VALUES_INL_H_
#endif

#include <hwy/highway.h>

#include "kernels/cpu/kernels_cpu.h"
#include "kernels/dtype_convert.h"

HWY_BEFORE_NAMESPACE();
namespace lbopt::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
#if LBOPT_EXACT_FMA

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DI = hn::RebindToSigned<DF>;
using VI = hn::Vec<DI>;
using DU = hn::RebindToUnsigned<DF>;
using VU = hn::Vec<DU>;
using DU16 = hn::Rebind<uint16_t, DF>;
using DF16 = hn::Rebind<hwy::float16_t, DF>;
using DU8 = hn::Rebind<uint8_t, DF>;
using DU64 = hn::Repartition<uint64_t, DU>;

constexpr int kMaxLanes = HWY_MAX_BYTES / sizeof(float);  // an upper bound, also for scalable vectors

HWY_INLINE VF load_value(Dtype dt, const void* p, int64_t i) {
  const DF df;
  if (dt == kFloat32) return hn::LoadU(df, static_cast<const float*>(p) + i);
  if (dt == kFloat16) return hn::PromoteTo(df, hn::LoadU(DF16(), static_cast<const hwy::float16_t*>(p) + i));
  const auto bits = hn::PromoteTo(DU(), hn::LoadU(DU16(), static_cast<const uint16_t*>(p) + i));
  return hn::BitCast(df, hn::ShiftLeft<16>(bits));
}

// dtype_convert.h's random_bits for the elements e0 .. e0 + lanes - 1: a u64 vector holds half of them, so the
// even and the odd elements are mixed separately and interleaved.
HWY_INLINE VU random_bits_vec(uint64_t seed, uint64_t step, int64_t e0) {
  const DU64 d64;
  const auto base = hn::Set(d64, seed ^ (step * 0x9E3779B97F4A7C15ull));
  const auto mix = [&](hn::Vec<DU64> index) HWY_ATTR {
    auto z = hn::Add(base, hn::Mul(hn::Add(index, hn::Set(d64, 1)), hn::Set(d64, 0xD1B54A32D192ED03ull)));
    z = hn::Mul(hn::Xor(z, hn::ShiftRight<30>(z)), hn::Set(d64, 0xBF58476D1CE4E5B9ull));
    z = hn::Mul(hn::Xor(z, hn::ShiftRight<27>(z)), hn::Set(d64, 0x94D049BB133111EBull));
    return hn::Xor(z, hn::ShiftRight<31>(z));
  };
  const auto lane = hn::Iota(d64, 0);
  const auto even = hn::Add(hn::Set(d64, uint64_t(e0)), hn::Add(lane, lane));
  const DU du;
  return hn::OddEven(hn::BitCast(du, hn::ShiftLeft<32>(mix(hn::Add(even, hn::Set(d64, 1))))),
                     hn::BitCast(du, mix(even)));
}

// dtype_convert.h's float_to_bf16 / float_to_bf16_stochastic / float_to_f16; NaN stays the same quiet NaN.
HWY_INLINE void store_param(Dtype dt, void* p, int64_t i, VF x, const VU* random) {
  const DF df;
  const DU du;
  if (dt == kFloat32) return hn::StoreU(x, df, static_cast<float*>(p) + i);
  // **float16 store**: the hardware conversion's result as it is where no lane is NaN (whose payload it keeps,
  // where float_to_f16 gives the sign and 0x7e00), the common case, with no widening and narrowing around it
  if (dt == kFloat16 && hn::AllFalse(df, hn::IsNaN(x)))
    return hn::StoreU(hn::DemoteTo(DF16(), x), DF16(), static_cast<hwy::float16_t*>(p) + i);
  const auto b = hn::BitCast(du, x);
  const auto is_nan = hn::RebindMask(du, hn::IsNaN(x));
  const auto high = hn::ShiftRight<16>(b);
  VU out, nan;
  if (dt == kFloat16) {  // the hardware conversion rounds to nearest even, to Inf past 65504, subnormals too
    out = hn::PromoteTo(du, hn::BitCast(DU16(), hn::DemoteTo(DF16(), x)));
    nan = hn::Or(hn::And(high, hn::Set(du, 0x8000u)), hn::Set(du, 0x7e00u));
  } else {
    const auto low = hn::And(b, hn::Set(du, 0xffffu));
    if (random) {
      const auto up = hn::Lt(hn::And(*random, hn::Set(du, 0xffffu)), low);
      out = hn::Add(high, hn::IfThenElseZero(up, hn::Set(du, 1u)));
    } else {
      out = hn::ShiftRight<16>(hn::Add(b, hn::Add(hn::Set(du, 0x7fffu), hn::And(high, hn::Set(du, 1u)))));
    }
    nan = hn::Or(high, hn::Set(du, 0x40u));
  }
  out = hn::IfThenElse(is_nan, nan, out);
  hn::StoreU(hn::DemoteTo(DU16(), hn::BitCast(DI(), out)), DU16(), static_cast<uint16_t*>(p) + i);
}


// How store_param_at rounds a param: to nearest (every dtype), stochastically (bf16), or to nearest by the CPU's
// bf16 conversion (bf16, below).
enum class ParamRound { kNearest, kStochastic, kConvert };

#if LBOPT_BF16_CONVERT
// float_to_bf16 of a whole vector by vcvtneps2bf16 (**bf16 store**), where the CPU has it (cpu_has_bf16_convert):
// the instruction rounds to nearest even and quiets NaN as float_to_bf16 does, for every float but the subnormals,
// which it flushes to zero (checked over all 2^32 floats); a vector holding one returns false and takes
// store_param's integer rounding.
HWY_INLINE bool store_bf16_convert(void* p, int64_t i, VF x) {
  if (_mm512_fpclass_ps_mask(x.raw, 0x20)) return false;  // 0x20: denormal
  __m256i h;
  __asm__("vcvtneps2bf16 %1, %0" : "=v"(h) : "v"(x.raw));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(p) + i), h);
  return true;
}
#endif

// store_param of elements e .. e + lanes - 1, rounded as `round` says (**param store**: a function, not a lambda
// of the step, whose captures were reloaded after every code byte store, which may alias them).
HWY_INLINE void store_param_at(Dtype dt, void* p, int64_t e, VF x, ParamRound round, uint64_t seed, uint64_t step) {
  if (round == ParamRound::kStochastic) {
    const VU random = random_bits_vec(seed, step, e);
    return store_param(dt, p, e, x, &random);
  }
#if LBOPT_BF16_CONVERT
  if (round == ParamRound::kConvert && store_bf16_convert(p, e, x)) return;
#endif
  store_param(dt, p, e, x, nullptr);
}

// ScalarOps::max: a NaN operand yields the other one (AMSGrad's running max keeps its value on a NaN v), and of
// equal operands, -0 and +0, the first (a state handed in may hold -0).
HWY_INLINE VF fmax_vec(VF a, VF b) { return hn::IfThenElse(hn::Or(hn::Ge(a, b), hn::IsNaN(b)), a, b); }

// Per-block accumulator of a state for encode_block: the bits of |x| as integers, which order every
// non-negative float and put Inf and NaN above all finite ones, so that one integer max per vector also flags them.
HWY_INLINE void block_max_add(VI& maxbits, VF x) { maxbits = hn::Max(maxbits, hn::BitCast(DI(), hn::Abs(x))); }

// The largest bits block_max_add saw: below 0x7f800000 when every value was finite.
HWY_INLINE int32_t block_top(VI maxbits) { return hn::GetLane(hn::MaxOfLanes(DI(), maxbits)); }

// The block's absmax for encode_block, with non-finite values in x zeroed first (finite_or_zero): the rare
// blocks that held one are rescanned.
HWY_INLINE float block_absmax(float* x, int64_t bs, int32_t top) {
  const DF df;
  if (top < 0x7f800000) return bits_float(uint32_t(top));
  auto absmax = hn::Zero(df);
  for (int64_t i = 0; i < bs; i += int64_t(hn::Lanes(df))) {
    const auto v = hn::Load(df, x + i);
    const auto f = hn::IfThenElseZero(hn::IsFinite(v), v);
    hn::Store(f, df, x + i);
    absmax = hn::Max(absmax, hn::Abs(f));
  }
  return hn::GetLane(hn::MaxOfLanes(df, absmax));
}

// The element operations of optimizers.h's ScalarOps on vectors, with the same rounding.
struct VecOps {
  using V = VF;
  static HWY_INLINE VF set(float x) { return hn::Set(DF(), x); }
  static HWY_INLINE VF add(VF a, VF b) { return hn::Add(a, b); }
  static HWY_INLINE VF sub(VF a, VF b) { return hn::Sub(a, b); }
  static HWY_INLINE VF mul(VF a, VF b) { return hn::Mul(a, b); }
  static HWY_INLINE VF div(VF a, VF b) { return hn::Div(a, b); }
  static HWY_INLINE VF fma(VF a, VF b, VF c) { return hn::MulAdd(a, b, c); }
  static HWY_INLINE VF sqrt(VF a) { return hn::Sqrt(a); }
  static HWY_INLINE VF div_by_scalar(VF x, float c, float) { return hn::Div(x, hn::Set(DF(), c)); }
  static HWY_INLINE VF max(VF a, VF b) { return fmax_vec(a, b); }
  static HWY_INLINE VF sign(VF a) {
    const DF df;
    const auto keep = hn::Or(hn::Eq(a, hn::Zero(df)), hn::IsNaN(a));
    return hn::IfThenElse(keep, a, hn::CopySign(hn::Set(df, 1.0f), a));
  }
};


#endif  // LBOPT_EXACT_FMA
}  // namespace HWY_NAMESPACE
}  // namespace lbopt::cpu
HWY_AFTER_NAMESPACE();

#endif  // include guard

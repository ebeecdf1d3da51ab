// SIMD CPU kernels (Google Highway, runtime dispatch): every optimizer's own element update (optim/*.h) on vector
// operations of the same rounding, the same per-value quantization as quant.h and the same conversions and random
// bits as dtype_convert.h, a vector at a time, for whole scale blocks. Only targets with a fused multiply-add run them, so every result is
// bit-identical to the portable kernels (tests/cpu/test_simd.cpp); on other targets and for a partial last block
// the portable kernels run instead.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/step_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/cpu/codebook4-inl.h"
#include "kernels/cpu/codebook8_arith-inl.h"

#include <string.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cpu/kernels_cpu.h"

HWY_BEFORE_NAMESPACE();
namespace lbopt::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#undef LBOPT_EXACT_FMA  // this file is compiled once per target
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_NEON || \
    HWY_TARGET == HWY_SVE || HWY_TARGET == HWY_SVE2 || HWY_TARGET == HWY_SVE_256 || HWY_TARGET == HWY_SVE2_128
#define LBOPT_EXACT_FMA 1
#else
#define LBOPT_EXACT_FMA 0
#endif

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

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

// quant.h's fp8_e4m3_encode for finite y: nearest even, saturating at 448, subnormals in steps of 2^-9.
HWY_INLINE VU fp8_encode(VF y) {
  const DF df;
  const DU du;
  const auto sign = hn::And(hn::ShiftRight<24>(hn::BitCast(du, y)), hn::Set(du, 0x80u));
  const auto a = hn::Min(hn::Abs(y), hn::Set(df, 448.0f));
  // below 2^-6, a * 512 < 8 is exact and the float adder rounds it to an integer (1.5 * 2^23 + its value)
  const auto sub = hn::Sub(hn::BitCast(du, hn::MulAdd(a, hn::Set(df, 512.0f), hn::Set(df, 12582912.0f))),
                           hn::Set(du, 0x4b400000u));
  auto b = hn::BitCast(du, a);
  b = hn::Add(b, hn::Add(hn::Set(du, 0x7ffffu), hn::And(hn::ShiftRight<20>(b), hn::Set(du, 1u))));
  // b >> 20 is the exponent e times 8 plus the 3 mantissa bits: minus 120 * 8, it is ((e - 120) << 3) | mantissa
  const auto normal = hn::Sub(hn::ShiftRight<20>(b), hn::Set(du, 120u << 3));
  const auto is_sub = hn::RebindMask(du, hn::Lt(a, hn::Set(df, 0.015625f)));
  return hn::Or(sign, hn::IfThenElse(is_sub, sub, hn::Min(normal, hn::Set(du, 0x7eu))));
}

// A state's codec with its 4-bit codebook laid out for lookup16.
struct SimdCodec {
  StateCodec c{};
  Table16 values;  // 4-bit: the codebook
  bool second = false;  // a second moment's codec: the non-negative maps, and zero guarded (codec_for)

  SimdCodec() = default;
  explicit SimdCodec(const StateCodec& codec) { init(codec); }
  void init(const StateCodec& codec) {
    c = codec;
    second = c.guard_zero || c.mids == codebook::kUnsigned4Mids;
    if (c.kind == kState4Bit) values.fill(c.values);
  }
};

// Element 2i's code in the high nibble: shift counts 4, 0, 4, 0, ... by lane.
HWY_INLINE VU nibble_shifts() {
  const DU du;
  const auto one = hn::Set(du, 1u);
  return hn::ShiftLeft<2>(hn::Xor(hn::And(hn::Iota(du, 0), one), one));
}

// table[code] per lane for the lanes' 8-bit codes at `bytes`. AVX2: eight scalar loads, with the code bytes read
// from memory, joined by shuffles, which Zen 3 runs faster than a gather. The 8-bit encode's bucket-table gather,
// whose indices are a vector result, gains nothing that way. Other targets keep the gather, which Intel's AVX-512
// runs faster than sixteen scalar loads (docs/benchmarks.md, "CPU loop choices": 8-bit decode).
HWY_INLINE VF lookup256(const float* table, const uint8_t* bytes) {
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
  const auto pair = [&](int j) HWY_ATTR {
    return _mm_unpacklo_ps(_mm_load_ss(table + bytes[j]), _mm_load_ss(table + bytes[j + 1]));
  };
  const __m128 low = _mm_movelh_ps(pair(0), pair(2)), high = _mm_movelh_ps(pair(4), pair(6));
  return VF{_mm256_insertf128_ps(_mm256_castps128_ps256(low), high, 1)};
#else
  return hn::GatherIndex(DF(), table, hn::BitCast(DI(), hn::PromoteTo(DU(), hn::LoadU(DU8(), bytes))));
#endif
}

// Whether decode_vec computes the unsigned 4-bit map's values (a second moment's, codec_for) rather than read them
// from the scaled table: on AVX2, where a 16-entry table costs two permutes and a blend (docs/benchmarks.md, "CPU
// loop choices": unsigned 4-bit decode).
constexpr bool kLinearDecode4 = HWY_TARGET == HWY_AVX2;

// The codes of elements i .. i + lanes - 1 of a block (codes: the block's first byte), decoded and scaled.
// 4-bit: exactly the lanes / 2 bytes that hold them are loaded (a full-width load could pass the end of the
// state), then each byte is duplicated, widened and shifted.
// 4-bit: `scaled` is the codebook times the block's scale (scale_table), so that an element's decode is its
// lookup alone, with the product decode_vec would round per element.
template <int kKind, bool kSecond = false>
HWY_INLINE VF decode_vec(const SimdCodec& sc, const uint8_t* codes, int64_t i, VF scale, const Table16& scaled) {
  const DF df;
  const DU du;
  if (kKind == kState4Bit) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
    // x86: the lanes / 2 bytes broadcast to every 128-bit block (the load does it), a byte shuffle gives lane j
    // byte j / 2, the shift brings its nibble down, and lookup16 reads only the low 4 bits: fewer instructions than
    // the generic unpack (docs/benchmarks.md, "CPU loop choices": 4-bit decode)
    using Raw = hn::Repartition<std::conditional_t<kMaxLanes >= 16, uint64_t, uint32_t>, DU>;
    typename hn::TFromD<Raw> raw;
    memcpy(&raw, codes + i / 2, sizeof raw);
    const auto pick = hn::BitCast(hn::Repartition<uint8_t, DU>(), hn::Or(hn::ShiftRight<1>(hn::Iota(du, 0)),
                                                                        hn::Set(du, 0x80808000u)));
    const auto bytes = hn::TableLookupBytesOr0(hn::BitCast(hn::Repartition<uint8_t, DU>(), hn::Set(Raw(), raw)), pick);
    const auto code = hn::BitCast(DI(), hn::Shr(hn::BitCast(du, bytes), nibble_shifts()));
    // the unsigned map (k + 1) / 16: RN((code + 1) s / 16) by a conversion and a multiply-add, equal to the
    // scaled table's entry (s / 16 is exact); no table is scaled for it
    if (kLinearDecode4 && kSecond) {
      const auto s16 = hn::Set(df, hn::GetLane(scale) * 0.0625f);
      return hn::MulAdd(hn::ConvertTo(df, hn::And(code, hn::Set(DI(), 15))), s16, s16);
    }
    return lookup16(scaled, code);
#else
    const auto pairs = hn::ZeroExtendVector(DU8(), hn::LoadU(hn::Half<DU8>(), codes + i / 2));
    const auto code = hn::Shr(hn::PromoteTo(du, hn::InterleaveLower(DU8(), pairs, pairs)), nibble_shifts());
    return lookup16(scaled, hn::BitCast(DI(), code));
#endif
  }
  if (kKind == kStateFp8) {
    const auto code = hn::PromoteTo(du, hn::LoadU(DU8(), codes + i));
    // e4m3's exponent and mantissa bits moved to float's place and rebiased by an integer add give the normal
    // values; the subnormals (exponent 0) are m * 2^-9. No float operand is subnormal: on x86 each one costs a
    // microcode assist, one per small v code (docs/benchmarks.md, "CPU loop choices": FP8 decode).
    const auto bits = hn::And(code, hn::Set(du, 0x7fu));
    const auto normal = hn::BitCast(df, hn::Add(hn::ShiftLeft<20>(bits), hn::Set(du, 120u << 23)));
    const auto sub = hn::Mul(hn::ConvertTo(df, hn::BitCast(DI(), bits)), hn::Set(df, 0x1p-9f));
    const auto mag = hn::IfThenElse(hn::RebindMask(df, hn::Lt(bits, hn::Set(du, 8u))), sub, normal);
    const auto sign = hn::BitCast(df, hn::ShiftLeft<24>(hn::And(code, hn::Set(du, 0x80u))));
    return hn::Mul(hn::Or(mag, sign), scale);
  }
  return hn::Mul(lookup256(sc.c.values, codes + i), scale);
}

// decode_vec's 4-bit table for a block of scale `scale`.
HWY_INLINE void scale_table(const SimdCodec& sc, float scale, Table16& scaled) {
  const DF df;
  for (int c = 0; c < Table16::kPad; c += int(hn::Lanes(df)))
    hn::Store(hn::Mul(hn::Load(df, sc.values.t + c), hn::Set(df, scale)), df, scaled.t + c);
}

// Where decode_vec reads block b of a quantized state.
template <int kKind>
HWY_INLINE const uint8_t* block_codes(StateRef st, int64_t start) {
  return static_cast<const uint8_t*>(st.codes) + state_byte(kKind, start);
}

// Requantizes block b of a state from x (finite values) with the block's absmax, a vector at a time, so that the
// step can run a block's encode inside the next block's update loop (see step_blocks). No map needs the generic
// search: the 8-bit codes come from one table read on the float's top bits and one compare (codebook8_arith.h;
// docs/benchmarks.md, "CPU loop choices": 8-bit encode), the 4-bit ones from a fold of the signed map or the
// linear unsigned map, or thresholds in x on AVX-512 (codebook4-inl.h).
template <int kKind>
class BlockEncoder {
 public:
  // Starts on block b of state st (whose codes begin at element start); x: the block's values.
  HWY_INLINE void init(const SimdCodec& sc, StateRef st, int64_t b, int64_t start, const float* x, float absmax) {
    sc_ = &sc;
    codes_ = static_cast<uint8_t*>(st.codes) + state_byte(kKind, start);
    x_ = x;
    scale_ = sc.c.block_scale(absmax);
    st.scales[b] = scale_.scale;
#if LBOPT_ENCODE4_IN_X
    if (kKind == kState4Bit)
      thresholds_.init(sc.second, scale_.scale);
#endif
  }

  // Vector i of the block (i a multiple of the lane count, in order: 4-bit codes are packed in pairs of vectors,
  // kOdd: the second of its pair). kSecond: the state is a second moment (sc.second), on the non-negative map.
  template <bool kSecond, bool kOdd>
  HWY_INLINE void vec(int64_t i) {
    const DF df;
    const DI di;
    const DU du;
    const auto xi = hn::Load(df, x_ + i);
#if LBOPT_ENCODE4_IN_X
    constexpr bool kInX = kKind == kState4Bit;
#else
    constexpr bool kInX = false;
#endif
    // StateCodec::encode_input
    const auto yi = kInX                    ? xi
                    : kKind == kState8Bit ? hn::Mul(xi, hn::Set(df, scale_.inverse))
                                          : hn::Div(xi, hn::Set(df, scale_.scale));
    VI c;
    if (kKind == kStateFp8) {
      c = hn::BitCast(di, fp8_encode(yi));
    } else if (kKind == kState8Bit) {
      // the map known at compile time: its fields are constants, not loads after every code store
      c = Encode8Arith(df, yi, kSecond ? kEncode8Unsigned : kEncode8Signed);
    } else {
#if LBOPT_ENCODE4_IN_X
      c = kSecond ? thresholds_.code_linear(xi) : thresholds_.code_signed(xi);
#else
      c = kSecond ? Encode4Linear(df, yi) : Encode4Signed(df, yi);
#endif
    }
    if (kKind != kState4Bit) {
      auto u = hn::BitCast(du, c);
      if (kSecond) {  // the maps with a zero code: guard_zero (the 4-bit maps have none)
        const auto lift = hn::And(hn::Eq(u, hn::Zero(du)), hn::RebindMask(du, hn::Gt(yi, hn::Zero(df))));
        u = hn::IfThenElse(lift, hn::Set(du, 1u), u);
      }
      hn::StoreU(hn::TruncateTo(DU8(), u), DU8(), codes_ + i);
      return;
    }
    const int64_t n = int64_t(hn::Lanes(df));
    if (!kOdd) {
      hn::Store(c, di, even_);
      return;
    }
    uint8_t* const out = codes_ + ((i - n) >> 1);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
    // x86: both vectors packed to 16-bit lanes (per 128-bit block k: lanes 4k .. 4k + 3 of the even vector, then of
    // this one), each pair of lanes joined by a multiply-add as 16 a + b, and the bytes put in order: 5
    // instructions for two vectors where the generic form below takes 9 to 11. The pack saturates, so the codes
    // < 0 (Encode4Linear's of a negative x, Encode4Signed's of y < -mids[14] on AVX2) become 0.
#if HWY_TARGET <= HWY_AVX3
    const __m512i words = _mm512_packus_epi32(_mm512_load_si512(even_), c.raw);
    const __m512i joined = _mm512_madd_epi16(words, _mm512_set1_epi32(0x00010010));
    // joined's lanes 4k .. 4k + 3 hold even-vector pairs 2k, 2k + 1, then this vector's pairs 2k, 2k + 1
    const __m128i order = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_shuffle_epi8(_mm512_cvtepi32_epi8(joined), order));
#else
    const __m256i words = _mm256_packus_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(even_)), c.raw);
    const __m256i joined = _mm256_madd_epi16(words, _mm256_set1_epi32(0x00010010));
    // per block k: the low byte of each 32-bit lane into bytes 0-3 (even pairs 2k, 2k + 1, then this vector's)
    const __m256i low = _mm256_shuffle_epi8(
        joined, _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1,
                                 -1, -1, -1, -1, -1, -1, -1, -1, -1));
    const __m128i bytes = _mm_unpacklo_epi16(_mm256_castsi256_si128(low), _mm256_extracti128_si256(low, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out), bytes);
#endif
#else
    // Two vectors of codes make one vector of bytes: shift the even lanes by 4 and OR each lane pair (in its u64)
    // into the even lane, then keep the even lanes of both. The unsigned map's codes <= 0 (Encode4Linear's for
    // x < 0) become 0.
    const auto shift = nibble_shifts();
    const auto pairs = [&](VI v) HWY_ATTR {
      if (kSecond) v = hn::Max(v, hn::Zero(di));
      const auto pair = hn::BitCast(DU64(), hn::Shl(hn::BitCast(du, v), shift));
      return hn::BitCast(du, hn::Or(pair, hn::ShiftRight<32>(pair)));
    };
    const auto bytes = hn::ConcatEven(du, pairs(c), pairs(hn::Load(di, even_)));
    hn::StoreU(hn::TruncateTo(DU8(), bytes), DU8(), out);
#endif
  }

 private:
  const SimdCodec* sc_ = nullptr;
  uint8_t* codes_ = nullptr;  // the block's first code byte
  const float* x_ = nullptr;
  StateCodec::BlockScale scale_{};
#if LBOPT_ENCODE4_IN_X
  Thresholds4 thresholds_;
#endif
  HWY_ALIGN int32_t even_[kMaxLanes];  // 4-bit: the codes of the last even vector
};

// The whole block at once (lbopt_quantize, and the step's last block).
template <int kKind>
HWY_INLINE void encode_block(const SimdCodec& sc, StateRef st, int64_t b, int64_t start, int64_t bs, const float* x,
                             float absmax) {
  BlockEncoder<kKind> enc;
  enc.init(sc, st, b, start, x, absmax);
  const int64_t n = int64_t(hn::Lanes(DF()));
  const auto run = [&](auto second) HWY_ATTR {
    for (int64_t i = 0; i < bs; i += 2 * n) {
      enc.template vec<decltype(second)::value, false>(i);
      enc.template vec<decltype(second)::value, true>(i + n);
    }
  };
  sc.second ? run(std::true_type()) : run(std::false_type());
}

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
  // float16: the hardware conversion's result as it is where no lane is NaN (whose payload it keeps, where
  // float_to_f16 gives the sign and 0x7e00), the common case, with no widening and narrowing around it
  // (docs/benchmarks.md, "CPU loop choices": float16 store)
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

#undef LBOPT_BF16_CONVERT
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define LBOPT_BF16_CONVERT 1
// float_to_bf16 of a whole vector by AVX512_BF16's vcvtneps2bf16, where the CPU has it (cpu_has_bf16_convert):
// the instruction rounds to nearest even and quiets NaN as float_to_bf16 does, for every float but the subnormals,
// which it flushes to zero (checked over all 2^32 floats); a vector holding one returns false and takes
// store_param's integer rounding. Half the instructions of that rounding (docs/benchmarks.md, "CPU loop
// choices": bf16 store).
// Highway 1.0.3 has no target with AVX512_BF16 and its intrinsic needs that target's flag, so the instruction is
// written in assembly.
HWY_INLINE bool store_bf16_convert(void* p, int64_t i, VF x) {
  if (_mm512_fpclass_ps_mask(x.raw, 0x20)) return false;  // 0x20: denormal
  __m256i h;
  __asm__("vcvtneps2bf16 %1, %0" : "=v"(h) : "v"(x.raw));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(p) + i), h);
  return true;
}
#else
#define LBOPT_BF16_CONVERT 0
#endif

// store_param of elements e .. e + lanes - 1, rounded as `round` says (a function, not a lambda of the step: in
// one, its captures were reloaded after every code byte store, which may alias them; docs/benchmarks.md, "CPU
// loop choices": param store).
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
  static HWY_INLINE VF max(VF a, VF b) { return fmax_vec(a, b); }
  static HWY_INLINE VF sign(VF a) {
    const DF df;
    const auto keep = hn::Or(hn::Eq(a, hn::Zero(df)), hn::IsNaN(a));
    return hn::IfThenElse(keep, a, hn::CopySign(hn::Set(df, 1.0f), a));
  }
};

#include "kernels/optim/updates.h"

// State k during one block: where its float32 values live (the caller's memory for FP32 states, a decoded buffer
// otherwise), and its codes and scale.
struct BlockState {
  float* values;
  const uint8_t* codes;
  float scale;
};

// How far ahead of the elements being updated step_blocks prefetches, in elements (see kPrefetch there).
constexpr int64_t kPrefetchAhead = 1024;

// What an instantiation of step_blocks fixes at compile time: the dtype of param and grad and the state count, or
// -1 for "read from the slot". fp32 params with fp32 grads, the common case, get loops of their own: with no
// dtype or state-count branch left in the vector loop, the compiler keeps its constants in registers. A gradient
// factor of 1 (no grad_scale, no maximize) gets loops of its own too: a compile-time flag inside one function
// gained nothing (its other loop copies cost registers). bf16 params with bf16 grads (faster on Zen 3's AVX2) and
// float16 params with float16 grads (model.half(), far slower in the general loops, which have no prefetch) get
// loops of their own as well (docs/benchmarks.md, "CPU loop choices": shaped loops).
// The sanitizer builds compile the general loops alone (the same code without the constants): the shaped ones
// quadrupled their compile time.
#undef LBOPT_SHAPED_LOOPS
#if defined(__SANITIZE_ADDRESS__)
#define LBOPT_SHAPED_LOOPS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LBOPT_SHAPED_LOOPS 0
#endif
#endif
#ifndef LBOPT_SHAPED_LOOPS
#define LBOPT_SHAPED_LOOPS 1
#endif
template <int kDtype, int kStates, bool kUnitGrad = false, int kGradDtype = kDtype>
struct Shape {
  static constexpr int dtype = kDtype, grad_dtype = kGradDtype, states = kStates;
  static constexpr bool unit_grad = kUnitGrad;  // grad_factor is 1: its product, exact, is left out
};
using AnyShape = Shape<-1, -1>;

// A flag of the optimizer's Scalars (Opt::Flags) and the value a loop is compiled for.
template <auto kFlag, bool kValue>
struct Fixed {};
template <class Scalars, auto kFlag, bool kValue>
HWY_INLINE void fix(Scalars& s, Fixed<kFlag, kValue>) {
  s.*kFlag = kValue;
}

// The step over whole blocks [b0, b1) of a slot, with the flags in Fixes assigned the constant values the slot
// has (step_fixing picks the instantiation): no branch on them is left in the vector loop (docs/benchmarks.md,
// "CPU loop choices": flags compiled out). Only the shaped loops get these copies: each flag doubles their compile
// time.
template <class Opt, int kKind, class S, class... Fixes>
int64_t step_blocks(const StepSlot& slot, const StepFlags& flags, int64_t b0, int64_t b1) {
  typename Opt::Scalars s = slot.scalars.template get<Opt>();
  (fix(s, Fixes()), ...);
  constexpr bool kQuantized = kKind != kStateFp32;
  const int64_t bs = work_block_size(kKind);
  const int n_states = S::states >= 0 ? S::states : Opt::states(flags.hyper);
  SimdCodec codec[kMaxStates];
  for (int k = 0; k < n_states; ++k) codec[k].init(host_codec(kKind, Opt::second_moment(k)));
  // Locals, not reads through slot: the byte stores of the codes may alias anything, which would force reloads.
  const Dtype pdt = S::dtype >= 0 ? Dtype(S::dtype) : slot.param_dtype;
  const Dtype gdt = S::grad_dtype >= 0 ? Dtype(S::grad_dtype) : slot.grad_dtype;
  void* const param = slot.param;
  const void* const grad = slot.grad;
  // Software prefetch, in the shaped loops: each vector of the update loop prefetches the lines kPrefetchAhead
  // elements on of its streams (param, grad, the states of the fp32 kind; a 16-bit param or grad stream every other
  // vector); the hardware prefetchers keep up with the code streams. At 16M-64M elements they alone leave the
  // step waiting on memory. A block's lines all at once did less (more lines than the L1 has fill buffers), and so
  // did prefetching the codes too; the general loops, whose sizes are read at run time, run slower with it
  // (docs/benchmarks.md, "CPU loop choices": prefetch). No loop here holds only prefetches: GCC deletes such a
  // loop (C++ lets it assume that a loop without side effects ends, -ffinite-loops), and its prefetch never runs.
  constexpr bool kPrefetch = S::dtype >= 0;
  constexpr int64_t kParamBytes = S::dtype == kFloat32 ? 4 : 2, kGradBytes = S::grad_dtype == kFloat32 ? 4 : 2;
  StateRef st[kMaxStates];
  for (int k = 0; k < kMaxStates; ++k) st[k] = slot.states[k];
  const bool convert = LBOPT_BF16_CONVERT && cpu_has_bf16_convert();
  const ParamRound round = pdt != kBfloat16        ? ParamRound::kNearest
                           : flags.stochastic_round ? ParamRound::kStochastic
                           : convert                ? ParamRound::kConvert
                                                    : ParamRound::kNearest;
  const uint64_t seed = flags.seed, step = uint64_t(slot.step);
  const DF df;
  const int64_t n = int64_t(hn::Lanes(df));
  // Quantized states on x86: block b's values go to buf[b % 2], and the encode of block b - 1 (from the other
  // half) runs vector by vector in block b's update loop. An update there is bound by its divider (square root
  // and divisions), an encode by integer and permute work: interleaved, one fills the other's idle units. AVX2 has
  // 16 vector registers, and on a real AVX2 host (Zen 3) only the 8-bit loops with one state gain (the gathers'
  // latency hidden); every other loop, 8-bit AdamW with its two-pass update included, runs faster with each
  // block encoded right after its update. (An Intel CPU restricted to AVX2 favoured the pipeline for every kind,
  // but AVX2 code runs only on CPUs without AVX-512.) On AVX-512 (Intel) the two-pass update unpipelined wins with
  // 16-bit params and with three 4-bit or 8-bit states, but not for fp32 params with two states or FP8 ones.
  // Other targets, unmeasured, encode each block right after its update. The measured effect of each choice:
  // docs/benchmarks.md, "CPU loop choices": pipelined encode, two-pass update.
#if HWY_ARCH_X86 && HWY_TARGET < HWY_AVX2
  constexpr bool kPipelined =
      kQuantized && !(Opt::kTwoPass && (S::dtype == kBfloat16 || S::dtype == kFloat16 ||
                                        (S::states >= 3 && kKind != kStateFp8)));
#elif HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
  constexpr bool kPipelined = kKind == kState8Bit && S::states < 3 && !Opt::kTwoPass;
#else
  constexpr bool kPipelined = false;
#endif
  // (rows padded by 64 bytes: no two rows 4 KiB apart, whose loads and stores the CPU would take as aliasing)
  HWY_ALIGN float buf[2][kMaxStates][kMaxBlock + 16];
  // The update in two passes (Opt::kTwoPass, on x86 where each block is encoded after its update): the update
  // loop runs update_states and keeps its result in tbuf, and the encode loop runs update_param vector by vector
  // beside the encode. AdamW's square root and divisions are one chain per vector, on a divider that also takes
  // the encode's divisions; split so, each loop has independent divisions to overlap (docs/benchmarks.md, "CPU
  // loop choices": two-pass update, which also names the split points tried).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  constexpr bool kTwoPass = Opt::kTwoPass && kQuantized && !kPipelined;
#else
  constexpr bool kTwoPass = false;
#endif
  HWY_ALIGN float tbuf[kTwoPass ? kMaxBlock : 1];
  float absmax[kMaxStates] = {};
  BlockEncoder<kKind> enc[kMaxStates];
  const auto grad_factor = hn::Set(df, slot.grad_factor);
  const bool has1 = n_states > 1, has2 = n_states > 2;
  BlockState bst[kMaxStates] = {};
  Table16 scaled[kMaxStates];
  // Vector i of the encoders' block, for every state (odd: the second vector of a pair): in the pipelined loops
  // block b - 1's, inside block b's update loop.
  const auto encode_vec = [&](int64_t i, auto odd) HWY_ATTR {
    constexpr bool kOdd = decltype(odd)::value;
    if (n_states > 0) enc[0].template vec<Opt::second_moment(0), kOdd>(i);
    if (has1) enc[1].template vec<Opt::second_moment(1), kOdd>(i);
    if (has2) enc[2].template vec<Opt::second_moment(2), kOdd>(i);
  };
  // update_param for vector i of the block at start (kTwoPass), on the states' new values and update_states'
  // result, from the param as it was before the step.
  const auto param_vec = [&](int64_t start, int64_t i) HWY_ATTR {
    if constexpr (kTwoPass) {
      auto p = load_value(pdt, param, start + i);
      const auto x0 = hn::Load(df, bst[0].values + i);
      const auto x1 = has1 ? hn::Load(df, bst[1].values + i) : x0;
      const auto x2 = has2 ? hn::Load(df, bst[2].values + i) : x0;
      update_param<VecOps>(s, p, hn::Load(df, tbuf + i), x0, x1, x2);
      store_param_at(pdt, param, start + i, p, round, seed, step);
    }
  };
  // The encoders' whole block, each vector's states together: where a block is encoded after its update, that
  // beats one state's whole block after the other on AVX2 (docs/benchmarks.md, "CPU loop choices": one encode
  // loop). With param: the param update of the block at that start beside it.
  const auto encode_all = [&](auto with_param, int64_t start) HWY_ATTR {
    for (int64_t i = 0; i < bs; i += 2 * n) {
      if (decltype(with_param)::value) param_vec(start, i);
      encode_vec(i, std::false_type());
      if (decltype(with_param)::value) param_vec(start, i + n);
      encode_vec(i + n, std::true_type());
    }
  };
  for (int64_t b = b0; b < b1 + (kPipelined ? 1 : 0); ++b) {
    const bool encoding = kPipelined && b > b0;  // block b - 1's encode runs in this round
    if (encoding)
      for (int k = 0; k < n_states; ++k)
        enc[k].init(codec[k], st[k], b - 1, (b - 1) * bs, buf[(b - 1) & 1][k], absmax[k]);
    if (b == b1) {  // the last block's encode alone
      if (encoding) encode_all(std::false_type(), 0);
      break;
    }
    const int64_t start = b * bs;
    // where this block prefetches: kPrefetchAhead elements on, or near the tensor's end the block itself
    const int64_t ahead = start + kPrefetchAhead + bs <= slot.numel ? start + kPrefetchAhead : start;
    for (int k = 0; k < n_states; ++k) {
      if (kQuantized) {  // decoded a vector at a time in the loop below
        bst[k] = {buf[b & 1][k], block_codes<kKind>(st[k], start), st[k].scales[b]};
        if (kKind == kState4Bit && !(kLinearDecode4 && Opt::second_moment(k)))  // as decode_vec's kSecond
          scale_table(codec[k], bst[k].scale, scaled[k]);
      } else {           // updated in place
        bst[k] = {static_cast<float*>(st[k].codes) + start, nullptr, 0.0f};
      }
    }
    const auto load = [&](auto state, int64_t i) HWY_ATTR {
      constexpr int k = decltype(state)::value;
      return kQuantized ? decode_vec<kKind, Opt::second_moment(k)>(codec[k], bst[k].codes, i,
                                                                   hn::Set(df, bst[k].scale), scaled[k])
                        : hn::LoadU(df, bst[k].values + i);  // FP32 states: the caller's memory, any alignment
    };
    auto max0 = hn::Zero(DI()), max1 = max0, max2 = max0;
    // two vectors a round: the 4-bit encode packs codes in pairs of vectors
    const auto update_vec = [&](int64_t i, auto odd, auto encode) HWY_ATTR {
      if (kPrefetch) {  // one line each per vector: at up to 16 lanes, every line of a stream is touched
        if (kParamBytes == 4 || !decltype(odd)::value)
          __builtin_prefetch(static_cast<char*>(param) + (ahead + i) * kParamBytes, 1);
        if (kGradBytes == 4 || !decltype(odd)::value)
          __builtin_prefetch(static_cast<const char*>(grad) + (ahead + i) * kGradBytes, 0);
        if (!kQuantized) {
          if (n_states > 0) __builtin_prefetch(static_cast<float*>(st[0].codes) + ahead + i, 1);
          if (has1) __builtin_prefetch(static_cast<float*>(st[1].codes) + ahead + i, 1);
          if (has2) __builtin_prefetch(static_cast<float*>(st[2].codes) + ahead + i, 1);
        }
      }
      auto p = load_value(pdt, param, start + i);
      auto g = load_value(gdt, grad, start + i);
      if (!S::unit_grad) g = hn::Mul(g, grad_factor);
      auto x0 = n_states > 0 ? load(std::integral_constant<int, 0>(), i) : hn::Zero(df);
      auto x1 = has1 ? load(std::integral_constant<int, 1>(), i) : hn::Zero(df);
      auto x2 = has2 ? load(std::integral_constant<int, 2>(), i) : hn::Zero(df);
      if constexpr (kTwoPass) {
        hn::Store(update_states<VecOps>(s, p, g, x0, x1, x2), df, tbuf + i);
      } else {
        update<VecOps>(s, p, g, x0, x1, x2);
        store_param_at(pdt, param, start + i, p, round, seed, step);
      }
      if (n_states > 0) {
        if (kQuantized) block_max_add(max0, x0);
        hn::StoreU(x0, df, bst[0].values + i);
      }
      if (has1) {
        if (kQuantized) block_max_add(max1, x1);
        hn::StoreU(x1, df, bst[1].values + i);
      }
      if (has2) {
        if (kQuantized) block_max_add(max2, x2);
        hn::StoreU(x2, df, bst[2].values + i);
      }
      if (decltype(encode)::value) encode_vec(i, odd);
    };
    // the encode's presence a compile-time constant: the loop then has no branch to code placed out of line
    const auto update_loop = [&](auto encode) HWY_ATTR {
      for (int64_t i = 0; i < bs; i += 2 * n) {
        update_vec(i, std::false_type(), encode);
        update_vec(i + n, std::true_type(), encode);
      }
    };
    encoding ? update_loop(std::true_type()) : update_loop(std::false_type());
    if (kQuantized) {
      // update_param reads the states' new values as the update made them: a block that held a non-finite one,
      // which block_absmax zeroes, gets its param update first (such blocks are rare)
      const int32_t top0 = n_states > 0 ? block_top(max0) : 0, top1 = has1 ? block_top(max1) : 0,
                    top2 = has2 ? block_top(max2) : 0;
      const bool finite = !kTwoPass || std::max(top0, std::max(top1, top2)) < 0x7f800000;
      if (!finite)
        for (int64_t i = 0; i < bs; i += n) param_vec(start, i);
      if (n_states > 0) absmax[0] = block_absmax(bst[0].values, bs, top0);
      if (has1) absmax[1] = block_absmax(bst[1].values, bs, top1);
      if (has2) absmax[2] = block_absmax(bst[2].values, bs, top2);
      if (!kPipelined) {
        for (int k = 0; k < n_states; ++k) enc[k].init(codec[k], st[k], b, start, bst[k].values, absmax[k]);
        if (kTwoPass && finite) {
          encode_all(std::true_type(), start);
        } else {
          encode_all(std::false_type(), start);
        }
      }
    }
  }
  return b1;
}

// step_blocks with each flag of the list fixed to the slot's value of it: one instantiation per combination.
template <class Opt, int kKind, class S, class... Fixes>
int64_t step_fixing(const StepSlot& slot, const StepFlags& flags, int64_t b0, int64_t b1, FlagList<>) {
  return step_blocks<Opt, kKind, S, Fixes...>(slot, flags, b0, b1);
}
template <class Opt, int kKind, class S, class... Fixes, auto kFlag, auto... kRest>
int64_t step_fixing(const StepSlot& slot, const StepFlags& flags, int64_t b0, int64_t b1,
                    FlagList<kFlag, kRest...>) {
  return slot.scalars.template get<Opt>().*kFlag
             ? step_fixing<Opt, kKind, S, Fixes..., Fixed<kFlag, true>>(slot, flags, b0, b1, FlagList<kRest...>())
             : step_fixing<Opt, kKind, S, Fixes..., Fixed<kFlag, false>>(slot, flags, b0, b1, FlagList<kRest...>());
}

// lbopt_quantize over whole blocks: as the step's encode, from the caller's floats.
template <int kKind>
int64_t quantize_blocks(const StateCodec& codec, const float* src, StateRef dst, int64_t b0, int64_t b1) {
  const SimdCodec sc(codec);
  const DF df;
  const int64_t n = int64_t(hn::Lanes(df)), bs = work_block_size(kKind);
  HWY_ALIGN float buf[kMaxBlock];
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t start = b * bs;
    auto maxbits = hn::Zero(DI());
    for (int64_t i = 0; i < bs; i += n) {
      const auto x = hn::LoadU(df, src + start + i);
      block_max_add(maxbits, x);
      hn::Store(x, df, buf + i);
    }
    encode_block<kKind>(sc, dst, b, start, bs, buf, block_absmax(buf, bs, block_top(maxbits)));
  }
  return b1;
}

// lbopt_dequantize over whole blocks: as the step's decode, to the caller's floats.
template <int kKind>
int64_t dequantize_blocks(const StateCodec& codec, StateRef src, float* dst, int64_t b0, int64_t b1) {
  const SimdCodec sc(codec);
  const DF df;
  const int64_t n = int64_t(hn::Lanes(df)), bs = work_block_size(kKind);
  Table16 scaled;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t start = b * bs;
    const uint8_t* codes = block_codes<kKind>(src, start);
    const auto scale = hn::Set(df, src.scales[b]);
    if (kKind == kState4Bit) scale_table(sc, src.scales[b], scaled);
    for (int64_t i = 0; i < bs; i += n)
      hn::StoreU(decode_vec<kKind>(sc, codes, i, scale, scaled), df, dst + start + i);
  }
  return b1;
}

// The end of the whole blocks among [b0, b1) of a tensor of numel elements, and f's result on them, f called with
// the kind as a compile-time constant.
template <class F>
HWY_INLINE int64_t on_whole_blocks(int kind, int64_t numel, int64_t b0, int64_t b1, const F& f) {
  const int64_t whole = numel / work_block_size(kind);
  b1 = b1 < whole ? b1 : whole;
  if (b1 <= b0) return b0;
  switch (kind) {
    case kState4Bit: return f(std::integral_constant<int, kState4Bit>(), b1);
    case kState8Bit: return f(std::integral_constant<int, kState8Bit>(), b1);
    case kStateFp8: return f(std::integral_constant<int, kStateFp8>(), b1);
    default: return f(std::integral_constant<int, kStateFp32>(), b1);
  }
}

// f(std::integral_constant<int, n>) for n in [kLo, kHi].
template <int kLo, int kHi, class F>
HWY_INLINE int64_t with_state_count(int n, const F& f) {
  if constexpr (kLo < kHi)
    if (n != kLo) return with_state_count<kLo + 1, kHi>(n, f);
  return f(std::integral_constant<int, kLo>());
}

// step_blocks of the Shape with dtypes kDtype (param) and kGradDtype that fits the slot's state count and grad
// factor.
template <class Opt, int kKind, int kDtype, int kGradDtype = kDtype>
int64_t step_dtype_shaped(const StepSlot& slot, const StepFlags& flags, int64_t b0, int64_t b1) {
  return with_state_count<Opt::kMinStates, Opt::kMaxStates>(Opt::states(flags.hyper), [&](auto n) HWY_ATTR {
    constexpr int kN = decltype(n)::value;
    const typename Opt::Flags fix_all;
    return slot.grad_factor == 1.0f
               ? step_fixing<Opt, kKind, Shape<kDtype, kN, true, kGradDtype>>(slot, flags, b0, b1, fix_all)
               : step_fixing<Opt, kKind, Shape<kDtype, kN, false, kGradDtype>>(slot, flags, b0, b1, fix_all);
  });
}

// step_blocks of the Shape that fits the slot.
template <class Opt, int kKind>
int64_t step_shaped(const StepSlot& slot, const StepFlags& flags, int64_t b0, int64_t b1) {
#if LBOPT_SHAPED_LOOPS
  if (slot.param_dtype == slot.grad_dtype) {
    if (slot.param_dtype == kFloat32) return step_dtype_shaped<Opt, kKind, kFloat32>(slot, flags, b0, b1);
    if (slot.param_dtype == kBfloat16) return step_dtype_shaped<Opt, kKind, kBfloat16>(slot, flags, b0, b1);
    if (slot.param_dtype == kFloat16) return step_dtype_shaped<Opt, kKind, kFloat16>(slot, flags, b0, b1);
  }
  // fp32 master params with bf16 grads, a mixed-precision setup, in loops of their own (docs/benchmarks.md, "CPU
  // loop choices": shaped loops)
  if (slot.param_dtype == kFloat32 && slot.grad_dtype == kBfloat16)
    return step_dtype_shaped<Opt, kKind, kFloat32, kBfloat16>(slot, flags, b0, b1);
#endif
  return step_blocks<Opt, kKind, AnyShape>(slot, flags, b0, b1);
}

int64_t StepFullBlocks(const StepSlot& slot, const StepFlags& flags, int64_t b0, int64_t b1) {
  return with_optimizer(flags.hyper.optimizer, [&](auto opt) HWY_ATTR {
    return on_whole_blocks(flags.kind, slot.numel, b0, b1, [&](auto kind, int64_t end) HWY_ATTR {
      return step_shaped<decltype(opt), decltype(kind)::value>(slot, flags, b0, end);
    });
  });
}

// FP32 "quantization" is a copy: the portable memcpy.
int64_t QuantizeFullBlocks(const StateCodec& codec, const float* src, StateRef dst, int64_t numel, int64_t b0,
                           int64_t b1) {
  if (codec.kind == kStateFp32) return b0;
  return on_whole_blocks(codec.kind, numel, b0, b1, [&](auto kind, int64_t end) HWY_ATTR {
    return quantize_blocks<decltype(kind)::value>(codec, src, dst, b0, end);
  });
}

int64_t DequantizeFullBlocks(const StateCodec& codec, StateRef src, float* dst, int64_t numel, int64_t b0,
                             int64_t b1) {
  if (codec.kind == kStateFp32) return b0;
  return on_whole_blocks(codec.kind, numel, b0, b1, [&](auto kind, int64_t end) HWY_ATTR {
    return dequantize_blocks<decltype(kind)::value>(codec, src, dst, b0, end);
  });
}

#else

int64_t StepFullBlocks(const StepSlot&, const StepFlags&, int64_t b0, int64_t) { return b0; }
int64_t QuantizeFullBlocks(const StateCodec&, const float*, StateRef, int64_t, int64_t b0, int64_t) { return b0; }
int64_t DequantizeFullBlocks(const StateCodec&, StateRef, float*, int64_t, int64_t b0, int64_t) { return b0; }

#endif  // LBOPT_EXACT_FMA

}  // namespace HWY_NAMESPACE
}  // namespace lbopt::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <stdlib.h>

namespace lbopt::cpu {

HWY_EXPORT(StepFullBlocks);
HWY_EXPORT(QuantizeFullBlocks);
HWY_EXPORT(DequantizeFullBlocks);
HWY_EXPORT(TargetName);

namespace {
// LBOPT_CPU_KERNELS=portable turns the SIMD kernels off (read on every call: tests compare both in one process).
// LBOPT_CPU_KERNELS=<a Highway target name this CPU supports> ("AVX2", "AVX3", ...) restricts the dispatch to it,
// read once: a benchmark of a framework process then runs the kernels of a smaller machine. It sets libhwy's
// process-wide target mask, as Highway's own tests do.
bool simd_enabled() {
  const char* env = getenv("LBOPT_CPU_KERNELS");
  static const bool restricted = [env] {
    if (!env) return false;
    for (int64_t t = 1; t != 0 && t <= HWY_SCALAR; t <<= 1)
      if ((t & hwy::SupportedTargets()) && strcmp(hwy::TargetName(t), env) == 0) {
        hwy::SetSupportedTargetsForTest(t);
        return true;
      }
    return false;
  }();
  (void)restricted;
  return !(env && strcmp(env, "portable") == 0);
}
}  // namespace

int64_t step_blocks_simd(const StepSlot& slot, const StepFlags& flags, int64_t block_begin, int64_t block_end) {
  if (!simd_enabled()) return block_begin;
  return HWY_DYNAMIC_DISPATCH(StepFullBlocks)(slot, flags, block_begin, block_end);
}

int64_t quantize_blocks_simd(const StateCodec& codec, const float* src, StateRef dst, int64_t numel,
                             int64_t block_begin, int64_t block_end) {
  if (!simd_enabled()) return block_begin;
  return HWY_DYNAMIC_DISPATCH(QuantizeFullBlocks)(codec, src, dst, numel, block_begin, block_end);
}

int64_t dequantize_blocks_simd(const StateCodec& codec, StateRef src, float* dst, int64_t numel,
                               int64_t block_begin, int64_t block_end) {
  if (!simd_enabled()) return block_begin;
  return HWY_DYNAMIC_DISPATCH(DequantizeFullBlocks)(codec, src, dst, numel, block_begin, block_end);
}

const char* simd_target() { return simd_enabled() ? HWY_DYNAMIC_DISPATCH(TargetName)() : "portable"; }

bool cpu_has_bf16_convert() {
#if HWY_ARCH_X86 && (defined(__GNUC__) || defined(__clang__))
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

}  // namespace lbopt::cpu
#endif  // HWY_ONCE

// The SIMD kernels' codec: quant.h's Codec a vector at a time, for each state kind (state_kinds.h), bit-identical
// to it. No map needs the generic search: 8-bit codes come from one table read on the float's top bits and one
// compare (codebook8_arith.h), 4-bit ones from a fold of the signed map or the linear unsigned map, or thresholds
// in x on AVX-512 (codebook4-inl.h). Included once per target by the SIMD units, after simd_values-inl.h.
#if defined(LBOPT_KERNELS_CPU_SIMD_CODEC_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LBOPT_KERNELS_CPU_SIMD_CODEC_INL_H_
#undef LBOPT_KERNELS_CPU_SIMD_CODEC_INL_H_
#else
#define LBOPT_KERNELS_CPU_SIMD_CODEC_INL_H_
#endif

#include <hwy/highway.h>

#include "kernels/cpu/codebook4-inl.h"
#include "kernels/cpu/codebook8_arith-inl.h"

#include <string.h>

#include <type_traits>

#include "kernels/quant.h"

HWY_BEFORE_NAMESPACE();
namespace lbopt::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
#if LBOPT_EXACT_FMA

// f(std::integral_constant<Moment, m>()) for the moment m of a codec (kind_moment's, of kind K).
template <class K, class F>
HWY_INLINE void with_moment(const Codec<K>& c, const F& f) {
  if (!c.second) return f(std::integral_constant<Moment, kMomentFirst>());
  if (c.unsigned_map) return f(std::integral_constant<Moment, kMomentSecond>());
  if constexpr (K::code_bits == 4) return f(std::integral_constant<Moment, kMomentSecondSigned>());
}

// A state's codec with its 4-bit codebook laid out for lookup16.
template <class K>
struct SimdCodec {
  Codec<K> c{};
  Table16 values;  // 4-bit: the codebook
  Table16 next;    // 4-bit: the value of the code one up (Gaps4)

  SimdCodec() = default;
  explicit SimdCodec(const Codec<K>& codec) { init(codec); }
  void init(const Codec<K>& codec) {
    c = codec;
    if constexpr (K::entries == 16) {
      values.fill(c.values);
      next.fill(c.values, 1);
    }
  }
};

// Element 2i's code in the high nibble: shift counts 4, 0, 4, 0, ... by lane.
HWY_INLINE VU nibble_shifts() {
  const DU du;
  const auto one = hn::Set(du, 1u);
  return hn::ShiftLeft<2>(hn::Xor(hn::And(hn::Iota(du, 0), one), one));
}

// table[code] per lane for the lanes' 8-bit codes at `bytes` (**8-bit decode**).
HWY_INLINE VF lookup256(const float* table, const uint8_t* bytes) {
#if LBOPT_SCALAR_LOOKUP256
  const auto pair = [&](int j) HWY_ATTR {
    return _mm_unpacklo_ps(_mm_load_ss(table + bytes[j]), _mm_load_ss(table + bytes[j + 1]));
  };
  const __m128 low = _mm_movelh_ps(pair(0), pair(2)), high = _mm_movelh_ps(pair(4), pair(6));
  return VF{_mm256_insertf128_ps(_mm256_castps128_ps256(low), high, 1)};
#else
  return hn::GatherIndex(DF(), table, hn::BitCast(DI(), hn::PromoteTo(DU(), hn::LoadU(DU8(), bytes))));
#endif
}

// The 4-bit codes of elements i .. i + lanes - 1 of a block. Exactly the lanes / 2 bytes that hold them are read
// (a full-width load could pass the end of the state), then each byte is duplicated, widened and shifted; lanes
// hold the code in their low 4 bits (lookup16 reads no more).
HWY_INLINE VI nibbles_vec(const uint8_t* codes, int64_t i) {
  const DU du;
#if LBOPT_X86_NIBBLES
  // **4-bit decode**: the bytes broadcast to every 128-bit block by the load, a byte shuffle gives lane j byte j / 2
  using Raw = hn::Repartition<std::conditional_t<kMaxLanes >= 16, uint64_t, uint32_t>, DU>;
  typename hn::TFromD<Raw> raw;
  memcpy(&raw, codes + i / 2, sizeof raw);
  const hn::Repartition<uint8_t, DU> d8;
  const auto pick = hn::BitCast(d8, hn::Or(hn::ShiftRight<1>(hn::Iota(du, 0)), hn::Set(du, 0x80808000u)));
  const auto bytes = hn::TableLookupBytesOr0(hn::BitCast(d8, hn::Set(Raw(), raw)), pick);
  return hn::BitCast(DI(), hn::Shr(hn::BitCast(du, bytes), nibble_shifts()));
#else
  const auto pairs = hn::ZeroExtendVector(DU8(), hn::LoadU(hn::Half<DU8>(), codes + i / 2));
  return hn::BitCast(DI(), hn::Shr(hn::PromoteTo(du, hn::InterleaveLower(DU8(), pairs, pairs)), nibble_shifts()));
#endif
}

// e4m3 codes decoded: the exponent and mantissa bits moved to float's place and rebiased by an integer add give
// the normal values, the subnormals (exponent 0) are m * 2^-9. No float operand is subnormal (**FP8 decode**: on
// x86 each costs a microcode assist).
HWY_INLINE VF fp8_decode(VU code) {
  const DF df;
  const DU du;
  const auto bits = hn::And(code, hn::Set(du, 0x7fu));
  const auto normal = hn::BitCast(df, hn::Add(hn::ShiftLeft<20>(bits), hn::Set(du, 120u << 23)));
  const auto sub = hn::Mul(hn::ConvertTo(df, hn::BitCast(DI(), bits)), hn::Set(df, 0x1p-9f));
  const auto mag = hn::IfThenElse(hn::RebindMask(df, hn::Lt(bits, hn::Set(du, 8u))), sub, normal);
  return hn::Or(mag, hn::BitCast(df, hn::ShiftLeft<24>(hn::And(code, hn::Set(du, 0x80u)))));
}

// The codes of elements i .. i + lanes - 1 of a block (codes: the block's first byte), decoded and scaled.
// 4-bit: `scaled` is the codebook times the block's scale (scale_table), so that an element's decode is its
// lookup alone, with the product Codec::decode rounds per element.
template <class K, Moment kM = kMomentFirst>
HWY_INLINE VF decode_vec(const SimdCodec<K>& sc, const uint8_t* codes, int64_t i, VF scale, const Table16& scaled) {
  const DF df;
  if constexpr (K::code_bits == 4) {
    const auto code = nibbles_vec(codes, i);
    // **unsigned 4-bit decode**: the map (k + 1) / 16 as RN((code + 1) s / 16), a conversion and a multiply-add,
    // equal to the scaled table's entry (s / 16 is exact); no table is scaled for it
    if (TargetPolicy::linear_decode4 && kM == kMomentSecond) {
      const auto s16 = hn::Set(df, hn::GetLane(scale) * 0.0625f);
      return hn::MulAdd(hn::ConvertTo(df, hn::And(code, hn::Set(DI(), 15))), s16, s16);
    }
    return lookup16(scaled, code);
  } else if constexpr (std::is_same_v<K, KindFp8>) {
    return hn::Mul(fp8_decode(hn::PromoteTo(DU(), hn::LoadU(DU8(), codes + i))), scale);
  } else {
    return hn::Mul(lookup256(sc.c.values, codes + i), scale);
  }
}

// Whether decode_vec reads a scaled table for a state: 4-bit, but for the unsigned map it computes.
template <class K>
HWY_INLINE bool scales_table(const Codec<K>& c) {
  return K::code_bits == 4 && !(TargetPolicy::linear_decode4 && c.unsigned_map);
}

// decode_vec's 4-bit table for a block of scale `scale`.
template <class K>
HWY_INLINE void scale_table(const SimdCodec<K>& sc, float scale, Table16& scaled) {
  const DF df;
  for (int c = 0; c < Table16::kPad; c += int(hn::Lanes(df)))
    hn::Store(hn::Mul(hn::Load(df, sc.values.t + c), hn::Set(df, scale)), df, scaled.t + c);
}

// Where decode_vec reads the block at element start of a quantized state.
template <class K>
HWY_INLINE const uint8_t* block_codes(StateRef st, int64_t start) {
  return static_cast<const uint8_t*>(st.codes) + state_byte<K>(start);
}

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

// quant.h's fp8_e4m3_encode_stochastic for finite y with random bits r.
HWY_INLINE VU fp8_encode_stochastic(VF y, VU r) {
  const DF df;
  const DU du;
  const auto sign = hn::And(hn::ShiftRight<24>(hn::BitCast(du, y)), hn::Set(du, 0x80u));
  const auto a = hn::Min(hn::Abs(y), hn::Set(df, 448.0f));
  const auto random = hn::ShiftRight<12>(r);
  const auto fixed = hn::Sub(hn::BitCast(du, hn::MulAdd(a, hn::Set(df, 512.0f), hn::Set(df, 8.0f))),
                             hn::Set(du, 0x41000000u));
  const auto sub = hn::ShiftRight<20>(hn::Add(fixed, random));
  const auto normal = hn::Sub(hn::ShiftRight<20>(hn::Add(hn::BitCast(du, a), random)), hn::Set(du, 120u << 3));
  const auto is_sub = hn::RebindMask(du, hn::Lt(a, hn::Set(df, 0.015625f)));
  return hn::Or(sign, hn::IfThenElse(is_sub, sub, normal));
}

// The low byte of each lane, stored in lane order. On AVX-512 one vpmovdb: Highway 1.0.3's TruncateTo to bytes
// permutes 32-bit lanes where it means bytes on AVX3_DL (its VBMI branch), which stored every 8-bit and FP8 code
// of a -march=native build on such a CPU wrong.
HWY_INLINE void store_low_bytes(VU v, uint8_t* out) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(v.raw));
#else
  hn::StoreU(hn::TruncateTo(DU8(), v), DU8(), out);
#endif
}

// **4-bit pack**: two vectors of codes (even: the first of the pair) to lanes bytes at out. The unsigned map's
// codes < 0 (Encode4Linear's of a negative x; kClamp) become 0, as do Encode4Signed's of y < -mids[14] on AVX2.
template <bool kClamp>
HWY_INLINE void pack4(const int32_t* even, VI odd, uint8_t* out) {
#if LBOPT_X86_NIBBLES
  // both vectors packed to 16-bit lanes (per 128-bit block k: lanes 4k .. 4k + 3 of the even vector, then of the
  // odd one), each pair of lanes joined by a multiply-add as 16 a + b, and the bytes put in order: 5 instructions
  // for two vectors where the generic form below takes 9 to 11. The pack saturates, which clamps the codes < 0.
#if HWY_TARGET <= HWY_AVX3
  const __m512i words = _mm512_packus_epi32(_mm512_load_si512(even), odd.raw);
  const __m512i joined = _mm512_madd_epi16(words, _mm512_set1_epi32(0x00010010));
  // joined's lanes 4k .. 4k + 3 hold even-vector pairs 2k, 2k + 1, then the odd vector's pairs 2k, 2k + 1
  const __m128i order = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_shuffle_epi8(_mm512_cvtepi32_epi8(joined), order));
#else
  const __m256i words = _mm256_packus_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(even)), odd.raw);
  const __m256i joined = _mm256_madd_epi16(words, _mm256_set1_epi32(0x00010010));
  // per block k: the low byte of each 32-bit lane into bytes 0-3 (even pairs 2k, 2k + 1, then the odd vector's)
  const __m256i low = _mm256_shuffle_epi8(
      joined, _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1,
                               -1, -1, -1, -1, -1, -1, -1, -1, -1));
  const __m128i bytes = _mm_unpacklo_epi16(_mm256_castsi256_si128(low), _mm256_extracti128_si256(low, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), bytes);
#endif
#else
  // shift the even lanes by 4 and OR each lane pair (in its u64) into the even lane, then keep the even lanes of
  // both vectors
  const DI di;
  const DU du;
  const auto shift = nibble_shifts();
  const auto pairs = [&](VI v) HWY_ATTR {
    if (kClamp) v = hn::Max(v, hn::Zero(di));
    const auto pair = hn::BitCast(DU64(), hn::Shl(hn::BitCast(du, v), shift));
    return hn::BitCast(du, hn::Or(pair, hn::ShiftRight<32>(pair)));
  };
  const auto bytes = hn::ConcatEven(du, pairs(odd), pairs(hn::Load(di, even)));
  store_low_bytes(bytes, out);
#endif
}

// quant.h's state_round_bits for the elements i0 .. i0 + lanes - 1 of a block, lane by lane.
HWY_INLINE VU state_round_bits_vec(uint32_t key, int64_t i0) {
  const DU du;
  // (i0 + j) g + key as j g, a constant, plus one broadcast
  const auto h = hn::Add(hn::Mul(hn::Iota(du, 0u), hn::Set(du, 0x9E3779B9u)),
                         hn::Set(du, key + uint32_t(i0) * 0x9E3779B9u));
  return hn::Mul(hn::Xor(h, hn::ShiftRight<16>(h)), hn::Set(du, 0x85EBCA6Bu));
}

// Codec::decode of each lane's code in a block of scale `scale` (4-bit: `scaled`, scale_table's table of it), and
// K::next_code.
template <class K>
HWY_INLINE VF code_value(const SimdCodec<K>& sc, VI c, VF scale, const Table16& scaled) {
  if constexpr (K::code_bits == 4) return lookup16(scaled, c);
  else if constexpr (std::is_same_v<K, KindFp8>) return hn::Mul(fp8_decode(hn::BitCast(DU(), c)), scale);
  else return hn::Mul(hn::GatherIndex(DF(), sc.c.values, c), scale);
}
template <class K>
HWY_INLINE VI next_code_vec(VI c, hn::Mask<DI> up) {
  const DI di;
  if constexpr (std::is_same_v<K, KindFp8>) {
    // the magnitude moves by +1 up from a positive code or down from a negative one, else by -1 (a vector, not a
    // mask operation: clang 14 fails to compile the latter's AVX-512 form)
    const auto sign = hn::And(c, hn::Set(di, 0x80)), mag = hn::And(c, hn::Set(di, 0x7f));
    const auto outward = hn::IfThenElse(hn::Eq(sign, hn::Zero(di)), hn::Set(di, 1), hn::Set(di, -1));
    const auto move = hn::IfThenElse(up, outward, hn::Neg(outward));
    return hn::Or(sign, hn::Min(hn::Max(hn::Add(mag, move), hn::Zero(di)), hn::Set(di, 0x7e)));
  } else {
    const auto next = hn::Min(hn::Add(c, hn::Set(di, 1)), hn::Set(di, int32_t(K::entries) - 1));
    return hn::IfThenElse(up, next, hn::Max(hn::Sub(c, hn::Set(di, 1)), hn::Zero(di)));
  }
}

// round_stochastic's u from random bits r.
HWY_INLINE VF random_unit(VU r) {
  const DF df;
  return hn::Mul(hn::ConvertTo(df, hn::BitCast(DI(), hn::ShiftRight<8>(r))), hn::Set(df, 0x1p-24f));
}

// Codec::round_stochastic of the lanes' nearest codes c of x, with random bits r.
template <class K>
HWY_INLINE VI round_stochastic_vec(const SimdCodec<K>& sc, VI c, VF x, VF scale, const Table16& scaled, VU r) {
  const DI di;
  const auto v = code_value(sc, c, scale, scaled);
  const auto up = hn::Gt(x, v);
  const auto next = next_code_vec<K>(c, hn::RebindMask(di, up));
  const auto w = code_value(sc, next, scale, scaled);
  const auto v_lo = hn::IfThenElse(up, v, w), v_hi = hn::IfThenElse(up, w, v);
  const auto take = hn::RebindMask(di, hn::Lt(hn::Mul(random_unit(r), hn::Sub(v_hi, v_lo)), hn::Sub(x, v_lo)));
  const auto upi = hn::RebindMask(di, up);
  const auto rounded = hn::IfThenElse(take, hn::IfThenElse(upi, next, c), hn::IfThenElse(upi, c, next));
  return hn::IfThenElse(hn::RebindMask(di, hn::Eq(x, v)), c, rounded);  // (x == v keeps c, and next == c too)
}

// A 4-bit block's tables for round_stochastic: its decoded values, and the gap from each code to the next one up
// (+inf at the top code, where u * inf is never below a distance). Each gap is the difference round_stochastic
// takes, so the tables give its bits.
struct Gaps4 {
  Table16 scaled, up;
  // a vector at a time: the next code's value is its own product, so the gap is scaled.t[c + 1] - scaled.t[c]
  template <class K>
  HWY_INLINE void init(const SimdCodec<K>& sc, float scale) {
    const DF df;
    const DI di;
    const auto s = hn::Set(df, scale);
    for (int c = 0; c < Table16::kPad; c += int(hn::Lanes(df))) {
      const auto v = hn::Mul(hn::Load(df, sc.values.t + c), s);
      const auto gap = hn::Sub(hn::Mul(hn::Load(df, sc.next.t + c), s), v);
      const auto top = hn::RebindMask(df, hn::Gt(hn::Iota(di, c), hn::Set(di, 14)));  // code 15 and past it
      hn::Store(v, df, scaled.t + c);
      hn::Store(hn::IfThenElse(top, hn::Set(df, HUGE_VALF), gap), df, up.t + c);
    }
  }
};

// round_stochastic_vec of a 4-bit code c: lo is c, or c - 1 where x lies below c's value (never below code 0: a
// value under the map's bottom stays there, since x - v_lo < 0), and hi = lo + 1 is taken with the gap up from lo.
HWY_INLINE VI round_stochastic4(const Gaps4& g, VI c, VF x, VU r) {
  const DI di;
  const auto below = hn::RebindMask(di, hn::Lt(x, lookup16(g.scaled, c)));
  const auto lo = hn::Max(hn::Sub(c, hn::IfThenElseZero(below, hn::Set(di, 1))), hn::Zero(di));
  const auto t = hn::Sub(x, lookup16(g.scaled, lo));
  const auto take = hn::RebindMask(di, hn::Lt(hn::Mul(random_unit(r), lookup16(g.up, lo)), t));
  return hn::Add(lo, hn::IfThenElseZero(take, hn::Set(di, 1)));
}

// Requantizes a block of a state from x (finite values) with the block's absmax, a vector at a time, so that the
// step can run a block's encode inside the next block's update loop (**pipelined encode**).
template <class K>
class BlockEncoder {
 public:
  // Starts on block b of state st, whose first element is start; x: the block's values. random_key: the block's
  // state_round_key where its codes round stochastically (a first moment), else NULL.
  HWY_INLINE void init(const SimdCodec<K>& sc, StateRef st, int64_t b, int64_t start, const float* x, float absmax,
                       const uint32_t* random_key = nullptr) {
    sc_ = &sc;
    sr_ = random_key != nullptr;
    key_ = sr_ ? *random_key : 0u;
    codes_ = static_cast<uint8_t*>(st.codes) + state_byte<K>(start);
    x_ = x;
    scale_ = sc.c.block_scale(absmax);
    st.scales[b] = scale_.scale;
    if (K::code_bits == 4 && sr_) gaps_.init(sc, scale_.scale);
#if LBOPT_ENCODE4_IN_X
    if constexpr (K::code_bits == 4) thresholds_.init(sc.c.unsigned_map, scale_.scale);
#endif
  }

  // Vector i of the block (i a multiple of the lane count, in order: 4-bit codes are packed in pairs of vectors,
  // kOdd: the second of its pair). kM: the state's moment as kind_moment gives it (the codec's, sc.c).
  template <Moment kM, bool kOdd>
  HWY_INLINE void vec(int64_t i) {
    const DF df;
    const auto xi = hn::Load(df, x_ + i);
    VI c;
    if (K::stochastic_in_y && kM == kMomentFirst && sr_)  // no nearest code needed
      c = hn::BitCast(DI(), fp8_encode_stochastic(encode_input(xi), state_round_bits_vec(key_, i)));
    else c = codes_of<kM>(xi, encode_input(xi));
    if (!K::stochastic_in_y && kM == kMomentFirst && sr_) c = stochastic(c, xi, i);
    constexpr bool kGuard = kM == kMomentSecondSigned || (K::zero_code && kM == kMomentSecond);
    if (kGuard) {  // Codec::guard_zero
      const DI di;
      const auto zero = hn::Set(di, kM == kMomentSecondSigned ? 7 : 0);
      const auto lift = hn::And(hn::Eq(c, zero), hn::RebindMask(di, hn::Gt(xi, hn::Zero(df))));
      c = hn::IfThenElse(lift, hn::Add(zero, hn::Set(di, 1)), c);
    }
    if constexpr (K::code_bits == 4) {
      if (kOdd) pack4<kM == kMomentSecond>(even_, c, codes_ + ((i - int64_t(hn::Lanes(df))) >> 1));
      else hn::Store(c, DI(), even_);
    } else {
      store_low_bytes(hn::BitCast(DU(), c), codes_ + i);
    }
  }

 private:
#if LBOPT_ENCODE4_IN_X
  static constexpr bool kInX = K::code_bits == 4;  // **thresholds in x**: the 4-bit codes of x itself
#else
  static constexpr bool kInX = false;
#endif

  // Codec::encode_input
  HWY_INLINE VF encode_input(VF xi) const {
    const DF df;
    if (kInX) return xi;
    if (K::reciprocal) return hn::Mul(xi, hn::Set(df, scale_.inverse));
    return hn::Div(xi, hn::Set(df, scale_.scale));
  }

  // Codec::round_stochastic of the nearest codes c of vector i, whose values are xi.
  HWY_INLINE VI stochastic(VI c, VF xi, int64_t i) const {
    const VU r = state_round_bits_vec(key_, i);
    if constexpr (K::code_bits == 4)  // Encode4Signed's codes < 0 are code 0 (pack4)
      return round_stochastic4(gaps_, hn::Max(c, hn::Zero(DI())), xi, r);
    else
      return round_stochastic_vec(*sc_, c, xi, hn::Set(DF(), scale_.scale), gaps_.scaled, r);
  }

  // The codes of x (4-bit in x) or of y = encode_input(x), before the zero guard.
  template <Moment kM>
  HWY_INLINE VI codes_of(VF xi, VF yi) const {
    constexpr bool kUnsigned = kM == kMomentSecond;
    const DF df;
    if constexpr (std::is_same_v<K, KindFp8>) {
      return hn::BitCast(DI(), fp8_encode(yi));
    } else if constexpr (K::entries == 256) {
      // **8-bit encode**; the map known at compile time: its fields are constants, not loads after every store
      return Encode8Arith(df, yi, kUnsigned ? kEncode8Unsigned : kEncode8Signed);
    } else {
#if LBOPT_ENCODE4_IN_X
      (void)yi;
      return kUnsigned ? thresholds_.code_linear(xi) : thresholds_.code_signed(xi);
#else
      (void)xi;
      return kUnsigned ? Encode4Linear(df, yi) : Encode4Signed(df, yi);
#endif
    }
  }

  const SimdCodec<K>* sc_ = nullptr;
  bool sr_ = false;
  uint32_t key_ = 0;
  Gaps4 gaps_;  // 4-bit, rounding stochastically
  uint8_t* codes_ = nullptr;  // the block's first code byte
  const float* x_ = nullptr;
  typename Codec<K>::BlockScale scale_{};
#if LBOPT_ENCODE4_IN_X
  Thresholds4 thresholds_;
#endif
  HWY_ALIGN int32_t even_[kMaxLanes];  // 4-bit: the codes of the last even vector
};

// The whole block at once (lbopt_quantize, and the step's last block).
template <class K>
HWY_INLINE void encode_block(const SimdCodec<K>& sc, StateRef st, int64_t b, int64_t start, int64_t bs,
                             const float* x, float absmax) {
  BlockEncoder<K> enc;
  enc.init(sc, st, b, start, x, absmax);
  const int64_t n = int64_t(hn::Lanes(DF()));
  with_moment<K>(sc.c, [&](auto m) HWY_ATTR {
    for (int64_t i = 0; i < bs; i += 2 * n) {
      enc.template vec<decltype(m)::value, false>(i);
      enc.template vec<decltype(m)::value, true>(i + n);
    }
  });
}

#endif  // LBOPT_EXACT_FMA
}  // namespace HWY_NAMESPACE
}  // namespace lbopt::cpu
HWY_AFTER_NAMESPACE();

#endif  // include guard

// Per-target vector form of codebook8_encode_arith (kernels/codebook8_arith.h): the same arithmetic a vector at a
// time, bit-identical to it and so to codebook_encode. Include it after <hwy/highway.h> at file scope of a
// foreach_target source (outside any namespace); it defines lbopt::cpu::HWY_NAMESPACE::Encode8Arith.
// The three region tables are register permutes where a vector holds 8 or 16 floats (AVX2, AVX-512), gathers
// elsewhere; the midpoint is the one real gather.
#if defined(LBOPT_KERNELS_CPU_CODEBOOK8_ARITH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LBOPT_KERNELS_CPU_CODEBOOK8_ARITH_INL_H_
#undef LBOPT_KERNELS_CPU_CODEBOOK8_ARITH_INL_H_
#else
#define LBOPT_KERNELS_CPU_CODEBOOK8_ARITH_INL_H_
#endif

#include <hwy/highway.h>

#include "kernels/codebook8_arith.h"

HWY_BEFORE_NAMESPACE();
namespace lbopt::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace encode8 {

// table[index] for a 16-entry table (index < 8).
template <class D>
HWY_INLINE hn::Vec<D> Lookup(D d, const hn::TFromD<D>* table, hn::Vec<hn::RebindToSigned<D>> index) {
  const size_t n = hn::Lanes(d);
  if (n == 8 || n == 16) return hn::TableLookupLanes(hn::LoadU(d, table), hn::IndicesFromVec(d, index));
  return hn::GatherIndex(d, table, index);
}

// v + 1 where mask: a masked add on AVX-512, subtracting the all-ones mask vector elsewhere.
template <class D, class M>
HWY_INLINE hn::Vec<D> AddIf(D d, M mask, hn::Vec<D> v) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return hn::IfThenElse(mask, hn::Add(v, hn::Set(d, 1)), v);
#else
  return hn::Sub(v, hn::VecFromMask(d, mask));
#endif
}

// round_nearest(x) for |x| < 2^22 (encode8_round): the float adder rounds, no conversion and its overflow fix-up.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> Round(DF df, hn::Vec<DF> x) {
  const hn::RebindToSigned<DF> di;
  return hn::Sub(hn::BitCast(di, hn::Add(x, hn::Set(df, encode8_detail::kRound))),
                 hn::Set(di, encode8_detail::kRoundBits));
}

}  // namespace encode8

// codebook_encode(t.mids, 256, y) per lane, as int32 codes 0..255, for finite y (kEncode8Signed or
// kEncode8Unsigned). Any vector width; y is the value already divided by the block scale.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> Encode8Arith(DF df, hn::Vec<DF> y, const Encode8Tables& t) {
  const hn::RebindToSigned<DF> di;
  using VI = hn::Vec<decltype(di)>;
  const VI bits = hn::BitCast(di, y);
  const VI neg = hn::ShiftRight<31>(bits);  // -1 or 0
  const VI a = hn::Min(hn::And(bits, hn::Set(di, 0x7fffffff)), hn::Set(di, int32_t(encode8_detail::kClamp)));
  const VI a_cmp = hn::Sub(a, hn::Not(neg));  // a + 1 + neg: "> mid" is ">=" for y >= 0 and ">" for y < 0
  VI est = encode8::Round(df, hn::MulAdd(hn::ConvertTo(df, a), hn::Set(df, encode8_detail::kEstMul),
                                         hn::Set(df, encode8_detail::kEstAdd)));
  est = hn::Max(est, hn::Zero(di));
  const VI r = encode8::AddIf(di, hn::Gt(a_cmp, encode8::Lookup(di, t.next, est)), est);
  const VI c = encode8::Round(
      df, hn::MulAdd(hn::BitCast(df, a), encode8::Lookup(df, t.mul, r), encode8::Lookup(df, t.add, r)));
  const VI mid = hn::BitCast(di, hn::GatherIndex(df, t.mids, c));
  const VI p = encode8::AddIf(di, hn::Gt(a_cmp, mid), c);
  if (!t.is_signed) return hn::AndNot(neg, p);
  // y < 0: 254 - p, and 0 where p = 255
  return hn::Max(hn::Add(hn::Xor(p, neg), hn::And(neg, hn::Set(di, 255))), hn::Zero(di));
}

}  // namespace HWY_NAMESPACE
}  // namespace lbopt::cpu
HWY_AFTER_NAMESPACE();

#endif  // LBOPT_KERNELS_CPU_CODEBOOK8_ARITH_INL_H_

// Per-target vector form of codebook8_encode_arith (kernels/codebook8_arith.h): the same arithmetic a vector at a
// time, bit-identical to it and so to codebook_encode. Include it after <hwy/highway.h> at file scope of a
// foreach_target source (outside any namespace); it defines lbopt::cpu::HWY_NAMESPACE::Encode8Arith. The bucket
// table is read by a gather.
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

// codebook_encode(t.mids, 256, y) per lane, as int32 codes 0..255, for finite y (kEncode8Signed or
// kEncode8Unsigned). Any vector width; y is the value already scaled (StateCodec::encode_input).
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> Encode8Arith(DF, hn::Vec<DF> y, const Encode8Tables& t) {
  using namespace encode8_detail;
  const hn::RebindToSigned<DF> di;
  const hn::RebindToUnsigned<DF> du;
  using VI = hn::Vec<decltype(di)>;
  const VI bits = hn::BitCast(di, y);
  const VI neg = hn::ShiftRight<31>(bits);  // -1 or 0
  const VI a = hn::Min(hn::And(bits, hn::Set(di, 0x7fffffff)), hn::Set(di, int32_t(kClamp)));
  // bucket - first, or 0 below it: the bucket fits in 16 bits, so a 16-bit saturating subtract does it
  const auto bucket = hn::ShiftRight<kShift>(hn::BitCast(du, a));
#if HWY_TARGET == HWY_SCALAR
  const VI index = hn::Max(hn::Sub(hn::BitCast(di, bucket), hn::Set(di, t.first)), hn::Zero(di));
#else
  const hn::Repartition<uint16_t, DF> d16;
  const VI index = hn::BitCast(
      di, hn::SaturatedSub(hn::BitCast(d16, bucket), hn::BitCast(d16, hn::Set(du, uint32_t(t.first)))));
#endif
  const VI e = hn::GatherIndex(di, t.entry, index);
  const VI place = hn::Sub(hn::And(a, hn::Set(di, kWidth - 1)), hn::Not(neg));  // + 1 + neg
  const auto up = hn::Gt(place, hn::And(e, hn::Set(di, kPlaceMask)));
  const VI code = hn::ShiftRight<kCodeShift>(e);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  const VI p = hn::IfThenElse(up, hn::Add(code, hn::Set(di, 1)), code);  // a masked add
#else
  const VI p = hn::Sub(code, hn::VecFromMask(di, up));
#endif
  if (!t.is_signed) return hn::AndNot(neg, p);
  // y < 0: 254 - p, and 0 where p = 255
  return hn::Max(hn::Add(hn::Xor(p, neg), hn::And(neg, hn::Set(di, 255))), hn::Zero(di));
}

}  // namespace HWY_NAMESPACE
}  // namespace lbopt::cpu
HWY_AFTER_NAMESPACE();

#endif  // LBOPT_KERNELS_CPU_CODEBOOK8_ARITH_INL_H_

// The per-target half of tests/cpu/exhaustive_encode.h: exhaustive::EncodeFn's contract for a vector encode.
// Include it after <hwy/highway.h> at file scope of a foreach_target test, outside any namespace.
#if defined(LBOPT_TESTS_EXHAUSTIVE_ENCODE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LBOPT_TESTS_EXHAUSTIVE_ENCODE_INL_H_
#undef LBOPT_TESTS_EXHAUSTIVE_ENCODE_INL_H_
#else
#define LBOPT_TESTS_EXHAUSTIVE_ENCODE_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace lbopt::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// out[2 i], out[2 i + 1]: encode(df, y) of +y and -y, y the float of bits mag0 + i, in vectors of df.
template <class DF, class Encode>
HWY_INLINE void EncodeMagsWith(DF df, uint32_t mag0, uint32_t count, const Encode& encode, int32_t* out) {
  const hn::RebindToSigned<DF> di;
  const hn::RebindToUnsigned<DF> du;
  const size_t n = hn::Lanes(df);
  HWY_ALIGN int32_t pos[HWY_MAX_BYTES / 4], neg[HWY_MAX_BYTES / 4];
  for (uint32_t i = 0; i < count; i += uint32_t(n)) {
    const auto bits = hn::Iota(du, mag0 + i);
    hn::Store(encode(df, hn::BitCast(df, bits)), di, pos);
    hn::Store(encode(df, hn::BitCast(df, hn::Or(bits, hn::Set(du, 0x80000000u)))), di, neg);
    for (size_t k = 0; k < n; ++k) out[2 * (i + k)] = pos[k], out[2 * (i + k) + 1] = neg[k];
  }
}

// The same on the vector width `lanes` asks for (0: the target's full vector, else 8 or 4 lanes at most).
template <class Encode>
HWY_INLINE void EncodeMagsAt(int lanes, uint32_t mag0, uint32_t count, const Encode& encode, int32_t* out) {
  if (lanes == 8) return EncodeMagsWith(hn::CappedTag<float, 8>(), mag0, count, encode, out);
  if (lanes == 4) return EncodeMagsWith(hn::CappedTag<float, 4>(), mag0, count, encode, out);
  EncodeMagsWith(hn::ScalableTag<float>(), mag0, count, encode, out);
}

}  // namespace HWY_NAMESPACE
}  // namespace lbopt::cpu
HWY_AFTER_NAMESPACE();

#endif  // LBOPT_TESTS_EXHAUSTIVE_ENCODE_INL_H_

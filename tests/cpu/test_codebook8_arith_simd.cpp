// The vector arithmetic 8-bit encode (kernels/cpu/codebook8_arith-inl.h) equals the scalar one on every float with
// |x| <= 2 (which stands for every finite float, see tests/unit/test_codebook8_arith.cpp), for both maps, on every
// Highway target compiled here that this CPU runs: full vectors everywhere, and 8- and 4-lane vectors (the
// permute and the gather table paths) on every eighth chunk.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tests/cpu/test_codebook8_arith_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/cpu/codebook8_arith-inl.h"

HWY_BEFORE_NAMESPACE();
namespace lbopt::cpu {
namespace HWY_NAMESPACE {

// exhaustive::EncodeFn's contract, for one vector width.
template <class DF>
HWY_INLINE void EncodeMagsWith(DF df, uint32_t mag0, uint32_t count, const Encode8Tables& t, int32_t* out) {
  const hn::RebindToSigned<DF> di;
  const hn::RebindToUnsigned<DF> du;
  const size_t n = hn::Lanes(df);
  HWY_ALIGN int32_t pos[HWY_MAX_BYTES / 4], neg[HWY_MAX_BYTES / 4];
  for (uint32_t i = 0; i < count; i += uint32_t(n)) {
    const auto bits = hn::Iota(du, mag0 + i);
    hn::Store(Encode8Arith(df, hn::BitCast(df, bits), t), di, pos);
    hn::Store(Encode8Arith(df, hn::BitCast(df, hn::Or(bits, hn::Set(du, 0x80000000u))), t), di, neg);
    for (size_t k = 0; k < n; ++k) out[2 * (i + k)] = pos[k], out[2 * (i + k) + 1] = neg[k];
  }
}

void EncodeMags(uint32_t mag0, uint32_t count, int is_signed, int lanes, int32_t* out) {
  const Encode8Tables& t = is_signed ? kEncode8Signed : kEncode8Unsigned;
  if (lanes == 8) return EncodeMagsWith(hn::CappedTag<float, 8>(), mag0, count, t, out);
  if (lanes == 4) return EncodeMagsWith(hn::CappedTag<float, 4>(), mag0, count, t, out);
  EncodeMagsWith(hn::ScalableTag<float>(), mag0, count, t, out);
}

int64_t CompiledTarget() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace lbopt::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "tests/cpu/exhaustive_encode.h"

namespace lbopt::cpu {
HWY_EXPORT(EncodeMags);
HWY_EXPORT(CompiledTarget);
}

TEST_SUITE("codebook8_arith_simd") {
  TEST_CASE("vector encode equals the scalar one for every float with |x| <= 2, every target, both maps") {
    const auto targets = exhaustive::targets(
        [](int64_t) { return true; },
        [] {
          int32_t warm[128];
          HWY_DYNAMIC_DISPATCH(lbopt::cpu::EncodeMags)(0, 64, 1, 0, warm);  // resolves the dispatch
          return &HWY_DYNAMIC_DISPATCH(lbopt::cpu::EncodeMags);
        },
        [] { return HWY_DYNAMIC_DISPATCH(lbopt::cpu::CompiledTarget)(); });
    for (int is_signed : {1, 0}) {
      const lbopt::Encode8Tables& t = is_signed ? lbopt::kEncode8Signed : lbopt::kEncode8Unsigned;
      exhaustive::check(targets, is_signed, is_signed ? "signed" : "unsigned", [&t](uint32_t bits) {
        return int32_t(lbopt::codebook8_encode_arith(t, lbopt::bits_float(bits)));
      });
    }
  }
}
#endif  // HWY_ONCE

// The vector arithmetic 8-bit encode (kernels/cpu/codebook8_arith-inl.h) equals the scalar one on every float with
// |x| <= 2 (which stands for every finite float, see tests/unit/test_codebook8_arith.cpp), for both maps, on every
// Highway target compiled here that this CPU runs: full vectors everywhere, and 8- and 4-lane vectors (the
// permute and the gather table paths) on every eighth chunk.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tests/cpu/test_codebook8_arith_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/cpu/codebook8_arith-inl.h"
#include "tests/cpu/exhaustive_encode-inl.h"

HWY_BEFORE_NAMESPACE();
namespace lbopt::cpu {
namespace HWY_NAMESPACE {

void EncodeMags(uint32_t mag0, uint32_t count, int is_signed, int lanes, int32_t* out) {
  const Encode8Tables& t = is_signed ? kEncode8Signed : kEncode8Unsigned;
  EncodeMagsAt(lanes, mag0, count, [&t](auto df, auto y) HWY_ATTR { return Encode8Arith(df, y, t); }, out);
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

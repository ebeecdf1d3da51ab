// The vector 4-bit encodes of the divided value (kernels/cpu/codebook4-inl.h: the signed map's fold, the unsigned
// map's arithmetic) equal codebook_encode on every float y with |y| <= 2, both signs, on every Highway target
// compiled here that this CPU runs and the step uses: full vectors everywhere, 8- and 4-lane vectors (the permute and the gather
// table paths) on every eighth chunk. (A quotient of the block scale lies in [-1, 1]; past 2 nothing changes.)
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tests/cpu/test_codebook4_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/cpu/codebook4-inl.h"
#include "tests/cpu/exhaustive_encode-inl.h"

HWY_BEFORE_NAMESPACE();
namespace lbopt::cpu {
namespace HWY_NAMESPACE {

void EncodeMags(uint32_t mag0, uint32_t count, int is_signed, int lanes, int32_t* out) {
  EncodeMagsAt(lanes, mag0, count, [is_signed](auto df, auto y) HWY_ATTR {
    return is_signed ? Encode4Signed(df, y) : Encode4Linear(df, y);
  }, out);
}

int64_t CompiledTarget() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace lbopt::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/quant.h"
#include "tests/cpu/exhaustive_encode.h"

namespace lbopt::cpu {
HWY_EXPORT(EncodeMags);
HWY_EXPORT(CompiledTarget);
}

TEST_SUITE("codebook4_simd") {
  TEST_CASE("vector 4-bit encodes equal codebook_encode for every float with |y| <= 2, every target, both maps") {
    // the step's SIMD kernels run only where a fused multiply-add is exact (AVX2 and up, NEON, SVE)
    const auto targets = exhaustive::targets(
        [](int64_t t) { return t != HWY_SSE4 && t != HWY_SSSE3 && t != HWY_SCALAR && t != HWY_EMU128; },
        [] {
          int32_t warm[128];
          HWY_DYNAMIC_DISPATCH(lbopt::cpu::EncodeMags)(0, 64, 1, 0, warm);  // resolves the dispatch
          return &HWY_DYNAMIC_DISPATCH(lbopt::cpu::EncodeMags);
        },
        [] { return HWY_DYNAMIC_DISPATCH(lbopt::cpu::CompiledTarget)(); });
    for (int is_signed : {1, 0}) {
      const float* mids = is_signed ? lbopt::codebook::kSigned4Mids : lbopt::codebook::kUnsigned4Mids;
      exhaustive::check(targets, is_signed, is_signed ? "signed" : "unsigned", [mids](uint32_t bits) {
        return int32_t(lbopt::codebook_encode(mids, 16, lbopt::bits_float(bits)));
      });
    }
  }
}
#endif  // HWY_ONCE

// The vector 4-bit encodes of the divided value (kernels/cpu/codebook4-inl.h: the signed map's fold, the unsigned
// map's arithmetic) equal codebook_encode on every float y with |y| <= 2, both signs, on every Highway target
// compiled here that this CPU runs and the step uses: full vectors everywhere, 8- and 4-lane vectors (the permute and the gather
// table paths) on every eighth chunk. (A quotient of the block scale lies in [-1, 1]; past 2 nothing changes.) The
// unsigned encode takes |y| <= 1, so y is clamped to it first, and its codes <= 0 count as 0, as the packers store
// them.
// On AVX-512, the codes of x itself under a block scale s (Thresholds4, no division) equal the fold's codes of
// x / s for every float |x| <= s, at seven scales from the step's floor 1e-12 to the largest float.
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
    namespace hn = hwy::HWY_NAMESPACE;
    // the codes < 0 count as 0, as the x86 packers store them (AVX2's signed encode gives -1 below -mids[14])
    if (is_signed) return hn::Max(Encode4Signed(df, y), hn::Zero(hn::RebindToSigned<decltype(df)>()));
    // Encode4Linear takes |y| <= 1 (past it the code is 15) and gives codes <= 0 below 0, which the packers clamp
    const auto c = Encode4Linear(df, hn::Min(hn::Max(y, hn::Set(df, -1.0f)), hn::Set(df, 1.0f)));
    return hn::Max(c, hn::Zero(hn::RebindToSigned<decltype(df)>()));
  }, out);
}

int64_t CompiledTarget() { return HWY_TARGET; }

// Thresholds4's codes of x (no division) against the fold's codes of x / s, for every float x with |x| <= s of
// magnitude bits mag0 .. mag0 + count - 1 (count a multiple of 16), both signs: the mismatches, and the first
// one's x bits in *first_bad. -1 where the target has no Thresholds4.
int64_t InXMismatches(float s, int is_signed, uint32_t mag0, uint32_t count, uint32_t* first_bad) {
#if LBOPT_ENCODE4_IN_X
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::RebindToSigned<decltype(df)> di;
  Thresholds4 t;
  t.init(!is_signed, s);
  const uint32_t limit = lbopt::float_bits(s);
  int64_t bad = 0;
  for (uint32_t i = 0; i < count; i += uint32_t(hn::Lanes(df))) {
    const auto mags = hn::Iota(du, mag0 + i);
    const auto in_range = hn::Lt(hn::BitCast(di, mags), hn::Set(di, int32_t(limit) + 1));  // |x| <= s
    for (uint32_t sign : {0u, 0x80000000u}) {
      const auto x = hn::BitCast(df, hn::Or(mags, hn::Set(du, sign)));
      const auto y = hn::Div(x, hn::Set(df, s));
      // the unsigned codes as the packers store them: those <= 0 (x < 0) as 0
      const auto got = is_signed ? t.code_signed(x) : hn::Max(t.code_linear(x), hn::Zero(di));
      const auto want = is_signed ? Encode4Signed(df, y) : hn::Max(Encode4Linear(df, y), hn::Zero(di));
      const auto wrong = hn::And(hn::Ne(got, want), in_range);
      if (hn::AllFalse(di, wrong)) continue;
      if (bad == 0) *first_bad = (mag0 + i + uint32_t(hn::FindKnownFirstTrue(di, wrong))) | sign;
      bad += int64_t(hn::CountTrue(di, wrong));
    }
  }
  return bad;
#else
  (void)s, (void)is_signed, (void)mag0, (void)count, (void)first_bad;
  return -1;
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace lbopt::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <thread>
#include <vector>

#include "kernels/quant.h"
#include "tests/cpu/exhaustive_encode.h"

namespace lbopt::cpu {
HWY_EXPORT(EncodeMags);
HWY_EXPORT(CompiledTarget);
HWY_EXPORT(InXMismatches);
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

  TEST_CASE("AVX-512's codes of x under block scale s equal the codes of x / s for every float |x| <= s") {
    // scales: a power of two, others, the step's floor, and the largest (where Thresholds4's r is subnormal)
    const float scales[] = {1.0f, 0.37f, 1e-12f, 7.3e-5f, 1234.5f, 1.5e38f, 3.4028235e38f};
    int targets = 0;
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
      hwy::SetSupportedTargetsForTest(target);
      uint32_t unused = 0;  // the first call resolves the dispatch
      if (HWY_DYNAMIC_DISPATCH(lbopt::cpu::InXMismatches)(1.0f, 1, 0, 16, &unused) < 0) continue;  // no Thresholds4
      const auto fn = &HWY_DYNAMIC_DISPATCH(lbopt::cpu::InXMismatches);
      ++targets;
      for (float s : scales)
        for (int is_signed : {1, 0}) {
          constexpr uint32_t kChunk = 1u << 20;
          const uint32_t end = lbopt::float_bits(s) + 1;
          const unsigned n_threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
          std::vector<int64_t> bad(n_threads, 0);
          std::vector<uint32_t> first(n_threads, 0);
          std::vector<std::thread> threads;
          for (unsigned k = 0; k < n_threads; ++k)
            threads.emplace_back([&, k] {
              for (uint64_t c = k * uint64_t(kChunk); c < end; c += n_threads * uint64_t(kChunk)) {
                uint32_t at = 0;
                const int64_t b = fn(s, is_signed, uint32_t(c), kChunk, &at);
                if (b > 0 && bad[k] == 0) first[k] = at;
                bad[k] += b;
              }
            });
          for (auto& th : threads) th.join();
          int64_t total = 0;
          uint32_t first_bad = 0;
          for (unsigned k = 0; k < n_threads; ++k) {
            if (bad[k] && !total) first_bad = first[k];
            total += bad[k];
          }
          char at[16];
          snprintf(at, sizeof at, "0x%08x", unsigned(first_bad));
          const std::string name = std::string(hwy::TargetName(target)) + (is_signed ? " signed" : " unsigned");
          CHECK_MESSAGE(total == 0, name, " map, s = ", s, ": ", total, " mismatches, one at x bits ", at);
        }
    }
    hwy::SetSupportedTargetsForTest(0);
    MESSAGE(targets, " targets with thresholds in x checked");
  }
}
#endif  // HWY_ONCE

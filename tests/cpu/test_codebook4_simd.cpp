// The vector 4-bit encodes of the divided value (kernels/cpu/codebook4-inl.h: the signed map's fold, the unsigned
// map's arithmetic) equal codebook_encode on every float y with |y| <= 2, both signs, on every Highway target
// compiled here that this CPU runs and the step uses: full vectors everywhere, 8- and 4-lane vectors (the permute and the gather
// table paths) on every eighth chunk. (A quotient of the block scale lies in [-1, 1]; past 2 nothing changes.)
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tests/cpu/test_codebook4_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/cpu/codebook4-inl.h"

HWY_BEFORE_NAMESPACE();
namespace lbopt::cpu {
namespace HWY_NAMESPACE {

// out[2 i] and out[2 i + 1]: the codes of +y and -y for the float y of bits mag0 + i, i < count (a multiple of 64).
template <class DF>
HWY_INLINE void EncodeMagsWith(DF df, uint32_t mag0, uint32_t count, int is_signed, int32_t* out) {
  const hn::RebindToSigned<DF> di;
  const hn::RebindToUnsigned<DF> du;
  const size_t n = hn::Lanes(df);
  HWY_ALIGN int32_t pos[HWY_MAX_BYTES / 4], neg[HWY_MAX_BYTES / 4];
  const auto encode = [&](hn::Vec<DF> y) HWY_ATTR { return is_signed ? Encode4Signed(df, y) : Encode4Linear(df, y); };
  for (uint32_t i = 0; i < count; i += uint32_t(n)) {
    const auto bits = hn::Iota(du, mag0 + i);
    hn::Store(encode(hn::BitCast(df, bits)), di, pos);
    hn::Store(encode(hn::BitCast(df, hn::Or(bits, hn::Set(du, 0x80000000u)))), di, neg);
    for (size_t k = 0; k < n; ++k) out[2 * (i + k)] = pos[k], out[2 * (i + k) + 1] = neg[k];
  }
}

// lanes: 0 for the target's full vector, else at most that many.
void EncodeMags(uint32_t mag0, uint32_t count, int is_signed, int lanes, int32_t* out) {
  if (lanes == 8) return EncodeMagsWith(hn::CappedTag<float, 8>(), mag0, count, is_signed, out);
  if (lanes == 4) return EncodeMagsWith(hn::CappedTag<float, 4>(), mag0, count, is_signed, out);
  EncodeMagsWith(hn::ScalableTag<float>(), mag0, count, is_signed, out);
}

int64_t CompiledTarget() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace lbopt::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <doctest/doctest.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "kernels/quant.h"

namespace lbopt::cpu {
HWY_EXPORT(EncodeMags);
HWY_EXPORT(CompiledTarget);
}

namespace {

using EncodeFn = void (*)(uint32_t, uint32_t, int, int, int32_t*);

struct Target {
  int64_t target;
  EncodeFn fn;
  uint64_t checked = 0, mismatches = 0;
  uint32_t first_bad = 0;
};

}  // namespace

TEST_SUITE("codebook4_simd") {
  TEST_CASE("vector 4-bit encodes equal codebook_encode for every float with |y| <= 2, every target, both maps") {
    std::vector<Target> targets;
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
      // the step's SIMD kernels run only where a fused multiply-add is exact (AVX2 and up, NEON, SVE)
      if (target == HWY_SSE4 || target == HWY_SSSE3 || target == HWY_SCALAR || target == HWY_EMU128) continue;
      hwy::SetSupportedTargetsForTest(target);
      int32_t warm[128];
      HWY_DYNAMIC_DISPATCH(lbopt::cpu::EncodeMags)(0, 64, 1, 0, warm);  // resolves the dispatch to `target`
      targets.push_back({target, &HWY_DYNAMIC_DISPATCH(lbopt::cpu::EncodeMags)});
      REQUIRE(HWY_DYNAMIC_DISPATCH(lbopt::cpu::CompiledTarget)() == target);
    }
    hwy::SetSupportedTargetsForTest(0);
    REQUIRE(!targets.empty());

    constexpr uint32_t kChunk = 1u << 16, kEnd = 0x40000000u + kChunk;  // past 2.0f, whole chunks
    const unsigned n_threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
    for (int is_signed : {1, 0}) {
      const float* mids = is_signed ? lbopt::codebook::kSigned4Mids : lbopt::codebook::kUnsigned4Mids;
      std::vector<std::vector<Target>> part(n_threads, targets);
      std::vector<std::thread> threads;
      for (unsigned k = 0; k < n_threads; ++k)
        threads.emplace_back([&, k] {
          std::vector<int32_t> want(2 * kChunk), got(2 * kChunk);
          for (uint32_t c = k; c < kEnd / kChunk; c += n_threads) {
            const uint32_t mag0 = c * kChunk;
            for (uint32_t i = 0; i < kChunk; ++i) {
              want[2 * i] = int32_t(lbopt::codebook_encode(mids, 16, lbopt::bits_float(mag0 + i)));
              want[2 * i + 1] = int32_t(lbopt::codebook_encode(mids, 16, lbopt::bits_float((mag0 + i) | 0x80000000u)));
            }
            for (Target& tg : part[k])
              for (int lanes : {0, 8, 4}) {
                if (lanes && c % 8) continue;
                tg.fn(mag0, kChunk, is_signed, lanes, got.data());
                tg.checked += 2 * kChunk;
                for (uint32_t i = 0; i < 2 * kChunk; ++i)
                  if (got[i] != want[i] && tg.mismatches++ == 0)
                    tg.first_bad = (mag0 + i / 2) | (i % 2 ? 0x80000000u : 0u);
              }
          }
        });
      for (auto& th : threads) th.join();
      for (size_t j = 0; j < targets.size(); ++j) {
        uint64_t checked = 0, mismatches = 0;
        uint32_t first_bad = 0;
        for (const auto& p : part) {
          if (p[j].mismatches && !mismatches) first_bad = p[j].first_bad;
          checked += p[j].checked, mismatches += p[j].mismatches;
        }
        char bad[16];
        snprintf(bad, sizeof bad, "0x%08x", unsigned(first_bad));
        MESSAGE(std::string(hwy::TargetName(targets[j].target)), std::string(is_signed ? " signed" : " unsigned"), ": ",
                checked, " encodes checked, ", mismatches, " mismatches");
        CHECK_MESSAGE(mismatches == 0, std::string(hwy::TargetName(targets[j].target)), " first mismatch at ", bad);
      }
    }
  }
}
#endif  // HWY_ONCE

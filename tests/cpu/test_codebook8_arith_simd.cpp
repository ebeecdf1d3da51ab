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

// out[2 i] and out[2 i + 1]: the codes of +x and -x for the float x of bits mag0 + i, i < count (a multiple of 64).
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

// lanes: 0 for the target's full vector, else at most that many.
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
#include <doctest/doctest.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

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

float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

}  // namespace

TEST_SUITE("codebook8_arith_simd") {
  TEST_CASE("vector encode equals the scalar one for every float with |x| <= 2, every target, both maps") {
    std::vector<Target> targets;
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
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
      const lbopt::Encode8Tables& t = is_signed ? lbopt::kEncode8Signed : lbopt::kEncode8Unsigned;
      std::vector<std::vector<Target>> part(n_threads, targets);
      std::vector<std::thread> threads;
      for (unsigned k = 0; k < n_threads; ++k)
        threads.emplace_back([&, k] {
          std::vector<int32_t> want(2 * kChunk), got(2 * kChunk);
          for (uint32_t c = k; c < kEnd / kChunk; c += n_threads) {
            const uint32_t mag0 = c * kChunk;
            for (uint32_t i = 0; i < kChunk; ++i) {
              want[2 * i] = int32_t(lbopt::codebook8_encode_arith(t, from_bits(mag0 + i)));
              want[2 * i + 1] = int32_t(lbopt::codebook8_encode_arith(t, from_bits((mag0 + i) | 0x80000000u)));
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

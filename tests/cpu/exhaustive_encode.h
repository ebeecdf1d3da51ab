// The driver of the exhaustive vector-encode suites (test_codebook8_arith_simd.cpp, test_codebook4_simd.cpp): each
// Highway target's encode against a scalar reference on every float y with |y| <= 2, both signs, on full vectors,
// and on 8- and 4-lane vectors (the permute and the gather table paths) every eighth chunk. Include it in the
// HWY_ONCE part of a foreach_target test.
#pragma once
#include <doctest/doctest.h>
#include <hwy/targets.h>
#include <stdio.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

namespace exhaustive {

// out[2 i] and out[2 i + 1]: the codes of +y and -y for the float y of bits mag0 + i, i < count (a multiple of
// 64); lanes: 0 for the target's full vector, else at most that many.
using EncodeFn = void (*)(uint32_t mag0, uint32_t count, int map, int lanes, int32_t* out);

struct Target {
  int64_t target;
  EncodeFn fn;
};

// Every target compiled here that this CPU runs and `keep` accepts; resolve() returns the dispatched encode,
// compiled() the target it was built for (both called with the dispatch forced to the target).
template <class Keep, class Resolve, class Compiled>
std::vector<Target> targets(const Keep& keep, const Resolve& resolve, const Compiled& compiled) {
  std::vector<Target> out;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    if (!keep(target)) continue;
    hwy::SetSupportedTargetsForTest(target);
    out.push_back({target, resolve()});
    REQUIRE(compiled() == target);
  }
  hwy::SetSupportedTargetsForTest(0);
  REQUIRE(!out.empty());
  return out;
}

// Checks map `map` of every target against want(bits) (the scalar code of the float of those bits).
template <class Want>
void check(const std::vector<Target>& targets, int map, const char* map_name, const Want& want) {
  struct Count {
    uint64_t checked = 0, mismatches = 0;
    uint32_t first_bad = 0;
  };
  constexpr uint32_t kChunk = 1u << 16, kEnd = 0x40000000u + kChunk;  // past 2.0f, whole chunks
  const unsigned n_threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  std::vector<std::vector<Count>> part(n_threads, std::vector<Count>(targets.size()));
  std::vector<std::thread> threads;
  for (unsigned k = 0; k < n_threads; ++k)
    threads.emplace_back([&, k] {
      std::vector<int32_t> expect(2 * kChunk), got(2 * kChunk);
      for (uint32_t c = k; c < kEnd / kChunk; c += n_threads) {
        const uint32_t mag0 = c * kChunk;
        for (uint32_t i = 0; i < kChunk; ++i) {
          expect[2 * i] = want(mag0 + i);
          expect[2 * i + 1] = want((mag0 + i) | 0x80000000u);
        }
        for (size_t j = 0; j < targets.size(); ++j)
          for (int lanes : {0, 8, 4}) {
            if (lanes && c % 8) continue;
            targets[j].fn(mag0, kChunk, map, lanes, got.data());
            Count& n = part[k][j];
            n.checked += 2 * kChunk;
            for (uint32_t i = 0; i < 2 * kChunk; ++i)
              if (got[i] != expect[i] && n.mismatches++ == 0) n.first_bad = (mag0 + i / 2) | (i % 2 ? 0x80000000u : 0u);
          }
      }
    });
  for (auto& th : threads) th.join();
  for (size_t j = 0; j < targets.size(); ++j) {
    Count total;
    for (const auto& p : part) {
      if (p[j].mismatches && !total.mismatches) total.first_bad = p[j].first_bad;
      total.checked += p[j].checked, total.mismatches += p[j].mismatches;
    }
    char bad[16];
    snprintf(bad, sizeof bad, "0x%08x", unsigned(total.first_bad));
    const std::string name = std::string(hwy::TargetName(targets[j].target)) + " " + map_name;
    MESSAGE(name, ": ", total.checked, " encodes checked, ", total.mismatches, " mismatches");
    CHECK_MESSAGE(total.mismatches == 0, name, " first mismatch at ", bad);
  }
}

}  // namespace exhaustive

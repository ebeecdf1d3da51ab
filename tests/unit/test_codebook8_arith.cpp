// The bucket-table 8-bit encode (kernels/codebook8_arith.h) against codebook_encode's search, for every float with
// |x| <= 2 and a sample beyond. Past |x| = 1 the encode clamps to one value, so this covers every finite float.
#include <doctest/doctest.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../../kernels/codebook8_arith.h"
#include "../../kernels/quant.h"

namespace {

float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

struct Map {
  const char* name;
  const lbopt::Encode8Tables& t;
  const float* mids;
};

const Map kMaps[] = {{"signed", lbopt::kEncode8Signed, lbopt::codebook::kSigned8Mids},
                     {"unsigned", lbopt::kEncode8Unsigned, lbopt::codebook::kUnsigned8Mids}};

constexpr uint32_t kTwoBits = 0x40000000u;  // 2.0f

struct Result {
  uint64_t checked = 0, mismatches = 0;
  uint32_t first_bad = 0;
};

// Both signs of every magnitude bit pattern in [lo, hi), split over the machine's threads.
Result check_range(const Map& m, uint32_t lo, uint32_t hi) {
  const unsigned n_threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  std::vector<Result> part(n_threads);
  std::vector<std::thread> threads;
  for (unsigned k = 0; k < n_threads; ++k)
    threads.emplace_back([&, k] {
      Result& r = part[k];
      const uint32_t span = hi - lo, a = lo + uint32_t(uint64_t(span) * k / n_threads),
                     b = lo + uint32_t(uint64_t(span) * (k + 1) / n_threads);
      for (uint32_t mag = a; mag < b; ++mag)
        for (uint32_t sign : {0u, 0x80000000u}) {
          const float x = from_bits(mag | sign);
          const uint32_t want = lbopt::codebook_encode(m.mids, 256, x);
          const uint32_t got = lbopt::codebook8_encode_arith(m.t, x);
          ++r.checked;
          if (got != want && r.mismatches++ == 0) r.first_bad = mag | sign;
        }
    });
  for (auto& th : threads) th.join();
  Result total;
  for (const Result& r : part) {
    if (r.mismatches && !total.mismatches) total.first_bad = r.first_bad;
    total.checked += r.checked, total.mismatches += r.mismatches;
  }
  return total;
}

}  // namespace

TEST_SUITE("codebook8_arith") {
  TEST_CASE("every float with |x| <= 2 encodes as codebook_encode does, both maps") {
    for (const Map& m : kMaps) {
      const Result r = check_range(m, 0, kTwoBits + 1);  // +-0, subnormals, normals up to +-2
      MESSAGE(std::string(m.name), ": ", r.checked, " floats checked, ", r.mismatches, " mismatches");
      CHECK(r.checked == 2ull * (kTwoBits + 1));
      char bad[16];
      snprintf(bad, sizeof bad, "0x%08x", unsigned(r.first_bad));
      CHECK_MESSAGE(r.mismatches == 0, std::string(m.name), " first mismatch at bits ", bad);
    }
  }

  TEST_CASE("beyond |x| = 2: every exponent, random mantissas, the largest finite floats and infinities") {
    std::mt19937 rng(8);
    for (const Map& m : kMaps) {
      uint64_t n = 0, bad = 0;
      for (uint32_t e = 129; e <= 255; ++e)
        for (int i = 0; i < 20000; ++i) {
          const uint32_t mant = e == 255 ? 0u : (i < 2 ? (i ? 0x7fffffu : 0u) : rng() & 0x7fffffu);
          for (uint32_t sign : {0u, 0x80000000u}) {
            const float x = from_bits(sign | e << 23 | mant);
            bad += lbopt::codebook8_encode_arith(m.t, x) != lbopt::codebook_encode(m.mids, 256, x);
            ++n;
          }
          if (e == 255) break;  // +-Inf once
        }
      MESSAGE(std::string(m.name), ": ", n, " floats beyond 2 checked, ", bad, " mismatches");
      CHECK(bad == 0);
    }
  }

  TEST_CASE("ties go up: every midpoint and its neighbours") {
    for (const Map& m : kMaps)
      for (int i = 0; i < 255; ++i) {
        uint32_t b;
        memcpy(&b, &m.mids[i], 4);
        for (int d = -2; d <= 2; ++d) {
          const float x = from_bits(b + uint32_t(d));
          CHECK(lbopt::codebook8_encode_arith(m.t, x) == lbopt::codebook_encode(m.mids, 256, x));
        }
        CHECK(lbopt::codebook8_encode_arith(m.t, m.mids[i]) == uint32_t(i + 1));
      }
  }
}

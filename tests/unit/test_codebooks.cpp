// The embedded codebooks against the torchao reference dump and the documented construction rule, and the
// value encoders built on them.
#include <doctest/doctest.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "../../kernels/codebooks.h"
#include "../../kernels/quant.h"
#include "reference.h"

namespace {

// "## QMAP 8-bit SIGNED ..." sections of "code value 0xHEX" rows.
std::map<std::string, std::vector<uint32_t>> read_qmaps(const char* path) {
  std::map<std::string, std::vector<uint32_t>> tables;
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open ", path);
  std::string line, current;
  while (std::getline(in, line)) {
    if (line.rfind("## QMAP ", 0) == 0) {
      std::istringstream words(line.substr(8));
      std::string bits, sign;
      words >> bits >> sign;
      current = bits + " " + sign;
      continue;
    }
    unsigned code, hex;
    char value[64];
    if (!current.empty() && sscanf(line.c_str(), " %u %63s 0x%x", &code, value, &hex) == 3) {
      REQUIRE(code == tables[current].size());
      tables[current].push_back(hex);
    }
  }
  return tables;
}

uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

// Distance in units in the last place between two floats of the same sign (or zero).
int64_t ulps(float a, float b) {
  const auto ordered = [](float f) {
    const int32_t i = int32_t(bits(f));
    return i < 0 ? int64_t(INT32_MIN) - i : int64_t(i);
  };
  return std::llabs(ordered(a) - ordered(b));
}

struct Table {
  std::string name;
  const float* values;
  const float* mids;
  uint32_t entries;
  std::vector<double> rule;
};

std::vector<Table> tables() {
  using namespace lbopt::codebook;
  return {{"4-bit SIGNED", kSigned4Values, kSigned4Mids, 16, ref::dynamic_map(true, 3)},
          {"4-bit UNSIGNED", kUnsigned4Values, kUnsigned4Mids, 16, ref::linear_map_no_zero()},
          {"8-bit SIGNED", kSigned8Values, kSigned8Mids, 256, ref::dynamic_map(true, 7)},
          {"8-bit UNSIGNED", kUnsigned8Values, kUnsigned8Mids, 256, ref::dynamic_map(false, 7)}};
}

}  // namespace

TEST_SUITE("codebooks") {
  TEST_CASE("the maps equal the spec's torchao dump: 4-bit exactly, 8-bit within 2 ulps") {
    // The reference dump (tests/data/qmaps_torchao.txt) came from an older torch whose float32 linspace rounds
    // differently in some 8-bit entries.
    const auto dump = read_qmaps(LBOPT_QMAPS_SPEC);
    for (const Table& t : tables()) {
      CAPTURE(t.name);
      const auto it = dump.find(t.name);
      REQUIRE(it != dump.end());
      REQUIRE(it->second.size() == t.entries);
      int64_t worst = 0;
      for (uint32_t c = 0; c < t.entries; ++c) {
        float f;
        memcpy(&f, &it->second[c], 4);
        worst = std::max(worst, ulps(t.values[c], f));
      }
      CHECK(worst <= (t.entries == 16 ? 0 : 2));
    }
  }

  TEST_CASE("the maps equal the dump of the torchao release they were generated from, bit for bit") {
    const auto dump = read_qmaps(LBOPT_QMAPS_CURRENT);
    for (const Table& t : tables()) {
      CAPTURE(t.name);
      const auto it = dump.find(t.name);
      REQUIRE(it != dump.end());
      REQUIRE(it->second.size() == t.entries);
      for (uint32_t c = 0; c < t.entries; ++c) CHECK(bits(t.values[c]) == it->second[c]);
    }
  }

  TEST_CASE("the maps follow the documented construction rule within 2 ulps") {
    // The rule evaluated in double and rounded once; torchao evaluates it in float32 steps, hence the ulps.
    for (const Table& t : tables()) {
      CAPTURE(t.name);
      REQUIRE(t.rule.size() == t.entries);
      int64_t worst = 0;
      for (uint32_t c = 0; c < t.entries; ++c) worst = std::max(worst, ulps(t.values[c], float(t.rule[c])));
      CHECK(worst <= 2);
    }
    // landmarks docs/formats.md names
    CHECK(lbopt::codebook::kSigned8Values[0] == doctest::Approx(-0.99296874).epsilon(1e-7));
    CHECK(lbopt::codebook::kSigned8Values[127] == 0.0f);
    CHECK(lbopt::codebook::kSigned8Values[255] == 1.0f);
    CHECK(lbopt::codebook::kUnsigned8Values[0] == 0.0f);
  }

  TEST_CASE("midpoints separate neighbours, and every value encodes to its own code") {
    for (const Table& t : tables()) {
      CAPTURE(t.name);
      CHECK(isinf(t.mids[t.entries - 1]));
      for (uint32_t c = 0; c + 1 < t.entries; ++c) {
        CHECK(t.values[c] < t.mids[c]);
        CHECK(t.mids[c] <= t.values[c + 1]);
      }
      for (uint32_t c = 0; c < t.entries; ++c) CHECK(lbopt::codebook_encode(t.mids, t.entries, t.values[c]) == c);
      // below the first value and above the last stay on the end codes
      CHECK(lbopt::codebook_encode(t.mids, t.entries, -2.0f) == 0);
      CHECK(lbopt::codebook_encode(t.mids, t.entries, 2.0f) == t.entries - 1);
    }
  }

  TEST_CASE("map encoding is nearest, ties up, against a brute-force search") {
    for (const Table& t : tables()) {
      CAPTURE(t.name);
      int64_t off = 0;
      for (int i = 0; i <= 200000; ++i) {
        const float x = float(-1.0 + 2.0 * i / 200000.0);
        uint32_t best = 0;
        for (uint32_t c = 1; c < t.entries; ++c)
          if (fabs(double(x) - t.values[c]) <= fabs(double(x) - t.values[best])) best = c;
        const uint32_t got = lbopt::codebook_encode(t.mids, t.entries, x);
        // float midpoints may disagree with the exact one only within an ulp of a tie
        if (got != best) {
          ++off;
          CHECK(fabs(fabs(double(x) - t.values[got]) - fabs(double(x) - t.values[best])) <= 1e-7);
        }
      }
      CHECK(off <= 20);  // of 200001 decimal grid points, which sit on or next to many decimal midpoints
    }
  }
}

TEST_SUITE("e4m3") {
  TEST_CASE("decode of every finite code matches the format definition") {
    for (int c = 0; c < 256; ++c) {
      if ((c & 0x7f) == 0x7f) continue;  // NaN codes are never written
      CAPTURE(c);
      CHECK(double(lbopt::fp8_e4m3_decode(uint8_t(c))) == ref::fp8_value(c));
    }
  }

  TEST_CASE("encode is round-to-nearest-even with saturation, never NaN") {
    const ref::Codec codec(ref::kFp8, false);
    for (int i = -300000; i <= 300000; ++i) {
      const float x = float(460.0 * i / 300000.0 * fabs(double(i)) / 300000.0);  // denser near 0
      const uint8_t got = lbopt::fp8_e4m3_encode(x);
      const int want = codec.encode(x, 1.0);
      CAPTURE(x);
      REQUIRE(((got & 0x7f) != 0x7f));
      if (got != want) REQUIRE(((got & 0x7f) == 0 && (want & 0x7f) == 0));  // +0 / -0
    }
    CHECK(lbopt::fp8_e4m3_encode(1e30f) == 0x7e);
    CHECK(lbopt::fp8_e4m3_encode(-1e30f) == 0xfe);
    CHECK(lbopt::fp8_e4m3_encode(464.0f) == 0x7e);  // would round to 480 / NaN in a plain cast
    CHECK(lbopt::fp8_e4m3_encode(0.0009765625f) == 0x00);  // half of the smallest subnormal: ties to even (0)
    CHECK(lbopt::fp8_e4m3_encode(0.0029296875f) == 0x02);  // 1.5 subnormal steps: ties to even (2)
  }
}

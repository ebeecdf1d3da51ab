// Dense layouts other than row-major (channels_last, transposes, any permutation of a compact layout): the step and
// the conversions walk memory in order, so a permuted view must give exactly what the same bytes give as a flat
// tensor, states included.
#include <doctest/doctest.h>

#include <vector>

#include "harness.h"

using namespace test;

namespace {

// [5, 6, 7] with strides {1, 35, 5}: dim 0 innermost, then dim 2, then dim 1.
std::vector<int64_t> kShape{5, 6, 7}, kStrides{1, 35, 5};

void permute(DLTensor& t) {
  t.ndim = 3;
  t.shape = kShape.data();
  t.strides = kStrides.data();
}

}  // namespace

TEST_SUITE("layouts") {
  TEST_CASE("a permuted dense param and grad step exactly as the same memory does flat") {
    for (lbopt_state_kind kind : {LBOPT_STATE_4BIT, LBOPT_STATE_8BIT, LBOPT_STATE_FP8, LBOPT_STATE_FP32}) {
      CAPTURE(int(kind));
      lbopt_adamw_config cfg;
      lbopt_adamw_config_init(&cfg, sizeof cfg);
      cfg.state_kind = kind;
      cfg.flags = LBOPT_FLAG_AMSGRAD;
      StepTensors flat(kind, 210, 7), permuted(kind, 210, 7);
      permute(permuted.p.t);
      permute(permuted.g.t);
      for (int64_t s = 1; s <= 3; ++s) {
        const lbopt_adamw_slot a = flat.slot(s, true), b = permuted.slot(s, true);
        REQUIRE(lbopt_adamw_step(&cfg, 1e-2, &a, 1, nullptr) == LBOPT_OK);
        REQUIRE_MESSAGE(lbopt_adamw_step(&cfg, 1e-2, &b, 1, nullptr) == LBOPT_OK, lbopt_last_error());
      }
      CHECK(flat.digest() == permuted.digest());
    }
  }

  TEST_CASE("quantize and dequantize read and write a permuted float32 tensor in memory order") {
    Buffer flat(f32(), {210}), permuted(f32(), {210}), back(f32(), {210});
    for (int64_t i = 0; i < 210; ++i) flat.as<float>()[i] = permuted.as<float>()[i] = float(i % 13) - 6.0f;
    permute(permuted.t);
    permute(back.t);
    State a(LBOPT_STATE_4BIT, 210), b(LBOPT_STATE_4BIT, 210);
    REQUIRE(lbopt_quantize(LBOPT_STATE_4BIT, LBOPT_MOMENT_FIRST, &flat.t, a.view(), nullptr) == LBOPT_OK);
    REQUIRE(lbopt_quantize(LBOPT_STATE_4BIT, LBOPT_MOMENT_FIRST, &permuted.t, b.view(), nullptr) == LBOPT_OK);
    CHECK(hash(*a.codes) == hash(*b.codes));
    CHECK(hash(*a.scales) == hash(*b.scales));
    REQUIRE(lbopt_dequantize(LBOPT_STATE_4BIT, LBOPT_MOMENT_FIRST, b.view(), &back.t, nullptr) == LBOPT_OK);
    REQUIRE(lbopt_dequantize(LBOPT_STATE_4BIT, LBOPT_MOMENT_FIRST, a.view(), &flat.t, nullptr) == LBOPT_OK);
    CHECK(hash(flat) == hash(back));
  }
}

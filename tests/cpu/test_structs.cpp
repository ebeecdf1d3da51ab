// Structs the library fills respect the caller's size: an older (smaller) caller struct is refused rather than
// overrun, a newer (larger) one gets its unknown tail zeroed.
#include <doctest/doctest.h>

#include <string.h>

#include "lbopt.h"

TEST_SUITE("struct sizes") {
  TEST_CASE("init functions write exactly the caller's size and report the library's") {
    unsigned char buf[sizeof(lbopt_adamw_config) + 32];
    memset(buf, 0xab, sizeof buf);
    REQUIRE(lbopt_adamw_config_init(reinterpret_cast<lbopt_adamw_config*>(buf), sizeof(lbopt_adamw_config) + 16) ==
            LBOPT_OK);
    lbopt_adamw_config c;
    memcpy(&c, buf, sizeof c);
    CHECK(c.struct_size == sizeof(lbopt_adamw_config));
    CHECK(c.beta1 == 0.9);
    CHECK(c.beta2 == 0.999);
    CHECK(c.eps == 1e-8);
    CHECK(c.weight_decay == 0.01);
    CHECK(c.state_kind == LBOPT_STATE_4BIT);
    CHECK(c.flags == 0);
    for (size_t i = sizeof(lbopt_adamw_config); i < sizeof(lbopt_adamw_config) + 16; ++i) CHECK(buf[i] == 0);
    for (size_t i = sizeof(lbopt_adamw_config) + 16; i < sizeof buf; ++i) CHECK(buf[i] == 0xab);

    memset(buf, 0xab, sizeof buf);
    CHECK(lbopt_step_options_init(reinterpret_cast<lbopt_step_options*>(buf), sizeof(lbopt_step_options) - 1) ==
          LBOPT_ERR_STRUCT_SIZE);
    for (unsigned char b : buf) CHECK(b == 0xab);
  }

  TEST_CASE("state layouts: sizes, block sizes and dtypes per kind") {
    struct Want {
      lbopt_state_kind kind;
      int64_t numel, codes, scales, block;
      uint8_t code, bits;
    };
    const Want wants[] = {{LBOPT_STATE_4BIT, 257, 129, 3, 128, kDLUInt, 8}, {LBOPT_STATE_4BIT, 0, 0, 0, 128, kDLUInt, 8},
                          {LBOPT_STATE_8BIT, 257, 257, 2, 256, kDLUInt, 8}, {LBOPT_STATE_FP8, 256, 256, 1, 256, kDLUInt, 8},
                          {LBOPT_STATE_FP32, 257, 257, 0, 0, kDLFloat, 32}};
    for (const Want& w : wants) {
      lbopt_layout l;
      REQUIRE(lbopt_state_layout(w.kind, w.numel, &l, sizeof l) == LBOPT_OK);
      CAPTURE(int(w.kind));
      CHECK(l.struct_size == sizeof l);
      CHECK(l.codes_numel == w.codes);
      CHECK(l.codes_bytes == w.codes * w.bits / 8);
      CHECK(l.scales_numel == w.scales);
      CHECK(l.block_size == w.block);
      CHECK(l.codes_dtype.code == w.code);
      CHECK(l.codes_dtype.bits == w.bits);
      CHECK(l.codes_dtype.lanes == 1);
    }
  }
}

// Structs the library fills respect the caller's size: a smaller caller struct than the library knows is refused
// rather than overrun, a newer (larger) one gets its unknown tail zeroed, and the step options of lbopt 0.3 (the
// one struct that has grown since) are filled and read at their own size.
#include <doctest/doctest.h>

#include <stddef.h>
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

  TEST_CASE("step options as lbopt 0.3 laid them out (without flags) are filled and accepted") {
    const size_t old_size = offsetof(lbopt_step_options, flags);
    unsigned char buf[sizeof(lbopt_step_options)];
    memset(buf, 0xab, sizeof buf);
    auto* options = reinterpret_cast<lbopt_step_options*>(buf);
    REQUIRE(lbopt_step_options_init(options, old_size) == LBOPT_OK);
    CHECK(options->struct_size == old_size);
    for (size_t i = offsetof(lbopt_step_options, grad_scale); i < old_size; ++i) CHECK(buf[i] == 0);
    for (size_t i = old_size; i < sizeof buf; ++i) CHECK(buf[i] == 0xab);  // the flags the caller does not have

    float param[4] = {1, 2, 3, 4}, grad[4] = {1, 1, 1, 1}, m[4] = {}, v[4] = {};
    int64_t shape[1] = {4};
    const auto tensor = [&](float* data) {
      DLTensor t{};
      t.data = data;
      t.device = {kDLCPU, 0};
      t.ndim = 1;
      t.dtype = {kDLFloat, 32, 1};
      t.shape = shape;
      return t;
    };
    DLTensor tp = tensor(param), tg = tensor(grad), tm = tensor(m), tv = tensor(v);
    lbopt_optimizer_config config;
    REQUIRE(lbopt_optimizer_config_init(&config, sizeof config, LBOPT_OPTIMIZER_ADAMW) == LBOPT_OK);
    config.state_kind = LBOPT_STATE_FP32;
    lbopt_slot slot{};
    slot.struct_size = sizeof slot;
    slot.param = &tp;
    slot.grad = &tg;
    slot.states[0].codes = &tm;
    slot.states[1].codes = &tv;
    slot.step = 1;
    CHECK(lbopt_step(&config, 0.1, &slot, 1, options) == LBOPT_OK);
    CHECK(param[0] < 1.0f);
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

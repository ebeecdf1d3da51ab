// lbopt_adamw_step_capturable: lr and step read from scalars at run time. On CPU tensors it must equal the by-value
// step bit for bit, and refuse bad scalars before writing anything.
#include <doctest/doctest.h>

#include <math.h>

#include <string>

#include "harness.h"

using namespace test;

TEST_SUITE("capturable step") {
  TEST_CASE("device-scalar lr and step equal the by-value step bit for bit") {
    lbopt_adamw_config cfg;
    lbopt_adamw_config_init(&cfg, sizeof cfg);
    cfg.flags = LBOPT_FLAG_BF16_STOCHASTIC_ROUND;
    for (bool lr64 : {false, true})
      for (bool step64 : {false, true}) {
        CAPTURE(lr64);
        CAPTURE(step64);
        StepTensors a(LBOPT_STATE_4BIT, 3001, 5), b(LBOPT_STATE_4BIT, 3001, 5);
        Buffer lr(lr64 ? DLDataType{kDLFloat, 64, 1} : f32(), {1}), step(step64 ? DLDataType{kDLInt, 64, 1} : f32(), {1});
        for (int64_t s = 1; s <= 5; ++s) {
          const double value = 1e-3 * (1 + cos(double(s)));  // a new lr on every step, written into the scalar
          double used;
          if (lr64) used = lr.as<double>()[0] = value;
          else used = lr.as<float>()[0] = float(value);
          if (step64) step.as<int64_t>()[0] = s;
          else step.as<float>()[0] = float(s);
          const lbopt_adamw_slot sa = a.slot(s), sb = b.slot(12345);  // b's slot step is ignored
          REQUIRE(lbopt_adamw_step(&cfg, used, &sa, 1, nullptr) == LBOPT_OK);
          REQUIRE_MESSAGE(lbopt_adamw_step_capturable(&cfg, &lr.t, &step.t, &sb, 1, nullptr) == LBOPT_OK,
                          lbopt_last_error());
          CHECK(a.digest() == b.digest());
        }
      }
  }

  TEST_CASE("bad scalars are refused with a message naming them, and nothing is written") {
    lbopt_adamw_config cfg;
    lbopt_adamw_config_init(&cfg, sizeof cfg);
    StepTensors a(LBOPT_STATE_4BIT, 500, 5);
    Buffer lr(f32(), {1}), lr2(f32(), {2}), lr_int(DLDataType{kDLInt, 32, 1}, {1}), step(DLDataType{kDLInt, 64, 1}, {1});
    lr.as<float>()[0] = 1e-3f;
    step.as<int64_t>()[0] = 1;
    const lbopt_adamw_slot s = a.slot(1);
    struct Case {
      const DLTensor* lr;
      const DLTensor* step;
      float lr_value;
      int64_t step_value;
      lbopt_status status;
      const char* needle;
    };
    const Case cases[] = {
        {nullptr, &step.t, 1e-3f, 1, LBOPT_ERR_NULL_POINTER, "lr"},
        {&lr.t, nullptr, 1e-3f, 1, LBOPT_ERR_NULL_POINTER, "step"},
        {&lr2.t, &step.t, 1e-3f, 1, LBOPT_ERR_SHAPE, "lr: has 2 elements"},
        {&lr_int.t, &step.t, 1e-3f, 1, LBOPT_ERR_DTYPE, "lr: dtype int32"},
        {&lr.t, &lr2.t, 1e-3f, 1, LBOPT_ERR_SHAPE, "step: has 2 elements"},
        {&lr.t, &lr.t, 1e-3f, 1, LBOPT_ERR_INVALID_VALUE, "step = 0.001"},  // a float32 step must be whole
        {&lr.t, &step.t, -1.0f, 1, LBOPT_ERR_INVALID_VALUE, "lr = -1"},
        {&lr.t, &step.t, NAN, 1, LBOPT_ERR_INVALID_VALUE, "lr = nan"},
        {&lr.t, &step.t, 1e-3f, 0, LBOPT_ERR_INVALID_VALUE, "step = 0"},
    };
    for (const Case& c : cases) {
      const std::string needle = c.needle;
      CAPTURE(needle);
      lr.as<float>()[0] = c.lr_value;
      step.as<int64_t>()[0] = c.step_value;
      const uint64_t before = a.digest();
      const lbopt_status st = lbopt_adamw_step_capturable(&cfg, c.lr, c.step, &s, 1, nullptr);
      CHECK(st == c.status);
      CHECK(std::string(lbopt_last_error()).find(c.needle) != std::string::npos);
      CHECK(a.digest() == before);
    }
  }
}

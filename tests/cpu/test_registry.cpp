// The operator registry: schemas are well formed, lbopt_op_invoke gives bit-identical results to the typed calls,
// and a bad invoke fails with its specific status, names what is wrong and writes nothing.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "harness.h"

using namespace test;

namespace {

lbopt_attr f(const char* n, double v) { return lbopt_attr{n, LBOPT_ATTR_DOUBLE, v, 0, nullptr}; }
lbopt_attr i64(const char* n, int64_t v) { return lbopt_attr{n, LBOPT_ATTR_INT64, 0.0, v, nullptr}; }
lbopt_attr b(const char* n, bool v) { return lbopt_attr{n, LBOPT_ATTR_BOOL, 0.0, v ? 1 : 0, nullptr}; }
lbopt_attr str(const char* n, const char* v) { return lbopt_attr{n, LBOPT_ATTR_STRING, 0.0, 0, v}; }

struct Model : StepTensors {
  Model(lbopt_state_kind k, int64_t n) : StepTensors(k, n, 21) {}
  std::vector<const DLTensor*> tensors(bool ams) {
    const auto sc = [](State& s) -> const DLTensor* { return s.scales ? &s.scales->t : nullptr; };
    return {&p.t, &g.t, &m.codes->t, sc(m), &v.codes->t, sc(v), ams ? &vmax.codes->t : nullptr,
            ams ? sc(vmax) : nullptr, nullptr};
  }
};

const char* kind_op(int k) {
  static const char* names[] = {"lbopt.adamw_step.4bit", "lbopt.adamw_step.8bit", "lbopt.adamw_step.fp8",
                                "lbopt.adamw_step.fp32"};
  return names[k];
}

}  // namespace

TEST_SUITE("operator registry") {
  TEST_CASE("schemas: unique names, found by name, well-formed arguments") {
    std::set<std::string> names;
    REQUIRE(lbopt_op_count() == 12);
    for (size_t i = 0; i < lbopt_op_count(); ++i) {
      const lbopt_op_info* op = lbopt_op_schema(i);
      REQUIRE(op);
      CHECK(op->struct_size == sizeof(lbopt_op_info));
      CHECK(names.insert(op->name).second);
      CHECK(lbopt_op_find(op->name) == op);
      for (size_t t = 0; t < op->n_tensors; ++t) CHECK(op->tensors[t].dtypes != 0);
      for (size_t a = 0; a < op->n_attrs; ++a) CHECK(op->attrs[a].type <= LBOPT_ATTR_STRING);
    }
    CHECK(lbopt_op_schema(lbopt_op_count()) == nullptr);
    CHECK(lbopt_op_find("lbopt.nope") == nullptr);
    CHECK(lbopt_op_find(nullptr) == nullptr);
  }

  TEST_CASE("invoking a step operator equals the typed call bit for bit, for every kind") {
    for (int kind = 0; kind < 4; ++kind) {
      CAPTURE(kind);
      Model a(lbopt_state_kind(kind), 1001), c(lbopt_state_kind(kind), 1001);
      lbopt_adamw_config cfg;
      lbopt_adamw_config_init(&cfg, sizeof cfg);
      cfg.state_kind = lbopt_state_kind(kind);
      cfg.flags = LBOPT_FLAG_AMSGRAD | LBOPT_FLAG_BF16_STOCHASTIC_ROUND;
      cfg.seed = 9;
      cfg.beta2 = 0.99;
      const lbopt_op_info* op = lbopt_op_find(kind_op(kind));
      REQUIRE(op);
      for (int64_t s = 1; s <= 3; ++s) {
        const double lr = 1e-3 * double(s);
        const lbopt_adamw_slot slot = a.slot(s, true);
        REQUIRE(lbopt_adamw_step(&cfg, lr, &slot, 1, nullptr) == LBOPT_OK);
        const lbopt_attr attrs[] = {f("lr", lr), i64("step", s), b("amsgrad", true), b("bf16_stochastic_round", true),
                                    i64("seed", 9), f("beta2", 0.99)};
        const auto t = c.tensors(true);
        REQUIRE_MESSAGE(lbopt_op_invoke(op, t.data(), t.size(), attrs, 6, nullptr) == LBOPT_OK, lbopt_last_error());
        CHECK(a.digest() == c.digest());
      }
    }
  }

  TEST_CASE("the tensor-lr step operators equal the by-value step, reading lr and step when they run") {
    static const char* ops[] = {"lbopt.adamw_step_capturable.4bit", "lbopt.adamw_step_capturable.8bit",
                                "lbopt.adamw_step_capturable.fp8", "lbopt.adamw_step_capturable.fp32"};
    for (int kind = 0; kind < 4; ++kind) {
      CAPTURE(kind);
      Model a(lbopt_state_kind(kind), 1001), c(lbopt_state_kind(kind), 1001);
      lbopt_adamw_config cfg;
      lbopt_adamw_config_init(&cfg, sizeof cfg);
      cfg.state_kind = lbopt_state_kind(kind);
      cfg.flags = LBOPT_FLAG_AMSGRAD;
      cfg.weight_decay = 0.1;
      const lbopt_op_info* op = lbopt_op_find(ops[kind]);
      REQUIRE(op);
      REQUIRE(op->n_tensors == 11);
      CHECK(op->n_attrs == 10);  // the step's attributes but lr and step
      Buffer lr(DLDataType{kDLFloat, 64, 1}, {1}), step(DLDataType{kDLInt, 64, 1}, {1});
      for (int64_t s = 1; s <= 3; ++s) {
        lr.as<double>()[0] = 1e-3 * double(s);  // written into the tensor, as a compiled program would
        step.as<int64_t>()[0] = s;
        const lbopt_adamw_slot slot = a.slot(s, true);
        REQUIRE(lbopt_adamw_step(&cfg, 1e-3 * double(s), &slot, 1, nullptr) == LBOPT_OK);
        const lbopt_attr attrs[] = {b("amsgrad", true), f("weight_decay", 0.1)};
        auto t = c.tensors(true);
        t.insert(t.begin() + 8, {&lr.t, &step.t});
        REQUIRE_MESSAGE(lbopt_op_invoke(op, t.data(), t.size(), attrs, 2, nullptr) == LBOPT_OK, lbopt_last_error());
        CHECK(a.digest() == c.digest());
      }
      const lbopt_attr by_value[] = {f("lr", 1e-3)};
      auto t = c.tensors(true);
      t.insert(t.begin() + 8, {&lr.t, &step.t});
      CHECK(lbopt_op_invoke(op, t.data(), t.size(), by_value, 1, nullptr) == LBOPT_ERR_INVALID_VALUE);
      CHECK(std::string(lbopt_last_error()).find("unknown attribute 'lr'") != std::string::npos);
    }
  }

  TEST_CASE("quantize, dequantize and state_layout operators equal their typed calls") {
    const int64_t n = 777;
    Buffer x(f32(), {n}), y1(f32(), {n}), y2(f32(), {n}), out(DLDataType{kDLInt, 64, 1}, {4});
    for (int64_t i = 0; i < n; ++i) x.as<float>()[i] = float(i % 13) * 1e-3f;
    State s1(LBOPT_STATE_8BIT, n), s2(LBOPT_STATE_8BIT, n);
    REQUIRE(lbopt_quantize(LBOPT_STATE_8BIT, LBOPT_MOMENT_SECOND, &x.t, s1.view(), nullptr) == LBOPT_OK);
    const lbopt_attr qa[] = {str("kind", "8bit"), str("moment", "v")};
    const DLTensor* qt[] = {&x.t, &s2.codes->t, &s2.scales->t};
    REQUIRE(lbopt_op_invoke(lbopt_op_find("lbopt.quantize"), qt, 3, qa, 2, nullptr) == LBOPT_OK);
    CHECK(hash(*s1.codes) == hash(*s2.codes));
    CHECK(hash(*s1.scales) == hash(*s2.scales));
    REQUIRE(lbopt_dequantize(LBOPT_STATE_8BIT, LBOPT_MOMENT_SECOND, s1.view(), &y1.t, nullptr) == LBOPT_OK);
    const DLTensor* dt[] = {&s2.codes->t, &s2.scales->t, &y2.t};
    REQUIRE(lbopt_op_invoke(lbopt_op_find("lbopt.dequantize"), dt, 3, qa, 2, nullptr) == LBOPT_OK);
    CHECK(hash(y1) == hash(y2));
    const lbopt_attr la[] = {str("kind", "4bit"), i64("numel", n)};
    const DLTensor* lt[] = {&out.t};
    REQUIRE(lbopt_op_invoke(lbopt_op_find("lbopt.state_layout"), lt, 1, la, 2, nullptr) == LBOPT_OK);
    CHECK(out.as<int64_t>()[0] == 389);
    CHECK(out.as<int64_t>()[2] == 7);
    CHECK(out.as<int64_t>()[3] == 128);
  }

  TEST_CASE("bad invokes: specific status, a message naming the problem, nothing written") {
    Model m(LBOPT_STATE_4BIT, 300);
    const lbopt_op_info* op = lbopt_op_find("lbopt.adamw_step.4bit");
    const auto t = m.tensors(false);
    struct Case {
      std::vector<lbopt_attr> attrs;
      size_t n_tensors;
      bool null_param;
      lbopt_status status;
      const char* needle;
    };
    const Case cases[] = {
        {{f("lr", 1e-3), i64("step", 1), f("bogus", 1)}, 9, false, LBOPT_ERR_INVALID_VALUE, "unknown attribute 'bogus'"},
        {{f("lr", 1e-3)}, 9, false, LBOPT_ERR_INVALID_VALUE, "'step' of lbopt.adamw_step.4bit is required"},
        {{i64("lr", 1), i64("step", 1)}, 9, false, LBOPT_ERR_DTYPE, "'lr': type INT64, lbopt.adamw_step.4bit takes DOUBLE"},
        {{f("lr", 1e-3), i64("step", 1), f("lr", 2e-3)}, 9, false, LBOPT_ERR_INVALID_VALUE, "'lr' given twice"},
        {{f("lr", 1e-3), i64("step", 1)}, 8, false, LBOPT_ERR_INVALID_VALUE, "n_tensors = 8"},
        {{f("lr", 1e-3), i64("step", 1)}, 9, true, LBOPT_ERR_NULL_POINTER, "tensors[0] (param)"},
        {{f("lr", -1.0), i64("step", 1)}, 9, false, LBOPT_ERR_INVALID_VALUE, "lr = -1"},
        {{f("lr", 1e-3), i64("step", 0)}, 9, false, LBOPT_ERR_INVALID_VALUE, "slots[0].step = 0"},
        {{f("lr", 1e-3), i64("step", 1), b("amsgrad", true)}, 9, false, LBOPT_ERR_NULL_POINTER, "vmax"},
        {{f("lr", 1e-3), i64("step", 1), lbopt_attr{"adam", LBOPT_ATTR_BOOL, 0, 2, nullptr}}, 9, false,
         LBOPT_ERR_INVALID_VALUE, "bool 2"},
    };
    for (const Case& c : cases) {
      const std::string needle = c.needle;
      CAPTURE(needle);
      auto tensors = t;
      if (c.null_param) tensors[0] = nullptr;
      const uint64_t before = m.digest();
      CHECK(lbopt_op_invoke(op, tensors.data(), c.n_tensors, c.attrs.data(), c.attrs.size(), nullptr) == c.status);
      CHECK(std::string(lbopt_last_error()).find(c.needle) != std::string::npos);
      CHECK(m.digest() == before);
    }
    const lbopt_attr ok[] = {f("lr", 1e-3), i64("step", 1)};
    CHECK(lbopt_op_invoke(nullptr, t.data(), 9, ok, 2, nullptr) == LBOPT_ERR_NULL_POINTER);
    const lbopt_op_info fake = *op;  // a copy is not one of the library's operators
    CHECK(lbopt_op_invoke(&fake, t.data(), 9, ok, 2, nullptr) == LBOPT_ERR_INVALID_VALUE);
    // an int64 [4] output whose byte_offset wraps the address space (found by the fuzzer)
    Buffer lay(DLDataType{kDLInt, 64, 1}, {4});
    lay.t.byte_offset = ~uint64_t(7);
    const lbopt_attr la[] = {str("kind", "4bit"), i64("numel", 300)};
    const DLTensor* lt[] = {&lay.t};
    const uint64_t lay_before = hash(lay);
    CHECK(lbopt_op_invoke(lbopt_op_find("lbopt.state_layout"), lt, 1, la, 2, nullptr) == LBOPT_ERR_SHAPE);
    CHECK(hash(lay) == lay_before);
    const lbopt_attr bad_kind[] = {str("kind", "3bit"), i64("numel", 300)};
    const DLTensor* it[] = {&m.m.codes->t, &m.m.scales->t};
    CHECK(lbopt_op_invoke(lbopt_op_find("lbopt.state_init"), it, 2, bad_kind, 2, nullptr) == LBOPT_ERR_INVALID_VALUE);
    CHECK(std::string(lbopt_last_error()).find("'3bit'") != std::string::npos);
  }
}

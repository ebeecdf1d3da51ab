// The operator registry: schemas are well formed, lbopt_op_invoke gives bit-identical results to the typed calls,
// and a bad invoke fails with its specific status, names what is wrong and writes nothing.
#include <doctest/doctest.h>

#include <map>
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

// StepTensors' m, v and vmax serve as states 0, 1 and 2 of a generic slot.
struct GenericModel : StepTensors {
  GenericModel(lbopt_state_kind k, int64_t n) : StepTensors(k, n, 33) {}
  State* state(size_t k) { return k == 0 ? &m : k == 1 ? &v : &vmax; }
  lbopt_slot slot(int64_t step, size_t n_states) {
    lbopt_slot s{};
    s.struct_size = sizeof s;
    s.param = &p.t;
    s.grad = &g.t;
    for (size_t k = 0; k < n_states; ++k) s.states[k] = state(k)->view();
    s.step = step;
    return s;
  }
  // A generated op's tensors: param, grad, n_of_schema (codes, scales) pairs of which the first n_states are
  // given, [lr, step,] skipped.
  std::vector<const DLTensor*> tensors(size_t n_of_schema, size_t n_states, const DLTensor* lr = nullptr,
                                       const DLTensor* step = nullptr) {
    std::vector<const DLTensor*> t = {&p.t, &g.t};
    for (size_t k = 0; k < n_of_schema; ++k) {
      State* s = k < n_states ? state(k) : nullptr;
      t.push_back(s ? &s->codes->t : nullptr);
      t.push_back(s && s->scales ? &s->scales->t : nullptr);
    }
    if (lr) t.insert(t.end(), {lr, step});
    t.push_back(nullptr);
    return t;
  }
};

// The name of a generated step operator, from the library's own names.
std::string step_op(lbopt_optimizer opt, int kind, bool capturable) {
  return std::string("lbopt.") + lbopt_optimizer_name(opt) + (capturable ? "_step_capturable." : "_step.") +
         lbopt_state_kind_name(lbopt_state_kind(kind));
}

const lbopt_optimizer kGenerated[] = {LBOPT_OPTIMIZER_SGD, LBOPT_OPTIMIZER_LION, LBOPT_OPTIMIZER_ADEMAMIX,
                                      LBOPT_OPTIMIZER_MUON};

const char* kind_op(int k) {
  static const char* names[] = {"lbopt.adamw_step.4bit", "lbopt.adamw_step.8bit", "lbopt.adamw_step.fp8",
                                "lbopt.adamw_step.fp32"};
  return names[k];
}

}  // namespace

TEST_SUITE("operator registry") {
  TEST_CASE("schemas: unique names, found by name, well-formed arguments") {
    std::set<std::string> names;
    REQUIRE(lbopt_op_count() == 44);
    // the operators of 0.1 and 0.2 keep their indices
    static const char* fixed[] = {"lbopt.adamw_step.4bit", "lbopt.adamw_step.8bit", "lbopt.adamw_step.fp8",
                                  "lbopt.adamw_step.fp32", "lbopt.quantize", "lbopt.dequantize", "lbopt.state_init",
                                  "lbopt.state_layout", "lbopt.adamw_step_capturable.4bit",
                                  "lbopt.adamw_step_capturable.8bit", "lbopt.adamw_step_capturable.fp8",
                                  "lbopt.adamw_step_capturable.fp32"};
    for (size_t i = 0; i < 12; ++i) CHECK(std::string(lbopt_op_schema(i)->name) == fixed[i]);
    for (lbopt_optimizer opt : kGenerated)
      for (int kind = 0; kind < 4; ++kind)
        for (bool cap : {false, true}) CHECK_MESSAGE(lbopt_op_find(step_op(opt, kind, cap).c_str()), step_op(opt, kind, cap));
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
      CHECK(op->n_attrs == 12);  // the step's attributes but lr and step
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
    const auto* inside = reinterpret_cast<const lbopt_op_info*>(reinterpret_cast<const char*>(op) + 8);
    CHECK(lbopt_op_invoke(inside, t.data(), 9, ok, 2, nullptr) == LBOPT_ERR_INVALID_VALUE);  // not at an operator
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

  TEST_CASE("generated step operators: states as lbopt_optimizer_states names them, lbopt_optimizer_config_init's "
            "defaults") {
    using C = lbopt_optimizer_config;
    // An attribute after lr and step: the double field it sets, or the flag; neither: seed.
    struct Expect {
      const char* name;
      double C::*field;
      uint32_t flag;
    };
    const std::vector<Expect> common = {{"maximize", nullptr, LBOPT_FLAG_MAXIMIZE},
                                        {"bf16_stochastic_round", nullptr, LBOPT_FLAG_BF16_STOCHASTIC_ROUND},
                                        {"skip_nonfinite", nullptr, LBOPT_FLAG_SKIP_NONFINITE},
                                        {"state_stochastic_round", nullptr, LBOPT_FLAG_STATE_STOCHASTIC_ROUND},
                                        {"state_nearest_round", nullptr, LBOPT_FLAG_STATE_NEAREST_ROUND},
                                        {"seed", nullptr, 0}};
    const std::map<lbopt_optimizer, std::vector<Expect>> own = {
        {LBOPT_OPTIMIZER_SGD,
         {{"momentum", &C::momentum, 0}, {"dampening", &C::dampening, 0}, {"weight_decay", &C::weight_decay, 0},
          {"nesterov", nullptr, LBOPT_FLAG_NESTEROV}}},
        {LBOPT_OPTIMIZER_LION, {{"beta1", &C::beta1, 0}, {"beta2", &C::beta2, 0}, {"weight_decay", &C::weight_decay, 0}}},
        {LBOPT_OPTIMIZER_ADEMAMIX,
         {{"beta1", &C::beta1, 0}, {"beta2", &C::beta2, 0}, {"beta3", &C::beta3, 0}, {"alpha", &C::alpha, 0},
          {"t_alpha", &C::t_alpha, 0}, {"t_beta3", &C::t_beta3, 0}, {"eps", &C::eps, 0},
          {"weight_decay", &C::weight_decay, 0}, {"nu_linear_map", nullptr, LBOPT_FLAG_NU_LINEAR_MAP}}},
        {LBOPT_OPTIMIZER_MUON, {{"momentum", &C::momentum, 0}, {"nesterov", nullptr, LBOPT_FLAG_NESTEROV}}},
    };
    const auto name = [](const char* s) { return std::string(s); };
    for (lbopt_optimizer opt : kGenerated) {
      C d;
      REQUIRE(lbopt_optimizer_config_init(&d, sizeof d, opt) == LBOPT_OK);
      lbopt_state_info states[LBOPT_MAX_STATES];
      size_t n = 0;
      REQUIRE(lbopt_optimizer_states(&d, states, &n) == LBOPT_OK);
      REQUIRE(n >= 1);
      std::vector<Expect> attrs = own.at(opt);
      attrs.insert(attrs.end(), common.begin(), common.end());
      for (int kind = 0; kind < 4; ++kind)
        for (bool cap : {false, true}) {
          const std::string op_name = step_op(opt, kind, cap);
          CAPTURE(op_name);
          const lbopt_op_info* op = lbopt_op_find(op_name.c_str());
          REQUIRE(op);
          CHECK(op->struct_size == sizeof(lbopt_op_info));
          CHECK(op->version == 1);
          CHECK(std::string(op->doc).find(cap ? "scalar tensors" : "step") != std::string::npos);
          REQUIRE(op->n_tensors == 2 + 2 * n + (cap ? 2 : 0) + 1);
          const lbopt_tensor_arg* t = op->tensors;
          const uint32_t params = LBOPT_DTYPE_FLOAT32 | LBOPT_DTYPE_BFLOAT16 | LBOPT_DTYPE_FLOAT16;
          CHECK((name(t[0].name) == "param" && t[0].role == LBOPT_ROLE_INOUT && !t[0].optional && t[0].dtypes == params));
          CHECK((name(t[1].name) == "grad" && t[1].role == LBOPT_ROLE_IN && !t[1].optional && t[1].dtypes == params));
          for (size_t k = 0; k < n; ++k) {
            const lbopt_tensor_arg &codes = t[2 + 2 * k], &scales = t[3 + 2 * k];
            CHECK(name(codes.name) == name(states[k].name) + "_codes");
            CHECK(codes.role == LBOPT_ROLE_INOUT);
            CHECK(codes.dtypes == (LBOPT_DTYPE_UINT8 | LBOPT_DTYPE_FLOAT32));
            CHECK(codes.optional == (opt == LBOPT_OPTIMIZER_SGD));  // momentum = 0 keeps no state
            CHECK(name(scales.name) == name(states[k].name) + "_scales");
            CHECK((scales.role == LBOPT_ROLE_INOUT && scales.dtypes == LBOPT_DTYPE_FLOAT32 && scales.optional));
          }
          const lbopt_tensor_arg* rest = t + 2 + 2 * n;
          if (cap) {
            CHECK((name(rest[0].name) == "lr" && rest[0].role == LBOPT_ROLE_IN && !rest[0].optional &&
                   rest[0].dtypes == (LBOPT_DTYPE_FLOAT32 | LBOPT_DTYPE_FLOAT64)));
            CHECK((name(rest[1].name) == "step" && rest[1].role == LBOPT_ROLE_IN && !rest[1].optional &&
                   rest[1].dtypes == (LBOPT_DTYPE_INT64 | LBOPT_DTYPE_FLOAT32)));
            rest += 2;
          }
          CHECK((name(rest[0].name) == "skipped" && rest[0].role == LBOPT_ROLE_OUT && rest[0].optional &&
                 rest[0].dtypes == LBOPT_DTYPE_UINT8));
          const lbopt_attr_arg* a = op->attrs;
          REQUIRE(op->n_attrs == attrs.size() + (cap ? 0 : 2));
          if (!cap) {
            CHECK((name(a[0].name) == "lr" && a[0].type == LBOPT_ATTR_DOUBLE && a[0].required));
            CHECK((name(a[1].name) == "step" && a[1].type == LBOPT_ATTR_INT64 && a[1].required));
            a += 2;
          }
          for (size_t k = 0; k < attrs.size(); ++k) {
            const Expect& e = attrs[k];
            CAPTURE(e.name);
            CHECK(name(a[k].name) == e.name);
            CHECK(!a[k].required);
            if (e.field) {
              CHECK(a[k].type == LBOPT_ATTR_DOUBLE);
              CHECK(a[k].default_double == d.*e.field);
            } else if (e.flag) {
              CHECK(a[k].type == LBOPT_ATTR_BOOL);
              CHECK(a[k].default_int == ((d.flags & e.flag) ? 1 : 0));
            } else {
              CHECK(a[k].type == LBOPT_ATTR_INT64);
              CHECK(a[k].default_int == int64_t(d.seed));
            }
          }
        }
    }
  }

  TEST_CASE("generated step operators equal lbopt_step bit for bit, for every optimizer and kind") {
    using C = lbopt_optimizer_config;
    struct Case {
      lbopt_optimizer opt;
      std::vector<lbopt_attr> attrs;
      void (*set)(C&);  // the same hyper-parameters on a config
    };
    const Case cases[] = {
        {LBOPT_OPTIMIZER_SGD, {f("momentum", 0.8), f("dampening", 0.1), f("weight_decay", 0.01), b("maximize", true)},
         [](C& c) {
           c.momentum = 0.8;
           c.dampening = 0.1;
           c.weight_decay = 0.01;
           c.flags |= LBOPT_FLAG_MAXIMIZE;
         }},
        {LBOPT_OPTIMIZER_SGD, {b("nesterov", true), f("weight_decay", 0.1)},
         [](C& c) {
           c.flags |= LBOPT_FLAG_NESTEROV;
           c.weight_decay = 0.1;
         }},
        {LBOPT_OPTIMIZER_SGD, {f("momentum", 0.0)}, [](C& c) { c.momentum = 0.0; }},  // no state: NULL tensors
        {LBOPT_OPTIMIZER_LION, {f("beta1", 0.95), f("beta2", 0.98), f("weight_decay", 0.1)},
         [](C& c) {
           c.beta1 = 0.95;
           c.beta2 = 0.98;
           c.weight_decay = 0.1;
         }},
        {LBOPT_OPTIMIZER_ADEMAMIX,
         {f("beta1", 0.8), f("beta3", 0.999), f("alpha", 4.0), f("t_alpha", 2.0), f("t_beta3", 2.0), f("eps", 1e-6),
          f("weight_decay", 0.0)},
         [](C& c) {
           c.beta1 = 0.8;
           c.beta3 = 0.999;
           c.alpha = 4.0;
           c.t_alpha = 2.0;
           c.t_beta3 = 2.0;
           c.eps = 1e-6;
           c.weight_decay = 0.0;
         }},
    };
    for (const Case& cs : cases)
      for (int kind = 0; kind < 4; ++kind) {
        const std::string op_name = step_op(cs.opt, kind, false);
        CAPTURE(op_name);
        CAPTURE(cs.attrs[0].name);
        C cfg;
        REQUIRE(lbopt_optimizer_config_init(&cfg, sizeof cfg, cs.opt) == LBOPT_OK);
        cfg.state_kind = lbopt_state_kind(kind);
        cfg.flags = LBOPT_FLAG_BF16_STOCHASTIC_ROUND;
        cfg.seed = 5;
        cs.set(cfg);
        lbopt_state_info states[LBOPT_MAX_STATES];
        size_t n = 0;
        REQUIRE(lbopt_optimizer_states(&cfg, states, &n) == LBOPT_OK);
        const lbopt_op_info* op = lbopt_op_find(op_name.c_str());
        const lbopt_op_info* cap = lbopt_op_find(step_op(cs.opt, kind, true).c_str());
        REQUIRE(op);
        REQUIRE(cap);
        const size_t n_schema = (op->n_tensors - 3) / 2;  // param, grad, skipped and the states' pairs
        GenericModel typed(lbopt_state_kind(kind), 1001), by_value(lbopt_state_kind(kind), 1001),
            tensor_lr(lbopt_state_kind(kind), 1001);
        const uint64_t start = typed.digest();
        Buffer lr(DLDataType{kDLFloat, 64, 1}, {1}), step(DLDataType{kDLInt, 64, 1}, {1});
        for (int64_t s = 1; s <= 3; ++s) {
          const double lr_s = 1e-2 * double(s);
          const lbopt_slot slot = typed.slot(s, n);
          REQUIRE_MESSAGE(lbopt_step(&cfg, lr_s, &slot, 1, nullptr) == LBOPT_OK, lbopt_last_error());
          std::vector<lbopt_attr> attrs = cs.attrs;
          attrs.insert(attrs.end(), {b("bf16_stochastic_round", true), i64("seed", 5)});
          const std::vector<lbopt_attr> cap_attrs = attrs;
          attrs.insert(attrs.begin(), {f("lr", lr_s), i64("step", s)});
          auto t = by_value.tensors(n_schema, n);
          REQUIRE_MESSAGE(lbopt_op_invoke(op, t.data(), t.size(), attrs.data(), attrs.size(), nullptr) == LBOPT_OK,
                          lbopt_last_error());
          lr.as<double>()[0] = lr_s;
          step.as<int64_t>()[0] = s;
          t = tensor_lr.tensors(n_schema, n, &lr.t, &step.t);
          REQUIRE_MESSAGE(
              lbopt_op_invoke(cap, t.data(), t.size(), cap_attrs.data(), cap_attrs.size(), nullptr) == LBOPT_OK,
              lbopt_last_error());
          CHECK(by_value.digest() == typed.digest());
          CHECK(tensor_lr.digest() == typed.digest());
        }
        CHECK(typed.digest() != start);  // the steps did something
      }
  }

  TEST_CASE("bad invokes of the generated step operators: refused, nothing written") {
    GenericModel m(LBOPT_STATE_8BIT, 300);
    Buffer lr(DLDataType{kDLFloat, 64, 1}, {1}), step(DLDataType{kDLInt, 64, 1}, {1});
    struct Case {
      const char* op;
      size_t n_states;  // given of the schema's
      std::vector<lbopt_attr> attrs;
      lbopt_status status;
      const char* needle;
      double lr = 1e-3;  // the capturable operators' lr tensor
    };
    const lbopt_attr lr1 = f("lr", 1e-3), step1 = i64("step", 1);
    const Case cases[] = {
        {"lbopt.sgd_step.8bit", 1, {lr1, step1, f("nesterov", 1.0)}, LBOPT_ERR_DTYPE,
         "'nesterov': type DOUBLE, lbopt.sgd_step.8bit takes BOOL"},
        {"lbopt.lion_step.8bit", 1, {lr1, step1, i64("beta1", 1)}, LBOPT_ERR_DTYPE, "'beta1': type INT64"},
        {"lbopt.sgd_step.8bit", 1, {lr1, step1, f("beta1", 0.9)}, LBOPT_ERR_INVALID_VALUE,
         "unknown attribute 'beta1' for lbopt.sgd_step.8bit"},
        {"lbopt.lion_step.8bit", 1, {lr1, step1, b("amsgrad", true)}, LBOPT_ERR_INVALID_VALUE,
         "unknown attribute 'amsgrad'"},
        {"lbopt.ademamix_step.8bit", 3, {lr1}, LBOPT_ERR_INVALID_VALUE, "'step' of lbopt.ademamix_step.8bit is required"},
        {"lbopt.ademamix_step.8bit", 3, {step1}, LBOPT_ERR_INVALID_VALUE, "'lr' of lbopt.ademamix_step.8bit is required"},
        {"lbopt.lion_step_capturable.8bit", 1, {lr1}, LBOPT_ERR_INVALID_VALUE, "unknown attribute 'lr'"},
        {"lbopt.lion_step.8bit", 1, {lr1, step1, lbopt_attr{"maximize", LBOPT_ATTR_BOOL, 0, 2, nullptr}},
         LBOPT_ERR_INVALID_VALUE, "bool 2"},
        // what lbopt_step refuses, it refuses through the operator
        {"lbopt.sgd_step.8bit", 1, {lr1, step1, b("nesterov", true), f("dampening", 0.5)}, LBOPT_ERR_INVALID_VALUE,
         "LBOPT_FLAG_NESTEROV needs"},
        {"lbopt.sgd_step.8bit", 1, {lr1, step1, f("momentum", 0.0)}, LBOPT_ERR_INVALID_VALUE, "given, but a sgd step"},
        {"lbopt.sgd_step.8bit", 0, {lr1, step1}, LBOPT_ERR_NULL_POINTER,
         "slots[0].states[0].codes: tensor pointer is NULL"},
        {"lbopt.ademamix_step.8bit", 2, {lr1, step1}, LBOPT_ERR_NULL_POINTER, "tensors[6] (nu_codes): NULL"},
        {"lbopt.ademamix_step.8bit", 3, {lr1, step1, f("beta3", 1.0)}, LBOPT_ERR_INVALID_VALUE, "config.beta3 = 1"},
        {"lbopt.lion_step.8bit", 1, {f("lr", -1.0), step1}, LBOPT_ERR_INVALID_VALUE, "lr = -1"},
        {"lbopt.lion_step_capturable.8bit", 1, {}, LBOPT_ERR_INVALID_VALUE, "lr = -1", -1.0},  // read on the host
    };
    for (const Case& c : cases) {
      const std::string op_name = c.op, needle = c.needle;
      CAPTURE(op_name);
      CAPTURE(needle);
      const lbopt_op_info* op = lbopt_op_find(c.op);
      REQUIRE(op);
      const bool cap = strstr(c.op, "capturable") != nullptr;
      lr.as<double>()[0] = c.lr;
      step.as<int64_t>()[0] = 1;
      const size_t n_schema = (op->n_tensors - (cap ? 5 : 3)) / 2;
      const auto t = m.tensors(n_schema, c.n_states, cap ? &lr.t : nullptr, cap ? &step.t : nullptr);
      const uint64_t before = m.digest();
      CHECK(lbopt_op_invoke(op, t.data(), t.size(), c.attrs.data(), c.attrs.size(), nullptr) == c.status);
      CHECK_MESSAGE(std::string(lbopt_last_error()).find(c.needle) != std::string::npos,
                    std::string(lbopt_last_error()));
      CHECK(m.digest() == before);
    }
  }
}

// The generic step (ABI 0.3) for SGD, Lion and AdEMAMix, and AdamW through it:
//   * fp32 states, AdamW too: every element of the params and states against an independent double-precision
//     reference written here from the equations (100 steps, a new lr on every step; fp32_bound says how close),
//     and bit for bit against a float32 mirror of the kernels' operation order;
//   * 4-bit, 8-bit and FP8 states: the states after one step are the exact ones on the right codebook (read back
//     with the moment this file expects, not the library's), and a 100-step run stays finite and near the fp32 run;
//   * SIMD kernels bit-identical to the portable ones on every instruction set Highway can force here;
//   * AdamW through lbopt_step equals lbopt_adamw_step, lbopt_step_capturable equals lbopt_step;
//   * an invalid-input table for lbopt_step / lbopt_step_validate / lbopt_optimizer_config_validate /
//     lbopt_optimizer_states / lbopt_step_capturable (status, message naming the field, not one byte written);
//   * lbopt_optimizer_states and lbopt_optimizer_config_init.
#include <doctest/doctest.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "harness.h"
#include "simd_targets.h"

using namespace test;

namespace {

const double kNaN = NAN;
const double kInf = INFINITY;

// ------------------------------------------------------------------------------------------------------------
// Configs, and this file's own model of each optimizer's states

struct Spec {
  const char* name;
  lbopt_optimizer optimizer;
  std::function<void(lbopt_optimizer_config&)> tweak;
};

lbopt_optimizer_config config_of(const Spec& s, lbopt_state_kind kind, uint32_t extra_flags = 0) {
  lbopt_optimizer_config c;
  REQUIRE(lbopt_optimizer_config_init(&c, sizeof c, s.optimizer) == LBOPT_OK);
  c.state_kind = kind;
  if (s.tweak) s.tweak(c);
  c.flags |= extra_flags;
  return c;
}

int model_states(const lbopt_optimizer_config& c) {
  switch (c.optimizer) {
    case LBOPT_OPTIMIZER_ADAMW: return (c.flags & LBOPT_FLAG_AMSGRAD) ? 3 : 2;
    case LBOPT_OPTIMIZER_SGD: return c.momentum != 0.0 ? 1 : 0;
    case LBOPT_OPTIMIZER_LION: return 1;
    case LBOPT_OPTIMIZER_MUON: return 1;
    default: return 3;
  }
}

// Which codebook state i is on: AdamW's v and vmax are second moments (non-negative maps), AdEMAMix's nu one on
// the signed 4-bit map's non-negative codes (the unsigned map with LBOPT_FLAG_NU_LINEAR_MAP).
lbopt_moment model_moment(lbopt_optimizer o, int i, uint32_t flags = 0) {
  if (o == LBOPT_OPTIMIZER_ADAMW) return i > 0 ? LBOPT_MOMENT_SECOND : LBOPT_MOMENT_FIRST;
  if (o != LBOPT_OPTIMIZER_ADEMAMIX || i != 2) return LBOPT_MOMENT_FIRST;
  return (flags & LBOPT_FLAG_NU_LINEAR_MAP) ? LBOPT_MOMENT_SECOND : LBOPT_MOMENT_SECOND_SIGNED;
}

// The new optimizers, in the variants the tests run.
const std::vector<Spec>& new_specs() {
  using C = lbopt_optimizer_config;
  static const std::vector<Spec> specs = {
      {"sgd, momentum 0", LBOPT_OPTIMIZER_SGD, [](C& c) { c.momentum = 0.0; }},
      {"sgd, momentum 0, weight decay, maximize", LBOPT_OPTIMIZER_SGD,
       [](C& c) { c.momentum = 0.0; c.weight_decay = 0.05; c.flags = LBOPT_FLAG_MAXIMIZE; }},
      {"sgd, momentum 0.9", LBOPT_OPTIMIZER_SGD, nullptr},
      {"sgd, momentum 0.9, dampening 0.3", LBOPT_OPTIMIZER_SGD, [](C& c) { c.dampening = 0.3; }},
      {"sgd, nesterov", LBOPT_OPTIMIZER_SGD, [](C& c) { c.flags = LBOPT_FLAG_NESTEROV; }},
      {"sgd, momentum 0.8, weight decay", LBOPT_OPTIMIZER_SGD, [](C& c) { c.momentum = 0.8; c.weight_decay = 0.05; }},
      {"sgd, momentum, maximize", LBOPT_OPTIMIZER_SGD, [](C& c) { c.flags = LBOPT_FLAG_MAXIMIZE; }},
      {"sgd, nesterov, weight decay, maximize", LBOPT_OPTIMIZER_SGD,
       [](C& c) { c.weight_decay = 0.02; c.flags = LBOPT_FLAG_NESTEROV | LBOPT_FLAG_MAXIMIZE; }},
      {"lion", LBOPT_OPTIMIZER_LION, nullptr},
      {"lion, weight decay 0.5", LBOPT_OPTIMIZER_LION, [](C& c) { c.weight_decay = 0.5; }},
      {"lion, betas 0.95 / 0.98, maximize", LBOPT_OPTIMIZER_LION,
       [](C& c) { c.beta1 = 0.95; c.beta2 = 0.98; c.flags = LBOPT_FLAG_MAXIMIZE; }},
      {"muon", LBOPT_OPTIMIZER_MUON, nullptr},
      {"muon, nesterov", LBOPT_OPTIMIZER_MUON, [](C& c) { c.flags = LBOPT_FLAG_NESTEROV; }},
      {"muon, momentum 0.3 (both lerp branches), nesterov, maximize", LBOPT_OPTIMIZER_MUON,
       [](C& c) { c.momentum = 0.3; c.flags = LBOPT_FLAG_NESTEROV | LBOPT_FLAG_MAXIMIZE; }},
      {"ademamix", LBOPT_OPTIMIZER_ADEMAMIX, nullptr},
      {"ademamix, nu on the linear map", LBOPT_OPTIMIZER_ADEMAMIX, [](C& c) { c.flags = LBOPT_FLAG_NU_LINEAR_MAP; }},
      {"ademamix, warm-ups t_alpha 40, t_beta3 60", LBOPT_OPTIMIZER_ADEMAMIX,
       [](C& c) { c.t_alpha = 40; c.t_beta3 = 60; }},
      {"ademamix, warm-ups past the run (300, 250), alpha 8, weight decay 0.1, maximize", LBOPT_OPTIMIZER_ADEMAMIX,
       [](C& c) {
         c.t_alpha = 300; c.t_beta3 = 250; c.alpha = 8; c.weight_decay = 0.1; c.beta3 = 0.999;
         c.flags = LBOPT_FLAG_MAXIMIZE;
       }},
  };
  return specs;
}

// A new lr on every step.
double lr_at(lbopt_optimizer o, int64_t t) {
  const double base = o == LBOPT_OPTIMIZER_SGD ? 3e-3 : 1e-3;
  return base * (1.0 + 0.5 * sin(0.9 * double(t)));
}

// ------------------------------------------------------------------------------------------------------------
// The library's side: one slot with its param, grad and up to three states

ref::Dtype ref_dtype(DLDataType t) { return t.bits == 32 ? ref::kF32 : (t.code == kDLBfloat ? ref::kBF16 : ref::kF16); }

struct LibSlot {
  lbopt_state_kind kind;
  int64_t n;
  int n_states;
  Buffer p, g;
  std::unique_ptr<State> st[LBOPT_MAX_STATES];

  LibSlot(lbopt_state_kind k, int64_t numel, int states, DLDataType pt = f32(), DLDataType gt = f32())
      : kind(k), n(numel), n_states(states), p(pt, {numel}), g(gt, {numel}) {
    for (auto& s : st) {
      s = std::make_unique<State>(k, numel);
      REQUIRE(lbopt_state_init(k, numel, s->view(), nullptr) == LBOPT_OK);
    }
  }
  LibSlot(const LibSlot&) = delete;
  LibSlot& operator=(const LibSlot&) = delete;

  lbopt_slot slot(int64_t step) const {
    lbopt_slot s{};
    s.struct_size = sizeof s;
    s.param = &p.t;
    s.grad = &g.t;
    for (int k = 0; k < n_states; ++k) s.states[k] = st[k]->view();
    s.step = step;
    return s;
  }
  // Params and the codes and scales of every state (the unused ones too: they must stay as they are).
  uint64_t digest() const {
    uint64_t d = hash(p);
    for (int k = 0; k < LBOPT_MAX_STATES; ++k) {
      d = d * 1000003u ^ hash(*st[k]->codes);
      if (st[k]->scales) d = d * 1000003u ^ hash(*st[k]->scales);
    }
    return d;
  }
  std::vector<double> params() const {
    std::vector<double> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out[size_t(i)] = ref::load(ref_dtype(p.t.dtype), p.as<void>(), i);
    return out;
  }
  // State k read back with lbopt_dequantize on the given codebook.
  std::vector<double> state(int k, lbopt_moment moment) const {
    Buffer out(f32(), {n});
    const lbopt_status st_ = lbopt_dequantize(kind, moment, st[k]->view(), &out.t, nullptr);
    REQUIRE_MESSAGE(st_ == LBOPT_OK, lbopt_last_error());
    return std::vector<double>(out.as<float>(), out.as<float>() + n);
  }
  void set_grads(const std::vector<double>& values) {
    for (int64_t i = 0; i < n; ++i) store(ref_dtype(g.t.dtype), g.as<void>(), i, values[size_t(i)]);
  }
};

// Per element a scale spread over two and a half decades and a bias (so that momentum matters), then fresh noise
// on every step; float32 values.
struct Grads {
  int64_t n, steps;
  std::vector<double> values;  // [steps][n]
  Grads(int64_t numel, int64_t n_steps, uint64_t seed) : n(numel), steps(n_steps), values(size_t(numel * n_steps)) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> nd;
    std::uniform_real_distribution<double> u(-2.0, 0.5);
    std::vector<double> scale(static_cast<size_t>(n)), bias(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      scale[size_t(i)] = pow(10.0, u(rng));
      bias[size_t(i)] = 0.5 * nd(rng);
    }
    for (int64_t t = 0; t < steps; ++t)
      for (int64_t i = 0; i < n; ++i)
        values[size_t(t * n + i)] = double(float(scale[size_t(i)] * (bias[size_t(i)] + nd(rng))));
  }
  std::vector<double> at(int64_t step) const {  // step from 1
    return std::vector<double>(values.begin() + (step - 1) * n, values.begin() + step * n);
  }
};

std::vector<double> initial_params(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  std::vector<double> p(static_cast<size_t>(n));
  for (double& x : p) x = double(float(nd(rng)));
  return p;
}

// ------------------------------------------------------------------------------------------------------------
// The reference: the equations in double precision

// Alongside every value the reference keeps its magnitude: the same recurrence run on the absolute values of its
// terms (and on the magnitudes of the values it reads), e.g. m = b m + (1 - b) g beside M = b M + (1 - b) |g|.
// Every float32 operation rounds to within half an ulp of its result, and a result is never larger than the sum
// of its terms' sizes, so a float32 run can only be held to (a small multiple of) 2^-24 of this magnitude
// per operation: where terms cancel (a signed EMA or a param passing through zero) the value itself is a poor
// yardstick. Without cancellation (nu, v, vmax; a param that keeps its sign and hardly moves) the magnitude is
// the value itself.
struct Ref {
  std::vector<double> p, s[LBOPT_MAX_STATES];
  std::vector<double> p_mag, s_mag[LBOPT_MAX_STATES];
  std::vector<char> lion_near_zero;  // Lion: c came within 1e-6 (relative to its terms) of zero at some step
  explicit Ref(std::vector<double> p0) : p(std::move(p0)), lion_near_zero(p.size(), 0) {
    p_mag.resize(p.size());
    for (size_t i = 0; i < p.size(); ++i) p_mag[i] = fabs(p[i]);
    for (auto& v : s) v.assign(p.size(), 0.0);
    for (auto& v : s_mag) v.assign(p.size(), 0.0);
  }
};

double sign_of(double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0; }

// One step. fp32: params and states are stored as float32 after the step (the storage of an fp32 run);
// otherwise everything stays exact.
void ref_step(const lbopt_optimizer_config& c, double lr, int64_t t, const std::vector<double>& grad, Ref& r,
              bool fp32) {
  const double gf = (c.flags & LBOPT_FLAG_MAXIMIZE) ? -1.0 : 1.0;
  const double td = double(t);
  const auto stored = [fp32](double x) { return fp32 ? double(float(x)) : x; };
  const double b1 = c.beta1, b2 = c.beta2, b3 = c.beta3, wd = c.weight_decay;
  // AdEMAMix's warm-ups
  const double alpha_t = c.t_alpha > 0 ? std::min(td * c.alpha / c.t_alpha, c.alpha) : c.alpha;
  double beta3_t = b3;
  if (c.t_beta3 > 0) {
    const double f = td / c.t_beta3;
    beta3_t = std::min(exp(log(b1) * log(b3) / ((1 - f) * log(b3) + f * log(b1))), b3);
  }
  const double bc1 = 1 - pow(b1, td), bc2 = 1 - pow(b2, td);
  for (size_t i = 0; i < r.p.size(); ++i) {
    double g = gf * grad[i], G = fabs(grad[i]);
    double &p = r.p[i], &P = r.p_mag[i];
    switch (c.optimizer) {
      case LBOPT_OPTIMIZER_SGD: {
        if (wd != 0) {
          g = g + wd * p;
          G = G + wd * P;
        }
        if (c.momentum != 0) {
          double &buf = r.s[0][i], &B = r.s_mag[0][i];
          buf = t == 1 ? g : c.momentum * buf + (1 - c.dampening) * g;
          B = t == 1 ? G : c.momentum * B + (1 - c.dampening) * G;
          const bool nesterov = c.flags & LBOPT_FLAG_NESTEROV;
          g = nesterov ? g + c.momentum * buf : buf;
          G = nesterov ? G + c.momentum * B : B;
          buf = stored(buf);
        }
        p = p - lr * g;
        P = P + lr * G;
        break;
      }
      case LBOPT_OPTIMIZER_LION: {
        double &m = r.s[0][i], &M = r.s_mag[0][i];
        p = p * (1 - lr * wd);
        P = P * (1 - lr * wd) + lr;
        const double cc = b1 * m + (1 - b1) * g;
        if (fabs(cc) <= 1e-6 * (fabs(b1 * m) + fabs((1 - b1) * g))) r.lion_near_zero[i] = 1;
        p = p - lr * sign_of(cc);
        m = stored(b2 * m + (1 - b2) * g);
        M = b2 * M + (1 - b2) * G;
        break;
      }
      case LBOPT_OPTIMIZER_MUON: {  // p: the direction (its value in is not read)
        double &buf = r.s[0][i], &B = r.s_mag[0][i];
        const double mu = c.momentum;
        const bool nesterov = c.flags & LBOPT_FLAG_NESTEROV;
        buf = mu * buf + (1 - mu) * g;
        B = mu * B + (1 - mu) * G;
        p = nesterov ? (1 - mu) * g + mu * buf : buf;
        P = nesterov ? (1 - mu) * G + mu * B : B;
        buf = stored(buf);
        break;
      }
      case LBOPT_OPTIMIZER_ADEMAMIX: {
        double &m1 = r.s[0][i], &m2 = r.s[1][i], &nu = r.s[2][i];
        double &M1 = r.s_mag[0][i], &M2 = r.s_mag[1][i], &NU = r.s_mag[2][i];
        m1 = b1 * m1 + (1 - b1) * g;
        m2 = beta3_t * m2 + (1 - beta3_t) * g;
        nu = b2 * nu + (1 - b2) * g * g;
        M1 = b1 * M1 + (1 - b1) * G;
        M2 = beta3_t * M2 + (1 - beta3_t) * G;
        NU = nu;
        const double denom = sqrt(nu) / sqrt(bc2) + c.eps;
        const double u = (m1 / bc1 + alpha_t * m2) / denom + wd * p;
        p = p - lr * u;
        P = P + lr * ((M1 / bc1 + alpha_t * M2) / denom + wd * P);
        m1 = stored(m1);
        m2 = stored(m2);
        nu = stored(nu);
        break;
      }
      case LBOPT_OPTIMIZER_ADAMW: {  // torch.optim.AdamW / Adam (coupled decay), AMSGrad
        double &m = r.s[0][i], &v = r.s[1][i], &vmax = r.s[2][i];
        double &M = r.s_mag[0][i], &V = r.s_mag[1][i], &VMAX = r.s_mag[2][i];
        if (c.flags & LBOPT_FLAG_ADAM_COUPLED_DECAY) {
          g = g + wd * p;
          G = G + wd * P;
        } else {
          p = p * (1 - lr * wd);
          P = P * (1 - lr * wd);
        }
        m = b1 * m + (1 - b1) * g;
        M = b1 * M + (1 - b1) * G;
        v = b2 * v + (1 - b2) * g * g;
        V = v;
        double vu = v;
        if (c.flags & LBOPT_FLAG_AMSGRAD) vu = VMAX = vmax = std::max(vmax, v);
        const double denom = sqrt(vu) / sqrt(bc2) + c.eps;
        p = p - lr / bc1 * m / denom;
        P = P + lr / bc1 * M / denom;
        m = stored(m);
        v = stored(v);
        vmax = stored(vmax);
        break;
      }
      default: FAIL("ref_step: not an optimizer this file knows");
    }
    p = stored(p);
  }
}

// The float32 mirror: the same steps in float32 in the kernels' operation order (kernels/optim/*.h): every
// coefficient rounded to float32 once per step from its double, a multiply-add fused (fmaf) where the kernel fuses
// it. Every operation is an IEEE one (correctly rounded), so the library's fp32 run must equal it bit for bit;
// that pins the float32 rounding the double reference can only bound (see fp32_bound below).
struct Mirror {
  std::vector<float> p, s[LBOPT_MAX_STATES];
  explicit Mirror(const std::vector<double>& p0) : p(p0.begin(), p0.end()) {
    for (auto& v : s) v.assign(p.size(), 0.0f);
  }
};

void mirror_step(const lbopt_optimizer_config& c, double lr, int64_t t, const std::vector<double>& grad, Mirror& r) {
  const float gf = (c.flags & LBOPT_FLAG_MAXIMIZE) ? -1.0f : 1.0f;
  const double td = double(t), wd = c.weight_decay;
  const double bc1 = 1.0 - pow(c.beta1, td), bc2 = 1.0 - pow(c.beta2, td);
  const float neg_lr = float(-lr), decay = float(1.0 - lr * wd), wd_f = float(wd), eps = float(c.eps);
  const float b1 = float(c.beta1), omb1 = float(1.0 - c.beta1), b2 = float(c.beta2), omb2 = float(1.0 - c.beta2);
  double beta3 = c.beta3;  // AdEMAMix's warm-ups, as ref_step computes them
  if (c.t_beta3 > 0) {
    const double ln1 = log(c.beta1), ln3 = log(c.beta3), f = td / c.t_beta3;
    beta3 = std::min(exp(ln1 * ln3 / ((1.0 - f) * ln3 + f * ln1)), c.beta3);
  }
  const float b3 = float(beta3), omb3 = float(1.0 - beta3);
  const float alpha = float(c.t_alpha > 0 ? std::min(td * c.alpha / c.t_alpha, c.alpha) : c.alpha);
  const auto sign = [](float x) { return x == 0.0f ? x : copysignf(1.0f, x); };
  for (size_t i = 0; i < r.p.size(); ++i) {
    float g = float(grad[i]) * gf, &p = r.p[i];
    float &s0 = r.s[0][i], &s1 = r.s[1][i], &s2 = r.s[2][i];
    switch (c.optimizer) {
      case LBOPT_OPTIMIZER_SGD:
        if (wd != 0) g = fmaf(wd_f, p, g);
        if (c.momentum != 0) {
          const float mom = float(c.momentum);
          s0 = t == 1 ? g : fmaf(float(1.0 - c.dampening), g, s0 * mom);
          g = (c.flags & LBOPT_FLAG_NESTEROV) ? fmaf(mom, s0, g) : s0;
        }
        p = fmaf(neg_lr, g, p);
        break;
      case LBOPT_OPTIMIZER_LION: {
        p = p * decay;
        const float cc = fmaf(omb1, g, s0 * b1);
        p = fmaf(neg_lr, sign(cc), p);
        s0 = fmaf(omb2, g, s0 * b2);
        break;
      }
      case LBOPT_OPTIMIZER_MUON: {
        const auto lerp = [](float start, float end, float w) {  // torch.lerp
          return fabsf(w) < 0.5f ? fmaf(w, end - start, start) : fmaf(w - 1.0f, end - start, end);
        };
        s0 = lerp(s0, g, float(1.0 - c.momentum));
        p = (c.flags & LBOPT_FLAG_NESTEROV) ? lerp(g, s0, float(c.momentum)) : s0;
        break;
      }
      case LBOPT_OPTIMIZER_ADEMAMIX: {
        s0 = fmaf(omb1, g, s0 * b1);
        s1 = fmaf(omb3, g, s1 * b3);
        s2 = fmaf(omb2 * g, g, s2 * b2);
        const float denom = fmaf(sqrtf(s2), float(1.0 / sqrt(bc2)), eps);
        float u = fmaf(alpha, s1, s0 * float(1.0 / bc1)) / denom;
        u = fmaf(wd_f, p, u);
        p = fmaf(neg_lr, u, p);
        break;
      }
      case LBOPT_OPTIMIZER_ADAMW: {
        const bool coupled = c.flags & LBOPT_FLAG_ADAM_COUPLED_DECAY;
        if (coupled) g = fmaf(wd_f, p, g);
        s0 = omb1 < 0.5f ? fmaf(omb1, g - s0, s0) : fmaf(-(1.0f - omb1), g - s0, g);  // torch.lerp
        s1 = fmaf(omb2 * g, g, s1 * b2);
        float root = sqrtf(s1);
        if (c.flags & LBOPT_FLAG_AMSGRAD) {
          s2 = s2 >= s1 ? s2 : s1;
          root = sqrtf(s2);
        }
        if (!coupled) p = p * decay;
        const float denom = root / float(pow(bc2, 0.5)) + eps;
        p = p + float(-(lr / bc1)) * s0 / denom;
        break;
      }
      default: FAIL("mirror_step: not an optimizer this file knows");
    }
  }
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, fabs(x));
  return m;
}

// The per-element bound of an fp32 run against the double reference, for the params (k = -1) or state k.
//
// 1e-6 (the requirement) where float32 can meet it: SGD's params and buffer, Lion's params without weight decay,
// the short-memory first moments (AdamW's m, AdEMAMix's m1). Elsewhere float32 carries errors the double reference
// cannot share; the float32 mirror pins them exactly (bit for bit), so here only their size is bounded, by 3e-6:
//  * an EMA with a long memory (coefficient >= 0.95: AdamW's v and vmax, AdEMAMix's nu and slow m2, Lion's m).
//    (1) The kernel multiplies by float32 coefficients: float(0.999) = 0.999 (1 + 1.29e-8), float(1 - 0.999) =
//    1e-3 (1 + 4.75e-8), float(0.9999) = 0.9999 (1 - 1.66e-8), float(0.99) = 0.99 (1 + 0.96e-8). A term that
//    entered k steps ago carries beta^k, off by k times that; after 100 steps of stationary gradients (mean age
//    ~49) v is off by ~6.8e-7, one sign on every element (measured: a mean of ~7 ulps). (2) The kernel rounds
//    twice a step (beta * v, then the fma) where the reference rounds once; the extra rounding moves the value by
//    up to half an ulp, so the two land on different floats about a quarter of the time and drift apart by a
//    random walk of ~sqrt(100 / 4) = 5 ulps that such an EMA does not forget (measured sigma ~3 ulps, ~3e-7).
//  * a param multiplied by the decoupled decay 1 - lr wd (AdamW, Lion with weight decay): the kernel rounds
//    p * float(1 - lr wd), then p + update again, two roundings of p a step against the reference's one, the same
//    random walk (measured sigma ~3.5e-7 relative), plus float(1 - lr wd)'s own error of up to 3e-8 a step.
//  * a param whose update reads one of those EMAs (AdamW and Adam divide by sqrt(v), AdEMAMix by sqrt(nu) and
//    mixes in m2): each step's update inherits up to half of v's relative error and all of m2's, so p's error
//    grows to that share of its movement (measured up to 0.89e-6 for AdEMAMix, 0.45e-6 for Adam).
// Measured worst of the 3e-6 ones (here / tests/python/test_optimizers.py's 5000-element tensors): AdamW params
// 1.74e-6 / 1.92e-6, v and vmax 1.65e-6 / 1.82e-6, nu 1.53e-6 / 1.82e-6, m2 1.46e-6 / 1.94e-6, Lion's m 1.01e-6 /
// 1.24e-6, Lion's params with weight decay 1.36e-6 / 1.43e-6; with the reference given the float32 coefficients
// and the decay's extra rounding, all of them here drop to <= 0.97e-6. 3e-6 is the systematic part (<= ~0.9e-6
// with these gradients) plus over 5 sigma of the random walk.
double fp32_bound(const lbopt_optimizer_config& c, int k) {
  const auto by_memory = [](double beta) { return beta >= 0.95 ? 3e-6 : 1e-6; };
  switch (c.optimizer) {
    case LBOPT_OPTIMIZER_SGD: return by_memory(c.momentum);  // the params read the buffer
    case LBOPT_OPTIMIZER_LION: return k < 0 ? (c.weight_decay != 0 ? 3e-6 : 1e-6) : by_memory(c.beta2);
    case LBOPT_OPTIMIZER_MUON: return by_memory(c.momentum);  // the direction reads the buffer
    default: return k == 0 ? by_memory(c.beta1) : 3e-6;  // AdamW, AdEMAMix: only m / m1 is a short EMA
  }
}

// One run of the library: the same initial params and grads for every kind.
struct LibRun {
  std::unique_ptr<LibSlot> slot;
  std::vector<std::vector<double>> states_after_1;  // every state after step 1, read with model_moment
  bool finite = true;
};

LibRun run_library(const lbopt_optimizer_config& cfg, const std::vector<double>& p0, const Grads& grads) {
  LibRun out;
  const int ns = model_states(cfg);
  out.slot = std::make_unique<LibSlot>(cfg.state_kind, int64_t(p0.size()), ns);
  for (size_t i = 0; i < p0.size(); ++i) out.slot->p.as<float>()[i] = float(p0[i]);
  for (int64_t t = 1; t <= grads.steps; ++t) {
    out.slot->set_grads(grads.at(t));
    const lbopt_slot s = out.slot->slot(t);
    const lbopt_status st = lbopt_step(&cfg, lr_at(cfg.optimizer, t), &s, 1, nullptr);
    REQUIRE_MESSAGE(st == LBOPT_OK, lbopt_last_error());
    if (t == 1)
      for (int k = 0; k < ns; ++k)
        out.states_after_1.push_back(out.slot->state(k, model_moment(cfg.optimizer, k, cfg.flags)));
  }
  for (double x : out.slot->params()) out.finite = out.finite && std::isfinite(x);
  for (int k = 0; k < ns; ++k)
    for (double x : out.slot->state(k, model_moment(cfg.optimizer, k, cfg.flags)))
      out.finite = out.finite && std::isfinite(x);
  return out;
}

constexpr int64_t kRunNumel = 1000;  // partial last block in every kind (4-bit: 7 * 128 + 104; 256: 3 * 256 + 232)
constexpr int64_t kRunSteps = 100;

}  // namespace

TEST_SUITE("optimizers") {
  TEST_CASE("fp32 states: 100 steps, a new lr on every step, match the double-precision reference") {
    // SGD, Lion and AdEMAMix in every variant above, and AdamW / Adam / AMSGrad through the same lbopt_step
    using C = lbopt_optimizer_config;
    std::vector<Spec> specs = new_specs();
    specs.push_back({"adamw", LBOPT_OPTIMIZER_ADAMW, nullptr});
    specs.push_back({"adamw, amsgrad, weight decay 0.1, maximize", LBOPT_OPTIMIZER_ADAMW,
                     [](C& c) { c.flags = LBOPT_FLAG_AMSGRAD | LBOPT_FLAG_MAXIMIZE; c.weight_decay = 0.1; }});
    specs.push_back({"adam (coupled decay), betas 0.8 / 0.99", LBOPT_OPTIMIZER_ADAMW,
                     [](C& c) { c.flags = LBOPT_FLAG_ADAM_COUPLED_DECAY; c.beta1 = 0.8; c.beta2 = 0.99; }});
    for (size_t si = 0; si < specs.size(); ++si) {
      const Spec& spec = specs[si];
      const std::string name = spec.name;
      CAPTURE(name);
      const lbopt_optimizer_config cfg = config_of(spec, LBOPT_STATE_FP32);
      const std::vector<double> p0 = initial_params(kRunNumel, 100 + si);
      const Grads grads(kRunNumel, kRunSteps, 200 + si);
      const LibRun lib = run_library(cfg, p0, grads);
      Ref ref(p0);
      Mirror mirror(p0);
      for (int64_t t = 1; t <= kRunSteps; ++t) {
        ref_step(cfg, lr_at(cfg.optimizer, t), t, grads.at(t), ref, true);
        mirror_step(cfg, lr_at(cfg.optimizer, t), t, grads.at(t), mirror);
      }
      CHECK(lib.finite);

      // Every element of the params and of every state, per element: |lib - ref| / max(|ref|, its magnitude) (see
      // Ref), and bit for bit against the float32 mirror.
      std::string report;
      const auto compare = [&](const std::string& what, const std::vector<double>& got, const std::vector<double>& want,
                               const std::vector<double>& mag, const std::vector<float>& mirrored, double bound,
                               bool skip_lion_ties) {
        double worst = 0;
        size_t worst_i = 0;
        int64_t floored = 0, over = 0, not_bitwise = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          not_bitwise += float(got[i]) != mirrored[i] || std::signbit(float(got[i])) != std::signbit(mirrored[i]);
          if (skip_lion_ties && ref.lion_near_zero[i]) continue;
          const double err = fabs(got[i] - want[i]) / std::max(fabs(want[i]), mag[i]);
          if (err > worst) {
            worst = err;
            worst_i = i;
          }
          over += err > bound;
          floored += mag[i] > 2 * fabs(want[i]);
        }
        report += "\n  " + what + ": worst " + std::to_string(worst * 1e6) + "e-6 (bound " +
                  std::to_string(bound * 1e6) + "e-6; element " + std::to_string(worst_i) + ", ref " +
                  std::to_string(want[worst_i]) + ", magnitude " + std::to_string(mag[worst_i]) + "), " +
                  std::to_string(floored) + " elements whose magnitude is over 2x |ref|";
        CHECK_MESSAGE(over == 0, what, ": ", over, " elements over ", bound, " relative, the worst ", worst);
        CHECK_MESSAGE(not_bitwise == 0, what, ": ", not_bitwise, " elements differ from the float32 mirror");
      };
      const std::vector<double> got = lib.slot->params();
      compare("params", got, ref.p, ref.p_mag, mirror.p, fp32_bound(cfg, -1), true);
      for (int k = 0; k < model_states(cfg); ++k)
        compare("state " + std::to_string(k), lib.slot->state(k, model_moment(cfg.optimizer, k, cfg.flags)), ref.s[k],
                ref.s_mag[k], mirror.s[k], fp32_bound(cfg, k), false);
      // Lion: elements whose sign(c) came within 1e-6 of a tie at some step are left out of the params' comparison
      // with the double reference (float and double may pick different signs there: a 2 lr jump); the mirror
      // still covers them. Measured: none of these runs has one.
      int64_t excluded = 0;
      for (char x : ref.lion_near_zero) excluded += x;
      CHECK(excluded <= 5);  // of 1000
      // the run did move the params (so the bounds are real ones): by far more than the error
      double moved = 0;
      for (size_t i = 0; i < got.size(); ++i) moved = std::max(moved, fabs(ref.p[i] - p0[i]));
      const double moved_rel = moved / max_abs(ref.p);
      CHECK(moved_rel > 1e-3);
      MESSAGE(name, ": Lion near-ties left out ", excluded, ", largest move / max|p| ", moved_rel, report);
    }
  }
}

namespace {

// The largest error of one quantization relative to its block's absmax, from the reference's own codebooks: half
// the widest gap between neighbouring values, and for a second moment the distance from 0 to the smallest code
// (a positive value never lands on 0; the unsigned 4-bit map has no 0 at all). 4-bit
// LBOPT_MOMENT_SECOND_SIGNED: the signed map's non-negative values.
double quant_tol(lbopt_state_kind kind, lbopt_moment moment) {
  const bool second = moment != LBOPT_MOMENT_FIRST;
  std::vector<double> v = ref::table(kind, moment);
  if (kind == LBOPT_STATE_FP8) {  // codes 0x7f / 0xff (NaN in e4m3fn) are never stored: |values| <= 448
    v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !(fabs(x) <= 448.0); }), v.end());
    for (double& x : v) x /= 448.0;  // scale = absmax / 448
  }
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  double gap = 0;
  for (size_t i = 0; i + 1 < v.size(); ++i)
    if (!second || v[i] >= 0) gap = std::max(gap, (v[i + 1] - v[i]) / 2);
  if (second) {
    double smallest = INFINITY;
    for (double x : v)
      if (x > 0) smallest = std::min(smallest, x);
    gap = std::max(gap, smallest);
  }
  return gap * 1.001 + 1e-7;
}

// Per block: max |got - want| / max |want| over the block.
double block_rel_error(const std::vector<double>& got, const std::vector<double>& want, int64_t block) {
  double worst = 0;
  for (size_t b = 0; b < want.size(); b += size_t(block)) {
    const size_t e = std::min(want.size(), b + size_t(block));
    double absmax = 0, err = 0;
    for (size_t i = b; i < e; ++i) {
      absmax = std::max(absmax, fabs(want[i]));
      err = std::max(err, fabs(got[i] - want[i]));
    }
    worst = std::max(worst, absmax > 0 ? err / absmax : err);
  }
  return worst;
}

double rms(const std::vector<double>& a, const std::vector<double>* minus = nullptr) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = a[i] - (minus ? (*minus)[i] : 0.0);
    s += d * d;
  }
  return sqrt(s / double(a.size()));
}

}  // namespace

TEST_SUITE("optimizers") {
  TEST_CASE("4-bit, 8-bit and fp8 states: exact after one step on the right codebook, a 100-step run near fp32") {
    for (size_t si = 0; si < new_specs().size(); ++si) {
      const Spec& spec = new_specs()[si];
      const std::vector<double> p0 = initial_params(kRunNumel, 100 + si);
      const Grads grads(kRunNumel, kRunSteps, 200 + si);
      const LibRun full = run_library(config_of(spec, LBOPT_STATE_FP32), p0, grads);
      const std::vector<double> p32 = full.slot->params();
      // the exact states after step 1 (from zero states)
      const lbopt_optimizer_config cfg32 = config_of(spec, LBOPT_STATE_FP32);
      Ref exact(p0);
      ref_step(cfg32, lr_at(cfg32.optimizer, 1), 1, grads.at(1), exact, false);
      std::vector<double> moved_by(p0.size());
      for (size_t i = 0; i < p0.size(); ++i) moved_by[i] = p32[i] - p0[i];
      const double movement = rms(moved_by);
      for (lbopt_state_kind kind : {LBOPT_STATE_4BIT, LBOPT_STATE_8BIT, LBOPT_STATE_FP8}) {
        const std::string name = std::string(spec.name) + ", " + lbopt_state_kind_name(kind);
        CAPTURE(name);
        const lbopt_optimizer_config cfg = config_of(spec, kind);
        const LibRun q = run_library(cfg, p0, grads);
        CHECK(q.finite);
        // step 1: each state is the exact one quantized on its codebook, read back on the codebook its moment says:
        // within half a code step of it, or a whole one where the codes round stochastically (by default the first
        // moments of SGD, Lion and AdEMAMix on 4-bit and FP8 states)
        const int64_t block = kind == LBOPT_STATE_4BIT ? 128 : 256;
        std::string state_errors;
        for (int k = 0; k < model_states(cfg); ++k) {
          const lbopt_moment moment = model_moment(cfg.optimizer, k, cfg.flags);
          const bool second = moment != LBOPT_MOMENT_FIRST;
          const double err = block_rel_error(q.states_after_1[size_t(k)], exact.s[k], block);
          const bool stochastic = !second && cfg.optimizer != LBOPT_OPTIMIZER_ADAMW && kind != LBOPT_STATE_8BIT;
          const double tol = quant_tol(kind, moment) * (stochastic ? 2 : 1);
          state_errors += " " + std::to_string(err) + " (tol " + std::to_string(tol) + ")";
          CHECK_MESSAGE(err <= tol, "state ", k, " after step 1: ", err, " of its block's absmax, tolerance ", tol);
        }
        // 100 steps: near the fp32 run, compared with how far the fp32 run moved the params
        const std::vector<double> pq = q.slot->params();
        const double dev = rms(pq, &p32) / movement;
        double dev_max = 0;
        for (size_t i = 0; i < pq.size(); ++i) dev_max = std::max(dev_max, fabs(pq[i] - p32[i]));
        dev_max /= max_abs(moved_by);
        std::string state_dev;
        double max_state_dev = 0;
        for (int k = 0; k < model_states(cfg); ++k) {
          const std::vector<double> s32 = full.slot->state(k, model_moment(cfg.optimizer, k, cfg.flags));
          const std::vector<double> sq = q.slot->state(k, model_moment(cfg.optimizer, k, cfg.flags));
          const double d = rms(sq, &s32) / rms(s32);
          max_state_dev = std::max(max_state_dev, d);
          state_dev += " " + std::to_string(d);
        }
        INFO("step-1 state errors" << state_errors << "; params vs the fp32 run after 100 steps: rms " << dev
             << " of the fp32 run's movement (max " << dev_max << "); states, rms relative to fp32's:" << state_dev);
        // Loose: low-bit runs drift (a 4-bit slow EMA barely moves: AdEMAMix's m2 increments are far below its
        // code spacing), but they stay within the fp32 run's own movement, and far closer with 8 bits
        const bool four = kind == LBOPT_STATE_4BIT;
        CHECK(dev <= (four ? (cfg.optimizer == LBOPT_OPTIMIZER_ADEMAMIX ? 1.0 : 0.5) : 0.25));
        CHECK(max_state_dev <= (four ? 0.7 : 0.4));
        if (model_states(cfg) > 0) CHECK(dev > 1e-4);  // the states really were quantized
      }
    }
  }
}

namespace {

// ------------------------------------------------------------------------------------------------------------
// SIMD vs portable

struct ParamVariant {
  const char* name;
  DLDataType dtype;
  uint32_t flags;
};

const ParamVariant kParamVariants[] = {{"float32", {kDLFloat, 32, 1}, 0},
                                       {"bfloat16", {kDLBfloat, 16, 1}, 0},
                                       {"bfloat16 + stochastic rounding", {kDLBfloat, 16, 1},
                                        LBOPT_FLAG_BF16_STOCHASTIC_ROUND},
                                       {"float16", {kDLFloat, 16, 1}, 0}};
const DLDataType kGradDtypes[] = {{kDLFloat, 32, 1}, {kDLBfloat, 16, 1}, {kDLFloat, 16, 1}};

void shift_one_element(Buffer& b) {
  const size_t elem = b.t.dtype.bits / 8;
  memmove(static_cast<uint8_t*>(b.t.data) + elem, b.t.data, size_t(b.t.shape[0]) * elem);
  b.t.byte_offset = elem;
}

// Three steps with a new lr each from random params and grads (tiny ones, and NaN / Inf in some runs); odd sizes
// on buffers one element off their alignment. The digest of params, codes and scales.
uint64_t simd_case(const lbopt_optimizer_config& cfg, const ParamVariant& pv, DLDataType gt, int64_t n,
                   bool nonfinite) {
  LibSlot r(cfg.state_kind, n, model_states(cfg), pv.dtype, gt);
  std::mt19937_64 rng(uint64_t(n) * 131 + uint64_t(cfg.optimizer) * 7 + uint64_t(cfg.state_kind));
  std::normal_distribution<double> nd;
  const ref::Dtype pd = ref_dtype(pv.dtype), gd = ref_dtype(gt);
  for (int64_t i = 0; i < n; ++i) {
    store(pd, r.p.t.data, i, ref::to_dtype(pd, 0.5 * nd(rng)));
    double gi = (i % 97 == 0 ? 1e-30 : (i % 89 == 0 ? 1e-6 : 0.01)) * nd(rng);
    if (nonfinite && i % 301 == 5) gi = i % 2 ? NAN : -INFINITY;
    store(gd, r.g.t.data, i, ref::to_dtype(gd, gi));
  }
  if (n % 2) {
    shift_one_element(r.p);
    shift_one_element(r.g);
    for (auto& s : r.st) shift_one_element(*s->codes);
  }
  lbopt_optimizer_config c = cfg;
  c.flags |= pv.flags;
  c.seed = 0x5eed0000u + uint64_t(n);
  for (int64_t t = 1; t <= 3; ++t) {
    const lbopt_slot s = r.slot(t);
    const lbopt_status st = lbopt_step(&c, 1e-2 * double(t), &s, 1, nullptr);
    REQUIRE_MESSAGE(st == LBOPT_OK, lbopt_last_error());
  }
  return r.digest();
}

struct SimdCase {
  std::string name;
  uint64_t digest;
};

std::vector<SimdCase> simd_cases() {
  std::vector<SimdCase> out;
  for (const Spec& spec : new_specs())
    for (int k = 0; k < 4; ++k)
      for (const ParamVariant& pv : kParamVariants)
        for (const DLDataType& gt : kGradDtypes)
          for (int64_t n : {int64_t(256), int64_t(1000), int64_t(2048 + 1), int64_t(4096 + 77)})
            for (bool nonfinite : {false, true}) {
              if (nonfinite && n != 1000) continue;
              const lbopt_optimizer_config cfg = config_of(spec, lbopt_state_kind(k));
              char gname[16];
              snprintf(gname, sizeof gname, "%s%u", gt.code == kDLBfloat ? "bfloat" : "float", unsigned(gt.bits));
              out.push_back({std::string(spec.name) + " / " + lbopt_state_kind_name(lbopt_state_kind(k)) +
                                 " / param " + pv.name + " / grad " + gname + " / n " + std::to_string(n) +
                                 (nonfinite ? " / NaN, Inf grads" : ""),
                             simd_case(cfg, pv, gt, n, nonfinite)});
            }
  return out;
}

}  // namespace

TEST_SUITE("optimizers") {
  TEST_CASE("SIMD kernels reproduce the portable kernels bit for bit: every optimizer, kind, dtype, instruction set") {
    const std::vector<SimdCase> portable = with_portable_kernels(simd_cases);
    // the cases differ from each other (a digest that ignored the optimizer or kind would not)
    std::vector<uint64_t> distinct;
    for (const SimdCase& c : portable) distinct.push_back(c.digest);
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    MESSAGE(portable.size(), " cases, ", distinct.size(), " distinct digests");
    CHECK(distinct.size() * 10 >= portable.size() * 9);
    for_each_simd_target([&](const std::string& name) {
      const std::vector<SimdCase> simd = simd_cases();
      REQUIRE(simd.size() == portable.size());
      int mismatches = 0;
      for (size_t i = 0; i < simd.size(); ++i)
        if (simd[i].digest != portable[i].digest && ++mismatches <= 10)
          MESSAGE("differs from portable on ", name, ": ", simd[i].name);
      CHECK(mismatches == 0);
    });
  }
}

namespace {

// ------------------------------------------------------------------------------------------------------------
// AdamW through the generic entry points, and the capturable step

void fill_slot(LibSlot& r, uint64_t seed, bool nonfinite) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  const ref::Dtype pd = ref_dtype(r.p.t.dtype), gd = ref_dtype(r.g.t.dtype);
  for (int64_t i = 0; i < r.n; ++i) {
    store(pd, r.p.t.data, i, ref::to_dtype(pd, 0.3 * nd(rng)));
    double gi = 0.01 * nd(rng);
    if (nonfinite && i % 211 == 3) gi = NAN;
    store(gd, r.g.t.data, i, ref::to_dtype(gd, gi));
  }
}

}  // namespace

TEST_SUITE("optimizers") {
  TEST_CASE("AdamW through lbopt_step equals lbopt_adamw_step bit for bit (AMSGrad: states[2] is vmax)") {
    const uint32_t flag_sets[] = {0u, LBOPT_FLAG_AMSGRAD, LBOPT_FLAG_ADAM_COUPLED_DECAY,
                                  LBOPT_FLAG_AMSGRAD | LBOPT_FLAG_MAXIMIZE | LBOPT_FLAG_BF16_STOCHASTIC_ROUND,
                                  LBOPT_FLAG_SKIP_NONFINITE | LBOPT_FLAG_ADAM_COUPLED_DECAY | LBOPT_FLAG_AMSGRAD};
    int compared = 0;
    for (int k = 0; k < 4; ++k)
      for (uint32_t flags : flag_sets)
        for (const DLDataType& pt : {bf16(), f32(), f16()}) {
          const lbopt_state_kind kind = lbopt_state_kind(k);
          const bool ams = flags & LBOPT_FLAG_AMSGRAD, skip = flags & LBOPT_FLAG_SKIP_NONFINITE;
          CAPTURE(k);
          CAPTURE(flags);
          CAPTURE(pt.bits);
          const int64_t n = 1000 + 77 * k;
          LibSlot a(kind, n, ams ? 3 : 2, pt, bf16()), b(kind, n, ams ? 3 : 2, pt, bf16());
          fill_slot(a, 7 + uint64_t(k), skip);
          fill_slot(b, 7 + uint64_t(k), skip);
          REQUIRE(a.digest() == b.digest());
          const auto set = [&](auto& c) {  // the same fields in both structs
            c.state_kind = kind;
            c.flags = flags;
            c.beta1 = 0.8;
            c.beta2 = 0.99;
            c.eps = 1e-7;
            c.weight_decay = 0.05;
            c.seed = 1234;
          };
          lbopt_adamw_config ac;
          REQUIRE(lbopt_adamw_config_init(&ac, sizeof ac) == LBOPT_OK);
          set(ac);
          lbopt_optimizer_config gc;
          REQUIRE(lbopt_optimizer_config_init(&gc, sizeof gc, LBOPT_OPTIMIZER_ADAMW) == LBOPT_OK);
          set(gc);
          // options: grad_scale 4 (exact reciprocal) and a skipped array on each side
          Buffer gs_a(f32(), {1}), gs_b(f32(), {1}), sk_a(u8(), {1}), sk_b(u8(), {1});
          gs_a.as<float>()[0] = gs_b.as<float>()[0] = 4.0f;
          lbopt_step_options oa, ob;
          lbopt_step_options_init(&oa, sizeof oa);
          lbopt_step_options_init(&ob, sizeof ob);
          oa.grad_scale = &gs_a.t;
          oa.skipped = &sk_a.t;
          ob.grad_scale = &gs_b.t;
          ob.skipped = &sk_b.t;
          for (int64_t t = 1; t <= 4; ++t) {
            const double lr = 1e-3 * (1 + 0.3 * double(t));
            const lbopt_adamw_slot as{sizeof as, &a.p.t, &a.g.t, a.st[0]->view(), a.st[1]->view(),
                                      ams ? a.st[2]->view() : lbopt_state{nullptr, nullptr}, t};
            const lbopt_slot bs = b.slot(t);
            REQUIRE_MESSAGE(lbopt_adamw_step(&ac, lr, &as, 1, &oa) == LBOPT_OK, lbopt_last_error());
            REQUIRE_MESSAGE(lbopt_step(&gc, lr, &bs, 1, &ob) == LBOPT_OK, lbopt_last_error());
            CHECK(a.digest() == b.digest());
            CHECK(hash(sk_a) == hash(sk_b));
            CHECK(sk_a.as<uint8_t>()[0] == (skip ? 1 : 0));
            ++compared;
          }
          // a real step happened (the digest changed from a fresh copy)
          LibSlot fresh(kind, n, ams ? 3 : 2, pt, bf16());
          fill_slot(fresh, 7 + uint64_t(k), skip);
          if (!skip) CHECK(fresh.digest() != a.digest());
        }
    CHECK(compared == 4 * 5 * 3 * 4);
  }

  TEST_CASE("lbopt_step_capturable equals lbopt_step bit for bit, every optimizer and kind") {
    std::vector<Spec> specs = new_specs();
    specs.push_back({"adamw", LBOPT_OPTIMIZER_ADAMW, nullptr});
    specs.push_back({"adamw, amsgrad, coupled", LBOPT_OPTIMIZER_ADAMW,
                     [](lbopt_optimizer_config& c) { c.flags = LBOPT_FLAG_AMSGRAD | LBOPT_FLAG_ADAM_COUPLED_DECAY; }});
    for (size_t si = 0; si < specs.size(); ++si)
      for (int k = 0; k < 4; ++k) {
        const bool lr64 = si % 2, step64 = (si / 2) % 2;
        const std::string name = std::string(specs[si].name) + ", " + lbopt_state_kind_name(lbopt_state_kind(k)) +
                                 (lr64 ? ", lr float64" : ", lr float32") + (step64 ? ", step int64" : ", step float32");
        CAPTURE(name);
        const lbopt_optimizer_config cfg =
            config_of(specs[si], lbopt_state_kind(k), LBOPT_FLAG_BF16_STOCHASTIC_ROUND);
        const int ns = model_states(cfg);
        LibSlot a(cfg.state_kind, 777, ns, bf16(), f32()), b(cfg.state_kind, 777, ns, bf16(), f32());
        fill_slot(a, 99 + si, false);
        fill_slot(b, 99 + si, false);
        Buffer lr(lr64 ? DLDataType{kDLFloat, 64, 1} : f32(), {1}), step(step64 ? DLDataType{kDLInt, 64, 1} : f32(), {1});
        for (int64_t t = 1; t <= 5; ++t) {
          const double value = lr_at(cfg.optimizer, t) * 3;
          double used;
          if (lr64) used = lr.as<double>()[0] = value;
          else used = lr.as<float>()[0] = float(value);
          if (step64) step.as<int64_t>()[0] = t;
          else step.as<float>()[0] = float(t);
          const lbopt_slot sa = a.slot(t), sb = b.slot(4321);  // the capturable step ignores slots[i].step
          REQUIRE_MESSAGE(lbopt_step(&cfg, used, &sa, 1, nullptr) == LBOPT_OK, lbopt_last_error());
          REQUIRE_MESSAGE(lbopt_step_capturable(&cfg, &lr.t, &step.t, &sb, 1, nullptr) == LBOPT_OK, lbopt_last_error());
          CHECK(a.digest() == b.digest());
        }
        // and the AdamW capturable entry point is the same step
        if (cfg.optimizer == LBOPT_OPTIMIZER_ADAMW) {
          LibSlot c(cfg.state_kind, 777, ns, bf16(), f32());
          fill_slot(c, 99 + si, false);
          lbopt_adamw_config ac;
          lbopt_adamw_config_init(&ac, sizeof ac);
          ac.state_kind = cfg.state_kind;
          ac.flags = cfg.flags;
          LibSlot d(cfg.state_kind, 777, ns, bf16(), f32());
          fill_slot(d, 99 + si, false);
          for (int64_t t = 1; t <= 3; ++t) {
            if (lr64) lr.as<double>()[0] = 1e-3 * double(t);
            else lr.as<float>()[0] = 1e-3f * float(t);
            if (step64) step.as<int64_t>()[0] = t;
            else step.as<float>()[0] = float(t);
            const bool ams = ns == 3;
            const lbopt_adamw_slot sc{sizeof sc, &c.p.t, &c.g.t, c.st[0]->view(), c.st[1]->view(),
                                      ams ? c.st[2]->view() : lbopt_state{nullptr, nullptr}, 1};
            const lbopt_slot sd = d.slot(1);
            REQUIRE(lbopt_adamw_step_capturable(&ac, &lr.t, &step.t, &sc, 1, nullptr) == LBOPT_OK);
            REQUIRE(lbopt_step_capturable(&cfg, &lr.t, &step.t, &sd, 1, nullptr) == LBOPT_OK);
            CHECK(c.digest() == d.digest());
          }
        }
      }
  }
}

namespace {

// ------------------------------------------------------------------------------------------------------------
// Invalid inputs to the generic entry points

enum class Base { kAdamW, kAdamWAmsgrad, kSgd, kSgdNoMomentum, kLion, kAdEMAMix };

lbopt_optimizer_config base_config(Base b, lbopt_state_kind kind) {
  const lbopt_optimizer o = b == Base::kAdamW || b == Base::kAdamWAmsgrad ? LBOPT_OPTIMIZER_ADAMW
                            : b == Base::kSgd || b == Base::kSgdNoMomentum ? LBOPT_OPTIMIZER_SGD
                            : b == Base::kLion                             ? LBOPT_OPTIMIZER_LION
                                                                            : LBOPT_OPTIMIZER_ADEMAMIX;
  lbopt_optimizer_config c;
  REQUIRE(lbopt_optimizer_config_init(&c, sizeof c, o) == LBOPT_OK);
  c.state_kind = kind;
  if (b == Base::kAdamWAmsgrad) c.flags = LBOPT_FLAG_AMSGRAD;
  if (b == Base::kSgdNoMomentum) c.momentum = 0.0;
  if (b == Base::kSgd) c.weight_decay = 0.01;
  return c;
}

// A valid two-slot step (slot 0: float32 param [300] with a bfloat16 grad; slot 1: bfloat16 param [3, 70] with a
// float16 grad) with three states allocated per slot (the optimizer's attached), options (grad_scale 1,
// found_inf 0, skipped [2]) and capturable lr / step scalars. Every buffer is random non-zero bytes first (slack
// included), then valid values in its view, so any write changes its hash.
struct Setup {
  lbopt_state_kind kind;
  std::mt19937_64 rng{0x09717e57ull};
  Buffer p0{f32(), {300}}, g0{bf16(), {300}}, p1{bf16(), {3, 70}}, g1{f16(), {3, 70}};
  std::unique_ptr<State> st[2][LBOPT_MAX_STATES];
  Buffer grad_scale{f32(), {1}}, found_inf{f32(), {1}}, skipped{u8(), {2}};
  Buffer lr_t{f32(), {1}}, step_t{DLDataType{kDLInt, 64, 1}, {1}};
  std::vector<std::unique_ptr<Buffer>> extra;

  lbopt_optimizer_config config{};
  double lr = 1e-3;
  lbopt_slot slots[2]{};
  lbopt_step_options options{};
  const lbopt_optimizer_config* config_arg = &config;
  const lbopt_slot* slots_arg = slots;
  size_t n_slots = 2;
  const lbopt_step_options* options_arg = &options;

  Setup(Base base, lbopt_state_kind k) : kind(k) {
    config = base_config(base, k);
    for (int s = 0; s < 2; ++s)
      for (auto& x : st[s]) x = std::make_unique<State>(k, s == 0 ? 300 : 210);
    for (const auto& nb : buffers()) randomize(*const_cast<Buffer*>(nb.second));
    fill(p0);
    fill(g0);
    fill(p1);
    fill(g1);
    for (int s = 0; s < 2; ++s)
      for (int i = 0; i < LBOPT_MAX_STATES; ++i) fill_state(*st[s][i], model_moment(config.optimizer, i, config.flags));
    grad_scale.as<float>()[0] = 1.0f;
    found_inf.as<float>()[0] = 0.0f;
    skipped.as<uint8_t>()[0] = 0xAB;
    skipped.as<uint8_t>()[1] = 0xCD;
    lr_t.as<float>()[0] = 1e-3f;
    step_t.as<int64_t>()[0] = 5;
    REQUIRE(lbopt_step_options_init(&options, sizeof options) == LBOPT_OK);
    options.grad_scale = &grad_scale.t;
    options.found_inf = &found_inf.t;
    options.skipped = &skipped.t;
    const int ns = model_states(config);
    slots[0] = {sizeof(lbopt_slot), &p0.t, &g0.t, {}, 3};
    slots[1] = {sizeof(lbopt_slot), &p1.t, &g1.t, {}, 7};
    for (int s = 0; s < 2; ++s)
      for (int i = 0; i < ns; ++i) slots[s].states[i] = st[s][i]->view();
  }
  Setup(const Setup&) = delete;
  Setup& operator=(const Setup&) = delete;

  std::vector<std::pair<std::string, const Buffer*>> buffers() const {
    std::vector<std::pair<std::string, const Buffer*>> out = {
        {"p0", &p0}, {"g0", &g0}, {"p1", &p1}, {"g1", &g1}, {"grad_scale", &grad_scale}, {"found_inf", &found_inf},
        {"skipped", &skipped}, {"lr", &lr_t}, {"step", &step_t}};
    for (int s = 0; s < 2; ++s)
      for (int i = 0; i < LBOPT_MAX_STATES; ++i) {
        const std::string name = "slot" + std::to_string(s) + ".states" + std::to_string(i);
        out.push_back({name + ".codes", st[s][i]->codes.get()});
        if (st[s][i]->scales) out.push_back({name + ".scales", st[s][i]->scales.get()});
      }
    for (size_t i = 0; i < extra.size(); ++i) out.push_back({"extra" + std::to_string(i), extra[i].get()});
    return out;
  }
  std::vector<uint64_t> hashes() const {
    std::vector<uint64_t> h;
    for (const auto& nb : buffers()) h.push_back(hash(*nb.second));
    return h;
  }

  void randomize(Buffer& b) { test::randomize(b, rng); }
  void fill(Buffer& b, bool nonneg = false) { fill_valid(b, rng, nonneg); }
  void fill_state(State& s, lbopt_moment moment) { fill_valid_state(s, kind, rng, moment == LBOPT_MOMENT_SECOND); }
  Buffer& add(DLDataType dtype, std::vector<int64_t> shape) {
    extra.push_back(std::make_unique<Buffer>(dtype, std::move(shape)));
    randomize(*extra.back());
    fill(*extra.back());
    return *extra.back();
  }
};

// What a row's failure is about, which decides the other entry points' verdicts: a config field (then
// lbopt_optimizer_config_validate, lbopt_optimizer_states and lbopt_step_capturable give the same status and
// message), lr (lbopt_optimizer_config_validate only), slots[i].step (not read by the capturable step), or
// anything else of the call (lbopt_step_capturable agrees, the config checks pass).
enum class Scope { kCall, kConfig, kLr, kSlotStep };

struct Row {
  const char* name;
  Base base;
  std::function<void(Setup&)> mutate;
  lbopt_status expected;
  std::vector<std::string> needles;
  Scope scope = Scope::kCall;
  lbopt_state_kind kind = LBOPT_STATE_4BIT;
};

const Base kA = Base::kAdamW, kAA = Base::kAdamWAmsgrad, kS = Base::kSgd, kS0 = Base::kSgdNoMomentum,
           kL = Base::kLion, kE = Base::kAdEMAMix;
const lbopt_status kOk = LBOPT_OK, kBad = LBOPT_ERR_INVALID_VALUE;
const Scope kCfg = Scope::kConfig;

using M = std::function<void(Setup&)>;
const M unchanged = [](Setup&) {};
M set(double lbopt_optimizer_config::*field, double value) {
  return [field, value](Setup& s) { s.config.*field = value; };
}
M flags(uint32_t f) {
  return [f](Setup& s) { s.config.flags |= f; };
}

// clang-format off
const std::vector<Row>& rows() {
  using C = lbopt_optimizer_config;
  static const std::vector<Row> table = {
    // ---- positive controls: each base steps, and fields an optimizer does not read are not checked ----
    {"control: adamw", kA, unchanged, kOk, {}},
    {"control: adamw + amsgrad", kAA, unchanged, kOk, {}},
    {"control: sgd momentum 0.9", kS, unchanged, kOk, {}},
    {"control: sgd momentum 0 (no state)", kS0, unchanged, kOk, {}},
    {"control: lion", kL, unchanged, kOk, {}},
    {"control: ademamix", kE, unchanged, kOk, {}},
    {"control: ademamix fp32", kE, unchanged, kOk, {}, Scope::kCall, LBOPT_STATE_FP32},
    {"control: sgd fp8", kS, unchanged, kOk, {}, Scope::kCall, LBOPT_STATE_FP8},
    {"control: lion 8-bit", kL, unchanged, kOk, {}, Scope::kCall, LBOPT_STATE_8BIT},
    {"accepted: sgd dampening = 1", kS, set(&C::dampening, 1.0), kOk, {}},
    {"accepted: sgd nesterov", kS, flags(LBOPT_FLAG_NESTEROV), kOk, {}},
    {"accepted: sgd ignores betas, eps, alpha, t_beta3", kS,
     [](Setup& s) { s.config.beta1 = 1.0; s.config.beta2 = kNaN; s.config.beta3 = -1; s.config.eps = kNaN;
                    s.config.alpha = -1; s.config.t_beta3 = kInf; }, kOk, {}},
    {"accepted: lion ignores beta3, eps, momentum, dampening, alpha", kL,
     [](Setup& s) { s.config.beta3 = 1.0; s.config.eps = -1; s.config.momentum = kNaN; s.config.dampening = 7;
                    s.config.alpha = kNaN; }, kOk, {}},
    {"accepted: adamw ignores beta3, momentum, dampening, t_alpha, t_beta3", kA,
     [](Setup& s) { s.config.beta3 = 2.0; s.config.momentum = -1; s.config.dampening = kNaN;
                    s.config.t_alpha = -1; s.config.t_beta3 = 5; s.config.beta1 = 0; }, kOk, {}},
    {"accepted: ademamix beta1 = 0 without the beta3 warm-up", kE, set(&C::beta1, 0.0), kOk, {}},
    {"accepted: ademamix warm-ups", kE, [](Setup& s) { s.config.t_alpha = 10; s.config.t_beta3 = 20; }, kOk, {}},
    {"accepted: ademamix alpha 0, eps 0", kE, [](Setup& s) { s.config.alpha = 0; s.config.eps = 0; }, kOk, {}},
    {"accepted: common flags on sgd", kS,
     flags(LBOPT_FLAG_MAXIMIZE | LBOPT_FLAG_BF16_STOCHASTIC_ROUND | LBOPT_FLAG_SKIP_NONFINITE), kOk, {}},
    {"accepted: common flags on ademamix", kE,
     flags(LBOPT_FLAG_MAXIMIZE | LBOPT_FLAG_BF16_STOCHASTIC_ROUND | LBOPT_FLAG_SKIP_NONFINITE), kOk, {}},

    // ---- betas: [0, 1) for each beta an optimizer reads ----
    {"adamw beta1 = 1", kA, set(&C::beta1, 1.0), kBad, {"config.beta1 = 1 is outside [0, 1)"}, kCfg},
    {"adamw beta1 = -0.1", kA, set(&C::beta1, -0.1), kBad, {"config.beta1 = -0.1"}, kCfg},
    {"adamw beta2 = NaN", kAA, set(&C::beta2, kNaN), kBad, {"config.beta2 = nan"}, kCfg},
    {"lion beta1 = 1", kL, set(&C::beta1, 1.0), kBad, {"config.beta1 = 1 is outside [0, 1)"}, kCfg},
    {"lion beta2 = 1.5", kL, set(&C::beta2, 1.5), kBad, {"config.beta2 = 1.5"}, kCfg},
    {"lion beta2 = -inf", kL, set(&C::beta2, -kInf), kBad, {"config.beta2 = -inf"}, kCfg},
    {"ademamix beta1 = 1", kE, set(&C::beta1, 1.0), kBad, {"config.beta1 = 1 is outside [0, 1)"}, kCfg},
    {"ademamix beta2 = 1", kE, set(&C::beta2, 1.0), kBad, {"config.beta2 = 1 is outside [0, 1)"}, kCfg},
    {"ademamix beta3 = 1", kE, set(&C::beta3, 1.0), kBad, {"config.beta3 = 1 is outside [0, 1)"}, kCfg},
    {"ademamix beta3 = -0.5", kE, set(&C::beta3, -0.5), kBad, {"config.beta3 = -0.5"}, kCfg},
    {"ademamix beta3 = NaN", kE, set(&C::beta3, kNaN), kBad, {"config.beta3 = nan"}, kCfg},
    // ---- AdEMAMix's alpha, warm-ups, eps ----
    {"ademamix alpha = -1", kE, set(&C::alpha, -1.0), kBad, {"config.alpha = -1 must be finite and >= 0"}, kCfg},
    {"ademamix alpha = inf", kE, set(&C::alpha, kInf), kBad, {"config.alpha = inf"}, kCfg},
    {"ademamix alpha = NaN", kE, set(&C::alpha, kNaN), kBad, {"config.alpha = nan"}, kCfg},
    {"ademamix t_alpha = -1", kE, set(&C::t_alpha, -1.0), kBad, {"config.t_alpha = -1"}, kCfg},
    {"ademamix t_beta3 = NaN", kE, set(&C::t_beta3, kNaN), kBad, {"config.t_beta3 = nan"}, kCfg},
    {"ademamix t_beta3 = inf", kE, set(&C::t_beta3, kInf), kBad, {"config.t_beta3 = inf"}, kCfg},
    {"ademamix t_beta3 > 0 with beta1 = 0", kE, [](Setup& s) { s.config.beta1 = 0; s.config.t_beta3 = 100; },
     kBad, {"config.t_beta3 = 100", "config.beta1 > 0"}, kCfg},
    {"ademamix t_beta3 > 0 with beta3 = 0", kE, [](Setup& s) { s.config.beta3 = 0; s.config.t_beta3 = 100; },
     kBad, {"config.t_beta3 = 100", "config.beta3 > 0"}, kCfg},
    {"ademamix eps = -1e-8", kE, set(&C::eps, -1e-8), kBad, {"config.eps = -1e-08"}, kCfg},
    {"adamw eps = inf", kA, set(&C::eps, kInf), kBad, {"config.eps = inf"}, kCfg},
    // ---- SGD's momentum, dampening, Nesterov ----
    {"sgd momentum = -0.5", kS, set(&C::momentum, -0.5), kBad, {"config.momentum = -0.5 must be finite and >= 0"}, kCfg},
    {"sgd momentum = NaN", kS, set(&C::momentum, kNaN), kBad, {"config.momentum = nan"}, kCfg},
    {"sgd momentum = inf", kS, set(&C::momentum, kInf), kBad, {"config.momentum = inf"}, kCfg},
    {"sgd dampening = -0.1", kS, set(&C::dampening, -0.1), kBad, {"config.dampening = -0.1 is outside [0, 1]"}, kCfg},
    {"sgd dampening = 1.5", kS, set(&C::dampening, 1.5), kBad, {"config.dampening = 1.5"}, kCfg},
    {"sgd dampening = NaN", kS, set(&C::dampening, kNaN), kBad, {"config.dampening = nan"}, kCfg},
    {"sgd nesterov without momentum", kS0, flags(LBOPT_FLAG_NESTEROV), kBad,
     {"config.flags: LBOPT_FLAG_NESTEROV needs config.momentum > 0 and config.dampening = 0"}, kCfg},
    {"sgd nesterov with dampening", kS, [](Setup& s) { s.config.flags |= LBOPT_FLAG_NESTEROV; s.config.dampening = 0.1; },
     kBad, {"LBOPT_FLAG_NESTEROV", "(they are 0.9 and 0.1)"}, kCfg},
    // ---- weight decay, for each optimizer ----
    {"sgd weight_decay = -0.1", kS, set(&C::weight_decay, -0.1), kBad, {"config.weight_decay = -0.1"}, kCfg},
    {"sgd (no momentum) weight_decay = NaN", kS0, set(&C::weight_decay, kNaN), kBad, {"config.weight_decay = nan"}, kCfg},
    {"lion weight_decay = inf", kL, set(&C::weight_decay, kInf), kBad, {"config.weight_decay = inf"}, kCfg},
    {"ademamix weight_decay = -1", kE, set(&C::weight_decay, -1.0), kBad, {"config.weight_decay = -1"}, kCfg},
    {"adamw weight_decay = -1", kA, set(&C::weight_decay, -1.0), kBad, {"config.weight_decay = -1"}, kCfg},
    // ---- the optimizer, the kind, flags ----
    {"optimizer = 5", kA, [](Setup& s) { s.config.optimizer = lbopt_optimizer(5); }, kBad,
     {"config.optimizer = 5 is not an lbopt_optimizer"}, kCfg},
    {"optimizer = -1", kL, [](Setup& s) { s.config.optimizer = lbopt_optimizer(-1); }, kBad, {"config.optimizer = -1"}, kCfg},
    {"optimizer = INT32_MAX", kE, [](Setup& s) { s.config.optimizer = lbopt_optimizer(INT32_MAX); }, kBad,
     {"config.optimizer = 2147483647"}, kCfg},
    {"state_kind = 4", kS, [](Setup& s) { s.config.state_kind = lbopt_state_kind(4); }, kBad, {"config.state_kind = 4"}, kCfg},
    {"state_kind = -1", kE, [](Setup& s) { s.config.state_kind = lbopt_state_kind(-1); }, kBad, {"config.state_kind = -1"}, kCfg},
    {"unknown flag 0x200", kL, flags(0x200), kBad, {"config.flags = 0x200 has unknown bits 0x200"}, kCfg},
    {"NU_LINEAR_MAP on lion", kL, flags(LBOPT_FLAG_NU_LINEAR_MAP), kBad, {"bits 0x100 that lion does not know"}, kCfg},
    {"both state roundings", kS, flags(LBOPT_FLAG_STATE_STOCHASTIC_ROUND | LBOPT_FLAG_STATE_NEAREST_ROUND), kBad,
     {"config.flags = 0xc0: LBOPT_FLAG_STATE_STOCHASTIC_ROUND and LBOPT_FLAG_STATE_NEAREST_ROUND exclude each other"},
     kCfg},
    {"unknown flag 0x80000000", kE, flags(0x80000000u), kBad, {"config.flags", "unknown bits 0x80000000"}, kCfg},
    {"AMSGRAD on sgd", kS, flags(LBOPT_FLAG_AMSGRAD), kBad, {"config.flags = 0x2 has bits 0x2 that sgd does not know"}, kCfg},
    {"ADAM_COUPLED_DECAY on sgd (no momentum)", kS0, flags(LBOPT_FLAG_ADAM_COUPLED_DECAY), kBad,
     {"config.flags = 0x1 has bits 0x1 that sgd does not know"}, kCfg},
    {"AMSGRAD on lion", kL, flags(LBOPT_FLAG_AMSGRAD), kBad, {"config.flags", "lion does not know"}, kCfg},
    {"NESTEROV on lion", kL, flags(LBOPT_FLAG_NESTEROV), kBad, {"config.flags = 0x20 has bits 0x20 that lion"}, kCfg},
    {"AMSGRAD on ademamix", kE, flags(LBOPT_FLAG_AMSGRAD), kBad, {"config.flags", "ademamix does not know"}, kCfg},
    {"NESTEROV on ademamix", kE, flags(LBOPT_FLAG_NESTEROV), kBad, {"bits 0x20 that ademamix does not know"}, kCfg},
    {"NESTEROV on adamw", kA, flags(LBOPT_FLAG_NESTEROV), kBad, {"config.flags = 0x20 has bits 0x20 that adamw does not know"}, kCfg},
    {"NESTEROV on adamw + amsgrad", kAA, flags(LBOPT_FLAG_NESTEROV), kBad, {"config.flags = 0x22 has bits 0x20 that adamw"}, kCfg},
    // ---- struct sizes, NULLs, counts ----
    {"config.struct_size - 8", kE, [](Setup& s) { s.config.struct_size -= 8; }, LBOPT_ERR_STRUCT_SIZE,
     {"config.struct_size = ", "lbopt_optimizer_config_init"}, kCfg},
    {"config.struct_size = sizeof(lbopt_adamw_config)", kA,
     [](Setup& s) { s.config.struct_size = sizeof(lbopt_adamw_config); }, LBOPT_ERR_STRUCT_SIZE, {"config.struct_size"}, kCfg},
    {"config.struct_size + 8", kS, [](Setup& s) { s.config.struct_size += 8; }, LBOPT_ERR_STRUCT_SIZE, {"config.struct_size"}, kCfg},
    {"config = NULL", kL, [](Setup& s) { s.config_arg = nullptr; }, LBOPT_ERR_NULL_POINTER, {"config: pointer is NULL"}, kCfg},
    {"slots[1].struct_size - 8", kL, [](Setup& s) { s.slots[1].struct_size -= 8; }, LBOPT_ERR_STRUCT_SIZE,
     {"slots[1].struct_size"}},
    {"slots[0].struct_size = 0", kA, [](Setup& s) { s.slots[0].struct_size = 0; }, LBOPT_ERR_STRUCT_SIZE,
     {"slots[0].struct_size = 0"}},
    {"options.struct_size + 8", kE, [](Setup& s) { s.options.struct_size += 8; }, LBOPT_ERR_STRUCT_SIZE,
     {"options.struct_size"}},
    {"slots = NULL", kS, [](Setup& s) { s.slots_arg = nullptr; }, LBOPT_ERR_NULL_POINTER, {"slots: pointer is NULL"}},
    {"n_slots = 0", kE, [](Setup& s) { s.n_slots = 0; }, kBad, {"n_slots"}},
    // ---- lr and step ----
    {"lr = -1", kL, [](Setup& s) { s.lr = -1; }, kBad, {"lr = -1 must be finite and >= 0"}, Scope::kLr},
    {"lr = NaN", kE, [](Setup& s) { s.lr = kNaN; }, kBad, {"lr = nan"}, Scope::kLr},
    {"lr = inf", kS, [](Setup& s) { s.lr = kInf; }, kBad, {"lr = inf"}, Scope::kLr},
    {"slots[1].step = 0", kE, [](Setup& s) { s.slots[1].step = 0; }, kBad, {"slots[1].step = 0 must be >= 1"}, Scope::kSlotStep},
    // ---- states: given that the optimizer does not use, missing, wrong ----
    {"sgd momentum 0 with states[0] given", kS0, [](Setup& s) { s.slots[0].states[0] = s.st[0][0]->view(); }, kBad,
     {"slots[0].states[0]: given, but a sgd step of this config uses 0 state(s)"}},
    {"sgd momentum 0 with states[0].scales only", kS0,
     [](Setup& s) { s.slots[1].states[0] = {nullptr, &s.st[1][0]->scales->t}; }, kBad, {"slots[1].states[0]: given"}},
    {"sgd momentum with states[1] given", kS, [](Setup& s) { s.slots[1].states[1] = s.st[1][1]->view(); }, kBad,
     {"slots[1].states[1]: given", "uses 1 state(s)"}},
    {"lion states[1] given", kL, [](Setup& s) { s.slots[0].states[1] = s.st[0][1]->view(); }, kBad,
     {"slots[0].states[1]: given, but a lion step of this config uses 1 state(s)"}},
    {"lion states[2] given on slot 1", kL, [](Setup& s) { s.slots[1].states[2] = s.st[1][2]->view(); }, kBad,
     {"slots[1].states[2]: given"}},
    {"adamw (no amsgrad) states[2] given", kA, [](Setup& s) { s.slots[0].states[2] = s.st[0][2]->view(); }, kBad,
     {"slots[0].states[2]: given, but a adamw step of this config uses 2 state(s)"}},
    {"ademamix states[2] missing", kE, [](Setup& s) { s.slots[0].states[2] = {nullptr, nullptr}; },
     LBOPT_ERR_NULL_POINTER, {"slots[0].states[2].codes: tensor pointer is NULL"}},
    {"ademamix states[0] missing on slot 1", kE, [](Setup& s) { s.slots[1].states[0] = {nullptr, nullptr}; },
     LBOPT_ERR_NULL_POINTER, {"slots[1].states[0].codes"}},
    {"sgd momentum states[0] missing", kS, [](Setup& s) { s.slots[1].states[0] = {nullptr, nullptr}; },
     LBOPT_ERR_NULL_POINTER, {"slots[1].states[0].codes"}},
    {"adamw + amsgrad states[2] missing", kAA, [](Setup& s) { s.slots[0].states[2] = {nullptr, nullptr}; },
     LBOPT_ERR_NULL_POINTER, {"slots[0].states[2].codes"}},
    {"lion states[0].scales missing", kL, [](Setup& s) { s.slots[0].states[0].scales = nullptr; },
     LBOPT_ERR_NULL_POINTER, {"slots[0].states[0].scales: tensor pointer is NULL"}},
    {"ademamix fp32 states[1].scales given", kE,
     [](Setup& s) { s.slots[0].states[1].scales = &s.add(f32(), {2}).t; }, kBad,
     {"slots[0].states[1].scales: must be NULL for LBOPT_STATE_FP32"}, Scope::kCall, LBOPT_STATE_FP32},
    {"ademamix states[1] of the other slot's size", kE, [](Setup& s) { s.slots[0].states[1] = s.st[1][1]->view(); },
     LBOPT_ERR_BUFFER_SIZE, {"slots[0].states[1].codes: has 105 elements"}},
    {"ademamix states[2] aliases states[0]", kE, [](Setup& s) { s.slots[1].states[2] = s.slots[1].states[0]; },
     LBOPT_ERR_OVERLAP, {"slots[1].states", "written buffers must not alias"}},
    {"lion param dtype int32", kL, [](Setup& s) { s.p0.t.dtype = DLDataType{kDLInt, 32, 1}; }, LBOPT_ERR_DTYPE,
     {"slots[0].param: dtype int32"}},
    {"sgd fp8 states[0].codes float32", kS,
     [](Setup& s) { s.slots[1].states[0].codes = &s.add(f32(), {210}).t; }, LBOPT_ERR_DTYPE,
     {"slots[1].states[0].codes: dtype must be uint8"}, Scope::kCall, LBOPT_STATE_FP8},
  };
  return table;
}
// clang-format on

bool changed(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b,
             const std::vector<std::pair<std::string, const Buffer*>>& names, std::string* which) {
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) {
      *which = names[i].first;
      return true;
    }
  return false;
}

void run_row(const Row& row) {
  const std::string name = row.name;
  CAPTURE(name);
  Setup s(row.base, row.kind);
  row.mutate(s);
  const auto names = s.buffers();
  const std::vector<uint64_t> before = s.hashes();
  std::string which;

  const lbopt_status validated = lbopt_step_validate(s.config_arg, s.lr, s.slots_arg, s.n_slots, s.options_arg);
  const std::string validate_msg = lbopt_last_error();
  CHECK_FALSE_MESSAGE(changed(before, s.hashes(), names, &which), "lbopt_step_validate wrote ", which);
  const lbopt_status config_validated = lbopt_optimizer_config_validate(s.config_arg, s.lr);
  const std::string config_msg = lbopt_last_error();
  lbopt_state_info info[LBOPT_MAX_STATES] = {};
  size_t n_states = 99;
  const lbopt_status states = lbopt_optimizer_states(s.config_arg, info, &n_states);
  const std::string states_msg = lbopt_last_error();
  lbopt_status captured = LBOPT_OK;
  std::string capture_msg;
  const bool try_capturable = row.expected != LBOPT_OK && (row.scope == Scope::kCall || row.scope == Scope::kConfig);
  if (try_capturable) {
    captured = lbopt_step_capturable(s.config_arg, &s.lr_t.t, &s.step_t.t, s.slots_arg, s.n_slots, s.options_arg);
    capture_msg = lbopt_last_error();
    CHECK_FALSE_MESSAGE(changed(before, s.hashes(), names, &which), "lbopt_step_capturable wrote ", which);
  }

  const lbopt_status status = lbopt_step(s.config_arg, s.lr, s.slots_arg, s.n_slots, s.options_arg);
  const std::string msg = lbopt_last_error();
  INFO("status " << std::string(lbopt_status_string(status)) << ", expected "
                  << std::string(lbopt_status_string(row.expected)));
  INFO("lbopt_last_error: \"" << msg << "\"");
  CHECK(int(status) == int(row.expected));
  CHECK(int(validated) == int(status));
  CHECK(validate_msg == msg);
  if (row.expected == LBOPT_OK) {
    CHECK(msg.empty());
    CHECK(config_validated == LBOPT_OK);
    CHECK(states == LBOPT_OK);
    CHECK(n_states == size_t(model_states(s.config)));
    // the hashes see the step: both params written, and every state it uses
    const std::vector<uint64_t> after = s.hashes();
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string& n = names[i].first;
      const bool param = n == "p0" || n == "p1";
      bool used_state = false;
      for (int k = 0; k < int(n_states); ++k)
        used_state = used_state || n.find(".states" + std::to_string(k) + ".") != std::string::npos;
      const bool may = n == "skipped" || used_state;
      INFO("buffer " << n);
      if (param) CHECK(after[i] != before[i]);
      else if (!may) CHECK(after[i] == before[i]);
    }
    return;
  }
  CHECK_FALSE(msg.empty());
  for (const std::string& needle : row.needles) {
    INFO("needle: \"" << needle << "\"");
    CHECK(msg.find(needle) != std::string::npos);
  }
  CHECK_FALSE_MESSAGE(changed(before, s.hashes(), names, &which), "lbopt_step wrote ", which);
  switch (row.scope) {
    case Scope::kConfig:
      CHECK(int(config_validated) == int(status));
      CHECK(config_msg == msg);
      CHECK(int(states) == int(status));  // (it validates the config as the step does, with lr = 0)
      CHECK(states_msg == msg);
      break;
    case Scope::kLr:
      CHECK(int(config_validated) == int(status));
      CHECK(config_msg == msg);
      CHECK(states == LBOPT_OK);
      break;
    default:
      CHECK(config_validated == LBOPT_OK);
      CHECK(config_msg.empty());
      CHECK(states == LBOPT_OK);
  }
  if (try_capturable) {
    CHECK(int(captured) == int(status));
    if (row.expected == LBOPT_ERR_OVERLAP) {
      // two buffers at one address are named in either order (the capturable call has more ranges to sort)
      for (const std::string& needle : row.needles) CHECK(capture_msg.find(needle) != std::string::npos);
    } else {
      CHECK(capture_msg == msg);
    }
  }
}

}  // namespace

TEST_SUITE("optimizers") {
  TEST_CASE("generic entry points refuse invalid inputs with the field's name and write nothing") {
    std::vector<std::string> seen;
    int failing = 0;
    for (const Row& row : rows()) {
      seen.push_back(row.name);
      failing += row.expected != LBOPT_OK;
      CHECK((row.expected == LBOPT_OK) == row.needles.empty());
      run_row(row);
    }
    std::sort(seen.begin(), seen.end());
    CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end());  // unique names
    MESSAGE(rows().size(), " rows, ", failing, " of them invalid calls");
    CHECK(failing >= 60);
  }

  TEST_CASE("lbopt_optimizer_states: names and codebooks of each optimizer's states") {
    struct Want {
      lbopt_optimizer optimizer;
      uint32_t flags;
      double momentum;
      std::vector<std::pair<std::string, int>> states;
    };
    const Want wants[] = {
        {LBOPT_OPTIMIZER_ADAMW, 0, 0.9, {{"exp_avg", LBOPT_MOMENT_FIRST}, {"exp_avg_sq", LBOPT_MOMENT_SECOND}}},
        {LBOPT_OPTIMIZER_ADAMW, LBOPT_FLAG_AMSGRAD | LBOPT_FLAG_ADAM_COUPLED_DECAY, 0.9,
         {{"exp_avg", LBOPT_MOMENT_FIRST}, {"exp_avg_sq", LBOPT_MOMENT_SECOND}, {"max_exp_avg_sq", LBOPT_MOMENT_SECOND}}},
        {LBOPT_OPTIMIZER_SGD, 0, 0.9, {{"momentum_buffer", LBOPT_MOMENT_FIRST}}},
        {LBOPT_OPTIMIZER_SGD, LBOPT_FLAG_NESTEROV, 0.5, {{"momentum_buffer", LBOPT_MOMENT_FIRST}}},
        {LBOPT_OPTIMIZER_SGD, 0, 0.0, {}},
        {LBOPT_OPTIMIZER_LION, 0, 0.9, {{"exp_avg", LBOPT_MOMENT_FIRST}}},
        {LBOPT_OPTIMIZER_MUON, LBOPT_FLAG_NESTEROV, 0.95, {{"momentum_buffer", LBOPT_MOMENT_FIRST}}},
        {LBOPT_OPTIMIZER_ADEMAMIX, LBOPT_FLAG_MAXIMIZE, 0.9,
         {{"m1", LBOPT_MOMENT_FIRST}, {"m2", LBOPT_MOMENT_FIRST}, {"nu", LBOPT_MOMENT_SECOND_SIGNED}}},
        {LBOPT_OPTIMIZER_ADEMAMIX, LBOPT_FLAG_NU_LINEAR_MAP, 0.9,
         {{"m1", LBOPT_MOMENT_FIRST}, {"m2", LBOPT_MOMENT_FIRST}, {"nu", LBOPT_MOMENT_SECOND}}},
    };
    for (const Want& w : wants)
      for (int k = 0; k < 4; ++k) {
        CAPTURE(int(w.optimizer));
        CAPTURE(w.flags);
        CAPTURE(w.momentum);
        CAPTURE(k);
        lbopt_optimizer_config c;
        REQUIRE(lbopt_optimizer_config_init(&c, sizeof c, w.optimizer) == LBOPT_OK);
        c.flags = w.flags;
        c.momentum = w.momentum;
        c.state_kind = lbopt_state_kind(k);
        lbopt_state_info info[LBOPT_MAX_STATES];
        for (auto& i : info) i = {"untouched", 77};
        size_t n = 99;
        REQUIRE_MESSAGE(lbopt_optimizer_states(&c, info, &n) == LBOPT_OK, lbopt_last_error());
        CHECK(std::string(lbopt_last_error()).empty());
        REQUIRE(n == w.states.size());
        CHECK(int(n) == model_states(c));
        for (size_t i = 0; i < n; ++i) {
          REQUIRE(info[i].name != nullptr);
          CHECK(std::string(info[i].name) == w.states[i].first);
          CHECK(info[i].moment == w.states[i].second);
          CHECK(info[i].moment == int(model_moment(w.optimizer, int(i), w.flags)));
        }
        for (size_t i = n; i < LBOPT_MAX_STATES; ++i) CHECK(info[i].moment == 77);  // past n: not written
      }
    // NULL pointers and an invalid config
    lbopt_optimizer_config c;
    REQUIRE(lbopt_optimizer_config_init(&c, sizeof c, LBOPT_OPTIMIZER_LION) == LBOPT_OK);
    lbopt_state_info info[LBOPT_MAX_STATES];
    size_t n = 0;
    CHECK(lbopt_optimizer_states(&c, nullptr, &n) == LBOPT_ERR_NULL_POINTER);
    CHECK(std::string(lbopt_last_error()).find("states") != std::string::npos);
    CHECK(lbopt_optimizer_states(&c, info, nullptr) == LBOPT_ERR_NULL_POINTER);
    CHECK(std::string(lbopt_last_error()).find("n_states") != std::string::npos);
    CHECK(lbopt_optimizer_states(nullptr, info, &n) == LBOPT_ERR_NULL_POINTER);
    c.beta2 = 1.0;
    n = 99;
    CHECK(lbopt_optimizer_states(&c, info, &n) == LBOPT_ERR_INVALID_VALUE);
    CHECK(std::string(lbopt_last_error()).find("config.beta2") != std::string::npos);
    CHECK(n == 99);  // not written on failure
  }

  TEST_CASE("lbopt_optimizer_config_init: each optimizer's defaults, and lbopt_optimizer_name") {
    struct Want {
      lbopt_optimizer optimizer;
      const char* name;
      double beta1, beta2, eps, weight_decay;
    };
    const Want wants[] = {{LBOPT_OPTIMIZER_ADAMW, "adamw", 0.9, 0.999, 1e-8, 0.01},
                          {LBOPT_OPTIMIZER_SGD, "sgd", 0.9, 0.999, 1e-8, 0.0},
                          {LBOPT_OPTIMIZER_LION, "lion", 0.9, 0.99, 1e-8, 0.0},
                          {LBOPT_OPTIMIZER_ADEMAMIX, "ademamix", 0.9, 0.999, 1e-8, 0.01},
                          {LBOPT_OPTIMIZER_MUON, "muon", 0.9, 0.999, 1e-8, 0.01}};  // (weight decay not read)
    for (const Want& w : wants) {
      CAPTURE(w.name);
      lbopt_optimizer_config c;
      memset(&c, 0xA5, sizeof c);
      REQUIRE(lbopt_optimizer_config_init(&c, sizeof c, w.optimizer) == LBOPT_OK);
      CHECK(c.struct_size == sizeof c);
      CHECK(c.optimizer == w.optimizer);
      CHECK(c.state_kind == LBOPT_STATE_4BIT);
      CHECK(c.flags == 0u);
      CHECK(c.seed == 0u);
      CHECK(c.weight_decay == w.weight_decay);
      if (w.optimizer == LBOPT_OPTIMIZER_MUON) CHECK(c.momentum == 0.95);
      if (w.optimizer != LBOPT_OPTIMIZER_SGD && w.optimizer != LBOPT_OPTIMIZER_MUON) {  // the betas it reads
        CHECK(c.beta1 == w.beta1);
        CHECK(c.beta2 == w.beta2);
      }
      if (w.optimizer == LBOPT_OPTIMIZER_ADAMW || w.optimizer == LBOPT_OPTIMIZER_ADEMAMIX) CHECK(c.eps == 1e-8);
      if (w.optimizer == LBOPT_OPTIMIZER_SGD) {
        CHECK(c.momentum == 0.9);
        CHECK(c.dampening == 0.0);
      }
      if (w.optimizer == LBOPT_OPTIMIZER_ADEMAMIX) {
        CHECK(c.beta3 == 0.9999);
        CHECK(c.alpha == 5.0);
        CHECK(c.t_alpha == 0.0);
        CHECK(c.t_beta3 == 0.0);
      }
      // every field the optimizer does not read is still set to a plain value (not left as the caller's bytes)
      CHECK(c.dampening == 0.0);
      CHECK(c.t_alpha == 0.0);
      CHECK(c.t_beta3 == 0.0);
      CHECK(lbopt_optimizer_config_validate(&c, 1e-3) == LBOPT_OK);
      CHECK(std::string(lbopt_optimizer_name(w.optimizer)) == w.name);
      // a larger caller struct: the tail is zeroed
      struct Bigger {
        lbopt_optimizer_config c;
        uint8_t tail[24];
      } big;
      memset(&big, 0xA5, sizeof big);
      REQUIRE(lbopt_optimizer_config_init(&big.c, sizeof big, w.optimizer) == LBOPT_OK);
      CHECK(big.c.struct_size == sizeof(lbopt_optimizer_config));
      CHECK(memcmp(&big.c, &c, sizeof c) == 0);
      for (uint8_t b : big.tail) CHECK(b == 0);
    }
    // the SGD default has its state; the AdEMAMix default reads and checks beta3 and alpha
    lbopt_optimizer_config c;
    REQUIRE(lbopt_optimizer_config_init(&c, sizeof c, LBOPT_OPTIMIZER_SGD) == LBOPT_OK);
    CHECK(model_states(c) == 1);
    // refusals: too small, NULL, not an optimizer; the struct is left as it was
    memset(&c, 0x5A, sizeof c);
    lbopt_optimizer_config copy = c;
    CHECK(lbopt_optimizer_config_init(&c, sizeof c - 1, LBOPT_OPTIMIZER_SGD) == LBOPT_ERR_STRUCT_SIZE);
    CHECK(std::string(lbopt_last_error()).find("struct_size") != std::string::npos);
    CHECK(lbopt_optimizer_config_init(nullptr, sizeof c, LBOPT_OPTIMIZER_SGD) == LBOPT_ERR_NULL_POINTER);
    CHECK(lbopt_optimizer_config_init(&c, sizeof c, lbopt_optimizer(5)) == LBOPT_ERR_INVALID_VALUE);
    CHECK(std::string(lbopt_last_error()).find("optimizer = 5") != std::string::npos);
    CHECK(lbopt_optimizer_config_init(&c, sizeof c, lbopt_optimizer(-1)) == LBOPT_ERR_INVALID_VALUE);
    CHECK(memcmp(&c, &copy, sizeof c) == 0);
    CHECK(lbopt_optimizer_name(lbopt_optimizer(5)) == nullptr);
    CHECK(lbopt_optimizer_name(lbopt_optimizer(-1)) == nullptr);
    CHECK(lbopt_optimizer_name(lbopt_optimizer(INT32_MAX)) == nullptr);
  }
}

namespace {

// This file's own list of the fields each optimizer reads (its registry operators' attribute order), and where
// each lives in the config.
struct WantFields {
  lbopt_optimizer optimizer;
  std::vector<std::string> names;  // fields, then flags
};
const WantFields kWantFields[] = {
    {LBOPT_OPTIMIZER_ADAMW, {"beta1", "beta2", "eps", "weight_decay", "adam", "amsgrad"}},
    {LBOPT_OPTIMIZER_SGD, {"momentum", "dampening", "weight_decay", "nesterov"}},
    {LBOPT_OPTIMIZER_LION, {"beta1", "beta2", "weight_decay"}},
    {LBOPT_OPTIMIZER_ADEMAMIX,
     {"beta1", "beta2", "beta3", "alpha", "t_alpha", "t_beta3", "eps", "weight_decay", "nu_linear_map"}},
    {LBOPT_OPTIMIZER_MUON, {"momentum", "nesterov"}},
};

double* config_double(lbopt_optimizer_config& c, const std::string& name) {
  const std::pair<const char*, double lbopt_optimizer_config::*> fields[] = {
      {"beta1", &lbopt_optimizer_config::beta1}, {"beta2", &lbopt_optimizer_config::beta2},
      {"beta3", &lbopt_optimizer_config::beta3}, {"eps", &lbopt_optimizer_config::eps},
      {"weight_decay", &lbopt_optimizer_config::weight_decay}, {"momentum", &lbopt_optimizer_config::momentum},
      {"dampening", &lbopt_optimizer_config::dampening}, {"alpha", &lbopt_optimizer_config::alpha},
      {"t_alpha", &lbopt_optimizer_config::t_alpha}, {"t_beta3", &lbopt_optimizer_config::t_beta3}};
  for (const auto& f : fields)
    if (name == f.first) return &(c.*f.second);
  return nullptr;
}

// lbopt_optimizer_config_validate of the optimizer's default config with one field set to x.
lbopt_status validate_with(lbopt_optimizer optimizer, const std::string& name, double x) {
  lbopt_optimizer_config c;
  REQUIRE(lbopt_optimizer_config_init(&c, sizeof c, optimizer) == LBOPT_OK);
  *config_double(c, name) = x;
  return lbopt_optimizer_config_validate(&c, 1e-3);
}

}  // namespace

TEST_SUITE("optimizers") {
  TEST_CASE("lbopt_optimizer_config_set: every listed field and flag by name, and nothing else") {
    for (const WantFields& w : kWantFields) {
      CAPTURE(lbopt_optimizer_name(w.optimizer));
      const lbopt_field_info* fields = nullptr;
      size_t n = 0;
      REQUIRE(lbopt_optimizer_fields(w.optimizer, &fields, &n) == LBOPT_OK);
      lbopt_optimizer_config c;
      REQUIRE(lbopt_optimizer_config_init(&c, sizeof c, w.optimizer) == LBOPT_OK);
      for (size_t i = 0; i < n; ++i) {
        const lbopt_field_info& f = fields[i];
        CAPTURE(f.name);
        lbopt_optimizer_config want = c;
        if (f.type == LBOPT_ATTR_BOOL) {
          want.flags |= f.flag;
          REQUIRE(lbopt_optimizer_config_set(&c, f.name, 1.0) == LBOPT_OK);
          CHECK(memcmp(&c, &want, sizeof c) == 0);
          want.flags &= ~f.flag;
          REQUIRE(lbopt_optimizer_config_set(&c, f.name, 0.0) == LBOPT_OK);
          CHECK(memcmp(&c, &want, sizeof c) == 0);
          CHECK(lbopt_optimizer_config_set(&c, f.name, 0.5) == LBOPT_ERR_INVALID_VALUE);
          continue;
        }
        const double x = isinf(f.max) ? 3.25 : 0.25;  // in range, not the default
        *config_double(want, f.name) = x;
        REQUIRE(lbopt_optimizer_config_set(&c, f.name, x) == LBOPT_OK);
        CHECK(memcmp(&c, &want, sizeof c) == 0);
        // out of range: the message validation gives, and nothing written
        CHECK(lbopt_optimizer_config_set(&c, f.name, nextafter(f.min, -kInf)) == LBOPT_ERR_INVALID_VALUE);
        CHECK(std::string(lbopt_last_error()).find(std::string("config.") + f.name + " = ") == 0);
        CHECK(lbopt_optimizer_config_set(&c, f.name, kNaN) == LBOPT_ERR_INVALID_VALUE);
        CHECK(memcmp(&c, &want, sizeof c) == 0);
      }
      for (const char* common : {"maximize", "bf16_stochastic_round", "skip_nonfinite", "state_stochastic_round",
                                 "state_nearest_round"}) {
        CAPTURE(common);
        CHECK(lbopt_optimizer_config_set(&c, common, 1.0) == LBOPT_OK);
        CHECK(lbopt_optimizer_config_set(&c, common, 0.0) == LBOPT_OK);
      }
      CHECK(c.flags == 0u);
      // a name another optimizer reads, and names of nothing: refused, naming what this one reads
      const lbopt_optimizer_config before = c;
      for (const char* name : {"dampening", "beta3", "lr", "seed", "", "weight_decay "}) {
        CAPTURE(name);
        const bool reads = [&] {
          for (size_t i = 0; i < n; ++i)
            if (std::string(fields[i].name) == name) return true;
          return false;
        }();
        if (reads) continue;
        CHECK(lbopt_optimizer_config_set(&c, name, 0.0) == LBOPT_ERR_INVALID_VALUE);
        CHECK(std::string(lbopt_last_error()).find(std::string("reads (") + (n ? fields[0].name : "maximize")) !=
              std::string::npos);
      }
      CHECK(memcmp(&c, &before, sizeof c) == 0);
    }
    lbopt_optimizer_config c;
    REQUIRE(lbopt_optimizer_config_init(&c, sizeof c, LBOPT_OPTIMIZER_SGD) == LBOPT_OK);
    CHECK(lbopt_optimizer_config_set(nullptr, "momentum", 0.5) == LBOPT_ERR_NULL_POINTER);
    CHECK(lbopt_optimizer_config_set(&c, nullptr, 0.5) == LBOPT_ERR_NULL_POINTER);
    c.struct_size -= 8;
    CHECK(lbopt_optimizer_config_set(&c, "momentum", 0.5) == LBOPT_ERR_STRUCT_SIZE);
    c.struct_size += 8;
    c.optimizer = lbopt_optimizer(9);
    CHECK(lbopt_optimizer_config_set(&c, "momentum", 0.5) == LBOPT_ERR_INVALID_VALUE);
    CHECK(c.momentum == 0.9);
  }

  TEST_CASE("lbopt_optimizer_fields: each optimizer's fields, as config_init sets and validation checks them") {
    for (const WantFields& w : kWantFields) {
      CAPTURE(lbopt_optimizer_name(w.optimizer));
      const lbopt_field_info* fields = nullptr;
      size_t n = 0;
      REQUIRE(lbopt_optimizer_fields(w.optimizer, &fields, &n) == LBOPT_OK);
      REQUIRE(n == w.names.size());
      lbopt_optimizer_config defaults;
      REQUIRE(lbopt_optimizer_config_init(&defaults, sizeof defaults, w.optimizer) == LBOPT_OK);
      for (size_t i = 0; i < n; ++i) {
        const lbopt_field_info& f = fields[i];
        CAPTURE(f.name);
        CHECK(f.name == w.names[i]);
        CHECK(f.reserved == 0);
        if (f.type == LBOPT_ATTR_BOOL) {  // a flag: the optimizer accepts it (its defaults meet its rules)
          CHECK(f.flag != 0u);
          lbopt_optimizer_config c = defaults;
          c.flags = f.flag;
          CHECK(lbopt_optimizer_config_validate(&c, 1e-3) == LBOPT_OK);
          continue;
        }
        REQUIRE(f.type == LBOPT_ATTR_DOUBLE);
        CHECK(f.flag == 0u);
        CHECK(f.default_value == *config_double(defaults, f.name));
        const std::string named = std::string("config.") + f.name + " = ";
        CHECK(validate_with(w.optimizer, f.name, f.min) == LBOPT_OK);
        CHECK(validate_with(w.optimizer, f.name, nextafter(f.min, -kInf)) == LBOPT_ERR_INVALID_VALUE);
        CHECK(std::string(lbopt_last_error()).find(named) == 0);
        CHECK(validate_with(w.optimizer, f.name, kNaN) == LBOPT_ERR_INVALID_VALUE);
        if (isinf(f.max)) {
          CHECK(validate_with(w.optimizer, f.name, 1e300) == LBOPT_OK);
          CHECK(validate_with(w.optimizer, f.name, kInf) == LBOPT_ERR_INVALID_VALUE);
        } else {
          CHECK(validate_with(w.optimizer, f.name, nextafter(f.max, -kInf)) == LBOPT_OK);
          CHECK(validate_with(w.optimizer, f.name, f.max) == (f.max_inclusive ? LBOPT_OK : LBOPT_ERR_INVALID_VALUE));
          CHECK(validate_with(w.optimizer, f.name, nextafter(f.max, kInf)) == LBOPT_ERR_INVALID_VALUE);
        }
      }
      // a flag it does not list is refused
      uint32_t listed = LBOPT_FLAG_MAXIMIZE | LBOPT_FLAG_BF16_STOCHASTIC_ROUND | LBOPT_FLAG_SKIP_NONFINITE;
      for (size_t i = 0; i < n; ++i) listed |= fields[i].flag;
      for (uint32_t bit = 1; bit <= LBOPT_FLAG_NESTEROV; bit <<= 1) {
        lbopt_optimizer_config c = defaults;
        c.flags = bit;
        CHECK((lbopt_optimizer_config_validate(&c, 1e-3) == LBOPT_OK) == ((listed & bit) != 0));
      }
    }
    const lbopt_field_info* fields = nullptr;
    size_t n = 7;
    CHECK(lbopt_optimizer_fields(LBOPT_OPTIMIZER_SGD, nullptr, &n) == LBOPT_ERR_NULL_POINTER);
    CHECK(lbopt_optimizer_fields(LBOPT_OPTIMIZER_SGD, &fields, nullptr) == LBOPT_ERR_NULL_POINTER);
    CHECK(lbopt_optimizer_fields(lbopt_optimizer(5), &fields, &n) == LBOPT_ERR_INVALID_VALUE);
    CHECK(std::string(lbopt_last_error()).find("optimizer = 5") != std::string::npos);
    CHECK((fields == nullptr && n == 7));  // nothing written
  }
}

// A parameter tensor with its states in both representations: the library's buffers and the reference's
// decoded values, filled with the same random contents so one step of each can be compared.
#pragma once
#include <math.h>

#include <memory>
#include <random>
#include <vector>

#include "reference.h"
#include "tensors.h"

namespace test {

inline DLDataType dl_dtype(ref::Dtype d) { return d == ref::kF32 ? f32() : (d == ref::kBF16 ? bf16() : f16()); }

// Store x (already representable) into element i of a param/grad buffer.
inline void store(ref::Dtype d, void* data, int64_t i, double x) {
  const float f = float(x);
  uint32_t u;
  memcpy(&u, &f, 4);
  if (d == ref::kF32) {
    static_cast<float*>(data)[i] = f;
  } else if (d == ref::kBF16) {
    static_cast<uint16_t*>(data)[i] = uint16_t(u >> 16);  // x is a bf16 value: the low half is zero
  } else {
    // x is a half value: rebuild its bits from the float
    const uint32_t sign = (u >> 16) & 0x8000u;
    const double a = fabs(x);
    uint16_t h;
    if (a == 0) h = 0;
    else if (a < ldexp(1.0, -14)) h = uint16_t(nearbyint(a / ldexp(1.0, -24)));
    else {
      int e;
      const double fr = frexp(a, &e);  // a = fr * 2^e, fr in [0.5, 1)
      h = uint16_t(((e - 1 + 15) << 10) | uint32_t(nearbyint((fr * 2 - 1) * 1024)));
    }
    static_cast<uint16_t*>(data)[i] = uint16_t(h | sign);
  }
}

// A bfloat16 param ~ N(0, 1) and its float32 grad ~ N(0, 0.01^2), with fresh states of one kind (vmax too): the
// starting point of the step tests that compare two ways of running the same steps.
struct StepTensors {
  lbopt_state_kind kind;
  Buffer p, g;
  State m, v, vmax;
  StepTensors(lbopt_state_kind k, int64_t n, uint64_t seed)
      : kind(k), p(bf16(), {n}), g(f32(), {n}), m(k, n), v(k, n), vmax(k, n) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> nd;
    for (int64_t i = 0; i < n; ++i) {
      store(ref::kBF16, p.t.data, i, ref::to_dtype(ref::kBF16, nd(rng)));
      g.as<float>()[i] = float(0.01 * nd(rng));
    }
    for (State* s : {&m, &v, &vmax}) lbopt_state_init(k, n, s->view(), nullptr);
  }
  lbopt_adamw_slot slot(int64_t step, bool amsgrad = false) {
    return {sizeof(lbopt_adamw_slot), &p.t, &g.t, m.view(), v.view(), amsgrad ? vmax.view() : lbopt_state{}, step};
  }
  // The params and every code and scale.
  uint64_t digest() const {
    uint64_t d = hash(p) ^ 3 * hash(*m.codes) ^ 5 * hash(*v.codes) ^ 7 * hash(*vmax.codes);
    if (m.scales) d ^= 11 * hash(*m.scales) ^ 13 * hash(*v.scales) ^ 17 * hash(*vmax.scales);
    return d;
  }
};

inline double bf16_value(const Buffer& b, int64_t i) { return ref::load(ref::kBF16, b.t.data, i); }

inline int get_code(lbopt_state_kind kind, const Buffer& codes, int64_t i) {
  const uint8_t* c = static_cast<const uint8_t*>(codes.t.data);
  if (kind == LBOPT_STATE_4BIT) return (c[i / 2] >> (i % 2 ? 0 : 4)) & 15;
  return c[i];
}

inline void set_code(lbopt_state_kind kind, Buffer& codes, int64_t i, int code) {
  uint8_t* c = static_cast<uint8_t*>(codes.t.data);
  if (kind == LBOPT_STATE_4BIT) {
    const int shift = i % 2 ? 0 : 4;
    c[i / 2] = uint8_t((c[i / 2] & ~(15 << shift)) | (code << shift));
  } else {
    c[i] = uint8_t(code);
  }
}

// One state held by the library (buffers) and mirrored by the reference (codes, scales, plain values).
struct MirroredState {
  lbopt_state_kind kind;
  int64_t numel;
  State lib;
  ref::QState mirror;

  MirroredState(lbopt_state_kind k, int64_t n) : kind(k), numel(n), lib(k, n) {}

  // Random codes and scales (or plain values) of a plausible magnitude.
  void randomize(std::mt19937_64& rng, bool second, double magnitude) {
    std::uniform_real_distribution<double> u(0.2, 1.0);
    mirror = {};
    if (kind == LBOPT_STATE_FP32) {
      std::normal_distribution<double> nd(0.0, magnitude);
      for (int64_t i = 0; i < numel; ++i) {
        const float x = float(second ? fabs(nd(rng)) : nd(rng));
        lib.codes->as<float>()[i] = x;
        mirror.plain.push_back(x);
      }
      return;
    }
    const int64_t bs = ref::block_of(kind);
    for (int64_t b = 0; b * bs < numel; ++b) {
      const float s = float(magnitude * u(rng));
      lib.scales->as<float>()[b] = s;
      mirror.scales.push_back(s);
    }
    const int n_codes = kind == LBOPT_STATE_4BIT ? 16 : 256;
    std::uniform_int_distribution<int> uc(0, n_codes - 1);
    for (int64_t i = 0; i < numel; ++i) {
      int c = uc(rng);
      if (kind == LBOPT_STATE_FP8) c = second ? c & 0x7e : (c & 0x7f) == 0x7f ? c - 1 : c;  // no NaN, v >= 0
      set_code(kind, *lib.codes, i, c);
      mirror.codes.push_back(c);
    }
  }

  // Load the library's current buffers into the mirror (to re-sync after a step).
  void pull() {
    mirror = {};
    if (kind == LBOPT_STATE_FP32) {
      for (int64_t i = 0; i < numel; ++i) mirror.plain.push_back(lib.codes->as<float>()[i]);
      return;
    }
    for (int64_t b = 0; b < lib.scales->numel(); ++b) mirror.scales.push_back(lib.scales->as<float>()[b]);
    for (int64_t i = 0; i < numel; ++i) mirror.codes.push_back(get_code(kind, *lib.codes, i));
  }
};

// Codes differ by at most one step of the value order (e4m3: same sign one apart, or both at zero).
inline bool adjacent_codes(lbopt_state_kind kind, int a, int b) {
  if (kind != LBOPT_STATE_FP8) return abs(a - b) <= 1;
  if ((a & 0x7f) <= 1 && (b & 0x7f) <= 1) return true;
  return (a & 0x80) == (b & 0x80) && abs(a - b) <= 1;
}

}  // namespace test

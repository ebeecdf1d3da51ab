// An independent double-precision reference of lbopt's formats and step (docs/formats.md), sharing no library
// code: codebooks built by the documented rule, nearest-code search by distance, the AdamW step in
// double, and rounding to the param dtype by significand counting.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <vector>

namespace ref {

enum Kind { k4Bit = 0, k8Bit = 1, kFp8 = 2, kFp32 = 3 };
enum Dtype { kF32 = 0, kBF16 = 1, kF16 = 2 };

// bitsandbytes' dynamic map: per decade k, the midpoints of n_k equal bins of [0.1, 1] scaled by 10^(k-(e-1)).
inline std::vector<double> dynamic_map(bool is_signed, int e) {
  std::vector<double> v{0.0, 1.0};
  for (int k = 0; k < e; ++k) {
    const int n = is_signed ? (1 << k) : (1 << (k + 1));
    for (int i = 0; i < n; ++i) {
      const double lo = 0.1 + 0.9 * i / n, hi = 0.1 + 0.9 * (i + 1) / n;
      const double x = pow(10.0, k - (e - 1)) * (lo + hi) / 2;
      v.push_back(x);
      if (is_signed) v.push_back(-x);
    }
  }
  std::sort(v.begin(), v.end());
  return v;
}

inline std::vector<double> linear_map_no_zero() {
  std::vector<double> v;
  for (int k = 1; k <= 16; ++k) v.push_back(k / 16.0);
  return v;
}

inline double fp8_value(int code) {
  const int e = (code >> 3) & 15, m = code & 7;
  const double mag = e == 0 ? m * pow(2.0, -9) : (1 + m / 8.0) * pow(2.0, e - 7);
  return (code & 0x80) ? -mag : mag;
}

// The values of every code of a (kind, moment) state, moment an lbopt_moment (0 first, 1 second, 2 second on the
// signed 4-bit map); FP8 lists codes 0..255 with NaN codes excluded by the encoder below.
inline std::vector<double> table(int kind, int moment) {
  switch (kind) {
    case k4Bit: return moment == 1 ? linear_map_no_zero() : dynamic_map(true, 3);
    case k8Bit: return dynamic_map(moment == 0, 7);
    default: {
      std::vector<double> v(256);
      for (int c = 0; c < 256; ++c) v[size_t(c)] = fp8_value(c);
      return v;
    }
  }
}

struct Codec {
  int kind;
  bool second;
  std::vector<double> values;
  Codec(int k, int moment) : kind(k), second(moment != 0), values(table(k, moment)) {}

  double scale_for(double absmax) const {
    const double s = std::max(absmax, 1e-12);
    return kind == kFp8 ? s / 448.0 : s;
  }

  // Nearest code by distance; ties go to the larger value (torchao) or, for e4m3, to the even code. A positive
  // second moment never lands on a code whose value is 0.
  int encode(double x, double scale) const {
    double y = x / scale;
    int best = 0;
    double best_d = INFINITY;
    if (kind == kFp8) y = std::min(std::max(y, -448.0), 448.0);
    for (int c = 0; c < int(values.size()); ++c) {
      if (kind == kFp8 && (c & 0x7f) == 0x7f) continue;
      const double d = fabs(y - values[size_t(c)]);
      const auto prefer = [&] {  // on a tie
        return kind == kFp8 ? (c % 2 == 0 && (c & 0x7f) != 0) : values[size_t(c)] > values[size_t(best)];
      };
      if (d < best_d || (d == best_d && prefer())) {
        best = c;
        best_d = d;
      }
    }
    if (second && y > 0 && values[size_t(best)] == 0.0) best = kind == kFp8 ? 1 : best + 1;
    return best;
  }
  double decode(int code, double scale) const { return values[size_t(code)] * scale; }
};

inline float bits_to_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// Round a double to a binary format with sig significand bits and smallest normal exponent emin (nearest, ties
// to even); subnormals share the quantum of 2^(emin - sig + 1).
inline double round_to_format(double x, int sig, int emin) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e;
  frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const int exp = std::max(e - 1, emin);
  const double quantum = ldexp(1.0, exp - sig + 1);
  return nearbyint(x / quantum) * quantum;
}

inline double to_dtype(Dtype d, double x) {
  switch (d) {
    case kF32: return double(float(x));
    case kBF16: return round_to_format(x, 8, -126);
    default: return round_to_format(x, 11, -14);
  }
}

// Decode the storage of a param/grad element.
inline double load(Dtype d, const void* data, int64_t i) {
  if (d == kF32) return static_cast<const float*>(data)[i];
  const uint16_t h = static_cast<const uint16_t*>(data)[i];
  if (d == kBF16) return bits_to_float(uint32_t(h) << 16);
  const int e = (h >> 10) & 31, m = h & 1023;
  const double mag = e == 0 ? m * pow(2.0, -24) : (e == 31 ? (m ? NAN : INFINITY) : (1 + m / 1024.0) * pow(2.0, e - 15));
  return (h & 0x8000) ? -mag : mag;
}

struct Hyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 0.01;
  bool coupled = false, amsgrad = false, maximize = false;
};

// Sizes of the terms that produced each result: float32 arithmetic can only be expected to agree with the double
// result to a few ulps of these (cancellation makes the result itself a poor yardstick).
struct Magnitudes {
  std::vector<double> p, m, v;
};

// One AdamW / Adam step in double precision on decoded values. p, m, v, vmax updated in place.
inline void adamw(const Hyper& h, int64_t step, std::vector<double>& p, const std::vector<double>& grad,
                  std::vector<double>& m, std::vector<double>& v, std::vector<double>& vmax,
                  Magnitudes* mag = nullptr) {
  const double bc1 = 1 - pow(h.beta1, double(step)), bc2 = 1 - pow(h.beta2, double(step));
  if (mag) *mag = {std::vector<double>(p.size()), std::vector<double>(p.size()), std::vector<double>(p.size())};
  for (size_t i = 0; i < p.size(); ++i) {
    const double p0 = p[i], m0 = m[i];
    double g = h.maximize ? -grad[i] : grad[i];
    if (h.coupled) g += h.wd * p[i];
    else p[i] -= h.lr * h.wd * p[i];
    m[i] = h.beta1 * m[i] + (1 - h.beta1) * g;
    v[i] = h.beta2 * v[i] + (1 - h.beta2) * g * g;
    double vu = v[i];
    if (h.amsgrad) vu = vmax[i] = std::max(vmax[i], v[i]);
    const double denom = sqrt(vu) / sqrt(bc2) + h.eps;
    p[i] -= h.lr / bc1 * m[i] / denom;
    if (mag) {
      const double mag_m = h.beta1 * fabs(m0) + (1 - h.beta1) * (fabs(grad[i]) + h.wd * fabs(p0));
      mag->m[i] = mag_m;
      mag->v[i] = h.amsgrad ? vu : v[i];
      mag->p[i] = fabs(p0) * (1 + h.lr * h.wd) + h.lr / bc1 * mag_m / denom;
    }
  }
}

// A quantized state in the reference's own representation: one code per element and one scale per block.
struct QState {
  std::vector<int> codes;
  std::vector<double> scales;
  std::vector<double> plain;  // FP32 kind
};

inline int64_t block_of(int kind) { return kind == k4Bit ? 128 : 256; }

inline std::vector<double> decode(const Codec& c, const QState& s, int64_t n) {
  if (c.kind == kFp32) return s.plain;
  std::vector<double> out(static_cast<size_t>(n));
  const int64_t bs = block_of(c.kind);
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = c.decode(s.codes[size_t(i)], s.scales[size_t(i / bs)]);
  return out;
}

inline QState encode(const Codec& c, const std::vector<double>& x) {
  QState s;
  if (c.kind == kFp32) {
    for (double e : x) s.plain.push_back(double(float(e)));
    return s;
  }
  const int64_t bs = block_of(c.kind), n = int64_t(x.size());
  for (int64_t b = 0; b * bs < n; ++b) {
    double absmax = 0;
    for (int64_t i = b * bs; i < std::min(n, (b + 1) * bs); ++i) absmax = std::max(absmax, fabs(x[size_t(i)]));
    s.scales.push_back(double(float(c.scale_for(absmax))));
  }
  for (int64_t i = 0; i < n; ++i) s.codes.push_back(c.encode(x[size_t(i)], s.scales[size_t(i / bs)]));
  return s;
}

}  // namespace ref

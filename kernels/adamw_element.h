// The AdamW / Adam update of one element (ALGORITHMS.md section 4, torchao's order), in float32. Every backend
// and every dtype runs this function; the scalars that depend only on the call (lr, step) come precomputed.
#pragma once
#include <math.h>
#include <stdint.h>

#include "hd.h"

namespace lbopt {

struct StepScalars {
  float grad_factor;     // 1 / grad_scale, negated for maximize
  float lr_wd;           // lr * weight_decay (AdamW, decoupled)
  float wd;              // weight_decay (Adam, coupled into the gradient)
  float one_minus_beta1;
  float one_minus_beta2;
  float step_size;       // lr / (1 - beta1^step)
  float inv_sqrt_bc2;    // 1 / sqrt(1 - beta2^step)
  float eps;
  bool coupled_decay;
  bool amsgrad;
};

// Host side, double precision: a per-step lr and step count cost nothing on the device.
inline StepScalars make_step_scalars(double lr, int64_t step, double beta1, double beta2, double eps,
                                     double weight_decay, bool coupled_decay, bool amsgrad, bool maximize,
                                     double grad_scale) {
  const double bc1 = 1.0 - pow(beta1, double(step));
  const double bc2 = 1.0 - pow(beta2, double(step));
  StepScalars s;
  s.grad_factor = float((maximize ? -1.0 : 1.0) / grad_scale);
  s.lr_wd = float(lr * weight_decay);
  s.wd = float(weight_decay);
  s.one_minus_beta1 = float(1.0 - beta1);
  s.one_minus_beta2 = float(1.0 - beta2);
  s.step_size = float(lr / bc1);
  s.inv_sqrt_bc2 = float(1.0 / sqrt(bc2));
  s.eps = float(eps);
  s.coupled_decay = coupled_decay;
  s.amsgrad = amsgrad;
  return s;
}

// p, m, v (and vmax with AMSGrad) are updated in place. The param update uses the new unquantized moments;
// quantization error enters only from the next step.
LBOPT_HD void adamw_element(const StepScalars& s, float& p, float grad, float& m, float& v, float& vmax) {
  float g = grad * s.grad_factor;
  if (s.coupled_decay) {
    g = g + s.wd * p;
  } else {
    p = p - s.lr_wd * p;
  }
  m = m + s.one_minus_beta1 * (g - m);
  v = v + s.one_minus_beta2 * (g * g - v);
  float v_used = v;
  if (s.amsgrad) {
    vmax = fmaxf(vmax, v);
    v_used = vmax;
  }
  const float denom = sqrtf(v_used) * s.inv_sqrt_bc2 + s.eps;
  p = p - s.step_size * m / denom;
}

}  // namespace lbopt

// The AdamW / Adam update of one element, in float32, in the operation order of torch.optim.AdamW's reference
// (single-tensor) implementation, so that full-precision states reproduce it bit for bit and low-bit states
// differ from it only by quantization. Every backend and every dtype runs this function; the scalars that depend
// only on the call (lr, step) come precomputed in double precision.
#pragma once
#include <math.h>
#include <stdint.h>

#include "hd.h"

namespace lbopt {

struct StepScalars {
  float grad_factor;       // 1 / grad_scale (float32, as GradScaler's inv_scale), negated for maximize
  float decay_factor;      // 1 - lr * weight_decay (AdamW, decoupled)
  float wd;                // weight_decay (Adam, coupled into the gradient)
  float one_minus_beta1;   // the lerp weight of m
  float beta2;
  float one_minus_beta2;
  float neg_step_size;     // -lr / (1 - beta1^step)
  float sqrt_bc2;          // sqrt(1 - beta2^step)
  float eps;
  bool coupled_decay;
  bool amsgrad;
};

// In double precision, on the host for a by-value lr (a per-step lr then costs nothing on the device), or on the
// device for the capturable step, which reads lr and step there.
LBOPT_HD StepScalars make_step_scalars(double lr, int64_t step, double beta1, double beta2, double eps,
                                     double weight_decay, bool coupled_decay, bool amsgrad, bool maximize,
                                     double grad_scale) {
  const double bc1 = 1.0 - pow(beta1, double(step));
  const double bc2 = 1.0 - pow(beta2, double(step));
  StepScalars s;
  s.grad_factor = float(1.0 / grad_scale) * (maximize ? -1.0f : 1.0f);
  s.decay_factor = float(1.0 - lr * weight_decay);
  s.wd = float(weight_decay);
  s.one_minus_beta1 = float(1.0 - beta1);
  s.beta2 = float(beta2);
  s.one_minus_beta2 = float(1.0 - beta2);
  s.neg_step_size = float(-(lr / bc1));
  s.sqrt_bc2 = float(pow(bc2, 0.5));  // as Python's bc2 ** 0.5
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
    g = fmaf(s.wd, p, g);  // torch's grad.add(param, alpha=wd): one rounding
  } else {
    p = p * s.decay_factor;
  }
  // torch.lerp(m, g, w): the branch keeps it exact at both ends
  const float w = s.one_minus_beta1;
  m = w < 0.5f ? fmaf(w, g - m, m) : fmaf(-(1.0f - w), g - m, g);
  v = fmaf(s.one_minus_beta2 * g, g, v * s.beta2);
  float v_used = v;
  if (s.amsgrad) {
    vmax = fmaxf(vmax, v);
    v_used = vmax;
  }
  const float denom = sqrtf(v_used) / s.sqrt_bc2 + s.eps;
  p = p + s.neg_step_size * m / denom;
}

}  // namespace lbopt

// The element updates of every optimizer, defined in the namespace that includes this file. The SIMD kernels
// include it once per instruction set inside Highway's per-target namespace, because a target's instructions
// can only be inlined into functions defined under that target; the portable and CUDA kernels include it once.
// No include guard, by design.
#ifndef LBOPT_OPTIMIZERS_H
#error "include kernels/optimizers.h at namespace scope first"
#endif
#define LBOPT_DEFINE_UPDATES

// torch.lerp(start, end, w) for a weight fixed per call, small = |w| < 0.5: start + w (end - start), else
// end - (1 - w) (end - start), each one fused multiply-add as torch's vectorized CPU kernel has it: exact at both
// ends of the weight's range.
template <class O>
LBOPT_HD typename O::V torch_lerp(typename O::V start, typename O::V end, float w, bool small) {
  return small ? O::fma(O::set(w), O::sub(end, start), start) : O::fma(O::set(w - 1.0f), O::sub(end, start), end);
}

#include "adamw.h"
#include "ademamix.h"
#include "lion.h"
#include "muon.h"
#include "sgd.h"
#undef LBOPT_DEFINE_UPDATES

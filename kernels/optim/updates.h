// The element updates of every optimizer, defined in the namespace that includes this file. The SIMD kernels
// include it once per instruction set inside Highway's per-target namespace, because a target's instructions
// can only be inlined into functions defined under that target; the portable and CUDA kernels include it once.
// No include guard, by design.
#ifndef LBOPT_OPTIMIZERS_H
#error "include kernels/optimizers.h at namespace scope first"
#endif
#define LBOPT_DEFINE_UPDATES
#include "adamw.h"
#include "ademamix.h"
#include "lion.h"
#include "sgd.h"
#undef LBOPT_DEFINE_UPDATES

// What a backend needs to run a validated step: raw pointers, dtypes and per-slot scalars. Built by
// src/validate.cpp from the caller's DLTensors; consumed by the CPU and CUDA kernels.
#pragma once
#include <stdint.h>

#include "optimizers.h"

namespace lbopt {

enum Dtype : uint8_t { kFloat32 = 0, kBfloat16 = 1, kFloat16 = 2 };

struct StateRef {
  void* codes = nullptr;     // uint8 codes, or float32 values for the FP32 kind
  float* scales = nullptr;   // one per block; null for the FP32 kind
};

struct StepSlot {
  void* param = nullptr;
  const void* grad = nullptr;
  int64_t numel = 0;
  int64_t step = 0;
  Dtype param_dtype = kFloat32;
  Dtype grad_dtype = kFloat32;
  StateRef states[kMaxStates];  // the optimizer's active states first, the rest null
  // Derived for a by-value step (derive_scalars in src/validate.cpp); the capturable CUDA step derives them on
  // the device. grad_factor folds in a host grad_scale; CUDA kernels multiply by their device one.
  float grad_factor = 1.0f;
  OptScalars scalars{};
};

}  // namespace lbopt

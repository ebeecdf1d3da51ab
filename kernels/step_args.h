// What a backend needs to run a validated step: raw pointers, dtypes and per-slot scalars. Built by
// src/validate.cpp from the caller's DLTensors; consumed by the CPU and CUDA kernels.
#pragma once
#include <stdint.h>

#include "adamw_element.h"

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
  StateRef m, v, vmax;         // vmax only with AMSGrad
  StepScalars scalars{};       // derived by validation for a by-value step (src/validate.cpp)
};

}  // namespace lbopt

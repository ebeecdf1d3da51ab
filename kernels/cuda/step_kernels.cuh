// CUDA kernels of the step and of the state conversions, over the shared per-element and per-value math. One
// warp handles one scale block (4-bit: 128 elements, 4 per lane; 8-bit/FP8: 256, 8 per lane; FP32: chunks of
// 256), lanes striding by 32 so each load and store instruction is coalesced (with gpu_wide_step, by runs of 4
// elements, loaded and stored as vectors where the tensors are aligned); a launch covers up to
// kMaxSlotsPerLaunch tensors, their metadata passed by value as a __grid_constant__ kernel parameter (no upload,
// no device buffer, captured as is by CUDA graphs).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "../step_args.h"

namespace lbopt::cuda {

constexpr int kMaxSlotsPerLaunch = 128;

struct StepLaunch {
  int n_slots;
  int kind;
  Hyper hyper;
  bool stochastic_round;        // bfloat16 params
  bool state_stochastic_round;  // the codes of quantized first-moment states
  uint64_t seed;
  // capturable: lr and step read on the device, scalars recomputed there in double precision
  const void* lr_scalar;
  const void* step_scalar;
  bool lr_is_double;
  bool step_is_int64;
  const float* grad_scale;  // AMP, read on the device
  const float* found_inf;
  uint8_t* skip;            // [n_slots]: 1 = leave the slot untouched (non-finite scan), doubles as the output
  int64_t total_blocks;
  int64_t first_block[kMaxSlotsPerLaunch + 1];
  StepSlot slots[kMaxSlotsPerLaunch];
};

struct ConvertLaunch {
  int kind;
  Moment moment;
  bool to_state;
  int64_t numel;
  float* values;
  StateRef state;
};

cudaError_t launch_nonfinite_scan(const StepLaunch& a, cudaStream_t stream);
cudaError_t launch_step(const StepLaunch& a, cudaStream_t stream);
cudaError_t launch_convert(const ConvertLaunch& a, cudaStream_t stream);

}  // namespace lbopt::cuda

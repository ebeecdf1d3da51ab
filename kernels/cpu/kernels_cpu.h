// CPU kernels: each processes a range of work blocks of one tensor; src/backend_cpu.cpp spreads the ranges of
// all tensors of a call over the thread pool. Blocks are independent, so any split gives identical results.
#pragma once
#include <stdint.h>

#include "../quant.h"
#include "../step_args.h"

namespace lbopt::cpu {

// What every slot of a call shares.
struct StepFlags {
  Hyper hyper;            // the optimizer and what selects its states (the numbers are in the slots' scalars)
  int kind;
  bool stochastic_round;  // bfloat16 params only
  bool state_stochastic_round;  // the codes of quantized first-moment states (Codec::round_stochastic)
  uint64_t seed;
};

void step_blocks(const StepSlot& slot, const StepFlags& flags, int64_t block_begin, int64_t block_end);

// The SIMD kernels (step_simd.cpp) on the whole blocks they support, from block_begin on; returns the first
// block they did not do, which the portable kernels then take.
int64_t step_blocks_simd(const StepSlot& slot, const StepFlags& flags, int64_t block_begin, int64_t block_end);
// The same for optimizer Opt's slots, on whole blocks (step_simd_optimizer.cpp, a unit per optimizer).
template <class Opt>
int64_t step_blocks_simd_of(const StepSlot& slot, const StepFlags& flags, int64_t block_begin, int64_t block_end);

// The same for lbopt_quantize / lbopt_dequantize.
int64_t quantize_blocks_simd(const StateCodec& codec, const float* src, StateRef dst, int64_t numel,
                             int64_t block_begin, int64_t block_end);
int64_t dequantize_blocks_simd(const StateCodec& codec, StateRef src, float* dst, int64_t numel,
                               int64_t block_begin, int64_t block_end);

// The instruction set the SIMD kernels dispatch to here ("AVX3", "AVX2", ...), or "portable".
const char* simd_target();

// Whether the CPU has AVX512_BF16, whose conversion the AVX-512 kernels round bf16 params with.
bool cpu_has_bf16_convert();

// True if any element of grad[begin, end) is NaN or Inf.
bool has_nonfinite(const void* grad, Dtype dtype, int64_t begin, int64_t end);

// float32 <-> state over whole blocks [block_begin, block_end) of a tensor with numel elements.
void quantize_blocks(const StateCodec& codec, const float* src, StateRef dst, int64_t numel, int64_t block_begin,
                     int64_t block_end);
void dequantize_blocks(const StateCodec& codec, StateRef src, float* dst, int64_t numel, int64_t block_begin,
                       int64_t block_end);

}  // namespace lbopt::cpu

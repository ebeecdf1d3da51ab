#include <cub/warp/warp_reduce.cuh>
#include <cuda/functional>

#include "../dtype_convert.h"
#include "../quant.h"
#include "codebooks_device.cuh"
#include "step_kernels.cuh"

namespace lbopt::cuda {
namespace {

#include "../optim/updates.h"

constexpr int kThreads = 256;  // 8 warps per CTA
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGrid = 65535;

__device__ __forceinline__ float load_elem(Dtype dt, const void* p, int64_t i) {
  switch (dt) {
    case kBfloat16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case kFloat16: return f16_to_float(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store_param(const StepSlot& s, int64_t i, float x, bool sr, uint64_t seed,
                                            int64_t step) {
  switch (s.param_dtype) {
    case kBfloat16:
      static_cast<uint16_t*>(s.param)[i] =
          sr ? float_to_bf16_stochastic(x, random_bits(seed, uint64_t(step), uint64_t(i))) : float_to_bf16(x);
      break;
    case kFloat16: static_cast<uint16_t*>(s.param)[i] = float_to_f16(x); break;
    default: static_cast<float*>(s.param)[i] = x;
  }
}

template <int KIND>
__device__ __forceinline__ float load_state(const StateCodec& c, StateRef st, int64_t e, float scale) {
  if (KIND == kStateFp32) return static_cast<const float*>(st.codes)[e];
  const uint8_t* codes = static_cast<const uint8_t*>(st.codes);
  return c.decode(KIND == kState4Bit ? nibble_get(codes, e) : codes[e], scale);
}

// Max over the warp, in every lane.
__device__ __forceinline__ float warp_max(float x) {
  using Reduce = cub::WarpReduce<float>;
  __shared__ typename Reduce::TempStorage temp[kWarps];
  const float lane0 = Reduce(temp[threadIdx.x / 32]).Reduce(x, ::cuda::maximum<float>{});
  __syncwarp();  // the temporary storage is reused by the next reduction
  return __shfl_sync(0xffffffffu, lane0, 0);
}

// Requantize the E values this lane holds of block b (local indices given) with the warp's absmax scale.
template <int KIND, int E>
__device__ __forceinline__ void store_block(const StateCodec& c, StateRef st, int64_t b, int64_t start, int64_t n,
                                            const int (&local)[E], const float (&x)[E], int lane) {
  if (KIND == kStateFp32) {
#pragma unroll
    for (int k = 0; k < E; ++k)
      if (local[k] < n) static_cast<float*>(st.codes)[start + local[k]] = x[k];
    return;
  }
  float absmax = 0.0f;
#pragma unroll
  for (int k = 0; k < E; ++k)
    if (local[k] < n) absmax = fmaxf(absmax, fabsf(finite_or_zero(x[k])));
  const float scale = c.scale_for(warp_max(absmax));
  if (lane == 0) st.scales[b] = scale;
  uint8_t* codes = static_cast<uint8_t*>(st.codes);
  if (KIND == kState4Bit) {  // lane holds pairs (2q, 2q+1) for q = lane, lane + 32: one byte each
#pragma unroll
    for (int k = 0; k < E; k += 2) {
      if (local[k] >= n) continue;
      const uint32_t hi = c.encode(finite_or_zero(x[k]), scale);
      const uint32_t lo = local[k + 1] < n ? c.encode(finite_or_zero(x[k + 1]), scale) : 0u;
      codes[(start + local[k]) >> 1] = uint8_t((hi << 4) | lo);
    }
  } else {
#pragma unroll
    for (int k = 0; k < E; ++k)
      if (local[k] < n) codes[start + local[k]] = uint8_t(c.encode(finite_or_zero(x[k]), scale));
  }
}

template <int KIND>
struct Geometry {
  static constexpr int64_t kBlock = KIND == kState4Bit ? kBlock4Bit : KIND == kState8Bit ? kBlock8Bit : kBlockFp8;
  static constexpr int kPerLane = int(kBlock / 32);  // a warp per block
  // Element of a block handled by lane, k-th: 4-bit keeps nibble pairs in one lane.
  __device__ static int local(int lane, int k) {
    return KIND == kState4Bit ? 2 * (lane + 32 * (k >> 1)) + (k & 1) : lane + 32 * k;
  }
};

__device__ __forceinline__ int slot_of(const StepLaunch& a, int64_t block) {
  int lo = 0, hi = a.n_slots - 1;  // the last slot whose first block is <= block
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.first_block[mid] <= block) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

template <class Opt, int KIND>
__global__ void __launch_bounds__(kThreads) step_kernel(const __grid_constant__ StepLaunch a) {
  using G = Geometry<KIND>;
  constexpr int E = G::kPerLane;
  const int lane = threadIdx.x & 31;
  const int64_t warp0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t n_warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  const CodebookTables tables = shared_codebooks<KIND>();

  // Device scalars: AMP overflow or an out-of-range scale, lr or step writes no param or state.
  bool skip_all = a.found_inf && *a.found_inf != 0.0f;
  double grad_scale = 1.0;
  if (a.grad_scale) {
    grad_scale = *a.grad_scale;
    skip_all |= !(grad_scale > 0.0 && isfinite(grad_scale) && isfinite(float(1.0 / grad_scale)));
  }
  double lr = 0.0, step = 0.0;
  if (a.lr_scalar) {
    lr = a.lr_is_double ? *static_cast<const double*>(a.lr_scalar) : double(*static_cast<const float*>(a.lr_scalar));
    step = a.step_is_int64 ? double(*static_cast<const int64_t*>(a.step_scalar))
                           : double(*static_cast<const float*>(a.step_scalar));
    skip_all |= !(lr >= 0.0 && isfinite(lr) && step >= 1.0 && step < 9.2e18 && step == floor(step));
  }
  if (skip_all) {
    for (int64_t i = warp0 * 32 + lane; i < a.n_slots; i += n_warps * 32) a.skip[i] = 1;
    return;
  }
  // Loops over states run to kMaxStates, guarded, so that they unroll and the per-state arrays stay in registers
  const int n_states = Opt::states(a.hyper);
  StateCodec codec[kMaxStates];
#pragma unroll
  for (int k = 0; k < kMaxStates; ++k) codec[k] = codec_for(KIND, Opt::second_moment(k), tables);
  const float device_factor = a.grad_scale ? grad_factor(grad_scale, false) : 1.0f;
  // The capturable step's scalars are the same for every slot
  const OptScalars device_scalars = a.lr_scalar ? make_scalars(a.hyper, lr, int64_t(step)) : OptScalars{};
  const float device_grad_factor = grad_factor(1.0, a.hyper.maximize);
  for (int64_t w = warp0; w < a.total_blocks; w += n_warps) {
    const int s = slot_of(a, w);
    if (a.skip[s]) continue;  // a non-finite gradient somewhere in this tensor
    const StepSlot& sl = a.slots[s];
    const int64_t slot_step = a.lr_scalar ? int64_t(step) : sl.step;
    const typename Opt::Scalars sc =  // by value: a reference to either would put device_scalars in local memory
        a.lr_scalar ? device_scalars.template get<Opt>() : sl.scalars.template get<Opt>();
    const float factor = (a.lr_scalar ? device_grad_factor : sl.grad_factor) * device_factor;
    const int64_t b = w - a.first_block[s];
    const int64_t start = b * G::kBlock;
    const int64_t n = min(G::kBlock, sl.numel - start);
    // Every load of the block is issued before the first store: the compiler cannot tell that a param store
    // aliases none of the later loads, so loads left after it would each wait for it
    float scale[kMaxStates] = {};
#pragma unroll
    for (int k = 0; k < kMaxStates; ++k)
      if (KIND != kStateFp32 && k < n_states) scale[k] = sl.states[k].scales[b];
    int local[E];
    float p[E], g[E], x[kMaxStates][E];
#pragma unroll
    for (int j = 0; j < E; ++j) {
      local[j] = G::local(lane, j);
      const bool in = local[j] < n;
      const int64_t e = start + local[j];
      p[j] = in ? load_elem(sl.param_dtype, sl.param, e) : 0.0f;
      g[j] = in ? load_elem(sl.grad_dtype, sl.grad, e) : 0.0f;
#pragma unroll
      for (int k = 0; k < kMaxStates; ++k)
        x[k][j] = in && k < n_states ? load_state<KIND>(codec[k], sl.states[k], e, scale[k]) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < E; ++j)
      if (local[j] < n) update<ScalarOps>(sc, p[j], g[j] * factor, x[0][j], x[1][j], x[2][j]);
#pragma unroll
    for (int j = 0; j < E; ++j)
      if (local[j] < n) store_param(sl, start + local[j], p[j], a.stochastic_round, a.seed, slot_step);
    __syncwarp();  // every lane has read the old codes and scales before any lane writes new ones
#pragma unroll
    for (int k = 0; k < kMaxStates; ++k)
      if (k < n_states) store_block<KIND, E>(codec[k], sl.states[k], b, start, n, local, x[k], lane);
    __syncwarp();
  }
}

template <int KIND>
__global__ void __launch_bounds__(kThreads) nonfinite_kernel(const __grid_constant__ StepLaunch a) {
  using G = Geometry<KIND>;
  const int lane = threadIdx.x & 31;
  const int64_t warp0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t n_warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t w = warp0; w < a.total_blocks; w += n_warps) {
    const int s = slot_of(a, w);
    const StepSlot& sl = a.slots[s];
    const int64_t start = (w - a.first_block[s]) * G::kBlock;
    const int64_t n = min(G::kBlock, sl.numel - start);
    bool bad = false;
    for (int k = 0; k < G::kPerLane; ++k) {
      const int64_t l = G::local(lane, k);
      if (l < n) bad |= !isfinite(load_elem(sl.grad_dtype, sl.grad, start + l));
    }
    if (__any_sync(0xffffffffu, bad) && lane == 0) a.skip[s] = 1;  // a benign race: every writer writes 1
  }
}

template <int KIND>
__global__ void __launch_bounds__(kThreads) convert_kernel(const ConvertLaunch a, int64_t n_blocks) {
  using G = Geometry<KIND>;
  constexpr int E = G::kPerLane;
  const int lane = threadIdx.x & 31;
  const StateCodec c = codec_for(KIND, a.second_moment, shared_codebooks<KIND>());
  for (int64_t b = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; b < n_blocks;
       b += (int64_t(gridDim.x) * blockDim.x) >> 5) {
    const int64_t start = b * G::kBlock;
    const int64_t n = min(G::kBlock, a.numel - start);
    const float scale = KIND == kStateFp32 ? 0.0f : a.state.scales[b];
    int local[E];
    float x[E];
#pragma unroll
    for (int k = 0; k < E; ++k) {
      local[k] = G::local(lane, k);
      x[k] = 0.0f;
      if (local[k] >= n) continue;
      if (a.to_state) x[k] = a.values[start + local[k]];
      else a.values[start + local[k]] = load_state<KIND>(c, a.state, start + local[k], scale);
    }
    if (a.to_state) store_block<KIND, E>(c, a.state, b, start, n, local, x, lane);
  }
}

int grid_for(int64_t warps_needed) {
  const int64_t ctas = (warps_needed + kWarps - 1) / kWarps;
  return int(ctas < 1 ? 1 : (ctas > kMaxGrid ? kMaxGrid : ctas));
}

template <template <int> class Kernel, class Args, class... Rest>
cudaError_t launch_kind(int kind, int64_t warps, cudaStream_t stream, const Args& a, Rest... rest) {
  const int grid = grid_for(warps);
  switch (kind) {
    case kState4Bit: Kernel<kState4Bit>::launch(grid, stream, a, rest...); break;
    case kState8Bit: Kernel<kState8Bit>::launch(grid, stream, a, rest...); break;
    case kStateFp8: Kernel<kStateFp8>::launch(grid, stream, a, rest...); break;
    default: Kernel<kStateFp32>::launch(grid, stream, a, rest...);
  }
  return cudaGetLastError();
}

template <class Opt>
struct Step {
  template <int K>
  struct Kind {
    static void launch(int grid, cudaStream_t s, const StepLaunch& a) {
      step_kernel<Opt, K><<<grid, kThreads, 0, s>>>(a);
    }
  };
};
template <int K>
struct Nonfinite {
  static void launch(int grid, cudaStream_t s, const StepLaunch& a) {
    nonfinite_kernel<K><<<grid, kThreads, 0, s>>>(a);
  }
};
template <int K>
struct Convert {
  static void launch(int grid, cudaStream_t s, const ConvertLaunch& a, int64_t n_blocks) {
    convert_kernel<K><<<grid, kThreads, 0, s>>>(a, n_blocks);
  }
};

}  // namespace

cudaError_t launch_nonfinite_scan(const StepLaunch& a, cudaStream_t stream) {
  return launch_kind<Nonfinite>(a.kind, a.total_blocks, stream, a);
}

cudaError_t launch_step(const StepLaunch& a, cudaStream_t stream) {
  return with_optimizer(a.hyper.optimizer, [&](auto opt) {
    return launch_kind<Step<decltype(opt)>::template Kind>(a.kind, a.total_blocks, stream, a);
  });
}

cudaError_t launch_convert(const ConvertLaunch& a, cudaStream_t stream) {
  const int64_t block = work_block_size(a.kind);
  const int64_t n_blocks = (a.numel + block - 1) / block;
  if (n_blocks == 0) return cudaSuccess;
  return launch_kind<Convert>(a.kind, n_blocks, stream, a, n_blocks);
}

}  // namespace lbopt::cuda

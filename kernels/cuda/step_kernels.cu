#include <cub/warp/warp_reduce.cuh>
#include <cuda/functional>

#include "../dtype_convert.h"
#include "../codebook8_arith.h"
#include "../encode_in_x.h"
#include "../quant.h"
#include "codebooks_device.cuh"
#include "fp8_cvt.cuh"
#include "step_kernels.cuh"

namespace lbopt::cuda {
namespace {

#include "../optim/updates.h"

constexpr int kThreads = 256;  // 8 warps per CTA
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGrid = 65535;
// The 4-bit encode by thresholds on x (meson option gpu_encode_in_x): the same codes without a division per
// element, tested bit for bit on the CPU (tests/unit/test_encode_in_x.cpp); the division stays the default until
// a GPU run passes the GPU suite with it.
#ifndef LBOPT_CUDA_ENCODE_IN_X
#define LBOPT_CUDA_ENCODE_IN_X 0
#endif
constexpr bool kEncodeInX = LBOPT_CUDA_ENCODE_IN_X;
// The 8-bit encode by buckets of the float's bits (meson option gpu_encode8_buckets; kernels/codebook8_arith.h,
// the CPU's SIMD encode): one table read and one compare per code instead of an 8-step search, the same codes for
// every float (tests/unit/test_codebook8_arith.cpp); the search stays the default until a GPU run passes the GPU
// suite with it.
#ifndef LBOPT_CUDA_ENCODE8_BUCKETS
#define LBOPT_CUDA_ENCODE8_BUCKETS 0
#endif
constexpr bool kEncode8Buckets = LBOPT_CUDA_ENCODE8_BUCKETS;
template <class K>
constexpr bool kBucketEncode = kEncode8Buckets && K::entries == 256;
// The FP8 encode by the conversion instruction of sm_89+ (meson option gpu_fp8_cvt; fp8_cvt.cuh): off until a GPU
// run has compared it with the software encode on every float (the GPU suite does) and passed the suite with it.
#ifndef LBOPT_CUDA_FP8_CVT
#define LBOPT_CUDA_FP8_CVT 0
#endif
template <class K>
constexpr bool kCvtEncode = LBOPT_CUDA_FP8_CVT && K::id == kStateFp8;

// The bucket tables of the signed and unsigned 8-bit maps (about 11 KiB each), in device memory and, for the
// kernels that encode with them, copied into each CTA's shared memory (a lane reads its own bucket).
__device__ const Encode8Tables kEncode8Device[2] = {kEncode8Signed, kEncode8Unsigned};

template <class K>
__device__ __forceinline__ const Encode8Tables* shared_encode8() {
  if constexpr (!kBucketEncode<K>) {
    return nullptr;
  } else {
    __shared__ Encode8Tables t[2];
    const int32_t* src = reinterpret_cast<const int32_t*>(kEncode8Device);
    int32_t* dst = reinterpret_cast<int32_t*>(t);
    for (int i = threadIdx.x; i < int(sizeof t / sizeof(int32_t)); i += blockDim.x) dst[i] = src[i];
    __syncthreads();
    return t;
  }
}

// A warp's grid-stride loop over blocks: its first block and the stride, the grid's warp count.
struct WarpStride {
  int64_t first, count;
};
__device__ __forceinline__ WarpStride warp_stride() {
  return {(int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5, (int64_t(gridDim.x) * blockDim.x) >> 5};
}

// Element i of a block that starts at base (the non-finite scan's load; the step loads a block at a time). The
// kernels index within a block with 32-bit offsets from per-block base pointers.
__device__ __forceinline__ float load_elem(Dtype dt, const void* base, int i) {
  switch (dt) {
    case kBfloat16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case kFloat16: return f16_to_float(static_cast<const uint16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

// The E elements at local[] (those < n unless FULL) of a block, as floats: every load is issued, under one dtype
// branch, before the first conversion waits for one. (A conversion inside a per-element branch would wait for
// its load before the next load issues, which slows the 16-bit dtypes most: docs/benchmarks.md, "GPU kernel
// choices".)
template <bool FULL, int E>
__device__ __forceinline__ void load_block(Dtype dt, const void* base, const int (&local)[E], int n, float (&out)[E]) {
  uint32_t raw[E];
  if (dt == kFloat32) {
#pragma unroll
    for (int j = 0; j < E; ++j) raw[j] = FULL || local[j] < n ? static_cast<const uint32_t*>(base)[local[j]] : 0u;
  } else {
#pragma unroll
    for (int j = 0; j < E; ++j) raw[j] = FULL || local[j] < n ? static_cast<const uint16_t*>(base)[local[j]] : 0u;
  }
  if (dt == kBfloat16) {
#pragma unroll
    for (int j = 0; j < E; ++j) out[j] = bf16_to_float(uint16_t(raw[j]));
  } else if (dt == kFloat16) {
#pragma unroll
    for (int j = 0; j < E; ++j) out[j] = f16_to_float(uint16_t(raw[j]));
  } else {
#pragma unroll
    for (int j = 0; j < E; ++j) out[j] = __uint_as_float(raw[j]);
  }
}

// e: the element's index in its tensor, which keys stochastic rounding.
__device__ __forceinline__ void store_param(Dtype dt, void* base, int i, float x, bool sr, uint64_t seed,
                                            int64_t step, int64_t e) {
  switch (dt) {
    case kBfloat16:
      static_cast<uint16_t*>(base)[i] =
          sr ? float_to_bf16_stochastic(x, random_bits(seed, uint64_t(step), uint64_t(e))) : float_to_bf16(x);
      break;
    case kFloat16: static_cast<uint16_t*>(base)[i] = float_to_f16(x); break;
    default: static_cast<float*>(base)[i] = x;
  }
}

template <class K>
struct Geometry {
  static constexpr int kBlock = int(K::work_block);
  static constexpr int kPerLane = kBlock / 32;  // a warp per block
  // Element of a block handled by lane, k-th: 4-bit keeps nibble pairs in one lane.
  __device__ static int local(int lane, int k) {
    return K::code_bits == 4 ? 2 * (lane + 32 * (k >> 1)) + (k & 1) : lane + 32 * k;
  }
  // A state's codes from the block's first element on.
  __device__ static void* codes_at(void* codes, int64_t start) {
    return static_cast<char*>(codes) + state_byte<K>(start);
  }
};

// A state's value at element i of a block whose codes start at codes.
template <class K>
__device__ __forceinline__ float load_state(const Codec<K>& c, const void* codes, int i, float scale) {
  if constexpr (K::float_codes) return static_cast<const float*>(codes)[i];
  else return c.decode(code_at<K>(static_cast<const uint8_t*>(codes), i), scale);
}

// Max over the warp of values >= 0, in every lane: their IEEE bits order as the values do.
__device__ __forceinline__ float warp_max_nonnegative(float x) {
#if __CUDA_ARCH__ >= 800
  return __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(x)));
#else
  using Reduce = cub::WarpReduce<float>;
  __shared__ typename Reduce::TempStorage temp[kWarps];
  const float lane0 = Reduce(temp[threadIdx.x / 32]).Reduce(x, ::cuda::maximum<float>{});
  __syncwarp();  // the temporary storage is reused by the next reduction
  return __shfl_sync(0xffffffffu, lane0, 0);
#endif
}

// The thresholds in x of a 4-bit map for block scale s (encode_in_x.h), in this warp's row of shared memory: lane
// k < 16 computes threshold k. Every lane of the warp calls it; the row stays valid until its next call.
template <class K>
__device__ __forceinline__ const float* warp_thresholds(const Codec<K>& c, float s, int lane) {
  __shared__ float rows[kWarps][16];
  float* row = rows[threadIdx.x / 32];
  __syncwarp();  // every lane is done with the previous thresholds
  if (lane < 16) row[lane] = threshold_in_x(c.mids, lane, s);
  __syncwarp();
  return row;
}

// Requantize the E values this lane holds of a block of n elements (FULL: n is the block size) whose codes start
// at codes, with the warp's absmax scale, stored to *scale_out. buckets: both 8-bit maps' bucket tables
// (shared_encode8), or NULL where the kernel searches the codebook. sr: the codes round stochastically, keyed by
// the block's state_round_key.
template <class K, bool FULL, int E>
__device__ __forceinline__ void store_block(const Codec<K>& c, const Encode8Tables* buckets, void* codes,
                                            float* scale_out, int n, const int (&local)[E], const float (&x)[E],
                                            int lane, bool sr = false, uint32_t key = 0) {
  if constexpr (K::float_codes) {
#pragma unroll
    for (int k = 0; k < E; ++k)
      if (FULL || local[k] < n) static_cast<float*>(codes)[local[k]] = x[k];
  } else {
    float absmax = 0.0f;
#pragma unroll
    for (int k = 0; k < E; ++k)
      if (FULL || local[k] < n) absmax = fmaxf(absmax, fabsf(finite_or_zero(x[k])));
    const auto scale = c.block_scale(warp_max_nonnegative(absmax));
    if (lane == 0) *scale_out = scale.scale;
    uint8_t* b = static_cast<uint8_t*>(codes);
    if constexpr (K::code_bits == 4) {  // lane holds pairs (2q, 2q+1) for q = lane, lane + 32: one byte each
      // kEncodeInX: the codes of x itself, searched among thresholds: Codec::encode's without a division
      static_assert(K::entries == 16 && !K::reciprocal && !K::zero_code, "thresholds in x serve a 4-bit map");
      const float* t = nullptr;
      if constexpr (kEncodeInX) t = warp_thresholds(c, scale.scale, lane);  // (not even compiled when off)
      const auto code = [&](float v, int l) {
        uint32_t q;
        if constexpr (kEncodeInX) q = codebook_encode(t, 16, v);
        else q = c.encode(v, scale);
        return sr ? c.round_stochastic(q, v, scale.scale, state_round_bits(key, uint32_t(l))) : q;
      };
#pragma unroll
      for (int k = 0; k < E; k += 2) {
        if (!FULL && local[k] >= n) continue;
        const uint32_t hi = code(finite_or_zero(x[k]), local[k]);
        const uint32_t lo = FULL || local[k + 1] < n ? code(finite_or_zero(x[k + 1]), local[k + 1]) : 0u;
        b[local[k] >> 1] = uint8_t((hi << 4) | lo);
      }
    } else {
      const auto code = [&](float v, int l) {  // Codec::encode, with the encode of y chosen by the build options
        const float y = c.encode_input(v, scale);
        uint32_t q;
        if constexpr (kBucketEncode<K>) q = codebook8_encode_arith(buckets[c.second ? 1 : 0], y);
        else if constexpr (kCvtEncode<K>) q = fp8_e4m3_encode_cvt(y);
        else q = K::encode_value(y, c.mids);
        q = c.guard_zero(q, y);
        return sr ? c.round_stochastic(q, v, scale.scale, state_round_bits(key, uint32_t(l))) : q;
      };
#pragma unroll
      for (int k = 0; k < E; ++k)
        if (FULL || local[k] < n) b[local[k]] = uint8_t(code(finite_or_zero(x[k]), local[k]));
    }
  }
}

__device__ __forceinline__ int slot_of(const StepLaunch& a, int64_t block) {
  int lo = 0, hi = a.n_slots - 1;  // the last slot whose first block is <= block
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.first_block[mid] <= block) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// What a warp needs of its slot for one block, read once: dtypes, scalars, and pointers at the block's start.
template <class Opt, class K>
struct BlockArgs {
  typename Opt::Scalars sc;
  float factor;
  int64_t step, block, start;
  int n;
  Dtype param_dtype, grad_dtype;
  void* param;
  const void* grad;
  void* codes[kMaxStates];
  float* scales[kMaxStates];
};

// The codecs of an optimizer's states and the 8-bit bucket tables, over this CTA's shared copies: every thread of
// the CTA makes them before any returns (the copies synchronize the CTA). Loops over states run to kMaxStates,
// guarded, so that they unroll and the per-state arrays stay in registers.
template <class Opt, class K>
struct StepCodecs {
  Codec<K> codec[kMaxStates];
  const Encode8Tables* buckets;
};
template <class Opt, class K>
__device__ __forceinline__ StepCodecs<Opt, K> step_codecs() {
  StepCodecs<Opt, K> c;
  const CodebookTables tables = shared_codebooks<K>();
#pragma unroll
  for (int s = 0; s < kMaxStates; ++s) c.codec[s] = codec_of<K>(Opt::second_moment(s), tables);
  c.buckets = shared_encode8<K>();
  return c;
}

// One block of a slot: every load is issued before the first store (the compiler cannot tell that a param store
// aliases none of the later loads, so loads left after it would each wait for it). FULL: all kBlock elements,
// no bounds checks.
template <class Opt, class K, bool FULL>
__device__ __forceinline__ void step_block(const BlockArgs<Opt, K>& k, const StepCodecs<Opt, K>& c, int n_states,
                                           bool sr, bool state_sr, uint64_t seed, int lane) {
  using G = Geometry<K>;
  constexpr int E = G::kPerLane;
  float scale[kMaxStates] = {};
#pragma unroll
  for (int s = 0; s < kMaxStates; ++s)
    if (!K::float_codes && s < n_states) scale[s] = *k.scales[s];
  int local[E];
  float p[E], g[E], x[kMaxStates][E];
#pragma unroll
  for (int j = 0; j < E; ++j) local[j] = G::local(lane, j);
  load_block<FULL>(k.param_dtype, k.param, local, k.n, p);
  load_block<FULL>(k.grad_dtype, k.grad, local, k.n, g);
#pragma unroll
  for (int j = 0; j < E; ++j)
#pragma unroll
    for (int s = 0; s < kMaxStates; ++s)
      x[s][j] = (FULL || local[j] < k.n) && s < n_states ? load_state<K>(c.codec[s], k.codes[s], local[j], scale[s])
                                                        : 0.0f;
#pragma unroll
  for (int j = 0; j < E; ++j)
    if (FULL || local[j] < k.n) update<ScalarOps>(k.sc, p[j], g[j] * k.factor, x[0][j], x[1][j], x[2][j]);
#pragma unroll
  for (int j = 0; j < E; ++j)
    if (FULL || local[j] < k.n)
      store_param(k.param_dtype, k.param, local[j], p[j], sr, seed, k.step, k.start + local[j]);
  __syncwarp();  // every lane has read the old codes and scales before any lane writes new ones
#pragma unroll
  for (int s = 0; s < kMaxStates; ++s)
    if (s < n_states) {
      const bool sr_codes = state_sr && !c.codec[s].second;
      const uint32_t key = sr_codes ? state_round_key(seed, k.step, s, k.block) : 0u;
      store_block<K, FULL>(c.codec[s], c.buckets, k.codes[s], k.scales[s], k.n, local, x[s], lane, sr_codes, key);
    }
  __syncwarp();
}

// At least 3 CTAs (24 warps) per multiprocessor for the quantized kinds: the step is bound by latency, and on an
// H200 this cap (80 registers, some spilled) runs them faster than the 94-128 registers uncapped; the FP32 kind
// runs fastest uncapped (docs/benchmarks.md, "GPU kernel choices").
template <class Opt, class K>
__global__ void __launch_bounds__(kThreads, K::float_codes ? 1 : 3)
    step_kernel(const __grid_constant__ StepLaunch a) {
  using G = Geometry<K>;
  const int lane = threadIdx.x & 31;
  const WarpStride warps = warp_stride();
  const StepCodecs<Opt, K> codecs = step_codecs<Opt, K>();

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
    for (int64_t i = warps.first * 32 + lane; i < a.n_slots; i += warps.count * 32) a.skip[i] = 1;
    return;
  }
  const int n_states = Opt::states(a.hyper);
  const float device_factor = a.grad_scale ? grad_factor(grad_scale, false) : 1.0f;
  // The capturable step's scalars are the same for every slot: derived once per CTA, kept out of registers
  __shared__ OptScalars device_scalars;
  if (a.lr_scalar && threadIdx.x == 0) device_scalars = make_scalars(a.hyper, lr, int64_t(step));
  __syncthreads();
  const float device_grad_factor = grad_factor(1.0, a.hyper.maximize);
  for (int64_t w = warps.first; w < a.total_blocks; w += warps.count) {
    const int s = slot_of(a, w);
    if (a.skip[s]) continue;  // a non-finite gradient somewhere in this tensor
    const StepSlot& sl = a.slots[s];
    BlockArgs<Opt, K> k;
    k.sc = a.lr_scalar ? device_scalars.template get<Opt>() : sl.scalars.template get<Opt>();
    k.factor = (a.lr_scalar ? device_grad_factor : sl.grad_factor) * device_factor;
    k.step = a.lr_scalar ? int64_t(step) : sl.step;
    const int64_t b = w - a.first_block[s];
    k.block = b;
    k.start = b * G::kBlock;
    k.n = int(min(int64_t(G::kBlock), sl.numel - k.start));
    k.param_dtype = sl.param_dtype;
    k.grad_dtype = sl.grad_dtype;
    k.param = static_cast<char*>(sl.param) + k.start * (k.param_dtype == kFloat32 ? 4 : 2);
    k.grad = static_cast<const char*>(sl.grad) + k.start * (k.grad_dtype == kFloat32 ? 4 : 2);
#pragma unroll
    for (int i = 0; i < kMaxStates; ++i) {
      k.codes[i] = i < n_states ? G::codes_at(sl.states[i].codes, k.start) : nullptr;
      k.scales[i] = !K::float_codes && i < n_states ? sl.states[i].scales + b : nullptr;
    }
    const bool sr = a.stochastic_round, state_sr = a.state_stochastic_round;
    if (k.n == G::kBlock) step_block<Opt, K, true>(k, codecs, n_states, sr, state_sr, a.seed, lane);
    else step_block<Opt, K, false>(k, codecs, n_states, sr, state_sr, a.seed, lane);
  }
}

template <class K>
__global__ void __launch_bounds__(kThreads) nonfinite_kernel(const __grid_constant__ StepLaunch a) {
  using G = Geometry<K>;
  const int lane = threadIdx.x & 31;
  const WarpStride warps = warp_stride();
  for (int64_t w = warps.first; w < a.total_blocks; w += warps.count) {
    const int s = slot_of(a, w);
    const StepSlot& sl = a.slots[s];
    const int64_t start = (w - a.first_block[s]) * G::kBlock;
    const int n = int(min(int64_t(G::kBlock), sl.numel - start));
    const void* grad = static_cast<const char*>(sl.grad) + start * (sl.grad_dtype == kFloat32 ? 4 : 2);
    bool bad = false;
    for (int k = 0; k < G::kPerLane; ++k) {
      const int l = G::local(lane, k);
      if (l < n) bad |= !isfinite(load_elem(sl.grad_dtype, grad, l));
    }
    if (__any_sync(0xffffffffu, bad) && lane == 0) a.skip[s] = 1;  // a benign race: every writer writes 1
  }
}

template <class K>
__global__ void __launch_bounds__(kThreads) convert_kernel(const ConvertLaunch a, int64_t n_blocks) {
  using G = Geometry<K>;
  constexpr int E = G::kPerLane;
  const int lane = threadIdx.x & 31;
  const Codec<K> c = codec_of<K>(a.second_moment, shared_codebooks<K>());
  const Encode8Tables* buckets = shared_encode8<K>();
  const WarpStride warps = warp_stride();
  for (int64_t b = warps.first; b < n_blocks; b += warps.count) {
    const int64_t start = b * G::kBlock;
    const int n = int(min(int64_t(G::kBlock), a.numel - start));
    void* codes = G::codes_at(a.state.codes, start);
    float* values = a.values + start;
    const float scale = K::float_codes ? 0.0f : a.state.scales[b];
    int local[E];
    float x[E];
#pragma unroll
    for (int k = 0; k < E; ++k) {
      local[k] = G::local(lane, k);
      x[k] = 0.0f;
      if (local[k] >= n) continue;
      if (a.to_state) x[k] = values[local[k]];
      else values[local[k]] = load_state<K>(c, codes, local[k], scale);
    }
    if (a.to_state)
      store_block<K, false>(c, buckets, codes, K::float_codes ? nullptr : a.state.scales + b, n, local, x, lane);
  }
}

int grid_for(int64_t warps_needed) {
  const int64_t ctas = (warps_needed + kWarps - 1) / kWarps;
  return int(ctas < 1 ? 1 : (ctas > kMaxGrid ? kMaxGrid : ctas));
}

template <template <class> class Kernel, class Args, class... Rest>
cudaError_t launch_kind(int kind, int64_t warps, cudaStream_t stream, const Args& a, Rest... rest) {
  const int grid = grid_for(warps);
  with_kind(kind, [&](auto k) { Kernel<decltype(k)>::launch(grid, stream, a, rest...); });
  return cudaGetLastError();
}

template <class Opt>
struct Step {
  template <class K>
  struct Kind {
    static void launch(int grid, cudaStream_t s, const StepLaunch& a) {
      step_kernel<Opt, K><<<grid, kThreads, 0, s>>>(a);
    }
  };
};
template <class K>
struct Nonfinite {
  static void launch(int grid, cudaStream_t s, const StepLaunch& a) {
    nonfinite_kernel<K><<<grid, kThreads, 0, s>>>(a);
  }
};
template <class K>
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

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
// The step shaped for bandwidth (meson option gpu_wide_step): a lane's elements are runs of 4 consecutive ones, so
// that a full block whose tensors are aligned moves its params, grads, codes and fp32 states with one vector load
// and store per run (128-bit for fp32), and 4-bit states encode in x. Today's layout and loads stay the default
// until a GPU run passes the GPU suite with it.
#ifndef LBOPT_CUDA_WIDE_STEP
#define LBOPT_CUDA_WIDE_STEP 0
#endif
constexpr bool kWide = LBOPT_CUDA_WIDE_STEP;
// The 4-bit encode in x (meson option gpu_encode_in_x, and part of gpu_wide_step; kernels/encode_in_x.h): a
// candidate code and one compare with a per-block threshold, the same codes without a division or a search per
// element, tested bit for bit on the CPU (tests/unit/test_encode_in_x.cpp); the division stays the default until
// a GPU run passes the GPU suite with it.
#ifndef LBOPT_CUDA_ENCODE_IN_X
#define LBOPT_CUDA_ENCODE_IN_X 0
#endif
constexpr bool kEncodeInX = LBOPT_CUDA_ENCODE_IN_X || kWide;
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

// The raw bits of E elements of dtype dt (float32 bits, or 16 bits in the low half) as floats.
template <int E>
__device__ __forceinline__ void convert_raw(Dtype dt, const uint32_t (&raw)[E], float (&out)[E]) {
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
  convert_raw(dt, raw, out);
}

// kWide's vector access to a full block whose tensors are all aligned (vectors_aligned): run r of a lane, its
// elements 4 (32 r + lane) to 4 (32 r + lane) + 3, is one 16-byte word of fp32 values, one 8-byte word of 16-bit
// values, one 2-byte word of 4-bit codes or one 4-byte word of 8-bit codes.
constexpr int kRun = 4;
template <class Word>
__device__ __forceinline__ const Word& run_at(const void* base, int lane, int r) {
  return static_cast<const Word*>(base)[32 * r + lane];
}
template <class Word>
__device__ __forceinline__ Word& run_at(void* base, int lane, int r) {
  return static_cast<Word*>(base)[32 * r + lane];
}

// load_block's vector form: the lane's E elements, kWide's layout.
template <int E>
__device__ __forceinline__ void load_runs(Dtype dt, const void* base, int lane, float (&out)[E]) {
  uint32_t raw[E];
  if (dt == kFloat32) {
#pragma unroll
    for (int r = 0; r < E / kRun; ++r) {
      const uint4 v = run_at<uint4>(base, lane, r);
      raw[4 * r] = v.x, raw[4 * r + 1] = v.y, raw[4 * r + 2] = v.z, raw[4 * r + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int r = 0; r < E / kRun; ++r) {
      const uint2 v = run_at<uint2>(base, lane, r);
      raw[4 * r] = v.x & 0xffffu, raw[4 * r + 1] = v.x >> 16;
      raw[4 * r + 2] = v.y & 0xffffu, raw[4 * r + 3] = v.y >> 16;
    }
  }
  convert_raw(dt, raw, out);
}

// A param's new value x in its dtype's bits (16-bit dtypes in the low half); e: the element's index in its tensor,
// which keys stochastic rounding.
__device__ __forceinline__ uint32_t param_bits(Dtype dt, float x, bool sr, uint64_t seed, int64_t step, int64_t e) {
  switch (dt) {
    case kBfloat16:
      return sr ? float_to_bf16_stochastic(x, random_bits(seed, uint64_t(step), uint64_t(e))) : float_to_bf16(x);
    case kFloat16: return float_to_f16(x);
    default: return __float_as_uint(x);
  }
}

__device__ __forceinline__ void store_param(Dtype dt, void* base, int i, float x, bool sr, uint64_t seed,
                                            int64_t step, int64_t e) {
  const uint32_t bits = param_bits(dt, x, sr, seed, step, e);
  if (dt == kFloat32) static_cast<uint32_t*>(base)[i] = bits;
  else static_cast<uint16_t*>(base)[i] = uint16_t(bits);
}

// store_param's vector form for the lane's E elements, kWide's layout; start: the block's first element.
template <int E>
__device__ __forceinline__ void store_runs(Dtype dt, void* base, int lane, const float (&x)[E], bool sr,
                                           uint64_t seed, int64_t step, int64_t start) {
#pragma unroll
  for (int r = 0; r < E / kRun; ++r) {
    uint32_t b[kRun];
#pragma unroll
    for (int i = 0; i < kRun; ++i)
      b[i] = param_bits(dt, x[kRun * r + i], sr, seed, step, start + kRun * (32 * r + lane) + i);
    if (dt == kFloat32) run_at<uint4>(base, lane, r) = make_uint4(b[0], b[1], b[2], b[3]);
    else run_at<uint2>(base, lane, r) = make_uint2(b[0] | (b[1] << 16), b[2] | (b[3] << 16));
  }
}

template <class K>
struct Geometry {
  static constexpr int kBlock = int(K::work_block);
  static constexpr int kPerLane = kBlock / 32;  // a warp per block
  // Element of a block handled by lane, k-th: 4-bit keeps nibble pairs in one lane; kWide, runs of kRun.
  __device__ static int local(int lane, int k) {
    if constexpr (kWide) return kRun * (32 * (k / kRun) + lane) + k % kRun;
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

// Code i (0 to 3) of a run's word of codes: element 2m's 4-bit code is the high nibble of byte m.
template <class K>
__device__ __forceinline__ uint32_t code_in_run(uint32_t word, int i) {
  if constexpr (K::code_bits == 4) return (word >> (8 * (i >> 1) + 4 * (~i & 1))) & 0xfu;
  else return (word >> (8 * i)) & 0xffu;
}
template <class K>
using CodeRun = typename std::conditional<K::code_bits == 4, uint16_t, uint32_t>::type;

// load_state's vector form: the lane's E values of a state, kWide's layout.
template <class K, int E>
__device__ __forceinline__ void load_state_runs(const Codec<K>& c, const void* codes, int lane, float scale,
                                                float (&out)[E]) {
#pragma unroll
  for (int r = 0; r < E / kRun; ++r) {
    if constexpr (K::float_codes) {
      const float4 v = run_at<float4>(codes, lane, r);
      out[4 * r] = v.x, out[4 * r + 1] = v.y, out[4 * r + 2] = v.z, out[4 * r + 3] = v.w;
    } else {
      const uint32_t word = run_at<CodeRun<K>>(codes, lane, r);
#pragma unroll
      for (int i = 0; i < kRun; ++i) out[kRun * r + i] = c.decode(code_in_run<K>(word, i), scale);
    }
  }
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

// The rows of the encode in x (encode_in_x.h) of up to N 4-bit states of each warp's block, in shared memory.
template <int N>
__device__ __forceinline__ float (*in_x_rows())[N][kInXRow] {
  __shared__ float rows[kWarps][N][kInXRow];
  return rows;
}

// The rows' fixed entries, written once per CTA; the CTA synchronizes before a warp reads them.
template <int N>
__device__ __forceinline__ void init_in_x_rows() {
  float(*rows)[N][kInXRow] = in_x_rows<N>();
  for (int i = threadIdx.x; i < kWarps * N; i += blockDim.x) in_x_fixed_entries(rows[i / N][i % N]);
}

// This warp's rows for its block's 4-bit states, row s for state s < n_states of block scale scale[s]: each
// half-warp computes a state's 16 values, two states at a time. Every lane of the warp calls it; the rows stay
// valid until its next call.
template <class K, int N>
__device__ __forceinline__ const float (*warp_in_x_rows(const Codec<K> (&c)[N], const float (&scale)[N],
                                                        int n_states, int lane))[kInXRow] {
  float(*row)[kInXRow] = in_x_rows<N>()[threadIdx.x / 32];
  const int half = lane >> 4, k = lane & 15;
  __syncwarp();  // every lane is done with the previous rows
#pragma unroll
  for (int s0 = 0; s0 < N; s0 += 2) {
    const int s1 = s0 + 1 < N ? s0 + 1 : s0;  // (unrolled: a constant)
    if (s0 + half >= n_states) continue;
    const bool linear = half ? c[s1].unsigned_map : c[s0].unsigned_map;
    row[s0 + half][in_x_entry(k)] = in_x_value(half ? c[s1].mids : c[s0].mids, linear, k, half ? scale[s1] : scale[s0]);
  }
  __syncwarp();
  return row;
}

// The tables an encode reads beyond the codec's: both 8-bit maps' bucket tables (shared_encode8) and the signed
// 4-bit map's candidates (shared_signed_buckets), each NULL where the build encodes otherwise.
struct EncodeTables {
  const Encode8Tables* buckets8;
  const int32_t* signed4;
};
// N: the most states a kernel encodes per block (the rows of the encode in x, whose fixed entries it writes).
template <class K, int N>
__device__ __forceinline__ EncodeTables shared_encode_tables() {
  const int32_t* signed4 = nullptr;
  if constexpr (kEncodeInX && K::code_bits == 4) {
    init_in_x_rows<N>();
    signed4 = shared_signed_buckets<K>();  // (synchronizes the CTA)
  }
  return {shared_encode8<K>(), signed4};
}

// The absmax scale of a block of n elements (FULL: n is the block size) of which this lane holds the E values x
// at local[], in every lane; lane 0 stores it to *scale_out.
template <class K, bool FULL, int E>
__device__ __forceinline__ typename Codec<K>::BlockScale block_scale(const Codec<K>& c, float* scale_out, int n,
                                                                     const int (&local)[E], const float (&x)[E],
                                                                     int lane) {
  float absmax = 0.0f;
#pragma unroll
  for (int k = 0; k < E; ++k)
    if (FULL || local[k] < n) absmax = fmaxf(absmax, fabsf(finite_or_zero(x[k])));
  const auto scale = c.block_scale(warp_max_nonnegative(absmax));
  if (lane == 0) *scale_out = scale.scale;
  return scale;
}

// Requantize the E values x this lane holds of a block of n elements (FULL: n is the block size) whose codes
// start at codes, under its block scale (block_scale) and, where the build encodes 4-bit states in x, its row
// (warp_in_x_rows). VEC: kWide's vector stores (FULL, aligned). sr: the codes round stochastically, keyed by the
// block's state_round_key.
template <class K, bool FULL, bool VEC, int E>
__device__ __forceinline__ void store_codes(const Codec<K>& c, const EncodeTables& tables,
                                            typename Codec<K>::BlockScale scale, const float* row, void* codes,
                                            int n, const int (&local)[E], const float (&x)[E], int lane, bool sr,
                                            uint32_t key) {
  static_assert(!VEC || (FULL && kWide), "vector stores serve kWide's full blocks");
  const auto code = [&](float v, int l) {  // Codec::encode, with the encode chosen by the build options
    if constexpr (K::stochastic_in_y) {  // no nearest code needed
      if (sr) return c.round_stochastic(0u, v, scale.scale, state_round_bits(key, uint32_t(l)));
    }
    uint32_t q;
    if constexpr (K::code_bits == 4) {
      static_assert(K::entries == 16 && !K::reciprocal && !K::zero_code, "the encode in x serves a 4-bit map");
      if constexpr (kEncodeInX)
        q = c.guard_zero(c.unsigned_map ? encode_linear_in_x(v, row) : encode_signed_in_x(v, row, tables.signed4), v);
      else q = c.encode(v, scale);
    } else {
      const float y = c.encode_input(v, scale);
      if constexpr (kBucketEncode<K>) q = codebook8_encode_arith(tables.buckets8[c.unsigned_map ? 1 : 0], y);
      else if constexpr (kCvtEncode<K>) q = fp8_e4m3_encode_cvt(y);
      else q = K::encode_value(y, c.mids);
      q = c.guard_zero(q, v);
    }
    return sr ? c.round_stochastic(q, v, scale.scale, state_round_bits(key, uint32_t(l))) : q;
  };
  uint32_t q[E];
#pragma unroll
  for (int k = 0; k < E; ++k) q[k] = FULL || local[k] < n ? code(finite_or_zero(x[k]), local[k]) : 0u;
  uint8_t* b = static_cast<uint8_t*>(codes);
#pragma unroll
  for (int k = 0; k < E; ++k) {
    if constexpr (VEC) {  // one word per run
      if (k % kRun != 0) continue;
      if constexpr (K::code_bits == 4)
        run_at<uint16_t>(codes, lane, k / kRun) = uint16_t((q[k] << 4) | q[k + 1] | (q[k + 2] << 12) | (q[k + 3] << 8));
      else
        run_at<uint32_t>(codes, lane, k / kRun) = q[k] | (q[k + 1] << 8) | (q[k + 2] << 16) | (q[k + 3] << 24);
    } else if constexpr (K::code_bits == 4) {  // lanes hold pairs (2m, 2m + 1): one byte each
      if (k % 2 == 0 && (FULL || local[k] < n)) b[local[k] >> 1] = uint8_t((q[k] << 4) | q[k + 1]);
    } else if (FULL || local[k] < n) {
      b[local[k]] = uint8_t(q[k]);
    }
  }
}

// The FP32 kind's store of the E values x this lane holds of a block (VEC: kWide's vector stores).
template <bool FULL, bool VEC, int E>
__device__ __forceinline__ void store_values(float* values, int n, const int (&local)[E], const float (&x)[E],
                                             int lane) {
#pragma unroll
  for (int k = 0; k < E; ++k) {
    if constexpr (VEC) {
      if (k % kRun == 0) run_at<float4>(values, lane, k / kRun) = make_float4(x[k], x[k + 1], x[k + 2], x[k + 3]);
    } else if (FULL || local[k] < n) {
      values[local[k]] = x[k];
    }
  }
}

// Requantize (or store, for the FP32 kind) the N states' values x this lane holds of a block of n elements,
// states n_states and on left alone: the block scales first, then the rows of the encode in x for all states at
// once, then the codes. codes[s], scales[s]: state s's at the block's first element. state_sr: the first
// moments' codes round stochastically, keyed by state_round_key(seed, step, s, block).
template <class K, bool FULL, bool VEC, int N, int E>
__device__ __forceinline__ void store_states(const Codec<K> (&c)[N], const EncodeTables& tables,
                                             void* const (&codes)[N], float* const (&scales)[N], int n_states,
                                             int n, const int (&local)[E], const float (&x)[N][E], int lane,
                                             bool state_sr, uint64_t seed, int64_t step, int64_t block) {
  if constexpr (K::float_codes) {
#pragma unroll
    for (int s = 0; s < N; ++s)
      if (s < n_states) store_values<FULL, VEC>(static_cast<float*>(codes[s]), n, local, x[s], lane);
  } else {
    typename Codec<K>::BlockScale scale[N];
    float scale_value[N];
#pragma unroll
    for (int s = 0; s < N; ++s) {
      scale[s] = s < n_states ? block_scale<K, FULL>(c[s], scales[s], n, local, x[s], lane)
                              : typename Codec<K>::BlockScale{1.0f, 1.0f};
      scale_value[s] = scale[s].scale;
    }
    const float(*rows)[kInXRow] = nullptr;
    if constexpr (kEncodeInX && K::code_bits == 4) rows = warp_in_x_rows(c, scale_value, n_states, lane);
#pragma unroll
    for (int s = 0; s < N; ++s)
      if (s < n_states) {
        StateRounding r = state_rounding(state_sr, c[s].second, seed, step, s, block);
        asm("" : "+r"(r.key));  // kept in a register: nvcc otherwise recomputes the 64-bit hash for every code
        const float* row = nullptr;
        if constexpr (kEncodeInX && K::code_bits == 4) row = rows[s];
        store_codes<K, FULL, VEC>(c[s], tables, scale[s], row, codes[s], n, local, x[s], lane, r.stochastic, r.key);
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

// The codecs of an optimizer's states and the encodes' tables, over this CTA's shared copies: every thread of the
// CTA makes them before any returns (the copies synchronize the CTA). Loops over states run to kMaxStates,
// guarded, so that they unroll and the per-state arrays stay in registers.
template <class Opt, class K>
struct StepCodecs {
  Codec<K> codec[kMaxStates];
  EncodeTables tables;
};
template <class Opt, class K>
__device__ __forceinline__ StepCodecs<Opt, K> step_codecs(const Hyper& h) {
  StepCodecs<Opt, K> c;
  const CodebookTables tables = shared_codebooks<K>();
#pragma unroll
  for (int s = 0; s < kMaxStates; ++s) c.codec[s] = codec_of<K>(Opt::moment(h, s), tables);
  c.tables = shared_encode_tables<K, kMaxStates>();
  return c;
}

// One block of a slot: every load is issued before the first store (the compiler cannot tell that a param store
// aliases none of the later loads, so loads left after it would each wait for it). FULL: all kBlock elements,
// no bounds checks. VEC: kWide's vector loads and stores (FULL, every tensor aligned).
template <class Opt, class K, bool FULL, bool VEC = false>
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
  if constexpr (VEC) {
    load_runs(k.param_dtype, k.param, lane, p);
    load_runs(k.grad_dtype, k.grad, lane, g);
#pragma unroll
    for (int s = 0; s < kMaxStates; ++s) {
      if (s < n_states) load_state_runs(c.codec[s], k.codes[s], lane, scale[s], x[s]);
      else for (float& v : x[s]) v = 0.0f;
    }
  } else {
    load_block<FULL>(k.param_dtype, k.param, local, k.n, p);
    load_block<FULL>(k.grad_dtype, k.grad, local, k.n, g);
#pragma unroll
    for (int j = 0; j < E; ++j)
#pragma unroll
      for (int s = 0; s < kMaxStates; ++s)
        x[s][j] = (FULL || local[j] < k.n) && s < n_states ? load_state<K>(c.codec[s], k.codes[s], local[j], scale[s])
                                                          : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < E; ++j)
    if (FULL || local[j] < k.n) update<ScalarOps>(k.sc, p[j], g[j] * k.factor, x[0][j], x[1][j], x[2][j]);
  if constexpr (VEC) {
    store_runs(k.param_dtype, k.param, lane, p, sr, seed, k.step, k.start);
  } else {
#pragma unroll
    for (int j = 0; j < E; ++j)
      if (FULL || local[j] < k.n)
        store_param(k.param_dtype, k.param, local[j], p[j], sr, seed, k.step, k.start + local[j]);
  }
  __syncwarp();  // every lane has read the old codes and scales before any lane writes new ones
  store_states<K, FULL, VEC>(c.codec, c.tables, k.codes, k.scales, n_states, k.n, local, x, lane, state_sr, seed,
                             k.step, k.block);
  __syncwarp();
}

// At least 3 CTAs (24 warps) per multiprocessor for the quantized kinds: the step is bound by latency, and on an
// H200 this cap (80 registers, some spilled) runs them faster than the 94-128 registers uncapped; the FP32 kind
// runs fastest uncapped (docs/benchmarks.md, "GPU kernel choices"). vectors: kWide's full blocks take the vector
// loads and stores (every slot's tensors are aligned for them: vectors_aligned).
template <class Opt, class K>
__global__ void __launch_bounds__(kThreads, K::float_codes ? 1 : 3)
    step_kernel(const __grid_constant__ StepLaunch a, bool vectors) {
  using G = Geometry<K>;
  const int lane = threadIdx.x & 31;
  const WarpStride warps = warp_stride();
  const StepCodecs<Opt, K> codecs = step_codecs<Opt, K>(a.hyper);

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
    if (k.n != G::kBlock) step_block<Opt, K, false>(k, codecs, n_states, sr, state_sr, a.seed, lane);
    else if (kWide && vectors) step_block<Opt, K, true, kWide>(k, codecs, n_states, sr, state_sr, a.seed, lane);
    else step_block<Opt, K, true>(k, codecs, n_states, sr, state_sr, a.seed, lane);
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
  const Codec<K> c[1] = {codec_of<K>(a.moment, shared_codebooks<K>())};
  const EncodeTables tables = shared_encode_tables<K, 1>();
  const WarpStride warps = warp_stride();
  for (int64_t b = warps.first; b < n_blocks; b += warps.count) {
    const int64_t start = b * G::kBlock;
    const int n = int(min(int64_t(G::kBlock), a.numel - start));
    void* const codes[1] = {G::codes_at(a.state.codes, start)};
    float* const scales[1] = {K::float_codes ? nullptr : a.state.scales + b};
    float* values = a.values + start;
    const float scale = K::float_codes ? 0.0f : *scales[0];
    int local[E];
    float x[1][E];
#pragma unroll
    for (int k = 0; k < E; ++k) {
      local[k] = G::local(lane, k);
      x[0][k] = 0.0f;
      if (local[k] >= n) continue;
      if (a.to_state) x[0][k] = values[local[k]];
      else values[local[k]] = load_state<K>(c[0], codes[0], local[k], scale);
    }
    if (a.to_state) store_states<K, false, false>(c, tables, codes, scales, 1, n, local, x, lane, false, 0, 0, 0);
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

// Whether kWide's vector loads and stores may serve every slot of a: each tensor's base is aligned to its run's
// word (a block starts a whole number of words further).
template <class K>
bool vectors_aligned(const StepLaunch& a) {
  const auto aligned = [](const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  const size_t code_word = K::float_codes ? sizeof(float4) : sizeof(CodeRun<K>);
  for (int i = 0; i < a.n_slots; ++i) {
    const StepSlot& s = a.slots[i];
    bool ok = aligned(s.param, s.param_dtype == kFloat32 ? sizeof(uint4) : sizeof(uint2)) &&
              aligned(s.grad, s.grad_dtype == kFloat32 ? sizeof(uint4) : sizeof(uint2));
    for (const StateRef& state : s.states) ok = ok && aligned(state.codes, code_word);
    if (!ok) return false;
  }
  return true;
}

template <class Opt>
struct Step {
  template <class K>
  struct Kind {
    static void launch(int grid, cudaStream_t s, const StepLaunch& a) {
      step_kernel<Opt, K><<<grid, kThreads, 0, s>>>(a, kWide && vectors_aligned<K>(a));
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

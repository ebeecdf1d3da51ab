// The full-block path of the CUDA step, one kernel per optimizer, state kind and param dtype, for a static count
// of its SASS instructions (tools/sass_count.py compiles this file and reads the loop of each probe kernel).
// The library's step kernel holds every dtype path and the checked tail in one function; here each probe runs
// step_block<..., FULL = true> in a grid-stride loop with the dtypes fixed at compile time, so the compiler keeps
// that one path: the loop's body is what a warp executes per block in the steady state. The rounding of the states'
// codes is each optimizer's and kind's default, fixed at compile time (stochastic for SGD, Lion and AdEMAMix on
// 4-bit and FP8 states).
#include "../kernels/cuda/step_kernels.cu"

namespace lbopt::cuda {
namespace {

// The states a probe steps: the optimizer's usual count (SGD with momentum).
template <class Opt>
constexpr int kProbeStates = Opt::kMinStates > 1 ? Opt::kMinStates : 1;

template <class Opt, class K, Dtype kParam>
__global__ void __launch_bounds__(kThreads, K::float_codes ? 1 : 3)
    sass_probe(const __grid_constant__ BlockArgs<Opt, K> args, int64_t n_blocks, bool sr, uint64_t seed) {
  using G = Geometry<K>;
  const int lane = threadIdx.x & 31;
  const WarpStride warps = warp_stride();
  const StepCodecs<Opt, K> codecs = step_codecs<Opt, K>(Hyper());  // each state on its default map
  constexpr int kBytes = kParam == kFloat32 ? 4 : 2;
  for (int64_t w = warps.first; w < n_blocks; w += warps.count) {
    BlockArgs<Opt, K> k = args;
    k.block = w;
    k.start = w * G::kBlock;
    k.n = G::kBlock;
    k.param_dtype = k.grad_dtype = kParam;
    k.param = static_cast<char*>(args.param) + k.start * kBytes;
    k.grad = static_cast<const char*>(args.grad) + k.start * kBytes;
#pragma unroll
    for (int s = 0; s < kMaxStates; ++s) {
      k.codes[s] = s < kProbeStates<Opt> ? G::codes_at(args.codes[s], k.start) : nullptr;
      k.scales[s] = !K::float_codes && s < kProbeStates<Opt> ? args.scales[s] + w : nullptr;
    }
    step_block<Opt, K, true, kWide>(k, codecs, kProbeStates<Opt>, sr, Opt::kStochasticStates && K::stochastic_codes,
                                    seed, lane);
  }
}

// Every probe's address, so that each is instantiated and compiled.
template <class Opt, class... Ks>
void take_kinds(TypeList<Ks...>, const void** out) {
  for (const void* f : {reinterpret_cast<const void*>(&sass_probe<Opt, Ks, kFloat32>)...,
                        reinterpret_cast<const void*>(&sass_probe<Opt, Ks, kBfloat16>)...})
    *out++ = f;
}

template <class... Opts>
void take_all(TypeList<Opts...>, const void** out) {
  int i = 0;
  ((take_kinds<Opts>(Kinds{}, out + i), i += 2 * Kinds::size), ...);
}

}  // namespace

const void* sass_probes[2 * Kinds::size * Optimizers::size];
const bool sass_probes_taken = (take_all(Optimizers{}, sass_probes), true);

}  // namespace lbopt::cuda

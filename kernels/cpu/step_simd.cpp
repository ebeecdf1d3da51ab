// SIMD CPU kernels (Google Highway, runtime dispatch): the dispatch to each optimizer's step loops
// (step_simd_optimizer.cpp, one unit per optimizer, on step_loops-inl.h), and lbopt_quantize / lbopt_dequantize
// with the step's per-value quantization (simd_codec-inl.h), a vector at a time, for whole scale blocks. Only
// targets with a fused multiply-add run them, so every result is bit-identical to the portable kernels
// (tests/cpu/test_simd.cpp); on other targets and for a partial last block the portable kernels run instead.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/step_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/cpu/simd_policy-inl.h"
#include "kernels/cpu/simd_values-inl.h"
#include "kernels/cpu/simd_codec-inl.h"

#include <stddef.h>

#include <algorithm>
#include <array>

#include "kernels/cpu/kernels_cpu.h"

HWY_BEFORE_NAMESPACE();
namespace lbopt::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

#if LBOPT_EXACT_FMA

// The end of the whole blocks among [b0, b1) of a tensor of numel elements of a kind whose unit of work is bs.
HWY_INLINE int64_t whole_blocks_end(int64_t bs, int64_t numel, int64_t b1) { return std::min(b1, numel / bs); }

// lbopt_quantize over whole blocks: as the step's encode, from the caller's floats.
template <class K>
int64_t quantize_blocks(const Codec<K>& codec, const float* src, StateRef dst, int64_t b0, int64_t b1) {
  const SimdCodec<K> sc(codec);
  const DF df;
  HWY_ALIGN float buf[kMaxBlock];
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t start = b * K::work_block;
    auto maxbits = hn::Zero(DI());
    for (int64_t i = 0; i < K::work_block; i += int64_t(hn::Lanes(df))) {
      const auto x = hn::LoadU(df, src + start + i);
      block_max_add(maxbits, x);
      hn::Store(x, df, buf + i);
    }
    encode_block(sc, dst, b, start, K::work_block, buf, block_absmax(buf, K::work_block, block_top(maxbits)));
  }
  return b1;
}

// lbopt_dequantize over whole blocks: as the step's decode, to the caller's floats.
template <class K>
int64_t dequantize_blocks(const Codec<K>& codec, StateRef src, float* dst, int64_t b0, int64_t b1) {
  const SimdCodec<K> sc(codec);
  const DF df;
  Table16 scaled;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t start = b * K::work_block;
    const uint8_t* codes = block_codes<K>(src, start);
    const auto scale = hn::Set(df, src.scales[b]);
    if (K::code_bits == 4) scale_table(sc, src.scales[b], scaled);
    for (int64_t i = 0; i < K::work_block; i += int64_t(hn::Lanes(df)))
      hn::StoreU(decode_vec<K>(sc, codes, i, scale, scaled), df, dst + start + i);
  }
  return b1;
}

// FP32 "quantization" is a copy: the portable memcpy.
int64_t QuantizeFullBlocks(const StateCodec& codec, const float* src, StateRef dst, int64_t numel, int64_t b0,
                           int64_t b1) {
  return with_kind(codec.kind, [&](auto kind) HWY_ATTR {
    using K = decltype(kind);
    b1 = whole_blocks_end(K::work_block, numel, b1);
    if constexpr (K::float_codes) return b0;
    else return b1 <= b0 ? b0 : quantize_blocks(host_codec<K>(codec.moment), src, dst, b0, b1);
  });
}

int64_t DequantizeFullBlocks(const StateCodec& codec, StateRef src, float* dst, int64_t numel, int64_t b0,
                             int64_t b1) {
  return with_kind(codec.kind, [&](auto kind) HWY_ATTR {
    using K = decltype(kind);
    b1 = whole_blocks_end(K::work_block, numel, b1);
    if constexpr (K::float_codes) return b0;
    else return b1 <= b0 ? b0 : dequantize_blocks(host_codec<K>(codec.moment), src, dst, b0, b1);
  });
}

#else

int64_t QuantizeFullBlocks(const StateCodec&, const float*, StateRef, int64_t, int64_t b0, int64_t) { return b0; }
int64_t DequantizeFullBlocks(const StateCodec&, StateRef, float*, int64_t, int64_t b0, int64_t) { return b0; }

#endif  // LBOPT_EXACT_FMA

}  // namespace HWY_NAMESPACE
}  // namespace lbopt::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <stdlib.h>

namespace lbopt::cpu {

HWY_EXPORT(QuantizeFullBlocks);
HWY_EXPORT(DequantizeFullBlocks);
HWY_EXPORT(TargetName);

namespace {
// LBOPT_CPU_KERNELS=portable turns the SIMD kernels off (read on every call: tests compare both in one process).
// LBOPT_CPU_KERNELS=<a Highway target name this CPU supports> ("AVX2", "AVX3", ...) restricts the dispatch to it,
// read once: a benchmark of a framework process then runs the kernels of a smaller machine. It sets libhwy's
// process-wide target mask, as Highway's own tests do.
bool simd_enabled() {
  const char* env = getenv("LBOPT_CPU_KERNELS");
  static const bool restricted = [env] {
    if (!env) return false;
    for (int64_t t = 1; t != 0 && t <= HWY_SCALAR; t <<= 1)
      if ((t & hwy::SupportedTargets()) && strcmp(hwy::TargetName(t), env) == 0) {
        hwy::SetSupportedTargetsForTest(t);
        return true;
      }
    return false;
  }();
  (void)restricted;
  return !(env && strcmp(env, "portable") == 0);
}
}  // namespace

// Each optimizer's step_blocks_simd_of, by its id.
using StepBlocksFn = int64_t (*)(const StepSlot&, const StepFlags&, int64_t, int64_t);
template <class... Opts>
constexpr std::array<StepBlocksFn, sizeof...(Opts)> step_table(TypeList<Opts...>) {
  return {&step_blocks_simd_of<Opts>...};
}

int64_t step_blocks_simd(const StepSlot& slot, const StepFlags& flags, int64_t block_begin, int64_t block_end) {
  static constexpr auto kTable = step_table(Optimizers());
  block_end = std::min(block_end, slot.numel / work_block_size(flags.kind));  // whole blocks only
  if (!simd_enabled() || block_end <= block_begin) return block_begin;
  return kTable[size_t(flags.hyper.optimizer)](slot, flags, block_begin, block_end);
}

int64_t quantize_blocks_simd(const StateCodec& codec, const float* src, StateRef dst, int64_t numel,
                             int64_t block_begin, int64_t block_end) {
  if (!simd_enabled()) return block_begin;
  return HWY_DYNAMIC_DISPATCH(QuantizeFullBlocks)(codec, src, dst, numel, block_begin, block_end);
}

int64_t dequantize_blocks_simd(const StateCodec& codec, StateRef src, float* dst, int64_t numel,
                               int64_t block_begin, int64_t block_end) {
  if (!simd_enabled()) return block_begin;
  return HWY_DYNAMIC_DISPATCH(DequantizeFullBlocks)(codec, src, dst, numel, block_begin, block_end);
}

const char* simd_target() { return simd_enabled() ? HWY_DYNAMIC_DISPATCH(TargetName)() : "portable"; }

bool cpu_has_bf16_convert() {
#if HWY_ARCH_X86 && (defined(__GNUC__) || defined(__clang__))
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

}  // namespace lbopt::cpu
#endif  // HWY_ONCE

// Portable C++ CPU kernels around the shared per-element and per-value math: every optimizer, kind and dtype.
#include <string.h>

#include <algorithm>

#include "../dtype_convert.h"
#include "kernels_cpu.h"

namespace lbopt::cpu {
namespace {

#include "../optim/updates.h"

struct F32 {
  using T = float;
  static float load(const T* p, int64_t i) { return p[i]; }
  static void store(T* p, int64_t i, float x) { p[i] = x; }
};
struct BF16 {
  using T = uint16_t;
  static float load(const T* p, int64_t i) { return bf16_to_float(p[i]); }
  static void store(T* p, int64_t i, float x) { p[i] = float_to_bf16(x); }
};
struct F16 {
  using T = uint16_t;
  static float load(const T* p, int64_t i) { return f16_to_float(p[i]); }
  static void store(T* p, int64_t i, float x) { p[i] = float_to_f16(x); }
};

// Decode n values of a state block starting at element start into out.
template <class K>
void load_state(const Codec<K>& codec, StateRef st, int64_t block, int64_t start, int64_t n, float* out) {
  if constexpr (K::float_codes) {
    memcpy(out, static_cast<const float*>(st.codes) + start, size_t(n) * sizeof(float));
  } else {
    const float scale = st.scales[block];
    const uint8_t* codes = static_cast<const uint8_t*>(st.codes);
    for (int64_t i = 0; i < n; ++i) out[i] = codec.decode(code_at<K>(codes, start + i), scale);
  }
}

// Quantize n values (a whole block) with a fresh absmax scale; non-finite values are stored as 0. random_key: the
// block's state_round_key where its codes round stochastically, else NULL.
template <class K>
void store_state(const Codec<K>& codec, StateRef st, int64_t block, int64_t start, int64_t n, const float* in,
                 const uint32_t* random_key = nullptr) {
  if constexpr (K::float_codes) {
    memcpy(static_cast<float*>(st.codes) + start, in, size_t(n) * sizeof(float));
  } else {
    float absmax = 0.0f;
    for (int64_t i = 0; i < n; ++i) absmax = std::max(absmax, fabsf(finite_or_zero(in[i])));
    const auto scale = codec.block_scale(absmax);
    st.scales[block] = scale.scale;
    uint8_t* codes = static_cast<uint8_t*>(st.codes);
    const auto code = [&](int64_t i) {
      if (i >= n) return 0u;
      const float x = finite_or_zero(in[i]);
      const uint32_t c = codec.encode(x, scale);
      if (!random_key) return c;
      return codec.round_stochastic(c, x, scale.scale, state_round_bits(*random_key, uint32_t(i)));
    };
    if constexpr (K::code_bits == 4) {  // start is even; an odd tail leaves the last low nibble 0
      for (int64_t i = 0; i < n; i += 2) codes[(start + i) >> 1] = uint8_t((code(i) << 4) | code(i + 1));
    } else {
      for (int64_t i = 0; i < n; ++i) codes[start + i] = uint8_t(code(i));
    }
  }
}

// One optimizer's step over blocks [block_begin, block_end) of a slot: decode each active state's block, update
// element by element, requantize.
template <class Opt, class K, class P, class G>
void step_typed(const StepSlot& slot, const StepFlags& flags, int64_t block_begin, int64_t block_end) {
  const typename Opt::Scalars& s = slot.scalars.get<Opt>();
  const int n_states = Opt::states(flags.hyper);
  Codec<K> codec[kMaxStates];
  for (int k = 0; k < n_states; ++k) codec[k] = host_codec<K>(Opt::moment(flags.hyper, k));
  constexpr int64_t bs = K::work_block;
  auto* param = static_cast<typename P::T*>(slot.param);
  const auto* grad = static_cast<const typename G::T*>(slot.grad);
  const bool sr = flags.stochastic_round && slot.param_dtype == kBfloat16;  // then P is BF16

  float st[kMaxStates][kMaxBlock];
  for (int64_t b = block_begin; b < block_end; ++b) {
    const int64_t start = b * bs;
    const int64_t n = std::min(bs, slot.numel - start);
    for (int k = 0; k < n_states; ++k) load_state(codec[k], slot.states[k], b, start, n, st[k]);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t e = start + i;
      float p = P::load(param, e);
      // (an update reads and writes only the states its config uses)
      update<ScalarOps>(s, p, G::load(grad, e) * slot.grad_factor, st[0][i], st[1][i], st[2][i]);
      if (sr) {
        static_cast<uint16_t*>(slot.param)[e] =
            float_to_bf16_stochastic(p, random_bits(flags.seed, uint64_t(slot.step), uint64_t(e)));
      } else {
        P::store(param, e, p);
      }
    }
    for (int k = 0; k < n_states; ++k) {
      const StateRounding r =
          state_rounding(flags.state_stochastic_round, codec[k].second, flags.seed, slot.step, k, b);
      store_state(codec[k], slot.states[k], b, start, n, st[k], r.stochastic ? &r.key : nullptr);
    }
  }
}

template <class Opt, class K, class P>
void step_param(const StepSlot& slot, const StepFlags& flags, int64_t b0, int64_t b1) {
  switch (slot.grad_dtype) {
    case kFloat32: return step_typed<Opt, K, P, F32>(slot, flags, b0, b1);
    case kBfloat16: return step_typed<Opt, K, P, BF16>(slot, flags, b0, b1);
    case kFloat16: return step_typed<Opt, K, P, F16>(slot, flags, b0, b1);
  }
}

template <class Opt, class K>
void step_optimizer(const StepSlot& slot, const StepFlags& flags, int64_t b0, int64_t b1) {
  switch (slot.param_dtype) {
    case kFloat32: return step_param<Opt, K, F32>(slot, flags, b0, b1);
    case kBfloat16: return step_param<Opt, K, BF16>(slot, flags, b0, b1);
    case kFloat16: return step_param<Opt, K, F16>(slot, flags, b0, b1);
  }
}

template <class G>
bool any_nonfinite(const void* grad, int64_t begin, int64_t end) {
  const auto* g = static_cast<const typename G::T*>(grad);
  bool bad = false;
  for (int64_t i = begin; i < end; ++i) bad |= !isfinite(G::load(g, i));
  return bad;
}

}  // namespace

void step_blocks(const StepSlot& slot, const StepFlags& flags, int64_t block_begin, int64_t block_end) {
  block_begin = step_blocks_simd(slot, flags, block_begin, block_end);
  if (block_begin >= block_end) return;
  with_optimizer(flags.hyper.optimizer, [&](auto opt) {
    with_kind(flags.kind, [&](auto kind) {
      step_optimizer<decltype(opt), decltype(kind)>(slot, flags, block_begin, block_end);
    });
  });
}

bool has_nonfinite(const void* grad, Dtype dtype, int64_t begin, int64_t end) {
  switch (dtype) {
    case kFloat32: return any_nonfinite<F32>(grad, begin, end);
    case kBfloat16: return any_nonfinite<BF16>(grad, begin, end);
    case kFloat16: return any_nonfinite<F16>(grad, begin, end);
  }
  return true;
}

// f(codec, b, start, n) for each block b in [block_begin, block_end) of a state of numel elements: its first
// element and its length.
template <class F>
void for_each_block(const StateCodec& codec, int64_t numel, int64_t block_begin, int64_t block_end, const F& f) {
  with_kind(codec.kind, [&](auto kind) {
    using K = decltype(kind);
    const Codec<K> c = host_codec<K>(codec.moment);
    for (int64_t b = block_begin; b < block_end; ++b) {
      const int64_t start = b * K::work_block;
      f(c, b, start, std::min(K::work_block, numel - start));
    }
  });
}

void quantize_blocks(const StateCodec& codec, const float* src, StateRef dst, int64_t numel, int64_t block_begin,
                     int64_t block_end) {
  block_begin = quantize_blocks_simd(codec, src, dst, numel, block_begin, block_end);
  for_each_block(codec, numel, block_begin, block_end, [&](const auto& c, int64_t b, int64_t start, int64_t n) {
    store_state(c, dst, b, start, n, src + start);
  });
}

void dequantize_blocks(const StateCodec& codec, StateRef src, float* dst, int64_t numel, int64_t block_begin,
                       int64_t block_end) {
  block_begin = dequantize_blocks_simd(codec, src, dst, numel, block_begin, block_end);
  for_each_block(codec, numel, block_begin, block_end, [&](const auto& c, int64_t b, int64_t start, int64_t n) {
    load_state(c, src, b, start, n, dst + start);
  });
}

}  // namespace lbopt::cpu

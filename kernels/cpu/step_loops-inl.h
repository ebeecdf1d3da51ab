// The SIMD step loops (step_simd_optimizer.cpp compiles those of one optimizer per unit): every optimizer's own
// element update (optim/*.h) on vector operations of the same rounding (simd_values-inl.h), with the same
// per-value quantization as quant.h (simd_codec-inl.h), a vector at a time, for whole scale blocks;
// simd_policy-inl.h says what each target and loop does and why. Included once per target, outside any namespace.
#if defined(LBOPT_KERNELS_CPU_STEP_LOOPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LBOPT_KERNELS_CPU_STEP_LOOPS_INL_H_
#undef LBOPT_KERNELS_CPU_STEP_LOOPS_INL_H_
#else
#define LBOPT_KERNELS_CPU_STEP_LOOPS_INL_H_
#endif

#include <hwy/highway.h>

#include "kernels/cpu/simd_policy-inl.h"
#include "kernels/cpu/simd_values-inl.h"
#include "kernels/cpu/simd_codec-inl.h"

#include <stddef.h>

#include <algorithm>
#include <array>
#include <utility>

#include "kernels/cpu/kernels_cpu.h"

HWY_BEFORE_NAMESPACE();
namespace lbopt::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if LBOPT_EXACT_FMA

#include "kernels/optim/updates.h"

// State k during one block: where its float32 values live (the caller's memory for FP32 states, a decoded buffer
// otherwise), and its codes and scale.
struct BlockState {
  float* values;
  const uint8_t* codes;
  float scale;
};

// A flag of the optimizer's Scalars (Opt::Flags) and the value a loop is compiled for (**flags compiled out**).
template <auto kFlag, bool kValue>
struct Fixed {};
template <class Scalars, auto kFlag, bool kValue>
HWY_INLINE void fix(Scalars& s, Fixed<kFlag, kValue>) {
  s.*kFlag = kValue;
}

// How store_param_at rounds a slot's params.
inline ParamRound param_round(Dtype param_dtype, const StepFlags& flags) {
  if (param_dtype != kBfloat16) return ParamRound::kNearest;
  if (flags.stochastic_round) return ParamRound::kStochastic;
  return LBOPT_BF16_CONVERT && cpu_has_bf16_convert() ? ParamRound::kConvert : ParamRound::kNearest;
}

// The new values of a block's states, block b's in buf[b % 2] (rows padded by 64 bytes: no two rows 4 KiB apart,
// whose loads and stores the CPU would take as aliasing), and update_states' results (tbuf, kTwoPass). Apart from
// StepLoop: the compiler's alias analysis sees an object as a whole, and stores through pointers into this one
// would otherwise force reloads of the loop's members (its scalars and flags) after each.
template <bool kTwoPass>
struct BlockValues {
  HWY_ALIGN float buf[2][kMaxStates][kMaxBlock + 16];
  HWY_ALIGN float tbuf[kTwoPass ? kMaxBlock : 1];
};

// The step over whole blocks of a slot, for optimizer Opt, kind K, shape S, with the flags in Fixes assigned the
// values the slot has (the dispatch table picks the instantiation). Each block's states are decoded a vector at a
// time in the update loop, which keeps their new values in a block buffer; the block is then encoded, or, in the
// pipelined loops, encoded vector by vector inside the next block's update loop. Members, not reads through the
// slot: the byte stores of the codes may alias anything the compiler cannot see is local.
template <class Opt, class K, class S, class... Fixes>
class StepLoop {
  using Policy = LoopPolicy<Opt, K, S>;
  static constexpr bool kQuantized = Policy::quantized, kPipelined = Policy::pipelined;
  static constexpr bool kTwoPass = Policy::two_pass, kPrefetch = Policy::prefetch;
  static constexpr int64_t kBs = K::work_block;
  static constexpr int64_t kParamBytes = S::dtype == kFloat32 ? 4 : 2, kGradBytes = S::grad_dtype == kFloat32 ? 4 : 2;

 public:
  using Values = BlockValues<kTwoPass>;

  HWY_INLINE StepLoop(const StepSlot& slot, const StepFlags& flags, Values& values)
      : v_(values),
        s_(fixed_scalars(slot)),
        n_states_(Opt::states(flags.hyper)),
        pdt_(slot.param_dtype),
        gdt_(slot.grad_dtype),
        param_(slot.param),
        grad_(slot.grad),
        numel_(slot.numel),
        round_(param_round(pdt(), flags)),
        state_sr_(flags.state_stochastic_round),
        nu_linear_(flags.hyper.nu_linear_map),
        seed_(flags.seed),
        step_(uint64_t(slot.step)),
        grad_factor_(slot.grad_factor) {
    for (int k = 0; k < kMaxStates; ++k) st_[k] = slot.states[k];
    for (int k = 0; k < states(); ++k) codec_[k].init(host_codec<K>(Opt::moment(flags.hyper, k)));
  }

  // Blocks [b0, b1); returns b1.
  HWY_INLINE int64_t run(int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1 + (kPipelined ? 1 : 0); ++b) {
      const bool encoding = kPipelined && b > b0;  // block b - 1's encode runs in this round
      if (encoding) start_encoders(b - 1);
      if (b == b1) {  // the last block's encode alone
        if (encoding) encode_all<false>(0);
        break;
      }
      step_block(b, encoding);
    }
    return b1;
  }

 private:
  static typename Opt::Scalars fixed_scalars(const StepSlot& slot) {
    typename Opt::Scalars s = slot.scalars.template get<Opt>();
    (fix(s, Fixes()), ...);
    return s;
  }
  // What the shape fixes, as compile-time constants; the rest read from the slot.
  HWY_INLINE int states() const { return S::states >= 0 ? S::states : n_states_; }
  // Whether state k is active; code for a state the shape rules out is not even instantiated (every call here is
  // inlined, and the compiler would inline it before it could see that its branch is dead).
  template <int k>
  static constexpr bool kMayHave = S::states < 0 || k < S::states;
  template <int k>
  HWY_INLINE bool has() const {
    if constexpr (kMayHave<k>) return k < states();
    else return false;
  }
  HWY_INLINE Dtype pdt() const { return S::dtype >= 0 ? Dtype(S::dtype) : pdt_; }
  HWY_INLINE Dtype gdt() const { return S::grad_dtype >= 0 ? Dtype(S::grad_dtype) : gdt_; }
  static int64_t lanes() { return int64_t(hn::Lanes(DF())); }

  // Block b: its update loop (with block b - 1's encode when encoding), then its encode unless pipelined.
  HWY_INLINE void step_block(int64_t b, bool encoding) {
    const int64_t start = b * kBs;
    begin_block(b, start);
    // where this block prefetches: prefetch_ahead elements on, or near the tensor's end the block itself
    constexpr int64_t kAhead = TargetPolicy::prefetch_ahead;
    const int64_t ahead = start + kAhead + kBs <= numel_ ? start + kAhead : start;
    auto max0 = hn::Zero(DI()), max1 = max0, max2 = max0;
    // the encode's presence a compile-time constant: the loop then has no branch to code placed out of line
    if constexpr (kPipelined) {
      if (encoding) update_loop<true>(start, ahead, max0, max1, max2);
      else update_loop<false>(start, ahead, max0, max1, max2);
    } else {
      update_loop<false>(start, ahead, max0, max1, max2);
    }
    if (kQuantized) finish_block(b, start, max0, max1, max2);
  }

  HWY_INLINE void begin_block(int64_t b, int64_t start) {
    for (int k = 0; k < states(); ++k) {
      if (kQuantized) {  // decoded a vector at a time in the update loop
        bst_[k] = {v_.buf[b & 1][k], block_codes<K>(st_[k], start), st_[k].scales[b]};
        if (scales_table(codec_[k].c)) scale_table(codec_[k], bst_[k].scale, scaled_[k]);
      } else {  // updated in place
        bst_[k] = {static_cast<float*>(st_[k].codes) + start, nullptr, 0.0f};
      }
    }
  }

  // Two vectors a round: the 4-bit encode packs codes in pairs of vectors.
  template <bool kEncode>
  HWY_INLINE void update_loop(int64_t start, int64_t ahead, VI& max0, VI& max1, VI& max2) {
    for (int64_t i = 0; i < kBs; i += 2 * lanes()) {
      update_vec<false, kEncode>(start, ahead, i, max0, max1, max2);
      update_vec<true, kEncode>(start, ahead, i + lanes(), max0, max1, max2);
    }
  }

  template <bool kOdd, bool kEncode>
  HWY_INLINE void update_vec(int64_t start, int64_t ahead, int64_t i, VI& max0, VI& max1, VI& max2) {
    const DF df;
    if (kPrefetch) prefetch<kOdd>(ahead + i);
    auto p = load_value(pdt(), param_, start + i);
    auto g = load_value(gdt(), grad_, start + i);
    if (!S::unit_grad) g = hn::Mul(g, hn::Set(df, grad_factor_));
    auto x0 = load<0>(i), x1 = load<1>(i), x2 = load<2>(i);
    if constexpr (kTwoPass) {
      hn::Store(update_states<VecOps>(s_, p, g, x0, x1, x2), df, v_.tbuf + i);
    } else {
      update<VecOps>(s_, p, g, x0, x1, x2);
      store_param_at(pdt(), param_, start + i, p, round_, seed_, step_);
    }
    keep<0>(i, x0, max0);
    keep<1>(i, x1, max1);
    keep<2>(i, x2, max2);
    if (kEncode) encode_vec<kOdd>(i);
  }

  // One line each per vector (at up to 16 lanes, every line of a stream is touched), 16-bit streams every other
  // vector; the hardware prefetchers keep up with the code streams. Written out, not as a loop over the states:
  // GCC may delete a loop that holds only prefetches (C++ lets it assume that such a loop ends).
  template <bool kOdd>
  HWY_INLINE void prefetch(int64_t e) const {
    if (kParamBytes == 4 || !kOdd) __builtin_prefetch(static_cast<char*>(param_) + e * kParamBytes, 1);
    if (kGradBytes == 4 || !kOdd) __builtin_prefetch(static_cast<const char*>(grad_) + e * kGradBytes, 0);
    if (kQuantized) return;
    if (has<0>()) __builtin_prefetch(static_cast<float*>(st_[0].codes) + e, 1);
    if (has<1>()) __builtin_prefetch(static_cast<float*>(st_[1].codes) + e, 1);
    if (has<2>()) __builtin_prefetch(static_cast<float*>(st_[2].codes) + e, 1);
  }

  // f(std::integral_constant<Moment, m>()) for state k's moment m (kind_moment's): a constant, but for a state
  // whose moment LBOPT_FLAG_NU_LINEAR_MAP changes (AdEMAMix's 4-bit nu), one of two picked per call.
  template <int k>
  static constexpr Moment kMoment = kind_moment<K>(Opt::moment(Hyper(), k));
  template <int k>
  static constexpr Moment kLinearMoment = kind_moment<K>(Opt::moment(nu_linear_hyper(), k));
  template <int k, class F>
  HWY_INLINE decltype(auto) with_state_moment(const F& f) const {
    if constexpr (kMoment<k> != kLinearMoment<k>)
      if (nu_linear_) return f(std::integral_constant<Moment, kLinearMoment<k>>());
    return f(std::integral_constant<Moment, kMoment<k>>());
  }

  // State k's values of vector i as the block holds them (0 for an inactive state).
  template <int k>
  HWY_INLINE VF load(int64_t i) const {
    if constexpr (!kMayHave<k>) return hn::Zero(DF());
    else if (!has<k>()) return hn::Zero(DF());
    else if constexpr (kQuantized)
      return with_state_moment<k>([&](auto m) HWY_ATTR {
        return decode_vec<K, decltype(m)::value>(codec_[k], bst_[k].codes, i, hn::Set(DF(), bst_[k].scale),
                                                 scaled_[k]);
      });
    else
      return hn::LoadU(DF(), bst_[k].values + i);  // FP32 states: the caller's memory, any alignment
  }

  // State k's new values of vector i, kept for the encode, with their absmax bits.
  template <int k>
  HWY_INLINE void keep(int64_t i, VF x, VI& max) {
    if (!has<k>()) return;
    if (kQuantized) block_max_add(max, x);
    hn::StoreU(x, DF(), bst_[k].values + i);
  }

  // update_param for vector i of the block at start (kTwoPass), on the states' new values and update_states'
  // result, from the param as it was before the step.
  HWY_INLINE void param_vec(int64_t start, int64_t i) {
    if constexpr (kTwoPass) {
      const DF df;
      auto p = load_value(pdt(), param_, start + i);
      const auto x0 = hn::Load(df, bst_[0].values + i);
      const auto x1 = has<1>() ? hn::Load(df, bst_[1].values + i) : x0;
      const auto x2 = has<2>() ? hn::Load(df, bst_[2].values + i) : x0;
      update_param<VecOps>(s_, p, hn::Load(df, v_.tbuf + i), x0, x1, x2);
      store_param_at(pdt(), param_, start + i, p, round_, seed_, step_);
    }
  }

  // After block b's update loop: its absmax per state (a block that held a non-finite value first gets its
  // param update, which reads the values as the update made them, before block_absmax zeroes it; rare), then,
  // unless pipelined, its encode (**one encode loop**: every state's vector together).
  HWY_INLINE void finish_block(int64_t b, int64_t start, VI max0, VI max1, VI max2) {
    const int32_t top[kMaxStates] = {has<0>() ? block_top(max0) : 0, has<1>() ? block_top(max1) : 0,
                                     has<2>() ? block_top(max2) : 0};
    const bool finite = !kTwoPass || std::max(top[0], std::max(top[1], top[2])) < 0x7f800000;
    if (!finite)
      for (int64_t i = 0; i < kBs; i += lanes()) param_vec(start, i);
    for (int k = 0; k < states(); ++k) absmax_[k] = block_absmax(bst_[k].values, kBs, top[k]);
    if (kPipelined) return;
    start_encoders(b);
    if constexpr (kTwoPass) {
      if (finite) return encode_all<true>(start);
    }
    encode_all<false>(start);
  }

  // The encoders on block b, whose new values are in v_.buf[b % 2].
  HWY_INLINE void start_encoders(int64_t b) {
    for (int k = 0; k < states(); ++k) {
      const StateRounding r = state_rounding(state_sr_, codec_[k].c.second, seed_, int64_t(step_), k, b);
      enc_[k].init(codec_[k], st_[k], b, b * kBs, v_.buf[b & 1][k], absmax_[k], r.stochastic ? &r.key : nullptr);
    }
  }

  // Vector i of the encoders' block, for every state (odd: the second vector of a pair).
  template <bool kOdd>
  HWY_INLINE void encode_vec(int64_t i) {
    encode_state<0, kOdd>(i);
    encode_state<1, kOdd>(i);
    encode_state<2, kOdd>(i);
  }
  template <int k, bool kOdd>
  HWY_INLINE void encode_state(int64_t i) {
    if constexpr (kMayHave<k>)
      if (has<k>()) with_state_moment<k>([&](auto m) HWY_ATTR { enc_[k].template vec<decltype(m)::value, kOdd>(i); });
  }

  // The encoders' whole block; kWithParam: the param update of the block at start beside it (**two-pass update**).
  template <bool kWithParam>
  HWY_INLINE void encode_all(int64_t start) {
    for (int64_t i = 0; i < kBs; i += 2 * lanes()) {
      if (kWithParam) param_vec(start, i);
      encode_vec<false>(i);
      if (kWithParam) param_vec(start, i + lanes());
      encode_vec<true>(i + lanes());
    }
  }

  Values& v_;
  typename Opt::Scalars s_;
  int n_states_;
  Dtype pdt_, gdt_;
  void* param_;
  const void* grad_;
  int64_t numel_;
  ParamRound round_;
  bool state_sr_;
  bool nu_linear_;
  uint64_t seed_, step_;
  float grad_factor_;
  StateRef st_[kMaxStates];
  SimdCodec<K> codec_[kMaxStates];
  BlockState bst_[kMaxStates] = {};
  Table16 scaled_[kMaxStates];
  float absmax_[kMaxStates] = {};
  BlockEncoder<K> enc_[kMaxStates];
};

template <class Opt, class K, class S, class... Fixes>
int64_t step_loop(const StepSlot& slot, const StepFlags& flags, int64_t b0, int64_t b1) {
  using Loop = StepLoop<Opt, K, S, Fixes...>;
  typename Loop::Values values;
  Loop loop(slot, flags, values);
  return loop.run(b0, b1);
}

using StepFn = int64_t (*)(const StepSlot&, const StepFlags&, int64_t, int64_t);

// The step_loop with flag j of the list fixed to bit j of kBits.
template <class Opt, class K, class S, unsigned kBits, auto... kFlags, size_t... J>
constexpr StepFn fixed_loop(FlagList<kFlags...>, std::index_sequence<J...>) {
  return &step_loop<Opt, K, S, Fixed<kFlags, bool((kBits >> J) & 1u)>...>;
}

// The slot's flags as fixed_loop's bits.
template <auto... kFlags, class Scalars>
unsigned flag_bits(FlagList<kFlags...>, const Scalars& s) {
  unsigned bits = 0, j = 0;
  ((bits |= unsigned(bool(s.*kFlags)) << j++), ...);
  return bits;
}
template <auto... kFlags>
constexpr int flag_count(FlagList<kFlags...>) {
  return int(sizeof...(kFlags));
}

// The (param, grad) dtype pairs with loops of their own (**shaped loops**): fp32 params with fp32 grads, the
// common case; bf16 and float16 with grads of their dtype; fp32 master params with bf16 grads.
struct DtypePair {
  Dtype param, grad;
};
constexpr DtypePair kShapedDtypes[] = {{kFloat32, kFloat32}, {kBfloat16, kBfloat16}, {kFloat16, kFloat16},
                                       {kFloat32, kBfloat16}};
constexpr int kNumShapedDtypes = int(sizeof kShapedDtypes / sizeof kShapedDtypes[0]);

inline int shaped_dtypes_of(const StepSlot& slot) {
  for (int i = 0; i < kNumShapedDtypes; ++i)
    if (kShapedDtypes[i].param == slot.param_dtype && kShapedDtypes[i].grad == slot.grad_dtype) return i;
  return -1;
}

// The loops of optimizer Opt and kind K: one per shaped dtype pair, state count, unit grad factor or not, and
// combination of flags, at the index run computes, and the general loop for every other slot.
template <class Opt, class K>
struct StepLoops {
  static constexpr int kFlags = flag_count(typename Opt::Flags());
  static constexpr int kCounts = Opt::kMaxStates - Opt::kMinStates + 1;
  static constexpr size_t kShaped = size_t(kNumShapedDtypes * kCounts * 2) << kFlags;

  template <size_t I>
  static constexpr StepFn shaped() {
    constexpr size_t rest = I >> kFlags;
    constexpr DtypePair pair = kShapedDtypes[rest / 2 / kCounts];
    using S = Shape<pair.param, Opt::kMinStates + int(rest / 2 % kCounts), rest % 2 == 1, pair.grad>;
    return fixed_loop<Opt, K, S, unsigned(I & ((1u << kFlags) - 1))>(typename Opt::Flags(),
                                                                      std::make_index_sequence<kFlags>());
  }
  template <size_t... I>
  static constexpr std::array<StepFn, kShaped> table(std::index_sequence<I...>) {
    return {shaped<I>()...};
  }

  static int64_t run(const StepSlot& slot, const StepFlags& flags, int64_t b0, int64_t b1) {
#if LBOPT_SHAPED_LOOPS
    static constexpr std::array<StepFn, kShaped> kTable = table(std::make_index_sequence<kShaped>());
    const int pair = shaped_dtypes_of(slot), count = Opt::states(flags.hyper) - Opt::kMinStates;
    if (pair >= 0 && count >= 0 && count < kCounts) {
      const size_t rest = size_t(pair * kCounts + count) * 2 + (slot.grad_factor == 1.0f);
      const auto& scalars = slot.scalars.template get<Opt>();
      return kTable[(rest << kFlags) | flag_bits(typename Opt::Flags(), scalars)](slot, flags, b0, b1);
    }
#endif
    return step_loop<Opt, K, AnyShape>(slot, flags, b0, b1);
  }
};

#endif  // LBOPT_EXACT_FMA

}  // namespace HWY_NAMESPACE
}  // namespace lbopt::cpu
HWY_AFTER_NAMESPACE();

#endif  // LBOPT_KERNELS_CPU_STEP_LOOPS_INL_H_

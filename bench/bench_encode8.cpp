// ns per element of the 8-bit encode of 256-value blocks already divided by their absmax, per instruction set:
// the binary search over the 256 midpoints a step at a time over the block (all eight steps as gathers, and the
// kernels' variant whose first four steps permute a 16-entry table of every 16th midpoint), against the
// bucket-table encode of kernels/cpu/codebook8_arith-inl.h. Medians of repeated runs; every method's codes are
// checked against codebook_encode first.
// usage: bench_encode8 [repeats]
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/bench_encode8.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>

#include "kernels/cpu/codebook4-inl.h"  // lookup16
#include "kernels/cpu/codebook8_arith-inl.h"

HWY_BEFORE_NAMESPACE();
namespace lbopt::cpu {
namespace HWY_NAMESPACE {

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using DU8 = hn::Rebind<uint8_t, DF>;
using VI = hn::Vec<DI>;
using VF = hn::Vec<DF>;
constexpr int kBlock = 256;

HWY_INLINE VI SearchStep(VI code, VF probe, VF y, int32_t step) {
  return hn::IfThenElse(hn::RebindMask(DI(), hn::Le(probe, y)), hn::Add(code, hn::Set(DI(), step)), code);
}

HWY_INLINE void StoreCodes(const int32_t* code, uint8_t* out) {
  const size_t n = hn::Lanes(DF());
  for (size_t i = 0; i < kBlock; i += n)
    hn::StoreU(hn::TruncateTo(DU8(), hn::BitCast(DU(), hn::Load(DI(), code + i))), DU8(), out + i);
}


// method 0: eight gather steps (the first a broadcast); 1: four permute steps over every 16th midpoint, then four
// gathers; 2: the bucket table (one gather). y: n_blocks blocks of 256.
void EncodeBlocks(int method, int is_signed, const float* y, int64_t n_blocks, uint8_t* out) {
  const DF df;
  const DI di;
  const size_t n = hn::Lanes(df);
  const Encode8Tables& t = is_signed ? kEncode8Signed : kEncode8Unsigned;
  const float* mids = is_signed ? codebook::kSigned8Mids : codebook::kUnsigned8Mids;
  Table16 probe[3];  // probe[j][c] = mids[16 * (c + (4 >> j) - 1) + 15], clamped
  for (int j = 0; j < 3; ++j)
    for (size_t c = 0; c < sizeof probe[j].t / 4; ++c) {
      const size_t k = std::min<size_t>(c + (4 >> j) - 1, 15);
      probe[j].t[c] = mids[16 * k + 15];
    }
  // as the step kernels: the block's y and codes in adjacent local buffers (a fixed offset, no 4 KiB aliasing)
  HWY_ALIGN float ybuf[kBlock];
  HWY_ALIGN int32_t code[kBlock];
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float* yin = y + b * kBlock;
    const float* yb = ybuf;
    uint8_t* ob = out + b * kBlock;
    if (method == 2) {
      for (size_t i = 0; i < kBlock; i += n)
        hn::StoreU(hn::TruncateTo(DU8(), hn::BitCast(DU(), Encode8Arith(df, hn::Load(df, yin + i), t))), DU8(),
                   ob + i);
      continue;
    }
    // the first step also copies y (where the kernels store x / scale)
    const float first = method == 0 ? mids[127] : mids[16 * 7 + 15];
    for (size_t i = 0; i < kBlock; i += n) {
      const VF yi = hn::Load(df, yin + i);
      hn::Store(yi, df, ybuf + i);
      hn::Store(SearchStep(hn::Zero(di), hn::Set(df, first), yi, method == 0 ? 128 : 8), di, code + i);
    }
    int32_t step = 64;
    if (method == 1) {
      // steps 64 .. 16 on code / 16
      for (int j = 0; j < 3; ++j)
        for (size_t i = 0; i < kBlock; i += n) {
          const VI c = hn::Load(di, code + i);
          hn::Store(SearchStep(c, lookup16(probe[j], c), hn::Load(df, yb + i), 4 >> j), di, code + i);
        }
      step = 8;
    }
    for (; step > 0; step >>= 1)
      for (size_t i = 0; i < kBlock; i += n) {
        VI c = hn::Load(di, code + i);
        if (method == 1 && step == 8) c = hn::ShiftLeft<4>(c);
        const VF p = hn::GatherIndex(df, mids, hn::Add(c, hn::Set(di, step - 1)));
        hn::Store(SearchStep(c, p, hn::Load(df, yb + i), step), di, code + i);
      }
    StoreCodes(code, ob);
  }
}

int64_t CompiledTarget() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace lbopt::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <hwy/aligned_allocator.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/quant.h"

namespace lbopt::cpu {
HWY_EXPORT(EncodeBlocks);
HWY_EXPORT(CompiledTarget);
}

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? atoi(argv[1]) : 21;
  constexpr int64_t kBlocks = 512;  // 128 Ki values: 512 KiB of input, in L2
  const int64_t n = kBlocks * 256;
  hwy::AlignedFreeUniquePtr<float[]> y[2];  // aligned like the kernels' block buffers
  std::mt19937_64 rng(1);
  std::normal_distribution<float> nd;
  for (int s = 0; s < 2; ++s) {
    y[s] = hwy::AllocateAligned<float>(size_t(n));
    for (int64_t b = 0; b < kBlocks; ++b) {
      float* yb = y[s].get() + b * 256;
      float absmax = 0;
      for (int i = 0; i < 256; ++i) {
        const float g = nd(rng);
        yb[i] = s ? g : g * g;  // m-like (signed map) and v-like (unsigned map) states
        absmax = std::max(absmax, std::fabs(yb[i]));
      }
      for (int i = 0; i < 256; ++i) yb[i] /= absmax;
    }
  }
  std::vector<uint8_t> out(static_cast<size_t>(n));
  const char* method_name[3] = {"search, 8 gathers", "search, 4 permutes + 4 gathers", "bucket table"};
  printf("ns/element, median of %d runs (min in brackets); %lld blocks of 256\n", repeats, (long long)kBlocks);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    if (target != HWY_AVX2 && target != HWY_AVX3 && target != HWY_AVX3_DL) continue;
    hwy::SetSupportedTargetsForTest(target);
    if (HWY_DYNAMIC_DISPATCH(lbopt::cpu::CompiledTarget)() != target) return 1;
    const auto encode = &HWY_DYNAMIC_DISPATCH(lbopt::cpu::EncodeBlocks);
    for (int is_signed : {1, 0}) {
      const float* yy = y[is_signed].get();
      const float* mids = is_signed ? lbopt::codebook::kSigned8Mids : lbopt::codebook::kUnsigned8Mids;
      for (int method = 0; method < 3; ++method) {
        encode(method, is_signed, yy, kBlocks, out.data());
        for (int64_t i = 0; i < n; ++i)
          if (out[size_t(i)] != lbopt::codebook_encode(mids, 256, yy[i])) {
            printf("%s %s: wrong code at %lld\n", hwy::TargetName(target), method_name[method], (long long)i);
            return 1;
          }
        std::vector<double> ns;
        for (int r = 0; r < repeats; ++r) {
          const int inner = 20;
          const auto t0 = std::chrono::steady_clock::now();
          for (int k = 0; k < inner; ++k) encode(method, is_signed, yy, kBlocks, out.data());
          const auto t1 = std::chrono::steady_clock::now();
          ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / double(inner * n));
        }
        std::sort(ns.begin(), ns.end());
        printf("%-5s %-8s %-32s %6.3f  [%6.3f]\n", hwy::TargetName(target), is_signed ? "signed" : "unsigned",
               method_name[method], ns[ns.size() / 2], ns[0]);
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  return 0;
}
#endif  // HWY_ONCE

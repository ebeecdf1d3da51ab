// The codebooks in device constant memory, from the same generated lists as the host tables, and the per-CTA
// copies the kernels read: each lane looks up its own code (a decode, or a step of the encode's search), and
// constant memory serves one address per cycle, so a warp's 16 or 32 different addresses replay the load that
// many times; shared memory serves them in one pass but for bank conflicts.
#pragma once
#include "../codebooks.h"
#include "../encode_in_x.h"
#include "../quant.h"

namespace lbopt::cuda {

__constant__ float kSigned4Values[16] = {LBOPT_SIGNED4_VALUES};
__constant__ float kSigned4Mids[16] = {LBOPT_SIGNED4_MIDS};
__constant__ float kUnsigned4Values[16] = {LBOPT_UNSIGNED4_VALUES};
__constant__ float kUnsigned4Mids[16] = {LBOPT_UNSIGNED4_MIDS};
__constant__ float kSigned8Values[256] = {LBOPT_SIGNED8_VALUES};
__constant__ float kSigned8Mids[256] = {LBOPT_SIGNED8_MIDS};
__constant__ float kUnsigned8Values[256] = {LBOPT_UNSIGNED8_VALUES};
__constant__ float kUnsigned8Mids[256] = {LBOPT_UNSIGNED8_MIDS};

// The signed 4-bit map's candidates for the encode in x (encode_in_x.h).
__constant__ encode4::SignedBuckets kSignedBucketsDevice = encode4::signed_buckets();

// The four tables (values and midpoints of the signed and unsigned maps) of state kind K, copied into this
// CTA's shared memory. Every thread of the CTA calls it, before any of them returns (it synchronizes the CTA).
template <class K>
__device__ __forceinline__ CodebookTables shared_codebooks() {
  constexpr int n = int(K::entries);
  if constexpr (n == 0) {
    return CodebookTables{};
  } else {
    __shared__ float t[4][n];
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      t[0][i] = n == 16 ? kSigned4Values[i] : kSigned8Values[i];
      t[1][i] = n == 16 ? kSigned4Mids[i] : kSigned8Mids[i];
      t[2][i] = n == 16 ? kUnsigned4Values[i] : kUnsigned8Values[i];
      t[3][i] = n == 16 ? kUnsigned4Mids[i] : kUnsigned8Mids[i];
    }
    __syncthreads();
    return n == 16 ? CodebookTables{t[0], t[1], t[2], t[3], nullptr, nullptr, nullptr, nullptr}
                   : CodebookTables{nullptr, nullptr, nullptr, nullptr, t[0], t[1], t[2], t[3]};
  }
}

// The signed 4-bit map's candidates (encode_signed_in_x), copied into this CTA's shared memory for the 4-bit kinds
// (NULL for the others). Every thread of the CTA calls it, before any of them returns.
template <class K>
__device__ __forceinline__ const int32_t* shared_signed_buckets() {
  if constexpr (K::entries != 16) {
    return nullptr;
  } else {
    __shared__ int32_t first[32];
    for (int i = threadIdx.x; i < 32; i += blockDim.x) first[i] = kSignedBucketsDevice.first[i];
    __syncthreads();
    return first;
  }
}

}  // namespace lbopt::cuda

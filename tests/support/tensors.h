// Test helpers: owned buffers exposed as DLTensors, and buffer hashes that prove "nothing was written".
#pragma once
#include <stdint.h>
#include <string.h>

#include <memory>
#include <vector>

#include "lbopt.h"

namespace test {

// A CPU buffer with a 1-D (or given) shape, viewed as a DLTensor. Storage is 64-byte aligned with slack so
// tests can shift byte_offset.
struct Buffer {
  std::vector<int64_t> shape;
  std::vector<uint8_t> storage;
  DLTensor t{};

  Buffer(DLDataType dtype, std::vector<int64_t> dims, size_t slack = 64) : shape(std::move(dims)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    storage.assign(size_t(n) * (dtype.bits / 8) + slack + 64, 0);
    t.data = aligned_base();
    t.device = {kDLCPU, 0};
    t.ndim = int(shape.size());
    t.dtype = dtype;
    t.shape = shape.data();
    t.strides = nullptr;
    t.byte_offset = 0;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  uint8_t* aligned_base() {
    const uintptr_t p = reinterpret_cast<uintptr_t>(storage.data());
    return storage.data() + ((64 - p % 64) % 64);
  }
  template <class T>
  T* as() const {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(t.data) + t.byte_offset);
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  size_t bytes() const { return size_t(numel()) * (t.dtype.bits / 8); }
  DLTensor* get() { return &t; }
};

inline DLDataType f32() { return {kDLFloat, 32, 1}; }
inline DLDataType bf16() { return {kDLBfloat, 16, 1}; }
inline DLDataType f16() { return {kDLFloat, 16, 1}; }
inline DLDataType u8() { return {kDLUInt, 8, 1}; }

// FNV-1a over the data and the slack after it, so writes past a view are caught too; equal contents hash
// equal across buffers.
inline uint64_t hash(const Buffer& b) {
  uint64_t h = 1469598103934665603ull;
  const uint8_t* base = const_cast<Buffer&>(b).aligned_base();
  for (const uint8_t* c = base; c < base + (b.storage.size() - 64); ++c) h = (h ^ *c) * 1099511628211ull;
  return h;
}

// One optimizer state allocated from lbopt_state_layout.
struct State {
  std::unique_ptr<Buffer> codes, scales;
  State(lbopt_state_kind kind, int64_t numel) {
    lbopt_layout l;
    lbopt_state_layout(kind, numel, &l, sizeof l);
    codes = std::make_unique<Buffer>(l.codes_dtype, std::vector<int64_t>{l.codes_numel});
    if (l.scales_numel || kind != LBOPT_STATE_FP32)
      scales = std::make_unique<Buffer>(f32(), std::vector<int64_t>{l.scales_numel});
  }
  lbopt_state view() const { return {&codes->t, scales ? &scales->t : nullptr}; }
};

// Every byte of b's storage (slack included) non-zero and random: what a test starts from before it writes the
// values a call reads, so that a read past them is a difference.
template <class Rng>
void randomize(Buffer& b, Rng& rng) {
  for (uint8_t& c : b.storage) c = uint8_t(1 + rng() % 255);
}

// Valid, finite, non-zero values in the view of b (after a mutation moved it, too): floats of magnitude 0.05 to 2.05
// (non-negative with nonneg), any non-zero byte in other dtypes.
template <class Rng>
void fill_valid(Buffer& b, Rng& rng, bool nonneg = false) {
  for (int64_t i = 0; i < b.numel(); ++i) {
    const uint32_t sign = nonneg ? 0u : uint32_t(rng() & 1u);
    if (b.t.dtype.code == kDLFloat && b.t.dtype.bits == 32) {
      const float mag = 0.05f + float(rng() % 1000) / 500.0f;
      b.as<float>()[i] = sign ? -mag : mag;
    } else if (b.t.dtype.code == kDLBfloat && b.t.dtype.bits == 16) {
      b.as<uint16_t>()[i] = uint16_t(sign << 15 | (120u + rng() % 11) << 7 | (rng() & 0x7fu));
    } else if (b.t.dtype.code == kDLFloat && b.t.dtype.bits == 16) {
      b.as<uint16_t>()[i] = uint16_t(sign << 15 | (10u + rng() % 11) << 10 | (rng() & 0x3ffu));
    } else {
      b.as<uint8_t>()[i] = uint8_t(1 + rng() % 255);
    }
  }
}

// A state of `kind` filled as fill_valid (positive scales), its FP8 codes without NaN and, for a second moment
// (nonneg), without sign.
template <class Rng>
void fill_valid_state(State& st, lbopt_state_kind kind, Rng& rng, bool nonneg) {
  fill_valid(*st.codes, rng, nonneg);
  if (kind == LBOPT_STATE_FP8)
    for (int64_t i = 0; i < st.codes->numel(); ++i) {
      uint8_t& c = st.codes->as<uint8_t>()[i];
      if ((c & 0x7f) == 0x7f) c = uint8_t(c & 0xfe);  // no NaN codes
      if (nonneg) c = uint8_t(c & 0x7f);
    }
  if (st.scales) fill_valid(*st.scales, rng, true);
}

}  // namespace test

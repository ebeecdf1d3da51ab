// libFuzzer harness for the C ABI (abi/lbopt.h): every entry point that takes caller memory, driven with fuzzed
// structs, enums, hyper-parameters and DLTensor metadata over real heap buffers, checking the contract:
//
//   * the returned status is a known lbopt_status;
//   * after an error lbopt_last_error() is non-empty and not one byte of any buffer (slack included) changed;
//   * after a success lbopt_last_error() is "", read-only inputs (grads, quantize src, dequantize codes and scales,
//     option scalars, capturable lr/step) are unchanged, nothing outside the written tensors' own byte ranges
//     changed (so no slack byte around any buffer), no written range overlaps another tensor of the call, and with
//     a nonzero options.found_inf only options.skipped (all 1) was written;
//   * the caller's structs, DLTensors, shape and stride arrays are never written;
//   * and, through ASan/UBSan, no out-of-bounds access or undefined behaviour anywhere.
//
// Every tensor is backed by its own malloc'd block: 64+ bytes of random slack, a region of exactly the bytes its
// claimed shape and dtype need (elements of ceil(bits * lanes / 8) bytes, from data + byte_offset), 64+ bytes of
// slack. The regions of one input total at most kBudget bytes; a tensor whose claimed extent does not fit gets
// data = NULL (or keeps its pointer when it holds no element, or when data + byte_offset wraps around the address
// space), so a call the library accepts can never legally touch memory outside its buffers. Optionally a tensor
// shares an earlier tensor's block (aliasing); the block is then sized for both.
//
// Input format (a byte reader; bytes past the end read as 0, and 0 always picks the valid default, so the one-byte
// input "\x00" is a valid 4-bit step and every seed can be short):
//   u8 entry (% 10): 0 adamw_step, 1 adamw_step_capturable, 2 quantize, 3 dequantize, 4 state_init,
//                    5 state_layout, 6 op_invoke, 7 step (the generic step of any optimizer), 8 step_capturable,
//                    9 the name lookups (lbopt_optimizer_name, lbopt_state_kind_name, lbopt_op_find)
//   u32 content seed, u8 misc (bit0: pass a non-NULL dummy stream, which CPU calls must ignore; bit1: tensors on
//   cuda:0 by default, bit2: on kDLCUDAHost by default)
//   then the entry's fields in the order the decode_* functions below read them; each tensor is
//   u8 mut, u8 aux, then the fields mut selects (see Ctx::tensor).
// Every lbopt_adamw_step is preceded by lbopt_adamw_step_validate on the same arguments, whose status and message
// must be the step's, and by lbopt_adamw_config_validate, whose refusal must be the step's. The same holds for
// lbopt_step with lbopt_step_validate and lbopt_optimizer_config_validate (for lbopt_step_capturable: the config's
// refusal at lr = 0); lbopt_optimizer_states must give lbopt_optimizer_config_validate's verdict at lr = 0 and,
// when it accepts, this harness's own count and codebooks of the optimizer's states; and
// lbopt_optimizer_config_validate must accept exactly the configs this harness's model of the documented ranges
// (abi/lbopt.h) accepts.
// LBOPT_FUZZ_VERBOSE=1 prints one line per input (entry, status, message): run the binary on a file to see what
// a reproducer or a seed does.
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <array>
#include <deque>
#include <string>
#include <vector>

#include "lbopt.h"

namespace {

constexpr size_t kBudget = size_t(1) << 20;  // bytes of tensor regions per input
constexpr size_t kSlack = 64;
constexpr int kMaxDims = 8;     // shape / stride arrays; fuzzed ndim stays within [-6, 6]
constexpr int kMaxTensors = 48;
constexpr int64_t kMaxNumel = 4096;
constexpr int kLastStatus = LBOPT_ERR_INTERNAL;

bool g_verbose = false;

// ------------------------------------------------------------------------------------------------------------
// Input decoding

struct Reader {
  const uint8_t* p;
  size_t n;
  uint8_t u8() {
    if (!n) return 0;
    --n;
    return *p++;
  }
  uint16_t u16() { return uint16_t(u8() | unsigned(u8()) << 8); }
  uint32_t u32() { return uint32_t(u16()) | uint32_t(u16()) << 16; }
  uint64_t u64() { return uint64_t(u32()) | uint64_t(u32()) << 32; }
};

double fuzz_double(Reader& r, double typical) {
  const uint8_t s = r.u8();
  const int hi = s >> 4;
  switch (s & 15) {
    case 0: return typical;
    case 1: return NAN;
    case 2: return INFINITY;
    case 3: return -INFINITY;
    case 4: return -typical;
    case 5: return 0.0;
    case 6: return -0.0;
    case 7: return 1.0;
    case 8: return nextafter(1.0, 0.0);
    case 9: return 4.9e-324;
    case 10: return DBL_MAX;
    case 11: {
      const uint64_t bits = r.u64();
      double d;
      memcpy(&d, &bits, sizeof d);
      return d;
    }
    case 12: return typical * (1 + hi);
    case 13: return hi / 16.0;
    case 14: return -NAN;
    default: return hi ? 1e300 : 1e-300;
  }
}

int64_t fuzz_i64(Reader& r, int64_t typical) {
  const uint8_t s = r.u8();
  const int hi = s >> 4;
  switch (s & 15) {
    case 0: return typical;
    case 1: return 0;
    case 2: return -1;
    case 3: return INT64_MIN;
    case 4: return INT64_MAX;
    case 5: return typical + 1 + hi;
    case 6: return typical - 1 - hi;
    case 7: return INT64_MAX / 4 + hi - 8;
    case 8: return int64_t(r.u64());
    case 9: return hi;
    case 10: return -2 - hi;
    case 11: return int64_t(1) << (30 + hi);
    case 12: return int64_t(INT32_MAX) + hi;
    default: return typical;
  }
}

int32_t fuzz_enum(Reader& r, int n_valid) {
  const uint8_t s = r.u8();
  if (!(s & 0x80)) return s % n_valid;
  switch (s & 7) {
    case 0: return -1;
    case 1: return n_valid;
    case 2: return n_valid + 1 + ((s >> 3) & 15);
    case 3: return INT32_MAX;
    case 4: return INT32_MIN;
    case 5: return 0x7fffffff - 1;
    case 6: return int32_t(r.u32());
    default: return -2 - ((s >> 3) & 15);
  }
}

// An element count: 0 (the byte pair) picks dflt.
int64_t fuzz_numel(Reader& r, int64_t dflt) {
  const uint16_t v = r.u16();
  return v == 0 ? dflt : int64_t(v - 1) % (kMaxNumel + 1);
}

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const int exp = int((x >> 23) & 0xff);
  const uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) return uint16_t(sign | 0x7c00u | (mant ? 0x200u : 0u));
  const int e = exp - 127 + 15;
  if (e >= 31) return uint16_t(sign | 0x7c00u);
  if (e <= 0) return sign;
  return uint16_t(sign | unsigned(e) << 10 | mant >> 13);
}

uint16_t f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if (isnan(f)) return uint16_t((x >> 16) | 0x40u);
  return uint16_t(x >> 16);
}

constexpr DLDataType kF32{kDLFloat, 32, 1}, kF64{kDLFloat, 64, 1}, kBF16{kDLBfloat, 16, 1}, kF16{kDLFloat, 16, 1},
    kU8{kDLUInt, 8, 1}, kI64{kDLInt, 64, 1};

bool same(DLDataType a, DLDataType b) { return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes; }

const char* kKindNames[] = {"4bit", "8bit", "fp8", "fp32"};

// ------------------------------------------------------------------------------------------------------------
// Tensors and their memory

enum class Role { kParam, kGrad, kCodes, kScales, kValues, kGradScale, kFoundInf, kSkipped, kLr, kStep, kLayoutOut };

struct Tens {
  DLTensor t{};
  int64_t shape[kMaxDims]{};
  int64_t strides[kMaxDims]{};
  const char* name = "";
  Role role = Role::kValues;
  bool present = false;  // passed to the call as a non-NULL pointer
  bool written = false;  // the call may write it
  bool null_data = false;
  int alias = -1;        // share the block of this earlier tensor
  int alloc = -1;
  bool owner = false;    // this tensor's contents fill the block
  size_t misalign = 0;   // data = region + misalign
  bool shape_ok = false; // ndim >= 0, shape readable, no negative dim, no overflow
  uint64_t need = 0;     // bytes from data + byte_offset that the metadata claims (upper bound)
  uint64_t lib_bytes = 0;  // numel * (bits / 8): what an accepting library touches
  bool fits = false;     // data + byte_offset + need lies inside the block's region
  int mode = 0;          // contents: 0 valid, 1 random bytes, 2 zeros, 3 valid plus one special value
  uint8_t special = 0;
  uint16_t special_at = 0;
  bool nonneg = false;   // valid contents are >= 0 (second moments)
  int kind = 0;          // state kind of codes (fp8: no NaN codes in valid contents)
  int64_t numel = 0;
  // copy of the struct and arrays before the call
  uint8_t before[sizeof(DLTensor) + 2 * sizeof(int64_t) * kMaxDims];
};

struct Alloc {
  uint8_t* block = nullptr;
  size_t block_size = 0;
  size_t region_off = 0;
  size_t region_size = 0;
  std::vector<uint8_t> snap;
};

struct Ctx {
  Reader r;
  uint64_t rng;
  std::array<Tens, kMaxTensors> tens;
  int n_tens = 0;
  std::vector<Alloc> allocs;
  size_t budget = kBudget;
  std::deque<std::string> strings;
  const char* entry = "";
  void* stream = nullptr;
  DLDevice device{kDLCPU, 0};  // every tensor's device unless its own is fuzzed
  // lbopt_state_layout's out struct, if any (an alloc of its own)
  int raw_out = -1;
  size_t raw_out_size = 0;
  // step semantics
  int found_inf = -1, skipped = -1;
  size_t n_slots = 0;

  ~Ctx() {
    for (Alloc& a : allocs) free(a.block);
  }

  uint64_t rand() { return splitmix(rng); }

  const DLTensor* ptr(int i) const { return i >= 0 && tens[size_t(i)].present ? &tens[size_t(i)].t : nullptr; }

  // A valid shape of n elements with ndim choice c (0..3), row-major.
  static int derived_shape(int64_t n, int c, int64_t* shape) {
    switch (c) {
      case 0:
        if (n == 1) return 0;
        shape[0] = n;
        return 1;
      case 1: shape[0] = n; return 1;
      case 2:
        if (n > 0 && n % 2 == 0) { shape[0] = 2; shape[1] = n / 2; }
        else { shape[0] = 1; shape[1] = n; }
        return 2;
      default: {
        const int64_t a = n > 0 && n % 3 == 0 ? 3 : 1;
        shape[0] = a; shape[1] = n / a; shape[2] = 1;
        return 3;
      }
    }
  }

  // Decode one tensor. numel: the element count a valid call needs; dtypes: the valid dtypes (aux picks one);
  // like: a tensor whose final shape this one copies unless its own shape is fuzzed (grad like param).
  int tensor(const char* name, Role role, int64_t numel, std::initializer_list<DLDataType> dtypes,
             bool default_present, bool written, int like = -1, bool nonneg = false, int kind = 0) {
    if (n_tens >= kMaxTensors) abort();  // harness bug
    const int index = n_tens++;
    Tens& T = tens[size_t(index)];
    T = Tens{};
    T.name = name;
    T.role = role;
    T.written = written;
    T.nonneg = nonneg;
    T.kind = kind;
    const uint8_t mut = r.u8();
    const uint8_t aux = r.u8();
    T.present = default_present != bool(mut & 0x80);
    T.mode = (aux >> 3) & 3;
    if (T.mode == 3) {
      T.special = r.u8();
      T.special_at = r.u16();
    }
    // dtype
    T.t.dtype = dtypes.begin()[size_t(aux >> 5) % dtypes.size()];
    if (mut & 0x01) {
      T.t.dtype.code = r.u8();
      T.t.dtype.bits = r.u8();
      T.t.dtype.lanes = r.u16();
    }
    // device
    T.t.device = device;
    if (mut & 0x02) {
      const uint8_t s = r.u8();
      switch (s & 3) {
        case 0: T.t.device.device_type = kDLCUDAHost; break;
        case 1: T.t.device.device_type = kDLCUDA; break;
        case 2: T.t.device.device_type = kDLCPU; break;
        default: T.t.device.device_type = DLDeviceType((s >> 2) & 15); break;  // within the enum's range
      }
      const uint8_t id = r.u8();
      T.t.device.device_id = (id & 3) == 0 ? 0 : (id & 3) == 1 ? 1 : (id & 3) == 2 ? -1 : int32_t(r.u32());
    }
    // shape
    int64_t derived[kMaxDims] = {1, 1, 1, 1, 1, 1, 1, 1};
    const int derived_ndim = derived_shape(numel, aux & 3, derived);
    T.t.shape = T.shape;
    if (mut & 0x04) {
      const int8_t v = int8_t(r.u8());
      T.t.ndim = v % 7;
      if (v == 0x7f) T.t.shape = nullptr;  // ndim 1 with shape NULL
      for (int d = 0; d < std::max(T.t.ndim, 0); ++d) {
        const uint8_t s = r.u8();
        const int hi = s >> 3;
        switch (s & 7) {
          case 0: T.shape[d] = derived[d]; break;
          case 1: T.shape[d] = 0; break;
          case 2: T.shape[d] = -1 - hi; break;
          case 3: T.shape[d] = hi; break;
          case 4: T.shape[d] = derived[d] + 1 + hi; break;
          case 5: T.shape[d] = INT64_MAX / (1 + hi); break;
          case 6: T.shape[d] = int64_t(1) << (32 + hi % 31); break;
          default: T.shape[d] = int64_t(r.u64()); break;
        }
      }
    } else if (like >= 0) {
      const Tens& L = tens[size_t(like)];
      T.t.ndim = L.t.ndim;
      if (!L.t.shape) T.t.shape = nullptr;
      memcpy(T.shape, L.shape, sizeof T.shape);
    } else {
      T.t.ndim = derived_ndim;
      memcpy(T.shape, derived, sizeof T.shape);
    }
    // strides: NULL, dense (compact in a dimension order, any stride on extent-1 dims), or fuzzed. With aux bit
    // 0x04 one more byte picks the order: 0 row-major, odd the like tensor's strides (a grad laid out as its
    // param), else a permutation (channels_last, transposes)
    const int nd = std::max(T.t.ndim, 0);
    if ((aux & 0x04) || (mut & 0x08)) {
      int order[kMaxDims];
      for (int d = 0; d < kMaxDims; ++d) order[d] = d;
      const uint8_t pick = (aux & 0x04) ? r.u8() : 0;
      if (pick && !(pick & 1)) {  // a Fisher-Yates shuffle driven by pick >> 1
        unsigned k = pick >> 1;
        for (int d = nd - 1; d > 0; --d) {
          std::swap(order[d], order[k % unsigned(d + 1)]);
          k /= unsigned(d + 1);
        }
      }
      uint64_t expected = 1;  // wraps for absurd shapes, which the library rejects before looking at strides
      for (int j = nd - 1; j >= 0; --j) {
        const int d = order[j];
        T.strides[d] = T.shape[d] == 1 ? 12345 + d : int64_t(expected);
        expected *= T.shape[d] ? uint64_t(T.shape[d]) : 1u;
      }
      if ((pick & 1) && like >= 0 && tens[size_t(like)].t.strides)
        memcpy(T.strides, tens[size_t(like)].strides, sizeof T.strides);
      T.t.strides = T.strides;
    }
    if (mut & 0x08) {
      for (int d = 0; d < nd; ++d) {
        const uint8_t s = r.u8();
        switch (s & 3) {
          case 0: break;  // compact
          case 1: T.strides[d] = 0; break;
          case 2: T.strides[d] = -1 - (s >> 2); break;
          default: T.strides[d] = (s >> 2) == 63 ? int64_t(r.u64()) : (s >> 2); break;
        }
      }
    }
    // byte_offset and data misalignment
    const uint64_t elem = T.t.dtype.bits >= 8 ? T.t.dtype.bits / 8 : 1;
    if (mut & 0x10) {
      const uint8_t s = r.u8();
      const uint64_t hi = s >> 3;
      switch (s & 7) {
        case 0: T.t.byte_offset = elem * hi; break;
        case 1: T.t.byte_offset = hi; break;
        case 2: T.t.byte_offset = uint64_t(1) << 40; break;
        case 3: T.t.byte_offset = ~uint64_t(0) - hi; break;  // wraps the address space
        case 4: T.misalign = hi & 7; break;
        case 5: T.t.byte_offset = r.u64(); break;
        case 6: T.t.byte_offset = uint64_t(INT64_MAX); break;
        default: T.t.byte_offset = 4096 * hi; break;
      }
    }
    T.null_data = mut & 0x20;
    if ((mut & 0x40) && index > 0) T.alias = r.u8() % index;
    return index;
  }

  // Sizes, blocks, data pointers, contents; then the snapshot.
  void materialize() {
    for (int i = 0; i < n_tens; ++i) {
      Tens& T = tens[size_t(i)];
      if (!T.present || T.null_data) continue;
      // claimed extent
      const DLDataType dt = T.t.dtype;
      const uint64_t elem_bytes = std::max<uint64_t>(1, (uint64_t(dt.bits) * std::max<uint16_t>(dt.lanes, 1) + 7) / 8);
      T.shape_ok = T.t.ndim >= 0 && (T.t.ndim == 0 || T.t.shape);
      uint64_t numel = 1;
      bool overflow = false;
      for (int d = 0; T.shape_ok && d < T.t.ndim; ++d) {
        if (T.shape[d] < 0) T.shape_ok = false;
        else if (__builtin_mul_overflow(numel, uint64_t(T.shape[d]), &numel)) overflow = true;
      }
      if (numel > uint64_t(INT64_MAX)) overflow = true;
      if (overflow) T.shape_ok = false;
      T.numel = T.shape_ok ? int64_t(numel) : 0;
      uint64_t need = 0, req = 0;
      bool big = !T.shape_ok && overflow;
      if (T.shape_ok) {
        big = __builtin_mul_overflow(numel, elem_bytes, &need);
        T.lib_bytes = numel * (dt.bits / 8);  // only used where the library accepted, so no overflow then
      }
      T.need = need;
      big = big || __builtin_add_overflow(uint64_t(T.misalign), T.t.byte_offset, &req) ||
            __builtin_add_overflow(req, need, &req);
      // block: own or shared
      if (T.alias >= 0 && tens[size_t(T.alias)].alloc >= 0) {
        T.alloc = tens[size_t(T.alias)].alloc;
      } else {
        T.alloc = int(allocs.size());
        allocs.emplace_back();
        T.owner = true;
      }
      Alloc& a = allocs[size_t(T.alloc)];
      if (!big && (req <= a.region_size || req - a.region_size <= budget)) {
        if (req > a.region_size) {
          budget -= req - a.region_size;
          a.region_size = req;
        }
        T.fits = true;
      }
    }
    if (raw_out >= 0) {  // lbopt_state_layout's out struct: raw_out_size bytes, no tensor
      Alloc a;
      a.region_size = raw_out_size;
      raw_out = int(allocs.size());
      allocs.push_back(a);
    }
    for (Alloc& a : allocs) {
      a.block_size = kSlack + 64 + a.region_size + kSlack;
      a.block = static_cast<uint8_t*>(malloc(a.block_size));
      if (!a.block) abort();
      const uintptr_t start = reinterpret_cast<uintptr_t>(a.block) + kSlack;
      a.region_off = kSlack + size_t((64 - start % 64) % 64);
      for (size_t k = 0; k < a.block_size; ++k) a.block[k] = uint8_t(rand());
    }
    for (int i = 0; i < n_tens; ++i) {
      Tens& T = tens[size_t(i)];
      if (!T.present || T.null_data) continue;
      Alloc& a = allocs[size_t(T.alloc)];
      uint8_t* data = a.block + a.region_off + T.misalign;
      T.t.data = data;
      if (!T.fits) {
        const uintptr_t addr = reinterpret_cast<uintptr_t>(data);
        const bool wraps = addr + T.t.byte_offset < addr;
        // Keep a pointer the library can never legally follow: a wrapping address, or one with no elements
        // (or an invalid shape, which must be rejected first). Otherwise the metadata claims more memory than
        // exists, which no library can detect: pass NULL instead.
        if (!(wraps || !T.shape_ok || T.need == 0)) T.t.data = nullptr;
      } else if (T.owner) {
        fill(T);
      }
    }
    // snapshots: blocks, then the DLTensors and their arrays
    for (Alloc& a : allocs) a.snap.assign(a.block, a.block + a.block_size);
    for (int i = 0; i < n_tens; ++i) save(tens[size_t(i)]);
  }

  static void save(Tens& T) {
    memcpy(T.before, &T.t, sizeof(DLTensor));
    memcpy(T.before + sizeof(DLTensor), T.shape, sizeof T.shape);
    memcpy(T.before + sizeof(DLTensor) + sizeof T.shape, T.strides, sizeof T.strides);
  }
  static bool unchanged(const Tens& T) {
    uint8_t now[sizeof T.before];
    memcpy(now, &T.t, sizeof(DLTensor));
    memcpy(now + sizeof(DLTensor), T.shape, sizeof T.shape);
    memcpy(now + sizeof(DLTensor) + sizeof T.shape, T.strides, sizeof T.strides);
    return memcmp(now, T.before, sizeof now) == 0;
  }

  // A valid value for the tensor's role.
  double valid_value(const Tens& T) {
    const uint64_t u = rand();
    const double mag = 0.05 + double(u % 1000) / 500.0;
    const bool neg = !T.nonneg && ((u >> 20) & 1);
    switch (T.role) {
      case Role::kScales: return 0.01 + double(u % 1000) / 500.0;
      case Role::kGradScale: return ldexp(1.0, int(u % 9) - 4);
      case Role::kFoundInf: return 0.0;
      case Role::kLr: return 1e-3;
      case Role::kStep: return double(1 + u % 100);
      default: return neg ? -mag : mag;
    }
  }

  double special_value(uint8_t s) const {
    switch (s & 7) {
      case 0: return NAN;
      case 1: return INFINITY;
      case 2: return -INFINITY;
      case 3: return -1.0;
      case 4: return 1e30;
      case 5: return FLT_MAX;
      case 6: return 1e-40;
      default: return (s >> 3) & 1 ? 0.0 : -0.0;
    }
  }

  void put(const Tens& T, uint8_t* p, double v, bool special) {
    const DLDataType dt = T.t.dtype;
    if (same(dt, kF32)) {
      const float f = float(v);
      memcpy(p, &f, 4);
    } else if (same(dt, kF64)) {
      memcpy(p, &v, 8);
    } else if (same(dt, kF16)) {
      const uint16_t h = f32_to_f16(float(v));
      memcpy(p, &h, 2);
    } else if (same(dt, kBF16)) {
      const uint16_t h = f32_to_bf16(float(v));
      memcpy(p, &h, 2);
    } else if (same(dt, kI64)) {
      int64_t i;
      if (special) i = (T.special & 3) == 0 ? 0 : (T.special & 3) == 1 ? -1 : (T.special & 3) == 2 ? INT64_MAX : INT64_MIN;
      else i = isfinite(v) && fabs(v) < 9e18 ? int64_t(v) : 0;
      memcpy(p, &i, 8);
    } else if (same(dt, kU8)) {
      uint8_t c = uint8_t(rand());
      if (special) c = (T.special & 1) ? 0xff : 0x7f;
      else if (T.role == Role::kCodes && T.kind == LBOPT_STATE_FP8) {
        if ((c & 0x7f) == 0x7f) c = uint8_t(c & 0xfe);  // no NaN codes
        if (T.nonneg) c = uint8_t(c & 0x7f);
      }
      *p = c;
    }
  }

  void fill(const Tens& T) {
    uint8_t* base = static_cast<uint8_t*>(T.t.data) + T.t.byte_offset;
    if (T.mode == 1) return;  // the block's random bytes
    if (T.mode == 2) {
      memset(base, 0, T.need);
      return;
    }
    const DLDataType dt = T.t.dtype;
    const bool known = same(dt, kF32) || same(dt, kF64) || same(dt, kF16) || same(dt, kBF16) || same(dt, kI64) ||
                       same(dt, kU8);
    if (!known) return;
    const int64_t elem = dt.bits / 8;
    for (int64_t k = 0; k < T.numel; ++k) put(T, base + k * elem, valid_value(T), false);
    if (T.mode == 3 && T.numel > 0) {
      const int64_t k = T.special_at % T.numel;
      put(T, base + k * elem, special_value(T.special), true);
    }
  }

  // ----------------------------------------------------------------------------------------------------------
  // Checks

  [[noreturn]] void die(lbopt_status st, const char* what, ...) __attribute__((format(printf, 3, 4))) {
    va_list ap;
    va_start(ap, what);
    fprintf(stderr, "\nlbopt fuzz: contract violated in %s (status %d, last_error \"%s\"): ", entry, int(st),
            lbopt_last_error());
    vfprintf(stderr, what, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    for (int i = 0; i < n_tens; ++i) {
      const Tens& T = tens[size_t(i)];
      fprintf(stderr, "  tensor %d %s: present %d written %d data %p off %llu ndim %d dtype %u/%u/%u dev %d:%d "
              "numel %lld fits %d alloc %d alias %d\n", i, T.name, T.present, T.written, T.t.data,
              (unsigned long long)T.t.byte_offset, T.t.ndim, T.t.dtype.code, T.t.dtype.bits, T.t.dtype.lanes,
              int(T.t.device.device_type), T.t.device.device_id, (long long)T.numel, T.fits, T.alloc, T.alias);
    }
    abort();
  }

  void check(lbopt_status st) {
    const char* msg = lbopt_last_error();
    if (g_verbose) fprintf(stderr, "lbopt fuzz: %s -> %d %s\n", entry, int(st), msg ? msg : "(null)");
    if (int(st) < 0 || int(st) > kLastStatus) die(st, "status %d is not a known lbopt_status", int(st));
    if (!lbopt_status_string(st)) die(st, "lbopt_status_string returned NULL");
    if (!msg) die(st, "lbopt_last_error() returned NULL");
    if (st != LBOPT_OK && msg[0] == '\0') die(st, "error status with an empty lbopt_last_error()");
    if (st == LBOPT_OK && msg[0] != '\0') die(st, "LBOPT_OK with a non-empty lbopt_last_error()");
    for (int i = 0; i < n_tens; ++i)
      if (!unchanged(tens[size_t(i)])) die(st, "the DLTensor %s (or its shape/strides) was written", tens[size_t(i)].name);

    if (st != LBOPT_OK) {
      for (size_t a = 0; a < allocs.size(); ++a) {
        const Alloc& A = allocs[a];
        if (memcmp(A.block, A.snap.data(), A.block_size) != 0) {
          size_t k = 0;
          while (A.block[k] == A.snap[k]) ++k;
          die(st, "error, yet block %zu changed at byte %td of its region", a, ptrdiff_t(k) - ptrdiff_t(A.region_off));
        }
      }
      return;
    }

    // Success. Contract: the call's written ranges do not overlap any other range, no tensor with a wrapping
    // or oversized extent was accepted.
    const bool inf_skip = found_inf >= 0 && tens[size_t(found_inf)].present && found_inf_value() != 0.0f;
    for (int i = 0; i < n_tens; ++i) {
      const Tens& A = tens[size_t(i)];
      if (!A.present || !A.t.data || !A.shape_ok || A.lib_bytes == 0) continue;
      if (!A.fits) die(st, "accepted %s whose extent lies outside any buffer (byte_offset %llu)", A.name,
                       (unsigned long long)A.t.byte_offset);
      const uintptr_t a0 = reinterpret_cast<uintptr_t>(A.t.data) + A.t.byte_offset, a1 = a0 + A.lib_bytes;
      for (int j = i + 1; j < n_tens; ++j) {
        const Tens& B = tens[size_t(j)];
        if (!B.present || !B.t.data || !B.shape_ok || B.lib_bytes == 0 || !(A.written || B.written)) continue;
        const uintptr_t b0 = reinterpret_cast<uintptr_t>(B.t.data) + B.t.byte_offset, b1 = b0 + B.lib_bytes;
        if (a0 < b1 && b0 < a1) die(st, "accepted %s overlapping %s, one of them written", A.name, B.name);
      }
    }
    // Bytes that may change: the written tensors' ranges (with a nonzero found_inf only options.skipped's).
    std::vector<std::vector<uint8_t>> may(allocs.size());
    for (size_t a = 0; a < allocs.size(); ++a) may[a].assign(allocs[a].block_size, 0);
    for (int i = 0; i < n_tens; ++i) {
      const Tens& T = tens[size_t(i)];
      if (!T.present || !T.written || !T.t.data || !T.fits || T.lib_bytes == 0) continue;
      if (inf_skip && i != skipped) continue;
      const Alloc& A = allocs[size_t(T.alloc)];
      const size_t off = size_t(static_cast<uint8_t*>(T.t.data) - A.block) + size_t(T.t.byte_offset);
      memset(may[size_t(T.alloc)].data() + off, 1, size_t(T.lib_bytes));
    }
    if (raw_out >= 0) {
      const Alloc& A = allocs[size_t(raw_out)];
      memset(may[size_t(raw_out)].data() + A.region_off, 1, A.region_size);
    }
    for (size_t a = 0; a < allocs.size(); ++a) {
      const Alloc& A = allocs[a];
      for (size_t k = 0; k < A.block_size; ++k)
        if (A.block[k] != A.snap[k] && !may[a][k]) {
          const char* who = "slack";
          for (int i = 0; i < n_tens; ++i) {
            const Tens& T = tens[size_t(i)];
            if (T.alloc != int(a) || !T.t.data || !T.fits) continue;
            const size_t off = size_t(static_cast<uint8_t*>(T.t.data) - A.block) + size_t(T.t.byte_offset);
            if (k >= off && k < off + T.lib_bytes) who = T.name;
          }
          die(st, "success, yet block %zu byte %td of its region changed (inside %s, which the call may not write)",
              a, ptrdiff_t(k) - ptrdiff_t(A.region_off), who);
        }
    }
    if (inf_skip && skipped >= 0 && tens[size_t(skipped)].present) {
      const Tens& S = tens[size_t(skipped)];
      const uint8_t* s = static_cast<const uint8_t*>(S.t.data) + S.t.byte_offset;
      for (size_t k = 0; k < n_slots; ++k)
        if (s[k] != 1) die(st, "found_inf is nonzero but options.skipped[%zu] = %u", k, unsigned(s[k]));
    }
    if (raw_out >= 0) {
      const Alloc& A = allocs[size_t(raw_out)];
      const uint8_t* o = A.block + A.region_off;
      uint32_t size;
      memcpy(&size, o, 4);
      if (size != sizeof(lbopt_layout)) die(st, "lbopt_layout.struct_size = %u", size);
      for (size_t k = sizeof(lbopt_layout); k < A.region_size; ++k)
        if (o[k]) die(st, "lbopt_layout: byte %zu past the known struct is not zeroed", k);
    }
  }

  float found_inf_value() const {
    const Tens& T = tens[size_t(found_inf)];
    if (!T.t.data || !T.fits || !same(T.t.dtype, kF32) || T.numel != 1) return 0.0f;
    float f;
    memcpy(&f, static_cast<const uint8_t*>(T.t.data) + T.t.byte_offset, 4);
    return f;
  }

  const char* keep(std::string s) {
    strings.push_back(std::move(s));
    return strings.back().c_str();
  }

  // A string attribute value or name: 0 picks typical.
  const char* fuzz_string(const char* typical) {
    const uint8_t s = r.u8();
    static const char* const table[] = {"4bit", "8bit", "fp8", "fp32", "m", "v", "", "4BIT", "fp32 ", "mm",
                                        "lr", "step", "kind", "numel", "amsgrad", "moment"};
    if (s == 0) return typical;
    if (s < 0x80) return table[s % 16];
    if (s < 0xc0) return nullptr;
    std::string out;
    const int len = r.u8() % 24;
    for (int k = 0; k < len; ++k) out.push_back(char(r.u8() | 1));  // no embedded NUL
    return keep(out);
  }
};

// ------------------------------------------------------------------------------------------------------------
// Entry points

int sizing_kind(int kind) { return kind >= 0 && kind <= 3 ? kind : (kind & 3); }

lbopt_layout layout(int kind, int64_t numel) {
  lbopt_layout l{};
  if (lbopt_state_layout(lbopt_state_kind(kind), numel, &l, sizeof l) != LBOPT_OK) {
    fprintf(stderr, "lbopt fuzz: lbopt_state_layout(%d, %lld) failed: %s\n", kind, (long long)numel,
            lbopt_last_error());
    abort();
  }
  return l;
}

// codes and scales of one state for kind and numel; present: whether a valid call passes the state at all.
void state_tensors(Ctx& c, const char* codes_name, const char* scales_name, int kind, int64_t numel, bool present,
                   bool written, bool nonneg, int* codes, int* scales) {
  const lbopt_layout l = layout(kind, numel);
  const DLDataType cd = kind == LBOPT_STATE_FP32 ? kF32 : kU8;
  *codes = c.tensor(codes_name, Role::kCodes, l.codes_numel, {cd}, present, written, -1, nonneg, kind);
  *scales = c.tensor(scales_name, Role::kScales, l.scales_numel, {kF32}, present && kind != LBOPT_STATE_FP32,
                     written, -1, true, kind);
}

const char* kSlotNames[4][8] = {
    {"slots[0].param", "slots[0].grad", "slots[0].m.codes", "slots[0].m.scales", "slots[0].v.codes",
     "slots[0].v.scales", "slots[0].vmax.codes", "slots[0].vmax.scales"},
    {"slots[1].param", "slots[1].grad", "slots[1].m.codes", "slots[1].m.scales", "slots[1].v.codes",
     "slots[1].v.scales", "slots[1].vmax.codes", "slots[1].vmax.scales"},
    {"slots[2].param", "slots[2].grad", "slots[2].m.codes", "slots[2].m.scales", "slots[2].v.codes",
     "slots[2].v.scales", "slots[2].vmax.codes", "slots[2].vmax.scales"},
    {"slots[3].param", "slots[3].grad", "slots[3].m.codes", "slots[3].m.scales", "slots[3].v.codes",
     "slots[3].v.scales", "slots[3].vmax.codes", "slots[3].vmax.scales"}};

// Slot i's struct size and step count, and its param and grad tensors (t[0], t[1]); returns its numel.
template <class Slot>
int64_t fuzz_slot_head(Ctx& c, size_t i, const char* const* nm, Slot& slot, int* t) {
  const uint8_t sm = c.r.u8();
  slot.struct_size = sm & 1 ? uint32_t(fuzz_i64(c.r, sizeof(Slot) - 8)) : sizeof(Slot);
  slot.step = fuzz_i64(c.r, int64_t(1 + i));
  const int64_t numel = fuzz_numel(c.r, 300 - 90 * int64_t(i));
  t[0] = c.tensor(nm[0], Role::kParam, numel, {kF32, kBF16, kF16}, true, true);
  t[1] = c.tensor(nm[1], Role::kGrad, numel, {kBF16, kF32, kF16}, true, false, t[0]);
  return numel;
}

// The options struct of a step call (cm: the call's fault bits) and the tensors it and a capturable step's lr and
// step point to: declared before c.materialize(), pointed to after it.
struct StepExtras {
  lbopt_step_options opts;
  int grad_scale = -1, lr = -1, step = -1;

  void declare(Ctx& c, uint8_t cm, size_t n_slots, bool capturable) {
    if (lbopt_step_options_init(&opts, sizeof opts) != LBOPT_OK) abort();
    if (cm & 0x10) opts.struct_size = uint32_t(fuzz_i64(c.r, sizeof opts - 8));
    grad_scale = c.tensor("options.grad_scale", Role::kGradScale, 1, {kF32}, true, false);
    c.found_inf = c.tensor("options.found_inf", Role::kFoundInf, 1, {kF32}, true, false);
    c.skipped = c.tensor("options.skipped", Role::kSkipped, int64_t(n_slots), {kU8}, true, true);
    if (capturable) {
      lr = c.tensor("lr", Role::kLr, 1, {kF32, kF64}, true, false);
      step = c.tensor("step", Role::kStep, 1, {kI64, kF32}, true, false);
    }
  }

  void bind(Ctx& c, uint8_t cm) {
    opts.grad_scale = c.ptr(grad_scale);
    opts.found_inf = c.ptr(c.found_inf);
    opts.skipped = c.ptr(c.skipped);
    opts.stream = c.stream;
    if (cm & 0x08) {  // options NULL: its tensors are not part of the call (their blocks must still stay intact)
      for (int i : {grad_scale, c.found_inf, c.skipped}) c.tens[size_t(i)].present = false;
      c.found_inf = c.skipped = -1;
    }
  }
};

void run_step(Ctx& c, bool capturable) {
  Reader& r = c.r;
  c.entry = capturable ? "lbopt_adamw_step_capturable" : "lbopt_adamw_step";
  const uint8_t cm = r.u8();  // bit0 config NULL, bit1 config.struct_size wrong, bit2 slots NULL,
                              // bit3 options NULL, bit4 options.struct_size wrong, bit5 flags |= 0x80000000
  lbopt_adamw_config cfg;
  if (lbopt_adamw_config_init(&cfg, sizeof cfg) != LBOPT_OK) abort();
  if (cm & 0x02) cfg.struct_size = uint32_t(fuzz_i64(r, sizeof cfg + 8));
  // Out-of-range kinds as a C caller passes them, stored without an enum-typed value in this C++ code.
  const int32_t cfg_kind = fuzz_enum(r, 4);
  memcpy(&cfg.state_kind, &cfg_kind, sizeof cfg_kind);
  cfg.beta1 = fuzz_double(r, 0.9);
  cfg.beta2 = fuzz_double(r, 0.999);
  cfg.eps = fuzz_double(r, 1e-8);
  cfg.weight_decay = fuzz_double(r, 0.01);
  cfg.flags = r.u8();  // bits 0-4 known, 5-7 unknown
  if (cm & 0x20) cfg.flags |= 0x80000000u;
  cfg.seed = r.u64();
  const double lr = capturable ? 0.0 : fuzz_double(r, 1e-3);
  const uint8_t ns = r.u8();
  const size_t n = ns == 0 ? 2 : ns % 5;
  c.n_slots = n;
  const int kind = sizing_kind(cfg_kind);
  const bool amsgrad = cfg.flags & LBOPT_FLAG_AMSGRAD;

  lbopt_adamw_slot slots[4] = {};
  int idx[4][8];
  for (size_t i = 0; i < n; ++i) {
    const char* const* nm = kSlotNames[i];
    int* t = idx[i];
    const int64_t numel = fuzz_slot_head(c, i, nm, slots[i], t);
    state_tensors(c, nm[2], nm[3], kind, numel, true, true, false, &t[2], &t[3]);
    state_tensors(c, nm[4], nm[5], kind, numel, true, true, true, &t[4], &t[5]);
    state_tensors(c, nm[6], nm[7], kind, numel, amsgrad, true, true, &t[6], &t[7]);
  }
  StepExtras extra;
  extra.declare(c, cm, n, capturable);
  c.materialize();

  for (size_t i = 0; i < n; ++i) {
    const int* t = idx[i];
    slots[i].param = c.ptr(t[0]);
    slots[i].grad = c.ptr(t[1]);
    slots[i].m = {c.ptr(t[2]), c.ptr(t[3])};
    slots[i].v = {c.ptr(t[4]), c.ptr(t[5])};
    slots[i].vmax = {c.ptr(t[6]), c.ptr(t[7])};
  }
  extra.bind(c, cm);
  lbopt_step_options& opts = extra.opts;

  const lbopt_adamw_config cfg_before = cfg;
  lbopt_adamw_slot slots_before[4];
  memcpy(slots_before, slots, sizeof slots);
  const lbopt_step_options opts_before = opts;
  const lbopt_adamw_config* cfg_arg = cm & 0x01 ? nullptr : &cfg;
  const lbopt_adamw_slot* slots_arg = cm & 0x04 ? nullptr : slots;
  const lbopt_step_options* opts_arg = cm & 0x08 ? nullptr : &opts;
  // lbopt_adamw_step_validate first: the step must then return its verdict and message (it also writes nothing,
  // which c.check sees whenever the step fails)
  std::string verdict, config_verdict;
  lbopt_status validated = LBOPT_OK, config_validated = LBOPT_OK;
  if (!capturable) {
    config_validated = lbopt_adamw_config_validate(cfg_arg, lr);  // a refusal there is the step's first
    config_verdict = lbopt_last_error();
    validated = lbopt_adamw_step_validate(cfg_arg, lr, slots_arg, n, opts_arg);
    verdict = lbopt_last_error();
  }
  const lbopt_status st =
      capturable ? lbopt_adamw_step_capturable(cfg_arg, c.ptr(extra.lr), c.ptr(extra.step), slots_arg, n, opts_arg)
                 : lbopt_adamw_step(cfg_arg, lr, slots_arg, n, opts_arg);
  if (!capturable && (st != validated || verdict != lbopt_last_error()))
    c.die(st, "lbopt_adamw_step_validate said %d (\"%s\"), the step %d", int(validated), verdict.c_str(), int(st));
  if (config_validated != LBOPT_OK && (st != config_validated || config_verdict != lbopt_last_error()))
    c.die(st, "lbopt_adamw_config_validate said %d (\"%s\"), the step %d", int(config_validated),
          config_verdict.c_str(), int(st));
  if (memcmp(&cfg_before, &cfg, sizeof cfg) || memcmp(slots_before, slots, sizeof slots) ||
      memcmp(&opts_before, &opts, sizeof opts))
    c.die(st, "the config, slots or options struct was written");
  c.check(st);
}

// ------------------------------------------------------------------------------------------------------------
// The generic step: lbopt_step / lbopt_step_validate / lbopt_step_capturable with any lbopt_optimizer

// This harness's own model of the optimizers (abi/lbopt.h): how many states a config uses, which are second
// moments, and which configs are valid.
int model_states(const lbopt_optimizer_config& c) {
  switch (int(c.optimizer)) {
    case LBOPT_OPTIMIZER_ADAMW: return (c.flags & LBOPT_FLAG_AMSGRAD) ? 3 : 2;
    case LBOPT_OPTIMIZER_SGD: return c.momentum != 0.0 ? 1 : 0;
    case LBOPT_OPTIMIZER_LION: return 1;
    case LBOPT_OPTIMIZER_MUON: return 1;
    default: return 3;  // AdEMAMix, and any value that is no optimizer (then the call is refused anyway)
  }
}

// The lbopt_moment of state k (its codebook); every other moment than the first is non-negative.
int model_moment(const lbopt_optimizer_config& c, int k) {
  if (c.optimizer == LBOPT_OPTIMIZER_ADAMW && k > 0) return LBOPT_MOMENT_SECOND;
  if (c.optimizer != LBOPT_OPTIMIZER_ADEMAMIX || k != 2) return LBOPT_MOMENT_FIRST;
  return (c.flags & LBOPT_FLAG_NU_LINEAR_MAP) ? LBOPT_MOMENT_SECOND : LBOPT_MOMENT_SECOND_SIGNED;
}

bool unit(double x) { return x >= 0.0 && x < 1.0; }
bool finite_nonneg(double x) { return x >= 0.0 && isfinite(x); }

// Whether lbopt_optimizer_config_validate(c, lr) must accept.
bool model_config_valid(const lbopt_optimizer_config* c, double lr) {
  if (!c || c->struct_size != sizeof(lbopt_optimizer_config)) return false;
  const int o = int(c->optimizer), kind = int(c->state_kind);
  if (o < 0 || o > 4 || kind < 0 || kind > 3) return false;
  const uint32_t roundings = LBOPT_FLAG_STATE_STOCHASTIC_ROUND | LBOPT_FLAG_STATE_NEAREST_ROUND;
  const uint32_t common = LBOPT_FLAG_MAXIMIZE | LBOPT_FLAG_BF16_STOCHASTIC_ROUND | LBOPT_FLAG_SKIP_NONFINITE | roundings;
  uint32_t allowed = common;
  bool ok = finite_nonneg(c->weight_decay) && finite_nonneg(lr) && (c->flags & roundings) != roundings;
  switch (o) {
    case LBOPT_OPTIMIZER_ADAMW:
      allowed |= LBOPT_FLAG_ADAM_COUPLED_DECAY | LBOPT_FLAG_AMSGRAD;
      ok = ok && unit(c->beta1) && unit(c->beta2) && finite_nonneg(c->eps);
      break;
    case LBOPT_OPTIMIZER_SGD:
      allowed |= LBOPT_FLAG_NESTEROV;
      ok = ok && finite_nonneg(c->momentum) && c->dampening >= 0.0 && c->dampening <= 1.0;
      if (c->flags & LBOPT_FLAG_NESTEROV) ok = ok && c->momentum > 0.0 && c->dampening == 0.0;
      break;
    case LBOPT_OPTIMIZER_LION: ok = ok && unit(c->beta1) && unit(c->beta2); break;
    case LBOPT_OPTIMIZER_MUON:  // reads no weight decay, and no lr (still checked)
      allowed |= LBOPT_FLAG_NESTEROV;
      ok = finite_nonneg(lr) && (c->flags & roundings) != roundings && finite_nonneg(c->momentum);
      break;
    default:
      allowed |= LBOPT_FLAG_NU_LINEAR_MAP;
      ok = ok && unit(c->beta1) && unit(c->beta2) && unit(c->beta3) && finite_nonneg(c->eps) &&
           finite_nonneg(c->alpha) && finite_nonneg(c->t_alpha) && finite_nonneg(c->t_beta3);
      if (c->t_beta3 > 0.0) ok = ok && c->beta1 > 0.0 && c->beta3 > 0.0;
  }
  return ok && !(c->flags & ~allowed);
}

const char* kGenericSlotNames[4][8] = {
    {"slots[0].param", "slots[0].grad", "slots[0].states[0].codes", "slots[0].states[0].scales",
     "slots[0].states[1].codes", "slots[0].states[1].scales", "slots[0].states[2].codes", "slots[0].states[2].scales"},
    {"slots[1].param", "slots[1].grad", "slots[1].states[0].codes", "slots[1].states[0].scales",
     "slots[1].states[1].codes", "slots[1].states[1].scales", "slots[1].states[2].codes", "slots[1].states[2].scales"},
    {"slots[2].param", "slots[2].grad", "slots[2].states[0].codes", "slots[2].states[0].scales",
     "slots[2].states[1].codes", "slots[2].states[1].scales", "slots[2].states[2].codes", "slots[2].states[2].scales"},
    {"slots[3].param", "slots[3].grad", "slots[3].states[0].codes", "slots[3].states[0].scales",
     "slots[3].states[1].codes", "slots[3].states[1].scales", "slots[3].states[2].codes", "slots[3].states[2].scales"}};

// Fields: u8 cm (as run_step's), an lbopt_optimizer (fuzz_enum), [struct_size], state_kind, u8 flags (bit 5
// NESTEROV, bits 6-7 unknown), u64 seed, beta1, beta2, beta3, eps, weight_decay, momentum, dampening, alpha (each
// fuzz_double around the optimizer's default), u8 warm (bit0: t_alpha, bit1: t_beta3 fuzzed around 50 / 80; else
// 0), lr unless capturable, u8 slot count, per slot u8 sm, step, numel and its tensors (param, grad, three states
// of codes and scales: the optimizer's present by default, the rest absent), then options, then lr / step scalars.
void run_generic_step(Ctx& c, bool capturable) {
  Reader& r = c.r;
  c.entry = capturable ? "lbopt_step_capturable" : "lbopt_step";
  const uint8_t cm = r.u8();  // bit0 config NULL, bit1 config.struct_size wrong, bit2 slots NULL,
                              // bit3 options NULL, bit4 options.struct_size wrong, bit5 flags |= 0x80000000,
                              // bit6 flags |= LBOPT_FLAG_NU_LINEAR_MAP
  const int32_t optimizer = fuzz_enum(r, 5);
  lbopt_optimizer_config cfg;
  const lbopt_optimizer defaults_of = optimizer >= 0 && optimizer < 5 ? lbopt_optimizer(optimizer) : LBOPT_OPTIMIZER_ADAMW;
  if (lbopt_optimizer_config_init(&cfg, sizeof cfg, defaults_of) != LBOPT_OK) abort();
  memcpy(&cfg.optimizer, &optimizer, sizeof optimizer);  // out-of-range values as a C caller passes them
  if (cm & 0x02) cfg.struct_size = uint32_t(fuzz_i64(r, sizeof cfg - 8));
  const int32_t cfg_kind = fuzz_enum(r, 4);
  memcpy(&cfg.state_kind, &cfg_kind, sizeof cfg_kind);
  cfg.flags = r.u8();
  if (cm & 0x20) cfg.flags |= 0x80000000u;
  if (cm & 0x40) cfg.flags |= LBOPT_FLAG_NU_LINEAR_MAP;
  cfg.seed = r.u64();
  for (double* f : {&cfg.beta1, &cfg.beta2, &cfg.beta3, &cfg.eps, &cfg.weight_decay, &cfg.momentum, &cfg.dampening,
                    &cfg.alpha})
    *f = fuzz_double(r, *f);
  const uint8_t warm = r.u8();
  if (warm & 1) cfg.t_alpha = fuzz_double(r, 50.0);
  if (warm & 2) cfg.t_beta3 = fuzz_double(r, 80.0);
  const double lr = capturable ? 0.0 : fuzz_double(r, 1e-3);
  const uint8_t ns = r.u8();
  const size_t n = ns == 0 ? 2 : ns % 5;
  c.n_slots = n;
  const int kind = sizing_kind(cfg_kind);
  const int n_states = model_states(cfg);

  lbopt_slot slots[4] = {};
  int idx[4][8];
  for (size_t i = 0; i < n; ++i) {
    const char* const* nm = kGenericSlotNames[i];
    int* t = idx[i];
    const int64_t numel = fuzz_slot_head(c, i, nm, slots[i], t);
    for (int k = 0; k < LBOPT_MAX_STATES; ++k)
      state_tensors(c, nm[2 + 2 * k], nm[3 + 2 * k], kind, numel, k < n_states, true,
                    model_moment(cfg, k) != LBOPT_MOMENT_FIRST, &t[2 + 2 * k], &t[3 + 2 * k]);
  }
  StepExtras extra;
  extra.declare(c, cm, n, capturable);
  c.materialize();

  for (size_t i = 0; i < n; ++i) {
    const int* t = idx[i];
    slots[i].param = c.ptr(t[0]);
    slots[i].grad = c.ptr(t[1]);
    for (int k = 0; k < LBOPT_MAX_STATES; ++k) slots[i].states[k] = {c.ptr(t[2 + 2 * k]), c.ptr(t[3 + 2 * k])};
  }
  extra.bind(c, cm);
  lbopt_step_options& opts = extra.opts;

  const lbopt_optimizer_config cfg_before = cfg;
  lbopt_slot slots_before[4];
  memcpy(slots_before, slots, sizeof slots);
  const lbopt_step_options opts_before = opts;
  const lbopt_optimizer_config* cfg_arg = cm & 0x01 ? nullptr : &cfg;
  const lbopt_slot* slots_arg = cm & 0x04 ? nullptr : slots;
  const lbopt_step_options* opts_arg = cm & 0x08 ? nullptr : &opts;

  // the config alone: at lr = 0 (as lbopt_optimizer_states and the capturable step check it) and at lr
  const lbopt_status config_at_0 = lbopt_optimizer_config_validate(cfg_arg, 0.0);
  const std::string verdict_at_0 = lbopt_last_error();
  if ((config_at_0 == LBOPT_OK) != model_config_valid(cfg_arg, 0.0))
    c.die(config_at_0, "lbopt_optimizer_config_validate(lr = 0) said %d (\"%s\"), the documented ranges say %s",
          int(config_at_0), verdict_at_0.c_str(), model_config_valid(cfg_arg, 0.0) ? "valid" : "invalid");
  lbopt_state_info info[LBOPT_MAX_STATES];
  for (lbopt_state_info& s : info) s = {nullptr, -7};
  size_t n_info = 12345;
  const lbopt_status states = lbopt_optimizer_states(cfg_arg, info, &n_info);
  if (states != config_at_0 || verdict_at_0 != lbopt_last_error())
    c.die(states, "lbopt_optimizer_states said %d (\"%s\"), lbopt_optimizer_config_validate(lr = 0) %d (\"%s\")",
          int(states), lbopt_last_error(), int(config_at_0), verdict_at_0.c_str());
  if (states == LBOPT_OK) {
    if (n_info != size_t(n_states)) c.die(states, "lbopt_optimizer_states: %zu states, expected %d", n_info, n_states);
    for (int k = 0; k < n_states; ++k)
      if (!info[k].name || !info[k].name[0] || info[k].moment != model_moment(cfg, k))
        c.die(states, "lbopt_optimizer_states: state %d is \"%s\" on moment %d", k, info[k].name ? info[k].name : "(null)",
              int(info[k].moment));
    for (int k = n_states; k < LBOPT_MAX_STATES; ++k)
      if (info[k].name || info[k].moment != -7) c.die(states, "lbopt_optimizer_states wrote states[%d]", k);
  } else if (n_info != 12345) {
    c.die(states, "lbopt_optimizer_states failed but wrote *n_states");
  }
  std::string verdict, config_verdict = verdict_at_0;
  lbopt_status validated = LBOPT_OK, config_validated = config_at_0;
  if (!capturable) {
    config_validated = lbopt_optimizer_config_validate(cfg_arg, lr);
    config_verdict = lbopt_last_error();
    if ((config_validated == LBOPT_OK) != model_config_valid(cfg_arg, lr))
      c.die(config_validated, "lbopt_optimizer_config_validate said %d (\"%s\"), the documented ranges say %s",
            int(config_validated), config_verdict.c_str(), model_config_valid(cfg_arg, lr) ? "valid" : "invalid");
    validated = lbopt_step_validate(cfg_arg, lr, slots_arg, n, opts_arg);
    verdict = lbopt_last_error();
  }
  const lbopt_status st = capturable ? lbopt_step_capturable(cfg_arg, c.ptr(extra.lr), c.ptr(extra.step), slots_arg, n, opts_arg)
                                     : lbopt_step(cfg_arg, lr, slots_arg, n, opts_arg);
  if (!capturable && (st != validated || verdict != lbopt_last_error()))
    c.die(st, "lbopt_step_validate said %d (\"%s\"), the step %d", int(validated), verdict.c_str(), int(st));
  // (the capturable step names a NULL lr or step tensor before anything else)
  const bool config_first = !capturable || (c.ptr(extra.lr) && c.ptr(extra.step));
  if (config_first && config_validated != LBOPT_OK && (st != config_validated || config_verdict != lbopt_last_error()))
    c.die(st, "lbopt_optimizer_config_validate said %d (\"%s\"), the step %d", int(config_validated),
          config_verdict.c_str(), int(st));
  if (memcmp(&cfg_before, &cfg, sizeof cfg) || memcmp(slots_before, slots, sizeof slots) ||
      memcmp(&opts_before, &opts, sizeof opts))
    c.die(st, "the config, slots or options struct was written");
  c.check(st);
}

void run_convert(Ctx& c, bool to_state) {
  Reader& r = c.r;
  c.entry = to_state ? "lbopt_quantize" : "lbopt_dequantize";
  const int32_t kind = fuzz_enum(r, 4);
  const int32_t moment = fuzz_enum(r, 3);
  const int64_t numel = fuzz_numel(r, 300);
  const int k = sizing_kind(kind);
  const bool nonneg = moment == LBOPT_MOMENT_SECOND || moment == LBOPT_MOMENT_SECOND_SIGNED;
  int values = -1, codes, scales;
  if (to_state) values = c.tensor("src", Role::kValues, numel, {kF32}, true, false, -1, nonneg);
  state_tensors(c, to_state ? "dst.codes" : "src.codes", to_state ? "dst.scales" : "src.scales", k, numel, true,
                to_state, nonneg, &codes, &scales);
  if (!to_state) values = c.tensor("dst", Role::kValues, numel, {kF32}, true, true);
  c.materialize();
  const lbopt_state state{c.ptr(codes), c.ptr(scales)};
  const lbopt_status st =
      to_state ? lbopt_quantize(lbopt_state_kind(kind), lbopt_moment(moment), c.ptr(values), state, c.stream)
               : lbopt_dequantize(lbopt_state_kind(kind), lbopt_moment(moment), state, c.ptr(values), c.stream);
  c.check(st);
}

void run_state_init(Ctx& c) {
  Reader& r = c.r;
  c.entry = "lbopt_state_init";
  const int32_t kind = fuzz_enum(r, 4);
  const int64_t sized = fuzz_numel(r, 300);
  const int64_t numel = fuzz_i64(r, sized);
  int codes, scales;
  state_tensors(c, "state.codes", "state.scales", sizing_kind(kind), sized, true, true, false, &codes, &scales);
  c.materialize();
  c.check(lbopt_state_init(lbopt_state_kind(kind), numel, lbopt_state{c.ptr(codes), c.ptr(scales)}, c.stream));
}

void run_state_layout(Ctx& c) {
  Reader& r = c.r;
  c.entry = "lbopt_state_layout";
  const int32_t kind = fuzz_enum(r, 4);
  const int64_t numel = fuzz_i64(r, fuzz_numel(r, 300));
  const uint8_t o = r.u8();  // bit7: out NULL; low bits: out_size
  const size_t own = sizeof(lbopt_layout);
  static const size_t sizes[] = {own, 0, own - 1, own + 1, 1, 4, own + 8, own + 64};
  c.raw_out_size = sizes[o & 7];
  c.raw_out = 0;
  c.materialize();
  lbopt_layout* out =
      o & 0x80 ? nullptr : reinterpret_cast<lbopt_layout*>(c.allocs[size_t(c.raw_out)].block + c.allocs[size_t(c.raw_out)].region_off);
  if (!out) c.raw_out = -1;  // nothing may change then (the block still has to stay intact on error)
  const lbopt_status st = lbopt_state_layout(lbopt_state_kind(kind), numel, out, c.raw_out_size);
  if (!out && st == LBOPT_OK) c.die(st, "accepted out = NULL");
  c.check(st);
}

// lbopt_op_invoke: an operator from the registry (or NULL, or a copy that is not the library's), its tensors
// sized from the schema's names, and attributes by name: the required ones right, plus fuzzed extras.
void run_op_invoke(Ctx& c) {
  Reader& r = c.r;
  c.entry = "lbopt_op_invoke";
  const size_t count = lbopt_op_count();
  if (count == 0) return;
  const uint8_t os = r.u8();
  const size_t oi = os % (count + 2);
  lbopt_op_info fake{};
  const lbopt_op_info* S = lbopt_op_schema(oi < count ? oi : 0);
  if (!S || S->n_tensors > 16 || S->n_attrs > 32) c.die(LBOPT_OK, "lbopt_op_schema(%zu) is NULL or implausible", oi);
  const lbopt_op_info* op = S;
  if (oi == count) op = nullptr;
  if (oi == count + 1) {
    fake = *S;
    op = &fake;
  }
  const char* name = S->name;
  const bool is_step = strncmp(name, "lbopt.adamw_step.", 17) == 0;
  int kind = LBOPT_STATE_4BIT;
  if (is_step) {
    for (int k = 0; k < 4; ++k)
      if (strcmp(name + 17, kKindNames[k]) == 0) kind = k;
  } else {
    kind = r.u8() & 3;
  }
  const uint8_t am = r.u8();  // bit0 omit required attrs, bit1 amsgrad, bit2 moment "v", bits3-4 optional attrs,
                              // bits5-6 arbitrary attrs, bit7 attrs pointer NULL
  const bool amsgrad = is_step && (am & 2);
  const bool moment_v = am & 4;
  const int64_t numel = fuzz_numel(r, 300);
  const uint8_t ts = r.u8();  // n_tensors: 0 exact; bit7 tensors pointer NULL
  size_t n_tensors = S->n_tensors;
  switch (ts & 0x7f) {
    case 0: break;
    case 1: n_tensors += 1; break;
    case 2: n_tensors = n_tensors ? n_tensors - 1 : 0; break;
    case 3: n_tensors = 0; break;
    default: break;
  }

  // attributes
  std::vector<lbopt_attr> attrs;
  auto typed = [&](const lbopt_attr_arg& a, double f, int64_t i, const char* s) {
    attrs.push_back(lbopt_attr{a.name, a.type, f, i, s});
  };
  if (!(am & 1)) {
    for (size_t k = 0; k < S->n_attrs; ++k) {
      const lbopt_attr_arg& a = S->attrs[k];
      const bool is_kind = strcmp(a.name, "kind") == 0, is_numel = strcmp(a.name, "numel") == 0;
      const bool want = a.required || (strcmp(a.name, "amsgrad") == 0 && amsgrad) ||
                        (strcmp(a.name, "moment") == 0 && moment_v);
      if (!want) continue;
      switch (a.type) {
        case LBOPT_ATTR_DOUBLE: typed(a, fuzz_double(r, strcmp(a.name, "lr") == 0 ? 1e-3 : a.default_double), 0, nullptr); break;
        case LBOPT_ATTR_INT64: typed(a, 0.0, fuzz_i64(r, is_numel ? numel : strcmp(a.name, "step") == 0 ? 1 : a.default_int), nullptr); break;
        case LBOPT_ATTR_BOOL: typed(a, 0.0, fuzz_i64(r, 1), nullptr); break;
        default: typed(a, 0.0, 0, c.fuzz_string(is_kind ? kKindNames[kind] : moment_v ? "v" : a.default_string ? a.default_string : "m")); break;
      }
    }
  }
  const int n_opt = (am >> 3) & 3, n_extra = (am >> 5) & 3;
  for (int q = 0; q < n_opt && S->n_attrs; ++q) {
    const lbopt_attr_arg& a = S->attrs[r.u8() % S->n_attrs];
    const uint8_t tsel = r.u8();
    const int32_t type = tsel == 0 ? a.type : tsel < 0x80 ? int32_t(tsel & 3) : int32_t(tsel) - 0x100 + (tsel & 1) * 0x200;
    const double f = fuzz_double(r, a.default_double);
    const int64_t i = fuzz_i64(r, a.default_int);
    attrs.push_back(lbopt_attr{a.name, type, f, i, c.fuzz_string(a.default_string ? a.default_string : "m")});
  }
  for (int q = 0; q < n_extra; ++q) {
    const uint8_t nsel = r.u8();
    const char* an;
    switch (nsel & 3) {
      case 0: an = S->n_attrs ? S->attrs[(nsel >> 2) % S->n_attrs].name : "lr"; break;
      case 1: an = c.fuzz_string("unknown_attribute"); break;
      case 2: an = nullptr; break;
      default: an = c.keep(std::string(S->n_attrs ? S->attrs[(nsel >> 2) % S->n_attrs].name : "x") + "_"); break;
    }
    const int32_t type = fuzz_enum(r, 4);
    const double f = fuzz_double(r, 1e-3);
    const int64_t i = fuzz_i64(r, 1);
    attrs.push_back(lbopt_attr{an, type, f, i, c.fuzz_string("4bit")});
  }

  // tensors, by schema name
  int idx[32];
  const bool nonneg = moment_v;
  const lbopt_layout l = layout(kind, numel);
  const DLDataType cd = kind == LBOPT_STATE_FP32 ? kF32 : kU8;
  int param = -1;
  for (size_t k = 0; k < S->n_tensors; ++k) {
    const lbopt_tensor_arg& ta = S->tensors[k];
    const bool written = ta.role != LBOPT_ROLE_IN;
    const char* tn = ta.name;
    const size_t len = strlen(tn);
    const bool is_vmax = strncmp(tn, "vmax", 4) == 0;
    const bool v_state = tn[0] == 'v' || moment_v;
    if (strcmp(tn, "param") == 0) {
      idx[k] = param = c.tensor(tn, Role::kParam, numel, {kF32, kBF16, kF16}, true, written);
    } else if (strcmp(tn, "grad") == 0) {
      idx[k] = c.tensor(tn, Role::kGrad, numel, {kBF16, kF32, kF16}, true, written, param);
    } else if (len >= 5 && strcmp(tn + len - 5, "codes") == 0) {
      idx[k] = c.tensor(tn, Role::kCodes, l.codes_numel, {cd}, !is_vmax || amsgrad, written, -1, v_state, kind);
    } else if (len >= 6 && strcmp(tn + len - 6, "scales") == 0) {
      idx[k] = c.tensor(tn, Role::kScales, l.scales_numel, {kF32}, kind != LBOPT_STATE_FP32 && (!is_vmax || amsgrad),
                        written, -1, true, kind);
    } else if (strcmp(tn, "skipped") == 0) {
      idx[k] = c.skipped = c.tensor(tn, Role::kSkipped, 1, {kU8}, true, written);
    } else if (strcmp(tn, "out") == 0) {
      idx[k] = c.tensor(tn, Role::kLayoutOut, 4, {kI64}, true, written);
    } else {  // src, dst, and any operator added later
      idx[k] = c.tensor(tn, Role::kValues, numel, {kF32}, true, written, -1, nonneg);
    }
  }
  c.n_slots = 1;
  c.materialize();
  std::vector<const DLTensor*> tensors(std::max(n_tensors, S->n_tensors) + 1, nullptr);
  for (size_t k = 0; k < S->n_tensors; ++k) tensors[k] = c.ptr(idx[k]);
  const std::vector<const DLTensor*> tensors_before = tensors;
  std::vector<lbopt_attr> attrs_before = attrs;
  const lbopt_status st = lbopt_op_invoke(op, ts & 0x80 ? nullptr : tensors.data(), n_tensors,
                                          (am & 0x80) || attrs.empty() ? nullptr : attrs.data(), attrs.size(),
                                          c.stream);
  if (tensors != tensors_before ||
      (!attrs.empty() && memcmp(attrs.data(), attrs_before.data(), attrs.size() * sizeof(lbopt_attr)) != 0))
    c.die(st, "the tensors or attrs array was written");
  if (op == nullptr && st == LBOPT_OK) c.die(st, "accepted op = NULL");
  if (op == &fake && st == LBOPT_OK) c.die(st, "accepted an operator that is not the library's");
  c.check(st);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_verbose = getenv("LBOPT_FUZZ_VERBOSE") && getenv("LBOPT_FUZZ_VERBOSE")[0] == '1';
  if (lbopt_set_num_threads(1) != LBOPT_OK || lbopt_get_num_threads() != 1) {
    fprintf(stderr, "lbopt fuzz: lbopt_set_num_threads(1) failed: %s\n", lbopt_last_error());
    abort();
  }
  // Host buffers are passed as kDLCUDA tensors (which must be refused): never where CUDA could take them.
  const char* info = lbopt_build_info();
  if (g_verbose) fprintf(stderr, "lbopt fuzz: %s\n", info);
  if (!strstr(info, "\"cuda_devices\":0,")) {
    fprintf(stderr, "lbopt fuzz: a CUDA device is usable (%s); this harness must run against a build without CUDA "
            "or where no device is usable\n", info);
    abort();
  }
  if ((lbopt_version() >> 16) != LBOPT_VERSION_MAJOR) {
    fprintf(stderr, "lbopt fuzz: library ABI major %u, header %d\n", lbopt_version() >> 16, LBOPT_VERSION_MAJOR);
    abort();
  }
  return 0;
}

// The lookups that return no status: lbopt_optimizer_name and lbopt_state_kind_name name exactly the enums' values
// (with the names the docs give), and lbopt_op_find returns the operator of exactly the name it is given: a
// registered name (found, and the schema's own pointer), the same name cut short or with one byte changed, or
// random bytes (NULL unless they spell a registered name), or NULL.
void run_names(Ctx& c) {
  Reader& r = c.r;
  c.entry = "lbopt names";
  static const char* const optimizers[] = {"adamw", "sgd", "lion", "ademamix", "muon"};
  static const char* const kinds[] = {"4bit", "8bit", "fp8", "fp32"};
  const int32_t o = fuzz_enum(r, 5), k = fuzz_enum(r, 4);
  const char* on = lbopt_optimizer_name(lbopt_optimizer(o));
  const char* kn = lbopt_state_kind_name(lbopt_state_kind(k));
  if ((o >= 0 && o < 5) ? !on || strcmp(on, optimizers[o]) != 0 : on != nullptr)
    c.die(LBOPT_OK, "lbopt_optimizer_name(%d) = %s", o, on ? on : "NULL");
  if ((k >= 0 && k < 4) ? !kn || strcmp(kn, kinds[k]) != 0 : kn != nullptr)
    c.die(LBOPT_OK, "lbopt_state_kind_name(%d) = %s", k, kn ? kn : "NULL");
  const size_t count = lbopt_op_count();
  const uint8_t how = r.u8();
  const size_t i = count ? r.u8() % count : 0;
  const lbopt_op_info* own = count ? lbopt_op_schema(i) : nullptr;
  char name[64] = {};
  if (own) snprintf(name, sizeof name, "%s", own->name);
  switch (how & 3) {
    case 0: break;                                      // a registered name
    case 1: name[r.u8() % (strlen(name) + 1)] = 0; break;  // cut short (or not at all)
    case 2: name[r.u8() % (strlen(name) + 1)] ^= char(1 + r.u8() % 255); break;  // one byte changed
    default:
      for (size_t j = 0; j + 1 < sizeof name; ++j) name[j] = char(r.u8());  // random bytes, 0 ends them
  }
  const lbopt_op_info* found = lbopt_op_find(how & 4 ? nullptr : name);
  if (how & 4) {
    if (found) c.die(LBOPT_OK, "lbopt_op_find(NULL) found %s", found->name);
    return;
  }
  const lbopt_op_info* want = nullptr;
  for (size_t j = 0; j < count && !want; ++j)
    if (strcmp(lbopt_op_schema(j)->name, name) == 0) want = lbopt_op_schema(j);
  if (found != want) c.die(LBOPT_OK, "lbopt_op_find(\"%s\") = %s", name, found ? found->name : "NULL");
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Ctx c;
  c.r = Reader{data, size};
  const uint8_t entry = c.r.u8();
  c.rng = c.r.u32() ^ 0x1b0b7ull;
  const uint8_t misc = c.r.u8();
  if (misc & 1) c.stream = reinterpret_cast<void*>(uintptr_t(0x10));
  // All tensors on cuda:0 (a build without CUDA must say LBOPT_ERR_UNSUPPORTED; a CUDA build would take these
  // host buffers for device memory, so this harness is built with LBOPT_WITH_CUDA=0) or on CUDAHost (host memory).
  if (misc & 2) c.device = {kDLCUDA, 0};
  else if (misc & 4) c.device = {kDLCUDAHost, 0};
  switch (entry % 10) {
    case 0: run_step(c, false); break;
    case 1: run_step(c, true); break;
    case 2: run_convert(c, true); break;
    case 3: run_convert(c, false); break;
    case 4: run_state_init(c); break;
    case 5: run_state_layout(c); break;
    case 6: run_op_invoke(c); break;
    case 7: run_generic_step(c, false); break;
    case 8: run_generic_step(c, true); break;
    default: run_names(c); break;
  }
  return 0;
}

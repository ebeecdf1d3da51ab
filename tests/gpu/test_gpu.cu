// GPU suite: the CUDA backend against the CPU path on the same inputs. Exits 77 (skipped) without a device.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <thrust/copy.h>
#include <thrust/device_vector.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "lbopt.h"
#include "../../kernels/cuda/fp8_cvt.cuh"

namespace {

// Counts the finite floats whose e4m3 code by the conversion instruction differs from the software encode's, and
// keeps the least such bit pattern.
__global__ void fp8_cvt_mismatches(unsigned long long* count, unsigned int* first) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (uint64_t(1) << 32); i += stride) {
    const float x = __uint_as_float(uint32_t(i));
    if (isfinite(x) && lbopt::cuda::fp8_e4m3_encode_cvt(x) != lbopt::fp8_e4m3_encode(x)) {
      atomicAdd(count, 1ull);
      atomicMin(first, uint32_t(i));
    }
  }
}

DLDataType dt(int code, int bits) { return DLDataType{uint8_t(code), uint8_t(bits), 1}; }

// One tensor mirrored on the host and the device; the device copy starts `offset` elements into its allocation
// (an offset of one leaves it unaligned for the wide step's vector loads and stores).
struct Mirror {
  std::vector<uint8_t> host;
  size_t offset;  // bytes
  thrust::device_vector<uint8_t> dev;
  int64_t shape;
  DLTensor h{}, d{};
  Mirror(DLDataType type, int64_t numel, int64_t offset_elements = 0)
      : host(size_t(numel) * type.bits / 8), offset(size_t(offset_elements) * type.bits / 8),
        dev(host.size() + offset), shape(numel) {
    h.data = host.data();
    h.device = {kDLCPU, 0};
    h.ndim = 1;
    h.dtype = type;
    h.shape = &shape;
    d = h;
    d.data = thrust::raw_pointer_cast(dev.data()) + offset;
    d.device = {kDLCUDA, 0};
  }
  void upload() { thrust::copy(host.begin(), host.end(), dev.begin() + offset); }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> out(host.size());
    thrust::copy(dev.begin() + offset, dev.end(), out.begin());
    return out;
  }
};

struct StateMirror {
  Mirror codes, scales;
  StateMirror(lbopt_state_kind kind, int64_t n, int64_t offset = 0)
      : codes(kind == LBOPT_STATE_FP32 ? dt(kDLFloat, 32) : dt(kDLUInt, 8), layout(kind, n).codes_numel, offset),
        scales(dt(kDLFloat, 32), layout(kind, n).scales_numel) {}
  static lbopt_layout layout(lbopt_state_kind kind, int64_t n) {
    lbopt_layout l;
    lbopt_state_layout(kind, n, &l, sizeof l);
    return l;
  }
  lbopt_state host(lbopt_state_kind k) { return {&codes.h, k == LBOPT_STATE_FP32 ? nullptr : &scales.h}; }
  lbopt_state device(lbopt_state_kind k) { return {&codes.d, k == LBOPT_STATE_FP32 ? nullptr : &scales.d}; }
};

// Normal values of the given scale, in t's dtype (16-bit: truncated float bits for bf16, CUDA's conversion for
// fp16; any valid value will do).
void fill(Mirror& t, std::mt19937_64& rng, float scale) {
  std::normal_distribution<float> nd;
  for (int64_t i = 0; i < t.shape; ++i) {
    const float x = nd(rng) * scale;
    if (t.h.dtype.bits == 32) {
      reinterpret_cast<float*>(t.host.data())[i] = x;
    } else {
      uint32_t u;
      memcpy(&u, &x, 4);
      const __half h = __float2half_rn(x);
      uint16_t b;
      memcpy(&b, &h, 2);
      reinterpret_cast<uint16_t*>(t.host.data())[i] = t.h.dtype.code == kDLBfloat ? uint16_t(u >> 16) : b;
    }
  }
}

int64_t mismatches(const Mirror& m);

using Config = lbopt_optimizer_config;

// The offsets in elements (Mirror) of a slot's device copies: the param, the grad and every state's codes.
struct DeviceOffsets {
  int64_t param = 0, grad = 0, codes = 0;
};

// A param, its grad and the optimizer's states, on the host and the device alike.
struct Slots {
  lbopt_state_kind kind;
  int64_t n;
  Mirror p, g;
  std::vector<StateMirror*> states;
  Slots(const Config& c, DLDataType pt, DLDataType gt, int64_t numel, uint64_t seed, DeviceOffsets offsets = {})
      : kind(c.state_kind), n(numel), p(pt, numel, offsets.param), g(gt, numel, offsets.grad) {
    lbopt_state_info info[LBOPT_MAX_STATES];
    size_t n_states = 0;
    REQUIRE_MESSAGE(lbopt_optimizer_states(&c, info, &n_states) == LBOPT_OK, std::string(lbopt_last_error()));
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd;
    fill(p, rng, 0.1f);
    fill(g, rng, 0.01f);
    for (size_t k = 0; k < n_states; ++k) {  // start from a random state on the state's own codebook
      states.push_back(new StateMirror(kind, numel, offsets.codes));
      Mirror x(dt(kDLFloat, 32), numel);
      const bool second = info[k].moment != LBOPT_MOMENT_FIRST;
      for (int64_t i = 0; i < numel; ++i) {
        const float r = nd(rng) * 1e-3f;
        reinterpret_cast<float*>(x.host.data())[i] = second ? r * r : r;
      }
      REQUIRE(lbopt_quantize(kind, lbopt_moment(info[k].moment), &x.h, states.back()->host(kind), nullptr) == LBOPT_OK);
      states.back()->codes.upload();
      states.back()->scales.upload();
    }
    p.upload();
    g.upload();
  }
  ~Slots() {
    for (StateMirror* s : states) delete s;
  }
  lbopt_slot slot(bool device, int64_t step) {
    lbopt_slot s{sizeof(lbopt_slot), device ? &p.d : &p.h, device ? &g.d : &g.h, {}, step};
    for (size_t k = 0; k < states.size(); ++k) s.states[k] = device ? states[k]->device(kind) : states[k]->host(kind);
    return s;
  }
  // AdamW's states as lbopt_adamw_slot takes them: m, v, and vmax when there is a third.
  lbopt_adamw_slot adamw_slot(bool device, int64_t step) {
    const lbopt_slot s = slot(device, step);
    return {sizeof(lbopt_adamw_slot), s.param, s.grad, s.states[0], s.states[1], s.states[2], step};
  }
  // Bytes of the device copies that differ from the host copies.
  int64_t mismatches() const {
    int64_t bad = ::mismatches(p);  // the free function, not this member
    for (const StateMirror* s : states) bad += ::mismatches(s->codes) + ::mismatches(s->scales);
    return bad;
  }
};

// Bytes of the device's params and states that differ from the host's: the kernels share the element and block
// code and round as written on both sides, so there must be none.
int64_t mismatches(const Mirror& m) {
  const auto d = m.download();
  int64_t bad = 0;
  for (size_t i = 0; i < d.size(); ++i) bad += d[i] != m.host[i];
  return bad;
}


// The generic config of an lbopt_adamw_config: it names the states a slot of it holds.
Config generic_of(const lbopt_adamw_config& c) {
  Config g;
  REQUIRE(lbopt_optimizer_config_init(&g, sizeof g, LBOPT_OPTIMIZER_ADAMW) == LBOPT_OK);
  g.state_kind = c.state_kind;
  g.flags = c.flags;
  return g;
}

}  // namespace

TEST_CASE("lbopt_adamw_step: CUDA equals the CPU bit for bit for every kind and dtype pair, many slots in one call") {
  const DLDataType dts[] = {dt(kDLFloat, 32), dt(kDLBfloat, 16), dt(kDLFloat, 16)};
  for (int kind = 0; kind < 4; ++kind)
    for (uint32_t flags : {0u, unsigned(LBOPT_FLAG_AMSGRAD | LBOPT_FLAG_BF16_STOCHASTIC_ROUND |
                                        LBOPT_FLAG_STATE_STOCHASTIC_ROUND)}) {
      CAPTURE(kind);
      CAPTURE(flags);
      lbopt_adamw_config cfg;
      lbopt_adamw_config_init(&cfg, sizeof cfg);
      cfg.state_kind = lbopt_state_kind(kind);
      cfg.flags = flags;
      cfg.seed = 77;
      const Config slots_of = generic_of(cfg);
      std::vector<Slots*> ts;
      // 9 dtype pairs x sizes with partial blocks and odd 4-bit counts, plus enough small ones for > 1 launch
      const int64_t sizes[] = {1, 3, 127, 129, 257, 4099, 100003};
      int seed = 0;
      for (const DLDataType& pt : dts)
        for (const DLDataType& gt : dts)
          for (int64_t n : sizes) ts.push_back(new Slots(slots_of, pt, gt, n, uint64_t(++seed)));
      for (int i = 0; i < 80; ++i) ts.push_back(new Slots(slots_of, dts[0], dts[1], 1 + i * 37, uint64_t(++seed)));
      std::vector<lbopt_adamw_slot> hs, ds;
      for (Slots* t : ts) {
        hs.push_back(t->adamw_slot(false, 3));
        ds.push_back(t->adamw_slot(true, 3));
      }
      REQUIRE_MESSAGE(lbopt_adamw_step(&cfg, 2e-3, hs.data(), hs.size(), nullptr) == LBOPT_OK,
                      std::string(lbopt_last_error()));
      REQUIRE_MESSAGE(lbopt_adamw_step(&cfg, 2e-3, ds.data(), ds.size(), nullptr) == LBOPT_OK,
                      std::string(lbopt_last_error()));
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      for (Slots* t : ts) CHECK(t->mismatches() == 0);
      for (Slots* t : ts) delete t;
    }
}

namespace {

// Captures capture(stream) into a CUDA graph (global mode, the strictest), then for k = 1..replays: set(k) writes
// the lr and step the graph reads, the graph replays, and eager(k, stream) makes the same step by value.
template <class Capture, class Set, class Eager>
void replay_against_eager(Capture capture, Set set, Eager eager, int replays) {
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  const lbopt_status captured = capture(s);
  const std::string message = lbopt_last_error();
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);  // ends the capture whatever the step did
  REQUIRE_MESSAGE(captured == LBOPT_OK, message);
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  for (int64_t k = 1; k <= replays; ++k) {
    set(k);
    REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
    REQUIRE(eager(k, s) == LBOPT_OK);
    // set() writes on the legacy stream, which s (non-blocking) does not wait for
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

lbopt_step_options on_stream(cudaStream_t s) {
  lbopt_step_options opts;
  lbopt_step_options_init(&opts, sizeof opts);
  opts.stream = s;
  return opts;
}

}  // namespace

TEST_CASE("lbopt_adamw_step_capturable in a CUDA graph (float64 lr, int64 step) equals eager calls") {
  lbopt_adamw_config cfg;
  lbopt_adamw_config_init(&cfg, sizeof cfg);
  Slots eager(generic_of(cfg), dt(kDLBfloat, 16), dt(kDLFloat, 32), 70001, 5);
  Slots graphed(generic_of(cfg), dt(kDLBfloat, 16), dt(kDLFloat, 32), 70001, 5);
  thrust::device_vector<double> lr(1);
  thrust::device_vector<int64_t> step(1);
  int64_t one = 1;
  DLTensor lr_t{thrust::raw_pointer_cast(lr.data()), {kDLCUDA, 0}, 1, dt(kDLFloat, 64), &one, nullptr, 0};
  DLTensor step_t{thrust::raw_pointer_cast(step.data()), {kDLCUDA, 0}, 1, dt(kDLInt, 64), &one, nullptr, 0};
  const lbopt_adamw_slot gs = graphed.adamw_slot(true, 1);
  auto value = [](int64_t k) { return 1e-3 * (1 + cos(double(k))); };
  replay_against_eager(
      [&](cudaStream_t s) {
        const lbopt_step_options opts = on_stream(s);
        return lbopt_adamw_step_capturable(&cfg, &lr_t, &step_t, &gs, 1, &opts);
      },
      [&](int64_t k) {
        lr[0] = value(k);
        step[0] = k;
      },
      [&](int64_t k, cudaStream_t s) {
        const lbopt_step_options opts = on_stream(s);
        const lbopt_adamw_slot es = eager.adamw_slot(true, k);
        return lbopt_adamw_step(&cfg, value(k), &es, 1, &opts);
      },
      5);
  CHECK(eager.p.download() == graphed.p.download());
  CHECK(eager.states[0]->codes.download() == graphed.states[0]->codes.download());
  CHECK(eager.states[1]->scales.download() == graphed.states[1]->scales.download());
}

TEST_CASE("the FP8 encode by the conversion instruction (gpu_fp8_cvt) equals the software encode on every float") {
  int device = 0;
  cudaGetDevice(&device);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, device);
  if (prop.major * 10 + prop.minor < 89) {
    MESSAGE("skipped: the instruction needs sm_89 or later");
    return;
  }
  thrust::device_vector<unsigned long long> count(1, 0);
  thrust::device_vector<unsigned int> first(1, 0xffffffffu);
  fp8_cvt_mismatches<<<4096, 256>>>(thrust::raw_pointer_cast(count.data()), thrust::raw_pointer_cast(first.data()));
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CAPTURE(first[0]);
  CHECK(count[0] == 0);
}

TEST_CASE("invalid device inputs return errors and write nothing") {
  lbopt_adamw_config cfg;
  lbopt_adamw_config_init(&cfg, sizeof cfg);
  cfg.state_kind = LBOPT_STATE_8BIT;
  Slots t(generic_of(cfg), dt(kDLFloat, 32), dt(kDLFloat, 32), 1000, 9);
  const auto before = t.p.download();
  {
    lbopt_adamw_slot s = t.adamw_slot(true, 1);
    DLTensor host_as_device = t.g.h;  // host memory claimed to be on cuda:0
    host_as_device.device = {kDLCUDA, 0};
    s.grad = &host_as_device;
    CHECK(lbopt_adamw_step(&cfg, 1e-3, &s, 1, nullptr) == LBOPT_ERR_DEVICE);
    CHECK(std::string(lbopt_last_error()).find("slots[0].grad") != std::string::npos);
    // validation alone refuses what the step refuses
    CHECK(lbopt_adamw_step_validate(&cfg, 1e-3, &s, 1, nullptr) == LBOPT_ERR_DEVICE);
    CHECK(std::string(lbopt_last_error()).find("slots[0].grad") != std::string::npos);
    // a caller that vouches for its devices is not asked about its pointers (so validation alone accepts this;
    // the step is not run)
    lbopt_step_options known;
    lbopt_step_options_init(&known, sizeof known);
    known.flags = LBOPT_STEP_DEVICES_KNOWN;
    CHECK(lbopt_adamw_step_validate(&cfg, 1e-3, &s, 1, &known) == LBOPT_OK);
  }
  {
    // a state is named as the caller's struct names it: v for lbopt_adamw_slot, states[1] for lbopt_slot
    lbopt_adamw_slot s = t.adamw_slot(true, 1);
    DLTensor host_as_device = t.states[1]->codes.h;
    host_as_device.device = {kDLCUDA, 0};
    s.v.codes = &host_as_device;
    CHECK(lbopt_adamw_step_validate(&cfg, 1e-3, &s, 1, nullptr) == LBOPT_ERR_DEVICE);
    CHECK(std::string(lbopt_last_error()).find("slots[0].v.codes") != std::string::npos);
    lbopt_slot g = t.slot(true, 1);
    g.states[1].codes = &host_as_device;
    const lbopt_optimizer_config gc = generic_of(cfg);
    CHECK(lbopt_step(&gc, 1e-3, &g, 1, nullptr) == LBOPT_ERR_DEVICE);
    CHECK(std::string(lbopt_last_error()).find("slots[0].states[1].codes") != std::string::npos);
  }
  {
    int devices = 0;
    cudaGetDeviceCount(&devices);
    lbopt_adamw_slot s = t.adamw_slot(true, 1);
    DLTensor other = t.g.d;
    other.device = {kDLCUDA, devices};  // a device that does not exist
    s.grad = &other;
    CHECK(lbopt_adamw_step(&cfg, 1e-3, &s, 1, nullptr) == LBOPT_ERR_DEVICE);
  }
  CHECK(t.p.download() == before);
}

TEST_CASE("a tensor larger than 2^31 bytes steps correctly at its end (64-bit indexing)") {
  size_t free_bytes = 0, total = 0;
  cudaMemGetInfo(&free_bytes, &total);
  const int64_t n = (int64_t(1) << 31) + 1001;  // bf16 params: 4.3 GB, grads 4.3 GB, states 2.2 GB
  if (free_bytes < size_t(12) << 30) {
    MESSAGE("skipped: needs 12 GB of free device memory");
    return;
  }
  thrust::device_vector<uint16_t> p(size_t(n), 0x3f80), g(size_t(n), 0x3c00);  // 1.0 and 2^-7 in bf16
  lbopt_layout l;
  lbopt_state_layout(LBOPT_STATE_4BIT, n, &l, sizeof l);
  thrust::device_vector<uint8_t> mc(size_t(l.codes_numel), 0), vc(size_t(l.codes_numel), 0);
  thrust::device_vector<float> ms(size_t(l.scales_numel), 0.0f), vs(size_t(l.scales_numel), 0.0f);
  int64_t shape = n, cshape = l.codes_numel, sshape = l.scales_numel;
  DLTensor tp{thrust::raw_pointer_cast(p.data()), {kDLCUDA, 0}, 1, dt(kDLBfloat, 16), &shape, nullptr, 0};
  DLTensor tg = tp;
  tg.data = thrust::raw_pointer_cast(g.data());
  DLTensor tmc{thrust::raw_pointer_cast(mc.data()), {kDLCUDA, 0}, 1, dt(kDLUInt, 8), &cshape, nullptr, 0};
  DLTensor tvc = tmc;
  tvc.data = thrust::raw_pointer_cast(vc.data());
  DLTensor tms{thrust::raw_pointer_cast(ms.data()), {kDLCUDA, 0}, 1, dt(kDLFloat, 32), &sshape, nullptr, 0};
  DLTensor tvs = tms;
  tvs.data = thrust::raw_pointer_cast(vs.data());
  lbopt_adamw_config cfg;
  lbopt_adamw_config_init(&cfg, sizeof cfg);
  const lbopt_adamw_slot s{sizeof s, &tp, &tg, {&tmc, &tms}, {&tvc, &tvs}, {}, 1};
  REQUIRE_MESSAGE(lbopt_adamw_step(&cfg, 1e-2, &s, 1, nullptr) == LBOPT_OK, std::string(lbopt_last_error()));
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  // every element took the same first step: 1 * (1 - lr * wd) - lr, rounded to bf16 (0x3f7d)
  const uint16_t first = p[0], last = p[size_t(n - 1)], middle = p[size_t(1) << 31];
  CHECK(first == last);
  CHECK(first == middle);
  CHECK(first != 0x3f80);
  const float scale_last = vs[size_t(l.scales_numel - 1)];
  CHECK(scale_last > 0.0f);
}

// ------------------------------------------------------------------------------------------------------------
// Every optimizer through lbopt_step: the CUDA kernels run the same element and block code as the CPU, rounded as
// written (no contraction on either side), so the results must agree bit for bit.

namespace {

using Config = lbopt_optimizer_config;

struct Spec {
  const char* name;
  lbopt_optimizer optimizer;
  void (*tweak)(Config&);
};

const Spec kSpecs[] = {
    {"adamw", LBOPT_OPTIMIZER_ADAMW, nullptr},
    {"adam, amsgrad, maximize", LBOPT_OPTIMIZER_ADAMW,
     [](Config& c) { c.flags = LBOPT_FLAG_ADAM_COUPLED_DECAY | LBOPT_FLAG_AMSGRAD | LBOPT_FLAG_MAXIMIZE; }},
    {"sgd, momentum 0, weight decay", LBOPT_OPTIMIZER_SGD, [](Config& c) { c.momentum = 0.0; c.weight_decay = 0.01; }},
    {"sgd, nesterov, weight decay", LBOPT_OPTIMIZER_SGD,
     [](Config& c) { c.flags = LBOPT_FLAG_NESTEROV; c.weight_decay = 0.01; }},
    {"sgd, dampening", LBOPT_OPTIMIZER_SGD, [](Config& c) { c.dampening = 0.3; }},
    {"lion, weight decay, maximize", LBOPT_OPTIMIZER_LION,
     [](Config& c) { c.weight_decay = 0.1; c.flags = LBOPT_FLAG_MAXIMIZE; }},
    {"ademamix", LBOPT_OPTIMIZER_ADEMAMIX, nullptr},
    {"ademamix, warm-ups", LBOPT_OPTIMIZER_ADEMAMIX, [](Config& c) { c.t_alpha = 3.0; c.t_beta3 = 3.0; }},
    {"ademamix, nu on the linear map", LBOPT_OPTIMIZER_ADEMAMIX, [](Config& c) { c.flags = LBOPT_FLAG_NU_LINEAR_MAP; }},
    {"muon, nesterov", LBOPT_OPTIMIZER_MUON, [](Config& c) { c.flags = LBOPT_FLAG_NESTEROV; }},
    {"muon, momentum 0.3", LBOPT_OPTIMIZER_MUON, [](Config& c) { c.momentum = 0.3; }},
};

Config config_of(const Spec& s, int kind, uint32_t extra_flags) {
  Config c;
  REQUIRE(lbopt_optimizer_config_init(&c, sizeof c, s.optimizer) == LBOPT_OK);
  c.state_kind = lbopt_state_kind(kind);
  if (s.tweak) s.tweak(c);
  c.flags |= extra_flags;
  c.seed = 99;
  return c;
}


double lr_at(int64_t step) { return 1e-3 * (1.0 + 0.5 * cos(0.7 * double(step))); }

// Steps 1 to steps of every slot of ts on the host and on the device alike (lr_at(step)), then synchronizes.
void step_both(const Config& cfg, const std::vector<Slots*>& ts, int64_t steps) {
  for (int64_t step = 1; step <= steps; ++step) {
    std::vector<lbopt_slot> hs, ds;
    for (Slots* t : ts) {
      hs.push_back(t->slot(false, step));
      ds.push_back(t->slot(true, step));
    }
    for (const std::vector<lbopt_slot>* side : {&hs, &ds})
      REQUIRE_MESSAGE(lbopt_step(&cfg, lr_at(step), side->data(), side->size(), nullptr) == LBOPT_OK,
                      std::string(lbopt_last_error()));
  }
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

}  // namespace

TEST_CASE("every optimizer, state kind and dtype pair: the CUDA step equals the CPU step bit for bit") {
  struct Pair {
    DLDataType p, g;
    uint32_t flags;
  };
  const Pair pairs[] = {{dt(kDLFloat, 32), dt(kDLFloat, 32), 0u},
                        {dt(kDLBfloat, 16), dt(kDLFloat, 32), LBOPT_FLAG_BF16_STOCHASTIC_ROUND},
                        {dt(kDLFloat, 16), dt(kDLBfloat, 16), 0u}};
  const int64_t sizes[] = {1, 127, 129, 255, 257, 4099, 100003};
  int64_t compared = 0;
  for (const Spec& spec : kSpecs)
    for (int kind = 0; kind < 4; ++kind)
      for (const Pair& pair : pairs) {
        const Config cfg = config_of(spec, kind, pair.flags);
        std::vector<Slots*> ts;
        uint64_t seed = 1;
        for (int64_t n : sizes) ts.push_back(new Slots(cfg, pair.p, pair.g, n, ++seed));
        if (pair.flags == 0 && pair.p.bits == 32)  // more tensors than one launch takes
          for (int i = 0; i < 140; ++i) ts.push_back(new Slots(cfg, pair.p, pair.g, 1 + 53 * i, ++seed));
        step_both(cfg, ts, 3);
        int64_t bad = 0, bad_tensors = 0;
        for (Slots* t : ts) {
          const int64_t b = t->mismatches();
          bad += b;
          bad_tensors += b != 0;
          compared += t->n;
        }
        if (bad)
          MESSAGE(spec.name << ", kind " << kind << ", param bits " << int(pair.p.bits) << ", grad code "
                            << int(pair.g.code) << ": " << bad << " bytes differ in " << bad_tensors << " of "
                            << ts.size() << " tensors");
        CHECK(bad == 0);
        for (Slots* t : ts) delete t;
      }
  MESSAGE("elements compared: " << compared);
}

TEST_CASE("tensors that start off a vector boundary step like aligned ones: the CUDA step equals the CPU step") {
  // The wide step (gpu_wide_step) loads and stores runs of 4 elements as vectors when every tensor of a launch is
  // aligned for them, and takes the scalar path otherwise: launches of aligned tensors, of tensors one element off
  // (params, grads or codes) and a mix of both must all equal the CPU.
  const DeviceOffsets offsets[] = {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {0, 0, 1}};
  const int64_t sizes[] = {128, 256, 1024, 4099};
  for (const Spec& spec : kSpecs)
    for (int kind = 0; kind < 4; ++kind)
      for (const DLDataType pt : {dt(kDLFloat, 32), dt(kDLBfloat, 16)}) {
        const Config cfg = config_of(spec, kind, 0u);
        for (int mix = 0; mix < 5; ++mix) {  // each offset alone, then all of them in one launch
          std::vector<Slots*> ts;
          uint64_t seed = 1;
          for (int o = 0; o < 4; ++o)
            if (mix == 4 || mix == o)
              for (int64_t n : sizes) ts.push_back(new Slots(cfg, pt, pt, n, ++seed, offsets[o]));
          step_both(cfg, ts, 2);
          int64_t bad = 0;
          for (Slots* t : ts) bad += t->mismatches();
          if (bad) MESSAGE(spec.name << ", kind " << kind << ", param bits " << int(pt.bits) << ", mix " << mix);
          CHECK(bad == 0);
          for (Slots* t : ts) delete t;
        }
      }
}

TEST_CASE("every optimizer: a captured lbopt_step_capturable replays with a new lr each step and equals eager calls") {
  for (const Spec& spec : kSpecs)
    for (int kind = 0; kind < 4; ++kind) {
      CAPTURE(spec.name);
      CAPTURE(kind);
      const Config cfg = config_of(spec, kind, 0);
      Slots eager(cfg, dt(kDLBfloat, 16), dt(kDLFloat, 32), 70001, 5);
      Slots graphed(cfg, dt(kDLBfloat, 16), dt(kDLFloat, 32), 70001, 5);
      thrust::device_vector<float> lr(1);  // float32 lr and step: the forms torch keeps on the device
      thrust::device_vector<float> step(1);
      int64_t one = 1;
      DLTensor lr_t{thrust::raw_pointer_cast(lr.data()), {kDLCUDA, 0}, 1, dt(kDLFloat, 32), &one, nullptr, 0};
      DLTensor step_t{thrust::raw_pointer_cast(step.data()), {kDLCUDA, 0}, 1, dt(kDLFloat, 32), &one, nullptr, 0};
      const lbopt_slot gs = graphed.slot(true, 1);
      replay_against_eager(
          [&](cudaStream_t s) {
            const lbopt_step_options opts = on_stream(s);
            return lbopt_step_capturable(&cfg, &lr_t, &step_t, &gs, 1, &opts);
          },
          [&](int64_t k) {
            lr[0] = float(lr_at(k));
            step[0] = float(k);
          },
          [&](int64_t k, cudaStream_t s) {
            const lbopt_step_options opts = on_stream(s);
            const lbopt_slot es = eager.slot(true, k);
            return lbopt_step(&cfg, double(float(lr_at(k))), &es, 1, &opts);
          },
          4);
      CHECK(eager.p.download() == graphed.p.download());
      for (size_t k = 0; k < eager.states.size(); ++k) {
        CHECK(eager.states[k]->codes.download() == graphed.states[k]->codes.download());
        CHECK(eager.states[k]->scales.download() == graphed.states[k]->scales.download());
      }
    }
}

TEST_CASE("AMP on the device: grad_scale, skip_nonfinite and found_inf give the CPU's results and flags") {
  for (const Spec& spec : kSpecs)
    for (int kind = 0; kind < 4; ++kind) {
      CAPTURE(spec.name);
      CAPTURE(kind);
      const Config cfg = config_of(spec, kind, LBOPT_FLAG_SKIP_NONFINITE);
      std::vector<Slots*> ts;
      for (int i = 0; i < 3; ++i)
        ts.push_back(new Slots(cfg, dt(kDLFloat, 32), dt(kDLFloat, 16), 3000 + 517 * i, 40 + i));
      // grads scaled by 2^10 as GradScaler leaves them; tensor 1 holds an Inf
      for (Slots* t : ts) {
        uint16_t* g = reinterpret_cast<uint16_t*>(t->g.host.data());
        for (int64_t i = 0; i < t->n; ++i) g[i] = uint16_t(g[i] + (g[i] & 0x7c00u ? 10u << 10 : 0u));
      }
      reinterpret_cast<uint16_t*>(ts[1]->g.host.data())[77] = 0x7c00;
      for (Slots* t : ts) t->g.upload();
      Mirror scale(dt(kDLFloat, 32), 1), found(dt(kDLFloat, 32), 1), skipped(dt(kDLUInt, 8), 3);
      reinterpret_cast<float*>(scale.host.data())[0] = 1024.0f;
      scale.upload();
      found.upload();
      std::fill(skipped.host.begin(), skipped.host.end(), uint8_t(7));
      skipped.upload();
      lbopt_step_options ho, dop;
      lbopt_step_options_init(&ho, sizeof ho);
      lbopt_step_options_init(&dop, sizeof dop);
      ho.grad_scale = &scale.h;
      ho.skipped = &skipped.h;
      dop.grad_scale = &scale.d;
      dop.skipped = &skipped.d;
      std::vector<lbopt_slot> hs, ds;
      for (Slots* t : ts) {
        hs.push_back(t->slot(false, 2));
        ds.push_back(t->slot(true, 2));
      }
      REQUIRE_MESSAGE(lbopt_step(&cfg, 1e-3, hs.data(), hs.size(), &ho) == LBOPT_OK, std::string(lbopt_last_error()));
      REQUIRE_MESSAGE(lbopt_step(&cfg, 1e-3, ds.data(), ds.size(), &dop) == LBOPT_OK, std::string(lbopt_last_error()));
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      CHECK(skipped.host == std::vector<uint8_t>{0, 1, 0});
      CHECK(skipped.download() == skipped.host);
      for (Slots* t : ts) CHECK(t->mismatches() == 0);
      // found_inf set: the device writes nothing and flags every slot
      reinterpret_cast<float*>(found.host.data())[0] = 1.0f;
      found.upload();
      dop.found_inf = &found.d;
      std::vector<std::vector<uint8_t>> before;
      for (Slots* t : ts) before.push_back(t->p.download());
      REQUIRE(lbopt_step(&cfg, 1e-3, ds.data(), ds.size(), &dop) == LBOPT_OK);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      CHECK(skipped.download() == std::vector<uint8_t>{1, 1, 1});
      for (size_t i = 0; i < ts.size(); ++i) {
        CHECK(ts[i]->p.download() == before[i]);
        CHECK(ts[i]->mismatches() == 0);
      }
      for (Slots* t : ts) delete t;
    }
}

TEST_CASE("quantize, dequantize and state_init on the device equal the CPU's bit for bit") {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd;
  for (int kind = 0; kind < 4; ++kind)
    for (lbopt_moment moment : {LBOPT_MOMENT_FIRST, LBOPT_MOMENT_SECOND, LBOPT_MOMENT_SECOND_SIGNED})
      for (int64_t n : {int64_t(1), int64_t(129), int64_t(100003)}) {
        CAPTURE(kind);
        CAPTURE(moment);
        CAPTURE(n);
        Mirror x(dt(kDLFloat, 32), n), back(dt(kDLFloat, 32), n);
        float* xs = reinterpret_cast<float*>(x.host.data());
        for (int64_t i = 0; i < n; ++i) {  // normal values, zeros, tiny and huge ones
          const float r = nd(rng) * (i % 7 == 3 ? 1e-30f : i % 11 == 5 ? 1e30f : 1.0f);
          xs[i] = i % 13 == 0 ? 0.0f : moment != LBOPT_MOMENT_FIRST ? fabsf(r) : r;
        }
        x.upload();
        const lbopt_state_kind k = lbopt_state_kind(kind);
        StateMirror st(k, n);
        REQUIRE(lbopt_quantize(k, moment, &x.h, st.host(k), nullptr) == LBOPT_OK);
        REQUIRE(lbopt_quantize(k, moment, &x.d, st.device(k), nullptr) == LBOPT_OK);
        REQUIRE(lbopt_dequantize(k, moment, st.host(k), &back.h, nullptr) == LBOPT_OK);
        REQUIRE(lbopt_dequantize(k, moment, st.device(k), &back.d, nullptr) == LBOPT_OK);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        CHECK(st.codes.download() == st.codes.host);
        CHECK(st.scales.download() == st.scales.host);
        CHECK(back.download() == back.host);
        REQUIRE(lbopt_state_init(k, n, st.device(k), nullptr) == LBOPT_OK);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        for (uint8_t b : st.codes.download()) REQUIRE(b == 0);
        for (uint8_t b : st.scales.download()) REQUIRE(b == 0);
      }
}

// The codes of x = mid * s and its neighbours, for every decision point of every map under block scales of every
// magnitude (from 2^126 on, 8-bit's RN(1 / s) is subnormal): inputs where the quotient x / s and the product
// x * RN(1 / s) give different codes, so that the device must encode the quotient each kind documents
// (docs/formats.md, "Encoding and decoding": the product for 8-bit, the quotient for 4-bit and FP8) as the CPU
// does. Random data rarely tells them apart.
TEST_CASE("quantize at and around every decision point times the block scale: the device's codes are the CPU's") {
  std::vector<float> anchors = {1e-12f, 1.7e-10f, 3e-5f, 0.37f, 1.0f, 1.5f, 1000.1f, 3e20f, 1e38f, 0x1p126f,
                                0x1.8p126f, 0x1p127f, 3.4028235e38f};
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> log_anchor(-27.6, 88.0);
  for (int i = 0; i < 100; ++i) anchors.push_back(float(std::exp(log_anchor(rng))));
  for (int kind = 0; kind < 3; ++kind)
    for (lbopt_moment moment : {LBOPT_MOMENT_FIRST, LBOPT_MOMENT_SECOND, LBOPT_MOMENT_SECOND_SIGNED}) {
      CAPTURE(kind);
      CAPTURE(moment);
      const lbopt_state_kind k = lbopt_state_kind(kind);
      const int64_t block = kind == LBOPT_STATE_4BIT ? 128 : 256, codes = kind == LBOPT_STATE_4BIT ? 16 : 256;
      // every code's value at scale 1 (the CPU's decode), and the midpoints between neighbouring values
      StateMirror table(k, block);
      for (int64_t c = 0; c < codes; ++c)
        if (kind == LBOPT_STATE_4BIT) table.codes.host[size_t(c / 2)] |= uint8_t(c % 2 ? c : c << 4);
        else table.codes.host[size_t(c)] = uint8_t(c);
      const float one = 1.0f;
      memcpy(table.scales.host.data(), &one, sizeof one);
      Mirror values(dt(kDLFloat, 32), block);
      REQUIRE(lbopt_dequantize(k, moment, table.host(k), &values.h, nullptr) == LBOPT_OK);
      std::vector<float> sorted;
      for (int64_t c = 0; c < codes; ++c) {
        const float v = reinterpret_cast<const float*>(values.host.data())[c];
        if (std::isfinite(v)) sorted.push_back(v);  // (e4m3's NaN codes left out)
      }
      std::sort(sorted.begin(), sorted.end());
      std::vector<float> in;
      for (float anchor : anchors) {
        const float absmax = std::max(anchor, 1e-12f);  // the block scale lbopt derives from it
        const float s = kind == LBOPT_STATE_FP8 ? absmax / 448.0f : absmax;
        std::vector<float> xs;
        for (size_t i = 0; i + 1 < sorted.size(); ++i) {
          float x = 0.5f * (sorted[i] + sorted[i + 1]) * s;
          for (int u = 0; u < 4; ++u) x = nextafterf(x, -INFINITY);
          for (int u = 0; u < 9; ++u, x = nextafterf(x, INFINITY))
            if (std::fabs(x) <= anchor && !(moment != LBOPT_MOMENT_FIRST && std::signbit(x))) xs.push_back(x);
        }
        for (size_t next = 0; next < xs.size();) {  // blocks: the anchor sets absmax, the rest lie within it
          in.push_back(anchor);
          for (int64_t j = 1; j < block; ++j) in.push_back(next < xs.size() ? xs[next++] : 0.0f);
        }
      }
      const int64_t n = int64_t(in.size());
      Mirror x(dt(kDLFloat, 32), n);
      memcpy(x.host.data(), in.data(), in.size() * sizeof(float));
      x.upload();
      StateMirror st(k, n);
      REQUIRE(lbopt_quantize(k, moment, &x.h, st.host(k), nullptr) == LBOPT_OK);
      REQUIRE(lbopt_quantize(k, moment, &x.d, st.device(k), nullptr) == LBOPT_OK);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      CHECK(st.scales.download() == st.scales.host);
      CHECK(st.codes.download() == st.codes.host);
    }
}

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}

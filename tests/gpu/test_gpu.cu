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

#include <random>
#include <string>
#include <vector>

#include "lbopt.h"

namespace {

DLDataType dt(int code, int bits) { return DLDataType{uint8_t(code), uint8_t(bits), 1}; }

// One tensor mirrored on the host and the device.
struct Mirror {
  std::vector<uint8_t> host;
  thrust::device_vector<uint8_t> dev;
  int64_t shape;
  DLTensor h{}, d{};
  Mirror(DLDataType type, int64_t numel) : host(size_t(numel) * type.bits / 8), dev(host.size()), shape(numel) {
    h.data = host.data();
    h.device = {kDLCPU, 0};
    h.ndim = 1;
    h.dtype = type;
    h.shape = &shape;
    d = h;
    d.data = thrust::raw_pointer_cast(dev.data());
    d.device = {kDLCUDA, 0};
  }
  void upload() { thrust::copy(host.begin(), host.end(), dev.begin()); }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> out(dev.size());
    thrust::copy(dev.begin(), dev.end(), out.begin());
    return out;
  }
};

struct StateMirror {
  Mirror codes, scales;
  StateMirror(lbopt_state_kind kind, int64_t n)
      : codes(kind == LBOPT_STATE_FP32 ? dt(kDLFloat, 32) : dt(kDLUInt, 8), layout(kind, n).codes_numel),
        scales(dt(kDLFloat, 32), layout(kind, n).scales_numel) {}
  static lbopt_layout layout(lbopt_state_kind kind, int64_t n) {
    lbopt_layout l;
    lbopt_state_layout(kind, n, &l, sizeof l);
    return l;
  }
  lbopt_state host(lbopt_state_kind k) { return {&codes.h, k == LBOPT_STATE_FP32 ? nullptr : &scales.h}; }
  lbopt_state device(lbopt_state_kind k) { return {&codes.d, k == LBOPT_STATE_FP32 ? nullptr : &scales.d}; }
};

struct Tensor {
  lbopt_state_kind kind;
  int64_t n;
  Mirror p, g;
  StateMirror m, v, vmax;
  Tensor(lbopt_state_kind k, DLDataType pt, DLDataType gt, int64_t numel, uint64_t seed)
      : kind(k), n(numel), p(pt, numel), g(gt, numel), m(k, numel), v(k, numel), vmax(k, numel) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd;
    fill(p, rng, 0.1f);
    fill(g, rng, 0.01f);
    for (StateMirror* s : {&m, &v, &vmax}) {  // start from a quantized random state
      Mirror x(dt(kDLFloat, 32), numel);
      for (int64_t i = 0; i < numel; ++i) reinterpret_cast<float*>(x.host.data())[i] = fabsf(nd(rng)) * 1e-3f;
      REQUIRE(lbopt_quantize(k, s == &m ? LBOPT_MOMENT_FIRST : LBOPT_MOMENT_SECOND, &x.h, s->host(k), nullptr) ==
              LBOPT_OK);
      s->codes.upload();
      s->scales.upload();
    }
    p.upload();
    g.upload();
  }
  static void fill(Mirror& t, std::mt19937_64& rng, float scale) {
    std::normal_distribution<float> nd;
    for (int64_t i = 0; i < t.shape; ++i) {
      const float x = nd(rng) * scale;
      if (t.h.dtype.bits == 32) {
        reinterpret_cast<float*>(t.host.data())[i] = x;
      } else {  // any valid 16-bit value will do: truncated float bits (bf16) or CUDA's conversion (fp16)
        uint32_t u;
        memcpy(&u, &x, 4);
        const __half h = __float2half_rn(x);
        uint16_t b;
        memcpy(&b, &h, 2);
        reinterpret_cast<uint16_t*>(t.host.data())[i] = t.h.dtype.code == kDLBfloat ? uint16_t(u >> 16) : b;
      }
    }
  }
  lbopt_adamw_slot host_slot(int64_t step, bool ams) {
    return {sizeof(lbopt_adamw_slot), &p.h, &g.h, m.host(kind), v.host(kind), ams ? vmax.host(kind) : lbopt_state{},
            step};
  }
  lbopt_adamw_slot device_slot(int64_t step, bool ams) {
    return {sizeof(lbopt_adamw_slot), &p.d, &g.d, m.device(kind), v.device(kind),
            ams ? vmax.device(kind) : lbopt_state{}, step};
  }
};

// Compare device results with host results: params bit for bit or within 1e-6 relative, codes identical except
// near-tie flips of one code.
void compare(Tensor& t, int64_t* code_flips, int64_t* codes_total) {
  const auto dp = t.p.download();
  if (t.p.h.dtype.bits == 32) {
    for (int64_t i = 0; i < t.n; ++i) {
      const float a = reinterpret_cast<const float*>(t.p.host.data())[i], b = reinterpret_cast<const float*>(dp.data())[i];
      REQUIRE(fabsf(a - b) <= 1e-6f * fmaxf(fabsf(a), 1e-3f));
    }
  } else {
    int64_t diff = 0;
    for (size_t i = 0; i < dp.size(); i += 2) diff += memcmp(&dp[i], &t.p.host[i], 2) != 0;
    CHECK(diff <= t.n / 10000 + 1);
  }
  for (StateMirror* s : {&t.m, &t.v}) {
    const auto dc = s->codes.download();
    if (t.kind == LBOPT_STATE_FP32) {
      CHECK(memcmp(dc.data(), s->codes.host.data(), dc.size()) == 0);
      continue;
    }
    for (size_t i = 0; i < dc.size(); ++i) {
      const int a = dc[i], b = s->codes.host[i];
      if (a == b) continue;
      const bool nibble_ok = t.kind == LBOPT_STATE_4BIT && abs((a >> 4) - (b >> 4)) <= 1 && abs((a & 15) - (b & 15)) <= 1;
      CHECK((nibble_ok || abs(a - b) <= 1));
      ++*code_flips;
    }
    *codes_total += int64_t(dc.size());
  }
}

}  // namespace

TEST_CASE("CUDA step equals the CPU step for every kind and dtype pair, many slots in one call") {
  const DLDataType dts[] = {dt(kDLFloat, 32), dt(kDLBfloat, 16), dt(kDLFloat, 16)};
  int64_t flips = 0, total = 0;
  for (int kind = 0; kind < 4; ++kind)
    for (uint32_t flags : {0u, unsigned(LBOPT_FLAG_AMSGRAD | LBOPT_FLAG_BF16_STOCHASTIC_ROUND)}) {
      CAPTURE(kind);
      CAPTURE(flags);
      std::vector<Tensor*> ts;
      // 9 dtype pairs x sizes with partial blocks and odd 4-bit counts, plus enough small ones for > 1 launch
      const int64_t sizes[] = {1, 3, 127, 129, 257, 4099, 100003};
      int seed = 0;
      for (const DLDataType& pt : dts)
        for (const DLDataType& gt : dts)
          for (int64_t n : sizes) ts.push_back(new Tensor(lbopt_state_kind(kind), pt, gt, n, uint64_t(++seed)));
      for (int i = 0; i < 80; ++i) ts.push_back(new Tensor(lbopt_state_kind(kind), dts[0], dts[1], 1 + i * 37, uint64_t(++seed)));
      lbopt_adamw_config cfg;
      lbopt_adamw_config_init(&cfg, sizeof cfg);
      cfg.state_kind = lbopt_state_kind(kind);
      cfg.flags = flags;
      cfg.seed = 77;
      const bool ams = flags & LBOPT_FLAG_AMSGRAD;
      std::vector<lbopt_adamw_slot> hs, ds;
      for (Tensor* t : ts) {
        hs.push_back(t->host_slot(3, ams));
        ds.push_back(t->device_slot(3, ams));
      }
      REQUIRE_MESSAGE(lbopt_adamw_step(&cfg, 2e-3, hs.data(), hs.size(), nullptr) == LBOPT_OK, lbopt_last_error());
      REQUIRE_MESSAGE(lbopt_adamw_step(&cfg, 2e-3, ds.data(), ds.size(), nullptr) == LBOPT_OK, lbopt_last_error());
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      for (Tensor* t : ts) compare(*t, &flips, &total);
      for (Tensor* t : ts) delete t;
    }
  MESSAGE("near-tie code flips: " << flips << " of " << total << " code bytes");
  CHECK(double(flips) <= 1e-4 * double(total) + 1);
}

TEST_CASE("capturable step in a CUDA graph replays with a new lr each step and equals eager calls") {
  Tensor eager(LBOPT_STATE_4BIT, dt(kDLBfloat, 16), dt(kDLFloat, 32), 70001, 5);
  Tensor graphed(LBOPT_STATE_4BIT, dt(kDLBfloat, 16), dt(kDLFloat, 32), 70001, 5);
  lbopt_adamw_config cfg;
  lbopt_adamw_config_init(&cfg, sizeof cfg);
  thrust::device_vector<double> lr(1);
  thrust::device_vector<int64_t> step(1);
  int64_t one = 1;
  DLTensor lr_t{thrust::raw_pointer_cast(lr.data()), {kDLCUDA, 0}, 1, dt(kDLFloat, 64), &one, nullptr, 0};
  DLTensor step_t{thrust::raw_pointer_cast(step.data()), {kDLCUDA, 0}, 1, dt(kDLInt, 64), &one, nullptr, 0};
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  lbopt_step_options opts;
  lbopt_step_options_init(&opts, sizeof opts);
  opts.stream = s;
  const lbopt_adamw_slot gs = graphed.device_slot(1, false);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE_MESSAGE(lbopt_adamw_step_capturable(&cfg, &lr_t, &step_t, &gs, 1, &opts) == LBOPT_OK, lbopt_last_error());
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  for (int64_t k = 1; k <= 5; ++k) {
    const double value = 1e-3 * (1 + cos(double(k)));
    lr[0] = value;
    step[0] = k;
    REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
    const lbopt_adamw_slot es = eager.device_slot(k, false);
    REQUIRE(lbopt_adamw_step(&cfg, value, &es, 1, &opts) == LBOPT_OK);
  }
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(eager.p.download() == graphed.p.download());
  CHECK(eager.m.codes.download() == graphed.m.codes.download());
  CHECK(eager.v.scales.download() == graphed.v.scales.download());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

TEST_CASE("invalid device inputs return errors and write nothing") {
  Tensor t(LBOPT_STATE_8BIT, dt(kDLFloat, 32), dt(kDLFloat, 32), 1000, 9);
  lbopt_adamw_config cfg;
  lbopt_adamw_config_init(&cfg, sizeof cfg);
  cfg.state_kind = LBOPT_STATE_8BIT;
  const auto before = t.p.download();
  {
    lbopt_adamw_slot s = t.device_slot(1, false);
    DLTensor host_as_device = t.g.h;  // host memory claimed to be on cuda:0
    host_as_device.device = {kDLCUDA, 0};
    s.grad = &host_as_device;
    CHECK(lbopt_adamw_step(&cfg, 1e-3, &s, 1, nullptr) == LBOPT_ERR_DEVICE);
    CHECK(std::string(lbopt_last_error()).find("slots[0].grad") != std::string::npos);
  }
  {
    int devices = 0;
    cudaGetDeviceCount(&devices);
    lbopt_adamw_slot s = t.device_slot(1, false);
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
  REQUIRE_MESSAGE(lbopt_adamw_step(&cfg, 1e-2, &s, 1, nullptr) == LBOPT_OK, lbopt_last_error());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  // every element took the same first step: 1 * (1 - lr * wd) - lr, rounded to bf16 (0x3f7d)
  const uint16_t first = p[0], last = p[size_t(n - 1)], middle = p[size_t(1) << 31];
  CHECK(first == last);
  CHECK(first == middle);
  CHECK(first != 0x3f80);
  const float scale_last = vs[size_t(l.scales_numel - 1)];
  CHECK(scale_last > 0.0f);
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

// CPU step throughput against a memory copy of the same footprint, measured in the same run.
// usage: bench_step [--sizes 1M,16M,256M] [--threads 1,0] [--kinds 4bit,8bit,fp8,fp32]
//                   [--params fp32,bf16,fp16,fp32+bf16] [--optimizers adamw,sgd,lion,ademamix,amsgrad] [--reps 5]
//                   [--csv FILE] [--isa AVX2|AVX3|...]
//                   (threads 0 = all; sizes take K/M suffixes; --isa restricts Highway's runtime dispatch to one
//                   instruction set the CPU supports; optimizers default to all four, so that every default run
//                   gives each one's ratio to AdamW; SGD runs with momentum 0.9; amsgrad is AdamW with
//                   LBOPT_FLAG_AMSGRAD, a third state; a name ending in /nearest or /stochastic sets
//                   LBOPT_FLAG_STATE_NEAREST_ROUND or LBOPT_FLAG_STATE_STOCHASTIC_ROUND, where a plain name keeps
//                   the default of the optimizer and kind: "sgd,sgd/nearest" gives the cost of the stochastic
//                   rounding of 4-bit and FP8 codes)
// Per optimizer, state kind, param dtype (grads the same), size and thread count: ns per element, effective GB/s
// (the bytes of docs/formats.md, "Bytes a step moves": param read+write, grad read, every state read+written), the
// ratio to the roofline's GB/s (see roofline()), measured with the same footprint and threads, and the ratio of
// ns/element to AdamW's of the same kind, dtype, size and threads when adamw runs too; best of reps for all.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <hwy/targets.h>

#include "kernels/dtype_convert.h"
#include "lbopt.h"

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

template <class F>
double best_of(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now();
    f();
    best = std::min(best, now() - t0);
  }
  return best;
}

std::vector<std::string> split(const char* s) {
  std::vector<std::string> out;
  std::string cur;
  for (; *s; ++s) {
    if (*s == ',') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += *s;
    }
  }
  out.push_back(cur);
  return out;
}

int64_t parse_size(const std::string& s) {
  const char suffix = s.empty() ? 0 : s.back();
  const int64_t scale = suffix == 'K' ? 1024 : (suffix == 'M' ? 1 << 20 : (suffix == 'G' ? int64_t(1) << 30 : 1));
  return int64_t(atof(s.c_str()) * double(scale));
}

// Threads that stay alive between timed runs (as lbopt's pool does), so a small copy is not dominated by
// thread creation.
class Team {
 public:
  explicit Team(int n) : n_(n) {
    for (int i = 1; i < n; ++i) threads_.emplace_back([this, i] { loop(i); });
  }
  ~Team() {
    stop_ = true;
    generation_.fetch_add(1);
    for (auto& t : threads_) t.join();
  }
  void run(const std::function<void(int, int)>& fn) {
    fn_ = &fn;
    done_.store(0);
    generation_.fetch_add(1);
    fn(0, n_);
    while (done_.load() != n_ - 1) std::this_thread::yield();
  }

 private:
  void loop(int i) {
    for (uint64_t seen = 0;;) {
      while (generation_.load() == seen) std::this_thread::yield();
      seen = generation_.load();
      if (stop_) return;
      (*fn_)(i, n_);
      done_.fetch_add(1);
    }
  }
  int n_;
  std::vector<std::thread> threads_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> done_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(int, int)>* fn_ = nullptr;
};

// The roofline is the better of two kernels with the step's footprint and thread count: memcpy (whose large-size
// path streams with non-temporal stores) and an in-place x += y, the step's own access pattern (read-modify-write
// of a buffer plus a read-only one: no read-for-ownership), in a plain loop the compiler vectorizes.
struct Roofline {
  double memcpy_gbs, inplace_gbs;
  double best() const { return std::max(memcpy_gbs, inplace_gbs); }
};

void add_floats(float* x, const float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] += y[i];
}

// GB/s (bytes read + written) of each kernel moving `bytes` in all.
Roofline roofline(Team& team, size_t bytes, int reps) {
  const size_t n = bytes / 2 / sizeof(float);
  std::vector<float> a(n, 1.0f), b(n, 0.0f);
  const auto share = [&](int i, int k, size_t total) {
    return std::make_pair(total * size_t(i) / size_t(k), total * size_t(i + 1) / size_t(k));
  };
  const std::function<void(int, int)> copy = [&](int i, int k) {
    const auto [lo, hi] = share(i, k, n);
    memcpy(b.data() + lo, a.data() + lo, (hi - lo) * sizeof(float));
  };
  const size_t m = bytes / 3 / sizeof(float);  // x read + written, y read
  const std::function<void(int, int)> add = [&](int i, int k) {
    const auto [lo, hi] = share(i, k, m);
    add_floats(b.data() + lo, a.data() + lo, hi - lo);
  };
  const double t_copy = best_of(reps, [&] { team.run(copy); });
  const double t_add = best_of(reps, [&] { team.run(add); });
  return {2.0 * double(n * sizeof(float)) / t_copy / 1e9, 3.0 * double(m * sizeof(float)) / t_add / 1e9};
}

DLTensor view(void* data, int64_t* shape, DLDataType dt) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.dtype = dt;
  t.shape = shape;
  return t;
}

// Normal-ish values (sum of uniforms) from a fast LCG, in the param dtype dt, so codes and scales vary.
void fill(std::vector<uint8_t>& buf, DLDataType dt, float sigma, uint64_t seed) {
  const size_t elem = dt.bits / 8, n = buf.size() / elem;
  uint64_t x = seed;
  for (size_t i = 0; i < n; ++i) {
    float s = -2.0f;
    for (int k = 0; k < 4; ++k) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      s += float(x >> 40) * (1.0f / 16777216.0f);
    }
    float f = s * 1.7f * sigma;
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if (elem == 2) {
      const uint16_t h = dt.code == kDLBfloat ? uint16_t(bits >> 16) : lbopt::float_to_f16(f);
      memcpy(&buf[i * 2], &h, 2);
    } else {
      memcpy(&buf[i * 4], &f, 4);
    }
  }
}

struct Row {
  std::string optimizer, kind, param;
  int64_t numel;
  int threads;
  double ns, gbs;
  Roofline roof;
};

int find_name(const char* (*name)(int), const std::string& s) {
  for (int i = 0; name(i); ++i)
    if (s == name(i)) return i;
  fprintf(stderr, "unknown name %s\n", s.c_str());
  exit(2);
}

const char* kind_name(int i) { return lbopt_state_kind_name(lbopt_state_kind(i)); }
const char* optimizer_name(int i) { return lbopt_optimizer_name(lbopt_optimizer(i)); }

DLDataType dtype_named(const std::string& name) {
  if (name == "bf16") return {kDLBfloat, 16, 1};
  if (name == "fp16") return {kDLFloat, 16, 1};
  if (name != "fp32") {
    fprintf(stderr, "unknown dtype %s\n", name.c_str());
    exit(1);
  }
  return {kDLFloat, 32, 1};
}

// name: an optimizer, or "amsgrad" (AdamW with LBOPT_FLAG_AMSGRAD: a third state, vmax), with an optional
// "/nearest" or "/stochastic" (the rounding of the first-moment codes). param: the dtype of the params and grads
// ("fp32", "bf16" or "fp16"), or of each ("fp32+bf16": fp32 params with bf16 grads).
Row run(const std::string& name, int kind, const std::string& param, int64_t n, int reps, Team& team) {
  const DLDataType f32{kDLFloat, 32, 1};
  const size_t plus = param.find('+');
  const DLDataType dt = dtype_named(param.substr(0, plus));
  const DLDataType gdt = plus == std::string::npos ? dt : dtype_named(param.substr(plus + 1));
  const size_t elem = dt.bits / 8, grad_elem = gdt.bits / 8;
  std::vector<uint8_t> p(size_t(n) * elem), g(size_t(n) * grad_elem);
  fill(p, dt, 0.1f, 1);
  fill(g, gdt, 0.01f, 2);
  const size_t slash = name.find('/');
  const std::string base = name.substr(0, slash), rounding = slash == std::string::npos ? "" : name.substr(slash + 1);
  const bool amsgrad = base == "amsgrad";
  lbopt_optimizer_config cfg;
  lbopt_optimizer_config_init(&cfg, sizeof cfg, lbopt_optimizer(find_name(optimizer_name, amsgrad ? "adamw" : base)));
  cfg.state_kind = lbopt_state_kind(kind);
  cfg.weight_decay = 0.01;
  if (amsgrad) cfg.flags |= LBOPT_FLAG_AMSGRAD;
  if (rounding == "stochastic") cfg.flags |= LBOPT_FLAG_STATE_STOCHASTIC_ROUND;
  else if (rounding == "nearest") cfg.flags |= LBOPT_FLAG_STATE_NEAREST_ROUND;
  else if (!rounding.empty()) {
    fprintf(stderr, "unknown rounding %s\n", rounding.c_str());
    exit(2);
  }
  lbopt_state_info infos[LBOPT_MAX_STATES];
  size_t n_states = 0;
  if (lbopt_optimizer_states(&cfg, infos, &n_states) != LBOPT_OK) {
    fprintf(stderr, "%s\n", lbopt_last_error());
    exit(1);
  }
  lbopt_layout l;
  lbopt_state_layout(lbopt_state_kind(kind), n, &l, sizeof l);
  int64_t cn = l.codes_numel, sn = l.scales_numel;
  std::vector<std::vector<uint8_t>> codes(n_states, std::vector<uint8_t>(size_t(l.codes_bytes)));
  std::vector<std::vector<float>> scales(n_states, std::vector<float>(size_t(std::max<int64_t>(sn, 1))));
  std::vector<DLTensor> tc(n_states), ts(n_states);
  DLTensor tp = view(p.data(), &n, dt), tg = view(g.data(), &n, gdt);
  const bool plain = kind == LBOPT_STATE_FP32;
  lbopt_slot slot{sizeof slot, &tp, &tg, {}, 1};
  for (size_t k = 0; k < n_states; ++k) {
    tc[k] = view(codes[k].data(), &cn, l.codes_dtype);
    ts[k] = view(scales[k].data(), &sn, f32);
    slot.states[k] = {&tc[k], plain ? nullptr : &ts[k]};
    lbopt_state_init(cfg.state_kind, n, slot.states[k], nullptr);
  }
  int64_t step = 0;
  const auto one = [&] {
    slot.step = ++step;
    if (lbopt_step(&cfg, 1e-3, &slot, 1, nullptr) != LBOPT_OK) {
      fprintf(stderr, "%s\n", lbopt_last_error());
      exit(1);
    }
  };
  one();  // first touch and non-trivial states
  const double t = best_of(reps, one);
  const double bytes = double(n) * double(2 * elem + grad_elem) +
                       double(n_states) * (2.0 * double(l.codes_bytes) + 8.0 * double(sn));
  Row r{name, lbopt_state_kind_name(lbopt_state_kind(kind)), param, n, lbopt_get_num_threads(),
        t / double(n) * 1e9, bytes / t / 1e9, {}};
  r.roof = roofline(team, size_t(bytes), reps);
  return r;
}


}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> sizes{"1M", "16M"}, threads{"1", "0"}, kinds{"4bit", "8bit", "fp8", "fp32"},
      params{"fp32", "bf16"}, optimizers{"adamw", "sgd", "lion", "ademamix"};
  int reps = 5;
  const char* csv = nullptr;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--sizes") sizes = split(argv[i + 1]);
    else if (a == "--threads") threads = split(argv[i + 1]);
    else if (a == "--kinds") kinds = split(argv[i + 1]);
    else if (a == "--params") params = split(argv[i + 1]);
    else if (a == "--optimizers") optimizers = split(argv[i + 1]);
    else if (a == "--reps") reps = atoi(argv[i + 1]);
    else if (a == "--csv") csv = argv[i + 1];
    else if (a == "--isa") {
      int64_t target = 0;
      for (int64_t t = 1; t != 0 && t <= HWY_SCALAR; t <<= 1)
        if (std::string(hwy::TargetName(t)) == argv[i + 1]) target = t;
      if (!(target & hwy::SupportedTargets())) {
        fprintf(stderr, "instruction set %s not supported here\n", argv[i + 1]);
        return 2;
      }
      hwy::SetSupportedTargetsForTest(target);  // lbopt shares libhwy's dispatch state with this process
    }
    else {
      fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  FILE* out = csv ? fopen(csv, "w") : nullptr;
  if (out) fprintf(out, "optimizer,kind,param,numel,threads,ns_per_elem,gbs,memcpy_gbs,inplace_gbs\n");
  printf("cpu kernels: %s\n", lbopt_build_info());
  printf("%-17s %-5s %-5s %11s %4s %9s %8s %8s %8s %9s %8s\n", "optimizer", "state", "param", "numel", "thr",
         "ns/elem", "GB/s", "memcpy", "x+=y", "vs roof", "vs adamw");
  for (const std::string& th : threads) {
    if (lbopt_set_num_threads(atoi(th.c_str())) != LBOPT_OK) return 1;
    Team team(lbopt_get_num_threads());
    for (const std::string& size : sizes)
      for (const std::string& k : kinds)
        for (const std::string& pd : params) {
          double adamw_ns = 0;
          for (const std::string& o : optimizers) {
            const Row r = run(o, find_name(kind_name, k), pd, parse_size(size), reps, team);
            if (r.optimizer == "adamw") adamw_ns = r.ns;
            char vs[16] = "";
            if (adamw_ns > 0) snprintf(vs, sizeof vs, "%.2fx", r.ns / adamw_ns);
            printf("%-17s %-5s %-5s %11lld %4d %9.3f %8.2f %8.2f %8.2f %8.1f%% %8s\n", r.optimizer.c_str(),
                   r.kind.c_str(), r.param.c_str(), (long long)r.numel, r.threads, r.ns, r.gbs, r.roof.memcpy_gbs,
                   r.roof.inplace_gbs, 100.0 * r.gbs / r.roof.best(), vs);
            fflush(stdout);
            if (out)
              fprintf(out, "%s,%s,%s,%lld,%d,%.4f,%.3f,%.3f,%.3f\n", r.optimizer.c_str(), r.kind.c_str(),
                      r.param.c_str(), (long long)r.numel, r.threads, r.ns, r.gbs, r.roof.memcpy_gbs,
                      r.roof.inplace_gbs);
          }
        }
  }
  if (out) fclose(out);
  return 0;
}

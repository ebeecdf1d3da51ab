// lbopt's optimizers for libtorch C++ programs: torch::optim::Optimizer subclasses with the names and defaults of
// lbopt.torch's (AdamW4bit ... AdEMAMix, Muon4bit ... Muon), stepping every param group through lbopt_step on
// DLPack views of the tensors, with no Python at run time. Given the same params, grads and lr sequence they give
// the same params and states as lbopt.torch, bit for bit: they pass the library the same config, seed, slots and
// step counts (and Muon runs the same ATen operations after it).
//
// Header-only: a program includes it and links liblbopt and libtorch, built with libtorch's flags (C++20, its
// _GLIBCXX_USE_CXX11_ABI). Define LBOPT_TORCH_CUDA=1 where libtorch has CUDA, so that CUDA steps run on the current
// stream (the header then needs the CUDA toolkit's headers).
//
//     auto opt = lbopt::torch::AdamW4bit(model->parameters(), lbopt::torch::AdamW4bit::options(1e-3)
//                                                                  .set("weight_decay", 0.1));
//     loss.backward(); opt.step(); opt.zero_grad();
//     torch::save(opt, "opt.pt");  // and torch::load(opt, "opt.pt")
//
// Options name the optimizer's hyper-parameters and flags as the library does (lbopt_optimizer_fields, and the
// flags every optimizer reads): this header never lists them, so a field the library adds is served as it is.
// Muon's update runs partly in torch, as in lbopt.torch: its settings there are the only ones named here
// (detail::settings_of).
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>
#include <torch/torch.h>

#ifndef LBOPT_TORCH_CUDA
#define LBOPT_TORCH_CUDA 0
#endif
#if LBOPT_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "lbopt.h"

namespace lbopt::torch {

namespace detail {

// The library's status as the exception lbopt.torch raises for it (TypeError, ValueError, else RuntimeError),
// carrying the library's message after prefix. The message is read at once: the next lbopt call replaces it.
inline void check(lbopt_status status, const std::string& prefix = "lbopt: ") {
  if (status == LBOPT_OK) return;
  const char* text = lbopt_last_error();
  const std::string message = prefix + (text && *text ? text : lbopt_status_string(status));
  TORCH_CHECK_TYPE(status != LBOPT_ERR_DTYPE && status != LBOPT_ERR_STRUCT_SIZE, message);
  TORCH_CHECK_VALUE(status > LBOPT_ERR_NONFINITE, message);
  TORCH_CHECK(false, message);
}

// The flags every optimizer reads, by the names lbopt_optimizer_config_set takes (lbopt_optimizer_fields lists
// only an optimizer's own).
inline constexpr const char* kCommonFlags[] = {"maximize", "bf16_stochastic_round", "skip_nonfinite",
                                               "state_stochastic_round", "state_nearest_round"};

// Every name an optimizer's config takes, with its default: its own fields and flags, then the common flags.
inline std::vector<std::pair<std::string, double>> defaults_of(lbopt_optimizer optimizer) {
  const lbopt_field_info* fields = nullptr;
  size_t n = 0;
  check(lbopt_optimizer_fields(optimizer, &fields, &n));
  std::vector<std::pair<std::string, double>> out;
  for (size_t k = 0; k < n; ++k) out.emplace_back(fields[k].name, fields[k].default_value);
  for (const char* flag : kCommonFlags) out.emplace_back(flag, 0.0);
  return out;
}

inline lbopt_optimizer_config config_init(lbopt_optimizer optimizer) {
  lbopt_optimizer_config config;
  check(lbopt_optimizer_config_init(&config, sizeof config, optimizer));
  return config;
}

inline lbopt_layout layout_of(lbopt_state_kind kind, int64_t numel) {
  lbopt_layout layout;
  check(lbopt_state_layout(kind, numel, &layout, sizeof layout));
  return layout;
}

inline std::string kind_name(lbopt_state_kind kind) {
  const char* name = lbopt_state_kind_name(kind);
  return name ? name : std::to_string(int64_t(kind));
}

inline std::string shape_of(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

// How lbopt.torch names a param in a message.
inline std::string what(const at::Tensor& p) { return "a param of shape " + shape_of(p); }

// Dims ordered from the largest stride to the smallest (ties by index), as torch.Tensor.dim_order: the memory
// order the step walks a tensor in, which its states follow.
inline std::vector<int64_t> dim_order(const at::Tensor& t) {
  std::vector<int64_t> order(size_t(t.dim()));
  for (size_t d = 0; d < order.size(); ++d) order[d] = int64_t(d);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
  return order;
}

inline bool is_identity(const std::vector<int64_t>& order) {
  for (size_t d = 0; d < order.size(); ++d)
    if (order[d] != int64_t(d)) return false;
  return true;
}

// Whether two stride lists of one shape put every element at the same memory position (a dim of extent 1 may
// carry any stride).
inline bool same_layout(at::IntArrayRef strides, at::IntArrayRef other, at::IntArrayRef shape) {
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != 1 && strides[d] != other[d]) return false;
  return true;
}

// Whether t lies in memory in dim order `order` (empty: row-major).
inline bool follows(const at::Tensor& t, std::vector<int64_t> order) {
  if (order.empty())
    for (int64_t d = 0; d < t.dim(); ++d) order.push_back(d);
  if (order.size() != size_t(t.dim())) return false;
  std::vector<int64_t> strides(order.size());
  int64_t s = 1;
  for (auto d = order.rbegin(); d != order.rend(); ++d) {
    strides[size_t(*d)] = s;
    s *= t.size(*d);
  }
  return same_layout(t.strides(), strides, t.sizes());
}

inline DLDataType dtype_of(c10::ScalarType st) {
  const auto bits = uint8_t(c10::elementSize(st) * 8);
  if (st == c10::ScalarType::BFloat16) return {kDLBfloat, bits, 1};
  if (c10::isComplexType(st)) return {kDLComplex, bits, 1};
  if (c10::isFloatingType(st)) return {kDLFloat, bits, 1};
  if (st == c10::ScalarType::Bool) return {6, bits, 1};  // DLPack's kDLBool, which older dlpack.h lack
  return {c10::isSignedType(st) ? uint8_t(kDLInt) : uint8_t(kDLUInt), bits, 1};
}

// A DLTensor view of a strided CPU or CUDA tensor (no copy); the library judges its dtype, shape and strides.
// The libtorch plugin's kernels take the same view.
inline DLTensor view_of(const at::Tensor& t) {
  TORCH_CHECK_TYPE(t.layout() == c10::kStrided, "lbopt: ", t.layout(),
                   " tensors are not supported; gradients and params must be dense");
  DLTensor v{};
  if (t.device().is_cpu()) v.device = {kDLCPU, 0};
  else if (t.device().is_cuda()) v.device = {kDLCUDA, t.device().index()};
  else TORCH_CHECK_VALUE(false, "lbopt: tensors on ", t.device(), " are not supported (cpu or cuda)");
  v.data = t.data_ptr();
  v.ndim = int32_t(t.dim());
  v.dtype = dtype_of(t.scalar_type());
  v.shape = const_cast<int64_t*>(t.sizes().data());
  v.strides = const_cast<int64_t*>(t.strides().data());
  return v;
}

inline void* stream_of(const c10::Device& device) {
#if LBOPT_TORCH_CUDA
  if (device.is_cuda()) return c10::cuda::getCurrentCUDAStream(device.index()).stream();
#else
  (void)device;
#endif
  return nullptr;
}

// A setting the binding reads itself, for the part of an update that runs in torch: the library has no field for
// it. A number, or a string for a choice; check refuses a value with lbopt.torch's message.
struct Setting {
  std::string name;
  c10::IValue value;
  void (*check)(const c10::IValue& value);
};

inline void any_number(const c10::IValue&) {}

inline void muon_weight_decay(const c10::IValue& v) {
  TORCH_CHECK_VALUE(v.toDouble() >= 0.0, "weight decay should be >= 0 but is: ", v.toDouble());
}

// A count of iterations: range(ns_steps) in Python, which needs a whole number.
inline void muon_ns_steps(const c10::IValue& v) {
  const double n = v.toDouble();
  TORCH_CHECK_VALUE(!(n >= 100), "Number of steps must be less than 100 for computational efficiency");
  TORCH_CHECK_VALUE(n >= 0 && n == std::floor(n), "lbopt: ns_steps must be a whole number >= 0, not ", n);
}

inline constexpr const char* kMuonAdjustLr[] = {"original", "match_rms_adamw", "spectral_unclamped"};

inline void muon_adjust_lr_fn(const c10::IValue& v) {
  const std::string& fn = v.toStringRef();
  TORCH_CHECK_VALUE(std::find(std::begin(kMuonAdjustLr), std::end(kMuonAdjustLr), fn) != std::end(kMuonAdjustLr),
                    "Adjust learning rate function ", fn, " is not supported");
}

// The settings of an optimizer that run in torch, with lbopt.torch's defaults: only Muon's Newton-Schulz iteration
// (ns_coefficients as ns_a, ns_b, ns_c), its lr adjustment and its decoupled weight decay.
inline std::vector<Setting> settings_of(lbopt_optimizer optimizer) {
  if (optimizer != LBOPT_OPTIMIZER_MUON) return {};
  return {
      {"weight_decay", 0.1, muon_weight_decay},
      {"ns_a", 3.4445, any_number},
      {"ns_b", -4.7750, any_number},
      {"ns_c", 2.0315, any_number},
      {"eps", 1e-7, any_number},
      {"ns_steps", 5.0, muon_ns_steps},
      {"adjust_lr_fn", std::string("original"), muon_adjust_lr_fn},
  };
}

// The library's flags the binding cannot honour: torch updates Muon's params, and neither rounds stochastically to
// bfloat16 nor skips a non-finite grad.
inline std::vector<std::string> refused_flags_of(lbopt_optimizer optimizer) {
  if (optimizer != LBOPT_OPTIMIZER_MUON) return {};
  return {"bf16_stochastic_round", "skip_nonfinite"};
}

}  // namespace detail

// ---- options ---------------------------------------------------------------------------------------------------

// The settings of a param group: the optimizer, its state kind, lr, seed, min_quant_size, the optimizer's fields
// and flags by the library's names (a flag is 0 or 1) and, for Muon, the settings of its update in torch
// (detail::settings_of). set() checks a value with the library's own rules and messages (lbopt.torch's for the
// torch settings); config() builds the lbopt_optimizer_config a step passes.
//
// Options remember what was set on them (the state kind and lr given to a constructor, every setter's call since),
// so that a param group's options override the optimizer's defaults in exactly that, as a param group dict does
// in Python: libtorch's own optimizers guess it by comparing each value with its class default instead, which
// takes a group's setting equal to that default for no setting.
class Options : public ::torch::optim::OptimizerCloneableOptions<Options> {
 public:
  // AdamW with 4-bit states; libtorch's checkpoint loading makes Options(0) and then reads every setting.
  Options() : Options(LBOPT_OPTIMIZER_ADAMW, LBOPT_STATE_4BIT, 1e-3) { set_.clear(); }
  explicit Options(double lr) : Options(LBOPT_OPTIMIZER_ADAMW, LBOPT_STATE_4BIT, lr) {}

  Options(lbopt_optimizer optimizer, lbopt_state_kind kind, double lr)
      : optimizer_(optimizer), values_(detail::defaults_of(optimizer)), own_(detail::settings_of(optimizer)) {
    for (const detail::Setting& s : own_)  // the archive and set() tell the two apart by name
      TORCH_INTERNAL_ASSERT(field_index(s.name) < 0, "lbopt: ", s.name, " is a library field and a torch setting");
    state_kind(kind);
    this->lr(lr);
  }

  lbopt_optimizer optimizer() const { return optimizer_; }
  lbopt_state_kind state_kind() const { return kind_; }
  Options& state_kind(lbopt_state_kind kind) {
    detail::layout_of(kind, 0);  // the library refuses a value that is no kind
    kind_ = kind;
    return mark("state_kind");
  }

  double lr() const { return lr_; }
  Options& lr(double lr) {
    lr_ = lr;
    return mark("lr");
  }
  double get_lr() const override { return lr_; }
  void set_lr(const double lr) override { this->lr(lr); }

  // The stochastic rounding key of every step (bf16 params, first-moment codes), as lbopt.torch's seed.
  uint64_t seed() const { return seed_; }
  Options& seed(uint64_t seed) {
    seed_ = seed;
    return mark("seed");
  }

  // Params with fewer elements keep fp32 states, as lbopt.torch's min_quant_size (default 4096, as torchao and
  // bitsandbytes): a small tensor's block scales would cost more than its fp32 state saves.
  int64_t min_quant_size() const { return min_quant_size_; }
  Options& min_quant_size(int64_t n) {
    TORCH_CHECK_VALUE(n >= 0, "lbopt: min_quant_size must be >= 0, not ", n);
    min_quant_size_ = n;
    return mark("min_quant_size");
  }

  // A field or flag by its library name, or a torch setting; a name this optimizer does not read, or a value out
  // of its range, throws with the library's message.
  Options& set(const std::string& name, double value) { return set_value(name, value); }
  // A torch setting that is a choice of names (Muon's adjust_lr_fn).
  Options& set(const std::string& name, const std::string& value) { return set_value(name, value); }
  double get(const std::string& name) const {
    const c10::IValue v = value_of(name);
    TORCH_CHECK_TYPE(v.isDouble(), "lbopt: ", name, " is a name, not a number (get_string)");
    return v.toDouble();
  }
  std::string get_string(const std::string& name) const {
    const c10::IValue v = value_of(name);
    TORCH_CHECK_TYPE(v.isString(), "lbopt: ", name, " is a number, not a name (get)");
    return v.toStringRef();
  }
  // Every name set() takes: the library's, in its order, then the torch settings.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& nv : values_) out.push_back(nv.first);
    for (const detail::Setting& s : own_) out.push_back(s.name);
    return out;
  }

  // Whether a setting ("lr", "seed", "min_quant_size", "state_kind" or a name of names()) was set on these options.
  bool is_set(const std::string& name) const { return std::find(set_.begin(), set_.end(), name) != set_.end(); }
  // Every value stays, but counts as a default from now on (a class's options() are its defaults).
  Options& forget_set() {
    set_.clear();
    return *this;
  }
  // These options with what `group` set on it: the settings of a param group given these defaults.
  Options merged(const Options& group) const {
    TORCH_CHECK_VALUE(group.optimizer_ == optimizer_, "lbopt: a param group's options are for ",
                      lbopt_optimizer_name(group.optimizer_), ", this optimizer is ", lbopt_optimizer_name(optimizer_));
    Options out = *this;
    for (const std::string& name : group.set_) {
      if (name == "lr") out.lr(group.lr_);
      else if (name == "seed") out.seed(group.seed_);
      else if (name == "state_kind") out.state_kind(group.kind_);
      else if (name == "min_quant_size") out.min_quant_size(group.min_quant_size_);
      else out.set_value(name, group.value_of(name));
    }
    return out;
  }

  // The config of a step of params with states of `kind`: the optimizer's defaults, then every name's value.
  lbopt_optimizer_config config(lbopt_state_kind kind) const {
    lbopt_optimizer_config config = detail::config_init(optimizer_);
    config.state_kind = kind;
    config.seed = seed_;
    for (const auto& [name, value] : values_) detail::check(lbopt_optimizer_config_set(&config, name.c_str(), value));
    return config;
  }
  lbopt_optimizer_config config() const { return config(kind_); }

  // The library's checks of the settings and lr together (rules across fields included).
  void validate() const {
    const lbopt_optimizer_config config = this->config(LBOPT_STATE_FP32);
    detail::check(lbopt_optimizer_config_validate(&config, lr_));
  }

  void serialize(::torch::serialize::OutputArchive& archive) const override {
    archive.write("optimizer", c10::IValue(int64_t(optimizer_)));
    archive.write("state_kind", c10::IValue(int64_t(kind_)));
    archive.write("lr", c10::IValue(lr_));
    archive.write("seed", c10::IValue(int64_t(seed_)));  // the bits of the uint64
    archive.write("min_quant_size", c10::IValue(min_quant_size_));
    for (const auto& [name, value] : values_) archive.write(name, c10::IValue(value));
    for (const detail::Setting& s : own_) archive.write(s.name, s.value);
  }

  void serialize(::torch::serialize::InputArchive& archive) override {
    const auto optimizer = lbopt_optimizer(read(archive, "optimizer").toInt());
    TORCH_CHECK_VALUE(lbopt_optimizer_name(optimizer), "lbopt: saved optimizer ", int64_t(optimizer),
                      " is no lbopt_optimizer");
    Options loaded(optimizer, lbopt_state_kind(read(archive, "state_kind").toInt()),
                   read(archive, "lr").toDouble());
    loaded.seed(uint64_t(read(archive, "seed").toInt()));
    loaded.min_quant_size(read(archive, "min_quant_size").toInt());
    for (const std::string& key : archive.keys()) {
      if (key == "optimizer" || key == "state_kind" || key == "lr" || key == "seed" || key == "min_quant_size")
        continue;
      loaded.set_value(key, read(archive, key));  // a name this optimizer does not read throws
    }
    *this = std::move(loaded);
  }

 private:
  Options& mark(const std::string& name) {
    if (!is_set(name)) set_.push_back(name);
    return *this;
  }

  // The index of a library name in values_, or of a torch setting in own_; -1 where there is none.
  ptrdiff_t field_index(const std::string& name) const {
    for (size_t i = 0; i < values_.size(); ++i)
      if (values_[i].first == name) return ptrdiff_t(i);
    return -1;
  }
  ptrdiff_t own_index(const std::string& name) const {
    for (size_t i = 0; i < own_.size(); ++i)
      if (own_[i].name == name) return ptrdiff_t(i);
    return -1;
  }

  c10::IValue value_of(const std::string& name) const {
    if (const ptrdiff_t i = own_index(name); i >= 0) return own_[size_t(i)].value;
    if (const ptrdiff_t i = field_index(name); i >= 0) return values_[size_t(i)].second;
    unknown(name);
  }

  Options& set_value(const std::string& name, const c10::IValue& value) {
    if (const ptrdiff_t i = own_index(name); i >= 0) return set_own(own_[size_t(i)], value);
    const ptrdiff_t i = field_index(name);
    if (i < 0) unknown(name);
    TORCH_CHECK_TYPE(value.isDouble(), "lbopt: ", name, " takes a number");
    check_supported(name, value.toDouble());
    lbopt_optimizer_config scratch = detail::config_init(optimizer_);
    detail::check(lbopt_optimizer_config_set(&scratch, name.c_str(), value.toDouble()));
    values_[size_t(i)].second = value.toDouble();
    return mark(name);
  }

  Options& set_own(detail::Setting& s, const c10::IValue& value) {
    TORCH_CHECK_TYPE(value.isString() == s.value.isString(), "lbopt: ", s.name, " takes ",
                     s.value.isString() ? "a name" : "a number");
    s.check(value);
    s.value = value;
    return mark(s.name);
  }

  // A library flag turned on that the binding cannot honour for this optimizer (detail::refused_flags_of).
  void check_supported(const std::string& name, double value) const {
    const auto refused = detail::refused_flags_of(optimizer_);
    TORCH_CHECK_VALUE(value == 0.0 || std::find(refused.begin(), refused.end(), name) == refused.end(), "lbopt: ",
                      name, " is not supported by ", lbopt_optimizer_name(optimizer_), " (torch updates the params)");
  }

  // Throws the library's message for a name the optimizer does not read.
  [[noreturn]] void unknown(const std::string& name) const {
    lbopt_optimizer_config scratch = detail::config_init(optimizer_);
    detail::check(lbopt_optimizer_config_set(&scratch, name.c_str(), 0.0));
    TORCH_CHECK_VALUE(false, "lbopt: ", lbopt_optimizer_name(optimizer_), " has no option ", name);
  }

  static c10::IValue read(::torch::serialize::InputArchive& archive, const std::string& key) {
    c10::IValue value;
    TORCH_CHECK_VALUE(archive.try_read(key, value), "lbopt: the saved options have no ", key);
    return value;
  }

  lbopt_optimizer optimizer_;
  lbopt_state_kind kind_ = LBOPT_STATE_4BIT;
  std::vector<std::pair<std::string, double>> values_;  // every name the config takes, in the library's order
  std::vector<detail::Setting> own_;                    // the settings of the optimizer's update in torch
  double lr_;
  uint64_t seed_ = 0;
  int64_t min_quant_size_ = 4096;
  std::vector<std::string> set_;  // what was set, in order
};

// ---- per-param state -------------------------------------------------------------------------------------------

// A param's states as lbopt.torch keeps them: the steps made, the state kind (fp32 below min_quant_size) and, for
// each state the optimizer lists (lbopt_optimizer_states), "<name>_codes" and (quantized kinds) "<name>_scales",
// 1-D tensors of lbopt_state_layout's sizes in the param's memory order. dim_order is that order where it is not
// row-major (empty otherwise).
class ParamState : public ::torch::optim::OptimizerCloneableParamState<ParamState> {
 public:
  int64_t step() const { return step_; }
  ParamState& step(int64_t step) {
    step_ = step;
    return *this;
  }
  lbopt_state_kind state_kind() const { return kind_; }
  ParamState& state_kind(lbopt_state_kind kind) {
    kind_ = kind;
    return *this;
  }
  const std::vector<int64_t>& dim_order() const { return dim_order_; }
  ParamState& dim_order(std::vector<int64_t> order) {
    dim_order_ = std::move(order);
    return *this;
  }

  // The codes or scales of a state by its name ("exp_avg"); undefined where the state has none.
  at::Tensor codes(const std::string& state) const { return tensor(state + "_codes"); }
  at::Tensor scales(const std::string& state) const { return tensor(state + "_scales"); }
  at::Tensor tensor(const std::string& key) const {
    const auto it = tensors_.find(key);
    return it == tensors_.end() ? at::Tensor() : it->second;
  }
  ParamState& tensor(const std::string& key, at::Tensor t) {
    tensors_[key] = std::move(t);
    return *this;
  }
  // Every tensor by its key ("exp_avg_codes", ...).
  const std::map<std::string, at::Tensor>& tensors() const { return tensors_; }

  void serialize(::torch::serialize::OutputArchive& archive) const override {
    archive.write("step", c10::IValue(step_));
    archive.write("state_kind", c10::IValue(int64_t(kind_)));
    if (!dim_order_.empty()) archive.write("dim_order", c10::IValue(dim_order_));
    for (const auto& [key, t] : tensors_) archive.write(key, t, /*is_buffer=*/true);
  }

  void serialize(::torch::serialize::InputArchive& archive) override {
    ParamState loaded;
    for (const std::string& key : archive.keys()) {
      c10::IValue value;
      archive.read(key, value);
      if (key == "step") loaded.step_ = value.toInt();
      else if (key == "state_kind") loaded.kind_ = lbopt_state_kind(value.toInt());
      else if (key == "dim_order") loaded.dim_order_ = value.toIntVector();
      else if (value.isTensor()) loaded.tensors_[key] = value.toTensor();
      else TORCH_CHECK_VALUE(false, "lbopt: unknown key ", key, " in a saved param state");
    }
    *this = std::move(loaded);
  }

 private:
  int64_t step_ = 0;
  lbopt_state_kind kind_ = LBOPT_STATE_FP32;
  std::vector<int64_t> dim_order_;
  std::map<std::string, at::Tensor> tensors_;
};

// ---- the optimizer ---------------------------------------------------------------------------------------------

// Any lbopt optimizer; the named classes below fix the optimizer, its state kind and lbopt.torch's defaults.
class LowBitOptimizer : public ::torch::optim::Optimizer {
 public:
  using OptimizerParamGroup = ::torch::optim::OptimizerParamGroup;

  LowBitOptimizer(const std::vector<OptimizerParamGroup>& groups, Options defaults)
      : Optimizer(std::vector<OptimizerParamGroup>{}, std::make_unique<Options>(std::move(defaults))) {
    for (const auto& group : groups) add_param_group(group);
  }
  LowBitOptimizer(std::vector<at::Tensor> params, Options defaults)
      : LowBitOptimizer({OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

  // A group's options are the defaults with what the group's own options set (Options::merged; libtorch's
  // Optimizer::add_param_group merges only its own types' options, and gives any other group the defaults). The
  // group is checked as lbopt.torch checks it: by the library's rules, and no param twice.
  void add_param_group(const OptimizerParamGroup& group) {
    Options options = defaults_options();
    if (group.has_options()) {
      const auto* own = dynamic_cast<const Options*>(&group.options());
      TORCH_CHECK_TYPE(own, "lbopt: a param group's options must be lbopt::torch::Options");
      options = options.merged(*own);
    }
    options.validate();
    check_unique(group.params());
    check_params(group.params());
    Optimizer::add_param_group(OptimizerParamGroup(group.params()));
    param_groups_.back().set_options(std::make_unique<Options>(std::move(options)));
  }

  const Options& defaults_options() const { return static_cast<const Options&>(defaults()); }
  static Options& options_of(OptimizerParamGroup& group) { return static_cast<Options&>(group.options()); }
  static const Options& options_of(const OptimizerParamGroup& group) {
    return static_cast<const Options&>(group.options());
  }

  // The param's state, or nullptr before its first step.
  ParamState* state_of(const at::Tensor& param) const {
    const auto it = state_.find(param.unsafeGetTensorImpl());
    return it == state_.end() ? nullptr : static_cast<ParamState*>(it->second.get());
  }

  // One step of every param with a grad: one lbopt_step per param group and state kind (and device), every call
  // checked before the first writes, so that a refused step (it throws the library's message) writes nothing and
  // creates no state. Each group's lr is read from its options now, as an LR scheduler or the caller left it.
  at::Tensor step(LossClosure closure = nullptr) override {
    at::Tensor loss;
    if (closure) {
      at::AutoGradMode grad_on(true);
      loss = closure();
    }
    at::NoGradGuard no_grad;
    Pending pending;
    std::vector<Call> calls;
    for (auto& group : param_groups_) plan_group(group, pending, calls);
    for (Call& call : calls) call.build();
    run(calls, pending);
    finish(calls);
    return loss;
  }

  void save(::torch::serialize::OutputArchive& archive) const override {
    ::torch::optim::serialize<ParamState, Options>(archive, *this);
  }

  // Reads a checkpoint of save() into an optimizer over the same params, then checks it before anything here
  // changes (a refused checkpoint leaves the optimizer as it was): each group's options are for this optimizer and
  // its state kind (the kind is the optimizer's, as in lbopt.torch; the other settings are the checkpoint's), and
  // each state is what a step would make for its param (kind, names, lbopt_state_layout's sizes, dtypes, scales).
  void load(::torch::serialize::InputArchive& archive) override {
    std::vector<OptimizerParamGroup> groups;
    for (const auto& group : param_groups_) groups.emplace_back(group.params());
    LowBitOptimizer loaded(groups, defaults_options());
    ::torch::optim::serialize<ParamState, Options>(archive, loaded);
    loaded.check_loaded(*this);
    for (size_t i = 0; i < param_groups_.size(); ++i)
      param_groups_[i].set_options(loaded.param_groups_[i].options().clone());
    state_ = std::move(loaded.state_);
  }

 protected:
  // One lbopt_step: the params of one group with states of one kind on one device, in the group's order.
  struct Call {
    // The config and lr of this step of the group's options.
    Call(c10::Device device, lbopt_state_kind kind, const Options& options, std::vector<std::string> names)
        : device(device),
          kind(kind),
          group(&options),
          config(options.config(kind)),
          lr(options.get_lr()),
          read_skipped(options.get("skip_nonfinite") != 0.0),
          state_names(std::move(names)) {}

    c10::Device device;
    lbopt_state_kind kind;
    const Options* group;  // the group's options, which outlive the step
    lbopt_optimizer_config config;
    double lr;
    bool read_skipped;  // only a skip holds a step count back; reading the flags from a GPU synchronizes
    std::vector<std::string> state_names;
    std::vector<at::Tensor> params, grads;
    std::vector<at::Tensor> targets;  // what each slot's param points to (slot_param)
    std::vector<ParamState*> states;
    std::vector<DLTensor> views;
    std::vector<lbopt_slot> slots;
    at::Tensor skipped;
    DLTensor skipped_view{};
    lbopt_step_options options{};

    // The views and slots; built once every call is planned, and never moved after.
    void build() {
      const size_t n = params.size(), k = state_names.size();
      views.reserve(n * (2 + 2 * k));
      slots.assign(n, lbopt_slot{});
      for (size_t i = 0; i < n; ++i) {
        lbopt_slot& slot = slots[i];
        slot.struct_size = sizeof(lbopt_slot);
        slot.param = add(targets[i]);
        slot.grad = add(grads[i]);
        for (size_t s = 0; s < k; ++s) {
          slot.states[s].codes = add(states[i]->codes(state_names[s]));
          slot.states[s].scales = kind == LBOPT_STATE_FP32 ? nullptr : add(states[i]->scales(state_names[s]));
        }
        slot.step = states[i]->step() + 1;
      }
      skipped = at::zeros({int64_t(n)}, at::TensorOptions().dtype(at::kByte).device(device));
      skipped_view = detail::view_of(skipped);
      detail::check(lbopt_step_options_init(&options, sizeof options));
      options.skipped = &skipped_view;
      options.flags = LBOPT_STEP_DEVICES_KNOWN;  // torch knows each tensor's device: no runtime query per pointer
      options.stream = detail::stream_of(device);
    }

    const DLTensor* add(const at::Tensor& t) {
      views.push_back(detail::view_of(t));
      return &views.back();
    }

    void validate() const { checked(lbopt_step_validate(&config, lr, slots.data(), slots.size(), &options)); }

    // The step (the library validates it before it writes), then the step counts of the slots it stepped.
    void run() {
      checked(lbopt_step(&config, lr, slots.data(), slots.size(), &options));
      const at::Tensor flags = read_skipped ? skipped.cpu() : at::Tensor();
      const uint8_t* skip = read_skipped ? flags.data_ptr<uint8_t>() : nullptr;
      for (size_t i = 0; i < states.size(); ++i)
        if (!skip || !skip[i]) states[i]->step(states[i]->step() + 1);
    }

    // A refused slot's message names its param, as lbopt.torch's does.
    void checked(lbopt_status status) const {
      if (status == LBOPT_OK) return;
      const std::string message = lbopt_last_error();
      size_t i = 0;
      if (std::sscanf(message.c_str(), "slots[%zu]", &i) == 1 && i < params.size())
        detail::check(status, "lbopt: " + detail::what(params[i]) + ": ");
      detail::check(status);
    }
  };

  // Refuses params this optimizer cannot step, where a group is added (none: the library judges them per step).
  virtual void check_params(const std::vector<at::Tensor>&) const {}
  // The tensor the library steps in p's slot, after p's checks: p itself, which the step updates; Muon's is a
  // direction the library writes and finish() applies.
  virtual at::Tensor slot_param(const at::Tensor& p) const { return p; }
  // What a step does once every call has run (Muon's update in torch).
  virtual void finish(std::vector<Call>&) {}

 private:
  // New states of this step, committed once the first call has run (a refused step creates none).
  using Pending = std::vector<std::pair<void*, std::unique_ptr<ParamState>>>;

  // One call cannot write a param twice, and two groups would step it twice.
  void check_unique(const std::vector<at::Tensor>& params) const {
    std::vector<const void*> seen;
    for (const auto& group : param_groups_)
      for (const auto& p : group.params()) seen.push_back(p.unsafeGetTensorImpl());
    for (const auto& p : params) {
      const void* key = p.unsafeGetTensorImpl();
      TORCH_CHECK_VALUE(std::find(seen.begin(), seen.end(), key) == seen.end(), "lbopt: duplicate param: ",
                        detail::what(p), " appears twice in the param groups");
      seen.push_back(key);
    }
  }

  // The names of the states a step of these options keeps, in slot order.
  static std::vector<std::string> state_names(const Options& options) {
    const lbopt_optimizer_config config = options.config(LBOPT_STATE_FP32);
    lbopt_state_info infos[LBOPT_MAX_STATES];
    size_t n = 0;
    detail::check(lbopt_optimizer_states(&config, infos, &n));
    std::vector<std::string> out;
    for (size_t k = 0; k < n; ++k) out.emplace_back(infos[k].name);
    return out;
  }

  // The zero state of one moment of p: codes and, for quantized kinds, scales (lbopt_state_init).
  static void zero_state(ParamState& st, const at::Tensor& p, const std::string& name) {
    const lbopt_state_kind kind = st.state_kind();
    const lbopt_layout layout = detail::layout_of(kind, p.numel());
    const auto on = at::TensorOptions().device(p.device());
    at::Tensor codes = at::empty({layout.codes_numel}, on.dtype(kind == LBOPT_STATE_FP32 ? at::kFloat : at::kByte));
    at::Tensor scales;
    if (kind != LBOPT_STATE_FP32) scales = at::empty({layout.scales_numel}, on.dtype(at::kFloat));
    DLTensor codes_view = detail::view_of(codes), scales_view{};
    lbopt_state state{&codes_view, nullptr};
    if (scales.defined()) {
      scales_view = detail::view_of(scales);
      state.scales = &scales_view;
    }
    detail::check(lbopt_state_init(kind, p.numel(), state, detail::stream_of(p.device())));
    st.tensor(name + "_codes", codes);
    if (scales.defined()) st.tensor(name + "_scales", scales);
  }

  static lbopt_state_kind kind_for(const at::Tensor& p, const Options& options) {
    return p.numel() < options.min_quant_size() ? LBOPT_STATE_FP32 : options.state_kind();
  }

  // The state p steps with: its own; a copy given the states the group now needs and it lacks (amsgrad or
  // momentum turned on since: they start at zero); or a fresh one, fp32 below min_quant_size. New ones go to
  // pending.
  ParamState* state_for(const at::Tensor& p, const Options& options, const std::vector<std::string>& names,
                        Pending& pending) {
    ParamState* own = state_of(p);
    std::unique_ptr<ParamState> fresh;
    if (!own) {
      fresh = std::make_unique<ParamState>();
      fresh->state_kind(kind_for(p, options));
      const std::vector<int64_t> order = detail::dim_order(p);
      if (!detail::is_identity(order)) fresh->dim_order(order);
    } else {
      TORCH_CHECK_VALUE(detail::follows(p, own->dim_order()), "lbopt: ", detail::what(p),
                        " is laid out in memory otherwise than when its states were made; its states follow the "
                        "old order (restore the layout, or load the states into an optimizer of the new model)");
    }
    for (const std::string& name : names) {
      if ((fresh ? fresh.get() : own)->codes(name).defined()) continue;
      if (!fresh) fresh = std::make_unique<ParamState>(*own);
      zero_state(*fresh, p, name);
    }
    if (!fresh) return own;
    pending.emplace_back(p.unsafeGetTensorImpl(), std::move(fresh));
    return pending.back().second.get();
  }

  // The grad the slot points to: p's own, or a copy in p's memory layout where it is laid out otherwise (as
  // torch's fused steps do).
  static at::Tensor grad_for(const at::Tensor& p) {
    const at::Tensor& g = p.grad();
    TORCH_CHECK_TYPE(g.layout() == c10::kStrided, "lbopt: ", g.layout(),
                     " gradients are not supported; lbopt steps dense tensors");
    if (g.sizes() != p.sizes() || g.device() != p.device() || detail::same_layout(g.strides(), p.strides(), p.sizes()))
      return g;
    return at::empty_like(p, g.options()).copy_(g);
  }

  void plan_group(OptimizerParamGroup& group, Pending& pending, std::vector<Call>& calls) {
    const Options& options = options_of(group);
    const std::vector<std::string> names = state_names(options);
    const size_t first = calls.size();
    for (const at::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      at::Tensor target = slot_param(p);
      ParamState* st = state_for(p, options, names, pending);
      Call* call = nullptr;
      for (size_t i = first; i < calls.size() && !call; ++i)
        if (calls[i].device == p.device() && calls[i].kind == st->state_kind()) call = &calls[i];
      if (!call) call = &calls.emplace_back(p.device(), st->state_kind(), options, names);
      call->params.push_back(p);
      call->targets.push_back(std::move(target));
      call->grads.push_back(grad_for(p));
      call->states.push_back(st);
    }
  }

  // Every call but the first is validated, the first runs (the library validates a call before it writes), the
  // new states are committed, then the others run: no call is validated twice.
  void run(std::vector<Call>& calls, Pending& pending) {
    for (size_t i = 1; i < calls.size(); ++i) calls[i].validate();
    if (!calls.empty()) calls[0].run();
    for (auto& [key, st] : pending) state_[key] = std::move(st);
    for (size_t i = 1; i < calls.size(); ++i) calls[i].run();
  }

  // After a load: each group's options are those of `current`'s group but for their settings, and valid; each
  // state what a step would make.
  void check_loaded(const LowBitOptimizer& current) {
    for (size_t i = 0; i < param_groups_.size(); ++i) {
      OptimizerParamGroup& group = param_groups_[i];
      const Options& options = options_of(group);
      const Options& own = options_of(current.param_groups_[i]);
      TORCH_CHECK_VALUE(options.optimizer() == own.optimizer(), "lbopt: the checkpoint's options are for ",
                        lbopt_optimizer_name(options.optimizer()), ", this optimizer is ",
                        lbopt_optimizer_name(own.optimizer()));
      TORCH_CHECK_VALUE(options.state_kind() == own.state_kind(), "lbopt: saved state kind ",
                        lbopt_state_kind_name(options.state_kind()), " of param group ", i,
                        " does not match this optimizer's ", lbopt_state_kind_name(own.state_kind()));
      options.validate();
      const std::vector<std::string> names = state_names(options);
      for (const at::Tensor& p : group.params())
        if (ParamState* st = state_of(p)) check_state(*st, p, options, names);
    }
  }

  static void check_state(ParamState& st, const at::Tensor& p, const Options& options,
                          const std::vector<std::string>& names) {
    const std::string what = detail::what(p);
    const lbopt_state_kind want = kind_for(p, options);
    TORCH_CHECK_VALUE(st.state_kind() == want, "lbopt: saved state kind ", detail::kind_name(st.state_kind()),
                      " does not match this optimizer's ", detail::kind_name(want), " for ", what);
    TORCH_CHECK_VALUE(st.step() >= 0, "lbopt: saved step ", st.step(), " of ", what, " is negative");
    TORCH_CHECK_VALUE(st.dim_order().empty() || is_permutation(st.dim_order(), p.dim()), "lbopt: saved dim_order of ",
                      what, " is not a permutation of its dims");
    check_tensors(st, p, names, what);
  }

  // The tensors a step of the group keeps for p, of their sizes and dtypes, moved to p's device.
  static void check_tensors(ParamState& st, const at::Tensor& p, const std::vector<std::string>& names,
                            const std::string& what) {
    const lbopt_state_kind kind = st.state_kind();
    const lbopt_layout layout = detail::layout_of(kind, p.numel());
    std::map<std::string, std::pair<int64_t, at::ScalarType>> expected;  // key -> numel, dtype
    for (const std::string& name : names) {
      expected[name + "_codes"] = {layout.codes_numel, kind == LBOPT_STATE_FP32 ? at::kFloat : at::kByte};
      if (kind != LBOPT_STATE_FP32) expected[name + "_scales"] = {layout.scales_numel, at::kFloat};
    }
    TORCH_CHECK_VALUE(st.tensors().size() == expected.size(), "lbopt: the saved state of ", what, " holds ",
                      st.tensors().size(), " tensors, a step of its group keeps ", expected.size());
    for (const auto& [key, like] : expected) {
      const at::Tensor t = st.tensor(key);
      TORCH_CHECK_VALUE(t.defined() && t.dim() == 1 && t.numel() == like.first && t.scalar_type() == like.second,
                        "lbopt: saved state ", key, " does not fit ", what, " with ", detail::kind_name(kind),
                        " states");
      check_values(key, t, kind, what);
      st.tensor(key, t.to(p.device()).contiguous());
    }
  }

  // Scales and FP8 codes that no step writes (a NaN FP8 code would poison its block's absmax).
  static void check_values(const std::string& key, const at::Tensor& t, lbopt_state_kind kind,
                           const std::string& what) {
    if (key.ends_with("_scales"))
      TORCH_CHECK_VALUE(at::all(at::isfinite(t) & (t >= 0)).item<bool>(), "lbopt: saved ", key, " of ", what,
                        " holds a negative or non-finite block scale");
    if (kind == LBOPT_STATE_FP8 && key.ends_with("_codes"))
      TORCH_CHECK_VALUE(!at::any(at::bitwise_and(t, 0x7F) == 0x7F).item<bool>(), "lbopt: saved ", key, " of ",
                        what, " holds a NaN, which no FP8 state has");
  }

  static bool is_permutation(std::vector<int64_t> order, int64_t dims) {
    std::sort(order.begin(), order.end());
    for (size_t d = 0; d < order.size(); ++d)
      if (order[d] != int64_t(d)) return false;
    return int64_t(order.size()) == dims;
  }
};

// ---- Muon ------------------------------------------------------------------------------------------------------

// Muon (Jordan et al. 2024) as lbopt.torch's LowBitMuon: the library moves each param's momentum and writes its
// update direction into a fresh bfloat16 tensor (2 bytes per param while a step runs); then torch.optim.Muon's
// Newton-Schulz iteration, decoupled weight decay and lr adjustment run in torch, in lbopt.torch's operations and
// order, so that the params match it bit for bit. 2-D params only.
class LowBitMuon : public LowBitOptimizer {
 public:
  // The groups are added here, not by LowBitOptimizer's constructor, so that check_params is Muon's.
  LowBitMuon(const std::vector<OptimizerParamGroup>& groups, Options defaults)
      : LowBitOptimizer(std::vector<OptimizerParamGroup>{}, std::move(defaults)) {
    for (const auto& group : groups) add_param_group(group);
  }

  // torch.optim.Muon's orthogonalization of a bfloat16 matrix x, as lbopt.torch's _newton_schulz: x / max(|x|_F,
  // eps), then steps of x <- a x + (b A + c A A) x with A = x x^T, on x or, for a tall matrix, its transpose.
  static at::Tensor newton_schulz(at::Tensor x, double a, double b, double c, int64_t steps, double eps) {
    const bool tall = x.size(0) > x.size(1);
    if (tall) x = x.numpy_T();
    x = x.div(at::linalg_vector_norm(x, 2).clamp(eps));  // Tensor.norm() is this vector_norm
    for (int64_t k = 0; k < steps; ++k) {
      const at::Tensor gram = at::matmul(x, x.numpy_T());
      x = at::addmm(x, at::addmm(gram, gram, gram, b, c), x, a);
    }
    return tall ? x.numpy_T() : x;
  }

  // torch.optim.Muon's lr for a matrix of shape (A, B), in Python's double arithmetic: scaled by sqrt(max(1, A /
  // B)) ("original"), 0.2 sqrt(max(A, B)) ("match_rms_adamw") or sqrt(A / B) ("spectral_unclamped").
  static double adjusted_lr(double lr, const std::string& fn, at::IntArrayRef shape) {
    const double rows = double(shape[0]), cols = double(shape[1]);
    if (fn == "original") return lr * std::sqrt(std::max(1.0, rows / cols));
    if (fn == "match_rms_adamw") return lr * 0.2 * std::sqrt(std::max(rows, cols));
    return lr * std::sqrt(rows / cols);
  }

 protected:
  void check_params(const std::vector<at::Tensor>& params) const override {
    for (const at::Tensor& p : params)
      TORCH_CHECK_VALUE(p.dim() == 2, "Muon only supports 2D parameters whereas we found a parameter with size: ",
                        p.sizes());
  }

  // The direction's tensor, laid out as p (torch.empty_like), after torch.optim.Muon's checks of p and its grad.
  at::Tensor slot_param(const at::Tensor& p) const override {
    TORCH_CHECK(!p.is_complex(), "Muon does not support complex parameters");
    TORCH_CHECK(!p.grad().is_sparse(), "Muon does not support sparse gradients");
    TORCH_CHECK_VALUE(p.grad().dim() == 2, "Param gradient must be a 2D matrix");
    return at::empty_like(p, at::TensorOptions().dtype(at::kBFloat16));
  }

  void finish(std::vector<Call>& calls) override {
    for (Call& call : calls)
      for (size_t i = 0; i < call.params.size(); ++i) update(call.params[i], call.targets[i], *call.group);
  }

 private:
  // Python's 1 - lr * wd, rounded twice: a product the compiler may not fuse into the subtraction (GNU C++ contracts
  // to a fused multiply-add by default where the target has one).
  static double decay(double lr, double wd) {
    volatile double product = lr * wd;
    return 1.0 - product;
  }

  // lbopt.torch's step of p from its direction: the decay, then the orthogonalized direction at the adjusted lr.
  static void update(at::Tensor& p, const at::Tensor& direction, const Options& o) {
    const double lr = o.lr();
    const at::Tensor u = newton_schulz(direction, o.get("ns_a"), o.get("ns_b"), o.get("ns_c"),
                                       int64_t(o.get("ns_steps")), o.get("eps"));
    p.mul_(decay(lr, o.get("weight_decay")));
    p.add_(u, -adjusted_lr(lr, o.get_string("adjust_lr_fn"), p.sizes()));
  }
};

// ---- the named optimizers --------------------------------------------------------------------------------------

namespace detail {

// lbopt.torch's classes' optimizer, default lr, the defaults in which they differ from the library's, and the
// class that steps them.
struct AdamWPreset {
  using Base = LowBitOptimizer;
  static constexpr lbopt_optimizer optimizer = LBOPT_OPTIMIZER_ADAMW;
  static constexpr double lr = 1e-3;
  static void apply(Options&) {}
};
struct AdamPreset {  // Adam: the decay coupled into the gradient (L2), none by default
  using Base = LowBitOptimizer;
  static constexpr lbopt_optimizer optimizer = LBOPT_OPTIMIZER_ADAMW;
  static constexpr double lr = 1e-3;
  static void apply(Options& o) { o.set("adam", 1.0).set("weight_decay", 0.0); }
};
struct SGDPreset {  // torch.optim.SGD's momentum of 0
  using Base = LowBitOptimizer;
  static constexpr lbopt_optimizer optimizer = LBOPT_OPTIMIZER_SGD;
  static constexpr double lr = 1e-3;
  static void apply(Options& o) { o.set("momentum", 0.0); }
};
struct LionPreset {
  using Base = LowBitOptimizer;
  static constexpr lbopt_optimizer optimizer = LBOPT_OPTIMIZER_LION;
  static constexpr double lr = 1e-4;
  static void apply(Options&) {}
};
struct AdEMAMixPreset {
  using Base = LowBitOptimizer;
  static constexpr lbopt_optimizer optimizer = LBOPT_OPTIMIZER_ADEMAMIX;
  static constexpr double lr = 1e-3;
  static void apply(Options&) {}
};
struct MuonPreset {  // torch.optim.Muon's Nesterov momentum
  using Base = LowBitMuon;
  static constexpr lbopt_optimizer optimizer = LBOPT_OPTIMIZER_MUON;
  static constexpr double lr = 1e-3;
  static void apply(Options& o) { o.set("nesterov", 1.0); }
};

}  // namespace detail

// An optimizer of one kind. options() gives its defaults, with nothing set (see Options); options(lr) with lr
// set, the start of a param group's options or of the defaults a constructor takes.
template <class Preset, lbopt_state_kind Kind>
class Fixed : public Preset::Base {
 public:
  using OptimizerParamGroup = ::torch::optim::OptimizerParamGroup;
  static Options options() {
    Options o(Preset::optimizer, Kind, Preset::lr);
    Preset::apply(o);
    return o.forget_set();
  }
  static Options options(double lr) { return options().lr(lr); }

  explicit Fixed(const std::vector<OptimizerParamGroup>& groups, Options defaults = options())
      : Preset::Base(groups, std::move(defaults)) {}
  explicit Fixed(std::vector<at::Tensor> params, Options defaults = options())
      : Fixed(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}
};

// A class of its own for each (not an alias of Fixed<...>), so that errors and overloads name it as Python does.
#define LBOPT_TORCH_OPTIMIZER(Name, Preset, Kind)     \
  class Name : public Fixed<detail::Preset, Kind> { \
   public:                                           \
    using Fixed::Fixed;                              \
  };
LBOPT_TORCH_OPTIMIZER(AdamW4bit, AdamWPreset, LBOPT_STATE_4BIT)
LBOPT_TORCH_OPTIMIZER(AdamW8bit, AdamWPreset, LBOPT_STATE_8BIT)
LBOPT_TORCH_OPTIMIZER(AdamWFp8, AdamWPreset, LBOPT_STATE_FP8)
LBOPT_TORCH_OPTIMIZER(AdamW, AdamWPreset, LBOPT_STATE_FP32)
LBOPT_TORCH_OPTIMIZER(Adam4bit, AdamPreset, LBOPT_STATE_4BIT)
LBOPT_TORCH_OPTIMIZER(Adam8bit, AdamPreset, LBOPT_STATE_8BIT)
LBOPT_TORCH_OPTIMIZER(AdamFp8, AdamPreset, LBOPT_STATE_FP8)
LBOPT_TORCH_OPTIMIZER(SGD4bit, SGDPreset, LBOPT_STATE_4BIT)
LBOPT_TORCH_OPTIMIZER(SGD8bit, SGDPreset, LBOPT_STATE_8BIT)
LBOPT_TORCH_OPTIMIZER(SGDFp8, SGDPreset, LBOPT_STATE_FP8)
LBOPT_TORCH_OPTIMIZER(SGD, SGDPreset, LBOPT_STATE_FP32)
LBOPT_TORCH_OPTIMIZER(Lion4bit, LionPreset, LBOPT_STATE_4BIT)
LBOPT_TORCH_OPTIMIZER(Lion8bit, LionPreset, LBOPT_STATE_8BIT)
LBOPT_TORCH_OPTIMIZER(LionFp8, LionPreset, LBOPT_STATE_FP8)
LBOPT_TORCH_OPTIMIZER(Lion, LionPreset, LBOPT_STATE_FP32)
LBOPT_TORCH_OPTIMIZER(AdEMAMix4bit, AdEMAMixPreset, LBOPT_STATE_4BIT)
LBOPT_TORCH_OPTIMIZER(AdEMAMix8bit, AdEMAMixPreset, LBOPT_STATE_8BIT)
LBOPT_TORCH_OPTIMIZER(AdEMAMixFp8, AdEMAMixPreset, LBOPT_STATE_FP8)
LBOPT_TORCH_OPTIMIZER(AdEMAMix, AdEMAMixPreset, LBOPT_STATE_FP32)
LBOPT_TORCH_OPTIMIZER(Muon4bit, MuonPreset, LBOPT_STATE_4BIT)
LBOPT_TORCH_OPTIMIZER(Muon8bit, MuonPreset, LBOPT_STATE_8BIT)
LBOPT_TORCH_OPTIMIZER(MuonFp8, MuonPreset, LBOPT_STATE_FP8)
LBOPT_TORCH_OPTIMIZER(Muon, MuonPreset, LBOPT_STATE_FP32)
#undef LBOPT_TORCH_OPTIMIZER

}  // namespace lbopt::torch

// lbopt::torch's optimizers (bindings/cpp/lbopt/torch.hpp) from a C++ program alone, no Python: every class trains
// a tiny model; a checkpoint saved with torch::save and loaded with torch::load into fresh params and a fresh
// optimizer resumes bit for bit; a refused step throws the library's message and writes nothing; unknown option
// names and mismatched checkpoints are refused; group options and LR schedulers work as in libtorch; Muon refuses
// what lbopt.torch's refuses, and keeps its torch settings through param groups and checkpoints.
//
// usage: torch_optim_host                      run the checks; exit 0 when all pass
//        torch_optim_host replay IN.pt OUT.pt  step a run Python wrote with torch.save (tests/python/
//                                              test_torch_cpp.py) and write the params and states for it
#include <lbopt/torch.hpp>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

namespace {

namespace lt = lbopt::torch;
using Groups = std::vector<torch::optim::OptimizerParamGroup>;
using Make = std::function<std::unique_ptr<lt::LowBitOptimizer>(const Groups&, const lt::Options&)>;

// A class by its Python name: its options() and a constructor.
struct Class {
  std::string name;
  std::function<lt::Options()> options;
  Make make;
};

template <class Opt>
Class class_of(const char* name) {
  return {name, [] { return Opt::options(); },
          [](const Groups& groups, const lt::Options& o) { return std::make_unique<Opt>(groups, o); }};
}

const std::vector<Class>& classes() {
  static const std::vector<Class> all = {
      class_of<lt::AdamW4bit>("AdamW4bit"),     class_of<lt::AdamW8bit>("AdamW8bit"),
      class_of<lt::AdamWFp8>("AdamWFp8"),       class_of<lt::AdamW>("AdamW"),
      class_of<lt::Adam4bit>("Adam4bit"),       class_of<lt::Adam8bit>("Adam8bit"),
      class_of<lt::AdamFp8>("AdamFp8"),         class_of<lt::SGD4bit>("SGD4bit"),
      class_of<lt::SGD8bit>("SGD8bit"),         class_of<lt::SGDFp8>("SGDFp8"),
      class_of<lt::SGD>("SGD"),                 class_of<lt::Lion4bit>("Lion4bit"),
      class_of<lt::Lion8bit>("Lion8bit"),       class_of<lt::LionFp8>("LionFp8"),
      class_of<lt::Lion>("Lion"),               class_of<lt::AdEMAMix4bit>("AdEMAMix4bit"),
      class_of<lt::AdEMAMix8bit>("AdEMAMix8bit"), class_of<lt::AdEMAMixFp8>("AdEMAMixFp8"),
      class_of<lt::AdEMAMix>("AdEMAMix"),       class_of<lt::Muon4bit>("Muon4bit"),
      class_of<lt::Muon8bit>("Muon8bit"),       class_of<lt::MuonFp8>("MuonFp8"),
      class_of<lt::Muon>("Muon")};
  return all;
}

const Class* find_class(const std::string& name) {
  for (const Class& c : classes())
    if (c.name == name) return &c;
  return nullptr;
}

// Muon steps 2-D params only, and its params are updated in torch (no bf16 stochastic rounding).
bool is_muon(const Class& c) { return c.name.starts_with("Muon"); }

int failures = 0;

std::string text(const c10::Error& e) { return e.what_without_backtrace(); }
bool says(const c10::Error& e, const std::string& part) { return text(e).find(part) != std::string::npos; }

void expect(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  ++failures;
}

// An lr at which a few steps of the class visibly train the tiny model.
double lr_for(const std::string& name) {
  if (name.starts_with("Lion")) return 3e-3;
  if (name.starts_with("SGD")) return 0.1;
  if (name.starts_with("Muon")) return 2e-2;
  return 1e-2;
}

// ---- training ----------------------------------------------------------------------------------------------------

void check_training(const Class& c) {
  torch::manual_seed(0);
  const bool bias = !is_muon(c);  // Muon: weights only
  torch::nn::Sequential model(torch::nn::Linear(torch::nn::LinearOptions(8, 32).bias(bias)), torch::nn::Tanh(),
                              torch::nn::Linear(torch::nn::LinearOptions(32, 1).bias(bias)));
  const torch::Tensor x = torch::randn({64, 8}), y = torch::sin(x.sum(1, true));
  auto opt = c.make({Groups::value_type(model->parameters())}, c.options().lr(lr_for(c.name)).min_quant_size(0));
  double first = 0.0, last = 0.0;
  for (int k = 0; k < 30; ++k) {
    opt->zero_grad();
    torch::Tensor loss = torch::mse_loss(model->forward(x), y);
    loss.backward();
    opt->step();
    (k == 0 ? first : last) = loss.item<double>();
  }
  expect(std::isfinite(last) && last < first,
         c.name + ": the loss went from " + std::to_string(first) + " to " + std::to_string(last));
}

// ---- checkpoints -------------------------------------------------------------------------------------------------

std::vector<torch::Tensor> initial_params() {
  torch::manual_seed(1);
  return {torch::randn({40, 130}), torch::randn({257}), torch::randn({3, 129}).to(torch::kBFloat16)};
}

// Muon's: 2-D, one of them tall (its Newton-Schulz iteration runs on the transpose).
std::vector<torch::Tensor> initial_params(const Class& c) {
  if (!is_muon(c)) return initial_params();
  torch::manual_seed(1);
  return {torch::randn({40, 130}), torch::randn({129, 3}), torch::randn({3, 129}).to(torch::kBFloat16)};
}

// Settings away from the defaults that a checkpoint must carry: the flag that keys stochastic rounding, or Muon's
// torch settings.
lt::Options resume_options(const Class& c) {
  lt::Options o = c.options().min_quant_size(0).seed(7);
  if (!is_muon(c)) return o.set("bf16_stochastic_round", 1);
  return o.set("weight_decay", 0.05).set("ns_steps", 4).set("adjust_lr_fn", "match_rms_adamw");
}

// Grads that depend on the params, so that a resumed run that went astray diverges.
void set_grads(const std::vector<torch::Tensor>& params, int k) {
  for (const torch::Tensor& p : params)
    p.mutable_grad() = (torch::sin(p.to(torch::kFloat) * (k + 1)) + 0.1 * p.to(torch::kFloat)).to(p.scalar_type());
}

void run_steps(lt::LowBitOptimizer& opt, const std::vector<torch::Tensor>& params, int from, int to) {
  for (int k = from; k < to; ++k) {
    set_grads(params, k);
    for (auto& group : opt.param_groups()) group.options().set_lr(1e-2 * (1.0 + 0.25 * k));
    opt.step();
  }
}

bool same_state(const lt::ParamState* a, const lt::ParamState* b) {
  if (!a || !b) return a == b;
  if (a->step() != b->step() || a->state_kind() != b->state_kind() || a->tensors().size() != b->tensors().size())
    return false;
  for (const auto& [key, t] : a->tensors())
    if (!b->tensor(key).defined() || !torch::equal(t, b->tensor(key))) return false;
  return true;
}

bool same_run(const lt::LowBitOptimizer& a, const std::vector<torch::Tensor>& pa, const lt::LowBitOptimizer& b,
              const std::vector<torch::Tensor>& pb) {
  for (size_t i = 0; i < pa.size(); ++i)
    if (!torch::equal(pa[i], pb[i]) || !same_state(a.state_of(pa[i]), b.state_of(pb[i]))) return false;
  return true;
}

std::vector<torch::Tensor> clones(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> out;
  for (const auto& t : ts) out.push_back(t.clone());
  return out;
}

// A copy of a state that the optimizer's later steps cannot write (a ParamState's copy shares its tensors).
std::unique_ptr<lt::ParamState> deep_copy(const lt::ParamState* st) {
  if (!st) return nullptr;
  auto out = std::make_unique<lt::ParamState>(*st);
  for (const auto& [key, t] : st->tensors()) out->tensor(key, t.clone());
  return out;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("lbopt_optim_host_" + std::to_string(getpid()) + "_" + name))
      .string();
}

// 6 steps straight against 3, torch::save, fresh params and optimizer, torch::load, 3 more.
void check_resume(const Class& c) {
  const lt::Options options = resume_options(c);
  const std::vector<torch::Tensor> init = initial_params(c);
  std::vector<torch::Tensor> straight = clones(init), first = clones(init);
  auto opt_straight = c.make({Groups::value_type(straight)}, options);
  run_steps(*opt_straight, straight, 0, 6);

  auto opt_first = c.make({Groups::value_type(first)}, options);
  run_steps(*opt_first, first, 0, 3);
  const std::string opt_file = temp_path("opt.pt"), params_file = temp_path("params.pt");
  torch::save(*opt_first, opt_file);
  torch::save(first, params_file);

  std::vector<torch::Tensor> resumed;  // torch::load appends the saved tensors
  torch::load(resumed, params_file);
  auto opt_resumed = c.make({Groups::value_type(resumed)}, c.options());
  torch::load(*opt_resumed, opt_file);
  run_steps(*opt_resumed, resumed, 3, 6);
  expect(same_run(*opt_straight, straight, *opt_resumed, resumed),
         c.name + ": 3 steps, save, load and 3 more differ from 6 steps");
  std::filesystem::remove(opt_file);
  std::filesystem::remove(params_file);
}

// A checkpoint of 4-bit states into an optimizer with 8-bit ones is refused, and the optimizer left as it was.
void check_load_mismatch() {
  std::vector<torch::Tensor> params = clones(initial_params()), other = clones(params);
  lt::AdamW4bit four(params, lt::AdamW4bit::options().min_quant_size(0));
  run_steps(four, params, 0, 2);
  lt::AdamW8bit eight(other, lt::AdamW8bit::options().min_quant_size(0));
  run_steps(eight, other, 0, 1);
  const auto before = deep_copy(eight.state_of(other[0]));
  const double lr = eight.param_groups()[0].options().get_lr();
  const std::string file = temp_path("mismatch.pt");
  torch::save(four, file);
  try {
    torch::load(eight, file);
    expect(false, "a checkpoint of AdamW4bit loaded into AdamW8bit");
  } catch (const c10::ValueError& e) {
    expect(says(e, "state kind"), "mismatch: " + text(e));
  }
  expect(same_state(before.get(), eight.state_of(other[0])) && eight.param_groups()[0].options().get_lr() == lr,
         "a refused load changed the optimizer");
  std::filesystem::remove(file);
}

// ---- refusals ----------------------------------------------------------------------------------------------------

// What the library says of these options and lr.
std::string library_message(const lt::Options& options, double lr) {
  const lbopt_optimizer_config config = options.config(LBOPT_STATE_FP32);
  lbopt_optimizer_config_validate(&config, lr);
  return lbopt_last_error();
}

struct Snapshot {
  std::vector<torch::Tensor> params;
  std::vector<std::unique_ptr<lt::ParamState>> states;
};

Snapshot snapshot(const lt::LowBitOptimizer& opt, const std::vector<torch::Tensor>& params) {
  Snapshot s{clones(params), {}};
  for (const auto& p : params) s.states.push_back(deep_copy(opt.state_of(p)));
  return s;
}

bool unchanged(const Snapshot& s, const lt::LowBitOptimizer& opt, const std::vector<torch::Tensor>& params) {
  for (size_t i = 0; i < params.size(); ++i)
    if (!torch::equal(s.params[i], params[i]) || !same_state(s.states[i].get(), opt.state_of(params[i])))
      return false;
  return true;
}

// A step whose second group the library refuses throws its message, c10::ValueError, and writes nothing in
// either group (nor creates a state, on a first step; nor, for Muon, updates a param in torch).
template <class Break>
void check_refused_step(const Class& c, int good_steps, const std::string& what, Break breaks) {
  std::vector<torch::Tensor> params = clones(initial_params(c));
  auto opt = c.make({Groups::value_type({params[0]}), Groups::value_type({params[1], params[2]})},
                    c.options().lr(1e-2).min_quant_size(0));
  run_steps(*opt, params, 0, good_steps);
  set_grads(params, good_steps);
  const std::string expected = breaks(*opt, params);
  const Snapshot before = snapshot(*opt, params);
  try {
    opt->step();
    expect(false, c.name + ": " + what + ": the step was not refused");
  } catch (const c10::ValueError& e) {
    expect(says(e, expected),
           c.name + ": " + what + ": the message \"" + text(e) + "\" lacks the library's \"" + expected + "\"");
  }
  expect(unchanged(before, *opt, params), c.name + ": " + what + ": a refused step wrote a param or state");
}

void check_refusals() {
  for (const char* name : {"AdamW4bit", "Muon8bit"})
    for (int good : {0, 2}) {
      const Class& c = *find_class(name);
      const std::string when = good ? " after 2 steps" : " on the first step";
      check_refused_step(c, good, "lr = -1 in the second group" + when, [](lt::LowBitOptimizer& opt, auto&) {
        opt.param_groups()[1].options().set_lr(-1.0);
        return library_message(lt::LowBitOptimizer::options_of(opt.param_groups()[1]), -1.0);
      });
      check_refused_step(c, good, "a grad of another shape" + when, [](lt::LowBitOptimizer&, auto& params) {
        params[2].mutable_grad() = torch::zeros({3, 128}, torch::kBFloat16);
        return std::string("lbopt: a param of shape [3, 129]: slots[1]");
      });
    }
  // options the library refuses are refused where they are set, or where the group is made
  try {
    lt::AdamW4bit::options().set("beta1", 1.5);
    expect(false, "beta1 = 1.5 was accepted");
  } catch (const c10::ValueError& e) {
    expect(says(e, "beta1"), "beta1: " + text(e));
  }
  std::vector<torch::Tensor> params = clones(initial_params());
  try {
    lt::SGD4bit opt(params, lt::SGD4bit::options(0.1).set("nesterov", 1));
    expect(false, "Nesterov without momentum was accepted");
  } catch (const c10::ValueError& e) {
    expect(says(e, "NESTEROV"), "nesterov: " + text(e));
  }
}

// What lbopt.torch's Muon refuses: params that are not matrices (where a group is made or added), the flags that
// torch's update cannot honour, and torch settings out of range; each where it is given.
template <class Use>
void expect_refused(const std::string& what, const std::string& message, Use use) {
  try {
    use();
    expect(false, "Muon: " + what + " was accepted");
  } catch (const c10::ValueError& e) {
    expect(says(e, message), "Muon: " + what + ": " + text(e));
  }
}

void check_muon_refusals() {
  std::vector<torch::Tensor> params = clones(initial_params());
  const std::string not_2d = "Muon only supports 2D parameters whereas we found a parameter with size: [257]";
  expect_refused("a 1-D param", not_2d, [&] { lt::Muon4bit opt(params); });
  expect_refused("a group of a 1-D param", not_2d, [&] {
    lt::Muon opt({params[0]});
    opt.add_param_group(Groups::value_type({params[1]}));
  });
  for (const char* flag : {"bf16_stochastic_round", "skip_nonfinite"})
    expect_refused(flag, "is not supported by", [&] { lt::Muon::options().set(flag, 1); });
  expect_refused("weight_decay = -1", "weight decay should be >= 0",
                 [] { lt::Muon::options().set("weight_decay", -1.0); });
  expect_refused("ns_steps = 100", "less than 100", [] { lt::Muon::options().set("ns_steps", 100); });
  expect_refused("ns_steps = 2.5", "whole number", [] { lt::Muon::options().set("ns_steps", 2.5); });
  expect_refused("adjust_lr_fn = cubic", "Adjust learning rate function cubic is not supported",
                 [] { lt::Muon::options().set("adjust_lr_fn", "cubic"); });
  try {
    lt::Muon::options().set("adjust_lr_fn", 1.0);
    expect(false, "Muon: a number for adjust_lr_fn was accepted");
  } catch (const c10::TypeError&) {
  }
}

// A group's torch settings override the defaults in what they set, as its library fields do.
void check_muon_groups() {
  std::vector<torch::Tensor> params = clones(initial_params(*find_class("Muon")));
  lt::Muon opt({Groups::value_type({params[0]}),
                Groups::value_type({params[1]}, std::make_unique<lt::Options>(
                                                    lt::Muon::options().set("adjust_lr_fn", "original")))},
               lt::Muon::options(2e-3).set("weight_decay", 0.2).set("adjust_lr_fn", "spectral_unclamped"));
  const auto& o0 = lt::LowBitOptimizer::options_of(opt.param_groups()[0]);
  const auto& o1 = lt::LowBitOptimizer::options_of(opt.param_groups()[1]);
  expect(o0.get("weight_decay") == 0.2 && o0.get_string("adjust_lr_fn") == "spectral_unclamped" &&
             o0.get("nesterov") == 1 && o0.get("ns_steps") == 5,
         "Muon: group 0 lacks the defaults");
  expect(o1.get("weight_decay") == 0.2 && o1.get_string("adjust_lr_fn") == "original", "Muon: group 1's settings");
}

// A name the optimizer does not read throws the library's message (which lists those it reads).
void check_unknown_names() {
  lbopt_optimizer_config scratch;
  lbopt_optimizer_config_init(&scratch, sizeof scratch, LBOPT_OPTIMIZER_LION);
  lbopt_optimizer_config_set(&scratch, "eps", 1e-8);
  const std::string expected = lbopt_last_error();
  for (const auto& use : std::vector<std::function<void(lt::Options&)>>{
           [](lt::Options& o) { o.set("eps", 1e-8); }, [](lt::Options& o) { (void)o.get("eps"); }}) {
    try {
      lt::Options o = lt::Lion4bit::options();
      use(o);
      expect(false, "Lion took an eps");
    } catch (const c10::ValueError& e) {
      expect(!expected.empty() && says(e, expected), "unknown name: " + text(e));
    }
  }
}

// ---- group options and schedulers --------------------------------------------------------------------------------

// A group's options override the defaults in what they set, even a value equal to the class default.
void check_groups() {
  std::vector<torch::Tensor> params = clones(initial_params());
  lt::AdamW4bit opt({Groups::value_type({params[0]}),
                     Groups::value_type({params[1]}, std::make_unique<lt::Options>(
                                                         lt::AdamW4bit::options().set("weight_decay", 0.01))),
                     Groups::value_type({params[2]}, std::make_unique<lt::Options>(lt::AdamW4bit::options(0.5)))},
                    lt::AdamW4bit::options(2e-3).set("weight_decay", 0.1).set("amsgrad", 1));
  const auto& g = opt.param_groups();
  const auto& o0 = lt::LowBitOptimizer::options_of(g[0]);
  const auto& o1 = lt::LowBitOptimizer::options_of(g[1]);
  const auto& o2 = lt::LowBitOptimizer::options_of(g[2]);
  expect(o0.lr() == 2e-3 && o0.get("weight_decay") == 0.1 && o0.get("amsgrad") == 1, "group 0 lacks the defaults");
  expect(o1.lr() == 2e-3 && o1.get("weight_decay") == 0.01 && o1.get("amsgrad") == 1, "group 1: weight_decay");
  expect(o2.lr() == 0.5 && o2.get("weight_decay") == 0.1, "group 2: lr");
  run_steps(opt, params, 0, 1);
  expect(opt.state_of(params[0])->codes("max_exp_avg_sq").defined(), "amsgrad keeps no max_exp_avg_sq");

  // libtorch's schedulers read and write each group's lr through get_lr / set_lr; StepLR's first step() keeps it
  torch::optim::StepLR schedule(opt, 1, 0.5);
  for (auto& group : opt.param_groups()) group.options().set_lr(1e-2);
  schedule.step();
  schedule.step();
  expect(std::abs(o0.lr() - 5e-3) < 1e-15 && std::abs(o2.lr() - 5e-3) < 1e-15, "StepLR did not halve the lr");
}

// ---- replay of a run Python describes ----------------------------------------------------------------------------

double number(const c10::IValue& v) {
  if (v.isBool()) return v.toBool() ? 1.0 : 0.0;
  return v.isInt() ? double(v.toInt()) : v.toDouble();
}

// Settings by name: seed, min_quant_size, or a name of the optimizer's options (a string for a choice).
void apply(lt::Options& options, const c10::impl::GenericDict& settings) {
  for (const auto& entry : settings) {
    const std::string name = entry.key().toStringRef();
    if (name == "seed") options.seed(uint64_t(entry.value().toInt()));
    else if (name == "min_quant_size") options.min_quant_size(entry.value().toInt());
    else if (entry.value().isString()) options.set(name, entry.value().toStringRef());
    else options.set(name, number(entry.value()));
  }
}

std::vector<char> read_file(const char* path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

Groups groups_of(const c10::impl::GenericDict& run, const Class& c, const std::vector<torch::Tensor>& params) {
  if (!run.contains("groups")) return {Groups::value_type(params)};
  Groups groups;
  for (const c10::IValue& g : run.at("groups").toListRef()) {
    const auto group = g.toGenericDict();
    std::vector<torch::Tensor> members;
    for (const c10::IValue& i : group.at("params").toListRef()) members.push_back(params.at(size_t(i.toInt())));
    lt::Options own = c.options();
    apply(own, group.at("options").toGenericDict());
    groups.emplace_back(members, std::make_unique<lt::Options>(own));
  }
  return groups;
}

c10::IValue state_dict(const lt::ParamState* st) {
  if (!st) return c10::IValue();
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  out.insert("step", st->step());
  out.insert("state_kind", int64_t(st->state_kind()));
  if (!st->dim_order().empty()) out.insert("dim_order", st->dim_order());
  for (const auto& [key, t] : st->tensors()) out.insert(key, t);
  return out;
}

// IN: {"class": name, "params": [tensor], "grads": [[tensor or None per param] per step], "lrs": [float per step],
// "options": {name: value}, optionally "groups": [{"params": [index], "options": {name: value}}]}.
// OUT: {"params": [tensor], "states": [{"step", "state_kind", "dim_order" where not row-major, "<state>_codes", ...}
// or None per param]}.
int replay(const char* in, const char* out) {
  const auto run = torch::pickle_load(read_file(in)).toGenericDict();
  const Class* c = find_class(run.at("class").toStringRef());
  if (!c) {
    std::fprintf(stderr, "FAIL: no class %s\n", run.at("class").toStringRef().c_str());
    return 1;
  }
  std::vector<torch::Tensor> params;
  for (const c10::IValue& p : run.at("params").toListRef()) params.push_back(p.toTensor().clone());
  lt::Options defaults = c->options();
  apply(defaults, run.at("options").toGenericDict());
  auto opt = c->make(groups_of(run, *c, params), defaults);
  const auto lrs = run.at("lrs").toListRef();
  const auto grads = run.at("grads").toListRef();
  for (size_t k = 0; k < grads.size(); ++k) {
    const auto step_grads = grads[k].toListRef();
    for (size_t i = 0; i < params.size(); ++i)
      params[i].mutable_grad() = step_grads[i].isNone() ? torch::Tensor() : step_grads[i].toTensor();
    for (auto& group : opt->param_groups()) group.options().set_lr(lrs[k].toDouble());
    opt->step();
  }
  c10::impl::GenericList states(c10::AnyType::get());
  for (const auto& p : params) states.push_back(state_dict(opt->state_of(p)));
  c10::impl::GenericDict result(c10::StringType::get(), c10::AnyType::get());
  result.insert("params", c10::List<torch::Tensor>(params));
  result.insert("states", states);
  const std::vector<char> bytes = torch::pickle_save(result);
  std::ofstream(out, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "replay") return replay(argv[2], argv[3]);
  if (argc != 1) {
    std::fprintf(stderr, "usage: torch_optim_host [replay IN.pt OUT.pt]\n");
    return 2;
  }
  torch::set_num_threads(1);
  for (const Class& c : classes()) {
    check_training(c);
    check_resume(c);
  }
  check_load_mismatch();
  check_refusals();
  check_muon_refusals();
  check_muon_groups();
  check_unknown_names();
  check_groups();
  if (failures) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("lbopt::torch: %zu classes trained and resumed bit for bit from torch::save/torch::load; refused "
              "steps, options and checkpoints wrote nothing\n", classes().size());
  return 0;
}

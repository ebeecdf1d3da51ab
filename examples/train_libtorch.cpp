// Training in C++ alone with lbopt's 4-bit AdamW (bindings/cpp/lbopt/torch.hpp): a small MLP fits a synthetic
// regression, with a cosine lr schedule set through the param group's options at every step; halfway the model
// and optimizer are saved with torch::save, and training resumes in fresh objects loaded with torch::load.
// Exits 1 unless the loss falls.
#include <lbopt/torch.hpp>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numbers>
#include <string>

namespace {

constexpr int kSteps = 300;
constexpr int kBatch = 128;
constexpr double kPeakLr = 3e-3, kFinalLr = 1e-4;

// 16 inputs -> 1 output; the 128x128 layer (16384 weights) gets 4-bit states, the smaller tensors fp32 states
// (lbopt's min_quant_size, 4096 elements by default).
torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Linear(16, 128), torch::nn::GELU(), torch::nn::Linear(128, 128),
                               torch::nn::GELU(), torch::nn::Linear(128, 1));
}

// Cosine decay from kPeakLr to kFinalLr over the run, after a short linear warm-up.
double lr_at(int step) {
  const int warmup = 20;
  if (step < warmup) return kPeakLr * (step + 1) / warmup;
  const double t = double(step - warmup) / (kSteps - warmup);
  return kFinalLr + 0.5 * (kPeakLr - kFinalLr) * (1.0 + std::cos(std::numbers::pi * t));
}

struct Data {
  torch::Tensor x, y;
};

Data make_data() {
  torch::manual_seed(0);
  const torch::Tensor x = torch::randn({4096, 16}), w = torch::randn({16, 1}) / 4.0;
  return {x, torch::sin(x.matmul(w) * 2.0) + 0.5 * torch::tanh(x.narrow(1, 0, 1) * x.narrow(1, 1, 1))};
}

double train(torch::nn::Sequential& model, lbopt::torch::AdamW4bit& opt, const Data& data, int from, int to) {
  double loss_value = 0.0;
  for (int step = from; step < to; ++step) {
    const torch::Tensor rows = torch::randint(data.x.size(0), {kBatch}, torch::kLong);
    opt.zero_grad();
    torch::Tensor loss = torch::mse_loss(model->forward(data.x.index_select(0, rows)), data.y.index_select(0, rows));
    loss.backward();
    for (auto& group : opt.param_groups()) group.options().set_lr(lr_at(step));
    opt.step();
    loss_value = loss.item<double>();
    if (step % 50 == 0 || step == to - 1) std::printf("step %3d  lr %.2e  loss %.4f\n", step, lr_at(step), loss_value);
  }
  return loss_value;
}

double full_loss(torch::nn::Sequential& model, const Data& data) {
  torch::NoGradGuard no_grad;
  return torch::mse_loss(model->forward(data.x), data.y).item<double>();
}

}  // namespace

int main() {
  torch::set_num_threads(1);
  const Data data = make_data();
  const auto dir = std::filesystem::temp_directory_path();
  const std::string tag = "lbopt_train_libtorch_" + std::to_string(getpid());
  const std::string model_file = (dir / (tag + "_model.pt")).string(), opt_file = (dir / (tag + "_opt.pt")).string();

  torch::nn::Sequential model = make_model();
  lbopt::torch::AdamW4bit opt(model->parameters(), lbopt::torch::AdamW4bit::options(kPeakLr).set("weight_decay", 0.01));
  const double initial = full_loss(model, data);
  std::printf("initial loss %.4f\n", initial);
  train(model, opt, data, 0, kSteps / 2);
  torch::save(model, model_file);
  torch::save(opt, opt_file);
  std::printf("checkpoint saved at step %d; resuming in a fresh model and optimizer\n", kSteps / 2);

  torch::nn::Sequential resumed = make_model();  // other random weights, until the load
  torch::load(resumed, model_file);
  lbopt::torch::AdamW4bit resumed_opt(resumed->parameters());  // settings and states come from the checkpoint
  torch::load(resumed_opt, opt_file);
  train(resumed, resumed_opt, data, kSteps / 2, kSteps);
  std::filesystem::remove(model_file);
  std::filesystem::remove(opt_file);

  const double final = full_loss(resumed, data);
  std::printf("final loss %.4f (from %.4f)\n", final, initial);
  if (!(final < 0.5 * initial)) {
    std::fprintf(stderr, "FAIL: the loss did not fall below half its initial value\n");
    return 1;
  }
  return 0;
}

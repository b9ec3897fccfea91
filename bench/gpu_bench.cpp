// The tepdist side of scripts/gpu-check.sh: the lenet and widecnn presets trained on the cuda
// backend for a fixed number of steps, state on the device (compute::ResidentState), in samples
// per second, beside the arithmetic rate that is and its fraction of the device's float32 peak.
// bench/gpu_torch.py is the PyTorch side, with the same models, batches and step.
//
// Each step copies a host batch to the device and reads the loss back, as `tepdist train` does.
// The arithmetic counted is 3 x the forward's multiply-adds x 2 (forward, input gradient, weight
// gradient) for convolutions and linear layers; pooling, ReLU, the loss and the optimiser are
// left out. The peak is the device's own: multiprocessors x 128 float32 lanes x 2 x its clock.
//
// fastest_samples_per_s is the same with compute.deterministic = false (cuDNN's fastest measured
// convolution algorithms). host_level_samples_per_s is the same training through the model's host buffers, as a cluster
// worker runs the cuda backend today (parameters up and the gradient down every step, the
// optimiser on the host).
//
// Usage: tepdist_gpu_bench [steps [model [batch]]]; prints one JSON object per line.

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "compute/cuda/cuda_backend.hpp"
#include "compute/presets.hpp"
#include "compute/resident.hpp"
#include "compute/train.hpp"

using namespace tepdist::compute;

namespace {

double forward_flops_per_sample(const Model& model) {
  double flops = 0.0;
  for (const PlannedLayer& l : model.planned_layers(1)) {
    if (l.kind == PlannedLayer::Kind::conv2d)
      flops += 2.0 * static_cast<double>(l.conv.k * l.conv.c * l.conv.r * l.conv.s * l.conv.oh() * l.conv.ow());
    if (l.kind == PlannedLayer::Kind::linear) flops += 2.0 * static_cast<double>(l.linear.in * l.linear.out);
  }
  return flops;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 300;
  // optional: one model and batch only (for a profiler's run)
  const std::string only_model = argc > 2 ? argv[2] : "";
  const int64_t only_batch = argc > 3 ? std::atoll(argv[3]) : 0;
  auto made = make_cuda_backend(0);
  if (!made) {
    fmt::print(stderr, "tepdist_gpu_bench: {}\n", made.error().message);
    return 1;
  }
  Backend& cuda = **made;
  auto fastest = std::move(*make_cuda_backend(0, false));  // compute.deterministic = false
  int sms = 0, clock_khz = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  const double peak = static_cast<double>(sms) * 128.0 * 2.0 * clock_khz * 1e3;
  fmt::print("{{\"device\": \"{}\", \"fp32_peak_tflops\": {:.1f}}}\n", cuda.describe(), peak / 1e12);
  std::fflush(stdout);

  for (const char* preset : {"lenet", "widecnn"}) {
    for (const int64_t batch : {int64_t{64}, int64_t{512}}) {
      if ((!only_model.empty() && only_model != preset) || (only_batch && only_batch != batch)) continue;
      auto model = std::move(*make_preset(preset));
      if (auto ok = model->build({1, 28, 28}, 1); !ok) return 1;
      OptimizerOptions o;  // SGD with momentum 0.9, as the PyTorch side
      auto resident = std::move(*make_resident(*model, cuda, o));
      // four batches to cycle through, uniform in [-1, 1) and labels 0..9
      std::vector<Tensor> xs;
      std::vector<std::vector<int32_t>> ys;
      Rng r(7);
      for (int k = 0; k < 4; ++k) {
        xs.emplace_back(Shape{batch, 1, 28, 28});
        for (float& v : xs.back().span()) v = r.uniform(-1.0f, 1.0f);
        ys.emplace_back(static_cast<size_t>(batch));
        for (auto& l : ys.back()) l = static_cast<int32_t>(r.below(10));
      }
      float loss = 0.0f;
      // samples/s of `steps` steps after 20 of warm-up, state on the device
      auto timed = [&](ResidentState& state) {
        auto step = [&](int i) {
          const float l = state.compute_gradients(xs[i % 4], ys[i % 4]).value();
          state.step(0.01f);
          return l;
        };
        for (int i = 0; i < 20; ++i) step(i);
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < steps; ++i) loss = step(i);
        state.pull_parameters();  // waits for the last update
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return static_cast<double>(batch) * steps / seconds;
      };
      const double rate = timed(*resident);
      auto fast_model = std::move(*make_preset(preset));
      if (auto ok = fast_model->build({1, 28, 28}, 1); !ok) return 1;
      auto fast_resident = std::move(*make_resident(*fast_model, *fastest, o));
      const double fast_rate = timed(*fast_resident);
      const double flops = 3.0 * forward_flops_per_sample(*model) * rate;
      // The same steps as a cluster worker runs them today: the model's host buffers, the plan's
      // host-level forward and backward (parameters up, gradient down every step), the host optimiser.
      auto host_model = std::move(*make_preset(preset));
      if (auto ok = host_model->build({1, 28, 28}, 1); !ok) return 1;
      auto host_optimizer = std::move(*make_optimizer(o, host_model->parameters().size()));
      LossScratch scratch;
      auto host_step = [&](int i) {
        const float l = try_compute_gradients(*host_model, cuda, xs[i % 4], ys[i % 4], scratch).value();
        host_optimizer->step(host_model->parameters(), host_model->gradients(), 0.01f);
        return l;
      };
      for (int i = 0; i < 20; ++i) host_step(i);
      const auto t1 = std::chrono::steady_clock::now();
      for (int i = 0; i < steps; ++i) host_step(i);
      const double host_rate =
          static_cast<double>(batch) * steps / std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
      fmt::print("{{\"framework\": \"tepdist cuda\", \"model\": \"{}\", \"batch\": {}, \"steps\": {}, \"math\": \"fp32\", "
                 "\"samples_per_s\": {:.1f}, \"tflops\": {:.3f}, \"fraction_of_fp32_peak\": {:.4f}, \"last_loss\": {:.4f}, "
                 "\"host_level_samples_per_s\": {:.1f}, \"fastest_samples_per_s\": {:.1f}, \"path\": \"{}\", "
                 "\"fastest_path\": \"{}\"}}\n",
                 preset, batch, steps, rate, flops / 1e12, flops / peak, loss, host_rate, fast_rate,
                 model->compute_path(cuda, batch), fast_model->compute_path(*fastest, batch));
      std::fflush(stdout);
    }
  }
  return 0;
}

// A program on the C++ API for tests that need to act between two train() calls: after each
// epoch but the last it prints what the report said and waits for a line on a FIFO the test
// writes to (a kill, a join, a look at the processes happens meanwhile).
//
//   tepdist_trainer_probe OUT MODE EPOCHS GATE_FIFO [ACTIONS|- [SEED SECRET_FILE]]
//
// Prints per epoch: "probe epoch E job J generation G members M samples S nodes PID,PID" and one
// "probe event: ..." line per membership change or generation the report lists; at the end,
// "probe nonzero N" (parameters not exactly 0). ACTIONS, joined by commas: zero-after-first: the program sets every
// parameter to 0 after the first epoch (plain SGD then moves only the last layer's bias: every
// other gradient is a product with a zero weight or a zero activation). slow-after-first: the
// program sets the optimiser's rate to 1e-30 after the first epoch (every change then falls below
// the parameters' precision: they stay as they are, bit for bit); adam-after-first: it changes
// the optimiser to Adam at the rate 1e-30 (another layout of state); gradients: an async job
// pushes gradients for the shards' optimisers ([elastic] local_steps = 0); emulate-device: a sync
// job keeps its state apart from the host's buffers ([compute] emulate_device). Each epoch also prints "probe
// params E CHECKSUM" (compute::checksum of the parameters). SEED and SECRET_FILE: a running cluster
// instead of two local nodes.

#include <tepdist/trainer.hpp>

#include <cstdio>
#include <fstream>
#include <string>

#include "compute/rng.hpp"
#include "compute/tensor.hpp"

namespace {

using namespace tepdist::compute;

/// Three classes of 16 features: the class's coordinate pattern plus noise.
Dataset make_data(int64_t n) {
  Rng rng(3);
  std::vector<float> x(static_cast<size_t>(n * 16));
  std::vector<int32_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const auto c = static_cast<int32_t>(rng.below(3));
    y[static_cast<size_t>(i)] = c;
    for (int64_t f = 0; f < 16; ++f)
      x[static_cast<size_t>(i * 16 + f)] = (f % 3 == c ? 1.0f : 0.0f) + rng.uniform(-0.5f, 0.5f);
  }
  return Dataset::of_floats({16}, std::move(x), std::move(y), 3);
}

}  // namespace

int main(int argc, char** argv) {
  tepdist::Trainer::serve(argc, argv, [] { return std::unique_ptr<Model>(); });
  if (argc != 5 && argc != 6 && argc != 8) {
    std::fprintf(stderr, "usage: tepdist_trainer_probe OUT MODE EPOCHS GATE_FIFO [ACTIONS|- [SEED SECRET_FILE]]\n");
    return 2;
  }
  const std::string actions = argc >= 6 ? "," + std::string(argv[5]) + "," : "";
  const auto asked = [&](const char* action) { return actions.find("," + std::string(action) + ",") != std::string::npos; };
  const bool zero = asked("zero-after-first"), slow = asked("slow-after-first"), adam = asked("adam-after-first");
  const int epochs = std::stoi(argv[3]);
  const std::vector<LayerSpec> layers = {{"linear", "", {{"out_features", 32}}}, {"relu", "", {}},
                                         {"linear", "", {{"out_features", 3}}}};
  const Dataset data = make_data(8192);
  auto model = make_model(layers);
  if (!model || !(*model)->build(data.sample_shape(), 0)) return 1;
  tepdist::TrainerOptions options;
  options.mode = argv[2];
  options.nodes = 2;
  options.epochs = epochs;
  options.layers = layers;
  options.batch_size = 16;
  options.out = argv[1];
  if (asked("gradients")) options.overrides.push_back("elastic.local_steps=0");
  if (asked("emulate-device")) options.overrides.push_back("compute.emulate_device=true");
  if (argc == 8) {
    options.seeds = {argv[6]};
    options.secret_file = argv[7];
  }
  tepdist::Trainer trainer(options);
  tepdist::OptimizerSpec optimizer;
  optimizer.options.name = "sgd";
  optimizer.options.momentum = 0.0f;  // plain SGD (zero-after-first relies on it)
  optimizer.schedule.base_lr = 0.05f;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    auto report = trainer.train(**model, data, optimizer, epoch);
    if (!report) {
      std::printf("probe failed: %s\n", report.error().message.c_str());
      return 1;
    }
    std::string pids;
    for (const int pid : trainer.node_pids()) {
      if (!pids.empty()) pids += ',';
      pids += std::to_string(pid);
    }
    std::printf("probe epoch %d job %llu generation %llu members %u samples %llu nodes %s\n", epoch + 1,
                static_cast<unsigned long long>(report->job_id), static_cast<unsigned long long>(report->generation),
                report->members, static_cast<unsigned long long>(report->samples), pids.c_str());
    for (const auto& e : report->events) std::printf("probe event: %s\n", e.c_str());
    std::printf("probe params %d %016llx\n", epoch + 1,
                static_cast<unsigned long long>(tepdist::compute::checksum((*model)->parameters())));
    std::fflush(stdout);
    if (epoch + 1 < epochs) {
      std::ifstream gate(argv[4]);  // blocks until the test opens it for writing
      std::string line;
      std::getline(gate, line);
    }
    if (zero && epoch == 0)
      for (float& v : (*model)->parameters()) v = 0.0f;
    if (slow && epoch == 0) optimizer.schedule.base_lr = 1e-30f;
    if (adam && epoch == 0) {
      optimizer.options.name = "adam";
      optimizer.schedule.base_lr = 1e-30f;
    }
  }
  size_t nonzero = 0;
  for (const float v : (*model)->parameters()) nonzero += v != 0.0f;
  std::printf("probe nonzero %zu\n", nonzero);
  std::printf("probe done\n");
  return 0;
}

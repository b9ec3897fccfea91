// A user program on tepdist's C++ API with data of its own: float feature vectors (generated
// here: four classes, each a cloud around its own centre in 20 dimensions), a small MLP given as a
// layer list, and one sync job of several epochs on local node processes, or on a running
// cluster of plain `tepdist node` processes.
//
//   build/examples/mlp_sync [--nodes 2] [--epochs 3] [--out out/mlp_sync]
//   build/examples/mlp_sync --seeds HOST:PORT --secret-file FILE     # a running cluster
//   build/examples/mlp_sync --set elastic.balance=false               # any job key, as tepdist run --set
//
// Each epoch prints the job's own evaluation, this program's, and the node processes (local
// nodes: the same ones every epoch). --stop-after N throws after N epochs, to show that the
// Trainer's destructor ends the job and stops its nodes on the way out.

#include <tepdist/trainer.hpp>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "compute/io/checkpoint.hpp"
#include "compute/rng.hpp"

namespace {

using namespace tepdist::compute;

constexpr int64_t features = 20, classes = 4;

/// n samples: class c's centre (each coordinate in [-1, 1], drawn once from seed 7) plus uniform
/// noise in [-2.5, 2.5] per coordinate (the clouds overlap: no model gets every sample right).
/// `stream` tells the training set from the test set.
Dataset make_clouds(int64_t n, uint64_t stream) {
  Rng centres(7);
  std::vector<float> centre(static_cast<size_t>(classes * features));
  for (float& v : centre) v = centres.uniform(-1.0f, 1.0f);
  Rng rng(1000 + stream);
  std::vector<float> x(static_cast<size_t>(n * features));
  std::vector<int32_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const auto c = static_cast<int32_t>(rng.below(classes));
    y[static_cast<size_t>(i)] = c;
    for (int64_t f = 0; f < features; ++f)
      x[static_cast<size_t>(i * features + f)] = centre[static_cast<size_t>(c * features + f)] + rng.uniform(-2.5f, 2.5f);
  }
  return Dataset::of_floats({features}, std::move(x), std::move(y), classes);
}

/// The model, as a layer list: this program builds it from the list, and so can nodes that do
/// not run this program (TrainerOptions::layers).
std::vector<LayerSpec> mlp() {
  return {{"linear", "", {{"out_features", 64}}}, {"relu", "", {}}, {"linear", "", {{"out_features", classes}}}};
}

struct Args {
  int nodes = 2, epochs = 3, stop_after = -1;
  std::string out = "out/mlp_sync", secret_file;
  std::vector<std::string> seeds, overrides;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--nodes") a.nodes = std::stoi(value);
    else if (flag == "--epochs") a.epochs = std::stoi(value);
    else if (flag == "--out") a.out = value;
    else if (flag == "--seeds") a.seeds.push_back(value);
    else if (flag == "--secret-file") a.secret_file = value;
    else if (flag == "--stop-after") a.stop_after = std::stoi(value);
    else if (flag == "--set") a.overrides.push_back(value);
    else {
      std::fprintf(stderr, "mlp_sync: unknown option %s\n", flag.c_str());
      std::exit(2);
    }
  }
  return a;
}

int run(const Args& args) {
  const Dataset train = make_clouds(4096, 0), test = make_clouds(1024, 1);
  auto model = make_model(mlp());
  if (!model || !(*model)->build(train.sample_shape(), /*seed=*/0)) {
    std::fprintf(stderr, "mlp_sync: cannot build the model\n");
    return 1;
  }
  tepdist::TrainerOptions options;
  options.mode = "sync";
  options.nodes = args.nodes;
  options.epochs = args.epochs;
  options.test_data = test;
  options.layers = mlp();
  options.seeds = args.seeds;
  options.secret_file = args.secret_file;
  options.batch_size = 32;
  options.out = args.out;
  options.overrides = args.overrides;
  tepdist::Trainer trainer(options);
  tepdist::OptimizerSpec sgd;
  sgd.options.name = "sgd";
  sgd.options.momentum = 0.9f;
  sgd.schedule.base_lr = 0.05f;

  for (int epoch = 0; epoch < args.epochs; ++epoch) {
    if (epoch == args.stop_after) throw std::runtime_error("stopped early (--stop-after)");
    auto report = trainer.train(**model, train, sgd, epoch);
    if (!report) {
      std::fprintf(stderr, "mlp_sync: %s\n", report.error().message.c_str());
      return 1;
    }
    const auto eval = trainer.test(**model, test);
    if (!eval) {
      std::fprintf(stderr, "mlp_sync: %s\n", eval.error().message.c_str());
      return 1;
    }
    std::string pids;
    for (const int pid : trainer.node_pids()) {
      if (!pids.empty()) pids += ',';
      pids += std::to_string(pid);
    }
    std::printf("epoch %d: members %u, job %llu generation %llu, %llu steps, %llu samples, job accuracy %.4f, "
                "test accuracy %.4f, nodes %s\n",
                epoch + 1, report->members, static_cast<unsigned long long>(report->job_id),
                static_cast<unsigned long long>(report->generation), static_cast<unsigned long long>(report->steps),
                static_cast<unsigned long long>(report->samples), report->test_accuracy.value_or(-1.0), eval->accuracy,
                pids.empty() ? "-" : pids.c_str());
    for (const auto& event : report->events) std::printf("  %s\n", event.c_str());
    std::fflush(stdout);
  }
  const std::string file = args.out + "/mlp_sync.safetensors";
  if (auto ok = export_safetensors(file, **model); !ok) {
    std::fprintf(stderr, "mlp_sync: %s\n", ok.error().message.c_str());
    return 1;
  }
  std::printf("saved %s\n", file.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Local nodes run this program too; their models come from the layer list, so no factory is
  // needed, but serve() is what turns such a relaunch into a node.
  tepdist::Trainer::serve(argc, argv, [] { return std::unique_ptr<Model>(); });
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::printf("mlp_sync: %s\n", e.what());
    return 3;
  }
}

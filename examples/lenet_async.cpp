// A user program on tepdist's C++ API: a LeNet-style model of its own, trained on Fashion-MNIST by
// two node processes in async mode, evaluated after every epoch and saved as safetensors.
//
//   build/examples/lenet_async [--nodes 2] [--mode async] [--epochs 3] [--train-samples 0]
//                              [--test-samples 0] [--out out/lenet_async]
//   build/examples/lenet_async --seeds HOST:PORT --secret-file FILE   # a running cluster whose nodes
//                                                                     # run this program too
//
// The nodes are this very program, relaunched by the Trainer: serve() turns such a relaunch into
// a node, so it comes first in main().

#include <tepdist/trainer.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "compute/io/checkpoint.hpp"
#include "compute/layers.hpp"

namespace {

using namespace tepdist::compute;

/// The model: two convolutions and two fully connected layers, as in LeCun et al. (1998), with
/// ReLU and max-pooling. Parameters are named after the layers (conv1.weight, fc4.bias, ...).
class LeNet : public Model {
 public:
  LeNet() {
    add<Conv2d>(1, 20, 5);
    add<MaxPool2d>(2);
    add<Relu>();
    add<Conv2d>(20, 50, 5);
    add<MaxPool2d>(2);
    add<Relu>();
    add<Flatten>();
    add<Linear>(0, 500);  // in_features 0: inferred when the model is built
    add<Relu>();
    add<Linear>(500, 10);
  }
};

struct Args {
  int nodes = 2, epochs = 3;
  std::string mode = "async", out = "out/lenet_async", secret_file;
  std::vector<std::string> seeds;
  int64_t train_samples = 0, test_samples = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--nodes") a.nodes = std::stoi(value);
    else if (flag == "--epochs") a.epochs = std::stoi(value);
    else if (flag == "--mode") a.mode = value;
    else if (flag == "--out") a.out = value;
    else if (flag == "--train-samples") a.train_samples = std::stoll(value);
    else if (flag == "--test-samples") a.test_samples = std::stoll(value);
    else if (flag == "--seeds") a.seeds.push_back(value);
    else if (flag == "--secret-file") a.secret_file = value;
    else {
      std::fprintf(stderr, "lenet_async: unknown option %s\n", flag.c_str());
      std::exit(2);
    }
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  tepdist::Trainer::serve(argc, argv, [] { return std::make_unique<LeNet>(); });
  const Args args = parse(argc, argv);

  auto train = load_fashion_mnist(fashion_mnist_dir, "train", args.train_samples);
  auto test = load_fashion_mnist(fashion_mnist_dir, "test", args.test_samples);
  if (!train || !test) {
    std::fprintf(stderr, "lenet_async: %s\n", (!train ? train.error() : test.error()).message.c_str());
    return 1;
  }
  LeNet model;
  if (auto ok = model.build(train->sample_shape(), /*seed=*/0); !ok) {
    std::fprintf(stderr, "lenet_async: %s\n", ok.error().message.c_str());
    return 1;
  }

  tepdist::TrainerOptions options;
  options.mode = args.mode;
  options.nodes = args.nodes;
  options.epochs = args.epochs;
  options.test_data = *test;  // the job's own evaluations at each epoch's end
  options.out = args.out;
  options.seeds = args.seeds;
  options.secret_file = args.secret_file;
  tepdist::Trainer trainer(options);
  tepdist::OptimizerSpec sgd;
  sgd.options.name = "sgd";
  sgd.options.momentum = 0.9f;
  sgd.schedule.base_lr = 0.02f * static_cast<float>(args.nodes);  // the batch-64 rate, scaled with the workers

  sgd.schedule.warmup_steps = 50;
  for (int epoch = 0; epoch < args.epochs; ++epoch) {
    auto report = trainer.train(model, *train, sgd, epoch);
    if (!report) {
      std::fprintf(stderr, "lenet_async: %s\n", report.error().message.c_str());
      return 1;
    }
    const auto eval = trainer.test(model, *test);
    if (!eval) {
      std::fprintf(stderr, "lenet_async: %s\n", eval.error().message.c_str());
      return 1;
    }
    std::printf("epoch %d: members %u, %llu steps in %.1f s (%.0f samples/s), test accuracy %.4f, test loss %.4f\n",
                epoch + 1, report->members, static_cast<unsigned long long>(report->steps), report->train_seconds,
                report->samples_per_second, eval->accuracy, eval->loss);
    std::fflush(stdout);
  }
  const std::string file = args.out + "/lenet_async.safetensors";
  if (auto ok = export_safetensors(file, model); !ok) {
    std::fprintf(stderr, "lenet_async: %s\n", ok.error().message.c_str());
    return 1;
  }
  std::printf("saved %s\n", file.c_str());
  return 0;
}

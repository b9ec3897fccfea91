#pragma once
// tepdist::Trainer: distributed training from your own C++ program.
//
//   class Net : public tepdist::compute::Model { ... add<Conv2d>(1, 20, 5); ... };
//
//   int main(int argc, char** argv) {
//     tepdist::Trainer::serve(argc, argv, [] { return std::make_unique<Net>(); });  // first thing
//     tepdist::Trainer trainer({.mode = "async", .nodes = 2});
//     Net net;
//     net.build({1, 28, 28}, 0);
//     for (int epoch = 0; epoch < 3; ++epoch) {
//       auto report = trainer.train(net, train_data, optimizer, epoch);
//       auto eval = trainer.test(net, test_data);  // compute::Result<Evaluation>, as train()'s
//     }
//   }
//
// How it is distributed: each train() call is one `tepdist run` job. The Trainer starts `nodes`
// node processes on loopback, each a relaunch of this very program (so every node builds the
// same model class); serve() is what turns such a relaunch into a node, which is why it comes
// first in main(). The job starts from the model's current parameters and trains on train_data
// for one epoch in the chosen mode (sync, async or gossip); the final parameters come back into
// the model, and the nodes stop. Everything a run writes (result.json, logs/, the model) is under
// options.out/epoch-E.
//
// The data set travels as IDX files under options.out/data (one channel: [n, 1, h, w]). The
// job's own evaluations run on the first 1,000 training samples; test() is the evaluation on
// held-out data.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compute/backend.hpp"
#include "compute/data/dataset.hpp"
#include "compute/model.hpp"
#include "compute/optimizer.hpp"
#include "compute/train.hpp"

namespace tepdist {

struct TrainerOptions {
  std::string mode = "async";  ///< "sync", "async" or "gossip"
  int nodes = 2;               ///< node processes started on this machine for each train()
  /// A job file for everything else ([job], [elastic], [membership], ...); none: the built-in
  /// quickstart's settings. mode, nodes, the data and the optimiser passed to train() win.
  std::optional<std::filesystem::path> config;
  std::vector<std::string> overrides;  ///< "section.key=value", as `tepdist run --set`
  std::filesystem::path out = "tepdist-trainer";
  int64_t batch_size = 64;  ///< per worker
  uint64_t seed = 0;        ///< with the epoch, seeds each job's shuffling
};

/// What to optimise with: the optimiser and its learning-rate schedule (total_steps is filled in).
struct OptimizerSpec {
  compute::OptimizerOptions options;
  compute::ScheduleOptions schedule;
};

/// One train() call's outcome, from its result.json.
struct EpochReport {
  uint32_t members = 0;  ///< workers that trained
  uint64_t steps = 0;    ///< global steps
  uint64_t samples = 0;
  double train_seconds = 0, samples_per_second = 0;
  std::filesystem::path result;  ///< the run's result.json
};

using ModelFactory = std::function<std::unique_ptr<compute::Model>()>;

class Trainer {
 public:
  /// Call first in main(). In a node process a Trainer started, runs the node with models made by
  /// `factory` (unbuilt; the job builds them) and exits the process; anywhere else, registers the
  /// factory and returns.
  static void serve(int argc, char** argv, ModelFactory factory);

  explicit Trainer(TrainerOptions options);

  /// One epoch (numbered from 0: it seeds the shuffle) of distributed training, starting from
  /// model's parameters and leaving the result in them. Errors (a bad option, a failed job) name
  /// what went wrong.
  compute::Result<EpochReport> train(compute::Model& model, const compute::Dataset& train_data,
                                     const OptimizerSpec& optimizer, int64_t epoch);

  /// Accuracy and loss of model on data, in this process. Errors name what of data the model
  /// does not take (a label outside its classes, a sample of another shape).
  compute::Result<compute::Evaluation> test(compute::Model& model, const compute::Dataset& data);

 private:
  TrainerOptions o_;
  bool data_written_ = false;
  const compute::Dataset* written_ = nullptr;  // the data set under out/data (by address and size)
  int64_t written_size_ = 0;
  std::unique_ptr<compute::Backend> backend_;  // test()'s
};

}  // namespace tepdist

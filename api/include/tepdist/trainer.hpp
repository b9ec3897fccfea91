#pragma once
// tepdist::Trainer: distributed training from your own C++ program.
//
//   class Net : public tepdist::compute::Model { ... add<Conv2d>(1, 20, 5); ... };
//
//   int main(int argc, char** argv) {
//     tepdist::Trainer::serve(argc, argv, [] { return std::make_unique<Net>(); });  // first thing
//     tepdist::Trainer trainer({.mode = "sync", .nodes = 2, .epochs = 3, .test_data = test});
//     Net net;
//     net.build(train.sample_shape(), 0);
//     for (int epoch = 0; epoch < 3; ++epoch) {
//       auto report = trainer.train(net, train, optimizer, epoch);  // compute::Result<EpochReport>
//       auto eval = trainer.test(net, test);                         // in this process
//     }
//   }  // the Trainer's destructor ends the job and stops its nodes
//
// The lifecycle. A Trainer holds one job for its life. The first train() call starts it: the
// nodes (options.nodes processes on this machine, each a relaunch of this very program, which is
// why serve() comes first in main(); or the running cluster options.seeds names), then the job
// of options.epochs epochs from the model's parameters. Each train() call is the job's next
// epoch: the job pauses after it (gossip averages its replicas; async assembles the model from
// its shards), the parameters come back into the model, and the next call releases the next
// epoch of the same job (optimiser state, schedule, generations and positions carry on, as in one
// `tepdist run` of that many epochs). close(), or the destructor, ends the job and stops the
// nodes it started, also when the program throws; if the program is killed, its nodes get
// SIGTERM from the kernel and leave.
//
// Data. Any compute::Dataset (byte images or float features, any sample shape) reaches the nodes
// as it is, as a data set file under options.out/data (compute/data/dataset_file.hpp): nodes that
// read the same bytes there (local nodes, a shared file system) use it, the others (a running
// cluster on other machines) fetch it from this program over the wire, as they do the starting
// parameters and those the program sets between calls. The job's own evaluations (every epoch
// end, in the report) use options.test_data.
//
// Errors are values: compute::Result holds what went wrong, naming it (a bad option, a node that
// could not start, a job that failed and why, a model the nodes cannot build).

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compute/backend.hpp"
#include "compute/data/dataset.hpp"
#include "compute/presets.hpp"
#include "compute/model.hpp"
#include "compute/optimizer.hpp"
#include "compute/train.hpp"

namespace tepdist {

struct TrainerOptions {
  std::string mode = "async";  ///< "sync", "async" or "gossip"
  /// Node processes of this program started on this machine, once, for the Trainer's life.
  int nodes = 2;
  /// The job's length: train() is called for epochs 0 .. epochs-1 (the schedule spans them all).
  int64_t epochs = 3;
  /// The job's own evaluations (at each epoch's end, in its report); none: the first 1,000
  /// training samples.
  std::optional<compute::Dataset> test_data;
  /// A running cluster instead of local nodes: members' HOST:PORT, and its secret file (mode
  /// 0600). Its nodes build the model from `layers` when given (plain `tepdist node` processes);
  /// else from the factory serve() registered, which only nodes running this program have.
  std::vector<std::string> seeds;
  std::filesystem::path secret_file;
  /// The model as a layer list (the [model] layers of a job file), for nodes that do not run this
  /// program; it must build the same parameters as the model passed to train().
  std::vector<compute::LayerSpec> layers;
  /// A job file for everything else ([job], [elastic], [membership], ...); none: the defaults.
  /// mode, nodes, epochs, the data and the optimiser given here win.
  std::optional<std::filesystem::path> config;
  std::vector<std::string> overrides;  ///< "section.key=value", as `tepdist run --set`
  std::filesystem::path out = "tepdist-trainer";
  int64_t batch_size = 64;  ///< per worker
  uint64_t seed = 0;        ///< the job's: its shuffles
  std::string listen = "127.0.0.1:0";  ///< where this program's member listens (reachable from the nodes)
};

/// What to optimise with: the optimiser and its learning-rate schedule (total_steps is filled in).
struct OptimizerSpec {
  compute::OptimizerOptions options;
  compute::ScheduleOptions schedule;
};

/// One train() call's outcome.
struct EpochReport {
  int64_t epoch = 0;     ///< the epoch trained (from 0)
  uint32_t members = 0;  ///< workers at its end
  uint64_t steps = 0;    ///< the job's global steps so far
  uint64_t samples = 0;  ///< trained in this call
  double train_seconds = 0, samples_per_second = 0;
  /// The job's own evaluation of the epoch's model on options.test_data (none: it did not run, as
  /// when rank 0 changed at the epoch's end).
  std::optional<double> test_accuracy, test_loss;
  uint64_t generation = 0;           ///< the job's generation at the end of the call
  std::vector<std::string> events;   ///< membership changes and generations during the call
  uint64_t job_id = 0;
  std::filesystem::path logs;        ///< where the nodes' logs are (local nodes) and this program's member's
};

using ModelFactory = std::function<std::unique_ptr<compute::Model>()>;

class Trainer {
 public:
  /// Call first in main(). Run as `PROGRAM node FILE [--join HOST:PORT] [--name N] [--listen
  /// HOST:PORT] [--set K=V] [--ready-file F]` (how a Trainer starts its local nodes, and how an
  /// operator adds a node of this program to a running cluster), it runs that node with models made
  /// by `factory` (unbuilt; the job builds them) and exits the process; otherwise it registers the
  /// factory and returns. A program on this API therefore leaves the first argument "node" to it.
  static void serve(int argc, char** argv, ModelFactory factory);

  explicit Trainer(TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Epoch `epoch` (0, 1, ... in order, below options.epochs) of the job, from model's parameters
  /// and leaving the result in them. The first call starts the job with train_data and optimizer;
  /// later calls must pass the same data set (it is the job's). Parameters and an optimiser the
  /// program changed since the last call are the next epoch's, in every mode: the optimiser's
  /// state (momentum, Adam's moments and step count) carries on where the new one keeps the same
  /// buffers (another momentum; Adam and AdamW), else starts afresh, and its schedule is made anew.
  /// Errors name what went wrong; after a failed job, the next call starts a new one.
  compute::Result<EpochReport> train(compute::Model& model, const compute::Dataset& train_data,
                                     const OptimizerSpec& optimizer, int64_t epoch);

  /// Accuracy and loss of model on data, in this process. Errors name what of data the model
  /// does not take (a label outside its classes, a sample of another shape).
  compute::Result<compute::Evaluation> test(compute::Model& model, const compute::Dataset& data);

  /// Ends the job (if it is still running) and stops the nodes this Trainer started. Idempotent;
  /// the destructor calls it.
  void close();

  /// The process ids of the local nodes running now (none for a running cluster).
  std::vector<int> node_pids() const;

 private:
  struct Job;
  struct Nodes;
  compute::Result<void> start_job(compute::Model& model, const compute::Dataset& train_data,
                                  const OptimizerSpec& optimizer, int64_t epoch);
  compute::Result<EpochReport> wait_epoch(compute::Model& model, int64_t epoch);
  void end_job();

  TrainerOptions o_;
  std::unique_ptr<Nodes> nodes_;
  std::unique_ptr<Job> job_;
  int64_t next_epoch_ = 0;
  int jobs_started_ = 0;
  uint64_t samples_at_ = 0;  // the job's samples when the last call returned
  std::unique_ptr<compute::Backend> backend_;  // test()'s
};

}  // namespace tepdist

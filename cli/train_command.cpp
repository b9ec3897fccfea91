#include "cli/train_command.hpp"

#include <fmt/core.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>

#include "compute/data/dataset.hpp"
#include "compute/io/checkpoint.hpp"
#include "compute/io/files.hpp"
#include "compute/presets.hpp"
#include "compute/backends.hpp"
#include "compute/resident.hpp"
#include "compute/train.hpp"
#include "elastic/config.hpp"
#include "elastic/job.hpp"

namespace tepdist::cli {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

/// SIGINT and SIGTERM, blocked in every thread from the start of the command and taken at step
/// boundaries: no handler runs, so no signal frame lands on a thread inside oneDNN (whose GEMM
/// kernels point rsp into the heap: compute/onednn/signals.hpp).
class StopSignals {
 public:
  StopSignals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);  // before any thread starts: they inherit it
  }
  /// Whether one came (consumed); sticky once it has.
  bool requested() {
    const timespec now_only{0, 0};
    if (!seen_ && sigtimedwait(&set_, nullptr, &now_only) > 0) seen_ = true;
    return seen_;
  }

 private:
  sigset_t set_;
  bool seen_ = false;
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

/// Training time with the clock stopped during evaluation and checkpoints.
class TrainClock {
 public:
  void start() { running_since_ = Clock::now(); }
  void pause() {
    if (running_since_) total_ += seconds_since(*running_since_);
    running_since_.reset();
  }
  double seconds() const { return total_ + (running_since_ ? seconds_since(*running_since_) : 0.0); }

 private:
  std::optional<Clock::time_point> running_since_;
  double total_ = 0.0;
};

int usage_error(const std::string& message) {
  fmt::print(stderr, "tepdist train: {}\n", message);
  return 2;
}

int runtime_error(const std::string& message) {
  fmt::print(stderr, "tepdist train: {}\n", message);
  return 1;
}

struct EvalRecord {
  int64_t step, epoch;
  double train_seconds;
  compute::Evaluation result;
};

}  // namespace

int run_train(const TrainArgs& args) {
  StopSignals stop;
  const auto process_start = Clock::now();
  std::vector<std::string> overrides = args.overrides;
  if (args.epochs) overrides.push_back(fmt::format("job.epochs={}", *args.epochs));
  if (args.threads) overrides.push_back(fmt::format("compute.threads={}", *args.threads));
  std::optional<fs::path> file;
  if (args.config) file = *args.config;
  auto config = elastic::load_config(file, overrides);
  if (!config) return usage_error(config.error().message);
  const elastic::JobConfig& c = *config;

  std::error_code ec;
  fs::create_directories(args.out, ec);
  if (ec) return usage_error(fmt::format("{}: cannot create the output directory: {}", args.out, ec.message()));
  const fs::path out = args.out;

  auto data = elastic::load_job_data(c.data, c.job.seed);
  if (!data) return runtime_error(data.error().message);
  auto model = elastic::build_job_model(c, data->train);
  if (!model) return usage_error(model.error().message);
  compute::Model& net = **model;

  auto made = compute::make_backend(c.compute.backend, elastic::backend_options(c));
  if (!made) return usage_error(fmt::format("{}: {}", c.source, made.error().message));
  const std::unique_ptr<compute::Backend> backend = std::move(*made);
  backend->set_threads(static_cast<int>(c.compute.threads));

  const int64_t n = data->train.size();
  const int64_t batch = c.data.batch_size;
  const int64_t steps_per_epoch = (n + batch - 1) / batch;
  int64_t total_steps = steps_per_epoch * c.job.epochs;
  if (c.job.max_steps > 0) total_steps = std::min(total_steps, c.job.max_steps);

  // Parameters, gradient and optimiser state where the backend computes (the device, for cuda);
  // the sync points below copy them to the model's buffers only for evaluation, checkpoints and
  // the export.
  auto made_resident = compute::make_resident(net, *backend, c.optimizer.options);
  if (!made_resident) return usage_error(fmt::format("{}: {}", c.source, made_resident.error().message));
  const std::unique_ptr<compute::ResidentState> resident = std::move(*made_resident);
  compute::ScheduleOptions schedule_options = c.optimizer.schedule;
  schedule_options.total_steps = total_steps;
  auto schedule = compute::LrSchedule::make(schedule_options);
  if (!schedule) return usage_error(fmt::format("{}: {}", c.source, schedule.error().message));

  compute::TrainingState state{0, 0, c.job.seed, {}};
  const fs::path checkpoint_path = out / "checkpoint";
  if (args.resume) {
    auto restored = compute::load_checkpoint(checkpoint_path, net, resident->optimizer());
    if (!restored) return runtime_error(fmt::format("--resume: {}", restored.error().message));
    resident->push_parameters();
    resident->push_optimizer();
    state = *restored;
    fmt::print("resumed from {} at epoch {}, step {}\n", checkpoint_path.string(), state.epoch, state.step);
  }

  fmt::print("tepdist train: {} on {} ({} train, {} test samples), backend {}, {} threads\n",
             c.model.layers.empty() ? c.model.preset : std::string("custom model"), c.data.dataset, n,
             data->test.size(), backend->name(), c.compute.threads ? c.compute.threads : sysconf(_SC_NPROCESSORS_ONLN));
  fmt::print("{}", net.summary());
  const std::string compute_path = net.compute_path(*backend, batch);
  fmt::print("compute path: {}\n", compute_path);
  fmt::print("training state: {}\n", resident->where());

  const bool tty = isatty(STDOUT_FILENO);
  compute::Tensor x;
  std::vector<int32_t> y;
  std::vector<EvalRecord> evals;
  std::optional<double> time_to_target;
  TrainClock train_clock;
  double eval_seconds = 0.0, checkpoint_seconds = 0.0, startup_seconds = 0.0;
  int64_t samples = 0, window_samples = 0;
  double window_start = 0.0, loss = 0.0;

  // A test set the model refuses (a label outside its classes, a sample of another shape) ends
  // the command with the refusal.
  auto evaluate_now = [&]() -> compute::Result<void> {
    train_clock.pause();
    const auto t0 = Clock::now();
    resident->pull_parameters();
    const auto e = compute::try_evaluate(net, *backend, data->test);
    if (!e)
      return compute::fail(e.error().code, fmt::format("evaluation at step {}: {}", state.step, e.error().message));
    eval_seconds += seconds_since(t0);
    evals.push_back({state.step, state.epoch, train_clock.seconds(), *e});
    if (!time_to_target && e->accuracy >= c.job.target_accuracy) time_to_target = train_clock.seconds();
    fmt::print("{}eval  epoch {} step {}: test accuracy {:.4f}, test loss {:.4f}\n", tty ? "\r\033[K" : "",
               state.epoch, state.step, e->accuracy, e->loss);
    std::fflush(stdout);
    train_clock.start();
    return {};
  };
  auto checkpoint_now = [&]() -> compute::Result<void> {
    train_clock.pause();
    const auto t0 = Clock::now();
    resident->pull_parameters();
    resident->pull_optimizer();
    auto ok = compute::save_checkpoint(checkpoint_path, net, resident->optimizer(), state);
    checkpoint_seconds += seconds_since(t0);
    train_clock.start();
    return ok;
  };

  bool first_step = true;
  while (state.epoch < c.job.epochs && state.step < total_steps && !stop.requested()) {
    std::vector<int64_t> order(static_cast<size_t>(n));
    if (c.data.shuffle)
      order = compute::shuffled_indices(n, c.job.seed, state.epoch);
    else
      std::iota(order.begin(), order.end(), 0);
    // A resumed run may start inside an epoch; the order is a function of (seed, epoch), so
    // skipping the batches already done continues exactly where the checkpoint left off.
    int64_t start = (state.step - state.epoch * steps_per_epoch) * batch;
    for (; start < n && state.step < total_steps && !stop.requested(); start += batch) {
      if (first_step) {
        startup_seconds = seconds_since(process_start);
        train_clock.start();
        first_step = false;
      }
      const std::span<const int64_t> idx(order.data() + start, static_cast<size_t>(std::min(batch, n - start)));
      compute::gather_batch(data->train, idx, x, y);
      const auto computed = resident->compute_gradients(x, y);
      if (!computed) return runtime_error(fmt::format("step {}: {}", state.step + 1, computed.error().message));
      loss = *computed;
      if (auto finite = compute::check_finite_step(state.step + 1, loss, resident->gradient_finite()); !finite) {
        // Refused before the optimiser steps. The checkpoint is left as it was (the last epoch's
        // end, or a run before): the steps since may have been blowing up while still finite.
        return runtime_error(fs::exists(checkpoint_path)
                                 ? fmt::format("{}; the checkpoint in {} is kept as it was", finite.error().message,
                                               checkpoint_path.string())
                                 : finite.error().message);
      }
      resident->step(schedule->at(state.step));
      ++state.step;
      samples += static_cast<int64_t>(idx.size());
      window_samples += static_cast<int64_t>(idx.size());
      if (state.step % c.job.log_every_steps == 0) {
        const double now = train_clock.seconds();
        const double rate = static_cast<double>(window_samples) / std::max(now - window_start, 1e-9);
        fmt::print("{}epoch {}/{} step {}/{} loss {:.4f} {:.0f} samples/s{}", tty ? "\r\033[K" : "",
                   state.epoch + 1, c.job.epochs, state.step, total_steps, loss, rate, tty ? "" : "\n");
        std::fflush(stdout);
        window_start = now;
        window_samples = 0;
      }
      if (c.job.eval_every_steps > 0 && state.step % c.job.eval_every_steps == 0)
        if (auto ok = evaluate_now(); !ok) return runtime_error(ok.error().message);
    }
    if (start < n) break;  // stopped inside the epoch: step cap or interrupt
    ++state.epoch;
    if (evals.empty() || evals.back().step != state.step)
      if (auto ok = evaluate_now(); !ok) return runtime_error(ok.error().message);
    if (auto ok = checkpoint_now(); !ok) return runtime_error(ok.error().message);
  }
  train_clock.pause();

  if (stop.requested()) {
    if (auto ok = checkpoint_now(); !ok) return runtime_error(ok.error().message);
    fmt::print("\ninterrupted at step {}; checkpoint in {} (continue with --resume)\n", state.step,
               checkpoint_path.string());
    return 130;
  }
  if (evals.empty() || evals.back().step != state.step)
    if (auto ok = evaluate_now(); !ok) return runtime_error(ok.error().message);

  resident->pull_parameters();
  if (auto ok = compute::export_safetensors(out / "model.safetensors", net); !ok)
    return runtime_error(ok.error().message);
  if (auto ok = checkpoint_now(); !ok) return runtime_error(ok.error().message);

  const double wall = train_clock.seconds();
  const auto& last = evals.back().result;
  nlohmann::json evaluations = nlohmann::json::array();
  for (const auto& e : evals)
    evaluations.push_back({{"step", e.step}, {"epoch", e.epoch}, {"train_seconds", e.train_seconds},
                           {"test_accuracy", e.result.accuracy}, {"test_loss", e.result.loss}});
  const nlohmann::json result = {
      {"mode", "single"},
      {"nodes", 1},
      {"epochs", state.epoch},
      {"steps", state.step},
      {"samples", samples},
      {"wall_seconds", wall},
      {"startup_seconds", startup_seconds},
      {"eval_seconds", eval_seconds},
      {"checkpoint_seconds", checkpoint_seconds},
      {"samples_per_second", wall > 0 ? samples / wall : 0.0},
      {"test_accuracy", last.accuracy},
      {"test_loss", last.loss},
      {"target_accuracy", c.job.target_accuracy},
      {"time_to_target_seconds", time_to_target ? nlohmann::json(*time_to_target) : nlohmann::json(nullptr)},
      {"membership_events", 0},
      {"checkpoint", fs::absolute(checkpoint_path).string()},
      {"compute_path", compute_path},
      {"seed", c.job.seed},
      {"backend", backend->name()},
      {"threads", c.compute.threads},
      {"batch_size", batch},
      {"peak_rss_mb", peak_rss_mb()},
      {"evaluations", evaluations},
  };
  if (auto ok = compute::write_file_atomically(out / "result.json", result.dump(2) + "\n"); !ok)
    return runtime_error(ok.error().message);

  fmt::print("{}done: {} epochs, {} steps in {:.1f} s ({:.0f} samples/s), test accuracy {:.4f}, peak RSS {:.0f} MB\n",
             tty ? "\r\033[K" : "", state.epoch, state.step, wall, wall > 0 ? samples / wall : 0.0, last.accuracy,
             peak_rss_mb());
  fmt::print("wrote {}, {}, {}\n", (out / "result.json").string(), (out / "model.safetensors").string(),
             checkpoint_path.string());
  return 0;
}

}  // namespace tepdist::cli

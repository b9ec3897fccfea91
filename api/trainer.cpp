#include "tepdist/trainer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <future>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "actors/launcher.hpp"
#include "actors/node.hpp"
#include "actors/router.hpp"
#include "actors/submitter.hpp"
#include "compute/backends.hpp"
#include "compute/data/dataset_file.hpp"
#include "compute/io/checkpoint.hpp"
#include "compute/io/files.hpp"
#include "elastic/config.hpp"
#include "elastic/job_files.hpp"
#include "elastic/job.hpp"

namespace tepdist {
namespace fs = std::filesystem;
using compute::Errc;
using Clock = std::chrono::steady_clock;

namespace {

std::unexpected<compute::Error> error(Errc code, const std::string& why) {
  return compute::fail(code, "tepdist::Trainer: " + why);
}

using elastic::toml_string;

/// `--set` values for the optimiser the caller chose.
std::vector<std::string> optimizer_overrides(const OptimizerSpec& o) {
  const auto& a = o.options;
  const auto& s = o.schedule;
  return {fmt::format("optimizer.name={}", toml_string(a.name)), fmt::format("optimizer.lr={}", s.base_lr),
          fmt::format("optimizer.momentum={}", a.momentum),      fmt::format("optimizer.nesterov={}", a.nesterov),
          fmt::format("optimizer.weight_decay={}", a.weight_decay), fmt::format("optimizer.beta1={}", a.beta1),
          fmt::format("optimizer.beta2={}", a.beta2),            fmt::format("optimizer.eps={}", a.eps),
          fmt::format("optimizer.schedule={}", toml_string(s.kind)),
          fmt::format("optimizer.warmup_steps={}", s.warmup_steps), fmt::format("optimizer.step_size={}", s.step_size),
          fmt::format("optimizer.gamma={}", s.gamma),            fmt::format("optimizer.min_lr={}", s.min_lr)};
}

/// The layer list as a TOML array of inline tables, for model.layers.
std::string layers_toml(const std::vector<compute::LayerSpec>& layers) {
  std::vector<std::string> items;
  for (const auto& l : layers) {
    std::string item = "{type = " + toml_string(l.type);
    if (!l.name.empty()) item += ", name = " + toml_string(l.name);
    for (const auto& [key, value] : l.args) item += fmt::format(", {} = {}", key, value);
    items.push_back(item + "}");
  }
  return fmt::format("[{}]", fmt::join(items, ", "));
}

bool same_optimizer(const OptimizerSpec& a, const OptimizerSpec& b) {
  return optimizer_overrides(a) == optimizer_overrides(b);
}

}  // namespace

/// The local nodes, started once for the Trainer's life, and what the launcher said of them.
struct Trainer::Nodes {
  std::unique_ptr<actors::LocalCluster> cluster;
  std::mutex mutex;
  std::vector<std::string> events;  // restarts by the launcher's keeper, until a report takes them
  // The thread the nodes are forked from, alive until they are stopped: a node's parent-death
  // signal (PR_SET_PDEATHSIG) comes when the thread that forked it ends, not the process, and the
  // first train() call may come from a thread that ends long before the Trainer.
  std::thread owner;
  std::mutex owner_mutex;
  std::condition_variable owner_done;
  bool stopping = false;

  /// Starts the cluster from the owner thread.
  std::expected<void, std::string> start(const elastic::JobConfig& config, const fs::path& out) {
    std::promise<std::expected<std::unique_ptr<actors::LocalCluster>, std::string>> started;
    auto result = started.get_future();
    owner = std::thread([this, &config, &out, &started] {
      started.set_value(actors::start_local_cluster(config, out, [this](const std::string& what) {
        std::lock_guard lock(mutex);
        events.push_back("local node " + what);
      }));
      std::unique_lock lock(owner_mutex);
      owner_done.wait(lock, [this] { return stopping; });
    });
    auto made = result.get();
    if (!made) return std::unexpected(made.error());
    cluster = std::move(*made);
    return {};
  }

  ~Nodes() {
    cluster.reset();  // stops and reaps every node (from any thread of this process)
    {
      std::lock_guard lock(owner_mutex);
      stopping = true;
    }
    owner_done.notify_all();
    if (owner.joinable()) owner.join();
  }
};

/// One job: the member this program adds to the cluster to submit and follow it (a node of its
/// own, on a thread, until the job ends), and what that member gathered.
struct Trainer::Job {
  uint64_t id = 0;
  int64_t first_epoch = 0;  // the train() epoch that is the job's epoch 0 (a job after a failed one starts later)
  fs::path dir;
  std::shared_ptr<actors::Submission> submission;
  std::thread member;
  // The job's inputs, which later calls must repeat.
  const compute::Dataset* data = nullptr;
  int64_t data_size = 0;
  OptimizerSpec optimizer;
  std::vector<float> left;  // the parameters the last call left in the model

  std::mutex mutex;  // everything below: the member's thread writes, train() reads
  std::condition_variable changed;
  size_t model_size = 0;
  uint64_t params_step = 0;
  std::vector<float> params;
  std::set<uint64_t> pieces;  // offsets received for params_step
  size_t received = 0;
  std::optional<gossip::JobReport> held, last_progress;
  std::optional<Clock::time_point> held_at;
  std::vector<gossip::JobReport> evaluations, done;
  std::vector<std::string> events;
  uint64_t generation = 0;
  std::optional<int> status;
  std::string why;

  bool params_complete(uint64_t step) const { return params_step == step && received == model_size && model_size > 0; }
};

void Trainer::serve(int argc, char** argv, ModelFactory factory) {
  elastic::set_program_model(std::move(factory));
  // `PROGRAM node FILE ...`: a node the launcher started, or one an operator started by hand to
  // join a running cluster that trains this program's model.
  if (argc < 2 || std::strcmp(argv[1], "node") != 0) return;
  std::exit(actors::run_node_process(actors::parse_relaunch_args(argc, argv)));
}

Trainer::Trainer(TrainerOptions options) : o_(std::move(options)) {}

Trainer::~Trainer() { close(); }

std::vector<int> Trainer::node_pids() const {
  if (!nodes_ || !nodes_->cluster) return {};
  const auto pids = nodes_->cluster->nodes.pids();
  return {pids.begin(), pids.end()};
}

void Trainer::end_job() {
  if (!job_) return;
  auto& j = *job_;
  if (j.member.joinable()) {
    // A job still running is stopped, and its end awaited (the workers report it): a member
    // that left first would leave the job to train on, detached, on a running cluster. Should
    // the workers not answer, the member is told to go (SIGTERM, as Ctrl-C on `tepdist run`).
    std::unique_lock lock(j.mutex);
    if (!j.status && j.submission->stop())
      j.changed.wait_for(lock, std::chrono::seconds(10), [&] { return j.status.has_value(); });
    const bool running = !j.status;
    lock.unlock();
    if (running) ::pthread_kill(j.member.native_handle(), SIGTERM);
    j.member.join();
  }
  job_.reset();
}

void Trainer::close() {
  end_job();
  nodes_.reset();  // stops and reaps every node this Trainer started
}

compute::Result<EpochReport> Trainer::train(compute::Model& model, const compute::Dataset& train_data,
                                            const OptimizerSpec& optimizer, int64_t epoch) {
  if (!model.built()) return error(Errc::invalid_argument, "train: build the model first");
  if (epoch != next_epoch_)
    return error(Errc::invalid_argument, fmt::format("train: epoch {} asked for, but the job's next epoch is {} (calls go "
                                                     "0, 1, 2, ... up to TrainerOptions::epochs - 1)",
                                                     epoch, next_epoch_));
  if (epoch >= o_.epochs)
    return error(Errc::invalid_argument, fmt::format("train: epoch {} is past the job's {} epochs "
                                                     "(TrainerOptions::epochs)",
                                                     epoch, o_.epochs));
  const auto params = model.parameters();
  bool running = false;
  if (job_) {
    std::lock_guard lock(job_->mutex);
    running = !job_->status;  // not over since (a failure between calls, or its target reached)
  }
  if (running) {
    // The next epoch of the running job: its inputs stay what they were.
    if (&train_data != job_->data || train_data.size() != job_->data_size)
      return error(Errc::invalid_argument, "train: the job trains on the data set its first train() call gave; pass that "
                                           "same data set (a new one needs a new Trainer)");
    // An optimiser the program changed: the workers apply it from the release on (its state kept
    // where it keeps the same buffers: compute::carry_state).
    std::string changed;
    if (!same_optimizer(optimizer, job_->optimizer)) {
      changed = fmt::format("{}", fmt::join(optimizer_overrides(optimizer), "\n"));
    }
    if (changed.size() + 32 > gossip::Control::max_argument)
      return error(Errc::invalid_argument, "train: the optimiser's settings are too long to send");
    const auto released = static_cast<uint32_t>(epoch - job_->first_epoch + 1);
    if (std::equal(params.begin(), params.end(), job_->left.begin(), job_->left.end())) {
      running = job_->submission->release(released, {}, 0, changed);
    } else {
      // Parameters the program set: the held workers (async: and the shards' holders) take them
      // from a file before they go on.
      const fs::path file = job_->dir / fmt::format("params-{}.safetensors", released);
      if (auto ok = compute::export_safetensors(file, model); !ok) return std::unexpected(ok.error());
      if (fs::absolute(file).string().size() + changed.size() + 32 > gossip::Control::max_argument)
        return error(Errc::invalid_argument, fmt::format("{}: the path is too long to send", file.string()));
      running = job_->submission->release(released, fs::absolute(file).string(), compute::checksum(params), changed);
    }
    if (running) job_->optimizer = optimizer;
  }
  // The first call, or the job is over: a job of the epochs left, from the model as it is.
  if (!running) {
    end_job();
    if (auto ok = start_job(model, train_data, optimizer, epoch); !ok) return std::unexpected(ok.error());
  }
  auto report = wait_epoch(model, epoch);
  if (!report) {
    end_job();  // a failed job is over; the next call starts another
    return report;
  }
  job_->left.assign(params.begin(), params.end());
  ++next_epoch_;
  if (next_epoch_ == o_.epochs) end_job();
  return report;
}

compute::Result<void> Trainer::start_job(compute::Model& model, const compute::Dataset& train_data,
                                         const OptimizerSpec& optimizer, int64_t epoch) {
  const bool local = o_.seeds.empty();
  if (!local && o_.secret_file.empty())
    return error(Errc::invalid_argument, "TrainerOptions::seeds names a running cluster; secret_file must name its secret");
  if (local && o_.nodes < 1) return error(Errc::invalid_argument, "TrainerOptions::nodes must be 1 or more");
  if (auto ok = train_data.check(); !ok) return error(Errc::invalid_argument, "the training set: " + ok.error().message);
  if (train_data.size() == 0) return error(Errc::invalid_argument, "the training set holds no samples");
  const fs::path out = fs::absolute(o_.out);
  const fs::path data = out / "data", dir = out / fmt::format("job-{}", ++jobs_started_);
  std::error_code ec;
  fs::create_directories(data, ec);
  fs::create_directories(dir / "logs", ec);
  if (ec) return error(Errc::io, fmt::format("cannot create {}: {}", dir.string(), ec.message()));

  // The data, as it is, in files every node reads.
  if (auto ok = compute::save_dataset(data / "train.tds", train_data); !ok) return std::unexpected(ok.error());
  if (o_.test_data) {
    if (auto ok = compute::save_dataset(data / "test.tds", *o_.test_data); !ok)
      return error(Errc::invalid_argument, "TrainerOptions::test_data: " + ok.error().message);
  }
  const fs::path init = dir / "init.safetensors";
  if (auto ok = compute::export_safetensors(init, model); !ok) return std::unexpected(ok.error());

  // The job file: the caller's (or the defaults), then what the options and the call say.
  // A job started after a failed one trains the epochs left.
  std::vector<std::string> keys = {
      fmt::format("job.mode={}", toml_string(o_.mode)),
      fmt::format("job.epochs={}", o_.epochs - epoch),
      fmt::format("job.seed={}", o_.seed + static_cast<uint64_t>(epoch)),
      "job.pause_between_epochs=true",
      "data.dataset=\"files\"",
      fmt::format("data.train_file={}", toml_string((data / "train.tds").string())),
      fmt::format("data.test_file={}", o_.test_data ? toml_string((data / "test.tds").string()) : "\"\""),
      "data.train_samples=0",
      "data.test_samples=0",
      fmt::format("data.batch_size={}", o_.batch_size),
      fmt::format("model.init_file={}", toml_string(init.string())),
      o_.layers.empty() ? std::string("model.preset=\"program\"") : "model.layers=" + layers_toml(o_.layers),
      fmt::format("cluster.local_nodes={}", local ? o_.nodes : 0),
  };
  for (auto& k : optimizer_overrides(optimizer)) keys.push_back(std::move(k));
  if (!local) {
    std::vector<std::string> seeds;
    for (const auto& s : o_.seeds) seeds.push_back(toml_string(s));
    keys.push_back(fmt::format("cluster.seeds=[{}]", fmt::join(seeds, ", ")));
    keys.push_back(fmt::format("cluster.secret_file={}", toml_string(fs::absolute(o_.secret_file).string())));
  }
  const bool quorum_given = std::any_of(o_.overrides.begin(), o_.overrides.end(),
                                        [](const std::string& k) { return k.starts_with("elastic.quorum"); });
  // Local nodes on one machine cannot be partitioned: job control may go on with any survivor.
  if (local && !quorum_given) keys.push_back("elastic.quorum=\"any\"");
  for (const auto& k : o_.overrides) keys.push_back(k);
  auto config = o_.config ? elastic::load_config(*o_.config, keys) : elastic::parse_config("", "(tepdist::Trainer)", keys);
  if (!config) return error(Errc::invalid_argument, config.error().message);
  if (config->job.mode == "single")
    return error(Errc::invalid_argument, "TrainerOptions::mode: \"sync\", \"async\" or \"gossip\"");
  // The job as submitted, for the record (`tepdist run` takes it as it is).
  {
    auto text = elastic::text_for_nodes(*config);
    if (!text) return error(Errc::invalid_argument, text.error().message);
    if (auto ok = compute::write_file_atomically(dir / "job.toml", *text); !ok) return std::unexpected(ok.error());
  }
  // The model the job builds must be the caller's: the same parameters, in name and shape.
  {
    auto built = elastic::build_job_model(*config, train_data);
    if (!built)
      return error(Errc::mismatch, fmt::format("the job's model does not build from the model passed to train(): {}",
                                               built.error().message));
  }

  // The cluster: this Trainer's local nodes (started once), or the running one.
  std::vector<std::string> seeds = o_.seeds;
  elastic::JobConfig cluster = *config;
  std::string secret;
  if (local) {
    if (!nodes_) {
      auto nodes = std::make_unique<Nodes>();
      if (auto started = nodes->start(*config, out); !started) return error(Errc::io, started.error());
      nodes_ = std::move(nodes);
    }
    seeds = nodes_->cluster->seeds;
    secret = nodes_->cluster->secret;
    const std::vector<std::string> cluster_keys = {
        "cluster.local_nodes=0", "cluster.secret=\"\"",
        fmt::format("cluster.secret_file={}", toml_string(fs::absolute(out / "secret").string()))};
    auto with_cluster = elastic::parse_config(config->text, config->source, cluster_keys);
    if (!with_cluster) return error(Errc::invalid_argument, with_cluster.error().message);
    cluster = *with_cluster;
  } else {
    auto s = elastic::load_secret(config->cluster);
    if (!s) return error(Errc::invalid_argument, fmt::format("{}: {}", o_.secret_file.string(), s.error().message));
    secret = *s;
  }

  samples_at_ = 0;
  auto job = std::make_unique<Job>();
  job->id = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  job->first_epoch = epoch;
  job->dir = dir;
  job->data = &train_data;
  job->data_size = train_data.size();
  job->optimizer = optimizer;
  job->model_size = model.parameters().size();
  auto shipped = elastic::text_for_nodes(cluster);
  if (!shipped) return error(Errc::invalid_argument, shipped.error().message);
  auto submission = std::make_shared<actors::Submission>();
  submission->job.job_id = job->id;
  submission->job.config = std::move(*shipped);
  // The data and the starting parameters, which this process serves to nodes that cannot read
  // them where it wrote them (a running cluster on other machines).
  auto files = elastic::describe_job_files(cluster);
  if (!files) return error(Errc::io, files.error());
  submission->job.files = std::move(*files);
  submission->job.released_epochs = 1;
  submission->expected_workers = local ? static_cast<size_t>(o_.nodes) : 0;
  submission->join_timeout_s = config->cluster.join_timeout_s;
  submission->report_timeout_s = config->job.step_timeout_s + 120;
  Job* j = job.get();
  submission->on_report = [j](const gossip::JobReport& r, const std::string&) {
    std::lock_guard lock(j->mutex);
    using K = gossip::JobReport::Kind;
    if (r.kind == K::held) {
      if (!j->held || j->held->epoch != r.epoch || j->held->step != r.step) j->held_at = Clock::now();
      j->held = r;
    } else if (r.kind == K::evaluation) {
      j->evaluations.push_back(r);
    } else if (r.kind == K::done) {
      j->done.push_back(r);
    } else if (r.kind == K::progress) {
      j->last_progress = r;
    } else {
      j->why = r.error;
    }
    j->changed.notify_all();
  };
  submission->on_params = [j](const gossip::TensorChunk& chunk) {
    std::lock_guard lock(j->mutex);
    // Only this job's model (from rank 0 of the generation the member knows: the submitter
    // checks), each piece once. Pieces of another step start the model afresh: a new rank 0 may
    // stand at a lower step than the old one (gossip and async count each worker's own).
    if (chunk.total != j->model_size) return;
    if (chunk.step != j->params_step || j->params.empty()) {
      j->params_step = chunk.step;
      j->params.assign(chunk.total, 0.0f);
      j->pieces.clear();
      j->received = 0;
    }
    if (!j->pieces.insert(chunk.offset).second) return;
    std::copy(chunk.data.begin(), chunk.data.end(), j->params.begin() + static_cast<ptrdiff_t>(chunk.offset));
    j->received += chunk.data.size();
    j->changed.notify_all();
  };
  submission->on_generation = [j](const gossip::JobStart& g) {
    std::lock_guard lock(j->mutex);
    j->generation = g.generation;
    // The model comes again from this generation's rank 0 (the pieces of two generations' ranks
    // 0 may stand for different models at one step).
    j->params.clear();
    j->pieces.clear();
    j->received = 0;
    if (g.generation > 1)
      j->events.push_back(fmt::format("generation {}: workers {}, resuming at step {}", g.generation,
                                      fmt::join(g.workers, " "), g.resume.step));
  };
  submission->on_membership_event = [j](const std::string& event) {
    std::lock_guard lock(j->mutex);
    j->events.push_back(event);
  };
  submission->on_end = [j](int status, const std::string& why) {
    std::lock_guard lock(j->mutex);
    j->status = status;
    if (!why.empty()) j->why = why;
    j->changed.notify_all();
  };
  job->submission = submission;

  const fs::path member_log = dir / "logs" / "trainer.log";
  if (!actors::node_events_to_file(member_log.string()))
    return error(Errc::io, fmt::format("cannot write {}", member_log.string()));
  actors::NodeOptions node;
  node.config = cluster;
  node.config.monitor.http.clear();  // it trains nothing: the nodes' endpoints show the job
  node.secret = secret;
  node.name = fmt::format("trainer-{}-{}", ::getpid(), jobs_started_);
  node.listen = o_.listen;
  node.join = seeds;
  node.submission = submission;
  job->member = std::thread([j, node] {
    // Signals meant for this node reach this thread only: close()'s SIGTERM, should it land
    // after run_node has returned, stays pending here rather than end the program.
    sigset_t signals;
    sigemptyset(&signals);
    for (const int sig : {SIGINT, SIGTERM, SIGUSR1}) sigaddset(&signals, sig);
    ::pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    const int status = actors::run_node(node);
    std::lock_guard lock(j->mutex);
    if (!j->status) j->status = status;
    j->changed.notify_all();
  });
  job_ = std::move(job);
  return {};
}

compute::Result<EpochReport> Trainer::wait_epoch(compute::Model& model, int64_t epoch) {
  auto& j = *job_;
  const auto began = Clock::now();
  const uint64_t released = static_cast<uint64_t>(epoch - j.first_epoch + 1);
  std::unique_lock lock(j.mutex);
  // The held report of this epoch's end with its model, or the job's end (rank 0 sent the model
  // before its done report, on the same connection).
  const auto at_hold = [&] {
    return j.held && j.held->epoch >= released && j.params_complete(j.held->step);
  };
  j.changed.wait(lock, [&] { return at_hold() || j.status.has_value(); });
  const gossip::JobReport* rank0 = nullptr;
  if (!at_hold()) {
    if (*j.status != 0)
      return error(Errc::invalid_argument,
                   fmt::format("the {} job {} failed in epoch {} (status {}): {}; logs in {}", o_.mode, j.id, epoch,
                               *j.status, j.why.empty() ? "no reason given" : j.why, (j.dir / "logs").string()));
    for (const auto& d : j.done)
      if (d.rank == 0) rank0 = &d;
    if (!rank0 || !j.params_complete(rank0->step))
      return error(Errc::invalid_argument, fmt::format("job {} ended without rank 0's model", j.id));
  }
  EpochReport report;
  report.epoch = epoch;
  report.job_id = j.id;
  report.generation = j.generation;
  report.logs = nodes_ ? fs::absolute(o_.out) / "logs" : j.dir / "logs";
  const auto ended = rank0 ? Clock::now() : j.held_at.value_or(Clock::now());
  report.train_seconds = std::chrono::duration<double>(ended - began).count();
  const gossip::JobReport& end = rank0 ? *rank0 : *j.held;
  report.members = end.members;
  report.steps = end.step;
  const auto evaluated = std::find_if(j.evaluations.begin(), j.evaluations.end(),
                                      [&](const gossip::JobReport& e) { return e.step == end.step; });
  if (evaluated != j.evaluations.end()) {
    report.test_accuracy = evaluated->test_accuracy;
    report.test_loss = evaluated->test_loss;
  } else if (rank0) {  // the job's last evaluation, in rank 0's done report
    report.test_accuracy = rank0->test_accuracy;
    report.test_loss = rank0->test_loss;
  }
  // Samples of this call: the job's count in rank 0's reports (sync: exact; gossip and async:
  // rank 0's own times the workers) since the last call's.
  const uint64_t samples_now = rank0 ? (j.last_progress ? j.last_progress->samples : 0) : j.held->samples;
  report.samples = samples_now >= samples_at_ ? samples_now - samples_at_ : 0;
  samples_at_ = samples_now;
  report.samples_per_second = report.train_seconds > 0 ? static_cast<double>(report.samples) / report.train_seconds : 0.0;
  std::copy(j.params.begin(), j.params.end(), model.parameters().begin());
  report.events = std::move(j.events);
  j.events.clear();
  if (nodes_) {
    std::lock_guard nodes_lock(nodes_->mutex);
    report.events.insert(report.events.end(), nodes_->events.begin(), nodes_->events.end());
    nodes_->events.clear();
  }
  return report;
}

compute::Result<compute::Evaluation> Trainer::test(compute::Model& model, const compute::Dataset& data) {
  if (!model.built()) return error(Errc::invalid_argument, "test: build the model first");
  if (!backend_) {  // one for the Trainer's life: the model's kernels for it are made once
    auto made = compute::make_backend("onednn");
    if (!made) made = compute::make_backend("ref");
    if (!made) return std::unexpected(made.error());
    backend_ = std::move(*made);
  }
  return compute::try_evaluate(model, *backend_, data);
}

}  // namespace tepdist

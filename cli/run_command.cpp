#include "cli/run_command.hpp"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "actors/launcher.hpp"
#include "actors/node.hpp"
#include "actors/router.hpp"
#include "cli/quickstart_config.hpp"
#include "compute/io/checkpoint.hpp"
#include "elastic/balance.hpp"
#include "elastic/checkpoints.hpp"
#include "elastic/job_files.hpp"
#include "elastic/progress.hpp"
#include "compute/io/files.hpp"
#include "elastic/coordination.hpp"
#include "elastic/job.hpp"
#include "elastic/job_control.hpp"

namespace tepdist::cli {
namespace {

/// Steps left in `epochs` epochs of `n` samples once `samples` are consumed, at `global` samples a
/// step (each epoch's last step takes what is left of it).
int64_t steps_left(int64_t n, int64_t epochs, int64_t samples, int64_t global) {
  if (n <= 0 || global <= 0) return 0;
  const int64_t epoch = samples / n, position = samples % n;
  if (epoch >= epochs) return 0;
  const int64_t per_epoch = (n + global - 1) / global;
  return (n - position + global - 1) / global + (epochs - epoch - 1) * per_epoch;
}

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

int usage_error(const std::string& message) {
  fmt::print(stderr, "tepdist run: {}\n", message);
  return 2;
}

int runtime_error(const std::string& message) {
  fmt::print(stderr, "tepdist run: {}\n", message);
  return 1;
}


/// Bounds on one sync step over the emulated network, for local nodes in index order (the ring
/// order of node-00, node-01, ...). Nothing when the network is not emulated.
struct RingBounds {
  /// The design brief's formula: 2(N-1) x the largest one-way latency on the ring + 2(N-1)/N x the
  /// buffer over the narrowest link + the compute of a step.
  double formula_s;
  /// A tighter one for rings of unequal links: every chunk crosses 2(N-1) consecutive links (one,
  /// for two workers, which exchange their buffers), so a step takes at least the slowest such path,
  /// and at least the narrowest link's 2(N-1)/N x the buffer; compute comes before either.
  double critical_path_s;
};

std::optional<RingBounds> ring_bounds(const elastic::JobConfig& c, size_t n, double bytes, double compute_s) {
  if (c.network.model.links.empty() || n < 2) return std::nullopt;
  auto region = [&](size_t k) { return c.node(elastic::local_node_name(static_cast<int64_t>(k))).region; };
  std::vector<double> latency_ms(n, 0.0);
  double bandwidth_mbit = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto* link = c.network.model.link(region(i), region((i + 1) % n));
    if (!link) continue;
    latency_ms[i] = link->latency_ms;
    if (link->bandwidth_mbit > 0) bandwidth_mbit = bandwidth_mbit > 0 ? std::min(bandwidth_mbit, link->bandwidth_mbit) : link->bandwidth_mbit;
  }
  const double w = static_cast<double>(n);
  const double transfer_s = bandwidth_mbit > 0 ? 2 * (w - 1) / w * bytes * 8 / (bandwidth_mbit * 1e6) : 0.0;
  double path_ms = 0;
  const size_t hops = n == 2 ? 1 : 2 * (n - 1);  // (gossip/collective/ring_allreduce.hpp)
  for (size_t start = 0; start < n; ++start) {
    double sum = 0;
    for (size_t hop = 0; hop < hops; ++hop) sum += latency_ms[(start + hop) % n];
    path_ms = std::max(path_ms, sum);
  }
  const double largest_ms = *std::max_element(latency_ms.begin(), latency_ms.end());
  return RingBounds{2 * (w - 1) * largest_ms / 1000 + transfer_s + compute_s,
                    std::max(path_ms / 1000, transfer_s) + compute_s};
}

/// Changes of the job's workers over its generations: each worker added, removed or restarted
/// after the first generation counts one.
size_t worker_changes(const nlohmann::json& generations) {
  size_t n = 0;
  for (size_t g = 1; g < generations.size(); ++g)
    n += generations[g]["added"].size() + generations[g]["removed"].size() + generations[g]["restarted"].size();
  return n;
}

/// What the submitter's hooks gather, from the submitter's thread; read after run_node returns.
struct Collected {
  std::mutex mutex;
  std::vector<gossip::JobReport> evaluations;
  // Done reports by worker: the latest of each, while it is the same run in the job (a worker
  // left out or restarted in a later generation loses its own, as the submitter's count does).
  std::map<std::string, gossip::JobReport> done;
  std::optional<gossip::JobStart> latest;  // the latest generation's record
  std::optional<gossip::JobReport> last_progress;
  std::vector<float> params;
  std::map<uint64_t, size_t> pieces;  // offset -> elements of each piece received
  size_t params_received = 0;
  uint64_t members = 0;
  std::string failure;
  std::optional<Clock::time_point> ended_at;  // the launcher's clock at the last done report
  std::vector<std::string> membership_events;  // "id joined|died|left|came back|restarted"
  nlohmann::json generations = nlohmann::json::array();
  // The rate in effect each time it changed (at most lr_history_limit entries: the oldest go).
  nlohmann::json lr_history = nlohmann::json::array();
  static constexpr size_t lr_history_limit = 64;
  void note_rate(uint64_t step, double lr) {
    if (!lr_history.empty()) {
      const double last = lr_history.back()["lr"].get<double>();
      if (std::abs(lr - last) <= 1e-6 * std::max(std::abs(lr), std::abs(last))) return;
    }
    lr_history.push_back({{"step", step}, {"lr", lr}});
    if (lr_history.size() > lr_history_limit) lr_history.erase(lr_history.begin());
  }
};

/// The progress line's part on load: a straggler (far slower than the others), and the sync
/// shares when they are not even.
std::string load_note(const std::vector<gossip::WorkerLoad>& loads) {
  std::vector<double> speeds;
  for (const auto& w : loads) speeds.push_back(w.samples_per_second);
  std::string out;
  if (const int s = elastic::straggler(speeds); s >= 0)
    out += fmt::format(" straggler {} ({:.0f} samples/s)", loads[static_cast<size_t>(s)].worker, speeds[static_cast<size_t>(s)]);
  const bool uneven = std::any_of(loads.begin(), loads.end(), [&](const auto& w) { return w.share != loads.front().share; });
  if (uneven) {
    out += " shares";
    for (size_t k = 0; k < loads.size(); ++k) out += fmt::format("{}{}", k ? "/" : " ", loads[k].share);
  }
  return out;
}

}  // namespace

int run_run_command(const RunArgs& args) {
  const auto process_start = Clock::now();
  std::vector<std::string> overrides = args.overrides;
  if (args.nodes) overrides.push_back(fmt::format("cluster.local_nodes={}", *args.nodes));
  if (args.mode) overrides.push_back(fmt::format("job.mode=\"{}\"", *args.mode));
  if (args.epochs) overrides.push_back(fmt::format("job.epochs={}", *args.epochs));
  // Local nodes on one machine cannot be partitioned: job control may go on with any survivor,
  // unless the file says otherwise (or emulates partitions, which it then must).
  const bool quorum_given = std::any_of(overrides.begin(), overrides.end(), [](const std::string& o) {
    return o.starts_with("elastic.quorum");
  });
  auto loaded = args.config ? elastic::load_config(fs::path(*args.config), overrides)
                            : elastic::parse_config(quickstart_toml, "(built-in configs/quickstart.toml)", overrides);
  if (!loaded) return usage_error(loaded.error().message);
  std::vector<std::string> implied;
  if (!quorum_given && loaded->cluster.local_nodes > 0 && loaded->network.model.partitions.empty() &&
      loaded->text.find("quorum") == std::string::npos)
    implied.push_back("elastic.quorum=\"any\"");
  // Checkpoints of a local cluster go beside its other output unless the file says where.
  if (const auto& e = loaded->elastic; loaded->cluster.local_nodes > 0 && e.checkpoint_dir.empty() &&
                                       (e.checkpoint_every_steps > 0 || e.checkpoint_every_s > 0))
    implied.push_back("elastic.checkpoint_dir=" + elastic::toml_string(fs::absolute(fs::path(args.out) / "checkpoints").string()));
  // A resumed gossip or async job: the step it resumed at, and the positions it has left.
  std::optional<std::pair<int64_t, uint64_t>> resumed_lists;
  uint64_t resumed_samples = 0;  // a resumed sync job: the samples its checkpoint had consumed
  if (args.resume) {
    if (loaded->cluster.local_nodes == 0 && loaded->elastic.checkpoint_dir.empty())
      return usage_error(fmt::format("{}: --resume on a running cluster needs [elastic] checkpoint_dir: the folder its "
                                     "nodes wrote the checkpoints to (each node's default is its own results_dir)",
                                     loaded->source));
    const fs::path dir = loaded->elastic.checkpoint_dir.empty() ? fs::path(args.out) / "checkpoints"
                                                                : fs::path(loaded->elastic.checkpoint_dir);
    auto found = elastic::latest_checkpoint(dir);
    if (!found) return usage_error(fmt::format("--resume: {}", found.error()));
    for (const auto& why : found->passed_over) fmt::print(stderr, "--resume: passed over {}\n", why);
    const auto& at = found->state;
    const uint64_t left = at.job ? elastic::span_total(elastic::spans_of(at.job->remaining)) : 0;
    if (at.job && at.job->mode != "sync") resumed_lists.emplace(at.step, left);
    if (at.job && at.job->mode == "sync") resumed_samples = at.job->samples;
    fmt::print("resuming from {}: step {}, epoch {}{}\n", found->part.string(), at.step, at.epoch + 1,
               !at.job                  ? std::string()
               : at.job->mode == "sync" ? fmt::format(", position {} (job {}, sync mode)", at.job->position, at.job->job_id)
                                        : fmt::format(", {} positions left (job {}, {} mode)", left, at.job->job_id,
                                                      at.job->mode));
    implied.push_back("elastic.resume_from=" + elastic::toml_string(fs::absolute(found->part).string()));
  }
  if (!implied.empty()) {
    overrides.insert(overrides.end(), implied.begin(), implied.end());
    loaded = args.config ? elastic::load_config(fs::path(*args.config), overrides)
                         : elastic::parse_config(quickstart_toml, "(built-in configs/quickstart.toml)", overrides);
    if (!loaded) return usage_error(loaded.error().message);
  }
  const elastic::JobConfig& c = *loaded;
  if (c.job.mode == "single")
    return usage_error(fmt::format("{}: job.mode = \"single\": `tepdist run` trains on a cluster (mode \"sync\", "
                                   "\"async\" or \"gossip\"); `tepdist train` trains in one process",
                                   c.source));
  const int64_t local = c.cluster.local_nodes;
  if (local == 0 && c.cluster.seeds.empty())
    return usage_error(fmt::format("{}: cluster.local_nodes is 0 and cluster.seeds is empty: set local_nodes to start "
                                   "nodes here, or seeds to join a running cluster",
                                   c.source));
  if (args.detach && local > 0)
    return usage_error(fmt::format("{}: --detach needs a running cluster (cluster.local_nodes = 0 and seeds): local "
                                   "nodes stop with the `tepdist run` that started them",
                                   c.source));
  // The data, before any process starts: a missing data set is this machine's error to report.
  auto data = elastic::load_job_data(c.data, c.job.seed);
  if (!data && local > 0) return usage_error(data.error().message);
  std::unique_ptr<compute::Model> model;
  if (data) {
    auto built = elastic::build_job_model(c, data->train);
    if (!built) return usage_error(built.error().message);
    model = std::move(*built);
  }

  const fs::path out = args.out;
  std::error_code ec;
  fs::create_directories(out / "logs", ec);
  fs::create_directories(out / "run", ec);
  if (ec) return usage_error(fmt::format("{}: cannot create the output directory: {}", out.string(), ec.message()));

  // The cluster: started here, or joined.
  std::unique_ptr<actors::LocalCluster> local_cluster;
  std::vector<std::string> seeds = c.cluster.seeds;
  std::string secret;
  elastic::JobConfig cluster = c;
  if (local > 0) {
    auto started = actors::start_local_cluster(c, out, [](const std::string& what) {
      fmt::print("\nlocal node {}\n", what);
      std::fflush(stdout);
    });
    if (!started) return runtime_error(started.error());
    local_cluster = std::move(*started);
    seeds = local_cluster->seeds;
    secret = local_cluster->secret;
    cluster = local_cluster->cluster;
    const auto& cluster_file = local_cluster->cluster_file;
    fmt::print("tepdist run: {} local nodes ({} threads each), logs in {}\n", local, local_cluster->threads,
               (out / "logs").string());
    fmt::print("  add a node:   tepdist node {} --join {}\n", cluster_file.string(), seeds[0]);
    fmt::print("  see them:     tepdist status {} --peer {}\n", cluster_file.string(), seeds[0]);
    if (!local_cluster->http.empty())
      fmt::print("  dashboard:    http://{}/  (also /metrics and /status)\n", local_cluster->http);
  } else {
    auto s = elastic::load_secret(c.cluster);
    if (!s) return usage_error(fmt::format("{}: {}", c.source, s.error().message));
    secret = *s;
  }

  // This process joins as the submitter and follows the job.
  const bool tty = isatty(STDOUT_FILENO);
  auto collected = std::make_shared<Collected>();
  auto submission = std::make_shared<actors::Submission>();
  submission->job.job_id = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  // The job as every node will hold it: without an inline secret (the nodes have their own).
  auto shipped = elastic::text_for_nodes(c);
  if (!shipped) return runtime_error(shipped.error().message);
  submission->job.config = std::move(*shipped);
  // The files it names, which this process serves to a node that cannot read them (another machine).
  auto files = elastic::describe_job_files(c);
  if (!files) return usage_error(fmt::format("{}: {}", c.source, files.error()));
  submission->job.files = std::move(*files);
  // A job that pauses between epochs (job.pause_between_epochs) has them all released here.
  submission->job.released_epochs = static_cast<uint32_t>(c.job.epochs);
  submission->expected_workers = static_cast<size_t>(local);
  submission->join_timeout_s = c.cluster.join_timeout_s;
  // Rank 0 reports at least every log_every_steps; a step may wait step_timeout_s before the
  // workers give up themselves, and the last evaluation comes on top.
  submission->report_timeout_s = c.job.step_timeout_s + 120;
  const int64_t train_n = data ? data->train.size() : 0;
  double startup_seconds = -1;
  submission->on_report = [&, collected](const gossip::JobReport& r, const std::string& worker) {
    std::lock_guard lock(collected->mutex);
    collected->members = r.members;
    using K = gossip::JobReport::Kind;
    if (r.kind == K::progress) {
      if (startup_seconds < 0)
        startup_seconds = std::chrono::duration<double>(Clock::now() - process_start).count() - r.train_seconds;
      // Gossip and async count each worker's local steps: a resumed job's go on from the
      // checkpoint's, through the positions it had left.
      // Otherwise: the steps taken and the rest of the epochs at the world the job has now (it
      // changes with every generation; exact for sync, whose reports count the job's samples, an
      // estimate for gossip and async, whose rank 0 counts its own times the world).
      const int64_t planned =
          resumed_lists && r.members > 0
              ? resumed_lists->first + static_cast<int64_t>((resumed_lists->second + r.members * c.data.batch_size - 1) /
                                                            (r.members * c.data.batch_size))
              : static_cast<int64_t>(r.step) + steps_left(train_n, c.job.epochs, static_cast<int64_t>(r.samples),
                                                          std::max<int64_t>(1, r.members) * c.data.batch_size);
      const int64_t total =
          train_n > 0 && r.members > 0 ? std::min(planned, c.job.max_steps > 0 ? c.job.max_steps : INT64_MAX) : 0;
      // Rank 0 repeats its last step's report, with no rate, while it waits for the others to
      // finish (a keep-alive): the line for that step is already out.
      const bool repeat =
          collected->last_progress && collected->last_progress->step == r.step && r.samples_per_second == 0;
      collected->last_progress = r;
      if (repeat) return;
      if (r.lr > 0) collected->note_rate(r.step, r.lr);
      const std::string accuracy = collected->evaluations.empty()
                                       ? std::string("-")
                                       : fmt::format("{:.4f}", collected->evaluations.back().test_accuracy);
      fmt::print("{}epoch {}/{} step {}/{} loss {:.4f} {:.0f} samples/s members {} mode {} lr {:.4g} accuracy {}{}{}",
                 tty ? "\r\033[K" : "", std::min<int64_t>(r.epoch + 1, c.job.epochs), c.job.epochs, r.step, total, r.loss,
                 r.samples_per_second, r.members, c.job.mode, r.lr, accuracy, load_note(r.loads), tty ? "" : "\n");
    } else if (r.kind == K::evaluation) {
      collected->evaluations.push_back(r);
      fmt::print("{}eval  epoch {} step {}: test accuracy {:.4f}, test loss {:.4f} (at {:.1f} s of training)\n",
                 tty ? "\r\033[K" : "", r.epoch, r.step, r.test_accuracy, r.test_loss, r.train_seconds);
    } else if (r.kind == K::done) {
      collected->done[worker] = r;
      collected->ended_at = Clock::now();
    } else {
      collected->failure = r.error;
    }
    std::fflush(stdout);
  };
  const size_t model_size = model ? model->parameters().size() : 0;
  submission->on_params = [collected, model_size](const gossip::TensorChunk& chunk) {
    std::lock_guard lock(collected->mutex);
    // Only this job's model, each piece once: anything else is not the model (the decoder has
    // already checked that the piece lies inside `total`).
    if (chunk.total != model_size || !collected->pieces.emplace(chunk.offset, chunk.data.size()).second) return;
    collected->params.resize(chunk.total);
    std::copy(chunk.data.begin(), chunk.data.end(), collected->params.begin() + static_cast<ptrdiff_t>(chunk.offset));
    collected->params_received += chunk.data.size();
  };
  submission->on_membership_event = [collected](const std::string& event) {
    std::lock_guard lock(collected->mutex);
    collected->membership_events.push_back(event);
  };
  auto previous = std::make_shared<std::map<std::string, uint64_t>>();  // worker -> boot id
  submission->on_generation = [&, collected, previous](const gossip::JobStart& g) {
    std::lock_guard lock(collected->mutex);
    // Why, as the change of workers from the generation before (the first: all of them).
    std::vector<std::string> added, removed, restarted;
    std::map<std::string, uint64_t> now;
    for (size_t i = 0; i < g.workers.size(); ++i) {
      const auto& w = g.workers[i];
      now[w] = i < g.worker_boot_ids.size() ? g.worker_boot_ids[i] : 0;
      const auto it = previous->find(w);
      if (it == previous->end()) added.push_back(w);
      else if (it->second && now[w] && it->second != now[w]) restarted.push_back(w);
    }
    for (const auto& [w, boot] : *previous)
      if (!now.contains(w)) removed.push_back(w);
    *previous = now;
    // As the submitter counts them: under another rank 0 (or its restart) every worker reports
    // done again; else a report stands while its worker is the same run.
    if (!collected->latest || !elastic::same_rank0(*collected->latest, g)) collected->done.clear();
    collected->latest = g;
    for (const auto& w : removed) collected->done.erase(w);
    for (const auto& w : restarted) collected->done.erase(w);
    collected->generations.push_back({{"generation", g.generation},
                                      {"at_seconds", std::chrono::duration<double>(Clock::now() - process_start).count()},
                                      {"workers", g.workers},
                                      {"added", added},
                                      {"removed", removed},
                                      {"restarted", restarted},
                                      {"resume_step", g.resume.step},
                                      {"donors", g.donors}});
    if (g.generation > 1)
      fmt::print("{}generation {}: {} workers{}{}{}, resuming at step {}\n", tty ? "\r\033[K" : "", g.generation,
                 g.workers.size(), added.empty() ? "" : fmt::format(", joined {}", fmt::join(added, " ")),
                 removed.empty() ? "" : fmt::format(", gone {}", fmt::join(removed, " ")),
                 restarted.empty() ? "" : fmt::format(", restarted {}", fmt::join(restarted, " ")), g.resume.step);
    std::fflush(stdout);
  };
  std::string end_reason;
  submission->on_end = [&end_reason](int, const std::string& why) { end_reason = why; };
  submission->detach = args.detach;

  const fs::path submitter_log = out / "logs" / "submitter.log";
  if (!actors::node_events_to_file(submitter_log.string()))
    return runtime_error(fmt::format("cannot write {}", submitter_log.string()));
  actors::NodeOptions node;
  node.config = cluster;
  node.config.monitor.http.clear();  // the launcher trains nothing: the nodes' endpoints show the job
  node.secret = secret;
  node.name = fmt::format("submitter-{}", ::getpid());
  node.listen = args.listen;
  node.join = seeds;
  node.submission = submission;
  const int status = actors::run_node(node);
  local_cluster.reset();  // every node this launcher started, whatever happened

  if (status == 130) {
    fmt::print("\ninterrupted: the job was stopped and the local nodes with it\n");
    return 130;
  }
  if (status != 0) return runtime_error(fmt::format("the job failed: {}", end_reason.empty() ? collected->failure : end_reason));
  if (args.detach) {
    std::lock_guard lock(collected->mutex);
    const auto& g = collected->generations;
    const std::string rank0 = g.empty() || g.back()["workers"].empty() ? "rank 0" : g.back()["workers"][0].get<std::string>();
    const auto id = submission->job.job_id;
    fmt::print("job {} detached: it trains on without this process.\n", id);
    fmt::print("At its end {} (rank 0 then) saves model.safetensors and result.json in its [cluster] results_dir/{}.\n",
               rank0, id);
    fmt::print("Meanwhile: tepdist status --peer {}\n", seeds.front());
    return 0;
  }

  // Results: the report every training subcommand writes, and the model.
  std::lock_guard lock(collected->mutex);
  const gossip::JobReport* rank0 = nullptr;
  for (const auto& [worker, d] : collected->done)
    if (d.rank == 0) rank0 = &d;
  if (!rank0) return runtime_error("the job ended without rank 0's report");
  std::optional<double> time_to_target;
  nlohmann::json evaluations = nlohmann::json::array();
  for (const auto& e : collected->evaluations) {
    evaluations.push_back({{"step", e.step}, {"epoch", e.epoch}, {"train_seconds", e.train_seconds},
                           {"test_accuracy", e.test_accuracy}, {"test_loss", e.test_loss}});
    if (!time_to_target && e.test_accuracy >= c.job.target_accuracy) time_to_target = e.train_seconds;
  }
  const bool sync = c.job.mode == "sync";
  nlohmann::json workers = nlohmann::json::array();
  uint64_t samples = 0, stale_rejected = 0, updates_applied = 0, exchanges = 0, staleness_sum = 0;
  double wall = rank0->train_seconds;
  for (const auto& [worker, d] : collected->done) {
    nlohmann::json w = {{"rank", d.rank},
                        {"steps", d.step},
                        {"samples", d.samples},
                        {"bytes_sent", d.bytes_sent},
                        {"bytes_per_step", d.step ? d.bytes_sent / d.step : 0},
                        {"train_seconds", d.train_seconds},
                        {"parameter_checksum", fmt::format("{:016x}", d.checksum)},
                        {"compute", d.compute}};
    if (sync) w["ring_bytes_sent"] = d.bytes_sent;
    if (c.job.mode == "async") {
      w["stale_rejected"] = d.stale_rejected;
      w["updates_applied"] = d.updates_applied;
    }
    if (c.job.mode == "gossip") w["exchanges"] = d.exchanges;
    workers.push_back(std::move(w));
    samples += d.samples;
    stale_rejected += d.stale_rejected;
    updates_applied += d.updates_applied;
    staleness_sum += d.staleness_sum;
    exchanges += d.exchanges;
    // Without a barrier workers end at different times: the job took as long as the slowest.
    if (!sync) wall = std::max(wall, d.train_seconds);
  }
  // Sync: the samples this run consumed, from the job's own count in rank 0's last report (every
  // step reports it at the end), which no worker that died, restarted or joined can skew. The
  // other modes: what the workers that finished trained in their runs (under churn, the final
  // workers' runs only: a worker's count goes with it).
  if (sync && collected->last_progress && collected->last_progress->samples >= resumed_samples)
    samples = collected->last_progress->samples - resumed_samples;
  // Rank 0's own clock starts at its first step: after a membership change the rank 0 at the end
  // may have joined late, or restarted, and seen only the end of the job. The launcher's clock saw
  // all of it: from the first step (the first progress report, less the training it covered) to
  // the last done report (which also holds the final evaluation, so fault-free jobs keep rank 0's).
  if (collected->generations.size() > 1 && startup_seconds >= 0 && collected->ended_at)
    wall = std::max(wall, std::chrono::duration<double>(*collected->ended_at - process_start).count() - startup_seconds);
  double compute_per_step = 0;
  for (const auto& [worker, d] : collected->done)
    if (d.step > 0) compute_per_step = std::max(compute_per_step, d.compute_seconds / static_cast<double>(d.step));
  const double step_seconds = rank0->step ? wall / static_cast<double>(rank0->step) : 0.0;
  // Sync only: the other modes have no ring to bound (a worker count of 0 gives no bound).
  const auto bound = ring_bounds(c, sync ? collected->done.size() : 0,
                                        model ? static_cast<double>(model->parameters().size() + 3) * sizeof(float) : 0.0,
                                        compute_per_step);
  const fs::path model_path = out / "model.safetensors";
  std::optional<std::string> model_file;
  if (model && collected->params.size() == model->parameters().size() &&
      collected->params_received == collected->params.size()) {
    std::copy(collected->params.begin(), collected->params.end(), model->parameters().begin());
    if (auto ok = compute::export_safetensors(model_path, *model); !ok) return runtime_error(ok.error().message);
    model_file = fs::absolute(model_path).string();
  }
  // The newest checkpoint the job left, where this launcher can see it.
  std::optional<std::string> checkpoint;
  if (!c.elastic.checkpoint_dir.empty())
    if (auto found = elastic::latest_checkpoint(c.elastic.checkpoint_dir))
      checkpoint = fs::absolute(found->manifest).string();
  // Each worker's measured speed and share as rank 0's last progress report had them (sync: all;
  // async and gossip: its own), each speed not known there from the worker's own done report.
  nlohmann::json loads = nlohmann::json::array();
  if (collected->last_progress) {
    std::vector<gossip::WorkerLoad> known = collected->last_progress->loads;
    for (const auto& [worker, d] : collected->done)
      for (const auto& own : d.loads)
        for (auto& w : known)
          if (w.worker == own.worker && w.samples_per_second == 0) w.samples_per_second = own.samples_per_second;
    for (const auto& w : known)
      loads.push_back({{"worker", w.worker}, {"samples_per_second", w.samples_per_second}, {"share", w.share}});
  }
  const nlohmann::json result = {
      {"mode", c.job.mode},
      {"nodes", collected->members},
      {"epochs", rank0->epoch},
      {"steps", rank0->step},
      {"samples", samples},
      {"wall_seconds", wall},
      {"startup_seconds", std::max(0.0, startup_seconds)},
      {"eval_seconds", rank0->eval_seconds},
      {"samples_per_second", sync ? rank0->samples_per_second : wall > 0 ? static_cast<double>(samples) / wall : 0.0},
      {"test_accuracy", rank0->test_accuracy},
      {"test_loss", rank0->test_loss},
      {"target_accuracy", c.job.target_accuracy},
      {"time_to_target_seconds", time_to_target ? nlohmann::json(*time_to_target) : nlohmann::json(nullptr)},
      {"membership_events", worker_changes(collected->generations)},
      {"membership_event_list", collected->membership_events},
      {"generations", collected->generations},
      {"checkpoint", checkpoint ? nlohmann::json(*checkpoint) : nlohmann::json(nullptr)},
      {"model", model_file ? nlohmann::json(*model_file) : nlohmann::json(nullptr)},
      {"seed", c.job.seed},
      {"backend", c.compute.backend},
      {"batch_size", c.data.batch_size},
      {"model_bytes", model ? model->parameters().size() * sizeof(float) : 0},
      {"step_seconds", step_seconds},
      {"compute_seconds_per_step", compute_per_step},
      {"ring_bound_formula_seconds", bound ? nlohmann::json(bound->formula_s) : nlohmann::json(nullptr)},
      {"ring_bound_critical_path_seconds", bound ? nlohmann::json(bound->critical_path_s) : nlohmann::json(nullptr)},
      {"stale_rejected", c.job.mode == "async" ? nlohmann::json(stale_rejected) : nlohmann::json(nullptr)},
      {"updates_applied", c.job.mode == "async" ? nlohmann::json(updates_applied) : nlohmann::json(nullptr)},
      {"mean_staleness", c.job.mode == "async" && updates_applied > 0
                             ? nlohmann::json(static_cast<double>(staleness_sum) / static_cast<double>(updates_applied))
                             : nlohmann::json(nullptr)},
      {"gossip_exchanges", c.job.mode == "gossip" ? nlohmann::json(exchanges) : nlohmann::json(nullptr)},
      {"workers", workers},
      {"evaluations", evaluations},
      {"lr_history", collected->lr_history},
      {"loads", loads},
  };
  if (auto ok = compute::write_file_atomically(out / "result.json", result.dump(2) + "\n"); !ok)
    return runtime_error(ok.error().message);
  fmt::print("{}done: {} workers, mode {}, {} epochs, {} steps in {:.1f} s ({:.0f} samples/s), test accuracy {:.4f}\n",
             tty ? "\r\033[K" : "", collected->members, c.job.mode, rank0->epoch, rank0->step, wall,
             result["samples_per_second"].get<double>(), rank0->test_accuracy);
  if (c.job.mode == "async")
    fmt::print("async: {} updates applied (mean staleness {:.1f}), {} pushes refused as staler than {} ({})\n",
               updates_applied, updates_applied ? static_cast<double>(staleness_sum) / static_cast<double>(updates_applied) : 0.0,
               stale_rejected, c.job.max_staleness, c.elastic.local_steps > 0 ? "sent again" : "recomputed");
  if (c.job.mode == "gossip") fmt::print("gossip: {} pairwise averagings, then one final average\n", exchanges);
  if (bound)
    fmt::print("step time {:.0f} ms (compute {:.0f} ms): {:.2f}x the ring formula's {:.0f} ms (2(N-1) x largest latency "
               "+ 2(N-1)/N x bytes / narrowest bandwidth + compute), {:.2f}x the critical path's {:.0f} ms (slowest "
               "2(N-1) consecutive links or the narrowest link's bytes, + compute)\n",
               step_seconds * 1000, compute_per_step * 1000, step_seconds / bound->formula_s, bound->formula_s * 1000,
               step_seconds / bound->critical_path_s, bound->critical_path_s * 1000);
  fmt::print("wrote {}{}\n", (out / "result.json").string(), model_file ? ", " + model_path.string() : std::string());
  return 0;
}

}  // namespace tepdist::cli

#include "cli/run_command.hpp"

#include <fmt/core.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <expected>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "actors/launcher.hpp"
#include "actors/node.hpp"
#include "actors/router.hpp"
#include "cli/quickstart_config.hpp"
#include "compute/io/checkpoint.hpp"
#include "compute/io/files.hpp"
#include "elastic/balance.hpp"
#include "elastic/checkpoints.hpp"
#include "elastic/coordination.hpp"
#include "elastic/job.hpp"
#include "elastic/job_control.hpp"
#include "elastic/job_files.hpp"
#include "elastic/progress.hpp"

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

/// How the command ends early: `tepdist run: MESSAGE` on stderr and the exit status (2: the
/// input, 1: the run).
struct Failure {
  int status;
  std::string message;
};
Failure usage(std::string message) { return {2, std::move(message)}; }
Failure runtime(std::string message) { return {1, std::move(message)}; }
int fail(const Failure& f) {
  fmt::print(stderr, "tepdist run: {}\n", f.message);
  return f.status;
}

/// What starts a printed line: on a terminal, the erasure of the progress line it replaces.
const char* line_start(bool tty) { return tty ? "\r\033[K" : ""; }

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
  double startup_seconds = -1;  // from this process's start to the first step (the first progress report's)
  std::string end_reason;       // why the submitter's node ended, if it says
  std::map<std::string, uint64_t> boot_ids;  // the latest generation's workers -> boot id
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

/// Where a --resume picks the job up, for the progress line's step count and the result's samples.
struct Resumed {
  std::optional<std::pair<int64_t, uint64_t>> lists;  ///< gossip or async: the step it resumed at, the positions left
  uint64_t samples = 0;                               ///< sync: the samples its checkpoint had consumed
};

/// The job file (or the built-in quickstart) with `overrides` on top.
std::expected<elastic::JobConfig, Failure> load_job(const RunArgs& args, const std::vector<std::string>& overrides) {
  auto loaded = args.config ? elastic::load_config(fs::path(*args.config), overrides)
                            : elastic::parse_config(quickstart_toml, "(built-in configs/quickstart.toml)", overrides);
  if (!loaded) return std::unexpected(usage(loaded.error().message));
  return std::move(*loaded);
}

/// The job as this command runs it: the file, the command line's options, and what `tepdist run`
/// implies where the file is silent (quorum "any" for local nodes, checkpoints beside the output,
/// the checkpoint a --resume continues from). Refuses what it cannot run.
std::expected<std::pair<elastic::JobConfig, Resumed>, Failure> resolve_job(const RunArgs& args) {
  std::vector<std::string> overrides = args.overrides;
  if (args.nodes) overrides.push_back(fmt::format("cluster.local_nodes={}", *args.nodes));
  if (args.mode) overrides.push_back(fmt::format("job.mode=\"{}\"", *args.mode));
  if (args.epochs) overrides.push_back(fmt::format("job.epochs={}", *args.epochs));
  auto loaded = load_job(args, overrides);
  if (!loaded) return std::unexpected(loaded.error());
  std::vector<std::string> implied;
  // Local nodes on one machine cannot be partitioned: job control may go on with any survivor,
  // unless the file says otherwise (or emulates partitions, which it then must).
  const bool quorum_given = std::any_of(overrides.begin(), overrides.end(), [](const std::string& o) {
    return o.starts_with("elastic.quorum");
  });
  if (!quorum_given && loaded->cluster.local_nodes > 0 && loaded->network.model.partitions.empty() &&
      loaded->text.find("quorum") == std::string::npos)
    implied.push_back("elastic.quorum=\"any\"");
  // Checkpoints of a local cluster go beside its other output unless the file says where.
  if (const auto& e = loaded->elastic; loaded->cluster.local_nodes > 0 && e.checkpoint_dir.empty() &&
                                       (e.checkpoint_every_steps > 0 || e.checkpoint_every_s > 0))
    implied.push_back("elastic.checkpoint_dir=" + elastic::toml_string(fs::absolute(fs::path(args.out) / "checkpoints").string()));
  Resumed resumed;
  if (args.resume) {
    if (loaded->cluster.local_nodes == 0 && loaded->elastic.checkpoint_dir.empty())
      return std::unexpected(usage(fmt::format("{}: --resume on a running cluster needs [elastic] checkpoint_dir: the folder "
                                               "its nodes wrote the checkpoints to (each node's default is its own "
                                               "results_dir)",
                                               loaded->source)));
    const fs::path dir = loaded->elastic.checkpoint_dir.empty() ? fs::path(args.out) / "checkpoints"
                                                                : fs::path(loaded->elastic.checkpoint_dir);
    auto found = elastic::latest_checkpoint(dir);
    if (!found) return std::unexpected(usage(fmt::format("--resume: {}", found.error())));
    for (const auto& why : found->passed_over) fmt::print(stderr, "--resume: passed over {}\n", why);
    const auto& at = found->state;
    const uint64_t left = at.job ? elastic::span_total(elastic::spans_of(at.job->remaining)) : 0;
    if (at.job && at.job->mode != "sync") resumed.lists.emplace(at.step, left);
    if (at.job && at.job->mode == "sync") resumed.samples = at.job->samples;
    fmt::print("resuming from {}: step {}, epoch {}{}\n", found->part.string(), at.step, at.epoch + 1,
               !at.job                  ? std::string()
               : at.job->mode == "sync" ? fmt::format(", position {} (job {}, sync mode)", at.job->position, at.job->job_id)
                                        : fmt::format(", {} positions left (job {}, {} mode)", left, at.job->job_id,
                                                      at.job->mode));
    implied.push_back("elastic.resume_from=" + elastic::toml_string(fs::absolute(found->part).string()));
  }
  if (!implied.empty()) {
    overrides.insert(overrides.end(), implied.begin(), implied.end());
    loaded = load_job(args, overrides);
    if (!loaded) return std::unexpected(loaded.error());
  }
  const elastic::JobConfig& c = *loaded;
  if (c.job.mode == "single")
    return std::unexpected(usage(fmt::format("{}: job.mode = \"single\": `tepdist run` trains on a cluster (mode "
                                             "\"sync\", \"async\" or \"gossip\"); `tepdist train` trains in one process",
                                             c.source)));
  if (c.cluster.local_nodes == 0 && c.cluster.seeds.empty())
    return std::unexpected(usage(fmt::format("{}: cluster.local_nodes is 0 and cluster.seeds is empty: set local_nodes "
                                             "to start nodes here, or seeds to join a running cluster",
                                             c.source)));
  if (args.detach && c.cluster.local_nodes > 0)
    return std::unexpected(usage(fmt::format("{}: --detach needs a running cluster (cluster.local_nodes = 0 and seeds): "
                                             "local nodes stop with the `tepdist run` that started them",
                                             c.source)));
  return std::pair{std::move(*loaded), std::move(resumed)};
}

/// The cluster the job goes to: started here (local nodes, stopped when this is destroyed) or
/// joined at the file's seeds.
struct Cluster {
  std::unique_ptr<actors::LocalCluster> local;
  std::vector<std::string> seeds;
  std::string secret;
  elastic::JobConfig config;  ///< what this process joins with: the local cluster's file, or the job's
};

std::expected<Cluster, Failure> open_cluster(const elastic::JobConfig& c, const fs::path& out) {
  Cluster cluster{nullptr, c.cluster.seeds, "", c};
  if (c.cluster.local_nodes == 0) {
    auto s = elastic::load_secret(c.cluster);
    if (!s) return std::unexpected(usage(fmt::format("{}: {}", c.source, s.error().message)));
    cluster.secret = *s;
    return cluster;
  }
  auto started = actors::start_local_cluster(c, out, [](const std::string& what) {
    fmt::print("\nlocal node {}\n", what);
    std::fflush(stdout);
  });
  if (!started) return std::unexpected(runtime(started.error()));
  cluster.local = std::move(*started);
  cluster.seeds = cluster.local->seeds;
  cluster.secret = cluster.local->secret;
  cluster.config = cluster.local->cluster;
  const auto& file = cluster.local->cluster_file;
  fmt::print("tepdist run: {} local nodes ({} threads each), logs in {}\n", c.cluster.local_nodes,
             cluster.local->threads, (out / "logs").string());
  fmt::print("  add a node:   tepdist node {} --join {}\n", file.string(), cluster.seeds[0]);
  fmt::print("  see them:     tepdist status {} --peer {}\n", file.string(), cluster.seeds[0]);
  if (!cluster.local->http.empty())
    fmt::print("  dashboard:    http://{}/  (also /metrics and /status)\n", cluster.local->http);
  return cluster;
}

/// What the hooks that follow the job need to know of it.
struct Following {
  const elastic::JobConfig* config;  // outlives the submission
  Resumed resumed;
  int64_t train_n = 0;     ///< training samples (0: the data is not on this machine)
  size_t model_size = 0;   ///< parameters (0: no model here)
  Clock::time_point process_start;
  bool tty = false;        ///< progress lines overwrite each other
};

/// The progress line's step count: steps taken and those of the rest of the epochs at the world the
/// job has now. It changes with every generation; exact for sync, whose reports count the job's
/// samples, an estimate for gossip and async, whose rank 0 counts its own times the world. A
/// resumed gossip or async job counts on from the checkpoint's step through the positions it had left.
int64_t planned_steps(const Following& f, const gossip::JobReport& r) {
  const elastic::JobConfig& c = *f.config;
  if (f.train_n <= 0 || r.members == 0) return 0;
  const int64_t global = static_cast<int64_t>(r.members) * c.data.batch_size;
  const int64_t planned =
      f.resumed.lists ? f.resumed.lists->first + static_cast<int64_t>((f.resumed.lists->second + global - 1) / global)
                      : static_cast<int64_t>(r.step) + steps_left(f.train_n, c.job.epochs, static_cast<int64_t>(r.samples), global);
  return std::min(planned, c.job.max_steps > 0 ? c.job.max_steps : INT64_MAX);
}

void on_progress(const Following& f, Collected& got, const gossip::JobReport& r) {
  const elastic::JobConfig& c = *f.config;
  if (got.startup_seconds < 0)
    got.startup_seconds = std::chrono::duration<double>(Clock::now() - f.process_start).count() - r.train_seconds;
  // Rank 0 repeats its last step's report, with no rate, while it waits for the others to finish
  // (a keep-alive): the line for that step is already out.
  const bool repeat = got.last_progress && got.last_progress->step == r.step && r.samples_per_second == 0;
  got.last_progress = r;
  if (repeat) return;
  if (r.lr > 0) got.note_rate(r.step, r.lr);
  const std::string accuracy =
      got.evaluations.empty() ? std::string("-") : fmt::format("{:.4f}", got.evaluations.back().test_accuracy);
  fmt::print("{}epoch {}/{} step {}/{} loss {:.4f} {:.0f} samples/s members {} mode {} lr {:.4g} accuracy {}{}{}",
             line_start(f.tty), std::min<int64_t>(r.epoch + 1, c.job.epochs), c.job.epochs, r.step,
             planned_steps(f, r), r.loss, r.samples_per_second, r.members, c.job.mode, r.lr, accuracy, load_note(r.loads),
             f.tty ? "" : "\n");
}

/// A new generation: noted for result.json with why it came (the change of workers from the one
/// before; the first: all of them), and announced after the first.
void on_generation(const Following& f, Collected& got, const gossip::JobStart& g) {
  std::vector<std::string> added, removed, restarted;
  std::map<std::string, uint64_t> now;  // worker -> boot id
  for (size_t i = 0; i < g.workers.size(); ++i) {
    const auto& w = g.workers[i];
    now[w] = i < g.worker_boot_ids.size() ? g.worker_boot_ids[i] : 0;
    const auto it = got.boot_ids.find(w);
    if (it == got.boot_ids.end()) added.push_back(w);
    else if (it->second && now[w] && it->second != now[w]) restarted.push_back(w);
  }
  for (const auto& [w, boot] : got.boot_ids)
    if (!now.contains(w)) removed.push_back(w);
  got.boot_ids = now;
  // As the submitter counts them: under another rank 0 (or its restart) every worker reports done
  // again; else a report stands while its worker is the same run.
  if (!got.latest || !elastic::same_rank0(*got.latest, g)) got.done.clear();
  got.latest = g;
  for (const auto& w : removed) got.done.erase(w);
  for (const auto& w : restarted) got.done.erase(w);
  got.generations.push_back({{"generation", g.generation},
                             {"at_seconds", std::chrono::duration<double>(Clock::now() - f.process_start).count()},
                             {"workers", g.workers},
                             {"added", added},
                             {"removed", removed},
                             {"restarted", restarted},
                             {"resume_step", g.resume.step},
                             {"donors", g.donors}});
  if (g.generation > 1)
    fmt::print("{}generation {}: {} workers{}{}{}, resuming at step {}\n", line_start(f.tty), g.generation,
               g.workers.size(), added.empty() ? "" : fmt::format(", joined {}", fmt::join(added, " ")),
               removed.empty() ? "" : fmt::format(", gone {}", fmt::join(removed, " ")),
               restarted.empty() ? "" : fmt::format(", restarted {}", fmt::join(restarted, " ")), g.resume.step);
}

/// The submitter's hooks: each gathers into `got` (under its mutex) and prints what a user follows.
void follow(actors::Submission& s, std::shared_ptr<Collected> got, Following f) {
  s.on_report = [got, f](const gossip::JobReport& r, const std::string& worker) {
    std::lock_guard lock(got->mutex);
    got->members = r.members;
    using K = gossip::JobReport::Kind;
    if (r.kind == K::progress) {
      on_progress(f, *got, r);
    } else if (r.kind == K::evaluation) {
      got->evaluations.push_back(r);
      fmt::print("{}eval  epoch {} step {}: test accuracy {:.4f}, test loss {:.4f} (at {:.1f} s of training)\n",
                 line_start(f.tty), r.epoch, r.step, r.test_accuracy, r.test_loss, r.train_seconds);
    } else if (r.kind == K::done) {
      got->done[worker] = r;
      got->ended_at = Clock::now();
    } else {
      got->failure = r.error;
    }
    std::fflush(stdout);
  };
  s.on_params = [got, size = f.model_size](const gossip::TensorChunk& chunk) {
    std::lock_guard lock(got->mutex);
    // Only this job's model, each piece once: anything else is not the model (the decoder has
    // already checked that the piece lies inside `total`).
    if (chunk.total != size || !got->pieces.emplace(chunk.offset, chunk.data.size()).second) return;
    got->params.resize(chunk.total);
    std::copy(chunk.data.begin(), chunk.data.end(), got->params.begin() + static_cast<ptrdiff_t>(chunk.offset));
    got->params_received += chunk.data.size();
  };
  s.on_membership_event = [got](const std::string& event) {
    std::lock_guard lock(got->mutex);
    got->membership_events.push_back(event);
  };
  s.on_generation = [got, f](const gossip::JobStart& g) {
    std::lock_guard lock(got->mutex);
    on_generation(f, *got, g);
    std::fflush(stdout);
  };
  s.on_end = [got](int, const std::string& why) {
    std::lock_guard lock(got->mutex);
    got->end_reason = why;
  };
}

/// result.json: the report every training subcommand writes. `rank0` is rank 0's done report.
nlohmann::json assemble_result(const elastic::JobConfig& c, const Collected& got, const gossip::JobReport& rank0,
                               const Resumed& resumed, const compute::Model* model, Clock::time_point process_start,
                               const std::optional<std::string>& model_file) {
  std::optional<double> time_to_target;
  nlohmann::json evaluations = nlohmann::json::array();
  for (const auto& e : got.evaluations) {
    evaluations.push_back({{"step", e.step}, {"epoch", e.epoch}, {"train_seconds", e.train_seconds},
                           {"test_accuracy", e.test_accuracy}, {"test_loss", e.test_loss}});
    if (!time_to_target && e.test_accuracy >= c.job.target_accuracy) time_to_target = e.train_seconds;
  }
  const bool sync = c.job.mode == "sync", async = c.job.mode == "async", gossip = c.job.mode == "gossip";
  nlohmann::json workers = nlohmann::json::array();
  uint64_t samples = 0, stale_rejected = 0, updates_applied = 0, exchanges = 0, staleness_sum = 0;
  double wall = rank0.train_seconds;
  for (const auto& [worker, d] : got.done) {
    nlohmann::json w = {{"rank", d.rank},
                        {"steps", d.step},
                        {"samples", d.samples},
                        {"bytes_sent", d.bytes_sent},
                        {"bytes_per_step", d.step ? d.bytes_sent / d.step : 0},
                        {"train_seconds", d.train_seconds},
                        {"parameter_checksum", fmt::format("{:016x}", d.checksum)},
                        {"compute", d.compute}};
    if (sync) w["ring_bytes_sent"] = d.bytes_sent;
    if (async) {
      w["stale_rejected"] = d.stale_rejected;
      w["updates_applied"] = d.updates_applied;
    }
    if (gossip) w["exchanges"] = d.exchanges;
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
  if (sync && got.last_progress && got.last_progress->samples >= resumed.samples)
    samples = got.last_progress->samples - resumed.samples;
  // Rank 0's own clock starts at its first step: after a membership change the rank 0 at the end
  // may have joined late, or restarted, and seen only the end of the job. The launcher's clock saw
  // all of it: from the first step (the first progress report, less the training it covered) to
  // the last done report (which also holds the final evaluation, so fault-free jobs keep rank 0's).
  if (got.generations.size() > 1 && got.startup_seconds >= 0 && got.ended_at)
    wall = std::max(wall, std::chrono::duration<double>(*got.ended_at - process_start).count() - got.startup_seconds);
  double compute_per_step = 0;
  for (const auto& [worker, d] : got.done)
    if (d.step > 0) compute_per_step = std::max(compute_per_step, d.compute_seconds / static_cast<double>(d.step));
  const double step_seconds = rank0.step ? wall / static_cast<double>(rank0.step) : 0.0;
  // Sync only: the other modes have no ring to bound (a worker count of 0 gives no bound).
  const auto bound = ring_bounds(c, sync ? got.done.size() : 0,
                                 model ? static_cast<double>(model->parameters().size() + 3) * sizeof(float) : 0.0,
                                 compute_per_step);
  // The newest checkpoint the job left, where this launcher can see it.
  std::optional<std::string> checkpoint;
  if (!c.elastic.checkpoint_dir.empty())
    if (auto found = elastic::latest_checkpoint(c.elastic.checkpoint_dir))
      checkpoint = fs::absolute(found->manifest).string();
  // Each worker's measured speed and share as rank 0's last progress report had them (sync: all;
  // async and gossip: its own), each speed not known there from the worker's own done report.
  nlohmann::json loads = nlohmann::json::array();
  if (got.last_progress) {
    std::vector<gossip::WorkerLoad> known = got.last_progress->loads;
    for (const auto& [worker, d] : got.done)
      for (const auto& own : d.loads)
        for (auto& w : known)
          if (w.worker == own.worker && w.samples_per_second == 0) w.samples_per_second = own.samples_per_second;
    for (const auto& w : known)
      loads.push_back({{"worker", w.worker}, {"samples_per_second", w.samples_per_second}, {"share", w.share}});
  }
  const auto or_null = [](bool has, const auto& value) { return has ? nlohmann::json(value) : nlohmann::json(nullptr); };
  return {
      {"mode", c.job.mode},
      {"nodes", got.members},
      {"epochs", rank0.epoch},
      {"steps", rank0.step},
      {"samples", samples},
      {"wall_seconds", wall},
      {"startup_seconds", std::max(0.0, got.startup_seconds)},
      {"eval_seconds", rank0.eval_seconds},
      {"samples_per_second", sync ? rank0.samples_per_second : wall > 0 ? static_cast<double>(samples) / wall : 0.0},
      {"test_accuracy", rank0.test_accuracy},
      {"test_loss", rank0.test_loss},
      {"target_accuracy", c.job.target_accuracy},
      {"time_to_target_seconds", or_null(time_to_target.has_value(), time_to_target.value_or(0))},
      {"membership_events", worker_changes(got.generations)},
      {"membership_event_list", got.membership_events},
      {"generations", got.generations},
      {"checkpoint", or_null(checkpoint.has_value(), checkpoint.value_or(""))},
      {"model", or_null(model_file.has_value(), model_file.value_or(""))},
      {"seed", c.job.seed},
      {"backend", c.compute.backend},
      {"batch_size", c.data.batch_size},
      {"model_bytes", model ? model->parameters().size() * sizeof(float) : 0},
      {"step_seconds", step_seconds},
      {"compute_seconds_per_step", compute_per_step},
      {"ring_bound_formula_seconds", or_null(bound.has_value(), bound ? bound->formula_s : 0.0)},
      {"ring_bound_critical_path_seconds", or_null(bound.has_value(), bound ? bound->critical_path_s : 0.0)},
      {"stale_rejected", or_null(async, stale_rejected)},
      {"updates_applied", or_null(async, updates_applied)},
      {"mean_staleness", or_null(async && updates_applied > 0,
                                 updates_applied ? static_cast<double>(staleness_sum) / static_cast<double>(updates_applied) : 0.0)},
      {"gossip_exchanges", or_null(gossip, exchanges)},
      {"workers", workers},
      {"evaluations", evaluations},
      {"lr_history", got.lr_history},
      {"loads", loads},
  };
}

/// The closing lines: the job's figures as result.json has them.
void print_summary(const elastic::JobConfig& c, const nlohmann::json& r, bool tty) {
  fmt::print("{}done: {} workers, mode {}, {} epochs, {} steps in {:.1f} s ({:.0f} samples/s), test accuracy {:.4f}\n",
             line_start(tty), r["nodes"].get<uint64_t>(), c.job.mode, r["epochs"].get<uint64_t>(),
             r["steps"].get<uint64_t>(), r["wall_seconds"].get<double>(), r["samples_per_second"].get<double>(),
             r["test_accuracy"].get<double>());
  if (c.job.mode == "async") {
    const auto applied = r["updates_applied"].get<uint64_t>();
    fmt::print("async: {} updates applied (mean staleness {:.1f}), {} pushes refused as staler than {} ({})\n", applied,
               r["mean_staleness"].is_null() ? 0.0 : r["mean_staleness"].get<double>(), r["stale_rejected"].get<uint64_t>(),
               c.job.max_staleness, c.elastic.local_steps > 0 ? "sent again" : "recomputed");
  }
  if (c.job.mode == "gossip")
    fmt::print("gossip: {} pairwise averagings, then one final average\n", r["gossip_exchanges"].get<uint64_t>());
  if (!r["ring_bound_formula_seconds"].is_null()) {
    const double step = r["step_seconds"].get<double>(), compute = r["compute_seconds_per_step"].get<double>();
    const double formula = r["ring_bound_formula_seconds"].get<double>();
    const double critical = r["ring_bound_critical_path_seconds"].get<double>();
    fmt::print("step time {:.0f} ms (compute {:.0f} ms): {:.2f}x the ring formula's {:.0f} ms (2(N-1) x largest latency "
               "+ 2(N-1)/N x bytes / narrowest bandwidth + compute), {:.2f}x the critical path's {:.0f} ms (slowest "
               "2(N-1) consecutive links or the narrowest link's bytes, + compute)\n",
               step * 1000, compute * 1000, step / formula, formula * 1000, step / critical, critical * 1000);
  }
}

}  // namespace

int run_run_command(const RunArgs& args) {
  const auto process_start = Clock::now();
  auto resolved = resolve_job(args);
  if (!resolved) return fail(resolved.error());
  const auto& [c, resumed] = *resolved;
  // The data, before any process starts: a missing data set is this machine's error to report.
  auto data = elastic::load_job_data(c.data, c.job.seed);
  if (!data && c.cluster.local_nodes > 0) return fail(usage(data.error().message));
  std::unique_ptr<compute::Model> model;
  if (data) {
    auto built = elastic::build_job_model(c, data->train);
    if (!built) return fail(usage(built.error().message));
    model = std::move(*built);
  }

  const fs::path out = args.out;
  std::error_code ec;
  fs::create_directories(out / "logs", ec);
  fs::create_directories(out / "run", ec);
  if (ec) return fail(usage(fmt::format("{}: cannot create the output directory: {}", out.string(), ec.message())));
  auto cluster = open_cluster(c, out);
  if (!cluster) return fail(cluster.error());

  // This process joins as the submitter and follows the job.
  const bool tty = isatty(STDOUT_FILENO);
  auto got = std::make_shared<Collected>();
  auto submission = std::make_shared<actors::Submission>();
  submission->job.job_id = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  // The job as every node will hold it: without an inline secret (the nodes have their own).
  auto shipped = elastic::text_for_nodes(c);
  if (!shipped) return fail(runtime(shipped.error().message));
  submission->job.config = std::move(*shipped);
  // The files it names, which this process serves to a node that cannot read them (another machine).
  auto files = elastic::describe_job_files(c);
  if (!files) return fail(usage(fmt::format("{}: {}", c.source, files.error())));
  submission->job.files = std::move(*files);
  // A job that pauses between epochs (job.pause_between_epochs) has them all released here.
  submission->job.released_epochs = static_cast<uint32_t>(c.job.epochs);
  submission->expected_workers = static_cast<size_t>(c.cluster.local_nodes);
  submission->join_timeout_s = c.cluster.join_timeout_s;
  // Rank 0 reports at least every log_every_steps; a step may wait step_timeout_s before the
  // workers give up themselves, and the last evaluation comes on top.
  submission->report_timeout_s = c.job.step_timeout_s + 120;
  submission->detach = args.detach;
  follow(*submission, got,
         Following{&c, resumed, data ? static_cast<int64_t>(data->train.size()) : 0,
                   model ? model->parameters().size() : 0, process_start, tty});

  const fs::path submitter_log = out / "logs" / "submitter.log";
  if (!actors::node_events_to_file(submitter_log.string()))
    return fail(runtime(fmt::format("cannot write {}", submitter_log.string())));
  actors::NodeOptions node;
  node.config = cluster->config;
  node.config.monitor.http.clear();  // the launcher trains nothing: the nodes' endpoints show the job
  node.secret = cluster->secret;
  node.name = fmt::format("submitter-{}", ::getpid());
  node.listen = args.listen;
  node.join = cluster->seeds;
  node.submission = submission;
  const int status = actors::run_node(node);
  cluster->local.reset();  // every node this launcher started, whatever happened

  std::lock_guard lock(got->mutex);
  if (status == 130) {
    fmt::print("\ninterrupted: the job was stopped and the local nodes with it\n");
    return 130;
  }
  if (status != 0)
    return fail(runtime(fmt::format("the job failed: {}", got->end_reason.empty() ? got->failure : got->end_reason)));
  if (args.detach) {
    const auto& g = got->generations;
    const std::string rank0 = g.empty() || g.back()["workers"].empty() ? "rank 0" : g.back()["workers"][0].get<std::string>();
    fmt::print("job {} detached: it trains on without this process.\n", submission->job.job_id);
    fmt::print("At its end {} (rank 0 then) saves model.safetensors and result.json in its [cluster] results_dir/{}.\n",
               rank0, submission->job.job_id);
    fmt::print("Meanwhile: tepdist status --peer {}\n", cluster->seeds.front());
    return 0;
  }

  // Results: the model as rank 0 sent it, and the report every training subcommand writes.
  const gossip::JobReport* rank0 = nullptr;
  for (const auto& [worker, d] : got->done)
    if (d.rank == 0) rank0 = &d;
  if (!rank0) return fail(runtime("the job ended without rank 0's report"));
  const fs::path model_path = out / "model.safetensors";
  std::optional<std::string> model_file;
  if (model && got->params.size() == model->parameters().size() && got->params_received == got->params.size()) {
    std::copy(got->params.begin(), got->params.end(), model->parameters().begin());
    if (auto ok = compute::export_safetensors(model_path, *model); !ok) return fail(runtime(ok.error().message));
    model_file = fs::absolute(model_path).string();
  }
  const nlohmann::json result = assemble_result(c, *got, *rank0, resumed, model.get(), process_start, model_file);
  if (auto ok = compute::write_file_atomically(out / "result.json", result.dump(2) + "\n"); !ok)
    return fail(runtime(ok.error().message));
  print_summary(c, result, tty);
  fmt::print("wrote {}{}\n", (out / "result.json").string(), model_file ? ", " + model_path.string() : std::string());
  return 0;
}

}  // namespace tepdist::cli

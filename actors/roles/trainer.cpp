#include "actors/roles/trainer.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/local_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>

#include "actors/atoms.hpp"
#include "actors/router.hpp"
#include "compute/backends.hpp"
#include "compute/io/checkpoint.hpp"
#include "compute/io/files.hpp"
#include "compute/optimizer.hpp"
#include "compute/train.hpp"
#include "elastic/coordination.hpp"
#include "elastic/job.hpp"
#include "elastic/job_control.hpp"
#include "elastic/progress.hpp"
#include "elastic/state_transfer.hpp"
#include "actors/roles/shard_host.hpp"
#include "elastic/async_shards.hpp"
#include "elastic/placement.hpp"
#include "gossip/collective/gossip_average.hpp"
#include "gossip/collective/ring_allreduce.hpp"

namespace tepdist::actors {
namespace {

using Clock = std::chrono::steady_clock;
using step_atom = caf::atom_constant<caf::atom("step")>;
using eval_atom = caf::atom_constant<caf::atom("eval")>;
using gossip::JobReport;

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

uint64_t checksum(std::span<const float> values) {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  for (size_t i = 0; i < values.size_bytes(); ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
  return h;
}

/// What rank 0's evaluator needs: its own model (parameters are copied in), backend and test set.
struct EvalKit {
  std::unique_ptr<compute::Model> model;
  std::unique_ptr<compute::Backend> backend;
  compute::Dataset test;
};

/// Evaluates parameter snapshots: (eval_atom, parameters) -> (accuracy, loss, seconds).
caf::behavior evaluator(caf::event_based_actor*, std::shared_ptr<EvalKit> kit) {
  return {[kit](eval_atom, const std::vector<float>& params) {
    const auto t0 = Clock::now();
    std::copy(params.begin(), params.end(), kit->model->parameters().begin());
    const auto e = compute::evaluate(*kit->model, *kit->backend, kit->test);
    return caf::make_message(e.accuracy, e.loss, seconds_between(t0, Clock::now()));
  }};
}

enum class Mode { sync, async, gossip };

struct Job {
  gossip::JobStart start;  // the record of the generation this worker trains in
  elastic::JobConfig config;
  Mode mode = Mode::sync;
  uint32_t rank = 0, world = 1;
  std::string prev_id, next_address;
  // Job control (sync and gossip): generations, and the state this worker holds.
  std::unique_ptr<elastic::JobControl> control;
  uint64_t generation = 1;
  gossip::JobProgress progress;  // sync: the job's, alike on every member; gossip: this worker's own
  bool has_state = true;         // false: a joiner, or a member behind, until it has pulled the state
  bool member = true;            // a worker of the installed generation (false: left out of it; waits)
  bool stepped_in_generation = false;  // the first step of each generation is logged (bench/chaos.sh times it)
  std::optional<elastic::StatePuller> pulling;
  std::optional<elastic::RatePolicy> rate;
  bool stop_voted = false;       // sync: a stop vote was in the last sum
  // Gossip: this worker's positions (elastic/progress.hpp), how far it is through them, and how far
  // the others were when they last mixed with it (for the next re-split, should one be gone).
  elastic::Spans spans;
  uint64_t consumed = 0;
  std::map<std::string, uint64_t> cursors;
  // Ring chunks of a generation this worker has not installed yet (a faster member started it).
  std::vector<std::pair<std::string, gossip::RingChunk>> ahead;
  size_t ahead_bytes = 0;
  elastic::JobData data;
  std::unique_ptr<compute::Model> model;
  std::unique_ptr<compute::Backend> backend;
  std::unique_ptr<compute::Optimizer> optimizer;
  std::optional<compute::LrSchedule> schedule;
  std::optional<gossip::collective::RingAllReduce> ring;  // sync: every step; gossip: the final average
  std::vector<float> buffer;  // sync: [gradient x samples, loss x samples, samples, stop votes]; gossip: parameters;
                              // async updates: the parameters before a step, then the step's change
  std::vector<int64_t> order;  // the shuffled sample indices of epoch order_epoch
  int64_t order_epoch = -1;
  uint64_t tensor_bytes = 0;   // async and gossip: payload bytes sent outside the ring
  // async
  std::optional<elastic::AsyncWorker> async;
  elastic::Placement placement;
  caf::actor shard_host;
  std::shared_ptr<ShardHostCounters> shard_counters;
  bool blocked = false;             // waiting for a shard's answer before the next step
  bool serving = false;             // not rank 0: all applied; holding shards until rank 0 has the model
  std::set<std::string> finished;   // rank 0: workers whose updates are all applied
  bool assembling = false;          // rank 0: pulling every shard for the final model
  std::vector<uint8_t> assembled;   // per shard
  size_t assembled_count = 0;
  // gossip
  std::optional<gossip::collective::GossipAveraging> gossip;
  std::mt19937_64 random;
  uint64_t next_exchange = 1;
  uint32_t partner = 0;
  bool final_average = false;
  bool heard_final = false;  // a chunk of the final average came: the previous worker is done stepping
  int64_t step = 0, epoch = 0, steps_per_epoch = 0, total_steps = 0;
  uint64_t own_samples = 0, samples = 0, window_samples = 0;
  double loss = 0;
  compute::LossScratch scratch;
  compute::Tensor x;
  std::vector<int32_t> y;
  std::optional<Clock::time_point> first_step;
  Clock::time_point last_step_end, window_start;
  Clock::time_point waiting_since;  // when this worker last began waiting for others
  Clock::time_point progress_at;    // when others last moved it on: the step timeout's mark
  double compute_seconds = 0, ring_seconds = 0;  // where the steps' time went
  // Rank 0.
  caf::actor evaluator;
  int pending_evals = 0;
  int64_t last_eval_step = -1;
  double last_accuracy = 0, last_test_loss = 0, eval_seconds = 0;
  bool target_reached = false;  // stop_at_target: rank 0 votes to stop in the next ring (sync), or tells
                                // the workers to stop after the step under way (async, gossip)
  bool finishing = false;
  bool detached = false;  // the submitter is gone: the job goes on, and rank 0 saves the model here

  double train_seconds() const { return first_step ? seconds_between(*first_step, last_step_end) : 0.0; }
  size_t elements() const { return model->parameters().size(); }
  uint64_t bytes_sent() const { return (ring ? ring->bytes_sent() : 0) + tensor_bytes; }
};

const char* mode_name(Mode m) { return m == Mode::sync ? "sync" : m == Mode::async ? "async" : "gossip"; }

struct TrainerState {
  TrainerOptions o;
  caf::actor router;
  std::vector<gossip::Member> view;
  std::unique_ptr<Job> job;
  // Chunks of a job not started here yet (a faster neighbour was told first), with their senders;
  // bounded in bytes, and only for jobs newer than any this node has run.
  std::vector<std::pair<std::string, gossip::RingChunk>> stash;
  size_t stash_bytes = 0;
  uint64_t last_job = 0;
  std::optional<gossip::JobStart> pending;  // submitted, waiting for this view to hold its workers
  std::string pending_from;
  Clock::time_point pending_since;
  // An assignment from a coordinator this view does not know as such yet (gossip of its arrival,
  // or of an older coordinator's end, has not come): held until the view catches up or the
  // deadline passes, then obeyed or refused with the reason.
  std::optional<gossip::JobStart> held;
  Clock::time_point held_since;
  // A node without the job that was proposed as a worker of a running one (a joiner, a restarted
  // node, a worker that was dropped): its votes, until the install makes it a worker.
  std::unique_ptr<elastic::JobControl> joining;
  Clock::time_point joining_since;
  static constexpr double joining_limit_s = 60;  // a proposal whose install never comes is forgotten
  std::set<uint64_t> ended_jobs;  // finished, failed or abandoned here: never joined again
  Clock::time_point started = Clock::now();
  static constexpr double held_limit_s = 10;
  static constexpr double pending_limit_s = 30;  // how long a submission waits for this view
  bool ticking = false;
  // Draining (the node leaves: SIGTERM, `tepdist leave`): the step under way ends, no other starts.
  std::optional<caf::typed_response_promise<std::string>> drain;
  bool drained = false;
  static inline const char* name = "tepdist.trainer";
};

using Trainer = caf::stateful_actor<TrainerState>;

void start_ticking(Trainer* self);

/// Sends, or says it could not: the peer's send queue is full ([cluster] send_queue_mb).
bool send_to(Trainer* self, const std::string& address, gossip::Body body) {
  auto& o = self->state.o;
  gossip::Message m{o.self_id, o.incarnation, o.cluster_id, std::move(body)};
  // This node's own shards are served by its shard host, not over a connection to itself.
  if (address == o.self_address && std::holds_alternative<gossip::ShardUpdate>(m.body) && self->state.job &&
      self->state.job->shard_host) {
    self->send(self->state.job->shard_host, wire_atom::value, o.self_id, o.self_address, std::move(m));
    return true;
  }
  if (o.transport->send(address, m)) return true;
  node_events().warn("send_refused peer={} reason=\"send queue full\"", address);
  return false;
}

/// To the job's submitter, unless it is gone: a detached job reports to nobody.
void to_submitter(Trainer* self, const Job& j, gossip::Body body) {
  if (!j.detached) send_to(self, j.start.submitter, std::move(body));
}

JobReport report_of(const Job& j, JobReport::Kind kind) {
  JobReport r;
  r.job_id = j.start.job_id;
  r.kind = kind;
  r.rank = j.rank;
  r.members = j.world;
  r.epoch = static_cast<uint32_t>(j.epoch);
  r.step = static_cast<uint64_t>(j.step);
  r.loss = j.loss;
  r.train_seconds = j.train_seconds();
  r.compute_seconds = j.compute_seconds;
  return r;
}

/// What this worker knows of its job, for status answers (elastic/status.hpp renders it).
gossip::JobStatus job_status(const Job& j, const std::string& self_id) {
  gossip::JobStatus st{j.start.job_id, mode_name(j.mode), j.generation, "training", {}};
  if (j.finishing) st.phase = "finished";
  else if (j.pulling) st.phase = "pulling";
  else if (!j.member) st.phase = "waiting";
  else if (j.control && j.control->paused()) st.phase = "voting";
  const auto per_epoch = static_cast<uint64_t>(j.steps_per_epoch);
  const auto step = static_cast<uint64_t>(j.step);
  if (j.mode == Mode::sync) st.progress = j.progress;
  else st.progress = {step, per_epoch ? step / per_epoch : 0, j.consumed, j.own_samples};
  for (const auto& w : j.start.workers) {
    if (j.mode == Mode::async && w != self_id) continue;  // async workers do not tell each other
    if (j.mode == Mode::sync) st.workers.emplace_back(w, j.progress.position);
    else if (w == self_id) st.workers.emplace_back(w, j.consumed);
    else if (const auto it = j.cursors.find(w); it != j.cursors.end()) st.workers.emplace_back(w, it->second);
    else st.workers.emplace_back(w, 0);  // not heard from in this generation yet
  }
  return st;
}

/// Tells the router what to answer status queries with (called each tick and at each generation).
void report_status(Trainer* self) {
  auto& s = self->state;
  caf::anon_send(s.router, status_atom::value,
                 s.job ? std::optional(job_status(*s.job, s.o.self_id)) : std::optional<gossip::JobStatus>());
}

/// Ends the current job here: its evaluator goes with it. `over`: the job is over for this node
/// (done, failed, abandoned), not merely left by it (a worker dropped from a generation may be
/// proposed again).
void drop_job(Trainer* self, bool over = true) {
  auto& job = self->state.job;
  if (job && over) self->state.ended_jobs.insert(job->start.job_id);
  // kill, not user_shutdown: it must not work through queued evaluations of a job that is over.
  if (job && job->evaluator) self->send_exit(job->evaluator, caf::exit_reason::kill);
  if (job && job->shard_host) {
    self->send_exit(job->shard_host, caf::exit_reason::kill);
    // Updates for the next job wait in the router until that job's host registers.
    caf::anon_send(self->state.router, shards_atom::value, caf::actor(), std::vector<gossip::ShardHolders>());
  }
  job.reset();
  report_status(self);
}

void fail(Trainer* self, const std::string& why) {
  auto& j = *self->state.job;
  node_events().warn("job_failed job={} rank={} step={} reason=\"{}\"", j.start.job_id, j.rank, j.step, why);
  JobReport r = report_of(j, JobReport::Kind::failed);
  r.error = fmt::format("{}: {}", self->state.o.self_id, why);
  to_submitter(self, j, r);
  drop_job(self);
}

/// Sends ring chunks to the next worker; false (the job failed) if its send queue is full.
bool send_ring(Trainer* self, std::vector<gossip::RingChunk>& out) {
  auto& j = *self->state.job;
  for (auto& c : out) {
    c.generation = j.generation;
    if (!send_to(self, j.next_address, std::move(c))) {
      fail(self, fmt::format("the send queue to the next worker ({}) is full; raise [cluster] send_queue_mb",
                             j.next_address));
      return false;
    }
  }
  return true;
}

void fail_start(Trainer* self, const gossip::JobStart& start, const std::string& why) {
  node_events().warn("job_refused job={} reason=\"{}\"", start.job_id, why);
  JobReport r;
  r.job_id = start.job_id;
  r.kind = JobReport::Kind::failed;
  r.error = fmt::format("{}: {}", self->state.o.self_id, why);
  send_to(self, start.submitter, r);
}

void add_mode_counters(const Job& j, JobReport& r) {
  if (j.async) r.stale_rejected = j.async->rejected();
  if (j.shard_counters) {
    r.updates_applied = j.shard_counters->applied.load();
    r.staleness_sum = j.shard_counters->staleness_sum.load();
  }
  if (j.gossip) r.exchanges = j.gossip->completed();  // the active side's count: each exchange once
}

/// Rank 0 at the end of a detached job: the model and the result go to this node's
/// results_dir/JOB_ID/ instead (model.safetensors, result.json). Where, or why not, for the log.
std::string save_detached(const TrainerState& s, const Job& j, const JobReport& r) {
  const std::filesystem::path dir = std::filesystem::path(s.o.results_dir) / std::to_string(j.start.job_id);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return fmt::format("not saved: cannot create {}: {}", dir.string(), ec.message());
  if (auto ok = compute::export_safetensors(dir / "model.safetensors", *j.model); !ok)
    return fmt::format("not saved: {}", ok.error().message);
  const std::string result = fmt::format(
      "{{\n  \"job_id\": {},\n  \"mode\": \"{}\",\n  \"generation\": {},\n  \"workers\": {},\n  \"steps\": {},\n"
      "  \"epochs\": {},\n  \"test_accuracy\": {},\n  \"test_loss\": {},\n  \"train_seconds\": {},\n"
      "  \"parameter_checksum\": \"{:016x}\",\n  \"submitter\": \"gone; saved by {}\"\n}}\n",
      j.start.job_id, mode_name(j.mode), j.generation, j.world, j.step, j.epoch, r.test_accuracy, r.test_loss,
      r.train_seconds, r.checksum, s.o.self_id);
  if (auto ok = compute::write_file_atomically(dir / "result.json", result); !ok)
    return fmt::format("not saved: {}", ok.error().message);
  return (dir / "model.safetensors").string();
}

/// Rank 0 at the end: the final model to the submitter, then its done report (a detached job:
/// both to this node's disk).
void complete_rank0(Trainer* self) {
  auto& j = *self->state.job;
  const auto params = j.model->parameters();
  auto copy = std::make_shared<const std::vector<float>>(params.begin(), params.end());
  constexpr size_t piece = 1u << 20;  // elements per frame: 4 MiB, well inside the frame limit
  for (size_t off = 0; off < copy->size() && !j.detached; off += piece) {
    const std::span<const float> data(copy->data() + off, std::min(piece, copy->size() - off));
    if (!send_to(self, j.start.submitter,
                 gossip::ParamPush{0, static_cast<uint64_t>(j.step),
                                   gossip::TensorChunk{static_cast<uint64_t>(j.step), 0, off, copy->size(), data, copy}}))
      return fail(self, "the final model does not fit the send queue to the submitter; raise [cluster] send_queue_mb");
  }
  JobReport r = report_of(j, JobReport::Kind::done);
  r.samples = j.own_samples;
  r.bytes_sent = j.bytes_sent();
  r.checksum = checksum(params);
  add_mode_counters(j, r);
  r.test_accuracy = j.last_accuracy;
  r.test_loss = j.last_test_loss;
  r.eval_seconds = j.eval_seconds;
  const double samples = j.mode == Mode::sync ? static_cast<double>(j.samples) : static_cast<double>(j.own_samples);
  r.samples_per_second = r.train_seconds > 0 ? samples / r.train_seconds : 0.0;
  to_submitter(self, j, r);
  const std::string saved = j.detached ? save_detached(self->state, j, r) : std::string("-");
  node_events().info("job_done job={} mode={} rank=0 steps={} checksum={:016x} compute_s={:.2f} wait_s={:.2f} "
                     "test_accuracy={:.4f} saved=\"{}\"",
                     j.start.job_id, mode_name(j.mode), j.step, r.checksum, j.compute_seconds, j.ring_seconds,
                     r.test_accuracy, saved);
  drop_job(self);
}

void finish_job(Trainer* self) {
  auto& j = *self->state.job;
  j.finishing = true;
  if (j.rank == 0) {
    if (j.pending_evals == 0) complete_rank0(self);
    return;
  }
  JobReport r = report_of(j, JobReport::Kind::done);
  r.samples = j.own_samples;
  r.bytes_sent = j.bytes_sent();
  r.checksum = checksum(j.model->parameters());
  add_mode_counters(j, r);
  to_submitter(self, j, r);
  node_events().info("job_done job={} mode={} rank={} steps={} checksum={:016x} compute_s={:.2f} wait_s={:.2f}",
                     j.start.job_id, mode_name(j.mode), j.rank, j.step, r.checksum, j.compute_seconds, j.ring_seconds);
  drop_job(self);
}

/// Async and gossip with stop_at_target: no fresh step after the one under way. What follows is
/// the usual end (async: pushes flushed and answered, the shards pulled; gossip: the final average).
void stop_training(Trainer* self) {
  auto& j = *self->state.job;
  if (j.step >= j.total_steps) return;
  node_events().info("stop_at_target job={} rank={} step={} of={}", j.start.job_id, j.rank, j.step, j.total_steps);
  j.total_steps = j.step;
}

/// Rank 0, async and gossip: the target is reached; every other worker is told to stop (again on
/// each tick until the job ends, should a message be lost).
void tell_target_reached(Trainer* self) {
  auto& s = self->state;
  auto& j = *s.job;
  for (size_t i = 1; i < j.start.addresses.size(); ++i)
    send_to(self, j.start.addresses[i],
            gossip::Control{s.o.self_id, s.o.incarnation, gossip::Control::Command::target_reached, j.start.job_id, {}});
}

/// Rank 0: evaluates a snapshot of the parameters in the evaluator, reports it when done.
void evaluate_snapshot(Trainer* self) {
  auto& j = *self->state.job;
  if (j.last_eval_step == j.step) return;
  j.last_eval_step = j.step;
  ++j.pending_evals;
  const auto params = j.model->parameters();
  JobReport r = report_of(j, JobReport::Kind::evaluation);
  const uint64_t job_id = j.start.job_id;
  self->request(j.evaluator, caf::infinite, eval_atom::value, std::vector<float>(params.begin(), params.end()))
      .then([self, r, job_id](double accuracy, double loss, double seconds) mutable {
        auto& job = self->state.job;
        if (!job || job->start.job_id != job_id) return;
        --job->pending_evals;
        job->last_accuracy = r.test_accuracy = accuracy;
        job->last_test_loss = r.test_loss = loss;
        job->eval_seconds += seconds;
        const bool reached = job->config.job.stop_at_target && accuracy >= job->config.job.target_accuracy;
        if (reached && !job->target_reached && job->mode != Mode::sync) {
          job->target_reached = true;
          tell_target_reached(self);
          stop_training(self);
          if (!self->state.job) return;
        }
        job->target_reached |= reached;
        r.eval_seconds = seconds;
        to_submitter(self, *job, r);
        if (job->finishing && job->pending_evals == 0) complete_rank0(self);
      },
      [self, job_id](const caf::error& e) {
        auto& job = self->state.job;
        if (job && job->start.job_id == job_id) fail(self, "evaluation failed: " + self->system().render(e));
      });
}

/// The first step a worker completes in a generation: when training resumed after a change.
void note_first_step(Job& j) {
  if (j.stepped_in_generation) return;
  j.stepped_in_generation = true;
  node_events().info("generation_first_step job={} generation={} step={}", j.start.job_id, j.generation, j.step);
}

/// Sync: whether the job is over at the progress every member shares (or a stop vote was summed).
bool sync_finished(const Job& j) {
  return j.stop_voted || elastic::job_finished(j.progress, j.config.job.epochs, j.config.job.max_steps);
}

/// The ring summed everything: divide by the samples, step the optimiser, move on.
void finish_step(Trainer* self) {
  auto& j = *self->state.job;
  const size_t e = j.elements();
  const double total = j.buffer[e + 1];
  const float inv = static_cast<float>(1.0 / total);
  auto grads = j.model->gradients();
  for (size_t i = 0; i < e; ++i) grads[i] = j.buffer[i] * inv;
  j.loss = j.buffer[e] / total;
  j.optimizer->step(j.model->parameters(), grads, j.rate->at(j.progress));
  j.progress = elastic::after_sync_step(j.progress, j.data.train.size(), j.world, j.config.data.batch_size);
  j.step = static_cast<int64_t>(j.progress.step);
  // A stop vote in the sum: every worker ends after this same step.
  if (j.buffer[e + 2] > 0) j.stop_voted = true;
  j.samples += static_cast<uint64_t>(total);
  j.window_samples += static_cast<uint64_t>(total);
  j.last_step_end = Clock::now();
  j.ring_seconds += seconds_between(j.waiting_since, j.last_step_end);
  const bool epoch_end = static_cast<int64_t>(j.progress.epoch) != j.epoch;
  j.epoch = static_cast<int64_t>(j.progress.epoch);
  note_first_step(j);
  const bool over = sync_finished(j);
  if (j.rank == 0) {
    if (j.step % j.config.job.log_every_steps == 0 || over) {
      JobReport r = report_of(j, JobReport::Kind::progress);
      r.samples = j.progress.samples;
      r.samples_per_second = static_cast<double>(j.window_samples) / std::max(1e-9, seconds_between(j.window_start, j.last_step_end));
      to_submitter(self, j, r);
      j.window_samples = 0;
      j.window_start = j.last_step_end;
    }
    const auto every = j.config.job.eval_every_steps;
    if ((every > 0 && j.step % every == 0) || epoch_end || over) evaluate_snapshot(self);
  }
  if (over) return finish_job(self);
  self->send(self, step_atom::value);
}

/// The gradient of positions [begin, end) of epoch `epoch`'s permutation into the model's
/// gradients; returns the samples (0: none) and sets their loss.
int64_t compute_positions(Job& j, int64_t epoch, int64_t begin, int64_t end, float& loss) {
  const int64_t n = j.data.train.size();
  if (epoch != j.order_epoch) {
    if (j.config.data.shuffle) {
      j.order = compute::shuffled_indices(n, j.config.job.seed, epoch);
    } else {
      j.order.resize(static_cast<size_t>(n));
      std::iota(j.order.begin(), j.order.end(), 0);
    }
    j.order_epoch = epoch;
  }
  if (end <= begin) return 0;
  const std::span<const int64_t> idx(j.order.data() + begin, static_cast<size_t>(end - begin));
  compute::gather_batch(j.data.train, idx, j.x, j.y);
  loss = compute::compute_gradients(*j.model, *j.backend, j.x, j.y, j.scratch);
  return end - begin;
}

/// Gossip: the gradient of one local step's pieces of positions (one epoch) into the model's
/// gradients; returns the samples and sets their loss.
int64_t compute_pieces(Job& j, const elastic::StepSlice& slice, float& loss) {
  if (slice.count == 0) return 0;
  compute_positions(j, static_cast<int64_t>(slice.epoch), 0, 0, loss);  // the epoch's order
  std::vector<int64_t> idx;
  idx.reserve(slice.count);
  for (const auto& [begin, end] : slice.pieces)
    idx.insert(idx.end(), j.order.begin() + static_cast<ptrdiff_t>(begin), j.order.begin() + static_cast<ptrdiff_t>(end));
  compute::gather_batch(j.data.train, idx, j.x, j.y);
  loss = compute::compute_gradients(*j.model, *j.backend, j.x, j.y, j.scratch);
  return static_cast<int64_t>(idx.size());
}

/// Async: the gradient of this worker's slice of global batch t (of epoch t /
/// steps_per_epoch) into the model's gradients; returns the samples in the slice (0 for a short
/// last step) and their loss.
int64_t compute_slice(Job& j, int64_t t, float& loss) {
  const int64_t n = j.data.train.size(), batch = j.config.data.batch_size;
  const int64_t epoch = t / j.steps_per_epoch, in_epoch = t % j.steps_per_epoch;
  const auto [begin, end] = elastic::sync_batch_slice(n, j.world, batch, in_epoch, j.rank);
  return compute_positions(j, epoch, begin, end, loss);
}

/// Whether this worker may take a step now: not while it has promised a generation that is not
/// installed yet, nor while it pulls the state.
bool may_step(const Job& j) {
  return !j.control || (j.member && !j.control->paused() && !j.pulling && j.has_state);
}

void sync_step(Trainer* self) {
  auto& j = *self->state.job;
  if (!may_step(j)) return;
  // A member that pulled the state of the job's last step (the others finished meanwhile) is done.
  if (sync_finished(j)) return finish_job(self);
  // One step at a time: a step message left over from an earlier job or step finds the ring busy.
  if (j.ring->step() == j.progress.step + 1 && !j.ring->done()) return;
  const size_t e = j.elements();
  const auto now = Clock::now();
  if (!j.first_step) j.first_step = j.window_start = now;
  float loss = 0;
  const auto [begin, end] =
      elastic::sync_slice(j.progress, j.data.train.size(), j.config.data.batch_size, j.rank);
  if (const int64_t samples = compute_positions(j, static_cast<int64_t>(j.progress.epoch), begin, end, loss);
      samples > 0) {
    const auto count = static_cast<float>(samples);
    const auto grads = j.model->gradients();
    for (size_t i = 0; i < e; ++i) j.buffer[i] = grads[i] * count;
    j.buffer[e] = loss * count;
    j.buffer[e + 1] = count;
    j.own_samples += static_cast<uint64_t>(samples);
  } else {
    std::fill(j.buffer.begin(), j.buffer.end(), 0.0f);  // a short last step: nothing for this rank
  }
  j.buffer[e + 2] = j.target_reached ? 1.0f : 0.0f;
  std::vector<gossip::RingChunk> out;
  j.ring->start(j.progress.step + 1, j.buffer, out);
  if (!send_ring(self, out)) return;
  j.waiting_since = j.progress_at = Clock::now();
  j.compute_seconds += seconds_between(now, j.waiting_since);
  if (j.ring->done()) finish_step(self);
}

/// Async and gossip, after each fresh local step: epoch count, and rank 0's progress reports and
/// evaluations. A global step here is one step of every worker (world x batch samples, as in
/// sync); rank 0's own steps stand for them, and its rate times the workers for the cluster's.
void after_local_step(Trainer* self, int64_t samples, float loss) {
  auto& j = *self->state.job;
  ++j.step;
  note_first_step(j);
  j.own_samples += static_cast<uint64_t>(samples);
  j.window_samples += static_cast<uint64_t>(samples);
  j.loss = loss;
  j.last_step_end = Clock::now();
  // Gossip: the epoch is that of the step's positions (set by the step); async counts steps.
  const bool epoch_end =
      j.mode == Mode::gossip
          ? elastic::next_slice(j.spans, j.consumed, static_cast<uint64_t>(j.config.data.batch_size)).epoch !=
                static_cast<uint64_t>(j.epoch)
          : j.step % j.steps_per_epoch == 0;
  if (epoch_end && j.mode != Mode::gossip) ++j.epoch;
  // This worker's last step: gossip at the end of its list, async at its step count.
  const bool last = j.step >= j.total_steps ||
                    (j.mode == Mode::gossip &&
                     elastic::next_slice(j.spans, j.consumed, static_cast<uint64_t>(j.config.data.batch_size)).count == 0);
  if (last && j.mode == Mode::gossip) j.epoch = static_cast<int64_t>(j.spans.empty() ? 0 : j.spans.back().epoch + 1);
  if (j.rank != 0) return;
  if (j.step % j.config.job.log_every_steps == 0 || last) {
    JobReport r = report_of(j, JobReport::Kind::progress);
    r.samples = j.own_samples * j.world;
    r.samples_per_second = static_cast<double>(j.window_samples * j.world) /
                           std::max(1e-9, seconds_between(j.window_start, j.last_step_end));
    to_submitter(self, j, r);
    j.window_samples = 0;
    j.window_start = j.last_step_end;
  }
  // The final model is evaluated once it exists (after the final average or the shard pull).
  const auto every = j.config.job.eval_every_steps;
  if (!last && ((every > 0 && j.step % every == 0) || epoch_end)) evaluate_snapshot(self);
}

void send_all(Trainer* self, elastic::Outgoing<gossip::ShardUpdate>& out) {
  auto& j = *self->state.job;
  for (auto& [address, u] : out) {
    j.tensor_bytes += u.chunk.data.size_bytes();
    if (!send_to(self, address, std::move(u)))
      return fail(self, fmt::format("the send queue to {} is full; raise [cluster] send_queue_mb", address));
    if (!self->state.job) return;
  }
}

void finish_async(Trainer* self);

/// Async: one batch (a fresh one, or a refused one again), its gradient pushed to the shards.
void async_step(Trainer* self) {
  auto& j = *self->state.job;
  if (j.serving || j.assembling || j.blocked) return;
  auto& a = *j.async;
  if (!a.may_step()) {
    j.blocked = true;  // an answer unblocks
    return;
  }
  auto work = a.take_redo();
  const bool fresh = !work;
  if (fresh && j.step >= j.total_steps) {
    if (j.config.elastic.local_steps > 0) {
      elastic::Outgoing<gossip::ShardUpdate> rest;
      a.flush(rest);
      send_all(self, rest);
      if (!self->state.job) return;
    }
    return finish_async(self);
  }
  if (fresh) work = elastic::AsyncWorker::Work{static_cast<uint64_t>(j.step)};
  const auto now = Clock::now();
  if (!j.first_step) j.first_step = j.window_start = now;
  float loss = 0;
  const int64_t samples = compute_slice(j, static_cast<int64_t>(work->batch), loss);
  const auto grads = j.model->gradients();
  if (samples > 0 && !std::all_of(grads.begin(), grads.end(), [](float g) { return std::isfinite(g); }))
    return fail(self, fmt::format("the gradient of batch {} is not finite: the model diverged (lower optimizer.lr)",
                                  work->batch));
  elastic::Outgoing<gossip::ShardUpdate> out;
  const float lr = j.schedule->at(static_cast<int64_t>(work->batch));
  if (j.config.elastic.local_steps > 0 && samples > 0) {
    // Updates mode: this worker's optimiser steps, and the change it made goes to the shards.
    const auto params = j.model->parameters();
    j.buffer.assign(params.begin(), params.end());
    j.optimizer->step(params, grads, lr);
    for (size_t i = 0; i < params.size(); ++i) j.buffer[i] = params[i] - j.buffer[i];
    a.on_update(j.buffer, static_cast<float>(j.config.elastic.outer_lr), out);
  } else if (samples > 0) {  // a short last slice with no samples of this rank's has nothing to push
    a.on_gradient(*work, grads, lr, out);
  }
  j.waiting_since = j.progress_at = Clock::now();
  j.compute_seconds += seconds_between(now, j.waiting_since);
  send_all(self, out);
  if (!self->state.job) return;
  if (fresh) after_local_step(self, samples, loss);
  self->send(self, step_atom::value);
}

/// Rank 0: pulls every shard not assembled yet from its primary (again on each tick, should an
/// answer be lost).
void pull_missing(Trainer* self) {
  auto& j = *self->state.job;
  elastic::Outgoing<gossip::ShardUpdate> out;
  for (uint32_t s = 0; s < j.placement.size(); ++s) {
    if (j.assembled[s]) continue;
    const auto it = std::find(j.start.workers.begin(), j.start.workers.end(), j.placement[s].front());
    out.emplace_back(j.start.addresses[static_cast<size_t>(it - j.start.workers.begin())],
                     gossip::ShardUpdate{j.start.job_id, s, gossip::ShardUpdate::Kind::pull, 0, 0, {}});
  }
  send_all(self, out);
}

/// Rank 0, once every worker has applied all its updates: pull every shard for the final model.
void maybe_assemble(Trainer* self) {
  auto& j = *self->state.job;
  if (j.assembling || j.finished.size() < j.world) return;
  j.assembling = true;
  j.assembled.assign(j.placement.size(), 0);
  j.assembled_count = 0;
  pull_missing(self);
}

/// Async: every fresh batch done; once every push is answered (and refused ones redone), this
/// worker is finished. Rank 0 then waits for the others; the others keep serving their shards.
void finish_async(Trainer* self) {
  auto& j = *self->state.job;
  if (!j.async->idle() || j.serving || j.finished.contains(self->state.o.self_id)) return;
  node_events().info("async_finished job={} rank={} steps={} pushes={} stale_rejected={}", j.start.job_id, j.rank,
                     j.step, j.async->pushes(), j.async->rejected());
  if (j.rank == 0) {
    j.finished.insert(self->state.o.self_id);
    return maybe_assemble(self);
  }
  j.serving = true;
  gossip::Control finished{self->state.o.self_id, self->state.o.incarnation, gossip::Control::Command::worker_finished,
                           j.start.job_id, {}};
  send_to(self, j.start.addresses[0], finished);
}

void on_shard_state(Trainer* self, const std::string& peer, const gossip::ShardState& st) {
  auto& s = self->state;
  if (!s.job || s.job->mode != Mode::async || s.job->start.job_id != st.job_id) return;
  auto& j = *s.job;
  if (st.shard >= j.placement.size() || peer != j.placement[st.shard].front()) {
    node_events().warn("shard_state_refused from={} shard={} reason=\"not the shard's primary\"", peer, st.shard);
    return;
  }
  if (j.assembling) {
    const auto range = elastic::shard_range(j.elements(), static_cast<uint32_t>(j.placement.size()), st.shard);
    if (j.assembled[st.shard]) return;  // a pull repeated while the first answer travelled
    if (st.chunk.offset != 0 || st.chunk.data.size() != range.size()) {
      node_events().warn("shard_state_refused from={} shard={} reason=\"not the pulled shard's size\"", peer, st.shard);
      return;
    }
    std::copy(st.chunk.data.begin(), st.chunk.data.end(),
              j.model->parameters().begin() + static_cast<ptrdiff_t>(range.begin));
    j.assembled[st.shard] = 1;
    if (++j.assembled_count < j.placement.size()) return;
    // The final model is whole: the others may let their shards go; rank 0 evaluates and reports.
    gossip::Control over{s.o.self_id, s.o.incarnation, gossip::Control::Command::job_finished, j.start.job_id, {}};
    for (size_t i = 1; i < j.start.addresses.size(); ++i) send_to(self, j.start.addresses[i], over);
    evaluate_snapshot(self);
    return finish_job(self);
  }
  elastic::Outgoing<gossip::ShardUpdate> out;
  if (auto ok = j.async->on_state(st, j.model->parameters(), out); !ok) {
    node_events().warn("shard_state_refused from={} shard={} reason=\"{}\"", peer, st.shard, ok.error());
    return;
  }
  j.waiting_since = j.progress_at = Clock::now();
  send_all(self, out);
  if (!s.job) return;
  if (j.blocked && j.async->may_step()) {
    j.blocked = false;
    self->send(self, step_atom::value);
  }
  if (j.step >= j.total_steps) {
    if (j.async->idle()) finish_async(self);
    else if (!j.blocked) self->send(self, step_atom::value);  // refused batches to redo
  }
}

void start_final_average(Trainer* self);

/// Gossip: the ring has summed the replicas; every worker divides the same sum the same way.
void end_final_average(Trainer* self) {
  auto& j = *self->state.job;
  const auto p = j.model->parameters();
  const float inv = 1.0f / static_cast<float>(j.world);
  for (size_t i = 0; i < p.size(); ++i) p[i] = j.buffer[i] * inv;
  j.ring_seconds += seconds_between(j.waiting_since, Clock::now());
  j.last_eval_step = -1;  // the average is another model than the replica evaluated at this step
  if (j.rank == 0) evaluate_snapshot(self);
  finish_job(self);
}

/// Gossip: this worker's local steps as a progress, in reference batches (the rate policy reads the
/// schedule at the step and ramps over samples).
gossip::JobProgress gossip_progress(const Job& j) {
  const auto step = static_cast<uint64_t>(j.step), per_epoch = static_cast<uint64_t>(j.steps_per_epoch);
  const uint64_t reference = j.start.reference_batch;
  return {step, step / per_epoch, step % per_epoch * reference, step * reference};
}

/// Gossip: a local step on this worker's replica, and now and then an averaging with a peer.
void gossip_step(Trainer* self) {
  auto& j = *self->state.job;
  if (j.final_average || !may_step(j)) return;
  const auto slice = elastic::next_slice(j.spans, j.consumed, static_cast<uint64_t>(j.config.data.batch_size));
  if (slice.count == 0 || j.step >= j.total_steps) return start_final_average(self);
  const auto now = Clock::now();
  if (!j.first_step) j.first_step = j.window_start = now;
  float loss = 0;
  const int64_t samples = compute_pieces(j, slice, loss);
  j.consumed += slice.count;
  j.epoch = static_cast<int64_t>(slice.epoch);
  if (samples > 0) j.optimizer->step(j.model->parameters(), j.model->gradients(), j.rate->at(gossip_progress(j)));
  if (j.gossip->after_step()) {
    j.partner = j.gossip->partner(j.random());
    std::vector<gossip::GossipAverage> out;
    j.gossip->begin(j.next_exchange++, j.model->parameters(), out);
    for (auto& m : out) {
      m.generation = j.generation;
      m.consumed = j.consumed;
      j.tensor_bytes += m.chunk.data.size_bytes();
      if (!send_to(self, j.start.addresses[j.partner], std::move(m)))
        return fail(self, fmt::format("the send queue to worker {} is full; raise [cluster] send_queue_mb",
                                      j.start.workers[j.partner]));
    }
  }
  j.compute_seconds += seconds_between(now, Clock::now());
  after_local_step(self, samples, loss);
  self->send(self, step_atom::value);
}

/// Gossip, after the last local step: one ring all-reduce of the replicas; every worker ends with
/// the same average.
void start_final_average(Trainer* self) {
  auto& j = *self->state.job;
  j.final_average = true;
  j.gossip->abandon();
  const auto params = j.model->parameters();
  std::copy(params.begin(), params.end(), j.buffer.begin());
  std::vector<gossip::RingChunk> out;
  j.ring->start(1, j.buffer, out);
  if (!send_ring(self, out)) return;
  j.waiting_since = j.progress_at = Clock::now();
  if (j.ring->done()) end_final_average(self);
}

void on_gossip(Trainer* self, const std::string& peer, const gossip::GossipAverage& m) {
  auto& s = self->state;
  if (!s.job || s.job->mode != Mode::gossip || s.job->start.job_id != m.job_id) return;
  auto& j = *s.job;
  const auto it = std::find(j.start.workers.begin(), j.start.workers.end(), peer);
  if (it == j.start.workers.end()) {
    node_events().warn("gossip_refused from={} reason=\"not a worker of job {}\"", peer, j.start.job_id);
    return;
  }
  const auto from = static_cast<uint32_t>(it - j.start.workers.begin());
  // Mixings happen within one generation, and not while this worker has promised the next: its
  // ack's cursors must stay what was mixed.
  if (m.generation != j.generation || !j.member || (j.control && j.control->paused())) return;
  // What it had trained on when it sent this is in the mixing: counted, should it die.
  if (m.generation == j.generation) j.cursors[peer] = std::max(j.cursors[peer], m.consumed);
  if (m.reply) {
    if (from != j.partner) {
      node_events().warn("gossip_refused from={} reason=\"not the partner of this exchange\"", peer);
      return;
    }
    if (auto ok = j.gossip->on_reply(m, j.model->parameters()); !ok && !j.final_average)
      node_events().warn("gossip_refused from={} reason=\"{}\"", peer, ok.error());
    return;
  }
  if (j.final_average) return;  // the replicas are being averaged for good: no more pairs
  std::vector<gossip::GossipAverage> out;
  if (auto ok = j.gossip->on_request(m, j.model->parameters(), out); !ok) {
    node_events().warn("gossip_refused from={} reason=\"{}\"", peer, ok.error());
    return;
  }
  for (auto& r : out) {
    r.generation = j.generation;
    r.consumed = j.consumed;
    j.tensor_bytes += r.chunk.data.size_bytes();
    send_to(self, j.start.addresses[from], std::move(r));
  }
}

/// Sync: a ring step is under way (this worker sent its part and waits for the sum).
bool mid_step(const Job& j) {
  return j.mode == Mode::sync && j.ring && j.ring->step() == j.progress.step + 1 && !j.ring->done();
}

/// Ends a drain: this worker takes no further step; what it says is where it stopped.
void end_drain(Trainer* self) {
  auto& s = self->state;
  const Job* j = s.job.get();
  const std::string where = !j ? std::string("no job")
                               : fmt::format("job {} generation {} after step {}", j->start.job_id, j->generation,
                                             j->mode == Mode::sync ? j->progress.step : static_cast<uint64_t>(j->step));
  node_events().info("trainer_drained {}", where);
  s.drained = true;
  if (s.drain) s.drain->deliver(where);
  s.drain.reset();
}

/// Asked to drain: at once when no step is under way (between steps, paused, pulling, not a
/// member, async), else when the step under way ends (do_step).
void on_drain(Trainer* self) {
  const Job* j = self->state.job.get();
  if (!j || !j->member || j->finishing || !may_step(*j) || !mid_step(*j)) end_drain(self);
}

void do_step(Trainer* self) {
  auto& s = self->state;
  if (s.drain && !(s.job && mid_step(*s.job))) end_drain(self);
  if (s.drained) return;
  auto* j = s.job.get();
  if (!j || j->finishing) return;
  switch (j->mode) {
    case Mode::sync: return sync_step(self);
    case Mode::async: return async_step(self);
    case Mode::gossip: return gossip_step(self);
  }
}

void on_chunk(Trainer* self, const std::string& peer, const gossip::RingChunk& c) {
  auto& s = self->state;
  if (!s.job || s.job->start.job_id != c.job_id) {
    // A neighbour that was told of the job first may already be on step 1: keep its chunks.
    constexpr size_t stash_limit = 256u << 20;
    const size_t bytes = c.chunk.data.size_bytes();
    if (c.job_id > s.last_job && (!s.job || c.job_id > s.job->start.job_id) && s.stash_bytes + bytes <= stash_limit) {
      s.stash.emplace_back(peer, c);
      s.stash_bytes += bytes;
    }
    return;
  }
  auto& j = *s.job;
  if (!j.ring) return;  // async: no ring
  if (c.generation != j.generation) {
    // A member that installed the next generation first has started its ring: keep its chunks
    // (bounded) for when this worker installs it too. Older generations' rings are over.
    constexpr size_t ahead_limit = 256u << 20;
    if (c.generation > j.generation && j.ahead_bytes + c.chunk.data.size_bytes() <= ahead_limit) {
      j.ahead.emplace_back(peer, c);
      j.ahead_bytes += c.chunk.data.size_bytes();
    }
    return;
  }
  // A worker that promised the next generation finishes no step of this one: what it reported
  // in its ack must stay true until the install.
  if (j.control && j.control->paused()) return;
  if (peer != j.prev_id) {
    node_events().warn("ring_chunk_refused from={} reason=\"not the previous worker ({})\"", peer, j.prev_id);
    return;
  }
  std::vector<gossip::RingChunk> out;
  if (auto ok = j.ring->on_chunk(c, out); !ok) {
    node_events().warn("ring_chunk_refused from={} reason=\"{}\"", peer, ok.error());
    return;
  }
  j.progress_at = Clock::now();  // not waiting_since: the wait for this step goes on
  if (!send_ring(self, out)) return;
  if (j.mode == Mode::gossip) {
    j.heard_final = true;
    if (j.ring->done() && j.final_average && !j.finishing) end_final_average(self);
    return;
  }
  if (j.ring->done() && !j.finishing && j.ring->step() == j.progress.step + 1) finish_step(self);
}

/// Async: the shards, where they live, this worker's side of the protocol, and the host for the
/// shards this node holds. Every node starts from the same initial parameters (same seed), so
/// primaries and replicas start equal.
std::expected<void, std::string> setup_async(Trainer* self, Job& j) {
  auto& o = self->state.o;
  const auto& e = j.config.elastic;
  const auto shards = static_cast<uint32_t>(
      std::clamp<int64_t>(e.shards > 0 ? e.shards : 2 * static_cast<int64_t>(j.world), 1, static_cast<int64_t>(j.elements())));
  const size_t largest_kb = elastic::shard_range(j.elements(), shards, 0).size() * sizeof(float) / 1024 + 1;
  if (static_cast<int64_t>(largest_kb) + 64 > o.max_frame_kb)
    return std::unexpected(fmt::format("a shard of {} KiB does not fit this node's frames ([cluster] max_frame_mb = {}); "
                                       "raise [elastic] shards",
                                       largest_kb, o.max_frame_kb / 1024));
  j.placement = elastic::place_shards(shards, j.start.workers, static_cast<int>(e.replication));
  const auto address_of = [&](const std::string& id) {
    const auto it = std::find(j.start.workers.begin(), j.start.workers.end(), id);
    return j.start.addresses[static_cast<size_t>(it - j.start.workers.begin())];
  };
  std::vector<std::string> primaries;
  for (const auto& holders : j.placement) primaries.push_back(address_of(holders.front()));
  j.async.emplace(elastic::AsyncWorker::Options{j.start.job_id, j.elements(), shards, primaries,
                                                static_cast<uint32_t>(e.push_window),
                                                static_cast<uint64_t>(std::max<int64_t>(1, j.config.job.max_staleness)),
                                                static_cast<uint32_t>(e.local_steps), j.world});
  auto init = std::make_shared<ShardHostInit>();
  init->transport = o.transport;
  init->cluster_id = o.cluster_id;
  init->self_id = o.self_id;
  init->self_address = o.self_address;
  init->incarnation = o.incarnation;
  init->job_id = j.start.job_id;
  init->workers = j.start.workers;
  init->addresses = j.start.addresses;
  init->placement = j.placement;
  init->trainer = caf::actor_cast<caf::actor>(self);
  j.shard_counters = init->counters = std::make_shared<ShardHostCounters>();
  const auto params = j.model->parameters();
  std::string held;
  for (uint32_t s = 0; s < shards; ++s) {
    const auto& holders = j.placement[s];
    const auto me = std::find(holders.begin(), holders.end(), o.self_id);
    if (me == holders.end()) continue;
    const auto range = elastic::shard_range(j.elements(), shards, s);
    // Updates mode: the workers' optimisers have stepped already; the primary adds their changes.
    compute::OptimizerOptions plain;
    plain.momentum = 0;
    auto optimizer =
        compute::make_optimizer(e.local_steps > 0 ? plain : j.config.optimizer.options, range.size());
    if (!optimizer) return std::unexpected(optimizer.error().message);
    std::vector<std::string> replicas;
    if (me == holders.begin())
      for (auto r = holders.begin() + 1; r != holders.end(); ++r) replicas.push_back(address_of(*r));
    init->shards.emplace(s, std::make_unique<elastic::ShardServer>(
                                elastic::ShardServer::Options{j.start.job_id, s,
                                                              static_cast<uint64_t>(j.config.job.max_staleness), replicas,
                                                              e.local_steps > 0 ? 1.0f : std::numeric_limits<float>::infinity()},
                                std::vector<float>(params.begin() + static_cast<ptrdiff_t>(range.begin),
                                                   params.begin() + static_cast<ptrdiff_t>(range.end)),
                                std::move(*optimizer)));
    held += fmt::format("{}{}{}", held.empty() ? "" : ",", s, me == holders.begin() ? "p" : "r");
  }
  node_events().info("shards_placed job={} shards={} replication={} held={}", j.start.job_id, shards,
                     std::min<int64_t>(e.replication, j.world), held.empty() ? "-" : held);
  j.shard_host = spawn_shard_host(*self, std::move(init));
  // Should the trainer itself end, the host ends with it.
  self->attach_functor([host = caf::actor_cast<caf::weak_actor_ptr>(j.shard_host)](const caf::error&) {
    if (auto h = caf::actor_cast<caf::actor>(host)) caf::anon_send_exit(h, caf::exit_reason::kill);
  });
  return {};
}

std::expected<void, std::string> setup(Trainer* self, Job& j) {
  auto& o = self->state.o;
  auto config = elastic::parse_config(j.start.config, fmt::format("job {} from {}", j.start.job_id, j.start.submitter));
  if (!config) return std::unexpected(config.error().message);
  j.config = std::move(*config);
  if (o.threads > 0) j.config.compute.threads = o.threads;
  auto data = elastic::load_job_data(j.config.data, j.config.job.seed);
  if (!data) return std::unexpected(data.error().message);
  j.data = std::move(*data);
  auto model = elastic::build_job_model(j.config, j.data.train);
  if (!model) return std::unexpected(model.error().message);
  j.model = std::move(*model);
  auto backend = compute::make_backend(j.config.compute.backend);
  if (!backend) return std::unexpected(backend.error().message);
  j.backend = std::move(*backend);
  j.backend->set_threads(static_cast<int>(j.config.compute.threads));
  // Epochs are counted in reference batches (the first generation's global batch), so the job's
  // length and its schedule keep their meaning when the number of workers changes.
  const int64_t batch = j.config.data.batch_size;
  // The first generation's workers all compute it alike; later records carry it.
  if (j.start.reference_batch == 0) j.start.reference_batch = static_cast<uint64_t>(j.world) * static_cast<uint64_t>(batch);
  const auto reference = static_cast<int64_t>(j.start.reference_batch);
  j.steps_per_epoch = elastic::sync_steps_per_epoch(j.data.train.size(), 1, reference);
  j.total_steps = j.steps_per_epoch * j.config.job.epochs;
  if (j.config.job.max_steps > 0) j.total_steps = std::min(j.total_steps, j.config.job.max_steps);
  auto optimizer = compute::make_optimizer(j.config.optimizer.options, j.elements());
  if (!optimizer) return std::unexpected(optimizer.error().message);
  j.optimizer = std::move(*optimizer);
  compute::ScheduleOptions schedule = j.config.optimizer.schedule;
  schedule.total_steps = j.total_steps;
  auto made = compute::LrSchedule::make(schedule);
  if (!made) return std::unexpected(made.error().message);
  j.schedule = *made;
  j.rate.emplace(*made, elastic::RatePolicy::Options{j.data.train.size(), reference, j.config.elastic.rescale_batches});
  if (j.config.job.ring_chunk_kb + 64 > o.max_frame_kb)
    return std::unexpected(fmt::format("job.ring_chunk_kb = {} does not fit this node's frames ([cluster] max_frame_mb "
                                       "= {})",
                                       j.config.job.ring_chunk_kb, o.max_frame_kb / 1024));
  const auto& mode = j.config.job.mode;
  if (mode == "sync") {
    j.mode = Mode::sync;
    j.buffer.assign(j.elements() + 3, 0.0f);
  } else if (mode == "gossip") {
    j.mode = Mode::gossip;
    j.buffer.assign(j.elements(), 0.0f);
    // Each worker trains through its own list of positions; the job ends when all are done.
    if (j.start.spans.empty())
      for (const auto& list : elastic::initial_spans(j.data.train.size(), j.config.job.epochs, j.world))
        j.start.spans.push_back(elastic::triples_of(list));
    j.total_steps = j.config.job.max_steps > 0 ? j.config.job.max_steps : std::numeric_limits<int64_t>::max();
  } else if (mode == "async") {
    j.mode = Mode::async;
    if (auto ok = setup_async(self, j); !ok) return ok;
  } else {
    return std::unexpected(fmt::format("job.mode = \"{}\" is not a cluster mode (sync, async or gossip)", mode));
  }
  return {};
}

/// Rank 0's evaluator, made when this worker first has rank 0.
std::expected<void, std::string> ensure_evaluator(Trainer* self, Job& j) {
  if (j.evaluator) return {};
  auto kit = std::make_shared<EvalKit>();
  auto eval_model = elastic::build_job_model(j.config, j.data.train);
  auto eval_backend = compute::make_backend(j.config.compute.backend);
  if (!eval_model || !eval_backend) return std::unexpected(std::string("cannot build the evaluator's model"));
  kit->model = std::move(*eval_model);
  kit->backend = std::move(*eval_backend);
  kit->backend->set_threads(static_cast<int>(j.config.compute.threads));
  kit->test = j.data.test;
  j.evaluator = self->spawn<caf::detached>(evaluator, kit);
  // Should the trainer itself end (node stopping, role failure), the evaluator ends with it.
  self->attach_functor([evaluator = caf::actor_cast<caf::weak_actor_ptr>(j.evaluator)](const caf::error&) {
    if (auto e = caf::actor_cast<caf::actor>(evaluator)) caf::anon_send_exit(e, caf::exit_reason::kill);
  });
  return {};
}

double now_ms(const TrainerState& s) { return std::chrono::duration<double, std::milli>(Clock::now() - s.started).count(); }

elastic::JobControl::Local local_of(const Job& j) {
  if (j.mode == Mode::sync) return {j.progress, j.has_state};
  auto progress = gossip_progress(j);
  progress.position = j.consumed;  // the cursor in this worker's list
  // Cursors count only in the generation they were measured in: the one the acks build on.
  const bool current = j.member && j.control && j.control->record().generation == j.generation;
  if (!current) return {progress, false, {}};
  return {progress, j.has_state, {j.cursors.begin(), j.cursors.end()}};
}

/// The job's state as one vector: the parameters, then each optimiser state buffer.
elastic::StateView state_view(Job& j) {
  std::vector<std::span<float>> parts{j.model->parameters()};
  for (auto& [name, buffer] : j.optimizer->state()) parts.push_back(buffer);
  return elastic::StateView(std::move(parts));
}

size_t chunk_elements(const Job& j) { return static_cast<size_t>(j.config.job.ring_chunk_kb) * 1024 / sizeof(float); }

std::unique_ptr<elastic::JobControl> make_control(const TrainerState& s, const elastic::JobConfig* config) {
  elastic::JobControl::Options o{s.o.self_id, s.o.boot_id};
  if (config) {
    o.quorum = config->elastic.quorum == "any" ? elastic::Quorum::any : elastic::Quorum::majority;
    o.min_workers = static_cast<size_t>(config->elastic.min_workers);
  }
  return std::make_unique<elastic::JobControl>(o);
}

void enter_generation(Trainer* self);

/// Carries out what job control asked for: its messages, its log lines, and what changed.
void apply_control(Trainer* self, uint64_t job_id, elastic::JobControl::Output& out) {
  auto& s = self->state;
  for (const auto& line : out.log) node_events().info("job_control job={} {}", job_id, line);
  for (auto& [address, body] : out.sends) send_to(self, address, std::move(body));
  if (!s.job || s.job->start.job_id != job_id) return;
  auto& j = *s.job;
  if (out.paused) node_events().info("job_paused job={} step={} promised={}", job_id, j.step, j.control->promised());
  if (!out.dropped.empty()) {
    // Not a worker of the installed generation (it was taken for gone): it lets its state go and
    // waits, holding the record and its promises, to be proposed again as a joiner.
    node_events().info("job_left job={} reason=\"{}\"", job_id, out.dropped);
    j.member = false;
    j.has_state = false;
    j.pulling.reset();
    j.cursors.clear();  // they point into lists of a generation this worker is no longer in
    j.consumed = 0;
    return;
  }
  if (out.installed) enter_generation(self);
}

/// Ring chunks of the generation just installed that came before it, then the next step.
void resume_training(Trainer* self) {
  auto& s = self->state;
  std::vector<std::pair<std::string, gossip::RingChunk>> early;
  early.swap(s.job->ahead);
  s.job->ahead_bytes = 0;
  for (const auto& [peer, c] : early) {
    if (!s.job) return;
    on_chunk(self, peer, c);
  }
  self->send(self, step_atom::value);
}

/// A worker behind the generation's resume point (a joiner, a restarted node, a member whose last
/// step did not complete) pulls the state, striped over the donors.
void start_pull(Trainer* self) {
  auto& s = self->state;
  auto& j = *s.job;
  const auto& r = j.start;
  std::vector<std::string> donors;
  for (const auto& id : r.donors)
    if (const auto* address = elastic::worker_address(r, id); address && id != s.o.self_id) donors.push_back(*address);
  if (donors.empty())
    return fail(self, fmt::format("generation {} names no donor of the state at step {}", r.generation, r.resume.step));
  const auto view = state_view(j);
  // Sync donors hold exactly the state at the resume step; gossip donors give their replica as it is.
  const uint64_t at = j.mode == Mode::sync ? r.resume.step : 0;
  j.pulling.emplace(elastic::StatePuller::Options{r.job_id, at, view.size(), chunk_elements(j), 5000, donors});
  std::vector<std::pair<std::string, gossip::StatePull>> out;
  j.pulling->start(now_ms(s), out);
  node_events().info("state_pull job={} generation={} step={} elements={} donors={} pieces={}", r.job_id, r.generation,
                     at, view.size(), donors.size(), j.pulling->pieces());
  for (auto& [address, pull] : out) send_to(self, address, pull);
}

void on_state_pull(Trainer* self, const std::string& peer, const gossip::StatePull& p) {
  auto& s = self->state;
  if (!s.job || s.job->start.job_id != p.job_id || !s.job->control) return;
  auto& j = *s.job;
  const auto* address = elastic::worker_address(j.start, peer);
  if (!address) {
    node_events().warn("state_pull_refused from={} reason=\"not a worker of generation {}\"", peer, j.generation);
    return;
  }
  if (!j.has_state || j.pulling) {
    node_events().warn("state_pull_refused from={} reason=\"this worker is pulling the state itself\"", peer);
    return;
  }
  const uint64_t at = j.mode == Mode::sync ? j.progress.step : p.step;
  auto pieces = elastic::serve_state(p, j.start.job_id, at, state_view(j), chunk_elements(j));
  if (!pieces) {
    node_events().warn("state_pull_refused from={} reason=\"{}\"", peer, pieces.error());
    return;
  }
  for (auto& piece : *pieces) send_to(self, *address, std::move(piece));
}

void on_state_piece(Trainer* self, const std::string& peer, const gossip::StatePiece& p) {
  auto& s = self->state;
  if (!s.job || s.job->start.job_id != p.job_id || !s.job->pulling) return;
  auto& j = *s.job;
  if (auto ok = j.pulling->on_piece(p, state_view(j)); !ok) {
    node_events().warn("state_piece_refused from={} reason=\"{}\"", peer, ok.error());
    return;
  }
  j.progress_at = Clock::now();  // a slow pull that moves is not stuck
  if (!j.pulling->done()) return;
  j.pulling.reset();
  j.has_state = true;
  const auto& resume = j.start.resume;
  if (j.mode == Mode::sync) {
    j.progress = resume;
    j.epoch = static_cast<int64_t>(resume.epoch);
  }
  j.step = std::max(j.step, static_cast<int64_t>(resume.step));
  j.optimizer->set_steps(static_cast<int64_t>(resume.step));
  j.waiting_since = j.progress_at = Clock::now();
  node_events().info("state_pulled job={} generation={} step={}", j.start.job_id, j.generation, j.step);
  resume_training(self);
}

/// The installed generation: ring order, this worker's rank, the rings rebuilt, the rate rescaled;
/// then training resumes, or the state is pulled first.
void enter_generation(Trainer* self) {
  auto& s = self->state;
  auto& j = *s.job;
  const auto submitter_id = j.start.submitter_id;
  j.start = j.control->record();
  if (j.start.submitter_id.empty()) j.start.submitter_id = submitter_id;
  const auto& r = j.start;
  const auto me = std::find(r.workers.begin(), r.workers.end(), s.o.self_id);
  if (me == r.workers.end()) return fail(self, fmt::format("generation {} does not name this worker", r.generation));
  j.member = true;
  j.stepped_in_generation = false;
  j.generation = r.generation;
  j.world = static_cast<uint32_t>(r.workers.size());
  j.rank = static_cast<uint32_t>(me - r.workers.begin());
  j.prev_id = r.workers[(j.rank + j.world - 1) % j.world];
  j.next_address = r.addresses[(j.rank + 1) % j.world];
  j.waiting_since = j.progress_at = Clock::now();
  const auto batch = static_cast<int64_t>(j.config.data.batch_size);
  j.rate->set_generation(r.resume, static_cast<int64_t>(r.previous_world) * batch, static_cast<int64_t>(j.world) * batch);
  if (j.mode == Mode::sync) {
    if (j.has_state && j.progress.step > r.resume.step)
      return fail(self, fmt::format("this worker is at step {}, past generation {}'s resume step {}", j.progress.step,
                                    r.generation, r.resume.step));
    j.ring.emplace(gossip::collective::RingAllReduce::Options{r.job_id, j.rank, j.world, j.elements() + 3,
                                                              chunk_elements(j), r.resume.step});
  } else {
    // Gossip: pairs only among this generation's workers; exchanges under way are over, and a final
    // average under way starts again among them.
    j.ring.emplace(gossip::collective::RingAllReduce::Options{r.job_id, j.rank, j.world, j.elements(), chunk_elements(j)});
    const auto every = static_cast<uint64_t>(j.config.job.gossip_every);
    j.gossip.emplace(gossip::collective::GossipAveraging::Options{r.job_id, j.rank, j.world, j.elements(),
                                                                  chunk_elements(j), every, std::max<uint64_t>(16, 4 * every)});
    j.random.seed(j.config.job.seed * 1000003 + j.rank + r.generation * 7919);
    j.final_average = j.heard_final = false;
    j.spans = j.rank < r.spans.size() ? elastic::spans_of(r.spans[j.rank]) : elastic::Spans{};
    for (const auto& span : j.spans)
      if (span.end > static_cast<uint64_t>(j.data.train.size()) ||
          span.epoch >= static_cast<uint64_t>(j.config.job.epochs))
        return fail(self, fmt::format("generation {} gives this worker positions [{}, {}) of epoch {}, outside the "
                                      "job's {} samples and {} epochs",
                                      r.generation, span.begin, span.end, span.epoch, j.data.train.size(),
                                      j.config.job.epochs));
    j.consumed = 0;
    j.cursors.clear();
  }
  if (j.rank == 0)
    if (auto ok = ensure_evaluator(self, j); !ok) return fail(self, ok.error());
  std::string donors;
  for (const auto& d : r.donors) donors += (donors.empty() ? "" : ",") + d;
  node_events().info("generation_installed job={} generation={} rank={} workers={} resume_step={} donors={}", r.job_id,
                     r.generation, j.rank, j.world, r.resume.step, donors.empty() ? "-" : donors);
  report_status(self);
  const bool behind = !j.has_state || (j.mode == Mode::sync && j.progress.step < r.resume.step);
  if (behind) {
    j.has_state = false;
    return start_pull(self);
  }
  resume_training(self);
}

/// Sets up `record`'s job on this node and enters its generation: the first assignment
/// (has_state: every worker starts from the same initial parameters), or a joiner's install
/// (it pulls the state).
/// The submitter is a client, not a part of the job: once the view holds it dead or left, the job
/// goes on detached, and rank 0 saves the result on its own node. (Not in the view is not gone:
/// gossip of its join may not have come yet.)
void check_submitter(Trainer* self) {
  auto& s = self->state;
  if (!s.job || s.job->detached) return;
  for (const auto& m : s.view)
    if (m.id == s.job->start.submitter_id && !elastic::is_live(m)) {
      s.job->detached = true;
      node_events().info("job_detached job={} reason=\"the submitter {} is gone; the job goes on, and rank 0 saves "
                         "the result in {}/{}\"",
                         s.job->start.job_id, m.id, s.o.results_dir, s.job->start.job_id);
    }
}

void start_job(Trainer* self, const gossip::JobStart& record, bool has_state) {
  auto& s = self->state;
  auto me = std::find(record.workers.begin(), record.workers.end(), s.o.self_id);
  if (me == record.workers.end()) return;  // not one of its workers
  auto job = std::make_unique<Job>();
  // The step timeout counts from here until the first step moves it: a tick that comes before
  // that step must not see a wait that began at the clock's epoch.
  job->waiting_since = job->progress_at = Clock::now();
  job->start = record;
  job->generation = std::max<uint64_t>(1, record.generation);
  job->world = static_cast<uint32_t>(record.workers.size());
  job->rank = static_cast<uint32_t>(me - record.workers.begin());
  job->prev_id = record.workers[(job->rank + job->world - 1) % job->world];
  job->next_address = record.addresses[(job->rank + 1) % job->world];
  job->has_state = has_state;
  if (auto ok = setup(self, *job); !ok) {
    if (job->shard_host) self->send_exit(job->shard_host, caf::exit_reason::kill);
    return fail_start(self, record, ok.error());
  }
  // Only a job that is set up takes shard updates (the router holds them until then).
  if (job->shard_host) {
    std::vector<gossip::ShardHolders> placement;
    for (uint32_t i = 0; i < job->placement.size(); ++i) placement.push_back({i, job->placement[i]});
    caf::anon_send(s.router, shards_atom::value, job->shard_host, std::move(placement));
  }
  node_events().info("job_started job={} mode={} rank={} workers={} steps={} steps_per_epoch={} generation={}",
                     record.job_id, mode_name(job->mode), job->rank, job->world, job->total_steps,
                     job->steps_per_epoch, job->generation);
  const bool elastic_mode = job->mode != Mode::async;
  s.job = std::move(job);
  s.joining.reset();
  s.last_job = std::max(s.last_job, record.job_id);
  start_ticking(self);
  if (elastic_mode) {
    // Job control: the record this node holds from now on, and what its view says of it.
    auto& j = *s.job;
    j.control = make_control(s, &j.config);
    j.control->adopt(j.start);
    elastic::JobControl::Output out;
    j.control->on_view(now_ms(s), s.view, local_of(j), out);
    // The generation first (rings, rank 0's evaluator), then what the view asks for.
    enter_generation(self);
    if (s.job && s.job->start.job_id == record.job_id) apply_control(self, record.job_id, out);
  } else {
    if (s.job->rank == 0)
      if (auto ok = ensure_evaluator(self, *s.job); !ok) return fail(self, ok.error());
    // Async: its one ring-less generation.
    self->send(self, step_atom::value);
  }
  check_submitter(self);
  // Chunks that came before the job did.
  std::vector<std::pair<std::string, gossip::RingChunk>> early;
  early.swap(s.stash);
  s.stash_bytes = 0;
  for (const auto& [peer, c] : early) {
    if (!s.job) break;
    if (c.job_id == record.job_id) on_chunk(self, peer, c);
  }
}

void on_assigned(Trainer* self, const std::string& peer, const gossip::JobStart& start) {
  auto& s = self->state;
  if (peer != start.coordinator)
    return fail_start(self, start, fmt::format("sent by {}, not by the coordinator it names ({})", peer, start.coordinator));
  if (s.job) {
    if (s.job->start.job_id != start.job_id)
      fail_start(self, start, fmt::format("busy with job {}", s.job->start.job_id));
    return;
  }
  if (auto ok = elastic::check_assignment(start, s.view); !ok) {
    if (start.workers.empty() || start.workers.size() != start.addresses.size()) return fail_start(self, start, ok.error());
    if (!s.held || s.held->job_id != start.job_id) {
      node_events().info("job_held job={} from={} reason=\"{}\" wait_s={:.0f}", start.job_id, peer, ok.error(),
                         TrainerState::held_limit_s);
      s.held = start;
      s.held_since = Clock::now();
      start_ticking(self);
    }
    return;
  }
  if (s.held && s.held->job_id == start.job_id) s.held.reset();
  start_job(self, start, true);
}

/// A later generation's record (generation 2 on): from its proposer, or forwarded by a member.
void on_install(Trainer* self, const std::string& peer, const gossip::JobStart& record) {
  auto& s = self->state;
  if (s.ended_jobs.contains(record.job_id)) return;
  if (s.job) {
    if (s.job->start.job_id != record.job_id || !s.job->control) return;
    elastic::JobControl::Output out;
    if (auto ok = s.job->control->on_install(record, out); !ok) {
      node_events().warn("generation_refused from={} reason=\"{}\"", peer, ok.error());
      return;
    }
    return apply_control(self, record.job_id, out);
  }
  // Not running it: a joiner whose acks were counted, or a worker dropped earlier and proposed again.
  if (std::find(record.workers.begin(), record.workers.end(), s.o.self_id) == record.workers.end()) return;
  if (!s.joining || s.joining->promised() > record.generation) {
    node_events().warn("generation_refused from={} reason=\"generation {} of job {} was not promised here\"", peer,
                       record.generation, record.job_id);
    return;
  }
  node_events().info("job_joining job={} generation={} from={}", record.job_id, record.generation, peer);
  start_job(self, record, false);
}

void on_vote(Trainer* self, const std::string& peer, const gossip::GenerationVote& vote) {
  auto& s = self->state;
  if (s.ended_jobs.contains(vote.job_id)) return;
  elastic::JobControl::Output out;
  if (s.job) {
    if (s.job->start.job_id != vote.job_id || !s.job->control) return;
    s.job->control->on_vote(now_ms(s), peer, vote, local_of(*s.job), out);
    return apply_control(self, vote.job_id, out);
  }
  // No job here: proposed as a joiner. Its acks say it holds nothing.
  if (vote.kind != gossip::GenerationVote::Kind::propose) return;
  if (!s.joining) {
    s.joining = make_control(s, nullptr);
    s.joining_since = Clock::now();
  }
  start_ticking(self);
  s.joining->on_view(now_ms(s), s.view, {}, out);
  s.joining->on_vote(now_ms(s), peer, vote, {}, out);
  apply_control(self, vote.job_id, out);
}

/// The coordinator's part: a job from a submitter gets its ring order and goes to every worker,
/// once this node's view holds every worker the submitter saw (gossip may not have brought them
/// all here yet).
/// Why this node cannot assign `request` yet, from its view: the submitter saw a worker or a
/// coordinator this view has not caught up with. Empty: it can.
std::string not_ready_to_assign(const TrainerState& s, const gossip::JobStart& request) {
  for (const auto& id : request.workers) {
    auto it = std::find_if(s.view.begin(), s.view.end(), [&](const gossip::Member& m) { return m.id == id; });
    if (it == s.view.end() || !elastic::is_live(*it))
      return fmt::format("worker {}, which the submitter saw, is not live in the coordinator's view", id);
  }
  const gossip::Member* c = elastic::coordinator_in(s.view);
  if (!c || c->id != s.o.self_id)
    return fmt::format("{} is not the coordinator; {} is", s.o.self_id, c ? c->id : std::string("nobody"));
  return {};
}

void on_submitted(Trainer* self, const std::string& submitter_peer, const gossip::JobStart& request) {
  auto& s = self->state;
  // The submitter's view and this one may differ for a moment (gossip of a join or a departure is
  // still on its way): the submission waits here for this view to catch up, at most 30 s.
  if (const auto why = not_ready_to_assign(s, request); !why.empty()) {
    if (s.pending && s.pending->job_id != request.job_id)
      return fail_start(self, request, fmt::format("job {} is waiting for its workers; one submission at a time",
                                                   s.pending->job_id));
    if (!s.pending) {
      node_events().info("job_pending job={} from={} reason=\"{}\" wait_s={:.0f}", request.job_id, submitter_peer, why,
                         TrainerState::pending_limit_s);
      s.pending_from = submitter_peer;
      s.pending = request;
      s.pending_since = Clock::now();
      start_ticking(self);
    }
    return;
  }
  s.pending.reset();
  auto assigned = elastic::assign_job(request, s.view, s.o.self_id);
  if (!assigned) return fail_start(self, request, assigned.error());
  assigned->submitter_id = submitter_peer;  // who sent it, not who it says it is
  assigned->generation = 1;
  node_events().info("job_assigned job={} workers={} submitter={}", assigned->job_id, assigned->workers.size(),
                     assigned->submitter);
  for (size_t i = 0; i < assigned->workers.size(); ++i)
    if (assigned->workers[i] != s.o.self_id) send_to(self, assigned->addresses[i], *assigned);
  // The submitter learns the ring order too: it takes the final model from rank 0 only.
  send_to(self, assigned->submitter, *assigned);
  on_assigned(self, s.o.self_id, *assigned);
}

void on_view(Trainer* self, std::vector<gossip::Member> view) {
  auto& s = self->state;
  s.view = std::move(view);
  if (s.held) {
    const auto start = *s.held;
    on_assigned(self, start.coordinator, start);
  }
  if (s.pending) {
    const auto request = *s.pending;
    on_submitted(self, s.pending_from, request);
  }
  if (s.joining) {
    elastic::JobControl::Output out;
    s.joining->on_view(now_ms(s), s.view, {}, out);
  }
  if (!s.job) return;
  if (!s.job->control) {
    // Async trains through membership changes in part 2 of elastic training; until then a change
    // ends it, saying so.
    const auto changes = elastic::ring_changes(s.job->start, s.view);
    if (!changes.empty()) {
      std::string names;
      for (const auto& c : changes) names += (names.empty() ? "" : ", ") + c;
      return fail(self, fmt::format("the cluster changed during an async job: {}; async jobs do not survive "
                                    "membership changes yet (sync and gossip jobs do)",
                                    names));
    }
  } else {
    elastic::JobControl::Output out;
    const uint64_t job_id = s.job->start.job_id;
    s.job->control->on_view(now_ms(s), s.view, local_of(*s.job), out);
    apply_control(self, job_id, out);
    if (!s.job) return;
  }
  check_submitter(self);
}

/// Every tick while a job ends without a barrier: rank 0 tells the submitter it is alive (its
/// last step may come long before the slowest worker's), a finished async worker repeats that it
/// is finished (rank 0 may not have had the job yet), and rank 0 repeats its missing pulls.
void keep_ending(Trainer* self) {
  auto& s = self->state;
  auto& j = *s.job;
  if (j.finishing) return;
  const bool async_done = j.mode == Mode::async && (j.serving || j.finished.contains(s.o.self_id));
  if (j.rank == 0 && (async_done || j.final_average)) {
    JobReport r = report_of(j, JobReport::Kind::progress);
    r.samples = j.own_samples * j.world;
    to_submitter(self, j, r);
  }
  if (j.mode == Mode::async && j.serving)
    send_to(self, j.start.addresses[0], gossip::Control{s.o.self_id, s.o.incarnation,
                                                         gossip::Control::Command::worker_finished, j.start.job_id, {}});
  if (j.mode == Mode::async && j.assembling) pull_missing(self);
  if (j.rank == 0 && j.mode != Mode::sync && j.target_reached) tell_target_reached(self);
}

void on_tick(Trainer* self) {
  auto& s = self->state;
  if (s.pending && seconds_between(s.pending_since, Clock::now()) > TrainerState::pending_limit_s) {
    const auto request = *s.pending;
    s.pending.reset();
    fail_start(self, request,
               fmt::format("{}, still after {:.0f} s", not_ready_to_assign(s, request), TrainerState::pending_limit_s));
  }
  if (s.held && seconds_between(s.held_since, Clock::now()) > TrainerState::held_limit_s) {
    const auto start = *s.held;
    s.held.reset();
    if (auto ok = elastic::check_assignment(start, s.view); !ok)
      fail_start(self, start, fmt::format("{}, still after {:.0f} s", ok.error(), TrainerState::held_limit_s));
  }
  if (s.job && s.job->member && !s.job->finishing &&
      seconds_between(s.job->progress_at, Clock::now()) > s.job->config.job.step_timeout_s) {
    auto& j = *s.job;
    const auto limit = j.config.job.step_timeout_s;
    // Gossip: workers end their local steps at different times, so the final average waits for
    // the previous worker without a limit until its first chunk comes (a dead one is membership's).
    const bool ring_wait = j.mode == Mode::sync || (j.mode == Mode::gossip && j.final_average && j.heard_final);
    if (j.control && j.pulling) {
      // A worker that cannot get the state from any donor steps out of the job rather than end it
      // for everyone: the others' ring leaves it out (eviction), and it may be proposed again.
      node_events().warn("job_left job={} reason=\"no donor answered the state pull for {:.0f} s\"", j.start.job_id,
                         limit);
      j.member = false;
      j.has_state = false;
      j.pulling.reset();
    } else if (j.control && j.control->paused()) {
      // Waiting for a generation (the side of a partition without a quorum): the state is kept,
      // whatever the wait; the job is not this worker's to end.
      j.progress_at = Clock::now();
      node_events().warn("job_waiting job={} promised={} reason=\"no generation installed for {:.0f} s (a quorum "
                         "lost, or the other side of a partition)\"",
                         j.start.job_id, j.control->promised(), limit);
    } else if (ring_wait && j.control && j.prev_id != s.o.self_id) {
      // Membership holds the previous worker live, yet the ring has not moved: leave it out of
      // the next generation rather than end the job.
      node_events().warn("worker_evicting job={} worker={} reason=\"{} {} waited {:.0f} s for it\"", j.start.job_id,
                         j.prev_id, j.mode == Mode::sync ? "step" : "the final average after step", j.step + 1, limit);
      j.progress_at = Clock::now();
      elastic::JobControl::Output out;
      const uint64_t job_id = j.start.job_id;
      j.control->evict(now_ms(s), j.prev_id, local_of(j), out);
      apply_control(self, job_id, out);
    } else if (ring_wait)
      fail(self, fmt::format("{} {} waited {:.0f} s for worker {} (the previous one in the ring)",
                             j.mode == Mode::sync ? "step" : "the final average after step", j.step + 1, limit, j.prev_id));
    else if (j.mode == Mode::async && !j.serving && !j.assembling && (j.blocked || j.step >= j.total_steps) &&
             !j.finished.contains(s.o.self_id))
      fail(self, fmt::format("step {} waited {:.0f} s for answers from shard primaries", j.step + 1, limit));
  }
  if (s.job && s.job->control) {
    auto& j = *s.job;
    const uint64_t job_id = j.start.job_id;
    if (j.pulling) {
      std::vector<std::pair<std::string, gossip::StatePull>> again;
      j.pulling->on_tick(now_ms(s), again);
      for (auto& [address, pull] : again) send_to(self, address, pull);
    }
    elastic::JobControl::Output out;
    j.control->on_tick(now_ms(s), local_of(j), out);
    apply_control(self, job_id, out);
  }
  if (s.job && s.job->member) keep_ending(self);
  if (s.joining && seconds_between(s.joining_since, Clock::now()) > TrainerState::joining_limit_s) {
    node_events().warn("job_joining_abandoned reason=\"proposed as a worker {:.0f} s ago, and no generation "
                       "naming this node came\"",
                       TrainerState::joining_limit_s);
    s.joining.reset();
  }
  if (!s.job && s.joining) {
    // A joiner's promise whose install did not come: it asks again (the core knows whom).
    elastic::JobControl::Output out;
    s.joining->on_tick(now_ms(s), {}, out);
    for (auto& [address, body] : out.sends) send_to(self, address, std::move(body));
  }
  if (s.job) report_status(self);
  if (s.pending || s.held || s.job || s.joining) self->delayed_send(self, std::chrono::seconds(1), tick_atom::value);
  else s.ticking = false;
}

/// Keeps one timer chain running while a job or a pending submission needs watching.
void start_ticking(Trainer* self) {
  if (self->state.ticking) return;
  self->state.ticking = true;
  self->delayed_send(self, std::chrono::seconds(1), tick_atom::value);
}

void on_control(Trainer* self, const std::string& peer, const gossip::Control& c) {
  auto& s = self->state;
  if (!s.job || s.job->start.job_id != c.job_id) return;
  auto& j = *s.job;
  using Command = gossip::Control::Command;
  if (c.command == Command::worker_finished && j.mode == Mode::async && j.rank == 0) {
    if (std::find(j.start.workers.begin(), j.start.workers.end(), peer) == j.start.workers.end()) return;
    j.finished.insert(peer);
    return maybe_assemble(self);
  }
  if (c.command == Command::target_reached && j.mode != Mode::sync && j.rank != 0 && peer == j.start.workers[0]) {
    stop_training(self);
    // A worker waiting on nothing (none of its steps under way) takes the end now.
    self->send(self, step_atom::value);
    return;
  }
  if (c.command == Command::job_finished && j.mode == Mode::async && j.rank != 0 && peer == j.start.workers[0]) {
    // Rank 0 has the final model: every update has been applied, so the counts are final.
    j.serving = false;
    return finish_job(self);
  }
  if (c.command != Command::stop_job) return;
  const auto& workers = s.job->start.workers;
  if (peer != s.job->start.submitter_id) {
    // Relayed by a worker of the job (whichever the submitter reached): stop.
    if (std::find(workers.begin(), workers.end(), peer) != workers.end()) fail(self, "stopped by the submitter");
    return;
  }
  // From the job's submitter: this worker relays it to the others (generations may have changed
  // who the submitter first sent the job to).
  gossip::Control relay = c;
  relay.coordinator = s.o.self_id;
  relay.coordinator_incarnation = s.o.incarnation;
  for (size_t i = 0; i < s.job->start.workers.size(); ++i)
    if (s.job->start.workers[i] != s.o.self_id) send_to(self, s.job->start.addresses[i], relay);
  fail(self, "stopped by the submitter");
}

caf::behavior trainer(Trainer* self, TrainerOptions options, caf::actor router) {
  self->state.o = std::move(options);
  self->state.router = router;
  caf::anon_send(router, job_atom::value, caf::actor_cast<caf::actor>(self));
  return {
      [self](view_atom, std::vector<gossip::Member> view) { on_view(self, std::move(view)); },
      [self](wire_atom, const std::string& peer, const std::string&, const gossip::Message& m) {
        if (const auto* chunk = std::get_if<gossip::RingChunk>(&m.body)) on_chunk(self, peer, *chunk);
        else if (const auto* state = std::get_if<gossip::ShardState>(&m.body)) on_shard_state(self, peer, *state);
        else if (const auto* average = std::get_if<gossip::GossipAverage>(&m.body)) on_gossip(self, peer, *average);
        else if (const auto* start = std::get_if<gossip::JobStart>(&m.body))
          start->coordinator.empty()   ? on_submitted(self, peer, *start)
          : start->generation >= 2 ? on_install(self, peer, *start)
                                   : on_assigned(self, peer, *start);
        else if (const auto* vote = std::get_if<gossip::GenerationVote>(&m.body)) on_vote(self, peer, *vote);
        else if (const auto* pull = std::get_if<gossip::StatePull>(&m.body)) on_state_pull(self, peer, *pull);
        else if (const auto* piece = std::get_if<gossip::StatePiece>(&m.body)) on_state_piece(self, peer, *piece);
        else if (const auto* control = std::get_if<gossip::Control>(&m.body)) on_control(self, peer, *control);
      },
      [self](step_atom) { do_step(self); },
      [self](tick_atom) { on_tick(self); },
      [self](drain_atom) -> caf::result<std::string> {
        self->state.drain = self->make_response_promise<std::string>();
        auto promise = *self->state.drain;
        on_drain(self);
        return promise;
      },
      // Connection trouble: membership decides who is gone; the step timeout covers the rest.
      [](peer_atom, const std::string&, const std::string&) {},
  };
}

}  // namespace

RoleSpec trainer_role(TrainerOptions options, caf::actor router) {
  return {"trainer", [options, router](caf::local_actor& parent, const caf::actor& supervisor,
                                       const caf::message& snapshot) mutable {
            // The snapshot is the boot id the last run of this role worked under: there is one,
            // so this is a restart, and what that run held for its jobs is gone. Members must see
            // the node as restarted (a new boot id), so job control takes it back as a joiner that
            // pulls the state, as it does a restarted process.
            if (snapshot.match_elements<uint64_t>()) {
              std::random_device device;
              uint64_t boot = (static_cast<uint64_t>(device()) << 32) ^ device();
              if (boot == 0 || boot == snapshot.get_as<uint64_t>(0)) boot = snapshot.get_as<uint64_t>(0) + 1;
              options.boot_id = boot;
              node_events().warn("trainer_restarted boot_id={:016x}", boot);
              caf::anon_send(router, boot_atom::value, boot);
            }
            caf::anon_send(supervisor, commit_atom::value, std::string("trainer"), caf::make_message(options.boot_id));
            return caf::actor(parent.spawn<caf::detached>(trainer, options, router));
          }};
}

}  // namespace tepdist::actors

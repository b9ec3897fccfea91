#include "actors/roles/trainer.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/local_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <fmt/format.h>

#include <chrono>
#include <numeric>
#include <optional>

#include "actors/atoms.hpp"
#include "actors/router.hpp"
#include "compute/backends.hpp"
#include "compute/optimizer.hpp"
#include "compute/train.hpp"
#include "elastic/coordination.hpp"
#include "elastic/job.hpp"
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

struct Job {
  gossip::JobStart start;
  elastic::JobConfig config;
  uint32_t rank = 0, world = 1;
  std::string prev_id, next_address;
  elastic::JobData data;
  std::unique_ptr<compute::Model> model;
  std::unique_ptr<compute::Backend> backend;
  std::unique_ptr<compute::Optimizer> optimizer;
  std::optional<compute::LrSchedule> schedule;
  std::optional<gossip::collective::RingAllReduce> ring;
  std::vector<float> buffer;  // [gradient x samples, loss x samples, samples, stop votes]
  std::vector<int64_t> order;
  int64_t step = 0, epoch = 0, steps_per_epoch = 0, total_steps = 0;
  uint64_t own_samples = 0, samples = 0, window_samples = 0;
  double loss = 0;
  compute::LossScratch scratch;
  compute::Tensor x;
  std::vector<int32_t> y;
  std::optional<Clock::time_point> first_step;
  Clock::time_point last_step_end, window_start, waiting_since;
  double compute_seconds = 0, ring_seconds = 0;  // where the steps' time went
  // Rank 0.
  caf::actor evaluator;
  int pending_evals = 0;
  int64_t last_eval_step = -1;
  double last_accuracy = 0, last_test_loss = 0, eval_seconds = 0;
  bool target_reached = false;  // stop_at_target: rank 0 votes to stop in the next ring
  bool finishing = false;

  double train_seconds() const { return first_step ? seconds_between(*first_step, last_step_end) : 0.0; }
  size_t elements() const { return model->parameters().size(); }
};

struct TrainerState {
  TrainerOptions o;
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
  bool ticking = false;
  static inline const char* name = "tepdist.trainer";
};

using Trainer = caf::stateful_actor<TrainerState>;

void start_ticking(Trainer* self);

/// Sends, or says it could not: the peer's send queue is full ([cluster] send_queue_mb).
bool send_to(Trainer* self, const std::string& address, gossip::Body body) {
  auto& o = self->state.o;
  if (o.transport->send(address, gossip::Message{o.self_id, o.incarnation, o.cluster_id, std::move(body)})) return true;
  node_events().warn("send_refused peer={} reason=\"send queue full\"", address);
  return false;
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

/// Ends the current job here: its evaluator goes with it.
void drop_job(Trainer* self) {
  auto& job = self->state.job;
  // kill, not user_shutdown: it must not work through queued evaluations of a job that is over.
  if (job && job->evaluator) self->send_exit(job->evaluator, caf::exit_reason::kill);
  job.reset();
}

void fail(Trainer* self, const std::string& why) {
  auto& j = *self->state.job;
  node_events().warn("job_failed job={} rank={} step={} reason=\"{}\"", j.start.job_id, j.rank, j.step, why);
  JobReport r = report_of(j, JobReport::Kind::failed);
  r.error = fmt::format("{}: {}", self->state.o.self_id, why);
  send_to(self, j.start.submitter, r);
  drop_job(self);
}

void fail_start(Trainer* self, const gossip::JobStart& start, const std::string& why) {
  node_events().warn("job_refused job={} reason=\"{}\"", start.job_id, why);
  JobReport r;
  r.job_id = start.job_id;
  r.kind = JobReport::Kind::failed;
  r.error = fmt::format("{}: {}", self->state.o.self_id, why);
  send_to(self, start.submitter, r);
}

/// Rank 0 at the end: the final model to the submitter, then its done report.
void complete_rank0(Trainer* self) {
  auto& j = *self->state.job;
  const auto params = j.model->parameters();
  auto copy = std::make_shared<const std::vector<float>>(params.begin(), params.end());
  constexpr size_t piece = 1u << 20;  // elements per frame: 4 MiB, well inside the frame limit
  for (size_t off = 0; off < copy->size(); off += piece) {
    const std::span<const float> data(copy->data() + off, std::min(piece, copy->size() - off));
    if (!send_to(self, j.start.submitter,
                 gossip::ParamPush{0, static_cast<uint64_t>(j.step),
                                   gossip::TensorChunk{static_cast<uint64_t>(j.step), 0, off, copy->size(), data, copy}}))
      return fail(self, "the final model does not fit the send queue to the submitter; raise [cluster] send_queue_mb");
  }
  JobReport r = report_of(j, JobReport::Kind::done);
  r.samples = j.own_samples;
  r.bytes_sent = j.ring->bytes_sent();
  r.checksum = checksum(params);
  r.test_accuracy = j.last_accuracy;
  r.test_loss = j.last_test_loss;
  r.eval_seconds = j.eval_seconds;
  r.samples_per_second = r.train_seconds > 0 ? static_cast<double>(j.samples) / r.train_seconds : 0.0;
  send_to(self, j.start.submitter, r);
  node_events().info("job_done job={} rank=0 steps={} checksum={:016x} compute_s={:.2f} ring_s={:.2f}", j.start.job_id,
                     j.step, r.checksum, j.compute_seconds, j.ring_seconds);
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
  r.bytes_sent = j.ring->bytes_sent();
  r.checksum = checksum(j.model->parameters());
  send_to(self, j.start.submitter, r);
  node_events().info("job_done job={} rank={} steps={} checksum={:016x} compute_s={:.2f} ring_s={:.2f}", j.start.job_id,
                     j.rank, j.step, r.checksum, j.compute_seconds, j.ring_seconds);
  drop_job(self);
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
        job->target_reached |= job->config.job.stop_at_target && accuracy >= job->config.job.target_accuracy;
        r.eval_seconds = seconds;
        send_to(self, job->start.submitter, r);
        if (job->finishing && job->pending_evals == 0) complete_rank0(self);
      },
      [self, job_id](const caf::error& e) {
        auto& job = self->state.job;
        if (job && job->start.job_id == job_id) fail(self, "evaluation failed: " + self->system().render(e));
      });
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
  j.optimizer->step(j.model->parameters(), grads, j.schedule->at(j.step));
  ++j.step;
  // A stop vote in the sum: every worker ends after this same step.
  if (j.buffer[e + 2] > 0) j.total_steps = j.step;
  j.samples += static_cast<uint64_t>(total);
  j.window_samples += static_cast<uint64_t>(total);
  j.last_step_end = Clock::now();
  j.ring_seconds += seconds_between(j.waiting_since, j.last_step_end);
  const bool epoch_end = j.step % j.steps_per_epoch == 0;
  if (epoch_end) ++j.epoch;
  if (j.rank == 0) {
    if (j.step % j.config.job.log_every_steps == 0 || j.step == j.total_steps) {
      JobReport r = report_of(j, JobReport::Kind::progress);
      r.samples = j.samples;
      r.samples_per_second = static_cast<double>(j.window_samples) / std::max(1e-9, seconds_between(j.window_start, j.last_step_end));
      send_to(self, j.start.submitter, r);
      j.window_samples = 0;
      j.window_start = j.last_step_end;
    }
    const auto every = j.config.job.eval_every_steps;
    if ((every > 0 && j.step % every == 0) || epoch_end || j.step == j.total_steps) evaluate_snapshot(self);
  }
  if (j.step >= j.total_steps) return finish_job(self);
  self->send(self, step_atom::value);
}

void do_step(Trainer* self) {
  auto* jp = self->state.job.get();
  if (!jp || jp->finishing) return;
  auto& j = *jp;
  // One step at a time: a step message left over from an earlier job or step finds the ring busy.
  if (j.ring->step() == static_cast<uint64_t>(j.step) + 1 && !j.ring->done()) return;
  const int64_t n = j.data.train.size(), batch = j.config.data.batch_size;
  const int64_t in_epoch = j.step - j.epoch * j.steps_per_epoch;
  if (in_epoch == 0) {
    if (j.config.data.shuffle) {
      j.order = compute::shuffled_indices(n, j.config.job.seed, j.epoch);
    } else {
      j.order.resize(static_cast<size_t>(n));
      std::iota(j.order.begin(), j.order.end(), 0);
    }
  }
  const auto [begin, end] = elastic::sync_batch_slice(n, j.world, batch, in_epoch, j.rank);
  const size_t e = j.elements();
  const auto now = Clock::now();
  if (!j.first_step) j.first_step = j.window_start = now;
  if (end > begin) {
    const std::span<const int64_t> idx(j.order.data() + begin, static_cast<size_t>(end - begin));
    compute::gather_batch(j.data.train, idx, j.x, j.y);
    const float loss = compute::compute_gradients(*j.model, *j.backend, j.x, j.y, j.scratch);
    const auto count = static_cast<float>(end - begin);
    const auto grads = j.model->gradients();
    for (size_t i = 0; i < e; ++i) j.buffer[i] = grads[i] * count;
    j.buffer[e] = loss * count;
    j.buffer[e + 1] = count;
    j.buffer[e + 2] = j.target_reached ? 1.0f : 0.0f;
    j.own_samples += static_cast<uint64_t>(end - begin);
  } else {
    std::fill(j.buffer.begin(), j.buffer.end(), 0.0f);  // a short last step: nothing for this rank
    j.buffer[e + 2] = j.target_reached ? 1.0f : 0.0f;
  }
  std::vector<gossip::RingChunk> out;
  j.ring->start(static_cast<uint64_t>(j.step) + 1, j.buffer, out);
  for (auto& c : out)
    if (!send_to(self, j.next_address, std::move(c)))
      return fail(self, fmt::format("the send queue to the next worker ({}) is full; raise [cluster] send_queue_mb",
                                    j.next_address));
  j.waiting_since = Clock::now();
  j.compute_seconds += seconds_between(now, j.waiting_since);
  if (j.ring->done()) finish_step(self);
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
  if (peer != j.prev_id) {
    node_events().warn("ring_chunk_refused from={} reason=\"not the previous worker ({})\"", peer, j.prev_id);
    return;
  }
  std::vector<gossip::RingChunk> out;
  if (auto ok = j.ring->on_chunk(c, out); !ok) {
    node_events().warn("ring_chunk_refused from={} reason=\"{}\"", peer, ok.error());
    return;
  }
  j.waiting_since = Clock::now();
  for (auto& m : out)
    if (!send_to(self, j.next_address, std::move(m)))
      return fail(self, fmt::format("the send queue to the next worker ({}) is full; raise [cluster] send_queue_mb",
                                    j.next_address));
  if (j.ring->done() && !j.finishing && j.ring->step() == static_cast<uint64_t>(j.step) + 1) finish_step(self);
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
  j.steps_per_epoch = elastic::sync_steps_per_epoch(j.data.train.size(), j.world, j.config.data.batch_size);
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
  const size_t chunk = static_cast<size_t>(j.config.job.ring_chunk_kb) * 1024 / sizeof(float);
  if (j.config.job.ring_chunk_kb + 64 > o.max_frame_kb)
    return std::unexpected(fmt::format("job.ring_chunk_kb = {} does not fit this node's frames ([cluster] max_frame_mb "
                                       "= {})",
                                       j.config.job.ring_chunk_kb, o.max_frame_kb / 1024));
  j.ring.emplace(gossip::collective::RingAllReduce::Options{j.start.job_id, j.rank, j.world, j.elements() + 3, chunk});
  j.buffer.assign(j.elements() + 3, 0.0f);
  if (j.rank == 0) {
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
  }
  return {};
}

void on_assigned(Trainer* self, const std::string& peer, const gossip::JobStart& start) {
  auto& s = self->state;
  if (peer != start.coordinator) {
    node_events().warn("job_refused job={} reason=\"sent by {}, not by the coordinator it names ({})\"", start.job_id,
                       peer, start.coordinator);
    return;
  }
  if (s.job) {
    if (s.job->start.job_id != start.job_id)
      fail_start(self, start, fmt::format("busy with job {}", s.job->start.job_id));
    return;
  }
  if (auto ok = elastic::check_assignment(start, s.view); !ok) return fail_start(self, start, ok.error());
  auto me = std::find(start.workers.begin(), start.workers.end(), s.o.self_id);
  if (me == start.workers.end()) return;  // not one of its workers
  auto job = std::make_unique<Job>();
  job->start = start;
  job->world = static_cast<uint32_t>(start.workers.size());
  job->rank = static_cast<uint32_t>(me - start.workers.begin());
  job->prev_id = start.workers[(job->rank + job->world - 1) % job->world];
  job->next_address = start.addresses[(job->rank + 1) % job->world];
  if (auto ok = setup(self, *job); !ok) return fail_start(self, start, ok.error());
  node_events().info("job_started job={} mode=sync rank={} workers={} steps={} steps_per_epoch={}", start.job_id,
                     job->rank, job->world, job->total_steps, job->steps_per_epoch);
  s.job = std::move(job);
  // Chunks that came before the job did.
  s.last_job = std::max(s.last_job, start.job_id);
  std::vector<std::pair<std::string, gossip::RingChunk>> early;
  early.swap(s.stash);
  s.stash_bytes = 0;
  for (const auto& [peer, c] : early)
    if (c.job_id == start.job_id) on_chunk(self, peer, c);
  self->send(self, step_atom::value);
  start_ticking(self);
}

/// The coordinator's part: a job from a submitter gets its ring order and goes to every worker,
/// once this node's view holds every worker the submitter saw (gossip may not have brought them
/// all here yet).
void on_submitted(Trainer* self, const std::string& submitter_peer, const gossip::JobStart& request) {
  auto& s = self->state;
  for (const auto& id : request.workers) {
    auto it = std::find_if(s.view.begin(), s.view.end(), [&](const gossip::Member& m) { return m.id == id; });
    if (it == s.view.end() || !elastic::is_live(*it)) {
      if (s.pending && s.pending->job_id != request.job_id)
        return fail_start(self, request, fmt::format("job {} is waiting for its workers; one submission at a time",
                                                     s.pending->job_id));
      if (!s.pending) {
        s.pending_from = submitter_peer;
        s.pending = request;
        s.pending_since = Clock::now();
        start_ticking(self);
      }
      return;
    }
  }
  s.pending.reset();
  auto assigned = elastic::assign_job(request, s.view, s.o.self_id, s.o.incarnation);
  if (!assigned) return fail_start(self, request, assigned.error());
  assigned->submitter_id = submitter_peer;  // who sent it, not who it says it is
  node_events().info("job_assigned job={} workers={} submitter={}", assigned->job_id, assigned->workers.size(),
                     assigned->submitter);
  for (size_t i = 0; i < assigned->workers.size(); ++i)
    if (assigned->workers[i] != s.o.self_id) send_to(self, assigned->addresses[i], *assigned);
  on_assigned(self, s.o.self_id, *assigned);
}

void on_view(Trainer* self, std::vector<gossip::Member> view) {
  auto& s = self->state;
  s.view = std::move(view);
  if (s.pending) {
    const auto request = *s.pending;
    on_submitted(self, s.pending_from, request);
  }
  if (!s.job) return;
  const auto changes = elastic::ring_changes(s.job->start, s.view);
  if (!changes.empty()) {
    std::string names;
    for (const auto& c : changes) names += (names.empty() ? "" : ", ") + c;
    fail(self, fmt::format("the cluster changed during a sync job: {}; sync jobs need a fixed membership", names));
    return;
  }
  for (const auto& m : s.view)
    if (m.id == s.job->start.submitter_id && !elastic::is_live(m)) {
      node_events().warn("job_abandoned job={} reason=\"the submitter {} is gone\"", s.job->start.job_id, m.id);
      drop_job(self);
      return;
    }
}

void on_tick(Trainer* self) {
  auto& s = self->state;
  if (s.pending && seconds_between(s.pending_since, Clock::now()) > 30) {
    const auto request = *s.pending;
    s.pending.reset();
    fail_start(self, request, "the workers the submitter saw did not all reach the coordinator within 30 s");
  }
  if (s.job && !s.job->finishing &&
      seconds_between(s.job->waiting_since, Clock::now()) > s.job->config.job.step_timeout_s) {
    auto& j = *s.job;
    fail(self, fmt::format("step {} waited {:.0f} s for worker {} (the previous one in the ring)", j.step + 1,
                           j.config.job.step_timeout_s, j.prev_id));
  }
  if (s.pending || s.job) self->delayed_send(self, std::chrono::seconds(1), tick_atom::value);
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
  if (c.command != gossip::Control::Command::stop_job || !s.job || s.job->start.job_id != c.job_id) return;
  if (peer == s.job->start.coordinator) {
    fail(self, "stopped by the submitter");
    return;
  }
  // From the job's submitter: the coordinator relays it to the workers.
  if (s.job->start.coordinator != s.o.self_id || peer != s.job->start.submitter_id) return;
  gossip::Control relay = c;
  relay.coordinator = s.o.self_id;
  relay.coordinator_incarnation = s.o.incarnation;
  for (size_t i = 0; i < s.job->start.workers.size(); ++i)
    if (s.job->start.workers[i] != s.o.self_id) send_to(self, s.job->start.addresses[i], relay);
  fail(self, "stopped by the submitter");
}

caf::behavior trainer(Trainer* self, TrainerOptions options, caf::actor router) {
  self->state.o = std::move(options);
  caf::anon_send(router, job_atom::value, caf::actor_cast<caf::actor>(self));
  return {
      [self](view_atom, std::vector<gossip::Member> view) { on_view(self, std::move(view)); },
      [self](wire_atom, const std::string& peer, const std::string&, const gossip::Message& m) {
        if (const auto* chunk = std::get_if<gossip::RingChunk>(&m.body)) on_chunk(self, peer, *chunk);
        else if (const auto* start = std::get_if<gossip::JobStart>(&m.body))
          start->coordinator.empty() ? on_submitted(self, peer, *start) : on_assigned(self, peer, *start);
        else if (const auto* control = std::get_if<gossip::Control>(&m.body)) on_control(self, peer, *control);
      },
      [self](step_atom) { do_step(self); },
      [self](tick_atom) { on_tick(self); },
      // Connection trouble: membership decides who is gone; the step timeout covers the rest.
      [](peer_atom, const std::string&, const std::string&) {},
  };
}

}  // namespace

RoleSpec trainer_role(TrainerOptions options, caf::actor router) {
  return {"trainer", [options, router](caf::local_actor& parent, const caf::actor&, const caf::message&) {
            return caf::actor(parent.spawn<caf::detached>(trainer, options, router));
          }};
}

}  // namespace tepdist::actors

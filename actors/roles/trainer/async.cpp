// The async driver: the parameters are sharded over the workers (elastic/placement.hpp); each
// worker trains through its own list of positions (elastic/progress.hpp, as gossip does),
// computes the gradient of each batch on the values it last pulled, pushes it (or, in updates
// mode, its local optimiser's change) to the shards' primaries, and steps again as long as its
// window of unanswered pushes allows (elastic/async_shards.hpp). This node's shards are served by
// its shard host (actors/roles/shard_host.hpp). At the end, once every worker's updates are all
// applied and durable, rank 0 assembles the final model from every shard: gathered with the
// shards' state for the job's last checkpoint when checkpoints are on, else pulled.
//
// Elastic: every installed generation places the shards afresh over its workers, every holder
// taking the shard's state from one surviving holder of the generation before
// (elastic::plan_shards); each worker sends every update it keeps (not yet durable) to the new
// primaries, which apply only those they do not hold; the rest of every worker's list is re-split
// by job control, counting a gone worker's positions as consumed up to the cursor its applied
// pushes carried. A shard none of whose holders survived ends the job, naming it.
//
// Checkpoints: rank 0 names the cut (the positions not consumed), its host gathers every shard,
// and rank 0 writes one part in the format sync writes (the whole model and optimiser state), so
// a checkpoint does not depend on the shard count or the world: a resumed job, on any number of
// nodes, places its shards afresh from it and re-splits the positions left.
// The last one, taken at the end, leaves no position when every list was trained (as gossip's),
// so a finished job resumed trains nothing again.

#include "actors/roles/trainer/job.hpp"

namespace tepdist::actors::trainer_detail {
namespace {

class AsyncDriver final : public Driver {
 public:
  const char* name() const override { return "async"; }

  /// The shard count (fixed in the record from the first generation on), this worker's
  /// positions, and the shard host, which holds nothing until enter() gives it a plan.
  std::expected<void, std::string> setup(Trainer* self, Job& j) override;

  /// One batch (a fresh one, or a refused one again), its gradient pushed to the shards.
  void step(Trainer* self, Job& j) override {
    if (held_ && j.detached) {  // nobody will release the hold: it trains on
      held_ = serving_ = assembling_ = false;
      finished_.clear();
      j.held = false;
    }
    if (serving_ || assembling_ || blocked_ || !worker_ || !may_step(j)) return;
    auto& a = *worker_;
    if (!a.may_step()) {
      blocked_ = true;  // an answer or a durable notice unblocks
      return;
    }
    const auto batch = static_cast<uint64_t>(j.config.data.batch_size);
    auto work = a.take_redo();
    const bool fresh = !work;
    elastic::StepSlice slice;
    if (fresh) {
      slice = elastic::next_slice(spans_, consumed_, batch);
      // A job that pauses between epochs: this worker's part of the released epochs is done, and
      // it finishes as at the end; rank 0 assembles the epoch's model and hands it over.
      if (slice.count == 0 || j.step >= j.total_steps || note_hold(j)) {
        if (j.config.elastic.local_steps > 0) {
          elastic::Outgoing<gossip::ShardUpdate> rest;
          a.flush(rest);
          if (!send_all(self, j, rest)) return;
        }
        return finish(self, j);
      }
      work = elastic::AsyncWorker::Work{next_batch_++};
      slices_.emplace(work->batch, slice);
      // A refused batch is recomputed while its shard's pushes are in flight; far older ones are not.
      while (slices_.size() > max_slices) slices_.erase(slices_.begin());
    } else if (const auto it = slices_.find(work->batch); it != slices_.end()) {
      slice = it->second;
    } else {
      node_events().warn("redo_skipped job={} batch={} reason=\"refused after {} newer batches\"", j.start.job_id,
                         work->batch, max_slices);
      self->send(self, step_atom::value);
      return;
    }
    const auto now = Clock::now();
    if (!j.first_step) j.first_step = j.window_start = now;
    float loss = 0;
    // A refused batch's redo counts as part of the step under way, which an error names.
    const auto computed = compute_slice(j, slice, j.step + 1, loss);
    if (!computed) return fail_everywhere(self, computed.error());
    const int64_t samples = *computed;
    const auto grads = j.model->gradients();
    if (fresh) {
      consumed_ += slice.count;
      j.epoch = static_cast<int64_t>(slice.epoch);
      a.set_cursor(consumed_);  // the pushes these steps go out in carry how far they reach
    }
    elastic::Outgoing<gossip::ShardUpdate> out;
    const float lr = j.rate->at(rate_progress_at(j, pace_, fresh ? consumed_ - slice.count : consumed_));
    if (j.config.elastic.local_steps > 0 && samples > 0) {
      // Updates mode: this worker's optimiser steps, and the change it made goes to the shards.
      const auto params = j.model->parameters();
      j.buffer.assign(params.begin(), params.end());
      j.optimizer->step(params, grads, lr);
      for (size_t i = 0; i < params.size(); ++i) j.buffer[i] = params[i] - j.buffer[i];
      a.on_update(j.buffer, static_cast<float>(j.config.elastic.outer_lr), out);
    } else if (samples > 0) {
      a.on_gradient(*work, grads, lr, out);
    }
    j.waiting_since = j.progress_at = Clock::now();
    j.compute_seconds += seconds_between(now, j.waiting_since);
    if (!send_all(self, j, out)) return;
    if (fresh) {
      // The epoch is that of the next step's positions; the last step is the end of the list.
      const auto next = elastic::next_slice(spans_, consumed_, batch);
      const bool last = next.count == 0 || j.step + 1 >= j.total_steps;
      const bool epoch_end = next.epoch != static_cast<uint64_t>(j.epoch);
      if (epoch_end || last) note_epoch_part(j);
      if (last) j.epoch = static_cast<int64_t>(spans_.empty() ? 0 : spans_.back().epoch + 1);
      after_local_step(self, j, samples, loss, epoch_end, last);
      if (j.rank == 0 && !last && j.checkpoints.take(j.step, false)) start_checkpoint(j);
    }
    self->send(self, step_atom::value);
  }

  gossip::JobProgress progress(const Job& j) const override { return local_progress(j); }
  gossip::JobProgress rate_progress(const Job& j) const override { return rate_progress_at(j, pace_, consumed_); }

  /// The cursor in this worker's list, and the others' as far as their pushes applied on this
  /// node's primaries reached (counted should they be gone).
  elastic::JobControl::Local local(const Job& j) const override {
    auto at = progress(j);
    at.position = consumed_;
    const bool current = j.member && j.control && j.control->record().generation == j.generation;
    if (!current || !counters_) return {.progress = at, .evaluations = evaluations_for_control(j)};
    auto cursors = counters_->cursors(j.generation);
    std::erase_if(cursors, [&](const auto& c) { return c.first == self_id_; });
    // Until the host has placed this generation (on its own thread, just after enter()), held()
    // says nothing: job control holds an ack back until it has (the host tells the trainer).
    return {at,
            j.has_state,
            std::move(cursors),
            counters_->held(j.generation),
            counters_->placed() < j.generation,
            evaluations_for_control(j)};
  }

  void add_status(const Job& j, const std::string& self_id, gossip::JobStatus& st) const override {
    const auto per_epoch = static_cast<uint64_t>(j.steps_per_epoch), step = static_cast<uint64_t>(j.step);
    st.progress = {step, per_epoch ? step / per_epoch : 0, consumed_, j.own_samples};
    std::map<std::string, uint64_t> known;
    if (counters_)
      for (const auto& [w, c] : counters_->cursors(j.generation)) known[w] = c;
    for (const auto& w : j.start.workers) st.workers.emplace_back(w, w == self_id ? consumed_ : known[w]);
    if (counters_) st.held_shards = counters_->held(j.generation);
  }

  bool on_message(Trainer* self, Job& j, const std::string& peer, const gossip::Body& body) override {
    const auto* st = std::get_if<gossip::ShardState>(&body);
    if (!st) return false;
    // An answer of an older generation: what it answered is sent again to this one's primaries.
    if (st->job_id == j.start.job_id && st->generation == j.generation && worker_) on_state(self, j, peer, *st);
    return true;
  }

  bool on_control(Trainer* self, Job& j, const std::string& peer, const gossip::Control& c) override {
    using Command = gossip::Control::Command;
    if (c.command == Command::worker_finished && j.rank == 0) {
      // Finished in this generation: one said before a change may have positions again.
      if (std::find(j.start.workers.begin(), j.start.workers.end(), peer) != j.start.workers.end() && j.member &&
          generation_of(c) == j.generation) {
        finished_.insert(peer);
        maybe_assemble(self, j);
      }
      return true;
    }
    if (c.command == Command::job_finished && j.rank != 0 && peer == j.start.workers[0]) {
      // Rank 0 has the final model: every update has been applied, so the counts are final.
      serving_ = false;
      finish_job(self);
      return true;
    }
    return take_target_reached(self, j, peer, c);
  }

  std::string stalled(const Job& j) const override {
    if (!worker_ || serving_ || assembling_ || !(blocked_ || listed_all(j)) || finished_.contains(self_id_)) return {};
    return fmt::format("step {} waited {:.0f} s for answers from shard primaries", j.step + 1, j.config.job.step_timeout_s);
  }

  bool ending(const Job&) const override { return serving_ || finished_.contains(self_id_); }

  void keep_ending(Trainer* self, Job& j) override {
    if (serving_) send_to(self, j.start.addresses[0], finished_message(self, j));
    if (assembling_) pull_missing(self, j);
    if (j.rank == 0 && j.target_reached) tell_target_reached(self, j);  // should a message be lost
  }

  void on_target(Trainer* self, Job& j) override {
    tell_target_reached(self, j);
    stop_training(self, j);
  }

  /// The generation's shards: the host gets its plan, and this worker sends what it keeps to the
  /// new primaries; positions as gossip's (the rest of every list, re-split).
  std::expected<void, std::string> enter(Trainer* self, Job& j) override;

  // A joiner pulls a worker's parameters as they are (step 0: any), as in gossip.
  void left(Job& j) override {
    // Left out of the generation: the updates it kept are another worker's to send no more (its
    // positions go to the others from its cursor on), and its host keeps only the shards it is
    // the source of in the installed generation, until their new holders have fetched them.
    worker_.reset();
    spans_.clear();
    consumed_ = 0;
    cut_.reset();  // a gather under way is not this worker's to finish any more
    assembling_ = false;
    finished_.clear();
    if (!host_ || !j.control) return;
    const auto& r = j.control->record();
    auto next = std::make_shared<ShardHostPlan>();
    next->generation = left_in_ = r.generation;
    next->workers = r.workers;
    next->addresses = r.addresses;
    next->plan = elastic::plan_shards(r, shards_, replication_);
    caf::anon_send(host_, place_atom::value, std::shared_ptr<const ShardHostPlan>(std::move(next)));
  }

  /// A graceful leave: this worker asks the duty holder to leave it out, naming the shards it
  /// holds (job control takes it as their source where no acker holds them), and the node stays
  /// until its host has handed them over.
  bool hand_over(Trainer* self, Job& j) override {
    if (!host_ || !counters_) return false;
    if (!j.member) return left_in_ == 0 || counters_->handed_over_in.load() != left_in_;
    if (asked_to_leave_) return true;
    // Until the host has placed this generation and fetched what it holds in it, what it holds is
    // not known, and the drain waits (the host says when: ShardHostCounters::ready_in). Taken for
    // "holds nothing", a node asked to leave as it started the job went with the only copy of its
    // shards; one asked to leave while fetching would have left a fetched shard out.
    if (counters_->ready_in.load() < j.generation) return true;
    auto held = counters_->held(j.generation);
    if (held.empty() || !j.control || j.world <= 1) return false;  // nothing only this node could give
    const auto& record = j.control->record();
    auto& s = self->state;
    const std::string holder = elastic::job_duty_holder(record, s.view, {{s.o.self_id, s.o.boot_id}});
    const auto* address = elastic::worker_address(record, holder);
    if (!address || holder == s.o.self_id) return false;
    auto vote = decline_vote(s, record.job_id, record.generation);
    vote.held_shards = std::move(held);
    node_events().info("handing_over job={} generation={} shards={} duty_holder={}", record.job_id, record.generation,
                       vote.held_shards.size(), holder);
    send_to(self, *address, std::move(vote));
    asked_to_leave_ = true;
    return true;
  }

  void add_counters(const Job&, JobReport& r) const override {
    if (worker_) r.stale_rejected = worker_->rejected();
    if (counters_) {
      r.updates_applied = counters_->applied.load();
      r.staleness_sum = counters_->staleness_sum.load();
    }
  }

  std::expected<void, std::string> resume(Job& j, const compute::TrainingState& state) override {
    resumed_ = true;
    return resume_positions(j, state);
  }

  /// Rank 0: the shards its host gathered, and the cut named when it was asked, to disk. The
  /// job's last cut is also its final model: rank 0 keeps the gathered values and ends the job
  /// (should the gather fail, the model is pulled from the primaries instead).
  void on_gathered(Trainer* self, Job& j, const ShardGather& g) override {
    if (!cut_ || g.id != cut_->id || !worker_) return;  // an older one's, or left out meanwhile
    auto cut = std::move(*cut_);
    cut_.reset();
    if (!g.error.empty()) {
      node_events().warn("checkpoint_failed job={} step={} reason=\"{}\"", j.start.job_id, cut.state.step, g.error);
      if (cut.final) start_pull(self, j);
      return;
    }
    const auto params = j.model->parameters();
    auto optimizer = j.optimizer->state();
    // Gradients mode: the optimiser state is the shards'; updates mode: the shards step plain SGD
    // and the state is this worker's own optimiser's, written as it is.
    const bool shard_state = !updates();
    if (g.values.size() != params.size() || (shard_state && g.optimizer.size() != optimizer.size())) {
      node_events().warn("checkpoint_failed job={} step={} reason=\"the shards gathered hold {} values and {} optimiser "
                         "buffers; the model has {} and {}\"",
                         j.start.job_id, cut.state.step, g.values.size(), g.optimizer.size(), params.size(),
                         optimizer.size());
      if (cut.final) start_pull(self, j);
      return;
    }
    auto cursors = g.cursors;
    // A job that ran out of positions (no job.max_steps, no stop at the target) leaves none: every
    // worker finished its list, so a resume of the finished job trains nothing again (as gossip).
    if (cut.final && j.config.job.max_steps <= 0 && !j.target_reached)
      for (const auto& w : j.start.workers) cursors[w] = std::numeric_limits<uint64_t>::max();
    set_unconsumed(j, cursors, cut.state);
    // The file is written from the model and optimiser: this worker's own values stand aside meanwhile.
    const std::vector<float> own(params.begin(), params.end());
    std::copy(g.values.begin(), g.values.end(), params.begin());
    if (shard_state) {
      for (size_t b = 0; b < optimizer.size(); ++b)
        std::copy(g.optimizer[b].begin(), g.optimizer[b].end(), optimizer[b].second.begin());
      j.optimizer->set_steps(g.optimizer_steps);
    }
    j.checkpoints.write(j, *j.model, *j.optimizer, cut.state, cut.began);
    if (cut.final) return assembled(self, j);  // every update is in: the gathered values are the final model
    std::copy(own.begin(), own.end(), params.begin());
  }

  void drop(Trainer* self) override {
    if (!host_) return;
    self->unlink_from(host_);  // its end is this job's, not a failure the trainer shares
    self->send_exit(host_, caf::exit_reason::kill);
    // Updates for the next job wait in the router until that job's host registers.
    caf::anon_send(self->state.router, shards_atom::value, caf::actor(), std::vector<gossip::ShardHolders>());
    host_ = caf::actor();
  }

  caf::actor local_shards() const override { return host_; }

 private:
  static constexpr size_t max_slices = 4096;

  bool updates() const { return worker_options_.local_steps > 0; }

  static ShardOptimizerFactory shard_optimizer(compute::OptimizerOptions options) {
    return [options](size_t n) -> std::expected<std::unique_ptr<compute::Optimizer>, std::string> {
      auto made = compute::make_optimizer(options, n);
      if (!made) return std::unexpected(made.error().message);
      return std::move(*made);
    };
  }

  /// Rank 0, a checkpoint due: this node's host gathers every shard from its primary; the file
  /// is written when they come (on_gathered). The positions it counts as consumed are, per
  /// worker, those every shard's state holds: the least cursor its applied pushes carried over
  /// the shards. (A push refused as too stale and not yet sent again is the exception: its
  /// steps may count although they are not in.)
  void start_checkpoint(Job& j, bool final = false) {
    Cut cut{++cuts_, Clock::now(), {j.step, j.epoch, j.config.job.seed, {}}, final};
    cut.state.job = compute::TrainingState::Job{j.start.job_id, j.generation, "async", 0, j.own_samples * j.world,
                                                j.start.reference_batch};
    cut.state.job->lr_factor = j.lr_factor();
    cut_ = std::move(cut);
    caf::anon_send(host_, gather_atom::value, cut_->id);
  }

  /// worker_finished, naming the generation it is finished in (8 bytes, little-endian).
  gossip::Control finished_message(Trainer* self, const Job& j) const {
    std::vector<uint8_t> generation(8);
    for (int i = 0; i < 8; ++i) generation[i] = static_cast<uint8_t>(j.generation >> (8 * i));
    return gossip::Control{self_id_, self->state.o.incarnation, gossip::Control::Command::worker_finished,
                           j.start.job_id, std::move(generation)};
  }

  static uint64_t generation_of(const gossip::Control& c) {
    if (c.argument.size() != 8) return 0;
    uint64_t g = 0;
    for (int i = 0; i < 8; ++i) g |= static_cast<uint64_t>(c.argument[i]) << (8 * i);
    return g;
  }

  /// Every position of this worker's list is trained (or max_steps reached), or those of the
  /// epochs released so far (a job that pauses between epochs).
  bool listed_all(const Job& j) const {
    const auto next = elastic::next_slice(spans_, consumed_, 1);
    return next.count == 0 || j.step >= j.total_steps || at_hold(j, next.epoch);
  }

  /// Whether this worker's next positions wait for a release (held_, and the epochs done, set).
  bool note_hold(const Job& j) {
    const auto next = elastic::next_slice(spans_, consumed_, 1);
    held_ = next.count > 0 && j.step < j.total_steps && at_hold(j, next.epoch);
    if (held_) held_epochs_ = next.epoch;
    return held_;
  }

  /// Whether positions of `epoch` wait for a release.
  static bool at_hold(const Job& j, uint64_t epoch) {
    return j.config.job.pause_between_epochs && !j.detached && epoch >= j.start.released_epochs;
  }

  /// False: a send queue was full and the job failed.
  bool send_all(Trainer* self, Job& j, elastic::Outgoing<gossip::ShardUpdate>& out) {
    for (auto& [address, u] : out) {
      j.tensor_bytes += u.chunk.data.size_bytes();
      if (!send_to(self, address, std::move(u))) {
        fail(self, fmt::format("the send queue to {} is full; raise [cluster] send_queue_mb", address));
        return false;
      }
    }
    return true;
  }

  /// Rank 0: pulls every shard not assembled yet from its primary (again on each tick, should an
  /// answer be lost).
  void pull_missing(Trainer* self, Job& j) {
    elastic::Outgoing<gossip::ShardUpdate> out;
    for (uint32_t s = 0; s < placement_.size(); ++s) {
      if (assembled_[s]) continue;
      if (const auto* address = elastic::worker_address(j.start, placement_[s].front()))
        out.emplace_back(*address, gossip::ShardUpdate{j.start.job_id, s, gossip::ShardUpdate::Kind::pull, 0, 0, {}, {},
                                                       0, 0, false, j.generation});
    }
    send_all(self, j, out);
  }

  /// Rank 0, once every worker has applied all its updates: the final model, gathered with the
  /// shards' optimiser state for the job's last checkpoint when one is due, else pulled.
  void maybe_assemble(Trainer* self, Job& j) {
    // Not again once the final model is whole: a worker_finished that crossed job_finished on
    // its way comes while rank 0 evaluates.
    if (j.finishing || assembling_ || (cut_ && cut_->final) || finished_.size() < j.world) return;
    if (held_) return start_pull(self, j);  // an epoch's model, not the job's end: no final checkpoint
    if (j.checkpoints.take(j.step, true)) return start_checkpoint(j, true);
    start_pull(self, j);
  }

  /// Rank 0: pulls every shard's values from its primary for the final model.
  void start_pull(Trainer* self, Job& j) {
    assembling_ = true;
    assembled_.assign(placement_.size(), 0);
    assembled_count_ = 0;
    pull_missing(self, j);
  }

  /// Rank 0, the final model whole: the others may let their shards go; rank 0 evaluates and reports.
  /// At an epoch's hold the others keep serving, and rank 0 evaluates the model, then hands it over.
  void assembled(Trainer* self, Job& j) {
    if (held_) {
      j.last_eval_step = -1;  // the assembled model is another than rank 0's replica
      evaluate_snapshot(self);
      hold_between_epochs(self, j, held_epochs_);
      return;
    }
    gossip::Control over{self_id_, self->state.o.incarnation, gossip::Control::Command::job_finished, j.start.job_id,
                         {}};
    for (size_t i = 1; i < j.start.addresses.size(); ++i) send_to(self, j.start.addresses[i], over);
    j.last_eval_step = -1;  // the assembled model is another than rank 0's replica evaluated at this step
    finish_job(self);       // which evaluates it
  }

  /// Every position of its list done; once every push is answered (and refused ones redone) and
  /// every update is durable (on every holder of its shard), this worker is finished. Rank 0
  /// then waits for the others; the others keep serving their shards.
  void finish(Trainer* self, Job& j) {
    if (!worker_->idle() || !worker_->durable() || serving_ || finished_.contains(self_id_)) return;
    note_hold(j);
    node_events().info("async_finished job={} rank={} generation={} steps={} pushes={} stale_rejected={}", j.start.job_id,
                       j.rank, j.generation, j.step, worker_->pushes(), worker_->rejected());
    if (j.rank == 0) {
      finished_.insert(self_id_);
      return maybe_assemble(self, j);
    }
    serving_ = true;
    send_to(self, j.start.addresses[0], finished_message(self, j));
    if (held_) hold_between_epochs(self, j, held_epochs_);  // rank 0 hands the model over
  }

  void on_state(Trainer* self, Job& j, const std::string& peer, const gossip::ShardState& st) {
    if (st.shard >= placement_.size() || peer != placement_[st.shard].front()) {
      node_events().warn("shard_state_refused from={} shard={} reason=\"not the shard's primary\"", peer, st.shard);
      return;
    }
    if (assembling_ && st.kind == gossip::ShardState::Kind::values) {
      const auto range = elastic::shard_range(j.elements(), static_cast<uint32_t>(placement_.size()), st.shard);
      if (assembled_[st.shard]) return;  // a pull repeated while the first answer travelled
      if (st.chunk.offset != 0 || st.chunk.data.size() != range.size()) {
        node_events().warn("shard_state_refused from={} shard={} reason=\"not the pulled shard's size\"", peer, st.shard);
        return;
      }
      std::copy(st.chunk.data.begin(), st.chunk.data.end(),
                j.model->parameters().begin() + static_cast<ptrdiff_t>(range.begin));
      assembled_[st.shard] = 1;
      if (++assembled_count_ < placement_.size()) return;
      return assembled(self, j);
    }
    elastic::Outgoing<gossip::ShardUpdate> out;
    if (auto ok = worker_->on_state(st, j.model->parameters(), out); !ok) {
      node_events().warn("shard_state_refused from={} shard={} reason=\"{}\"", peer, st.shard, ok.error());
      return;
    }
    j.waiting_since = j.progress_at = Clock::now();
    if (auto& f = j.figures; st.kind == gossip::ShardState::Kind::values && !st.rejected && !st.duplicate && f.staleness) {
      f.staleness->observe(static_cast<double>(st.staleness));
      if (!f.recent_staleness)
        f.recent_staleness = &f.metrics->gauge("tepdist_worker_staleness", {{"mode", "async"}},
                                               "the recent mean staleness of this worker's applied pushes");
      f.recent_staleness->set(worker_->recent_staleness());
    }
    if (!send_all(self, j, out)) return;
    if (blocked_ && worker_->may_step()) {
      blocked_ = false;
      self->send(self, step_atom::value);
    }
    if (listed_all(j)) {
      if (worker_->idle()) finish(self, j);  // or, once every update is durable, on the last notice
      else if (!blocked_) self->send(self, step_atom::value);  // refused batches to redo
    }
  }

  std::string self_id_;
  uint32_t shards_ = 0;
  int replication_ = 1;
  std::optional<elastic::AsyncWorker> worker_;
  uint64_t worker_runs_ = 0;
  elastic::AsyncWorker::Options worker_options_;
  elastic::Placement placement_;
  caf::actor host_;
  std::shared_ptr<ShardHostCounters> counters_;
  // This worker's positions and how far it is through them.
  elastic::Spans spans_;
  uint64_t consumed_ = 0;
  elastic::JobPace pace_;  // the job's progress from consumed_, for the rate
  uint64_t next_batch_ = 0;
  std::map<uint64_t, elastic::StepSlice> slices_;  // the positions of recent batches, for a refused one's redo
  bool blocked_ = false;             // waiting for a shard's answer before the next step
  bool serving_ = false;             // not rank 0: all applied; holding shards until rank 0 has the model
  std::set<std::string> finished_;   // rank 0: workers whose updates are all applied
  // Rank 0: the checkpoint whose shards are being gathered.
  struct Cut {
    uint64_t id = 0;
    Clock::time_point began;
    compute::TrainingState state;
    bool final = false;  // the job's last: every worker finished, and the gathered values are the final model
  };
  std::optional<Cut> cut_;
  uint64_t cuts_ = 0;
  bool asked_to_leave_ = false;  // draining: asked to be left out, handing the shards over
  uint64_t left_in_ = 0;         // the generation that left this worker out (its host hands over in it)
  bool resumed_ = false;  // from a checkpoint: in gradients mode the shards' optimisers start from its state
  std::string shard_optimizer_applied_;  // the release's optimiser lines the host's shards step with (Job::optimizer_applied)
  bool assembling_ = false;          // rank 0: pulling every shard for the final model
  bool held_ = false;                // finished the released epochs of a job that pauses between them
  uint64_t held_epochs_ = 0;         // the epochs done at that hold
  std::vector<uint8_t> assembled_;   // per shard
  size_t assembled_count_ = 0;
};

std::expected<void, std::string> AsyncDriver::setup(Trainer* self, Job& j) {
  auto& o = self->state.o;
  self_id_ = o.self_id;
  const auto& e = j.config.elastic;
  replication_ = static_cast<int>(e.replication);
  // The first generation fixes the count (0: twice its workers); the record carries it on.
  if (j.start.shards == 0)
    j.start.shards = static_cast<uint32_t>(std::clamp<int64_t>(
        e.shards > 0 ? e.shards : 2 * static_cast<int64_t>(j.world), 1, static_cast<int64_t>(j.elements())));
  shards_ = j.start.shards;
  // Updates mode: the workers' optimisers have stepped already; the primary adds their changes
  // (so a change of optimiser between epochs is the workers' alone).
  compute::OptimizerOptions shard_options = j.config.optimizer.options;
  if (e.local_steps > 0) {
    shard_options = {};
    shard_options.momentum = 0;
  }
  auto probe = compute::make_optimizer(shard_options, 1);
  if (!probe) return std::unexpected(probe.error().message);
  // A shard moves whole, with its optimiser state, in one frame.
  const size_t buffers = (*probe)->state().size();
  const size_t largest_kb =
      elastic::shard_range(j.elements(), shards_, 0).size() * (1 + buffers) * sizeof(float) / 1024 + 1;
  if (static_cast<int64_t>(largest_kb) + 64 > o.max_frame_kb)
    return std::unexpected(fmt::format("a shard with its optimiser state ({} KiB) does not fit this node's frames "
                                       "([cluster] max_frame_mb = {}); raise [elastic] shards",
                                       largest_kb, o.max_frame_kb / 1024));
  init_position_lists(j);
  worker_options_ = elastic::AsyncWorker::Options{j.start.job_id,
                                                  j.elements(),
                                                  shards_,
                                                  {},
                                                  static_cast<uint32_t>(e.push_window),
                                                  static_cast<uint64_t>(std::max<int64_t>(1, j.config.job.max_staleness)),
                                                  static_cast<uint32_t>(e.local_steps),
                                                  j.world,
                                                  o.self_id,
                                                  o.boot_id};
  auto init = std::make_shared<ShardHostInit>();
  init->transport = o.transport;
  init->cluster_id = o.cluster_id;
  init->self_id = o.self_id;
  init->self_address = o.self_address;
  init->incarnation = o.incarnation;
  init->trainer = caf::actor_cast<caf::actor>(self);
  init->job_id = j.start.job_id;
  init->elements = j.elements();
  init->shards = shards_;
  init->max_staleness = static_cast<uint64_t>(j.config.job.max_staleness);
  init->max_lr = e.local_steps > 0 ? 1.0f : std::numeric_limits<float>::infinity();
  init->piece = chunk_elements(j);
  init->optimizer = shard_optimizer(shard_options);
  shard_optimizer_applied_ = j.optimizer_applied;
  counters_ = init->counters = std::make_shared<ShardHostCounters>();
  host_ = spawn_shard_host(*self, std::move(init));
  // Should the trainer itself end, the host ends with it.
  self->attach_functor([host = caf::actor_cast<caf::weak_actor_ptr>(host_)](const caf::error&) {
    if (auto h = caf::actor_cast<caf::actor>(host)) caf::anon_send_exit(h, caf::exit_reason::kill);
  });
  // The job's last step of set-up: from here the host takes this node's shard updates (the
  // router holds them until then; the host holds them until its plan comes).
  caf::anon_send(self->state.router, shards_atom::value, host_, std::vector<gossip::ShardHolders>());
  return {};
}

std::expected<void, std::string> AsyncDriver::enter(Trainer* self, Job& j) {
  const auto& r = j.start;
  if (r.shards != shards_)
    return std::unexpected(fmt::format("generation {} names {} shards; the job has {}", r.generation, r.shards, shards_));
  auto plan = elastic::plan_shards(r, shards_, replication_);
  if (!plan.lost.empty()) {
    std::string lost;
    for (const auto& l : plan.lost) lost += (lost.empty() ? "" : "; ") + l;
    return std::unexpected(fmt::format("generation {} has no surviving holder of {} shard(s): {}. Every holder of a "
                                       "shard died at once; [elastic] replication = {} survives {} at once",
                                       r.generation, plan.lost.size(), lost, replication_,
                                       std::max(0, replication_ - 1)));
  }
  placement_ = plan.placement;
  auto host_plan = std::make_shared<ShardHostPlan>();
  host_plan->generation = r.generation;
  host_plan->workers = r.workers;
  host_plan->addresses = r.addresses;
  // A source left out of this generation (a leaver handing over) is reached through the view.
  for (const auto& source : plan.sources) {
    const auto* address = elastic::worker_address(r, source);
    const auto& view = self->state.view;
    const auto member = std::find_if(view.begin(), view.end(), [&](const gossip::Member& m) { return m.id == source; });
    host_plan->source_addresses.push_back(address ? *address : member != view.end() ? member->address : std::string());
  }
  host_plan->plan = std::move(plan);
  if (r.previous_workers.empty()) {  // the first generation: every holder starts from these values
    const auto params = j.model->parameters();
    host_plan->initial = std::make_shared<const std::vector<float>>(params.begin(), params.end());
    if (resumed_ && !updates()) {  // ... and, resumed in gradients mode, from the checkpoint's optimiser state
      auto buffers = std::make_shared<std::vector<std::vector<float>>>();
      for (const auto& [name, b] : j.optimizer->state()) buffers->emplace_back(b.begin(), b.end());
      host_plan->initial_optimizer = std::move(buffers);
      host_plan->initial_optimizer_steps = j.optimizer->steps();
    }
  }
  // A release with what the program set between epochs: the parameters (this worker took them as
  // it entered) are every holder's, and in gradients mode the shards step the new optimiser.
  if (j.reset_in == r.generation) {
    const auto params = j.model->parameters();
    host_plan->reset = std::make_shared<const std::vector<float>>(params.begin(), params.end());
  }
  if (j.optimizer_applied != shard_optimizer_applied_) {
    if (!updates()) host_plan->optimizer = shard_optimizer(j.config.optimizer.options);
    shard_optimizer_applied_ = j.optimizer_applied;
  }
  cut_.reset();  // a gather under way ends with this install
  caf::anon_send(host_, place_atom::value, std::shared_ptr<const ShardHostPlan>(std::move(host_plan)));
  std::vector<gossip::ShardHolders> holders;
  for (uint32_t s = 0; s < placement_.size(); ++s) holders.push_back({s, placement_[s]});
  caf::anon_send(self->state.router, shards_atom::value, host_, std::move(holders));

  std::vector<std::string> primaries;
  for (const auto& h : placement_) primaries.push_back(*elastic::worker_address(r, h.front()));
  elastic::Outgoing<gossip::ShardUpdate> resend;
  if (!worker_) {
    auto options = worker_options_;
    options.primaries = primaries;
    options.workers = j.world;
    // Each run of the worker numbers its updates from 1: one after being left out must not be
    // taken for the earlier run's, which the shards' marks remember.
    options.boot = worker_options_.boot + 0x9e3779b97f4a7c15ull * worker_runs_++;
    worker_.emplace(std::move(options));
    worker_->set_generation(r.generation);
  } else {
    worker_->set_generation(r.generation);
    for (uint32_t s = 0; s < shards_; ++s) worker_->retarget(s, primaries[s], resend);
  }
  auto spans = worker_positions(j);
  if (!spans) return std::unexpected(spans.error());
  spans_ = std::move(*spans);
  consumed_ = 0;
  pace_ = job_pace(j);
  worker_->set_cursor(0);
  blocked_ = serving_ = assembling_ = held_ = false;
  finished_.clear();
  // Draining, and still a worker of this generation: the ask to be left out was not what this
  // generation did (the duty holder left another out: every node of a job draining at once, as
  // when the program that started them dies, each asks another), so the drain looks again, and
  // a worker now alone has nobody to hand its shards to and goes.
  asked_to_leave_ = false;
  uint64_t positions = 0;
  for (const auto& span : spans_) positions += span.end - span.begin;
  if (r.generation > 1)
    node_events().info("async_entered job={} generation={} shards={} resent={} positions={}", r.job_id, r.generation,
                       shards_, resend.size(), positions);
  for (auto& [address, u] : resend) {
    j.tensor_bytes += u.chunk.data.size_bytes();
    if (!send_to(self, address, std::move(u)))
      return std::unexpected(fmt::format("the send queue to {} is full; raise [cluster] send_queue_mb", address));
  }
  return {};
}

}  // namespace

std::unique_ptr<Driver> make_async_driver() { return std::make_unique<AsyncDriver>(); }

}  // namespace tepdist::actors::trainer_detail

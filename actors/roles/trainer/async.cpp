// The async driver: the parameters are sharded over the workers (elastic/placement.hpp); each
// worker computes the gradient of its slice of the next global batch on the values it last
// pulled, pushes it (or, in updates mode, its local optimiser's change) to the shards' primaries,
// and steps again as long as its window of unanswered pushes allows (elastic/async_shards.hpp).
// This node's shards are served by its shard host (actors/roles/shard_host.hpp). At the end rank 0
// pulls every shard for the final model. Not elastic yet: a membership change ends the job.

#include "actors/roles/trainer/job.hpp"

namespace tepdist::actors::trainer_detail {
namespace {

class AsyncDriver final : public Driver {
 public:
  const char* name() const override { return "async"; }
  bool elastic() const override { return false; }

  /// The shards, where they live, this worker's side of the protocol, and the host for the shards
  /// this node holds. Every node starts from the same initial parameters (same seed), so primaries
  /// and replicas start equal.
  std::expected<void, std::string> setup(Trainer* self, Job& j) override;

  /// One batch (a fresh one, or a refused one again), its gradient pushed to the shards.
  void step(Trainer* self, Job& j) override {
    if (serving_ || assembling_ || blocked_) return;
    auto& a = *worker_;
    if (!a.may_step()) {
      blocked_ = true;  // an answer unblocks
      return;
    }
    auto work = a.take_redo();
    const bool fresh = !work;
    if (fresh && j.step >= j.total_steps) {
      if (j.config.elastic.local_steps > 0) {
        elastic::Outgoing<gossip::ShardUpdate> rest;
        a.flush(rest);
        if (!send_all(self, j, rest)) return;
      }
      return finish(self, j);
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
    if (!send_all(self, j, out)) return;
    if (fresh) {
      const int64_t step = j.step + 1;  // the step just taken
      const bool epoch_end = step % j.steps_per_epoch == 0;
      if (epoch_end) ++j.epoch;
      after_local_step(self, j, samples, loss, epoch_end, step >= j.total_steps);
    }
    self->send(self, step_atom::value);
  }

  gossip::JobProgress progress(const Job& j) const override {
    const auto step = static_cast<uint64_t>(j.step), per_epoch = static_cast<uint64_t>(j.steps_per_epoch);
    return {step, per_epoch ? step / per_epoch : 0, per_epoch ? step % per_epoch * j.start.reference_batch : 0,
            j.own_samples};
  }

  elastic::JobControl::Local local(const Job& j) const override { return {progress(j), j.has_state}; }

  // Async workers do not tell each other where they are: only this worker's own position.
  void add_status(const Job& j, const std::string& self_id, gossip::JobStatus& st) const override {
    st.progress = progress(j);
    st.workers.emplace_back(self_id, st.progress.position);
  }

  bool on_message(Trainer* self, Job& j, const std::string& peer, const gossip::Body& body) override {
    const auto* st = std::get_if<gossip::ShardState>(&body);
    if (!st) return false;
    if (st->job_id == j.start.job_id) on_state(self, j, peer, *st);
    return true;
  }

  bool on_control(Trainer* self, Job& j, const std::string& peer, const gossip::Control& c) override {
    using Command = gossip::Control::Command;
    if (c.command == Command::worker_finished && j.rank == 0) {
      if (std::find(j.start.workers.begin(), j.start.workers.end(), peer) != j.start.workers.end()) {
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
    if (serving_ || assembling_ || !(blocked_ || j.step >= j.total_steps) || finished_.contains(self_id_)) return {};
    return fmt::format("step {} waited {:.0f} s for answers from shard primaries", j.step + 1, j.config.job.step_timeout_s);
  }

  bool ending(const Job&) const override { return serving_ || finished_.contains(self_id_); }

  void keep_ending(Trainer* self, Job& j) override {
    if (serving_)
      send_to(self, j.start.addresses[0], gossip::Control{self->state.o.self_id, self->state.o.incarnation,
                                                           gossip::Control::Command::worker_finished, j.start.job_id, {}});
    if (assembling_) pull_missing(self, j);
    if (j.rank == 0 && j.target_reached) tell_target_reached(self, j);  // should a message be lost
  }

  void on_target(Trainer* self, Job& j) override {
    tell_target_reached(self, j);
    stop_training(self, j);
  }

  std::expected<void, std::string> enter(Trainer*, Job&) override {
    return std::unexpected(std::string("async jobs do not survive membership changes yet (sync and gossip jobs do)"));
  }

  void add_counters(const Job&, JobReport& r) const override {
    if (worker_) r.stale_rejected = worker_->rejected();
    if (counters_) {
      r.updates_applied = counters_->applied.load();
      r.staleness_sum = counters_->staleness_sum.load();
    }
  }

  void drop(Trainer* self) override {
    if (!host_) return;
    self->send_exit(host_, caf::exit_reason::kill);
    // Updates for the next job wait in the router until that job's host registers.
    caf::anon_send(self->state.router, shards_atom::value, caf::actor(), std::vector<gossip::ShardHolders>());
    host_ = caf::actor();
  }

  caf::actor local_shards() const override { return host_; }

 private:
  /// The gradient of this worker's slice of global batch t (of epoch t / steps_per_epoch);
  /// returns the samples in the slice (0 for a short last step) and their loss.
  static int64_t compute_slice(Job& j, int64_t t, float& loss) {
    const int64_t n = j.data.train.size(), batch = j.config.data.batch_size;
    const int64_t epoch = t / j.steps_per_epoch, in_epoch = t % j.steps_per_epoch;
    const auto [begin, end] = elastic::sync_batch_slice(n, j.world, batch, in_epoch, j.rank);
    return compute_positions(j, epoch, begin, end, loss);
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
        out.emplace_back(*address, gossip::ShardUpdate{j.start.job_id, s, gossip::ShardUpdate::Kind::pull, 0, 0, {}});
    }
    send_all(self, j, out);
  }

  /// Rank 0, once every worker has applied all its updates: pull every shard for the final model.
  void maybe_assemble(Trainer* self, Job& j) {
    if (assembling_ || finished_.size() < j.world) return;
    assembling_ = true;
    assembled_.assign(placement_.size(), 0);
    assembled_count_ = 0;
    pull_missing(self, j);
  }

  /// Every fresh batch done; once every push is answered (and refused ones redone) and every
  /// update is durable (on every holder of its shard), this worker is finished. Rank 0 then waits for the others; the others keep serving their shards.
  void finish(Trainer* self, Job& j) {
    if (!worker_->idle() || !worker_->durable() || serving_ || finished_.contains(self_id_)) return;
    node_events().info("async_finished job={} rank={} steps={} pushes={} stale_rejected={}", j.start.job_id, j.rank,
                       j.step, worker_->pushes(), worker_->rejected());
    if (j.rank == 0) {
      finished_.insert(self_id_);
      return maybe_assemble(self, j);
    }
    serving_ = true;
    send_to(self, j.start.addresses[0],
            gossip::Control{self_id_, self->state.o.incarnation, gossip::Control::Command::worker_finished,
                            j.start.job_id, {}});
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
      // The final model is whole: the others may let their shards go; rank 0 evaluates and reports.
      gossip::Control over{self_id_, self->state.o.incarnation, gossip::Control::Command::job_finished, j.start.job_id,
                           {}};
      for (size_t i = 1; i < j.start.addresses.size(); ++i) send_to(self, j.start.addresses[i], over);
      evaluate_snapshot(self);
      return finish_job(self);
    }
    elastic::Outgoing<gossip::ShardUpdate> out;
    if (auto ok = worker_->on_state(st, j.model->parameters(), out); !ok) {
      node_events().warn("shard_state_refused from={} shard={} reason=\"{}\"", peer, st.shard, ok.error());
      return;
    }
    j.waiting_since = j.progress_at = Clock::now();
    if (!send_all(self, j, out)) return;
    if (blocked_ && worker_->may_step()) {
      blocked_ = false;
      self->send(self, step_atom::value);
    }
    if (j.step >= j.total_steps) {
      if (worker_->idle()) finish(self, j);  // or, once every update is durable, on the last notice
      else if (!blocked_) self->send(self, step_atom::value);  // refused batches to redo
    }
  }

  std::string self_id_;
  std::optional<elastic::AsyncWorker> worker_;
  elastic::Placement placement_;
  caf::actor host_;
  std::shared_ptr<ShardHostCounters> counters_;
  bool blocked_ = false;             // waiting for a shard's answer before the next step
  bool serving_ = false;             // not rank 0: all applied; holding shards until rank 0 has the model
  std::set<std::string> finished_;   // rank 0: workers whose updates are all applied
  bool assembling_ = false;          // rank 0: pulling every shard for the final model
  std::vector<uint8_t> assembled_;   // per shard
  size_t assembled_count_ = 0;
};

std::expected<void, std::string> AsyncDriver::setup(Trainer* self, Job& j) {
  auto& o = self->state.o;
  self_id_ = o.self_id;
  const auto& e = j.config.elastic;
  const auto shards = static_cast<uint32_t>(std::clamp<int64_t>(e.shards > 0 ? e.shards : 2 * static_cast<int64_t>(j.world),
                                                                1, static_cast<int64_t>(j.elements())));
  const size_t largest_kb = elastic::shard_range(j.elements(), shards, 0).size() * sizeof(float) / 1024 + 1;
  if (static_cast<int64_t>(largest_kb) + 64 > o.max_frame_kb)
    return std::unexpected(fmt::format("a shard of {} KiB does not fit this node's frames ([cluster] max_frame_mb = {}); "
                                       "raise [elastic] shards",
                                       largest_kb, o.max_frame_kb / 1024));
  placement_ = elastic::place_shards(shards, j.start.workers, static_cast<int>(e.replication));
  const auto address_of = [&](const std::string& id) { return *elastic::worker_address(j.start, id); };
  std::vector<std::string> primaries;
  for (const auto& holders : placement_) primaries.push_back(address_of(holders.front()));
  worker_.emplace(elastic::AsyncWorker::Options{j.start.job_id, j.elements(), shards, primaries,
                                                static_cast<uint32_t>(e.push_window),
                                                static_cast<uint64_t>(std::max<int64_t>(1, j.config.job.max_staleness)),
                                                static_cast<uint32_t>(e.local_steps), j.world, o.self_id,
                                                o.boot_id});
  auto init = std::make_shared<ShardHostInit>();
  init->transport = o.transport;
  init->cluster_id = o.cluster_id;
  init->self_id = o.self_id;
  init->self_address = o.self_address;
  init->incarnation = o.incarnation;
  init->job_id = j.start.job_id;
  init->workers = j.start.workers;
  init->addresses = j.start.addresses;
  init->placement = placement_;
  init->trainer = caf::actor_cast<caf::actor>(self);
  counters_ = init->counters = std::make_shared<ShardHostCounters>();
  const auto params = j.model->parameters();
  std::string held;
  for (uint32_t s = 0; s < shards; ++s) {
    const auto& holders = placement_[s];
    const auto me = std::find(holders.begin(), holders.end(), o.self_id);
    if (me == holders.end()) continue;
    const auto range = elastic::shard_range(j.elements(), shards, s);
    // Updates mode: the workers' optimisers have stepped already; the primary adds their changes.
    compute::OptimizerOptions plain;
    plain.momentum = 0;
    auto optimizer = compute::make_optimizer(e.local_steps > 0 ? plain : j.config.optimizer.options, range.size());
    if (!optimizer) return std::unexpected(optimizer.error().message);
    std::vector<std::string> replicas;
    if (me == holders.begin())
      for (auto r = holders.begin() + 1; r != holders.end(); ++r) replicas.push_back(address_of(*r));
    init->shards.emplace(
        s, std::make_unique<elastic::ShardServer>(
               elastic::ShardServer::Options{j.start.job_id, s, static_cast<uint64_t>(j.config.job.max_staleness), replicas,
                                             e.local_steps > 0 ? 1.0f : std::numeric_limits<float>::infinity()},
               std::vector<float>(params.begin() + static_cast<ptrdiff_t>(range.begin),
                                  params.begin() + static_cast<ptrdiff_t>(range.end)),
               std::move(*optimizer)));
    held += fmt::format("{}{}{}", held.empty() ? "" : ",", s, me == holders.begin() ? "p" : "r");
  }
  node_events().info("shards_placed job={} shards={} replication={} held={}", j.start.job_id, shards,
                     std::min<int64_t>(e.replication, j.world), held.empty() ? "-" : held);
  host_ = spawn_shard_host(*self, std::move(init));
  // Should the trainer itself end, the host ends with it.
  self->attach_functor([host = caf::actor_cast<caf::weak_actor_ptr>(host_)](const caf::error&) {
    if (auto h = caf::actor_cast<caf::actor>(host)) caf::anon_send_exit(h, caf::exit_reason::kill);
  });
  // The job's last step of set-up: from here the host takes this node's shard updates (the
  // router holds them until then).
  std::vector<gossip::ShardHolders> holders;
  for (uint32_t s = 0; s < placement_.size(); ++s) holders.push_back({s, placement_[s]});
  caf::anon_send(self->state.router, shards_atom::value, host_, std::move(holders));
  return {};
}

}  // namespace

std::unique_ptr<Driver> make_async_driver() { return std::make_unique<AsyncDriver>(); }

}  // namespace tepdist::actors::trainer_detail

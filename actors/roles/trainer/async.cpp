#include "actors/roles/trainer/job.hpp"

namespace tepdist::actors::trainer_detail {

void send_all(Trainer* self, elastic::Outgoing<gossip::ShardUpdate>& out) {
  auto& j = *self->state.job;
  for (auto& [address, u] : out) {
    j.tensor_bytes += u.chunk.data.size_bytes();
    if (!send_to(self, address, std::move(u)))
      return fail(self, fmt::format("the send queue to {} is full; raise [cluster] send_queue_mb", address));
    if (!self->state.job) return;
  }
}

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

void maybe_assemble(Trainer* self) {
  auto& j = *self->state.job;
  if (j.assembling || j.finished.size() < j.world) return;
  j.assembling = true;
  j.assembled.assign(j.placement.size(), 0);
  j.assembled_count = 0;
  pull_missing(self);
}

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
}  // namespace tepdist::actors::trainer_detail

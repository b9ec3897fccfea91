#include "actors/roles/trainer/job.hpp"

namespace tepdist::actors::trainer_detail {

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

gossip::JobProgress gossip_progress(const Job& j) {
  const auto step = static_cast<uint64_t>(j.step), per_epoch = static_cast<uint64_t>(j.steps_per_epoch);
  const uint64_t reference = j.start.reference_batch;
  return {step, step / per_epoch, step % per_epoch * reference, step * reference};
}

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
}  // namespace tepdist::actors::trainer_detail

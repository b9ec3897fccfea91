#include "actors/roles/trainer/job.hpp"

namespace tepdist::actors::trainer_detail {

bool sync_finished(const Job& j) {
  return j.stop_voted || elastic::job_finished(j.progress, j.config.job.epochs, j.config.job.max_steps);
}

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

bool mid_step(const Job& j) {
  return j.mode == Mode::sync && j.ring && j.ring->step() == j.progress.step + 1 && !j.ring->done();
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
}  // namespace tepdist::actors::trainer_detail

// The sync driver: every step one ring all-reduce of [loss x samples, samples, stop votes, each
// rank's speed, gradient x samples] over the generation's workers, sent while the backward pass
// is still computing it where it can (job.ring_overlap); every worker divides the same sum
// the same way and steps its optimiser, so the replicas stay bit-identical. Progress is the job's,
// alike on every member: a position in the epoch's permutation, each step covering the next run
// of it, cut into the ranks' shares. The shares start equal in every generation and then follow
// the speeds in the sum ([elastic] balance, elastic/balance.hpp): every member computes them from
// the same numbers, so all agree without a message of their own.

#include "actors/roles/trainer/job.hpp"

namespace tepdist::actors::trainer_detail {
namespace {

class SyncDriver final : public Driver {
 public:
  const char* name() const override { return "sync"; }

  std::expected<void, std::string> setup(Trainer*, Job&) override { return {}; }

  void step(Trainer* self, Job& j) override {
    if (!may_step(j)) return;
    // A member that pulled the state of the job's last step (the others finished meanwhile) is done.
    if (finished(j)) return finish_job(self);
    // One step at a time: a step message left over from an earlier job or step finds the ring busy.
    if (mid_step(j)) return;
    // Between epochs of a job that pauses there: until a generation releases the next.
    if (hold_between_epochs(self, j, progress_.epoch)) return;
    const auto now = Clock::now();
    if (!j.first_step) j.first_step = j.window_start = now;
    float loss = 0;
    const uint64_t step = progress_.step + 1;
    const auto [begin, end] = elastic::sync_slice(progress_, j.data.train.size(), j.shares, j.rank);
    Overlap overlap{self, j, step, static_cast<float>(end - begin)};
    // A resident state (a device's) hands its gradient over whole: nothing to overlap.
    const bool overlapping = j.config.job.ring_overlap && j.ring->can_offer(step) && !j.resident;
    const auto computed = compute_positions(j, static_cast<int64_t>(progress_.epoch), begin, end,
                                            static_cast<int64_t>(step), loss,
                                            overlapping ? compute::GradientsReady(std::ref(overlap)) : nullptr);
    if (!computed) return fail_everywhere(self, computed.error());
    if (overlap.send_failed) return fail(self, *overlap.send_failed);
    if (const int64_t samples = *computed; samples > 0) {
      const auto count = static_cast<float>(samples);
      TEPDIST_CHECK(overlap.count == count);
      if (j.resident) j.resident->pull_gradients();  // the ring sums it on the host
      // What the backward pass handed to the ring is in the buffer already.
      if (overlap.written != j.elements()) {
        TEPDIST_CHECK(overlap.written == 0);
        overlap.weigh(0, j.elements());
      }
      j.buffer[loss_at] = loss * count;
      j.buffer[samples_at] = count;
      j.own_samples += static_cast<uint64_t>(samples);
    } else {
      std::fill(j.buffer.begin(), j.buffer.end(), 0.0f);  // a short last step: nothing for this rank
    }
    j.buffer[vote_at] = j.target_reached ? 1.0f : 0.0f;
    // This rank's speed in its own slot (the others' are zero, so the sum is exact everywhere).
    std::fill_n(j.buffer.begin() + static_cast<ptrdiff_t>(speeds_at), j.world, 0.0f);
    j.buffer[speeds_at + j.rank] = static_cast<float>(j.speed.speed());
    std::vector<gossip::RingChunk> out;
    j.ring->start(step, j.buffer, out);
    if (!send_ring(self, out)) return;
    j.waiting_since = j.progress_at = Clock::now();
    j.compute_seconds += seconds_between(now, j.waiting_since);
    if (j.ring->done()) finish_step(self, j);
  }

  bool mid_step(const Job& j) const override {
    return j.ring && j.ring->step() == progress_.step + 1 && !j.ring->done();
  }

  gossip::JobProgress progress(const Job&) const override { return progress_; }

  elastic::JobControl::Local local(const Job& j) const override { return {progress_, j.has_state}; }

  void add_status(const Job& j, const std::string&, gossip::JobStatus& st) const override {
    st.progress = progress_;
    for (const auto& w : j.start.workers) st.workers.emplace_back(w, progress_.position);
  }

  void ring_moved(Trainer* self, Job& j) override {
    if (j.ring->done() && !j.finishing && j.ring->step() == progress_.step + 1) finish_step(self, j);
  }

  const char* ring_wait(const Job&) const override { return "step"; }

  std::expected<void, std::string> enter(Trainer*, Job& j) override {
    const auto& r = j.start;
    if (j.has_state && progress_.step > r.resume.step)
      return std::unexpected(fmt::format("this worker is at step {}, past generation {}'s resume step {}",
                                         progress_.step, r.generation, r.resume.step));
    j.buffer.assign(gradient_at(j) + j.elements(), 0.0f);
    j.ring_bytes_early = 0;
    j.ring.emplace(gossip::collective::RingAllReduce::Options{r.job_id, j.rank, j.world, j.buffer.size(),
                                                              chunk_elements(j), r.resume.step});
    // Every generation starts from equal shares; the first sum's speeds move them.
    j.shares = elastic::equal_shares(global_batch(j), j.world);
    j.speeds.assign(j.world, 0.0);
    return {};
  }

  // Donors hold exactly the state at the resume step.
  bool behind(const Job& j) const override { return progress_.step < j.start.resume.step; }
  uint64_t pull_step(const Job& j) const override { return j.start.resume.step; }
  uint64_t serve_step(const Job&, uint64_t) const override { return progress_.step; }

  void pulled(Job& j) override {
    progress_ = j.start.resume;
    j.epoch = static_cast<int64_t>(progress_.epoch);
  }

  uint64_t samples_trained(const Job&) const override { return samples_; }
  uint64_t job_samples(const Job&) const override { return progress_.samples; }

  std::expected<void, std::string> resume(Job& j, const compute::TrainingState& state) override {
    const auto& at = *state.job;
    if (state.seed != j.config.job.seed)
      return std::unexpected(fmt::format("elastic.resume_from: {} was saved by a job with seed {}; this job's seed is {} "
                                         "(its epochs would walk another permutation)",
                                         j.config.elastic.resume_from, state.seed, j.config.job.seed));
    if (at.position > static_cast<uint64_t>(j.data.train.size()))
      return std::unexpected(fmt::format("elastic.resume_from: {} stands at position {} of an epoch of {} samples",
                                         j.config.elastic.resume_from, at.position, j.data.train.size()));
    progress_ = {static_cast<uint64_t>(state.step), static_cast<uint64_t>(state.epoch), at.position, at.samples};
    j.step = state.step;
    j.epoch = state.epoch;
    // The first generation resumes there: job control's record, and the check in enter().
    j.start.resume = progress_;
    j.checkpoints.resumed(state.step);
    node_events().info("job_resumed job={} from=\"{}\" step={} epoch={} position={}", j.start.job_id,
                       j.config.elastic.resume_from, state.step, state.epoch, at.position);
    return {};
  }

 private:
  // The ring's buffer: the step's own numbers first, then the weighted gradient. The gradient's
  // end (the last layers', which the backward pass finishes first) then fills whole chunks that
  // hold nothing else, and those go before the compute ends; the chunk with these numbers goes
  // with the first layers' gradients, which the backward finishes last anyway.
  static constexpr size_t loss_at = 0, samples_at = 1, vote_at = 2, speeds_at = 3;
  static size_t gradient_at(const Job& j) { return speeds_at + j.world; }

  /// Overlapping the ring with the backward pass: each layer's gradients, as the backward finishes
  /// them, are weighted into the buffer and offered to the ring, which sends every chunk they
  /// complete (gossip/collective/ring_allreduce.hpp). The divergence rule holds range by range:
  /// after a range that is not finite (weighted: what would be sent) nothing more is offered, and
  /// the step fails once the compute returns (check_finite_step over the whole gradient). A send
  /// that fails is kept for then too: the job cannot be let go from inside the compute.
  struct Overlap {
    Trainer* self;
    Job& j;
    uint64_t step;
    float count;  // this rank's samples in the step
    size_t written = 0;
    bool stopped = false;
    std::optional<std::string> send_failed{};
    std::vector<gossip::RingChunk> out{};

    /// Gradient elements [begin, end), times the samples, into the buffer; whether all are finite.
    bool weigh(size_t begin, size_t end) {
      const auto grads = j.model->gradients();
      float* to = j.buffer.data() + gradient_at(j);
      bool finite = true;
      for (size_t i = begin; i < end; ++i) {
        to[i] = grads[i] * count;
        finite &= std::isfinite(to[i]);
      }
      written += end - begin;
      return finite;
    }

    void operator()(size_t begin, size_t end) {
      const bool finite = weigh(begin, end);
      if (stopped || !finite) {
        stopped = true;
        return;
      }
      const size_t at = gradient_at(j);
      j.ring->offer(step, j.buffer, at + begin, at + end, out);
      if (out.empty()) return;
      // Early only if the compute goes on after it: the last range's chunks leave as it ends.
      if (written < j.elements())
        for (const auto& c : out) j.ring_bytes_early += c.chunk.data.size_bytes();
      send_failed = try_send_ring(self, out);
      stopped = send_failed.has_value();
      out.clear();
    }
  };

  static int64_t global_batch(const Job& j) { return static_cast<int64_t>(j.world) * j.config.data.batch_size; }

  /// Whether the job is over at the progress every member shares (or a stop vote was summed).
  bool finished(const Job& j) const {
    return stop_voted_ || elastic::job_finished(progress_, j.config.job.epochs, j.config.job.max_steps);
  }

  /// The ring summed everything: divide by the samples, step the optimiser, move on.
  void finish_step(Trainer* self, Job& j) {
    const double total = j.buffer[samples_at];
    const float inv = static_cast<float>(1.0 / total);
    auto grads = j.model->gradients();
    const float* sum = j.buffer.data() + gradient_at(j);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = sum[i] * inv;
    j.loss = j.buffer[loss_at] / total;
    if (j.resident) j.resident->push_gradients();
    optimizer_step(j, j.rate->at(progress_));
    progress_ = elastic::after_sync_step(progress_, j.data.train.size(), j.world, j.config.data.batch_size);
    j.step = static_cast<int64_t>(progress_.step);
    // A stop vote in the sum: every worker ends after this same step.
    if (j.buffer[vote_at] > 0) stop_voted_ = true;
    // The next step's shares, from the speeds every member now holds alike.
    j.speeds.assign(j.buffer.begin() + static_cast<ptrdiff_t>(speeds_at), j.buffer.begin() + static_cast<ptrdiff_t>(gradient_at(j)));
    if (j.config.elastic.balance)
      j.shares = elastic::sync_shares(j.shares, j.speeds, global_batch(j), j.config.elastic.balance_quantum);
    samples_ += static_cast<uint64_t>(total);
    j.window_samples += static_cast<uint64_t>(total);
    j.last_step_end = Clock::now();
    j.ring_seconds += seconds_between(j.waiting_since, j.last_step_end);
    count_step(self, j);
    const bool epoch_end = static_cast<int64_t>(progress_.epoch) != j.epoch;
    j.epoch = static_cast<int64_t>(progress_.epoch);
    note_first_step(j);
    const bool over = finished(j);
    if (j.rank == 0) maybe_checkpoint(j, over);
    if (j.rank == 0) {
      if (j.step % j.config.job.log_every_steps == 0 || over) {
        JobReport r = report_of(j, JobReport::Kind::progress);
        r.samples = progress_.samples;
        r.samples_per_second =
            static_cast<double>(j.window_samples) / std::max(1e-9, seconds_between(j.window_start, j.last_step_end));
        to_submitter(self, j, r);
        j.window_samples = 0;
        j.window_start = j.last_step_end;
      }
      const auto every = j.config.job.eval_every_steps;
      // The last step's model is evaluated by finish_job.
      if (!over && ((every > 0 && j.step % every == 0) || epoch_end)) evaluate_snapshot(self);
    }
    if (over) return finish_job(self);
    self->send(self, step_atom::value);
  }

  /// Rank 0, after a step: the job's state to disk when a checkpoint is due (and at the end). Every
  /// replica is the same, so this one part is a consistent cut. A failed write is logged, and the
  /// job goes on.
  void maybe_checkpoint(Job& j, bool over) {
    const auto now = Clock::now();
    if (!j.checkpoints.take(j.step, over)) return;
    compute::TrainingState state{j.step, static_cast<int64_t>(progress_.epoch), j.config.job.seed, {}};
    state.job = compute::TrainingState::Job{j.start.job_id,  j.generation,      "sync", progress_.position,
                                            progress_.samples, j.start.reference_batch};
    state.job->lr_factor = j.lr_factor();
    state_to_host(j);
    j.checkpoints.write(j, *j.model, j.opt(), state, now);
  }

  gossip::JobProgress progress_;  // the job's, alike on every member
  bool stop_voted_ = false;       // a stop vote was in the last sum
  uint64_t samples_ = 0;          // the cluster's samples this worker has stepped through
};

}  // namespace

std::unique_ptr<Driver> make_sync_driver() { return std::make_unique<SyncDriver>(); }

}  // namespace tepdist::actors::trainer_detail

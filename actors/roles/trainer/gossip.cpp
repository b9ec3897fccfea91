// The gossip driver: each worker trains its own replica through its own list of positions
// (elastic/progress.hpp), and every gossip_every local steps averages it with a random partner of
// the generation (gossip/collective/gossip_average.hpp); after its last local step one ring
// all-reduce of the replicas leaves every worker with the same average. On a change the rest of
// every list is re-split (job control), and what a dead worker never mixed counts as not consumed.

#include <limits>

#include "actors/roles/trainer/job.hpp"

namespace tepdist::actors::trainer_detail {
namespace {

class GossipDriver final : public Driver {
 public:
  const char* name() const override { return "gossip"; }

  std::expected<void, std::string> setup(Trainer*, Job& j) override {
    j.buffer.assign(j.elements() + 1, 0.0f);  // the replica, and this worker's vote to end (start_final_average)
    init_position_lists(j);
    return {};
  }

  /// A local step on this worker's replica, and now and then an averaging with a peer.
  void step(Trainer* self, Job& j) override {
    if (held_ && j.held && j.detached) held_ = final_average_ = j.held = false;  // nobody will release it: on it goes
    if (final_average_ || !may_step(j)) return;
    const auto batch = static_cast<uint64_t>(j.config.data.batch_size);
    const auto slice = elastic::next_slice(spans_, consumed_, batch);
    if (slice.count == 0 || j.step >= j.total_steps) return start_final_average(self, j);
    // A job that pauses between epochs: this worker's part of the released epochs is done. The
    // replicas are averaged as at the end, and the average is the model rank 0 hands over. Every
    // worker averages at every boundary past the released epochs, detached or not (it learns of
    // its submitter's end at its own time), so the rounds pair alike; a detached one goes on
    // after the average.
    if (j.config.job.pause_between_epochs && slice.epoch >= j.start.released_epochs && slice.epoch > averaged_) {
      held_ = true;
      held_epochs_ = averaged_ = slice.epoch;
      return start_final_average(self, j);
    }
    const auto now = Clock::now();
    if (!j.first_step) j.first_step = j.window_start = now;
    float loss = 0;
    const auto computed = compute_slice(j, slice, j.step + 1, loss);
    if (!computed) return fail_everywhere(self, computed.error());
    const int64_t samples = *computed;
    consumed_ += slice.count;
    j.epoch = static_cast<int64_t>(slice.epoch);
    if (samples > 0) optimizer_step(j, j.rate->at(rate_progress_at(j, pace_, consumed_ - slice.count)));
    if (averaging_->after_step()) {
      partner_ = averaging_->partner(random_());
      std::vector<gossip::GossipAverage> out;
      parameters_to_host(j);
      averaging_->begin(next_exchange_++, j.model->parameters(), out);
      for (auto& m : out) {
        m.generation = j.generation;
        m.consumed = consumed_;
        j.tensor_bytes += m.chunk.data.size_bytes();
        if (!send_to(self, j.start.addresses[partner_], std::move(m)))
          return fail(self, fmt::format("the send queue to worker {} is full; raise [cluster] send_queue_mb",
                                        j.start.workers[partner_]));
      }
    }
    j.compute_seconds += seconds_between(now, Clock::now());
    // The epoch is that of the next step's positions; the last step is the end of the list.
    const auto next = elastic::next_slice(spans_, consumed_, batch);
    const bool last = next.count == 0 || j.step + 1 >= j.total_steps;
    const bool epoch_end = next.epoch != static_cast<uint64_t>(j.epoch);
    if (epoch_end || last) note_epoch_part(j);
    if (last) j.epoch = static_cast<int64_t>(spans_.empty() ? 0 : spans_.back().epoch + 1);
    after_local_step(self, j, samples, loss, epoch_end, last);
    if (j.rank == 0 && !last && j.checkpoints.take(j.step, false)) checkpoint(j, now);
    self->send(self, step_atom::value);
  }

  gossip::JobProgress progress(const Job& j) const override { return local_progress(j); }
  gossip::JobProgress rate_progress(const Job& j) const override { return rate_progress_at(j, pace_, consumed_); }

  elastic::JobControl::Local local(const Job& j) const override {
    auto at = progress(j);
    at.position = consumed_;  // the cursor in this worker's list
    // Cursors count only in the generation they were measured in: the one the acks build on.
    const bool current = j.member && j.control && j.control->record().generation == j.generation;
    if (!current) return {.progress = at, .evaluations = evaluations_for_control(j)};
    return {.progress = at,
            .has_state = j.has_state,
            .cursors = {cursors_.begin(), cursors_.end()},
            .evaluations = evaluations_for_control(j)};
  }

  void add_status(const Job& j, const std::string& self_id, gossip::JobStatus& st) const override {
    const auto per_epoch = static_cast<uint64_t>(j.steps_per_epoch), step = static_cast<uint64_t>(j.step);
    st.progress = {step, per_epoch ? step / per_epoch : 0, consumed_, j.own_samples};
    for (const auto& w : j.start.workers) {
      if (w == self_id) st.workers.emplace_back(w, consumed_);
      else if (const auto it = cursors_.find(w); it != cursors_.end()) st.workers.emplace_back(w, it->second);
      else st.workers.emplace_back(w, 0);  // not heard from in this generation yet
    }
  }

  bool on_message(Trainer* self, Job& j, const std::string& peer, const gossip::Body& body) override {
    const auto* m = std::get_if<gossip::GossipAverage>(&body);
    if (!m) return false;
    if (m->job_id == j.start.job_id) on_average(self, j, peer, *m);
    return true;
  }

  bool on_control(Trainer* self, Job& j, const std::string& peer, const gossip::Control& c) override {
    return take_target_reached(self, j, peer, c);
  }

  void ring_moved(Trainer* self, Job& j) override {
    heard_final_ = true;
    if (j.ring->done() && final_average_ && !j.finishing) end_final_average(self, j);
  }

  // Workers end their local steps at different times, so the final average waits for the previous
  // worker without a limit until its first chunk comes (a dead one is membership's).
  const char* ring_wait(const Job&) const override {
    return final_average_ && heard_final_ ? "the final average after step" : nullptr;
  }

  bool ending(const Job&) const override { return final_average_ && !held_; }

  void keep_ending(Trainer* self, Job& j) override {
    if (j.rank == 0 && j.target_reached) tell_target_reached(self, j);  // should a message be lost
  }

  void on_target(Trainer* self, Job& j) override {
    tell_target_reached(self, j);
    stop_training(self, j);
  }

  /// At a hold whose average is still under way here when the release installs (the others have
  /// theirs, rank 0 handed it over, the program released): this worker's average is lost with
  /// the ring, but parameters the program set with the release are taken, as the others take them.
  std::optional<uint64_t> hold_reached(const Job& j) const override {
    if (final_average_ && held_ && !j.held) return held_epochs_;
    return std::nullopt;
  }

  /// Pairs only among this generation's workers; exchanges under way are over, and a final average
  /// under way starts again among them.
  std::expected<void, std::string> enter(Trainer*, Job& j) override {
    const auto& r = j.start;
    j.ring.emplace(gossip::collective::RingAllReduce::Options{r.job_id, j.rank, j.world, j.buffer.size(), chunk_elements(j)});
    const auto every = static_cast<uint64_t>(j.config.job.gossip_every);
    averaging_.emplace(gossip::collective::GossipAveraging::Options{
        r.job_id, j.rank, j.world, j.elements(), chunk_elements(j), every, std::max<uint64_t>(16, 4 * every)});
    random_.seed(j.config.job.seed * 1000003 + j.rank + r.generation * 7919);
    final_average_ = heard_final_ = held_ = false;
    rounds_ = averaged_ = 0;
    auto spans = worker_positions(j);
    if (!spans) return std::unexpected(spans.error());
    spans_ = std::move(*spans);
    consumed_ = 0;
    pace_ = job_pace(j);
    cursors_.clear();
    return {};
  }

  // Donors give their replica as it is (step 0: any).
  void left(Job&) override {
    cursors_.clear();  // they point into lists of a generation this worker is no longer in
    consumed_ = 0;
  }

  void add_counters(const Job&, JobReport& r) const override {
    if (averaging_) r.exchanges = averaging_->completed();  // the active side's count: each exchange once
  }

  std::expected<void, std::string> resume(Job& j, const compute::TrainingState& state) override {
    return resume_positions(j, state);
  }

 private:
  /// After the last local step: one ring all-reduce of the replicas; every worker ends with the
  /// same average. At a hold it is the epoch's model. The ring also sums a vote to end: a worker
  /// that ran out of steps (job.max_steps) or was told the target is reached ends the job, and
  /// one at a hold whose round another ends takes it for the end too, so all decide alike.
  void start_final_average(Trainer* self, Job& j) {
    final_average_ = true;
    averaging_->abandon();
    parameters_to_host(j);
    const auto params = j.model->parameters();
    std::copy(params.begin(), params.end(), j.buffer.begin());
    j.buffer.back() = held_ ? 0.0f : 1.0f;
    std::vector<gossip::RingChunk> out;
    // The rounds of one generation's ring, numbered in order (the ring takes them so): every
    // worker averages at the same boundaries (the holds, then the end), so the numbers agree.
    j.ring->start(++rounds_, j.buffer, out);
    if (!send_ring(self, out)) return;
    j.waiting_since = j.progress_at = Clock::now();
    if (j.ring->done()) end_final_average(self, j);
  }

  /// The ring has summed the replicas; every worker divides the same sum the same way.
  void end_final_average(Trainer* self, Job& j) {
    if (held_ && j.held) return;  // this hold's average is in already
    if (held_ && j.buffer.back() > 0.5f) {
      node_events().info("hold_ends_job job={} rank={} step={} reason=\"another worker's last step ended this round\"",
                         j.start.job_id, j.rank, j.step);
      held_ = false;
    }
    const auto p = host_parameters_to_write(j);
    const float inv = 1.0f / static_cast<float>(j.world);
    for (size_t i = 0; i < p.size(); ++i) p[i] = j.buffer[i] * inv;
    j.ring_seconds += seconds_between(j.waiting_since, Clock::now());
    j.last_eval_step = -1;  // the average is another model than the replica evaluated at this step
    if (held_) {
      // Held after the released epochs: rank 0 evaluates the average, then hands it over.
      heard_final_ = false;  // a chunk of another round is news again
      if (j.rank == 0) evaluate_snapshot(self);
      if (!hold_between_epochs(self, j, held_epochs_)) {  // released for good (detached): on it goes
        held_ = final_average_ = j.held = false;
        self->send(self, step_atom::value);
      }
      return;
    }
    if (j.rank == 0 && j.checkpoints.take(j.step, true)) checkpoint(j, Clock::now(), true);
    finish_job(self);  // rank 0 evaluates the average there
  }

  /// Rank 0: its replica (at the end, the final average) and optimiser, and the positions none of
  /// the workers is known to have consumed (the others' as far as their last mixing with rank 0
  /// said). What a worker trained since is partly in this replica already, through mixings: a
  /// resume trains those positions again, and skips none. The final checkpoint of a job that ran
  /// out of positions leaves nothing: with no job.max_steps and no stop at the target, every worker
  /// ended its steps because its list was empty, so a resume of the finished job evaluates and
  /// exports its model without training it again. (A job stopped by max_steps or at the target is
  /// resumed from the cursors, as sync is from its step.)
  void checkpoint(Job& j, Clock::time_point began, bool final = false) {
    auto cursors = cursors_;
    cursors[j.start.workers[j.rank]] = consumed_;
    compute::TrainingState state{j.step, j.epoch, j.config.job.seed, {}};
    state.job = compute::TrainingState::Job{j.start.job_id, j.generation, "gossip", 0, j.own_samples * j.world,
                                            j.start.reference_batch};
    state.job->lr_factor = j.lr_factor();
    if (final && j.config.job.max_steps <= 0 && !j.target_reached)
      for (const auto& w : j.start.workers) cursors[w] = std::numeric_limits<uint64_t>::max();
    set_unconsumed(j, cursors, state);
    state_to_host(j);
    j.checkpoints.write(j, *j.model, j.opt(), state, began);
  }

  void on_average(Trainer* self, Job& j, const std::string& peer, const gossip::GossipAverage& m) {
    const auto it = std::find(j.start.workers.begin(), j.start.workers.end(), peer);
    if (it == j.start.workers.end()) {
      node_events().warn("gossip_refused from={} reason=\"not a worker of job {}\"", peer, j.start.job_id);
      return;
    }
    const auto from = static_cast<uint32_t>(it - j.start.workers.begin());
    // Mixings happen within one generation, and not while this worker has promised the next: its
    // ack's cursors must stay what was mixed. Nor while it pulls its replica: a mixing would send
    // the half it has, and write over pieces already pulled.
    if (m.generation != j.generation || !j.member || (j.control && j.control->paused()) || !averaging_ ||
        !j.has_state || j.pulling)
      return;
    // What it had trained on when it sent this is in the mixing: counted, should it die.
    cursors_[peer] = std::max(cursors_[peer], m.consumed);
    if (m.reply) {
      if (from != partner_) {
        node_events().warn("gossip_refused from={} reason=\"not the partner of this exchange\"", peer);
        return;
      }
      if (auto ok = averaging_->on_reply(m, host_parameters_to_write(j)); !ok && !final_average_)
        node_events().warn("gossip_refused from={} reason=\"{}\"", peer, ok.error());
      return;
    }
    if (final_average_) return;  // the replicas are being averaged for good: no more pairs
    std::vector<gossip::GossipAverage> out;
    if (auto ok = averaging_->on_request(m, host_parameters_to_write(j), out); !ok) {
      node_events().warn("gossip_refused from={} reason=\"{}\"", peer, ok.error());
      return;
    }
    for (auto& r : out) {
      r.generation = j.generation;
      r.consumed = consumed_;
      j.tensor_bytes += r.chunk.data.size_bytes();
      send_to(self, j.start.addresses[from], std::move(r));
    }
  }

  // This worker's positions, how far it is through them, and how far the others were when they
  // last mixed with it (for the next re-split, should one be gone).
  elastic::Spans spans_;
  uint64_t consumed_ = 0;
  elastic::JobPace pace_;  // the job's progress from consumed_, for the rate
  std::map<std::string, uint64_t> cursors_;
  std::optional<gossip::collective::GossipAveraging> averaging_;
  std::mt19937_64 random_;
  uint64_t next_exchange_ = 1;
  uint32_t partner_ = 0;
  bool final_average_ = false;
  bool heard_final_ = false;  // a chunk of the final average came: the previous worker is done stepping
  bool held_ = false;         // the average under way (or done) is an epoch's hold, not the end (unless another ends it)
  uint64_t held_epochs_ = 0;  // the epochs done at that hold
  uint64_t rounds_ = 0;       // ring all-reduces started in this generation
  uint64_t averaged_ = 0;     // the last epoch boundary this worker averaged at in this generation
};

}  // namespace

std::unique_ptr<Driver> make_gossip_driver() { return std::make_unique<GossipDriver>(); }

}  // namespace tepdist::actors::trainer_detail

#include "actors/roles/trainer/job.hpp"

#include <csignal>

namespace tepdist::actors::trainer_detail {

bool send_to(Trainer* self, const std::string& address, gossip::Body body) {
  auto& o = self->state.o;
  gossip::Message m{o.self_id, o.incarnation, o.cluster_id, std::move(body)};
  // This node's own shards are served by its shard host, not over a connection to itself.
  if (address == o.self_address && std::holds_alternative<gossip::ShardUpdate>(m.body) && self->state.job)
    if (const auto host = self->state.job->driver->local_shards()) {
      self->send(host, wire_atom::value, o.self_id, o.self_address, std::move(m));
      return true;
    }
  const auto wait = send_wait(self->state);
  if (o.transport->send(address, m, wait)) return true;
  if (!o.transport->stopping())  // stopping: nothing goes out any more, and that is no queue's fault
    node_events().warn("send_refused peer={} reason=\"its send queue stayed full for {} ms\"", address, wait.count());
  return false;
}

std::chrono::milliseconds send_wait(const TrainerState& s) {
  if (!s.job) return std::chrono::seconds(2);
  const double quarter_ms = s.job->config.job.step_timeout_s * 250.0;
  return std::chrono::milliseconds(static_cast<int64_t>(std::clamp(quarter_ms, 100.0, 10000.0)));
}

bool submitter_live(const TrainerState& s, const std::string& submitter_id) {
  return std::any_of(s.view.begin(), s.view.end(),
                     [&](const gossip::Member& m) { return m.id == submitter_id && elastic::is_live(m); });
}

void to_submitter(Trainer* self, const Job& j, gossip::Body body) {
  if (!j.detached) send_to(self, j.start.submitter, std::move(body));
}

/// The generation's workers' speeds and shares as this worker knows them: sync, everyone's from the
/// last ring sum; async and gossip, only its own speed.
std::vector<gossip::WorkerLoad> loads_of(const Job& j) {
  std::vector<gossip::WorkerLoad> out;
  for (size_t r = 0; r < j.start.workers.size(); ++r) {
    gossip::WorkerLoad w{j.start.workers[r]};
    if (r < j.speeds.size()) w.samples_per_second = j.speeds[r];
    // Its own speed it always knows (sync: also before a generation's first sum).
    if (r == j.rank && w.samples_per_second <= 0) w.samples_per_second = j.speed.speed();
    if (r < j.shares.size()) w.share = static_cast<uint64_t>(j.shares[r]);
    out.push_back(std::move(w));
  }
  return out;
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
  r.generation = j.generation;
  if (kind == JobReport::Kind::progress || kind == JobReport::Kind::done) {
    if (j.rate && j.driver) r.lr = j.rate->at(j.driver->rate_progress(j));
    r.loads = loads_of(j);  // done: async and gossip workers' own speeds reach the result this way
  }
  // How it computed: where a resident state lives (a change of optimiser may have moved it to the
  // host), else the backend's path.
  if (kind == JobReport::Kind::done) r.compute = j.resident ? j.resident->where() : j.compute_path;
  return r;
}

gossip::JobStatus job_status(const Job& j, const std::string& self_id) {
  gossip::JobStatus st{j.start.job_id, j.driver->name(), j.generation, "training", {}};
  if (j.finishing) st.phase = "finished";
  else if (j.pulling) st.phase = "pulling";
  else if (!j.member) st.phase = "waiting";
  else if (j.control && j.control->paused())
    st.phase = j.control->stalled().empty() ? std::string("voting")
                                            : ("voting, stalled: " + j.control->stalled()).substr(0, 512);
  else if (j.held) st.phase = "held";
  j.driver->add_status(j, self_id, st);
  st.loads = loads_of(j);
  if (j.rate) st.lr = j.rate->at(j.driver->rate_progress(j));
  st.loss = j.loss;
  st.evaluations.assign(j.evaluations.begin(), j.evaluations.end());
  st.history.assign(j.history.begin(), j.history.end());
  st.generations.assign(j.marks.begin(), j.marks.end());
  return st;
}

void report_status(Trainer* self) {
  auto& s = self->state;
  caf::anon_send(s.router, status_atom::value,
                 s.job ? std::optional(job_status(*s.job, s.o.self_id)) : std::optional<gossip::JobStatus>());
}

void drop_job(Trainer* self, bool over) {
  auto& s = self->state;
  if (auto& job = s.job) {
    if (over) s.ended_jobs.insert(job->start.job_id);
    // kill, not user_shutdown: it must not work through queued evaluations of a job that is over.
    if (job->evaluator) self->send_exit(job->evaluator, caf::exit_reason::kill);
    job->driver->drop(self);
    // Whatever the handler under way holds of the job (a reference, the driver's `this`) stays
    // valid until it returns; the next message frees it.
    s.retired.push_back(std::move(job));
    self->send(self, retire_atom::value);
  }
  report_status(self);
  if (self->state.drain) on_drain(self);  // draining, and now no job: drained
}

void fail_everywhere(Trainer* self, const std::string& why) {
  auto& s = self->state;
  auto& j = *s.job;
  const std::string reason = why.substr(0, gossip::Control::max_reason);
  const gossip::Control stop{s.o.self_id, s.o.incarnation, gossip::Control::Command::stop_job, j.start.job_id,
                             std::vector<uint8_t>(reason.begin(), reason.end())};
  for (size_t i = 0; i < j.start.workers.size(); ++i)
    if (j.start.workers[i] != s.o.self_id) send_to(self, j.start.addresses[i], stop);
  fail(self, why);
}

void fail(Trainer* self, const std::string& why) {
  auto& j = *self->state.job;
  node_events().warn("job_failed job={} rank={} step={} reason=\"{}\"", j.start.job_id, j.rank, j.step, why);
  JobReport r = report_of(j, JobReport::Kind::failed);
  r.error = fmt::format("{}: {}", self->state.o.self_id, why);
  to_submitter(self, j, r);
  drop_job(self);
}

std::optional<std::string> try_send_ring(Trainer* self, std::vector<gossip::RingChunk>& out) {
  auto& j = *self->state.job;
  for (auto& c : out) {
    c.generation = j.generation;
    if (!send_to(self, j.next_address, std::move(c)))
      return fmt::format("the next worker ({}) took nothing for {} ms: its send queue stayed full", j.next_address,
                         send_wait(self->state).count());
  }
  return std::nullopt;
}

bool send_ring(Trainer* self, std::vector<gossip::RingChunk>& out) {
  if (auto why = try_send_ring(self, out)) {
    fail(self, *why);
    return false;
  }
  return true;
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
  if (!j.ring) return;  // no ring in this mode (async), or none entered yet
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
  j.driver->ring_moved(self, j);
}

void fail_start(Trainer* self, const gossip::JobStart& start, const std::string& why) {
  node_events().warn("job_refused job={} reason=\"{}\"", start.job_id, why);
  JobReport r;
  r.job_id = start.job_id;
  r.kind = JobReport::Kind::failed;
  r.error = fmt::format("{}: {}", self->state.o.self_id, why);
  r.generation = start.generation;
  send_to(self, start.submitter, r);
}

std::string save_detached(const TrainerState& s, const Job& j, const JobReport& r) {
  std::filesystem::path dir = std::filesystem::path(s.o.results_dir) / std::to_string(j.start.job_id);
  std::error_code ec;
  for (int k = 2; std::filesystem::exists(dir, ec) && k < 1000; ++k)  // never over an earlier result
    dir = std::filesystem::path(s.o.results_dir) / fmt::format("{}-{}", j.start.job_id, k);
  std::filesystem::create_directories(dir, ec);
  if (ec) return fmt::format("not saved: cannot create {}: {}", dir.string(), ec.message());
  if (auto ok = compute::export_safetensors(dir / "model.safetensors", *j.model); !ok)
    return fmt::format("not saved: {}", ok.error().message);
  const std::string result = fmt::format(
      "{{\n  \"job_id\": {},\n  \"mode\": \"{}\",\n  \"generation\": {},\n  \"workers\": {},\n  \"steps\": {},\n"
      "  \"epochs\": {},\n  \"test_accuracy\": {},\n  \"test_loss\": {},\n  \"train_seconds\": {},\n"
      "  \"parameter_checksum\": \"{:016x}\",\n  \"submitter\": \"gone; saved by {}\"\n}}\n",
      j.start.job_id, j.driver->name(), j.generation, j.world, j.step, j.epoch, r.test_accuracy, r.test_loss,
      r.train_seconds, r.checksum, s.o.self_id);
  if (auto ok = compute::write_file_atomically(dir / "result.json", result); !ok)
    return fmt::format("not saved: {}", ok.error().message);
  return (dir / "model.safetensors").string();
}

bool send_model(Trainer* self) {
  auto& j = *self->state.job;
  parameters_to_host(j);
  const auto params = j.model->parameters();
  auto copy = std::make_shared<const std::vector<float>>(params.begin(), params.end());
  constexpr size_t piece = 1u << 20;  // elements per frame: 4 MiB, well inside the frame limit
  for (size_t off = 0; off < copy->size() && !j.detached; off += piece) {
    const std::span<const float> data(copy->data() + off, std::min(piece, copy->size() - off));
    if (!send_to(self, j.start.submitter,
                 gossip::ParamPush{0, static_cast<uint64_t>(j.step),
                                   gossip::TensorChunk{static_cast<uint64_t>(j.step), 0, off, copy->size(), data, copy}})) {
      fail(self, "the model does not fit the send queue to the submitter; raise [cluster] send_queue_mb");
      return false;
    }
  }
  return true;
}

void report_held(Trainer* self) {
  auto& j = *self->state.job;
  if (!send_model(self)) return;
  j.held_reported = true;
  to_submitter(self, j, held_report(j));
}

JobReport held_report(const Job& j) {
  JobReport r = report_of(j, JobReport::Kind::held);
  r.epoch = static_cast<uint32_t>(j.held_epochs);
  r.samples = j.driver->job_samples(j);
  r.test_accuracy = j.last_accuracy;
  r.test_loss = j.last_test_loss;
  r.eval_seconds = j.eval_seconds;
  return r;
}

bool hold_between_epochs(Trainer* self, Job& j, uint64_t epochs_done) {
  // A job whose submitter is gone is released for good: it trains on to its end, detached.
  const bool hold = j.config.job.pause_between_epochs && !j.detached && epochs_done >= j.start.released_epochs;
  if (hold && !j.held) {
    node_events().info("epoch_hold job={} step={} epochs_done={} released={}", j.start.job_id, j.step, epochs_done,
                       j.start.released_epochs);
    j.held = true;
    j.held_epochs = epochs_done;
    j.held_ticks = 0;
    j.held_reported = false;
    // Rank 0 sends the model and says so, after the epoch's evaluation if one is under way.
    if (j.rank == 0 && j.pending_evals == 0) report_held(self);
  } else if (!hold && j.held) {
    node_events().info("epoch_hold_ended job={} step={} released={}", j.start.job_id, j.step, j.start.released_epochs);
    j.held = false;
  }
  if (hold) j.progress_at = Clock::now();
  return hold;
}

void complete_rank0(Trainer* self) {
  auto& j = *self->state.job;
  // At the end, a submitter this view does not hold live is gone, even if this node never saw it
  // leave (a joiner after membership forgot it, a restarted trainer): the result stays here.
  if (!j.detached && !submitter_live(self->state, j.start.submitter_id)) {
    j.detached = true;
    node_events().info("job_detached job={} reason=\"the submitter {} is not live in this view at the end\"",
                       j.start.job_id, j.start.submitter_id);
  }
  if (self->state.die_before_complete) {
    node_events().warn("fault_injected id={} what=\"rank 0 dies before it completes job {}\"", self->state.o.self_id,
                       j.start.job_id);
    std::raise(SIGKILL);
  }
  if (!send_model(self)) return;
  parameters_to_host(j);
  const auto params = j.model->parameters();
  JobReport r = report_of(j, JobReport::Kind::done);
  r.samples = j.own_samples;
  r.bytes_sent = j.bytes_sent();
  r.checksum = checksum(params);
  j.driver->add_counters(j, r);
  r.test_accuracy = j.last_accuracy;
  r.test_loss = j.last_test_loss;
  r.eval_seconds = j.eval_seconds;
  r.samples_per_second =
      r.train_seconds > 0 ? static_cast<double>(j.driver->samples_trained(j)) / r.train_seconds : 0.0;
  to_submitter(self, j, r);
  // The others kept the job in case this worker died before the line above: it is complete. To
  // the workers of the generation it ends, and of one job control installed or promised since.
  const gossip::Control complete{self->state.o.self_id, self->state.o.incarnation, gossip::Control::Command::job_complete,
                                 j.start.job_id, {}};
  std::set<std::string> told{self->state.o.self_id};
  const gossip::JobStart* records[] = {&j.start, j.control ? &j.control->record() : nullptr};
  for (const auto* record : records)
    if (record)
      for (size_t i = 0; i < record->workers.size() && i < record->addresses.size(); ++i)
        if (told.insert(record->workers[i]).second) send_to(self, record->addresses[i], complete);
  const std::string saved = j.detached ? save_detached(self->state, j, r) : std::string("-");
  node_events().info("job_done job={} mode={} rank=0 steps={} checksum={:016x} compute_s={:.2f} wait_s={:.2f} "
                     "ring_early={:.2f} test_accuracy={:.4f} saved=\"{}\"",
                     j.start.job_id, j.driver->name(), j.step, r.checksum, j.compute_seconds, j.ring_seconds,
                     j.ring_early(), r.test_accuracy, saved);
  drop_job(self);
}

void finish_job(Trainer* self) {
  auto& j = *self->state.job;
  j.finishing = true;
  if (j.rank == 0) {
    // The one place the model the job ends with is evaluated (every mode, and a job resumed at its
    // end, which took no step); a step already evaluated is not evaluated again.
    evaluate_snapshot(self);
    if (j.pending_evals == 0) complete_rank0(self);
    return;
  }
  JobReport r = report_of(j, JobReport::Kind::done);
  r.samples = j.own_samples;
  r.bytes_sent = j.bytes_sent();
  parameters_to_host(j);
  r.checksum = checksum(j.model->parameters());
  j.driver->add_counters(j, r);
  to_submitter(self, j, r);
  node_events().info("job_done job={} mode={} rank={} steps={} checksum={:016x} compute_s={:.2f} wait_s={:.2f} "
                     "ring_early={:.2f}",
                     j.start.job_id, j.driver->name(), j.rank, j.step, r.checksum, j.compute_seconds, j.ring_seconds,
                     j.ring_early());
  // Kept until rank 0 completes: should it die first, job control makes a generation of the rest
  // (and of its restart), whose rank 0 ends the job again from the state they hold.
  j.done_at = Clock::now();
  if (j.completed_at != Clock::time_point{}) return release_done_job(self, "rank 0 completed the job");
  if (self->state.drain) on_drain(self);  // a drain does not wait for it
}

void release_done_job(Trainer* self, const char* why) {
  auto& j = *self->state.job;
  node_events().info("job_released job={} generation={} reason=\"{}\"", j.start.job_id, j.generation, why);
  drop_job(self);
}

void note_first_step(Job& j) {
  if (j.stepped_in_generation) return;
  j.stepped_in_generation = true;
  node_events().info("generation_first_step job={} generation={} step={}", j.start.job_id, j.generation, j.step);
}

namespace {

/// Epoch `epoch`'s permutation of the training samples into j.order (kept until the epoch changes).
void order_for_epoch(Job& j, int64_t epoch) {
  if (epoch == j.order_epoch) return;
  const int64_t n = j.data.train.size();
  if (j.config.data.shuffle) {
    j.order = compute::shuffled_indices(n, j.config.job.seed, epoch);
  } else {
    j.order.resize(static_cast<size_t>(n));
    std::iota(j.order.begin(), j.order.end(), 0);
  }
  j.order_epoch = epoch;
}


/// The gradient of samples `idx` (at least one) into the model's gradients, its loss into `loss`;
/// the samples, or why the step cannot go on, naming it. `ready`: as compute::try_compute_gradients.
std::expected<int64_t, std::string> gradient_of(Job& j, std::span<const int64_t> idx, int64_t step, float& loss,
                                                const compute::GradientsReady& ready = {}) {
  const auto began = Clock::now();
  // [compute] slowdown, the emulated slower node: this thread is held as a slower CPU would hold
  // it, the computing so far taking `slowdown` times as long. Held before each layer's gradients
  // are handed on, and at the end, so what leaves the worker leaves when a slower CPU's would.
  // What `ready` does with them (sending, which may wait on a full queue) is not computing: it is
  // not stretched. Computing is counted in this thread's CPU time where the kernels run on it
  // alone (compute.threads = 1, a host backend): time it spent off its core, while other threads
  // ran (another node's compute, the transports), would not grow on a slower CPU, so it is not
  // stretched either. With more kernel threads, or a device's, their time is not this thread's:
  // wall time is counted.
  const bool cpu_clock = j.config.compute.threads == 1 && j.backend->name() != "cuda";
  const double clock0 = cpu_clock ? thread_cpu_seconds() : 0.0;
  const auto clock = [&] { return cpu_clock ? thread_cpu_seconds() - clock0 : seconds_between(began, Clock::now()); };
  double held = 0, handing = 0;  // seconds slept; the clock's seconds spent in `ready`
  const auto hold = [&] {
    if (j.slowdown <= 1) return;
    const double computing = clock() - handing - (cpu_clock ? 0.0 : held);
    const double wait = (j.slowdown - 1) * computing - held;
    if (wait <= 0) return;
    const auto now = Clock::now();
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    held += seconds_between(now, Clock::now());  // what was slept, oversleeping included
  };
  compute::GradientsReady paced;
  if (ready) {
    paced = [&](size_t begin, size_t end) {
      hold();
      const double from = clock();
      ready(begin, end);
      handing += clock() - from;
    };
  }
  compute::gather_batch(j.data.train, idx, j.x, j.y);
  // A resident state computes where it lives, on the parameters with the host's writes, and keeps
  // the gradient there (no `ready`: sync's ring pulls it whole, a copy for the ring, so outside the
  // step's measured and stretched compute).
  TEPDIST_CHECK(!j.resident || !ready);
  if (j.resident) parameters_to_device(j);
  const auto computed = j.resident ? j.resident->compute_gradients(j.x, j.y)
                                   : compute::try_compute_gradients(*j.model, *j.backend, j.x, j.y, j.scratch, paced);
  if (!computed) return std::unexpected(fmt::format("step {}: {}", step, computed.error().message));
  hold();
  j.speed.add(static_cast<int64_t>(idx.size()), seconds_between(began, Clock::now()));
  loss = *computed;
  // The divergence rule, every mode alike: nothing of a step that is not finite leaves the worker
  // (a ring sum, a mixing, a push) or steps an optimiser. A resident gradient is checked where it
  // lives; one that is not finite comes to the host, so the error names its first bad element.
  if (j.resident && std::isfinite(loss) && j.resident->gradient_finite()) return static_cast<int64_t>(idx.size());
  if (j.resident) j.resident->pull_gradients();
  if (auto ok = compute::check_finite_step(step, loss, j.model->gradients()); !ok)
    return std::unexpected(ok.error().message);
  return static_cast<int64_t>(idx.size());
}

}  // namespace

std::expected<int64_t, std::string> compute_positions(Job& j, int64_t epoch, int64_t begin, int64_t end, int64_t step,
                                                      float& loss, const compute::GradientsReady& ready) {
  order_for_epoch(j, epoch);
  if (end <= begin) return 0;
  return gradient_of(j, std::span<const int64_t>(j.order.data() + begin, static_cast<size_t>(end - begin)), step, loss,
                     ready);
}

void init_position_lists(Job& j) {
  if (j.start.spans.empty())
    for (const auto& list : elastic::initial_spans(j.data.train.size(), j.config.job.epochs, j.world))
      j.start.spans.push_back(elastic::triples_of(list));
  j.total_steps = j.config.job.max_steps > 0 ? j.config.job.max_steps : std::numeric_limits<int64_t>::max();
}

std::expected<elastic::Spans, std::string> worker_positions(const Job& j) {
  const auto& r = j.start;
  auto spans = j.rank < r.spans.size() ? elastic::spans_of(r.spans[j.rank]) : elastic::Spans{};
  for (const auto& span : spans)
    if (span.end > static_cast<uint64_t>(j.data.train.size()) || span.epoch >= static_cast<uint64_t>(j.config.job.epochs))
      return std::unexpected(fmt::format("generation {} gives this worker positions [{}, {}) of epoch {}, outside the "
                                         "job's {} samples and {} epochs",
                                         r.generation, span.begin, span.end, span.epoch, j.data.train.size(),
                                         j.config.job.epochs));
  return spans;
}

gossip::JobProgress local_progress(const Job& j) {
  const auto step = static_cast<uint64_t>(j.step), per_epoch = static_cast<uint64_t>(j.steps_per_epoch);
  const uint64_t reference = j.start.reference_batch;
  return {step, per_epoch ? step / per_epoch : 0, per_epoch ? step % per_epoch * reference : 0, step * reference};
}

gossip::JobProgress rate_progress_at(const Job& j, const elastic::JobPace& pace, uint64_t consumed) {
  // With max_steps, the job ends at a count of local steps, and the schedule with it.
  return j.config.job.max_steps > 0 ? local_progress(j) : pace.at(consumed);
}

elastic::JobPace job_pace(const Job& j) {
  return {j.start.spans, j.rank, static_cast<int64_t>(j.data.train.size()), j.config.job.epochs,
          j.start.reference_batch, j.start.resume};
}

std::expected<int64_t, std::string> compute_slice(Job& j, const elastic::StepSlice& slice, int64_t step, float& loss) {
  if (slice.count == 0) return 0;
  order_for_epoch(j, static_cast<int64_t>(slice.epoch));
  std::vector<int64_t> idx;
  idx.reserve(slice.count);
  for (const auto& [begin, end] : slice.pieces)
    idx.insert(idx.end(), j.order.begin() + static_cast<ptrdiff_t>(begin), j.order.begin() + static_cast<ptrdiff_t>(end));
  return gradient_of(j, idx, step, loss);
}

bool may_step(const Job& j) {
  return !j.control || (j.member && !j.control->paused() && !j.pulling && j.has_state);
}

void note_epoch_part(const Job& j) {
  node_events().info("epoch_part_done job={} epoch={} generation={} samples={}", j.start.job_id, j.epoch, j.generation,
                     j.own_samples);
}

void count_step(Trainer* self, Job& j) {
  // The router's copy of the job (status answers, /status) follows the steps, a few times a second.
  if (j.last_step_end - j.status_at >= std::chrono::milliseconds(250)) {
    j.status_at = j.last_step_end;
    report_status(self);
  }
  // About a point a second of the job's course for the status (and the dashboard's charts).
  const uint64_t trained = j.driver->samples_trained(j);
  if (j.history_at == Clock::time_point{}) {
    j.history_at = j.last_step_end;
    j.history_samples = trained;
  } else if (const double dt = seconds_between(j.history_at, j.last_step_end); dt >= 1.0) {
    const double rate = trained > j.history_samples ? static_cast<double>(trained - j.history_samples) / dt : 0.0;
    j.history.push_back({static_cast<uint64_t>(j.step), j.train_seconds(), j.loss, rate,
                         j.rate ? j.rate->at(j.driver->rate_progress(j)) : 0.0});
    while (j.history.size() > Job::history_points) j.history.pop_front();
    j.history_at = j.last_step_end;
    j.history_samples = trained;
  }
  auto& f = j.figures;
  if (!f.steps) return;
  f.steps->add();
  if (j.own_samples > j.figures_samples) f.samples->add(j.own_samples - j.figures_samples);
  j.figures_samples = j.own_samples;
  f.loss->set(j.loss);
  if (j.rate && j.driver) f.lr->set(j.rate->at(j.driver->rate_progress(j)));
  f.speed->set(j.speed.speed());
  if (f.share && j.rank < j.shares.size()) f.share->set(static_cast<double>(j.shares[j.rank]));
  f.generation->set(static_cast<double>(j.generation));
  // The time from the end of the last step counted: compute, the wait for the others, the update.
  if (j.figures_at != Clock::time_point{} && j.figures_at <= j.last_step_end)
    f.step_seconds->observe(seconds_between(j.figures_at, j.last_step_end));
  j.figures_at = j.last_step_end;
}

void after_local_step(Trainer* self, Job& j, int64_t samples, float loss, bool epoch_end, bool last) {
  ++j.step;
  note_first_step(j);
  j.own_samples += static_cast<uint64_t>(samples);
  j.window_samples += static_cast<uint64_t>(samples);
  j.loss = loss;
  j.last_step_end = Clock::now();
  count_step(self, j);
  if (j.rank != 0) return;
  if (j.step % j.config.job.log_every_steps == 0 || last) {
    JobReport r = report_of(j, JobReport::Kind::progress);
    r.samples = j.driver->job_samples(j);
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

elastic::JobControl::Local::Evaluations evaluations_for_control(const Job& j) {
  if (j.rank != 0) return {};
  const auto& load = j.eval_load;
  elastic::JobControl::Local::Evaluations e{load.busy_s * 1000, load.busy_samples, load.cost_s * 1000};
  if (j.pending_evals > 0) {  // the one under way, so far
    e.under_way_ms = std::max(1e-3, seconds_between(load.began, Clock::now()) * 1000);
    e.busy_ms += e.under_way_ms;
    e.busy_positions += j.own_samples - load.began_samples;
  }
  e.at_epoch_ends = true;  // after_local_step
  e.every = static_cast<uint64_t>(std::max<int64_t>(0, j.config.job.eval_every_steps) * j.config.data.batch_size);
  return e;
}

namespace {

/// JobStart::optimizer's lines as config overrides; each must set an [optimizer] key.
std::expected<std::vector<std::string>, std::string> optimizer_lines(const std::string& text) {
  std::vector<std::string> out;
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size());
    std::string line = text.substr(at, end - at);
    at = end + 1;
    if (line.empty()) continue;
    if (!line.starts_with("optimizer."))
      return std::unexpected(fmt::format("the job's optimiser sets \"{}\", which is not an [optimizer] key", line));
    out.push_back(std::move(line));
  }
  return out;
}

/// The schedule and the rate policy over it, from the job's config (its length known).
std::expected<void, std::string> make_rate(Job& j) {
  const auto reference = static_cast<int64_t>(j.start.reference_batch);
  compute::ScheduleOptions schedule = j.config.optimizer.schedule;
  schedule.total_steps = j.total_steps;
  auto made = compute::LrSchedule::make(schedule);
  if (!made) return std::unexpected(made.error().message);
  j.schedule = *made;
  j.rate.emplace(*made, elastic::RatePolicy::for_mode(j.config.job.mode, j.config.optimizer.scaling_rule(),
                                                     j.data.train.size(), reference, j.config.elastic.rescale_batches));
  return {};
}

}  // namespace

/// Makes `resident` (made for the model and the optimiser the config now names) the job's state:
/// it takes the host optimiser's buffers and count, and the host's copy, which must be current.
void adopt_resident(Job& j, std::unique_ptr<compute::ResidentState> resident) {
  TEPDIST_CHECK(resident && j.optimizer);
  const bool carried = compute::carry_state(*j.optimizer, resident->optimizer());  // the same options
  TEPDIST_CHECK(carried);
  j.resident = std::move(resident);
  j.optimizer.reset();
  state_from_host(j);
}

std::expected<void, std::string> change_optimizer(Job& j) {
  const auto& r = j.start;
  auto lines = optimizer_lines(r.optimizer);
  if (!lines) return std::unexpected(lines.error());
  auto config = elastic::parse_config(r.config, fmt::format("job {}'s optimiser", r.job_id), *lines);
  if (!config) return std::unexpected(config.error().message);
  auto made = compute::make_optimizer(config->optimizer.options, j.elements());
  if (!made) return std::unexpected(made.error().message);
  // The same buffers keep their state (momentum, Adam's moments) and step count; others start afresh.
  state_to_host(j);
  compute::carry_state(j.opt(), **made);
  const auto old_config = j.config.optimizer;
  j.config.optimizer = config->optimizer;
  if (auto ok = make_rate(j); !ok) {
    j.config.optimizer = old_config;
    return ok;
  }
  j.optimizer = std::move(*made);
  if (j.resident) {
    // A resident state is made anew for the new optimiser from the host's copy, the old one freed
    // first (a device need not hold both). Should that fail, the job goes on with its state on
    // the host, the backend computing on it, as gossip and async do.
    j.resident.reset();
    auto remade = j.backend->make_resident(*j.model, j.config.optimizer.options);
    if (remade && *remade) {
      adopt_resident(j, std::move(*remade));
    } else {
      node_events().warn("training_state job={} where=\"host memory\" reason=\"{}\"", r.job_id,
                         remade ? "the backend made no state of its own" : remade.error().message);
    }
  }
  j.optimizer_applied = r.optimizer;
  node_events().info("optimizer_changed job={} generation={} optimizer={} lr={}", r.job_id, r.generation,
                     j.opt().name(), j.config.optimizer.schedule.base_lr);
  return {};
}

std::expected<void, std::string> setup(Trainer* self, Job& j) {
  auto& o = self->state.o;
  // A joiner of a job whose optimiser a release changed: the record carries it over the config.
  auto lines = optimizer_lines(j.start.optimizer);
  if (!lines) return std::unexpected(lines.error());
  auto config =
      elastic::parse_config(j.start.config, fmt::format("job {} from {}", j.start.job_id, j.start.submitter), *lines);
  j.optimizer_applied = j.start.optimizer;
  if (!config) return std::unexpected(config.error().message);
  j.config = std::move(*config);
  if (o.threads > 0) j.config.compute.threads = o.threads;
  if (o.device >= 0) j.config.compute.device = o.device;
  // The job's files where this node has them (prepare_job: fetched from the submitter, if need be).
  if (const auto& s = self->state; s.local_files_job == j.start.job_id)
    elastic::use_local_files(j.config, j.start.files, s.local_files);
  auto data = elastic::load_job_data(j.config.data, j.config.job.seed);
  if (!data) return std::unexpected(data.error().message);
  j.data = std::move(*data);
  auto model = elastic::build_job_model(j.config, j.data.train);
  if (!model) return std::unexpected(model.error().message);
  j.model = std::move(*model);
  auto backend = compute::make_backend(j.config.compute.backend, elastic::backend_options(j.config));
  if (!backend) return std::unexpected(backend.error().message);
  // A layer the backend cannot run where it computes is refused here, never run on the host quietly.
  if (auto ok = (*backend)->check_layers(j.model->planned_layers(1)); !ok) return std::unexpected(ok.error().message);
  j.backend = std::move(*backend);
  j.backend->set_threads(static_cast<int>(j.config.compute.threads));
  auto optimizer = compute::make_optimizer(j.config.optimizer.options, j.elements());
  if (!optimizer) return std::unexpected(optimizer.error().message);
  j.optimizer = std::move(*optimizer);
  // A job resumed from a checkpoint (tepdist run --resume): every worker of its first generation
  // reads the same file, so all start from the same state. Joiners of later generations pull the
  // state from the donors as always.
  std::optional<compute::TrainingState> resumed;
  if (const auto& from = j.config.elastic.resume_from; !from.empty() && j.start.generation <= 1) {
    auto state = compute::load_checkpoint(from, *j.model, *j.optimizer);
    if (!state) return std::unexpected(fmt::format("elastic.resume_from: {}", state.error().message));
    if (!state->job)
      return std::unexpected(fmt::format("elastic.resume_from: {} is a checkpoint of `tepdist train`, not of a cluster "
                                         "job (resume it with `tepdist train --resume`)",
                                         from));
    if (state->job->mode != j.config.job.mode)
      return std::unexpected(fmt::format("elastic.resume_from: {} holds a {} job; this job's mode is {}", from,
                                         state->job->mode, j.config.job.mode));
    j.start.reference_batch = state->job->reference_batch;
    resumed = std::move(*state);
  }
  // Epochs are counted in reference batches (the first generation's global batch), so the job's
  // length and its schedule keep their meaning when the number of workers changes.
  const int64_t batch = j.config.data.batch_size;
  // The first generation's workers all compute it alike (a resumed job: the checkpoint's); later
  // records carry it.
  // [optimizer] reference_batch, else the first generation's global batch.
  if (j.start.reference_batch == 0)
    j.start.reference_batch = j.config.optimizer.reference_batch > 0
                                  ? static_cast<uint64_t>(j.config.optimizer.reference_batch)
                                  : static_cast<uint64_t>(j.world) * static_cast<uint64_t>(batch);
  const auto reference = static_cast<int64_t>(j.start.reference_batch);
  j.steps_per_epoch = elastic::sync_steps_per_epoch(j.data.train.size(), 1, reference);
  j.total_steps = j.steps_per_epoch * j.config.job.epochs;
  if (j.config.job.max_steps > 0) j.total_steps = std::min(j.total_steps, j.config.job.max_steps);
  if (auto ok = make_rate(j); !ok) return ok;
  j.plateau.emplace(elastic::PlateauPolicy::Options{j.config.optimizer.plateau_patience, j.config.optimizer.plateau_factor});
  if (j.config.job.ring_chunk_kb + 64 > o.max_frame_kb)
    return std::unexpected(fmt::format("job.ring_chunk_kb = {} does not fit this node's frames ([cluster] max_frame_mb "
                                       "= {})",
                                       j.config.job.ring_chunk_kb, o.max_frame_kb / 1024));
  j.checkpoints.setup(o.results_dir, j);
  j.slowdown = o.slowdown;
  if (o.metrics) {
    const gossip::Labels l{{"mode", j.config.job.mode}};  // node: the registry's common label
    auto& m = *o.metrics;
    j.figures = {&m.counter("tepdist_train_steps_total", l, "training steps this worker finished"),
                 &m.counter("tepdist_train_samples_total", l, "samples this worker trained on"),
                 &m.gauge("tepdist_train_loss", l, "training loss of this worker's last step (sync: the job's)"),
                 &m.gauge("tepdist_learning_rate", l, "the learning rate in effect (sync: for the next step)"),
                 &m.gauge("tepdist_worker_samples_per_second", l,
                          "this worker's measured speed: samples over compute time, a median of recent steps"),
                 j.config.job.mode == "sync"
                     ? &m.gauge("tepdist_worker_share", l, "this worker's samples of the next step's global batch")
                     : nullptr,
                 &m.gauge("tepdist_job_generation", l, "the generation this worker trains in"),
                 &m.histogram("tepdist_train_step_seconds", l, "from the end of one step to the end of the next",
                              {0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10})};
    if (j.config.job.mode == "async") {
      j.figures.staleness = &m.histogram("tepdist_async_push_staleness", l,
                                         "versions a shard moved on between the values a push of this worker was "
                                         "computed on and its apply",
                                         {0, 1, 2, 4, 8, 16, 32, 64, 128});
      j.figures.metrics = &m;  // the recent mean's gauge is made at the first answer: none is none yet
    }
  }
  // Sync and gossip keep the training state where the backend keeps it (a device's memory; or
  // emulated, [compute] emulate_device): each step sync's ring needs only the gradient on the host,
  // gossip's local steps nothing, its mixings the parameters. Async's parameters are its shards',
  // pulled and pushed over the wire every step, so its state stays on the host, the backend
  // computing on it.
  if (j.config.job.mode == "sync" || j.config.job.mode == "gossip") {
    auto resident = j.backend->make_resident(*j.model, j.config.optimizer.options);
    if (!resident) return std::unexpected(resident.error().message);
    if (*resident) {
      adopt_resident(j, std::move(*resident));  // with a checkpoint's state, resumed above
      node_events().info("training_state job={} where=\"{}\"", j.start.job_id, j.resident->where());
    }
  }
  // The mode's own set-up comes last: async's registers its shard host, which takes updates from then on.
  const auto& mode = j.config.job.mode;
  if (mode == "sync") j.driver = make_sync_driver();
  else if (mode == "gossip") j.driver = make_gossip_driver();
  else if (mode == "async") j.driver = make_async_driver();
  else return std::unexpected(fmt::format("job.mode = \"{}\" is not a cluster mode (sync, async or gossip)", mode));
  if (auto ok = j.driver->setup(self, j); !ok) return ok;
  if (resumed) {
    if (auto ok = j.driver->resume(j, *resumed); !ok) return ok;
    // The plateau decays the checkpoint was cut under: every worker of the first generation reads
    // the same file; the duty holder's control carries it into the records from then on.
    if (resumed->job && resumed->job->lr_factor < 1) {
      j.resumed_factor = j.decided_factor = resumed->job->lr_factor;
      j.rate->set_factor(j.resumed_factor);
    }
  }
  return {};
}

void Checkpoints::setup(const std::string& results_dir, const Job& j) {
  const auto& e = j.config.elastic;
  policy_.emplace(e.checkpoint_every_steps, e.checkpoint_every_s);
  dir_ = !e.checkpoint_dir.empty() ? std::filesystem::path(e.checkpoint_dir)
                                   : std::filesystem::path(results_dir) / std::to_string(j.start.job_id) / "checkpoints";
}

bool Checkpoints::take(int64_t step, bool over) {
  const double now_s = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  if (!enabled() || !(policy_->due(step, now_s) || over)) return false;
  policy_->taken(step, now_s);
  return true;
}

void Checkpoints::resumed(int64_t step) {
  if (policy_) policy_->taken(step, std::chrono::duration<double>(Clock::now().time_since_epoch()).count());
}

void Checkpoints::write(const Job& j, compute::Model& model, compute::Optimizer& optimizer,
                        const compute::TrainingState& state, Clock::time_point began) const {
  auto saved = elastic::write_checkpoint(dir_, model, optimizer, state, j.config.elastic.checkpoint_keep);
  if (!saved) {
    node_events().warn("checkpoint_failed job={} step={} reason=\"{}\"", j.start.job_id, state.step, saved.error());
    return;
  }
  node_events().info("checkpoint_saved job={} step={} manifest={} ms={:.0f}", j.start.job_id, state.step,
                     saved->string(), seconds_between(began, Clock::now()) * 1000);
}

void set_unconsumed(const Job& j, const std::map<std::string, uint64_t>& cursors, compute::TrainingState& state) {
  const auto& r = j.start;
  std::vector<elastic::Spans> rests;
  for (size_t w = 0; w < r.workers.size() && w < r.spans.size(); ++w) {
    const auto it = cursors.find(r.workers[w]);
    rests.push_back(elastic::rest_after(elastic::spans_of(r.spans[w]), it == cursors.end() ? 0 : it->second));
  }
  // One list: every epoch's rest in position order.
  const auto left = elastic::resplit(rests, 1).front();
  state.job->remaining = elastic::triples_of(left);
  if (!left.empty()) state.epoch = static_cast<int64_t>(left.front().epoch);
}

std::expected<void, std::string> resume_positions(Job& j, const compute::TrainingState& state) {
  const auto& from = j.config.elastic.resume_from;
  if (state.seed != j.config.job.seed)
    return std::unexpected(fmt::format("elastic.resume_from: {} was saved by a job with seed {}; this job's seed is {} "
                                       "(its epochs would walk another permutation)",
                                       from, state.seed, j.config.job.seed));
  const auto remaining = elastic::spans_of(state.job->remaining);
  for (size_t i = 0; i < remaining.size(); ++i) {
    const auto& span = remaining[i];
    if (span.begin >= span.end || span.end > static_cast<uint64_t>(j.data.train.size()) ||
        span.epoch >= static_cast<uint64_t>(j.config.job.epochs))
      return std::unexpected(fmt::format("elastic.resume_from: {} leaves positions [{}, {}) of epoch {}, outside this "
                                         "job's {} samples and {} epochs",
                                         from, span.begin, span.end, span.epoch, j.data.train.size(), j.config.job.epochs));
    // In epoch and position order, none twice: the re-split takes them as they come.
    if (i > 0 && (span.epoch < remaining[i - 1].epoch ||
                  (span.epoch == remaining[i - 1].epoch && span.begin < remaining[i - 1].end)))
      return std::unexpected(fmt::format("elastic.resume_from: {} lists positions out of order or twice (epoch {}, [{}, {}))",
                                         from, span.epoch, span.begin, span.end));
  }
  j.start.spans.clear();
  for (const auto& list : elastic::resplit({remaining}, j.world)) j.start.spans.push_back(elastic::triples_of(list));
  j.step = state.step;
  j.epoch = state.epoch;
  j.checkpoints.resumed(state.step);
  node_events().info("job_resumed job={} from=\"{}\" step={} epoch={} remaining={}", j.start.job_id, from, state.step,
                     state.epoch, elastic::span_total(remaining));
  return {};
}

double now_ms(const TrainerState& s) { return std::chrono::duration<double, std::milli>(Clock::now() - s.started).count(); }

size_t chunk_elements(const Job& j) { return static_cast<size_t>(j.config.job.ring_chunk_kb) * 1024 / sizeof(float); }
}  // namespace tepdist::actors::trainer_detail

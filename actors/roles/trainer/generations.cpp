#include "actors/roles/trainer/job.hpp"

namespace tepdist::actors::trainer_detail {

elastic::StateView state_view(Job& j) {
  std::vector<std::span<float>> parts{j.model->parameters()};
  for (auto& [name, buffer] : j.opt().state()) parts.push_back(buffer);
  return elastic::StateView(std::move(parts));
}

void parameters_to_host(Job& j) {
  if (!j.resident || j.host_parameters) return;
  TEPDIST_CHECK(j.resident_parameters);  // a pull would lose the host's writes
  j.resident->pull_parameters();
  j.host_parameters = true;
}

std::span<float> host_parameters_to_write(Job& j) {
  parameters_to_host(j);
  if (j.resident) j.resident_parameters = false;
  return j.model->parameters();
}

void parameters_to_device(Job& j) {
  if (!j.resident || j.resident_parameters) return;
  TEPDIST_CHECK(j.host_parameters);
  j.resident->push_parameters();
  j.resident_parameters = true;
}

void optimizer_step(Job& j, float lr) {
  if (!j.resident) return j.optimizer->step(j.model->parameters(), j.model->gradients(), lr);
  parameters_to_device(j);
  j.resident->step(lr);
  j.host_parameters = j.host_optimizer = false;
}

void state_to_host(Job& j) {
  parameters_to_host(j);
  if (!j.resident || j.host_optimizer) return;
  j.resident->pull_optimizer();
  j.host_optimizer = true;
}

void state_from_host(Job& j) {
  if (!j.resident) return;
  j.resident->push_parameters();
  j.resident->push_optimizer();
  j.host_parameters = j.host_optimizer = j.resident_parameters = true;
}

std::unique_ptr<elastic::JobControl> make_control(const TrainerState& s, const elastic::JobConfig* config) {
  elastic::JobControl::Options o{s.o.self_id, s.o.boot_id};
  if (config) {
    o.quorum = config->elastic.quorum == "any" ? elastic::Quorum::any : elastic::Quorum::majority;
    o.min_workers = static_cast<size_t>(config->elastic.min_workers);
    o.replication = static_cast<int>(config->elastic.replication);
    // Gossip and async balance by re-splitting positions (sync balances every step's shares).
    o.rebalance = config->elastic.balance && config->job.mode != "sync";
  }
  return std::make_unique<elastic::JobControl>(o);
}

void apply_control(Trainer* self, uint64_t job_id, elastic::JobControl::Output& out) {
  auto& s = self->state;
  for (const auto& line : out.log) node_events().info("job_control job={} {}", job_id, line);
  for (auto& [address, body] : out.sends) send_to(self, address, std::move(body));
  if (!s.job || s.job->start.job_id != job_id) return;
  auto& j = *s.job;
  if (!out.lost.empty()) {
    // No node holds the state any more: every node hears why (one without the job ignores it),
    // and the job fails here, reporting it to the submitter, rather than propose forever.
    const std::string why = out.lost.substr(0, gossip::Control::max_reason);
    const gossip::Control stop{s.o.self_id, s.o.incarnation, gossip::Control::Command::stop_job, job_id,
                               std::vector<uint8_t>(why.begin(), why.end())};
    for (const auto& m : s.view)
      if (m.id != s.o.self_id && elastic::is_live(m)) send_to(self, m.address, stop);
    return fail(self, fmt::format("the job's state is lost: {}", out.lost));
  }
  if (out.paused) node_events().info("job_paused job={} step={} promised={}", job_id, j.step, j.control->promised());
  if (!out.dropped.empty()) {
    // Not a worker of the installed generation (it was taken for gone): it lets its state go and
    // waits, holding the record and its promises, to be proposed again as a joiner.
    node_events().info("job_left job={} reason=\"{}\"", job_id, out.dropped);
    j.member = false;
    j.has_state = false;
    j.pulling.reset();
    j.driver->left(j);
    return;
  }
  if (out.installed) enter_generation(self);
}

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
  const uint64_t at = j.driver->pull_step(j);
  // A piece not received is asked for again well inside the step timeout, which ends the pull.
  const double retry_ms = std::min(5000.0, j.config.job.step_timeout_s * 1000 / 4);
  elastic::StatePuller::Options pull{r.job_id, at, view.size(), chunk_elements(j), retry_ms, donors};
  pull.generation = j.generation;
  j.pulling.emplace(std::move(pull));
  std::vector<std::pair<std::string, gossip::StatePull>> out;
  j.pulling->start(now_ms(s), out);
  node_events().info("state_pull job={} generation={} step={} elements={} donors={} pieces={}", r.job_id, r.generation,
                     at, view.size(), donors.size(), j.pulling->pieces());
  for (auto& [address, pull] : out) send_to(self, address, pull);
}

void on_state_pull(Trainer* self, const std::string& peer, const std::string& from, const gossip::StatePull& p) {
  auto& s = self->state;
  if (!s.job || s.job->start.job_id != p.job_id || !s.job->control) return;
  auto& j = *s.job;
  // A pull not served is refused at once (a piece of nothing): the puller asks its next donor for
  // that stripe instead of waiting for its retry.
  const auto refuse = [&](std::string_view why) {
    node_events().warn("state_pull_refused from={} generation={} reason=\"{}\"", peer, p.generation, why);
    if (!from.empty()) send_to(self, from, elastic::refusal_of(p));
  };
  const auto* address = elastic::worker_address(j.start, peer);
  if (p.generation > j.generation || (!address && j.control->paused())) {
    // A donor of the next generation has acked it and waits for its install, which may reach the
    // puller first: the pull waits here for the install (enter_generation serves it, or refuses it
    // if another generation was installed instead). Served now, it would get this generation's
    // state, which at the same step need not be the next one's (a program's parameters).
    constexpr size_t early_limit = 1024;
    if (j.early_pulls.size() >= early_limit) return refuse("too many pulls wait for a generation not installed here");
    j.early_pulls.push_back({peer, from, p});
    return;
  }
  if (!address) return refuse(fmt::format("not a worker of generation {}", j.generation));
  if (!j.has_state || j.pulling) return refuse("this worker is pulling the state itself");
  const uint64_t at = j.driver->serve_step(j, p.step);
  state_to_host(j);
  auto pieces = elastic::serve_state(p, {j.start.job_id, j.generation, at}, state_view(j), chunk_elements(j));
  if (!pieces) return refuse(pieces.error());
  for (auto& piece : *pieces) send_to(self, *address, std::move(piece));
}

void on_state_piece(Trainer* self, const std::string& peer, const std::string& from, const gossip::StatePiece& p) {
  auto& s = self->state;
  if (!s.job || s.job->start.job_id != p.job_id || !s.job->pulling) return;
  auto& j = *s.job;
  if (elastic::is_refusal(p)) {
    std::vector<std::pair<std::string, gossip::StatePull>> again;
    if (auto ok = j.pulling->on_refusal(p, from, now_ms(s), again); !ok)
      node_events().debug("state_piece_refused from={} reason=\"a refusal of another pull: {}\"", peer, ok.error());
    else if (!again.empty())
      node_events().info("state_pull_moved job={} from={} pulls={} reason=\"refused by the donor\"", p.job_id, peer,
                         again.size());
    for (auto& [address, pull] : again) send_to(self, address, pull);
    return;
  }
  if (auto ok = j.pulling->on_piece(p, state_view(j)); !ok) {
    node_events().warn("state_piece_refused from={} reason=\"{}\"", peer, ok.error());
    return;
  }
  j.progress_at = Clock::now();  // a slow pull that moves is not stuck
  if (!j.pulling->done()) return;
  j.pulling.reset();
  j.has_state = true;
  const auto& resume = j.start.resume;
  j.driver->pulled(j);
  j.step = std::max(j.step, static_cast<int64_t>(resume.step));
  j.opt().set_steps(static_cast<int64_t>(resume.step));
  state_from_host(j);
  j.waiting_since = j.progress_at = Clock::now();
  node_events().info("state_pulled job={} generation={} step={}", j.start.job_id, j.generation, j.step);
  resume_training(self);
}

bool takes_reset(const Job& j, const gossip::JobStart& r) {
  const auto hold = j.held ? std::optional(j.held_epochs) : j.driver->hold_reached(j);
  return hold && r.reset_checksum != 0 && r.reset_epochs == r.released_epochs && r.reset_epochs == *hold + 1 &&
         j.has_state;
}

std::expected<void, std::string> take_reset(Job& j, const std::string& path) {
  const auto& r = j.start;
  state_to_host(j);  // both parts: the pushed state after it is the host's whole copy
  const auto params = j.model->parameters();
  const std::vector<float> before(params.begin(), params.end());
  auto loaded = compute::import_safetensors(path, *j.model);
  const uint64_t got = loaded ? checksum(params) : 0;
  if (loaded && got == r.reset_checksum) {
    node_events().info("parameters_taken job={} epochs={} file=\"{}\" checksum={:016x}", r.job_id, r.reset_epochs,
                       r.reset_file, got);
    state_from_host(j);
    return {};
  }
  std::copy(before.begin(), before.end(), params.begin());
  if (!loaded)
    return std::unexpected(fmt::format("cannot take the parameters the program set for epoch {}: {}", r.reset_epochs + 1,
                                       loaded.error().message));
  return std::unexpected(fmt::format("the parameters the program set for epoch {} ({}) are not what it sent (checksum "
                                     "{:016x}, expected {:016x})",
                                     r.reset_epochs + 1, r.reset_file, got, r.reset_checksum));
}

void enter_generation(Trainer* self) {
  auto& s = self->state;
  auto& j = *s.job;
  // A worker that reported done takes part again only under another rank 0 (or another run of
  // it): the one it finished under died before completing the job, and this generation ends the
  // job anew. Under the same rank 0 (a rebalance or a join in the job's last moments) it enters
  // the generation (its state and shards stay the job's, should rank 0 die after all) but stays
  // done, waiting for rank 0's word; rank 0, finishing, completes as it was.
  if (j.done_at != Clock::time_point{}) {
    const auto& next = j.control->record();
    if (elastic::same_rank0(next, j.start)) {
      j.done_at = Clock::now();  // the wait for rank 0's word starts again, from this install
      node_events().info("job_kept job={} generation={} reason=\"done; rank 0 {} completes the job\"", j.start.job_id,
                         next.generation, next.workers[0]);
    } else {
      j.finishing = false;
      j.done_at = {};
    }
  }
  // Released with parameters this node cannot read where the program wrote them: fetched from
  // the submitter first (the worker is held meanwhile; the others keep what it is sent).
  std::string reset_path;
  if (takes_reset(j, j.control->record()))
    if (reset_path = reset_file_here(self, j.control->record()); reset_path.empty()) return;
  const auto submitter_id = j.start.submitter_id;
  j.start = j.control->record();
  if (j.start.submitter_id.empty()) j.start.submitter_id = submitter_id;
  const auto& r = j.start;
  const auto me = std::find(r.workers.begin(), r.workers.end(), s.o.self_id);
  if (me == r.workers.end()) return fail(self, fmt::format("generation {} does not name this worker", r.generation));
  j.member = true;
  j.stepped_in_generation = false;
  // Released with parameters the program set: the workers held at the hold this release ends
  // take them (a worker that trained on since, or a restarted one, has the job's state instead).
  if (!reset_path.empty()) {
    if (auto taken = take_reset(j, reset_path); !taken) return fail_everywhere(self, taken.error());
    j.reset_in = r.generation;
  }
  // A hold is entered afresh in every generation: its rank 0 (maybe another worker now) reports it.
  j.held = false;
  j.generation = r.generation;
  j.world = static_cast<uint32_t>(r.workers.size());
  j.rank = static_cast<uint32_t>(me - r.workers.begin());
  j.prev_id = r.workers[(j.rank + j.world - 1) % j.world];
  j.marks.push_back({r.generation, r.resume.step, j.world, unix_ms()});
  while (j.marks.size() > Job::generation_marks) j.marks.pop_front();
  j.next_address = r.addresses[(j.rank + 1) % j.world];
  j.waiting_since = j.progress_at = Clock::now();
  // An optimiser the program set between epochs: every worker applies it from the same install.
  if (r.optimizer != j.optimizer_applied)
    if (auto ok = change_optimizer(j); !ok) return fail_everywhere(self, ok.error());
  const auto batch = static_cast<int64_t>(j.config.data.batch_size);
  j.rate->set_generation(r.resume, static_cast<int64_t>(r.previous_world) * batch, static_cast<int64_t>(j.world) * batch);
  j.rate->set_factor(j.lr_factor());  // the plateau decays so far
  if (r.lr_factor > 0) j.decided_factor = std::min(j.decided_factor, r.lr_factor);
  if (auto ok = j.driver->enter(self, j); !ok) return fail(self, ok.error());
  if (j.rank == 0)
    if (auto ok = ensure_evaluator(self, j); !ok) return fail(self, ok.error());
  std::string donors;
  for (const auto& d : r.donors) donors += (donors.empty() ? "" : ",") + d;
  node_events().info("generation_installed job={} generation={} rank={} workers={} resume_step={} donors={}", r.job_id,
                     r.generation, j.rank, j.world, r.resume.step, donors.empty() ? "-" : donors);
  report_status(self);
  // Pulls that came before this install: served now (or refused, naming why).
  std::vector<EarlyPull> early;
  early.swap(j.early_pulls);
  for (const auto& [peer, from, pull] : early) on_state_pull(self, peer, from, pull);
  const bool behind = !j.has_state || j.driver->behind(j);
  if (behind) {
    j.has_state = false;
    return start_pull(self);
  }
  resume_training(self);
}

void check_submitter(Trainer* self) {
  auto& s = self->state;
  if (!s.job || s.job->detached) return;
  for (const auto& m : s.view)
    if (m.id == s.job->start.submitter_id && !elastic::is_live(m)) {
      s.job->detached = true;
      node_events().info("job_detached job={} reason=\"the submitter {} is gone; the job goes on, and rank 0 saves "
                         "the result in {}/{}\"",
                         s.job->start.job_id, m.id, s.o.results_dir, s.job->start.job_id);
      if (s.job->held) self->send(self, step_atom::value);  // nobody will release it: it trains on
    }
}

void decline_join(Trainer* self, const gossip::JobStart& record, const std::string& why) {
  auto& s = self->state;
  // A joiner that cannot run the job (its data set, its frame limit, its backend) is its own
  // problem, not the job's: the submitter hears nothing, and the duty holder is asked to leave
  // this node out again (an eviction of itself), which it does in the next generation. The job is
  // never joined again here.
  node_events().warn("job_declined job={} generation={} reason=\"{}\"", record.job_id, record.generation, why);
  s.ended_jobs.insert(record.job_id);
  s.declined_jobs.insert(record.job_id);
  s.joining.reset();
  // The duty holder as the others will see it once this node is passed over (this node may have
  // the lowest id); any later proposal naming this node is answered the same way (on_vote).
  const std::string holder = elastic::job_duty_holder(record, s.view, {{s.o.self_id, s.o.boot_id}});
  if (const auto* address = elastic::worker_address(record, holder); address && holder != s.o.self_id)
    send_to(self, *address, decline_vote(s, record.job_id, record.generation));
}

gossip::GenerationVote decline_vote(const TrainerState& s, uint64_t job_id, uint64_t generation) {
  gossip::GenerationVote v{job_id, gossip::GenerationVote::Kind::evict, generation, generation, {s.o.self_id}};
  v.boot_id = s.o.boot_id;
  return v;
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
    if (job->driver) job->driver->drop(self);
    if (!has_state && record.generation >= 2) return decline_join(self, record, ok.error());
    return fail_start(self, record, ok.error());
  }
  node_events().info("job_started job={} mode={} rank={} workers={} steps={} steps_per_epoch={} generation={}",
                     record.job_id, job->driver->name(), job->rank, job->world, job->total_steps,
                     job->steps_per_epoch, job->generation);
  // With a resident state the model's own plan never runs (and on a device would hold memory).
  if (!job->resident) {
    job->compute_path = job->model->compute_path(*job->backend, job->config.data.batch_size);
    node_events().info("compute_path job={} path=\"{}\"", record.job_id, job->compute_path);
  }
  const bool elastic_mode = job->driver->elastic();
  s.job = std::move(job);
  s.joining.reset();
  s.last_job = std::max(s.last_job, record.job_id);
  start_ticking(self);
  if (elastic_mode) {
    // Job control: the record this node holds from now on, and what its view says of it.
    auto& j = *s.job;
    j.control = make_control(s, &j.config);
    j.control->adopt(j.start);
    if (j.resumed_factor < 1) j.control->set_rate_factor(j.resumed_factor);  // the duty holder proposes it
    elastic::JobControl::Output out;
    j.control->on_view(now_ms(s), s.view, j.driver->local(j), out);
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
  // Drained since it promised (the node is leaving): it would take shards away with it.
  if (s.drained && !s.drain) return decline_join(self, record, "this node has drained: it is leaving");
  node_events().info("job_joining job={} generation={} from={}", record.job_id, record.generation, peer);
  prepare_job(self, record, false);
}

void on_vote(Trainer* self, const std::string& peer, const gossip::GenerationVote& vote) {
  auto& s = self->state;
  if (s.ended_jobs.contains(vote.job_id)) {
    // A job this node declined, proposed to it again (by a duty holder that did not hear it):
    // the same answer, so the proposer leaves it out instead of waiting for its ack.
    if (s.declined_jobs.contains(vote.job_id) && vote.kind == gossip::GenerationVote::Kind::propose &&
        std::ranges::count(vote.workers, s.o.self_id))
      for (const auto& m : s.view)
        if (m.id == peer) send_to(self, m.address, decline_vote(s, vote.job_id, vote.base));
    return;
  }
  elastic::JobControl::Output out;
  if (s.job) {
    if (s.job->start.job_id != vote.job_id || !s.job->control) return;
    s.job->control->on_vote(now_ms(s), peer, vote, s.job->driver->local(*s.job), out);
    return apply_control(self, vote.job_id, out);
  }
  // No job here: proposed as a joiner. Its acks say it holds nothing.
  if (vote.kind != gossip::GenerationVote::Kind::propose) return;
  if (s.drained) {
    // Leaving: it answers as a joiner that cannot run the job does, and the proposer leaves it out.
    node_events().warn("job_declined job={} generation={} reason=\"this node has drained: it is leaving\"",
                       vote.job_id, vote.number);
    s.ended_jobs.insert(vote.job_id);
    s.declined_jobs.insert(vote.job_id);
    for (const auto& m : s.view)
      if (m.id == peer) send_to(self, m.address, decline_vote(s, vote.job_id, vote.base));
    return;
  }
  if (!s.joining) {
    s.joining = make_control(s, nullptr);
    s.joining_since = Clock::now();
  }
  start_ticking(self);
  s.joining->on_view(now_ms(s), s.view, {}, out);
  s.joining->on_vote(now_ms(s), peer, vote, {}, out);
  apply_control(self, vote.job_id, out);
}
}  // namespace tepdist::actors::trainer_detail

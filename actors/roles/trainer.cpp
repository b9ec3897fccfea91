// The trainer actor: its messages, ticks, the coordinator's part of a submission, drains; the
// rest of the role is in actors/roles/trainer/ (job.hpp says what is where).

#include "actors/node.hpp"
#include "actors/roles/trainer/job.hpp"
#include "base/thread_name.hpp"

#include <thread>

namespace tepdist::actors {
namespace trainer_detail {

void end_drain(Trainer* self) {
  auto& s = self->state;
  const Job* j = s.job.get();
  const std::string where = !j ? std::string("drained: no job")
                               : fmt::format("drained: job {} generation {} after step {}", j->start.job_id, j->generation,
                                             j->driver->progress(*j).step);
  node_events().info("trainer_drained where=\"{}\"", where);
  s.drained = true;
  if (s.drain) s.drain->deliver(where);
  s.drain.reset();
}

void on_drain(Trainer* self) {
  auto& s = self->state;
  Job* j = s.job.get();
  if (j && j->member && !j->finishing && may_step(*j) && j->driver->mid_step(*j))
    return start_ticking(self);  // each tick looks again (on_tick)
  s.drained = true;  // no step starts from here
  // Assigned a job that waits for this node's view to catch up: it starts, then the drain goes on
  // as in any job (async: its shards are handed over), rather than leave a worker of the job
  // without a word. The view catches up, or the assignment fails after held_limit_s.
  if (!j && s.held) return start_ticking(self);
  // Async: this node's shards stay until the next generation's holders have them.
  if (j && !j->finishing && j->driver->hand_over(self, *j)) return start_ticking(self);
  end_drain(self);
}

void do_step(Trainer* self) {
  auto& s = self->state;
  if (s.drain && !(s.job && s.job->driver->mid_step(*s.job))) on_drain(self);
  if (s.drained) return;
  auto* j = s.job.get();
  if (!j || j->finishing) return;
  j->driver->step(self, *j);
}

void on_assigned(Trainer* self, const std::string& peer, const gossip::JobStart& start) {
  auto& s = self->state;
  if (peer != start.coordinator)
    return fail_start(self, start, fmt::format("sent by {}, not by the coordinator it names ({})", peer, start.coordinator));
  // A job this worker reported done, kept for rank 0's end, gives way: the next job's assignment
  // may come before rank 0's word that the last one is complete.
  if (s.job && s.job->done_at != Clock::time_point{} && s.job->start.job_id != start.job_id)
    release_done_job(self, "another job was assigned");
  if (s.job) {
    if (s.job->start.job_id != start.job_id)
      fail_start(self, start, fmt::format("busy with job {}", s.job->start.job_id));
    return;
  }
  if (s.fetching) {
    if (s.fetching->start.job_id != start.job_id)
      fail_start(self, start, fmt::format("busy fetching the files of job {}", s.fetching->start.job_id));
    return;
  }
  if (auto ok = elastic::check_assignment(start, s.view); !ok) {
    if (start.workers.empty() || start.workers.size() != start.addresses.size()) return fail_start(self, start, ok.error());
    if (!s.held || s.held->job_id != start.job_id) {
      node_events().info("job_held job={} from={} reason=\"{}\" wait_s={:.0f}", start.job_id, peer, ok.error(),
                         TrainerState::held_limit_s);
      s.held = start;
      s.held_since = Clock::now();
      start_ticking(self);
    }
    return;
  }
  if (s.held && s.held->job_id == start.job_id) s.held.reset();
  // Drained already (asked before the assignment came): the node is leaving, and says so at once,
  // so that the job goes on without it rather than wait for the leave to be gossiped.
  if (s.drained && !s.drain) return decline_join(self, start, "this node has drained: it is leaving");
  node_events().info("job_accepted job={} generation={} from={}", start.job_id, start.generation, peer);
  prepare_job(self, start, true);
  if (s.drain) on_drain(self);  // asked to drain while the assignment was held: the job's drain goes on
}

std::string not_ready_to_assign(const TrainerState& s, const gossip::JobStart& request) {
  for (const auto& id : request.workers) {
    auto it = std::find_if(s.view.begin(), s.view.end(), [&](const gossip::Member& m) { return m.id == id; });
    if (it == s.view.end() || !elastic::is_live(*it))
      return fmt::format("worker {}, which the submitter saw, is not live in the coordinator's view", id);
  }
  const gossip::Member* c = elastic::coordinator_in(s.view);
  if (!c || c->id != s.o.self_id)
    return fmt::format("{} is not the coordinator; {} is", s.o.self_id, c ? c->id : std::string("nobody"));
  return {};
}

void on_submitted(Trainer* self, const std::string& submitter_peer, const gossip::JobStart& request) {
  auto& s = self->state;
  if (s.drained) {  // a coordinator on its way out: its workers would hear of a job it cannot run
    s.pending.reset();
    return fail_start(self, request,
                      fmt::format("{} is the coordinator, but it has drained and is leaving; submit again once it "
                                  "has gone",
                                  s.o.self_id));
  }
  // The submitter's view and this one may differ for a moment (gossip of a join or a departure is
  // still on its way): the submission waits here for this view to catch up, at most 30 s.
  if (const auto why = not_ready_to_assign(s, request); !why.empty()) {
    if (s.pending && s.pending->job_id != request.job_id)
      return fail_start(self, request, fmt::format("job {} is waiting for its workers; one submission at a time",
                                                   s.pending->job_id));
    if (!s.pending) {
      node_events().info("job_pending job={} from={} reason=\"{}\" wait_s={:.0f}", request.job_id, submitter_peer, why,
                         TrainerState::pending_limit_s);
      s.pending_from = submitter_peer;
      s.pending = request;
      s.pending_since = Clock::now();
      start_ticking(self);
    }
    return;
  }
  s.pending.reset();
  auto assigned = elastic::assign_job(request, s.view, s.o.self_id);
  if (!assigned) return fail_start(self, request, assigned.error());
  assigned->submitter_id = submitter_peer;  // who sent it, not who it says it is
  assigned->generation = 1;
  node_events().info("job_assigned job={} workers={} submitter={}", assigned->job_id, assigned->workers.size(),
                     assigned->submitter);
  for (size_t i = 0; i < assigned->workers.size(); ++i)
    if (assigned->workers[i] != s.o.self_id) send_to(self, assigned->addresses[i], *assigned);
  // The submitter learns the ring order too: it takes the final model from rank 0 only.
  send_to(self, assigned->submitter, *assigned);
  on_assigned(self, s.o.self_id, *assigned);
}

void on_view(Trainer* self, std::vector<gossip::Member> view) {
  auto& s = self->state;
  s.view = std::move(view);
  if (s.held) {
    const auto start = *s.held;
    on_assigned(self, start.coordinator, start);
  }
  if (s.pending) {
    const auto request = *s.pending;
    if (!submitter_live(s, s.pending_from)) {
      node_events().info("job_cancelled job={} reason=\"its submitter {} is gone before it was assigned\"",
                         request.job_id, s.pending_from);
      s.pending.reset();
    } else {
      on_submitted(self, s.pending_from, request);
    }
  }
  if (s.joining) {
    elastic::JobControl::Output out;
    s.joining->on_view(now_ms(s), s.view, {}, out);
  }
  if (!s.job) return;
  if (!s.job->control) {
    // Async trains through membership changes in part 2 of elastic training; until then a change
    // ends it, saying so.
    const auto changes = elastic::ring_changes(s.job->start, s.view);
    if (!changes.empty()) {
      std::string names;
      for (const auto& c : changes) names += (names.empty() ? "" : ", ") + c;
      return fail(self, fmt::format("the cluster changed during an async job: {}; async jobs do not survive "
                                    "membership changes yet (sync and gossip jobs do)",
                                    names));
    }
  } else {
    elastic::JobControl::Output out;
    const uint64_t job_id = s.job->start.job_id;
    s.job->control->on_view(now_ms(s), s.view, s.job->driver->local(*s.job), out);
    apply_control(self, job_id, out);
    if (!s.job) return;
  }
  check_submitter(self);
}

void keep_ending(Trainer* self) {
  auto& s = self->state;
  auto& j = *s.job;
  if (j.finishing) return;
  if (j.rank == 0 && j.driver->ending(j)) {
    JobReport r = report_of(j, JobReport::Kind::progress);
    r.samples = j.driver->job_samples(j);
    to_submitter(self, j, r);
  }
  j.driver->keep_ending(self, j);
}

void check_step_timeout(Trainer* self) {
  auto& s = self->state;
  auto& j = *s.job;
  const auto limit = j.config.job.step_timeout_s;
  const char* ring_wait = j.driver->ring_wait(j);
  if (j.control && j.pulling) {
    // A worker that cannot get the state from any donor steps out of the job rather than end it
    // for everyone: the others' ring leaves it out (eviction), and it may be proposed again.
    node_events().warn("job_left job={} reason=\"no donor answered the state pull for {:.0f} s\"", j.start.job_id,
                       limit);
    j.member = false;
    j.has_state = false;
    j.pulling.reset();
  } else if (j.control && j.control->paused()) {
    // Waiting for a generation (the side of a partition without a quorum): the state is kept,
    // whatever the wait; the job is not this worker's to end.
    j.progress_at = Clock::now();
    node_events().warn("job_waiting job={} promised={} reason=\"no generation installed for {:.0f} s (a quorum "
                       "lost, or the other side of a partition)\"",
                       j.start.job_id, j.control->promised(), limit);
  } else if (ring_wait && j.control && j.prev_id != s.o.self_id) {
    // Membership holds the previous worker live, yet the ring has not moved. Every worker after
    // a hung one waits too, so first ask the previous one whether its trainer takes messages:
    // one that answers waits on a worker before it, whose own next worker evicts that one. No
    // answer within half the timeout: this is the one that blocks the ring; it is left out of
    // the next generation rather than end the job. (An answer is not a pass forever: at twice
    // the timeout it is evicted anyway, should the whole ring wait on a message that was lost.)
    const auto now = Clock::now();
    const double waited = seconds_between(j.progress_at, now);
    auto& check = j.ring_check;
    const char* what = ring_wait;
    std::string why;
    const bool fresh = !check || check->mark != j.progress_at;
    if (fresh || !check->answered) {
      // The nonce only matches an answer to its question (the channel is authenticated); the
      // clock serves, and leaves gossip's seeded partner draws alone. Asked again each tick
      // until answered: one lost question or answer must not evict a healthy worker.
      if (fresh)
        check = Job::RingCheck{j.progress_at, now, static_cast<uint64_t>(now.time_since_epoch().count()), false};
      std::vector<uint8_t> nonce(8);
      for (size_t b = 0; b < 8; ++b) nonce[b] = static_cast<uint8_t>(check->nonce >> (8 * b));
      if (const auto* address = elastic::worker_address(j.start, j.prev_id))
        send_to(self, *address,
                gossip::Control{s.o.self_id, s.o.incarnation, gossip::Control::Command::ring_check, j.start.job_id,
                                std::move(nonce)});
      if (fresh)
        node_events().info("ring_check job={} worker={} reason=\"{} {} waited {:.0f} s for it\"", j.start.job_id,
                           j.prev_id, what, j.step + 1, waited);
    }
    // Just asked (fresh): the answer has its half timeout from now.
    if (!fresh && !check->answered && seconds_between(check->sent, now) > limit / 2)
      why = fmt::format("{} {} waited {:.0f} s for it, and its trainer did not answer in {:.1f} s", what, j.step + 1,
                        waited, limit / 2);
    else if (!fresh && check->answered && waited > 2 * limit)
      why = fmt::format("{} {} waited {:.0f} s for it (its trainer answers, but the ring has not moved)", what,
                        j.step + 1, waited);
    if (!why.empty()) {
      node_events().warn("worker_evicting job={} worker={} reason=\"{}\"", j.start.job_id, j.prev_id, why);
      j.progress_at = now;
      check.reset();
      elastic::JobControl::Output out;
      const uint64_t job_id = j.start.job_id;
      j.control->evict(now_ms(s), j.prev_id, j.driver->local(j), out);
      apply_control(self, job_id, out);
    }
  } else if (ring_wait) {
    fail(self, fmt::format("{} {} waited {:.0f} s for worker {} (the previous one in the ring)", ring_wait, j.step + 1,
                           limit, j.prev_id));
  } else if (const auto why = j.driver->stalled(j); !why.empty()) {
    fail(self, why);
  }
}

void on_tick(Trainer* self) {
  auto& s = self->state;
  if (s.pending && seconds_between(s.pending_since, Clock::now()) > TrainerState::pending_limit_s) {
    const auto request = *s.pending;
    s.pending.reset();
    fail_start(self, request,
               fmt::format("{}, still after {:.0f} s", not_ready_to_assign(s, request), TrainerState::pending_limit_s));
  }
  if (s.held && seconds_between(s.held_since, Clock::now()) > TrainerState::held_limit_s) {
    const auto start = *s.held;
    s.held.reset();
    if (auto ok = elastic::check_assignment(start, s.view); !ok)
      fail_start(self, start, fmt::format("{}, still after {:.0f} s", ok.error(), TrainerState::held_limit_s));
  }
  // A done worker waits for rank 0's word, but not while a generation it acked is being voted
  // on (rank 0 may have died at the end: the survivors, this worker among them, end the job under
  // a new one, and its state may be needed). An install restarts the wait (enter_generation).
  if (s.job && s.job->done_at != Clock::time_point{} && !(s.job->control && s.job->control->paused()) &&
      seconds_between(s.job->done_at, Clock::now()) > s.job->config.job.step_timeout_s)
    release_done_job(self, "no word from rank 0 within step_timeout_s of this worker's done");
  else if (s.job && s.job->completed_at != Clock::time_point{} &&
           seconds_between(s.job->completed_at, Clock::now()) > TrainerState::complete_grace_s)
    release_done_job(self, "rank 0 completed the job, and this worker's part did not end");
  // A worker held between epochs waits for its submitter, however long: no step is late.
  if (s.job && s.job->member && !s.job->finishing && !s.job->held &&
      seconds_between(s.job->progress_at, Clock::now()) > s.job->config.job.step_timeout_s)
    check_step_timeout(self);
  if (s.job && s.job->member && s.job->held && s.job->held_reported && s.job->rank == 0) {
    // Said again each tick (the submitter's report timeout, a report lost), and the model again
    // now and then: pieces sent before the member knew this generation's rank 0 were refused.
    const uint64_t t = ++s.job->held_ticks;
    const bool again = ((t & (t - 1)) == 0 && t >= 2 && t <= 64) || t % 64 == 0;
    if (!again || send_model(self)) to_submitter(self, *s.job, held_report(*s.job));  // a failed send drops the job
  }
  if (s.job && s.job->control) {
    auto& j = *s.job;
    const uint64_t job_id = j.start.job_id;
    if (j.pulling) {
      std::vector<std::pair<std::string, gossip::StatePull>> again;
      j.pulling->on_tick(now_ms(s), again);
      for (auto& [address, pull] : again) send_to(self, address, pull);
    }
    elastic::JobControl::Output out;
    j.control->on_tick(now_ms(s), j.driver->local(j), out);
    apply_control(self, job_id, out);
  }
  if (s.job && s.job->member) keep_ending(self);
  tick_files(self);
  if (s.joining && seconds_between(s.joining_since, Clock::now()) > TrainerState::joining_limit_s) {
    node_events().warn("job_joining_abandoned reason=\"proposed as a worker {:.0f} s ago, and no generation "
                       "naming this node came\"",
                       TrainerState::joining_limit_s);
    s.joining.reset();
  }
  if (!s.job && s.joining) {
    // A joiner's promise whose install did not come: it asks again (the core knows whom).
    elastic::JobControl::Output out;
    s.joining->on_tick(now_ms(s), {}, out);
    for (auto& [address, body] : out.sends) send_to(self, address, std::move(body));
  }
  if (s.job) report_status(self);
  if (s.drain) on_drain(self);  // a pause, a drop or a failure since: no step under way to wait for
  if (s.pending || s.held || s.job || s.joining || s.fetching) self->delayed_send(self, std::chrono::seconds(1), tick_atom::value);
  else s.ticking = false;
}

void start_ticking(Trainer* self) {
  if (self->state.ticking) return;
  self->state.ticking = true;
  self->delayed_send(self, std::chrono::seconds(1), tick_atom::value);
}

void on_control(Trainer* self, const std::string& peer, const gossip::Control& c) {
  auto& s = self->state;
  using Command = gossip::Control::Command;
  if (c.command == Command::stop_job && s.pending && s.pending->job_id == c.job_id && peer == s.pending_from) {
    // Stopped (Ctrl-C) before the coordinator could assign it: it never starts.
    node_events().info("job_cancelled job={} reason=\"stopped by its submitter before it was assigned\"", c.job_id);
    s.pending.reset();
    return;
  }
  if (!s.job || s.job->start.job_id != c.job_id) return;
  auto& j = *s.job;
  if (c.command == Command::ring_check) {
    // The next worker waits on this one: answering says this trainer takes messages (it waits
    // itself, or is about to send). Only a worker of the job is answered.
    if (const auto* address = elastic::worker_address(j.start, peer))
      send_to(self, *address,
              gossip::Control{s.o.self_id, s.o.incarnation, Command::ring_check_answer, c.job_id,
                              std::vector<uint8_t>(c.argument.begin(), c.argument.begin() +
                                                                           std::min<ptrdiff_t>(8, c.argument.size()))});
    return;
  }
  if (c.command == Command::ring_check_answer) {
    uint64_t nonce = 0;
    for (size_t b = 0; b < 8 && b < c.argument.size(); ++b) nonce |= uint64_t{c.argument[b]} << (8 * b);
    if (j.ring_check && !j.ring_check->answered && peer == j.prev_id && c.argument.size() == 8 &&
        nonce == j.ring_check->nonce) {
      j.ring_check->answered = true;
      node_events().info("ring_check_answered job={} worker={} reason=\"it takes messages: it waits on a worker "
                         "before it\"",
                         j.start.job_id, peer);
    }
    return;
  }
  if (c.command == Command::job_complete) {
    // From rank 0 (of this worker's generation, or of one job control installed or promised
    // since), once the submitter has its result: what this worker kept since its own done goes;
    // one not done yet goes at its done, or a few seconds on.
    const bool from_rank0 = peer == j.start.workers[0] || (j.control && !j.control->record().workers.empty() &&
                                                           peer == j.control->record().workers[0]);
    if (!from_rank0) return;
    if (j.done_at != Clock::time_point{}) return release_done_job(self, "rank 0 completed the job");
    if (j.completed_at == Clock::time_point{}) j.completed_at = Clock::now();
    return;
  }
  if (j.driver->on_control(self, j, peer, c)) return;
  if (c.command == Command::release_epochs) {
    // Only from the job's submitter (gossip::Release). Job control makes it a generation every
    // worker installs.
    if (peer != j.start.submitter_id || !j.control) return;
    auto release = gossip::Release::decode(c.argument);
    if (!release) return;
    elastic::JobControl::Output out;
    const uint64_t job_id = j.start.job_id;
    j.control->release(now_ms(s), std::move(*release), j.driver->local(j), out);
    apply_control(self, job_id, out);
    return;
  }
  if (c.command != Command::stop_job) return;
  if (peer != s.job->start.submitter_id) {
    // From a worker of the job (this node's generation, or the newest its job control holds):
    // relayed from the submitter (no reason), or the job cannot go on (why).
    if (!elastic::worker_address(j.start, peer) && !(j.control && elastic::worker_address(j.control->record(), peer)))
      return;
    if (c.argument.empty()) return fail(self, "stopped by the submitter");
    std::string why(c.argument.begin(),
                    c.argument.begin() + static_cast<ptrdiff_t>(std::min(c.argument.size(), gossip::Control::max_reason)));
    for (auto& ch : why)
      if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = '?';
    return fail(self, fmt::format("stopped by {}: {}", peer, why));
  }
  // From the job's submitter: this worker relays it to the others (generations may have changed
  // who the submitter first sent the job to).
  gossip::Control relay = c;
  relay.coordinator = s.o.self_id;
  relay.coordinator_incarnation = s.o.incarnation;
  for (size_t i = 0; i < s.job->start.workers.size(); ++i)
    if (s.job->start.workers[i] != s.o.self_id) send_to(self, s.job->start.addresses[i], relay);
  fail(self, "stopped by the submitter");
}

caf::behavior trainer(Trainer* self, TrainerOptions options, caf::actor router) {
  base::name_this_thread("trainer");  // detached: this is its own thread
  self->state.o = std::move(options);
  self->state.router = router;
  caf::anon_send(router, job_atom::value, caf::actor_cast<caf::actor>(self));
  // A restarted trainer holds no job: the router must not answer status queries with the last
  // run's job, nor send shard updates to its host.
  caf::anon_send(router, status_atom::value, std::optional<gossip::JobStatus>());
  caf::anon_send(router, shards_atom::value, caf::actor(), std::vector<gossip::ShardHolders>());
  return {
      [self](view_atom, std::vector<gossip::Member> view) { on_view(self, std::move(view)); },
      [self](wire_atom, const std::string& peer, const std::string& from, const gossip::Message& m) {
        auto& s = self->state;
        if (const auto* chunk = std::get_if<gossip::RingChunk>(&m.body)) on_chunk(self, peer, *chunk);
        else if (s.job && s.job->driver->on_message(self, *s.job, peer, m.body)) return;
        else if (const auto* start = std::get_if<gossip::JobStart>(&m.body))
          start->coordinator.empty()   ? on_submitted(self, peer, *start)
          : start->generation >= 2 ? on_install(self, peer, *start)
                                   : on_assigned(self, peer, *start);
        else if (const auto* vote = std::get_if<gossip::GenerationVote>(&m.body)) on_vote(self, peer, *vote);
        else if (const auto* pull = std::get_if<gossip::StatePull>(&m.body)) on_state_pull(self, peer, from, *pull);
        else if (const auto* piece = std::get_if<gossip::StatePiece>(&m.body)) on_state_piece(self, peer, from, *piece);
        else if (const auto* file = std::get_if<gossip::FilePiece>(&m.body)) on_file_piece(self, peer, *file);
        else if (const auto* control = std::get_if<gossip::Control>(&m.body)) on_control(self, peer, *control);
      },
      [self](step_atom) { do_step(self); },
      [self](shardlost_atom, const std::string& why) {
        // The shard host could not get a shard's state for this generation: what it held is gone.
        if (self->state.job && self->state.job->driver->local_shards())
          fail(self, fmt::format("a shard of the async job is lost: {}", why));
      },
      [self](handover_atom) {
        // The shard host placed a generation, has its shards ready, or handed them over: an ack
        // held back until it placed goes now, and a drain may go on.
        auto& s = self->state;
        if (s.job && s.job->control) {
          elastic::JobControl::Output out;
          s.job->control->on_local(now_ms(s), s.job->driver->local(*s.job), out);
          apply_control(self, s.job->start.job_id, out);
        }
        if (s.drain) on_drain(self);
      },
      [self](gather_atom, uint64_t, std::shared_ptr<const ShardGather> gathered) {
        if (self->state.job && gathered) self->state.job->driver->on_gathered(self, *self->state.job, *gathered);
      },
      [self](retire_atom) { self->state.retired.clear(); },
      [self](tick_atom) { on_tick(self); },
      [self](drain_atom) -> caf::result<std::string> {
        self->state.drain = self->make_response_promise<std::string>();
        auto promise = *self->state.drain;
        on_drain(self);
        return promise;
      },
      [self](hang_atom) {
        // Fault injection (SIGRTMIN to the node): this actor's thread blocks, as a hung device or a
        // deadlock would block it, while the router goes on answering membership's probes. Long
        // enough for the next worker's ring check to evict this one (it evicts between 1.5 and 2
        // step timeouts after the ring stopped, ticks being a second apart).
        const double seconds = self->state.job ? 3 * self->state.job->config.job.step_timeout_s : 10;
        node_events().warn("trainer_hanging seconds={:.0f}", seconds);
        std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
        node_events().warn("trainer_hung_until_now");
      },
      [self](dieatend_atom) {
        node_events().warn("fault_armed what=\"as rank 0, this node dies just before it completes its job\"");
        self->state.die_before_complete = true;
      },
      [self](hostcrash_atom) {
        // Fault injection (SIGRTMIN+2 to the node): the async shard host fails as a bug in it
        // would (it is told to, and quits with an error). It is linked to this actor, so its
        // failure takes the trainer with it, and the supervisor's restart brings the node back
        // as a restarted member whose shards come back from their replicas.
        const auto host = self->state.job ? self->state.job->driver->local_shards() : caf::actor();
        if (!host) {
          node_events().warn("shard_host_crash_ignored reason=\"no async job here, so no shard host\"");
          return;
        }
        node_events().warn("shard_host_crashing job={}", self->state.job->start.job_id);
        self->send(host, hostcrash_atom::value);
      },
      // Connection trouble: membership decides who is gone; the step timeout covers the rest.
      [](peer_atom, const std::string&, const std::string&) {},
  };
}
}  // namespace trainer_detail

RoleSpec trainer_role(TrainerOptions options, caf::actor router) {
  return {"trainer", [options, router](caf::local_actor& parent, const caf::actor& supervisor,
                                       const caf::message& snapshot) mutable {
            // The snapshot is the boot id the last run of this role worked under: there is one,
            // so this is a restart, and what that run held for its jobs is gone. Members must see
            // the node as restarted (a new boot id), so job control takes it back as a joiner that
            // pulls the state, as it does a restarted process.
            if (snapshot.match_elements<uint64_t>()) {
              const uint64_t boot = new_boot_id(snapshot.get_as<uint64_t>(0));
              options.boot_id = boot;
              node_events().warn("trainer_restarted boot_id={:016x}", boot);
              caf::anon_send(router, boot_atom::value, boot);
            }
            caf::anon_send(supervisor, commit_atom::value, std::string("trainer"), caf::make_message(options.boot_id));
            return caf::actor(parent.spawn<caf::detached>(trainer_detail::trainer, options, router));
          }};
}

}  // namespace tepdist::actors


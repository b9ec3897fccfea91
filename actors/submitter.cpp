#include "actors/submitter.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "actors/atoms.hpp"
#include "actors/roles/trainer.hpp"
#include "actors/router.hpp"
#include "elastic/coordination.hpp"
#include "elastic/job_files.hpp"
#include "elastic/job_control.hpp"
#include "elastic/status.hpp"

namespace tepdist::actors {
namespace {

struct SubmitterState {
  SubmitterOptions o;
  std::shared_ptr<Submission> submission;
  std::vector<gossip::Member> view;
  std::string coordinator_address, coordinator_id;
  gossip::JobStart sent;  // workers: the live workers when it was submitted
  std::optional<gossip::JobStart> assigned;  // the coordinator's copy of the assignment: the ring order
  bool submitted = false, ended = false, heard = false;
  std::chrono::steady_clock::time_point submitted_at, last_report, started_at = std::chrono::steady_clock::now();
  std::string trouble;  // the last connection problem, for a join that does not happen
  // Workers that reported done, with the boot id the record then named. A done stands while the
  // worker is the same run in the job's latest generation: a late generation (a rebalance at the
  // end) does not wipe rank 0's, which it sends once; one that restarted or was left out reports
  // again or not at all.
  std::map<std::string, uint64_t> done;
  // Rank 0 completes the job only once its generation's workers have all finished, so its done is
  // the job's end: the others' done reports, sent before it, get a short grace to arrive (one that
  // joined in the job's last moments never finishes it).
  std::optional<std::chrono::steady_clock::time_point> rank0_done_at;
  static constexpr double rank0_done_grace_s = 2;
  // Reports sent in a generation whose record has not come here yet (a worker reports as soon as it
  // installs, and its report can overtake the proposer's record): held in arrival order until the
  // record comes, or for early_hold_s at most, then taken under the record known (as every report
  // was before they named their generation; under another rank 0 its record would wipe them).
  struct Early {
    std::string peer;
    gossip::JobReport report;
    std::chrono::steady_clock::time_point at;
  };
  std::deque<Early> early;
  static constexpr double early_hold_s = 5;
  static constexpr size_t early_max = 256;
  std::map<std::string, std::pair<std::string, uint64_t>> workers_seen;  // id -> (live/died/left, boot id)
  // Since when every worker of the newest generation known here is gone in the run it names (see
  // state_gone): the job's state is then held by no node.
  std::optional<std::chrono::steady_clock::time_point> gone_since;
  static constexpr double gone_grace_s = 15;  // and no report came meanwhile: the job is lost
  gossip::Release release;  // the latest (Submission::release), told until a generation carries it
  std::vector<gossip::JobFile> served;  // besides the job's files: every reset file released, for fetching
  static inline const char* name = "tepdist.submitter";
};
using Submitter = caf::stateful_actor<SubmitterState>;

void send_to(Submitter* self, const std::string& address, gossip::Body body) {
  auto& o = self->state.o;
  o.transport->send(address, gossip::Message{o.self_id, o.incarnation, o.cluster_id, std::move(body)});
}

void end(Submitter* self, int status, const std::string& why) {
  if (self->state.ended) return;
  self->state.ended = true;
  self->state.submission->on_end(status, why);
}

/// Tells every worker of the latest generation known here the epochs released, unless a
/// generation carries them already.
void send_release(Submitter* self) {
  auto& s = self->state;
  if (!s.assigned || s.ended || s.release.epochs <= s.assigned->released_epochs) return;
  const gossip::Control release{s.o.self_id, s.o.incarnation, gossip::Control::Command::release_epochs, s.sent.job_id,
                                s.release.encode()};
  for (const auto& address : s.assigned->addresses) send_to(self, address, release);
}

/// Why no node can hold the job's state any more, from this view: every worker of the newest
/// generation known here has left, or runs again in another run (a restart loses the state).
/// Empty: one may hold it. A dead worker may be across a partition from this node, so it is not
/// counted gone; a job whose last holders die for good ends at the report timeout instead.
/// Member `id` as this node's view has it (null: not in it).
const gossip::Member* in_view(const SubmitterState& s, const std::string& id) {
  const auto it = std::find_if(s.view.begin(), s.view.end(), [&](const gossip::Member& m) { return m.id == id; });
  return it == s.view.end() ? nullptr : &*it;
}

std::string state_gone(const SubmitterState& s) {
  if (!s.assigned || s.assigned->workers.empty()) return {};
  const auto& r = *s.assigned;
  std::string gone;
  for (size_t i = 0; i < r.workers.size(); ++i) {
    const gossip::Member* it = in_view(s, r.workers[i]);
    if (!it) return {};
    const uint64_t boot = i < r.worker_boot_ids.size() ? r.worker_boot_ids[i] : 0;
    std::string what;
    if (it->state == gossip::Member::State::left) what = "left";
    else if (elastic::is_live(*it) && boot && it->boot_id && it->boot_id != boot) what = "restarted";
    else return {};
    gone += fmt::format("{}{} {}", gone.empty() ? "" : ", ", r.workers[i], what);
  }
  return gone;
}

/// The newest generation known here, worker by worker as this node's view has it ("generation 3:
/// node-00 (rank 0) dead, node-01 alive"), for a job whose reports stopped: whether rank 0 died,
/// and whether enough of the workers are left to install the next generation (a majority of them).
std::string workers_as_seen(const SubmitterState& s) {
  if (!s.assigned || s.assigned->workers.empty()) return "no generation of it known here";
  const auto& r = *s.assigned;
  std::string out = fmt::format("generation {}'s workers as this node sees them:", r.generation);
  for (size_t i = 0; i < r.workers.size(); ++i) {
    const gossip::Member* m = in_view(s, r.workers[i]);
    out += fmt::format("{} {}{} {}", i ? "," : "", r.workers[i], i == 0 ? " (rank 0)" : "",
                       m ? elastic::state_name(m->state) : "not in this node's view");
  }
  return out;
}

void on_view(Submitter* self, std::vector<gossip::Member> view) {
  auto& s = self->state;
  s.view = std::move(view);
  if (s.ended) return;
  if (s.submitted) {
    // The workers' changes during the job: the job goes on (job control installs the next
    // generation); they are counted for the result.
    for (const auto& m : s.view) {
      if (!elastic::has_role(m, "worker")) continue;
      const auto state = elastic::is_live(m) ? std::string("live") : std::string(m.state == gossip::Member::State::dead ? "died" : "left");
      auto& known = s.workers_seen[m.id];
      std::string event;
      if (known.first.empty()) event = state == "live" ? "joined" : "";
      else if (known.first != state) event = state == "live" ? "came back" : state;
      else if (state == "live" && known.second && m.boot_id && known.second != m.boot_id) event = "restarted";
      known = {state, m.boot_id};
      if (!event.empty()) {
        node_events().info("job_member_event job={} id={} event=\"{}\"", s.sent.job_id, m.id, event);
        s.submission->on_membership_event(m.id + " " + event);
      }
    }
    return;
  }
  size_t workers = 0;
  for (const auto& m : s.view) workers += elastic::is_live(m) && elastic::has_role(m, "worker");
  const auto* coordinator = elastic::coordinator_in(s.view);
  if (!coordinator || workers < std::max<size_t>(1, s.submission->expected_workers)) return;
  s.sent = s.submission->job;
  s.sent.submitter = s.o.self_address;
  for (const auto& m : s.view)
    if (elastic::has_role(m, "worker")) s.workers_seen[m.id] = {elastic::is_live(m) ? "live" : "gone", m.boot_id};
  for (const auto& m : s.view)
    if (elastic::is_live(m) && elastic::has_role(m, "worker")) s.sent.workers.push_back(m.id);
  const gossip::JobStart& request = s.sent;  // workers: those it waits for; the coordinator decides the ring
  s.coordinator_address = coordinator->address;
  s.coordinator_id = coordinator->id;
  send_to(self, coordinator->address, request);
  s.submitted = true;
  s.submitted_at = std::chrono::steady_clock::now();
  node_events().info("job_submitted job={} coordinator={} workers={}", request.job_id, coordinator->id, workers);
}

/// The rank `peer` has in the job: its place in the assignment once the coordinator's copy has
/// come; before that, only whether it is one of the workers submitted to (-1: not of this job).
int64_t rank_of(const SubmitterState& s, const std::string& peer) {
  const auto& workers = s.assigned ? s.assigned->workers : s.sent.workers;
  const auto it = std::find(workers.begin(), workers.end(), peer);
  if (it == workers.end()) return -1;
  return s.assigned ? it - workers.begin() : INT64_MAX;
}

/// A worker asks for a piece of one of the job's files (one it cannot read where the config
/// says): served from this machine, by checksum, only the files the job lists.
void serve_file(Submitter* self, const std::string& peer, const std::string& address, const gossip::FileFetch& f) {
  auto& s = self->state;
  gossip::FilePiece p{f.job_id, f.checksum, f.offset};
  const gossip::JobFile* file = nullptr;
  for (const auto* list : {&s.submission->job.files, &s.served})
    if (const auto it = std::ranges::find(*list, f.checksum, &gossip::JobFile::checksum); !file && it != list->end())
      file = &*it;
  if (f.job_id != s.submission->job.job_id || !file) {
    p.refused = fmt::format("job {} lists no file of checksum {:016x}", s.submission->job.job_id, f.checksum);
  } else if (f.offset >= file->size) {
    p.refused = fmt::format("{} has {} bytes; a piece at {} was asked for", file->path, file->size, f.offset);
  } else {
    const auto length = std::min<uint64_t>({f.length, gossip::FilePiece::max_bytes, file->size - f.offset});
    p.data.resize(length);
    std::ifstream in(file->path, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(f.offset));
    in.read(reinterpret_cast<char*>(p.data.data()), static_cast<std::streamsize>(length));
    if (!in || static_cast<uint64_t>(in.gcount()) != length) {
      p.data.clear();
      p.refused = fmt::format("cannot read {} bytes at {} of {} here (changed since the job was submitted?)", length,
                              f.offset, file->path);
    }
  }
  if (!p.refused.empty())
    node_events().warn("file_fetch_refused from={} reason=\"{}\"", peer, p.refused);
  send_to(self, address, std::move(p));
}

void take_report(Submitter* self, const std::string& peer, const gossip::JobReport& report);
void take_early(Submitter* self);

void on_frame(Submitter* self, const std::string& peer, const std::string& address, const gossip::Message& m) {
  auto& s = self->state;
  if (s.ended) return;
  if (const auto* fetch = std::get_if<gossip::FileFetch>(&m.body)) return serve_file(self, peer, address, *fetch);
  if (const auto* start = std::get_if<gossip::JobStart>(&m.body)) {
    if (!s.submitted || start->coordinator.empty() || start->job_id != s.sent.job_id) return;
    if (!s.assigned) {
      if (peer != s.coordinator_id) return;
      s.assigned = *start;
      s.submission->on_generation(*start);
      return take_early(self);
    }
    // A later generation, from its proposer (the record names it), or from a worker of the
    // generation this node knows. (Records of two generations may arrive out of order.)
    const auto& workers = s.assigned->workers;
    if (start->generation <= s.assigned->generation) return;
    if (peer != start->coordinator && std::find(workers.begin(), workers.end(), peer) == workers.end()) {
      node_events().warn("generation_refused from={} reason=\"not a worker of job {}'s generation {}\"", peer,
                         s.sent.job_id, s.assigned->generation);
      return;
    }
    // Under another rank 0 (or another run of it) every worker ends the job again: the done reports
    // so far count for nothing. Else each stands while its worker is the same run.
    if (!elastic::same_rank0(*s.assigned, *start)) {
      s.done.clear();
      s.rank0_done_at.reset();
    }
    s.assigned = *start;
    std::erase_if(s.done, [&](const auto& d) { return elastic::worker_boot(*start, d.first) != d.second; });
    send_release(self);  // a release the generation does not carry yet (its workers may be new)
    node_events().info("job_generation job={} generation={} workers={} resume_step={}", start->job_id,
                       start->generation, start->workers.size(), start->resume.step);
    s.submission->on_generation(*start);
    take_early(self);
    return;
  }
  if (const auto* push = std::get_if<gossip::ParamPush>(&m.body)) {
    // The final model comes from rank 0, and only from it.
    if (rank_of(s, peer) != 0) {
      node_events().warn("param_push_refused from={} reason=\"not rank 0 of job {}\"", peer, s.sent.job_id);
      return;
    }
    if (push->shard == 0 && push->chunk.total > 0) s.submission->on_params(push->chunk);
    return;
  }
  const auto* r = std::get_if<gossip::JobReport>(&m.body);
  if (!r || r->job_id != s.sent.job_id) return;
  if (s.assigned && r->generation > s.assigned->generation) {
    if (s.early.size() == SubmitterState::early_max) {
      auto oldest = std::move(s.early.front());
      s.early.pop_front();
      take_report(self, oldest.peer, oldest.report);
      if (s.ended) return;
    }
    node_events().info("job_report_held from={} generation={} known={} reason=\"its generation's record has not come\"",
                       peer, r->generation, s.assigned->generation);
    s.early.push_back({peer, *r, std::chrono::steady_clock::now()});
    return;
  }
  take_report(self, peer, *r);
}

/// Takes the held reports whose record has come, or that have waited long enough.
void take_early(Submitter* self) {
  auto& s = self->state;
  const auto now = std::chrono::steady_clock::now();
  const auto due = [&](const SubmitterState::Early& e) {
    return !s.assigned || e.report.generation <= s.assigned->generation ||
           std::chrono::duration<double>(now - e.at).count() > SubmitterState::early_hold_s;
  };
  auto held = std::exchange(s.early, {});
  for (auto& e : held) {
    if (s.ended) return;
    if (due(e)) take_report(self, e.peer, e.report);
    else s.early.push_back(std::move(e));
  }
}

void take_report(Submitter* self, const std::string& peer, const gossip::JobReport& r) {
  auto& s = self->state;
  if (const int64_t rank = rank_of(s, peer); rank < 0 || (rank != INT64_MAX && rank != r.rank)) {
    node_events().warn("job_report_refused from={} rank={} reason=\"not that worker of job {}\"", peer, r.rank,
                       s.sent.job_id);
    return;
  }
  s.heard = true;
  s.last_report = std::chrono::steady_clock::now();
  s.submission->on_report(r, peer);
  if (r.kind == gossip::JobReport::Kind::failed) return end(self, 1, r.error);
  // Detaching once the job trains (rank 0's first progress): a job refused by a worker, or one that
  // cannot set up, has failed here first, with its reason.
  if (s.submission->detach && r.kind == gossip::JobReport::Kind::progress) return end(self, 0, "detached");
  if (r.kind == gossip::JobReport::Kind::done && s.assigned) {
    s.done[peer] = elastic::worker_boot(*s.assigned, peer);
    if (r.rank == 0 && !s.rank0_done_at) s.rank0_done_at = std::chrono::steady_clock::now();
    if (std::ranges::all_of(s.assigned->workers, [&](const std::string& w) { return s.done.contains(w); }))
      end(self, 0, "");
  }
}

caf::behavior submitter(Submitter* self, SubmitterOptions options, std::shared_ptr<Submission> submission,
                        caf::actor router) {
  self->state.o = std::move(options);
  self->state.submission = std::move(submission);
  self->state.release.epochs = self->state.submission->job.released_epochs;
  const auto handle = caf::actor_cast<caf::actor>(self);
  self->state.submission->set_controls(
      [handle](uint32_t epochs, std::string reset_file, uint64_t reset_checksum, std::string optimizer) {
        caf::anon_send(handle, release_atom::value, epochs, std::move(reset_file), reset_checksum, std::move(optimizer));
      },
      [handle] { caf::anon_send(handle, stop_atom::value); });
  self->attach_functor([submission = self->state.submission] { submission->set_controls({}, {}); });
  caf::anon_send(router, job_atom::value, caf::actor_cast<caf::actor>(self));
  self->delayed_send(self, std::chrono::seconds(1), tick_atom::value);  // watches the join
  return {
      [self](view_atom, std::vector<gossip::Member> view) { on_view(self, std::move(view)); },
      [self](wire_atom, const std::string& peer, const std::string& address, const gossip::Message& m) {
        on_frame(self, peer, address, m);
      },
      [self](peer_atom, const std::string& peer, const std::string& detail) {
        self->state.trouble = fmt::format("{}: {}", peer, detail);
      },
      [self](tick_atom) {
        // A join that does not happen, or a job nobody answers for, is a failure to report, not a
        // reason to wait forever.
        auto& s = self->state;
        if (s.ended) return;
        if (s.assigned) {
          // Every node that held the state is gone: said once it has lasted a while with no
          // report (should this view be behind a generation), instead of at the report timeout.
          const auto now = std::chrono::steady_clock::now();
          const auto gone = state_gone(s);
          if (gone.empty() || (s.gone_since && s.heard && s.last_report > *s.gone_since)) s.gone_since.reset();
          if (!gone.empty() && !s.gone_since) s.gone_since = now;
          if (!gone.empty() && std::chrono::duration<double>(now - *s.gone_since).count() > SubmitterState::gone_grace_s)
            return end(self, 1,
                       fmt::format("job {} lost its state: every worker of generation {} is gone ({}), so no node "
                                   "holds it; without a checkpoint it cannot resume",
                                   s.sent.job_id, s.assigned->generation, gone));
        }
        send_release(self);  // again, should the release or its generation have been lost
        take_early(self);  // reports whose record is overdue
        if (s.ended) return;
        // (Not while a done report waits for its generation's record: it is taken within early_hold_s.)
        const bool done_held = std::ranges::any_of(
            s.early, [](const SubmitterState::Early& e) { return e.report.kind == gossip::JobReport::Kind::done; });
        if (s.rank0_done_at && !done_held &&
            std::chrono::duration<double>(std::chrono::steady_clock::now() - *s.rank0_done_at).count() >
                SubmitterState::rank0_done_grace_s) {
          std::string missing;
          for (const auto& w : s.assigned->workers)
            if (!s.done.contains(w)) missing += (missing.empty() ? "" : " ") + w;
          node_events().warn("job_ended_without_done job={} workers=\"{}\" reason=\"rank 0 completed the job {:.0f} s "
                             "ago; their done reports did not come\"",
                             s.sent.job_id, missing, SubmitterState::rank0_done_grace_s);
          return end(self, 0, "");
        }
        if (s.heard) {
          // Reports stopped: rank 0 is gone or cannot reach this node.
          const double quiet = std::chrono::duration<double>(std::chrono::steady_clock::now() - s.last_report).count();
          if (quiet > s.submission->report_timeout_s)
            return end(self, 1,
                       fmt::format("no report on job {} for {:.0f} s; {} (`tepdist status` says whether job control "
                                   "is waiting for a majority of them)",
                                   s.sent.job_id, quiet, workers_as_seen(s)));
          self->delayed_send(self, std::chrono::seconds(1), tick_atom::value);
          return;
        }
        if (!s.submitted) {
          if (std::chrono::duration<double>(std::chrono::steady_clock::now() - s.started_at).count() >
              s.submission->join_timeout_s)
            return end(self, 1, fmt::format("could not join the cluster within {} s ({}); last connection problem: {}",
                                            s.submission->join_timeout_s,
                                            s.submission->expected_workers
                                                ? fmt::format("waiting for {} workers", s.submission->expected_workers)
                                                : std::string("no coordinator and worker seen"),
                                            s.trouble.empty() ? std::string("none") : s.trouble));
          self->delayed_send(self, std::chrono::seconds(1), tick_atom::value);
          return;
        }
        if (std::chrono::steady_clock::now() - s.submitted_at > std::chrono::seconds(60))
          return end(self, 1, fmt::format("the coordinator at {} did not answer job {} within 60 s",
                                          s.coordinator_address, s.sent.job_id));
        self->delayed_send(self, std::chrono::seconds(5), tick_atom::value);
      },
      [self](release_atom, uint32_t epochs, std::string reset_file, uint64_t reset_checksum, std::string optimizer) {
        auto& s = self->state;
        if (epochs <= s.release.epochs) return;
        s.release = {epochs, {reset_file}, 0, std::move(optimizer)};
        if (reset_checksum) {
          // The file's bytes, for workers that fetch it (they cannot read it where it is).
          auto described = elastic::describe_file(reset_file);
          if (!described) return end(self, 1, fmt::format("the parameters to release: {}", described.error()));
          s.release.reset_file = *described;
          s.release.reset_checksum = reset_checksum;
          s.served.push_back(*described);
        }
        node_events().info("job_released job={} epochs={} reset=\"{}\"", s.sent.job_id, epochs, reset_file);
        send_release(self);
      },
      [self](stop_atom) {
        auto& s = self->state;
        if (!s.submitted || s.ended) return;
        // To every worker of the latest generation it knows (any of them relays it), else to the
        // coordinator it submitted to.
        const gossip::Control stop{s.o.self_id, s.o.incarnation, gossip::Control::Command::stop_job, s.sent.job_id, {}};
        if (!s.assigned) return send_to(self, s.coordinator_address, stop);
        for (const auto& address : s.assigned->addresses) send_to(self, address, stop);
      },
  };
}

}  // namespace

bool Submission::release(uint32_t epochs, std::string reset_file, uint64_t reset_checksum, std::string optimizer) {
  std::lock_guard lock(controls_->mutex);
  if (!controls_->release) return false;
  controls_->release(epochs, std::move(reset_file), reset_checksum, std::move(optimizer));
  return true;
}

bool Submission::stop() {
  std::lock_guard lock(controls_->mutex);
  if (!controls_->stop) return false;
  controls_->stop();
  return true;
}

void Submission::set_controls(Release release, std::function<void()> stop) {
  std::lock_guard lock(controls_->mutex);
  controls_->release = std::move(release);
  controls_->stop = std::move(stop);
}

RoleSpec submitter_role(SubmitterOptions options, std::shared_ptr<Submission> submission, caf::actor router) {
  return {"submitter", [options, submission, router](caf::local_actor& parent, const caf::actor&, const caf::message&) {
            return caf::actor(parent.spawn(submitter, options, submission, router));
          }};
}

}  // namespace tepdist::actors

#include "actors/router.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/skip.hpp>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <fmt/format.h>

#include <algorithm>

#include "actors/atoms.hpp"
#include "base/thread_name.hpp"
#include "elastic/coordination.hpp"

namespace tepdist::actors {
namespace {

using Router = caf::stateful_actor<RouterState>;
using gossip::Member;
using gossip::swim::Event;

double now_ms(Router* self) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - self->state.start).count();
}

void send(Router* self, const std::string& address, gossip::Body body) {
  auto& s = self->state;
  // The core does not know the cluster epoch; every state sync carries it, so joiners learn it.
  if (auto* sync = std::get_if<gossip::StateSync>(&body)) sync->epoch_unix_ms = s.epoch_unix_ms;
  gossip::Message m{s.swim->self().id, s.swim->self().incarnation, s.cluster_id, std::move(body)};
  if (!s.transport->send(address, m) && !s.transport->stopping())  // stopping: nothing goes out any more
    node_events().warn("send_refused peer={} reason=\"send queue full\"", address);
}

/// Logs the view and the coordinator it names (the one rule, elastic::coordinator_in).
void log_view(Router* self) {
  const auto members = self->state.swim->members();
  const auto live = std::count_if(members.begin(), members.end(), [](const Member& m) { return elastic::is_live(m); });
  const Member* coordinator = elastic::coordinator_in(members);
  node_events().info("view members={} coordinator={}", live, coordinator ? coordinator->id : std::string("none"));
}

void schedule_tick(Router* self) {
  auto& s = self->state;
  const double now = now_ms(self);
  const double wait = std::clamp(s.swim->next_deadline_ms() - now, 1.0, 250.0);
  // A tick already on its way that comes no later than needed will do. One that would come later
  // (a message just brought an earlier deadline) does not: the core would take that tick for its
  // own lateness. Then another goes; the extra one does nothing when it comes.
  if (s.tick_pending && s.tick_at_ms <= now + wait) return;
  s.tick_pending = true;
  s.tick_at_ms = now + wait;
  self->delayed_send(self, std::chrono::microseconds(static_cast<int64_t>(wait * 1000)), tick_atom::value);
}

/// Carries out what the SWIM core asked for: sends, then events.
/// What a status query is answered with: the view, the job, every node's figures, the events.
gossip::StateSync status_answer(const RouterState& s) {
  return {s.swim->members(), true, s.epoch_unix_ms, s.placement, s.job_status, s.figures,
          std::vector<gossip::MemberEvent>(s.events.begin(), s.events.end())};
}

void apply(Router* self, gossip::swim::Output& out) {
  for (auto& s : out.sends) send(self, s.address, std::move(s.body));
  bool view_changed = false;
  for (const auto& e : out.events) {
    const Member& m = e.member;
    if (e.kind == Event::Kind::suspected || e.kind == Event::Kind::refuted)
      node_events().info("member_{} id={} address={} incarnation={} region={} by={}", gossip::swim::event_name(e.kind),
                         m.id, m.address, m.incarnation, m.region, m.accuser);
    else
      node_events().info("member_{} id={} address={} incarnation={} region={}", gossip::swim::event_name(e.kind), m.id,
                         m.address, m.incarnation, m.region);
    view_changed |= e.kind != Event::Kind::updated && e.kind != Event::Kind::refuted;
    if (e.kind != Event::Kind::updated) {  // the timeline /status shows
      auto& events = self->state.events;
      events.push_back({unix_ms(), gossip::swim::event_name(e.kind), m.id});
      while (events.size() > RouterState::event_limit) events.pop_front();
    }
    // What waits for a member gone for good will never be read: its queue's memory goes now.
    if (e.kind == Event::Kind::dead || e.kind == Event::Kind::left) self->state.transport->forget(m.address);
  }
  if (view_changed) {
    log_view(self);
    if (self->state.job) caf::anon_send(self->state.job, view_atom::value, self->state.swim->members());
  }
  schedule_tick(self);
}

void on_frame(Router* self, const std::string& peer, const std::string& address, const gossip::Message& m) {
  auto& s = self->state;
  if (const auto* sync = std::get_if<gossip::StateSync>(&m.body)) {
    // The cluster epoch is the earliest any member started with; all converge on it.
    if (sync->epoch_unix_ms && sync->epoch_unix_ms < s.epoch_unix_ms) {
      s.epoch_unix_ms = sync->epoch_unix_ms;
      s.transport->set_epoch_unix_ms(s.epoch_unix_ms);
    }
    // An empty, unanswered sync from someone who is not a member is a status query
    // (`tepdist status`): answer with the whole view, and do not take the asker for a member.
    if (sync->members.empty() && !sync->reply) {
      send(self, address, status_answer(s));
      return;
    }
  }
  if (const auto* leave = std::get_if<gossip::LeaveRequest>(&m.body); leave && leave->kind == gossip::LeaveRequest::Kind::request) {
    // `tepdist leave NODE`, sent to the address the asker's view holds for NODE.
    using Kind = gossip::LeaveRequest::Kind;
    const std::string& self_id = s.swim->self().id;
    if (leave->node != self_id)
      return send(self, address, gossip::LeaveRequest{leave->node, Kind::refused,
                                                      fmt::format("this is {}, not {}", self_id, leave->node)});
    if (!s.on_leave_request)
      return send(self, address, gossip::LeaveRequest{leave->node, Kind::refused, "this node submits a job; it trains nothing"});
    if (s.leave_requested)  // the first asker gets the final answer; a second would wait for none
      return send(self, address, gossip::LeaveRequest{leave->node, Kind::refused, "already leaving"});
    node_events().info("leave_requested by={}", peer);
    send(self, address, gossip::LeaveRequest{leave->node, Kind::accepted, "draining: the step under way ends, then it leaves"});
    s.leave_requested = true;
    s.on_leave_request(address);
    return;
  }
  if (gossip::is_membership(m.body)) {
    gossip::swim::Output out;
    s.swim->on_message(now_ms(self), peer, address, m.body, out);
    apply(self, out);
    return;
  }
  // Every node's figures (the monitor role's gossip): the monitor merges them; none before it registers.
  if (std::holds_alternative<gossip::MetricsSnapshot>(m.body)) {
    if (s.monitor) caf::anon_send(s.monitor, wire_atom::value, peer, address, m);
    return;
  }
  // Async jobs' gradients and pulls: the shard host, so they never wait behind a training step.
  const auto* u = std::get_if<gossip::ShardUpdate>(&m.body);
  const auto* transfer = std::get_if<gossip::ShardTransfer>(&m.body);
  // ... and a shard's state, pulled striped from its holders (the job's own state goes to the trainer).
  const auto* pull = std::get_if<gossip::StatePull>(&m.body);
  const auto* piece = std::get_if<gossip::StatePiece>(&m.body);
  if (u || transfer || (pull && pull->of_shard) || (piece && piece->of_shard)) {
    if (s.shards) {
      caf::anon_send(s.shards, wire_atom::value, peer, address, m);
      return;
    }
    // A worker that started the job sooner may push before this node's host exists: keep its
    // updates (bounded) for the host to come.
    const size_t bytes = (u ? u->chunk.data.size_bytes()
                          : transfer ? transfer->chunk.data.size_bytes()
                          : piece ? piece->chunk.data.size_bytes() : 0) + 64;
    if (s.early_shard_bytes + bytes > RouterState::early_shard_limit) {
      node_events().warn("message_dropped from={} kind=shard_update reason=\"no shard host, and {} MiB already wait\"",
                         peer, s.early_shard_bytes >> 20);
      return;
    }
    s.early_shard_bytes += bytes;
    s.early_shards.push_back({peer, address, m});
    return;
  }
  // Jobs: the trainer (a worker node) or the submitter (tepdist run) takes them.
  if (std::holds_alternative<gossip::ShardState>(m.body) || std::holds_alternative<gossip::GossipAverage>(m.body) ||
      std::holds_alternative<gossip::JobStart>(m.body) || std::holds_alternative<gossip::RingChunk>(m.body) ||
      std::holds_alternative<gossip::JobReport>(m.body) || std::holds_alternative<gossip::Control>(m.body) ||
      std::holds_alternative<gossip::ParamPush>(m.body) || std::holds_alternative<gossip::GenerationVote>(m.body) ||
      std::holds_alternative<gossip::StatePull>(m.body) || std::holds_alternative<gossip::StatePiece>(m.body) ||
      std::holds_alternative<gossip::FileFetch>(m.body) || std::holds_alternative<gossip::FilePiece>(m.body)) {
    if (s.job) {
      caf::anon_send(s.job, wire_atom::value, peer, address, m);
      return;
    }
    // The trainer or submitter has not registered yet (the supervisor starts roles after the
    // transport): a job or its first chunks wait for it, bounded, rather than vanish.
    if (s.early_jobs.size() >= RouterState::early_job_limit) {
      node_events().warn("message_dropped from={} kind={} reason=\"no trainer yet, and {} frames already wait\"", peer,
                         gossip::kind_name(m.body), s.early_jobs.size());
      return;
    }
    s.early_jobs.push_back({peer, address, m});
    return;
  }
  node_events().debug("message_ignored from={} kind={}", peer, gossip::kind_name(m.body));
}

}  // namespace

uint64_t unix_ms() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

spdlog::logger& node_events() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stdout_logger_mt("node");
    l->set_pattern("%Y-%m-%dT%H:%M:%S.%e %v");
    l->flush_on(spdlog::level::info);
    return l;
  }();
  return *logger;
}

bool node_events_to_file(const std::string& path) {
  try {
    auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path);
    auto& sinks = node_events().sinks();
    sinks.clear();
    sinks.push_back(std::move(sink));
    return true;
  } catch (const spdlog::spdlog_ex&) {
    return false;
  }
}

caf::behavior router(caf::stateful_actor<RouterState>* self, gossip::Transport* transport, std::string cluster_id) {
  base::name_this_thread("router");  // detached: this is its own thread
  self->state.transport = transport;
  self->state.cluster_id = std::move(cluster_id);
  self->state.start = std::chrono::steady_clock::now();
  // Frames may arrive before init tells the router who it is: keep them until then.
  self->set_default_handler(caf::skip);
  return {[self](init_atom, const RouterInit& init) {
    auto& s = self->state;
    s.supervisor = init.supervisor;
    s.on_leave_request = init.on_leave_request;
    s.epoch_unix_ms = init.epoch_unix_ms;
    s.random.seed(init.self.incarnation);
    s.swim = std::make_unique<gossip::swim::Swim>(init.self, init.swim,
                                                  [self](uint64_t n) { return self->state.random() % n; });
    self->set_default_handler(caf::print_and_drop);
    gossip::swim::Output out;
    s.swim->join(now_ms(self), init.seeds, out);
    apply(self, out);
    log_view(self);
    self->become(caf::behavior{
        [self](wire_atom, const std::string& peer, const std::string& address, const gossip::Message& m) {
          on_frame(self, peer, address, m);
        },
        [self](peer_atom, bool up, const std::string& peer, const std::string& detail) {
          if (detail.starts_with("refused: ")) {
            // Logged where it happened (peer_refused); the job actor hears it like any trouble.
          } else {
            node_events().info("{} id={} {}", up ? "peer_up" : "peer_down", peer, detail);
          }
          if (!up && self->state.job) caf::anon_send(self->state.job, peer_atom::value, peer, detail);
          else if (!up) self->state.early_trouble.emplace(peer, detail);
        },
        [self](tick_atom) {
          self->state.tick_pending = false;
          gossip::swim::Output out;
          self->state.swim->tick(now_ms(self), out);
          apply(self, out);
        },
        [self](shards_atom, const caf::actor& host, std::vector<gossip::ShardHolders> placement) {
          auto& s = self->state;
          s.shards = host;
          s.placement = std::move(placement);
          if (!host) {  // the job is over: what waits is its stragglers' or junk
            s.early_shards.clear();
            s.early_shard_bytes = 0;
            return;
          }
          for (auto& [peer, address, m] : s.early_shards) caf::anon_send(host, wire_atom::value, peer, address, std::move(m));
          s.early_shards.clear();
          s.early_shard_bytes = 0;
        },
        [self](status_atom, std::optional<gossip::JobStatus> status) { self->state.job_status = std::move(status); },
        // The node's own HTTP endpoint (/status): the answer a status query over the wire gets.
        [self](get_atom, status_atom) {
          const auto& s = self->state;
          return status_answer(s);
        },
        [self](monitor_atom, const caf::actor& monitor) { self->state.monitor = monitor; },
        [self](monitor_atom, gossip::MetricsSnapshot figures) { self->state.figures = std::move(figures); },
        [self](boot_atom, uint64_t boot_id) {
          auto& s = self->state;
          if (boot_id == 0 || boot_id == s.swim->self().boot_id) return;
          node_events().warn("node_new_boot id={} boot_id={:016x} reason=\"the trainer restarted without its job "
                             "state; members take this node for a restarted one\"",
                             s.swim->self().id, boot_id);
          gossip::swim::Output out;
          s.swim->new_boot(now_ms(self), boot_id, out);
          apply(self, out);
        },
        [self](job_atom, const caf::actor& job) {
          auto& s = self->state;
          s.job = job;
          caf::anon_send(job, view_atom::value, s.swim->members());
          for (auto& [peer, address, m] : s.early_jobs) caf::anon_send(job, wire_atom::value, peer, address, std::move(m));
          s.early_jobs.clear();
          if (s.early_trouble) caf::anon_send(job, peer_atom::value, s.early_trouble->first, s.early_trouble->second);
          s.early_trouble.reset();
        },
        [self](leave_atom) {
          gossip::swim::Output out;
          self->state.swim->leave(now_ms(self), out);
          for (auto& s : out.sends) send(self, s.address, std::move(s.body));
          return true;
        },
    });
  }};
}

}  // namespace tepdist::actors

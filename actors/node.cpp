#include "actors/node.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/system_messages.hpp>
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>

#include "actors/atoms.hpp"
#include "actors/monitor_http.hpp"
#include "actors/roles/monitor.hpp"
#include "actors/roles/trainer.hpp"
#include "actors/router.hpp"
#include "actors/supervisor.hpp"
#include "elastic/status.hpp"
#include "gossip/transport/transport.hpp"

namespace tepdist::actors {
namespace {

/// Writes the ready file atomically: a reader sees nothing or all of it. The first line is the
/// node's address; a second, "http=HOST:PORT", its monitor endpoint when it has one.
bool write_ready_file(const std::string& path, const std::string& address, const std::string& http) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << address << "\n";
    if (!http.empty()) out << "http=" << http << "\n";
    if (!out) return false;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  return !ec;
}

/// Takes the node down in order on every way out of run_node: the transport first (no frame
/// reaches an actor after), then every actor, waiting for them while the objects they point to
/// (the transport, the registry, run_node's locals) still exist.
class Teardown {
 public:
  Teardown(caf::actor_system& sys, gossip::Transport& transport) : sys_(sys), transport_(transport) {}
  Teardown(const Teardown&) = delete;
  Teardown& operator=(const Teardown&) = delete;
  void add(caf::actor a) { actors_.push_back(std::move(a)); }
  ~Teardown() {
    transport_.stop();
    for (const auto& a : actors_) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    sys_.await_all_actors_done();
  }

 private:
  caf::actor_system& sys_;
  gossip::Transport& transport_;
  std::vector<caf::actor> actors_;
};

}  // namespace

uint64_t new_boot_id(uint64_t other_than) {
  std::random_device device;
  uint64_t id = (static_cast<uint64_t>(device()) << 32) ^ device();
  while (id == 0 || id == other_than) id = (id << 1) ^ device();
  return id;
}

int run_node(const NodeOptions& o) {
  // Signals are taken by sigwait in this thread only: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  for (int s : {SIGINT, SIGTERM, SIGUSR1}) sigaddset(&signals, s);
  // Fault injection, for tests and bench/chaos.sh: SIGUSR2 to a worker node crashes its trainer
  // role, which its supervisor restarts; SIGRTMIN hangs it (its thread blocks for three times the job's
  // step_timeout_s) while membership, on its own thread, goes on answering: a worker alive to
  // membership that blocks the ring; SIGRTMIN+1 crashes the router, which the node cannot do
  // without: it exits non-zero (a launcher's restart policy brings it back); SIGRTMIN+2 crashes an
  // async job's shard host, which takes its trainer with it (they are linked); SIGRTMIN+3 makes the
  // node, as rank 0, die just before it completes its job (after the others reported theirs). (A
  // submitter, which may live in a user's program, leaves all five alone.)
  const int crash_router_signal = SIGRTMIN + 1;
  const int crash_host_signal = SIGRTMIN + 2;
  const int die_at_end_signal = SIGRTMIN + 3;
  if (!o.submission) {
    sigaddset(&signals, SIGUSR2);
    sigaddset(&signals, SIGRTMIN);
    sigaddset(&signals, crash_router_signal);
    sigaddset(&signals, crash_host_signal);
    sigaddset(&signals, die_at_end_signal);
  }
  // A program may run several nodes one after another (tepdist::Trainer runs one submitter per
  // epoch): the caller's mask comes back when this returns (declared first, so after teardown),
  // and no signal meant for one node is left for the next.
  struct SignalScope {
    sigset_t signals, previous;
    explicit SignalScope(const sigset_t& s) : signals(s) {
      pthread_sigmask(SIG_BLOCK, &signals, &previous);
      drain(true);
    }
    ~SignalScope() {
      drain(false);
      pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    }
    /// Consumes pending SIGUSR1 (and, leaving, SIGINT and SIGTERM too).
    void drain(bool wakes_only) const {
      sigset_t pending = signals;
      if (wakes_only) {
        sigemptyset(&pending);
        sigaddset(&pending, SIGUSR1);
      }
      const timespec now_only{0, 0};
      while (sigtimedwait(&pending, nullptr, &now_only) > 0) {
      }
    }
  } signal_scope(signals);
  // Wakes this thread, not the process: a program whose other threads do not block SIGUSR1
  // must not be killed by it.
  const pthread_t waiter = pthread_self();

  const uint64_t incarnation = unix_ms();  // above any incarnation an earlier run of this id used
  // New for each run of this process, never 0 (unknown): members tell a restart from a refutation by
  // it, and a job assignment names its coordinator's.
  const uint64_t boot_id = new_boot_id();
  gossip::MetricsRegistry metrics;  // before the actors: the monitor role reads it until they are gone
  caf::actor_system_config cfg;
  // The work-sharing scheduler sleeps on a condition variable when idle; CAF's default
  // work-stealing one polls, and on a node whose cores are busy training that polling steals
  // compute from the trainer (measured: a third of a 2-core machine's throughput). Two threads
  // suffice: the heavy actors (trainer, evaluator) are detached, on threads of their own.
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("scheduler.max-threads", size_t{2});
  caf::actor_system sys{cfg};

  gossip::TransportOptions topts;
  const auto colon = o.listen.rfind(':');
  if (colon == std::string::npos) {
    fmt::print(stderr, "tepdist node: --listen {}: expected host:port\n", o.listen);
    return 2;
  }
  topts.listen_host = o.listen.substr(0, colon);
  topts.listen_port = static_cast<uint16_t>(std::atoi(o.listen.c_str() + colon + 1));
  topts.identity = {o.config.cluster.cluster_id, o.name, o.region, o.secret, "", o.config.cluster.frames()};
  topts.limits.max_frame_bytes = static_cast<uint32_t>(o.config.cluster.max_frame_mb) << 20;
  topts.send_queue_bytes = static_cast<size_t>(o.config.cluster.send_queue_mb) << 20;
  topts.receive_queue_bytes = static_cast<size_t>(o.config.cluster.receive_queue_mb) << 20;
  topts.receive_total_bytes = static_cast<size_t>(o.config.cluster.receive_total_mb) << 20;
  topts.reconnect_max_ms = static_cast<uint64_t>(o.config.cluster.reconnect_max_ms);
  topts.network = o.config.network.model;
  topts.epoch_unix_ms = incarnation;  // until membership carries the cluster epoch
  topts.seed = incarnation;
  topts.metrics = &metrics;

  // How the node ends when not by a signal: the supervisor gave up (watcher below) or the
  // submitted job ended. Either wakes the main thread with SIGUSR1.
  std::mutex outcome_mutex;
  int outcome_status = 1;
  std::string outcome;
  auto end_with = [&](int status, const std::string& why) {
    {
      std::lock_guard lock(outcome_mutex);
      outcome_status = status;
      outcome = why;
    }
    pthread_kill(waiter, SIGUSR1);
  };
  // `tepdist leave` named this node: the router hands over the asker's address and the main thread
  // takes the SIGTERM path (drain, then leave), answering the asker when it has drained.
  std::mutex leave_mutex;
  std::string leave_asker;
  auto on_leave_request = [&](const std::string& asker) {
    {
      std::lock_guard lock(leave_mutex);
      leave_asker = asker;
    }
    pthread_kill(waiter, SIGTERM);
  };
  caf::actor router_actor;
  std::mutex router_mutex;  // the transport thread reads router_actor; it is set once, below
  auto to_router = [&](auto... xs) {
    std::lock_guard lock(router_mutex);
    if (router_actor) caf::anon_send(router_actor, xs...);
  };
  gossip::TransportEvents tevents{
      [&](const std::string& peer, const std::string& address, gossip::Message m) {
        to_router(wire_atom::value, peer, address, std::move(m));
      },
      [&](const std::string& peer, const std::string& address) {
        to_router(peer_atom::value, true, peer, "address=" + address);
      },
      [&](const std::string& peer, const std::string& reason) {
        to_router(peer_atom::value, false, peer, "reason=\"" + reason + "\"");
      },
      [&](const std::string& peer, const std::string& reason) {
        node_events().warn("peer_refused peer={} reason=\"{}\"", peer, reason);
        to_router(peer_atom::value, false, peer, "refused: " + reason);
      }};
  gossip::Transport transport(topts, tevents);
  Teardown teardown(sys, transport);
  {
    std::lock_guard lock(router_mutex);
    // Detached: membership runs on a thread of its own, so its probes and acks never wait for the
    // scheduler's two threads behind the roles' work (a late ack is a suspicion somewhere else).
    router_actor = sys.spawn<caf::detached>(router, &transport, o.config.cluster.cluster_id);
  }
  teardown.add(router_actor);
  auto bound = transport.start();
  if (!bound) {
    fmt::print(stderr, "tepdist node: {}\n", bound.error());
    return 1;
  }
  const std::string id = o.name.empty() ? *bound : o.name;  // the transport made the same choice
  metrics.set_common_labels({{"node", id}});  // one scrape target among many: every series says whose

  // The monitor's HTTP endpoint, before the node joins (a port it cannot have stops the node before
  // anyone counts on it). Stopped before the actors it asks are: it is declared after the teardown,
  // so it goes first. Its status view waits in the router's mailbox until the router is set up.
  std::optional<MonitorHttp> http;
  std::string http_address;
  if (!o.config.monitor.http.empty()) {
    MonitorHttpViews views;
    views.metrics = [&metrics] { return metrics.render_prometheus(); };
    views.status_json = [&sys, router = router_actor, source = *bound]() -> std::expected<std::string, std::string> {
      caf::scoped_actor asker{sys};
      std::expected<std::string, std::string> json = std::unexpected(std::string("the router did not answer"));
      asker->request(router, std::chrono::seconds(2), get_atom::value, status_atom::value)
          .receive([&](const gossip::StateSync& sync) { json = elastic::status_json(elastic::status_document(source, sync)); },
                   [&](const caf::error& e) { json = std::unexpected("the router did not answer: " + sys.render(e)); });
      return json;
    };
    http.emplace(MonitorHttpOptions{o.config.monitor.http}, std::move(views));
    auto started = http->start();
    if (!started) {
      fmt::print(stderr, "tepdist node: {}\n", started.error());
      return 1;
    }
    http_address = *started;
  }

  // The roles, under the supervisor. The names a node advertises in its member record are what it
  // can do: coordinate (the one rule picks who does), host async shards, train, monitor; the
  // trainer actor does the first three for each job.
  std::vector<RoleSpec> roles;
  std::vector<std::string> role_names;
  const MonitorOptions monitor_options{&metrics, &transport, o.config.cluster.cluster_id, id, incarnation};
  if (o.submission) {
    auto submission = std::make_shared<Submission>(*o.submission);
    submission->on_end = [&, user = o.submission->on_end](int status, const std::string& why) {
      if (user) user(status, why);
      end_with(status, why);
    };
    roles = {monitor_role(monitor_options, router_actor),
             submitter_role({&transport, o.config.cluster.cluster_id, id, *bound, incarnation}, submission, router_actor)};
    role_names = {"submitter", "monitor"};
  } else {
    roles = {monitor_role(monitor_options, router_actor),
             trainer_role({&transport, o.config.cluster.cluster_id, id, *bound, incarnation, o.threads,
                                       o.config.cluster.max_frame_mb << 10, boot_id, o.config.cluster.results_dir,
                                       o.slowdown, &metrics, o.device},
                                      router_actor)};
    role_names = {"coordinator", "parameter-shard", "worker", "monitor"};
  }
  auto sup = sys.spawn(supervisor, std::move(roles), SupervisorOptions{});
  teardown.add(caf::actor(sup));
  RouterInit init;
  init.self = {id, *bound, incarnation, gossip::Member::State::alive, o.region, role_names, {}, boot_id};
  init.seeds = o.join;
  init.swim = o.config.membership.swim();
  init.epoch_unix_ms = incarnation;
  init.supervisor = caf::actor(sup);
  if (!o.submission) init.on_leave_request = on_leave_request;
  caf::anon_send(router_actor, init_atom::value, init);

  // The supervisor's end, or the router's, wakes the main thread through SIGUSR1. The router runs
  // membership and carries every frame to the roles; it holds no state a restart could bring back
  // that the others would still trust (its view, its incarnation), so a node without it stops, and
  // comes back, if at all, as a restarted node with a new boot id.
  auto watcher = sys.spawn([&, sup, router = router_actor](caf::event_based_actor* self) -> caf::behavior {
    self->monitor(sup);
    self->monitor(router);
    self->set_down_handler([&, router_address = router.address()](const caf::down_msg& d) {
      if (d.source == router_address)
        end_with(1, fmt::format("the router (membership and every frame) stopped: {}",
                                d.reason ? sys.render(d.reason) : "without a reason"));
      else
        end_with(1, d.reason ? sys.render(d.reason) : "supervisor stopped");
    });
    return {[](get_atom) {}};
  });
  teardown.add(watcher);

  if (!o.ready_file.empty() && !write_ready_file(o.ready_file, *bound, http_address)) {
    fmt::print(stderr, "tepdist node: cannot write the ready file {}\n", o.ready_file);
    return 1;
  }
  node_events().info("node_ready id={} address={} region={} incarnation={} boot_id={:016x} http={} device={} slowdown={}",
                     id, *bound, o.region, incarnation, boot_id, http_address.empty() ? "off" : http_address,
                     o.device < 0 ? std::string("job") : std::to_string(o.device), o.slowdown);

  int sig = 0;
  caf::scoped_actor asker{sys};
  // The trainer role as the supervisor holds it now (a restart replaces it); none on a submitter.
  const auto with_trainer = [&](auto f) {
    asker->request(caf::actor(sup), std::chrono::seconds(2), get_atom::value, role_atom::value, std::string("trainer"))
        .receive(f, [](const caf::error&) {});
  };
  for (sigwait(&signals, &sig);
       sig == SIGUSR2 || sig == SIGRTMIN || sig == crash_router_signal || sig == crash_host_signal ||
       sig == die_at_end_signal;
       sigwait(&signals, &sig)) {
    if (sig == crash_router_signal) {
      node_events().warn("fault_injected id={} what=\"SIGRTMIN+1: the router crashes\"", id);
      asker->send_exit(router_actor, caf::sec::runtime_error);
    } else if (sig == die_at_end_signal) {
      with_trainer([&](const caf::actor& trainer) { asker->send(trainer, dieatend_atom::value); });
    } else if (sig == crash_host_signal) {
      node_events().warn("fault_injected id={} what=\"SIGRTMIN+2: the shard host crashes\"", id);
      with_trainer([&](const caf::actor& trainer) { asker->send(trainer, hostcrash_atom::value); });
    } else if (sig == SIGUSR2) {
      node_events().warn("fault_injected id={} what=\"SIGUSR2: the trainer role crashes\"", id);
      with_trainer([&](const caf::actor& trainer) { asker->send_exit(trainer, caf::sec::runtime_error); });
    } else {
      node_events().warn("fault_injected id={} what=\"SIGRTMIN: the trainer role hangs\"", id);
      with_trainer([&](const caf::actor& trainer) { asker->send(trainer, hang_atom::value); });
    }
  }
  int status = 0;
  bool leave = true;
  if (sig == SIGUSR1) {
    std::lock_guard lock(outcome_mutex);
    status = outcome_status;
    if (status != 0 && !o.submission) {  // the supervisor gave up: no goodbyes from a broken node
      fmt::print(stderr, "tepdist node: stopping: {}\n", outcome);
      leave = false;
    }
  } else {
    node_events().info("node_stopping id={} signal={}", id, sig == SIGTERM ? "SIGTERM" : "SIGINT");
    if (o.submission) {
      // Ctrl-C on `tepdist run`: ask the coordinator to stop the job before leaving.
      asker->request(caf::actor(sup), std::chrono::seconds(2), get_atom::value, role_atom::value, std::string("submitter"))
          .receive([](const caf::actor& a) { caf::anon_send(a, stop_atom::value); }, [](const caf::error&) {});
      status = 130;
    } else {
      // A drain: the step under way ends (the others commit it too), no other starts, then the
      // graceful leave below tells the others, who go on in a generation without this node.
      // Bounded: a ring that never completes (a neighbour dead) does not hold the leave up.
      std::string where = "no trainer";
      with_trainer([&](const caf::actor& trainer) {
        asker->request(trainer, std::chrono::seconds(30), drain_atom::value)
            .receive([&](const std::string& w) { where = w; },
                     [&](const caf::error& e) { where = "not drained within 30 s: " + sys.render(e); });
      });
      node_events().info("node_drained id={} where=\"{}\"", id, where);
      std::lock_guard lock(leave_mutex);
      if (!leave_asker.empty())
        transport.send(leave_asker, {id, incarnation, o.config.cluster.cluster_id,
                                     gossip::LeaveRequest{id, gossip::LeaveRequest::Kind::done, where}});
    }
  }
  if (leave) {
    // A graceful leave: members mark this node left, not dead. Bounded, so a stuck peer cannot
    // hold the node up.
    asker->request(router_actor, std::chrono::seconds(2), leave_atom::value)
        .receive([](bool) {}, [](const caf::error&) {});
    transport.drain(std::chrono::seconds(1));
  }
  return status;  // teardown: transport, then actors
}

}  // namespace tepdist::actors

#include "actors/node.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>
#include <caf/skip.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/system_messages.hpp>
#include <fmt/format.h>
#include <signal.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>

#include "actors/atoms.hpp"
#include "actors/roles/cluster_roles.hpp"
#include "actors/roles/parameter_shard.hpp"
#include "actors/supervisor.hpp"
#include "gossip/transport/transport.hpp"

// Frames cross from the transport's thread to the router by anon_send inside this process only;
// CAF never serialises them.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tepdist::gossip::Message)

namespace tepdist::actors {
namespace {

using init_atom = caf::atom_constant<caf::atom("init")>;
using down_atom = caf::atom_constant<caf::atom("down")>;

/// The node's event stream on stdout: one line per event, key=value fields.
spdlog::logger& events() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stdout_logger_mt("node");
    l->set_pattern("%Y-%m-%dT%H:%M:%S.%e %v");
    l->flush_on(spdlog::level::info);
    return l;
  }();
  return *logger;
}

struct RouterState {
  gossip::Transport* transport = nullptr;
  caf::actor supervisor;
  gossip::Member self;
  uint64_t epoch_unix_ms = 0;
  std::map<std::string, gossip::Member> members;  // by id, this node excluded
  static inline const char* name = "tepdist.router";
};

using Router = caf::stateful_actor<RouterState>;

void send(Router* self, const std::string& address, gossip::Body body, const std::string& cluster_id) {
  gossip::Message m{self->state.self.id, self->state.self.incarnation, cluster_id, std::move(body)};
  if (!self->state.transport->send(address, m))
    events().warn("send_refused peer={} reason=\"send queue full\"", address);
}

/// Sends a member this node's parameter shard, from an immutable snapshot the frame keeps alive.
void send_shard(Router* self, const gossip::Member& to, const std::string& cluster_id) {
  self->request(self->state.supervisor, std::chrono::seconds(5), get_atom::value, role_atom::value,
                std::string("parameter-shard"))
      .then([self, to, cluster_id](const caf::actor& shard_actor) {
        self->request(caf::actor_cast<parameter_shard_actor>(shard_actor), std::chrono::seconds(5), get_atom::value)
            .then([self, to, cluster_id](const ShardSnapshot& s) {
              auto values = std::make_shared<const std::vector<float>>(s.values);
              gossip::TensorChunk chunk{s.version, s.shard, 0, values->size(), *values, values};
              send(self, to.address, gossip::ParamPush{s.shard, s.version, chunk}, cluster_id);
            });
      });
}

/// Adds a member; returns whether it was new.
bool meet(Router* self, const gossip::Member& m) {
  if (m.id == self->state.self.id) return false;
  auto [it, inserted] = self->state.members.try_emplace(m.id, m);
  if (!inserted && it->second.incarnation >= m.incarnation) return false;
  it->second = m;
  events().info("member_joined id={} address={} region={} incarnation={}", m.id, m.address, m.region, m.incarnation);
  return true;
}

/// Tells the coordinator and worker roles the live ids, then logs the view they act on.
void announce_view(Router* self) {
  std::vector<std::string> ids{self->state.self.id};
  for (const auto& [id, m] : self->state.members) ids.push_back(id);
  const auto n = ids.size();
  for (const char* role : {"coordinator", "worker"})
    self->request(self->state.supervisor, std::chrono::seconds(5), get_atom::value, role_atom::value, std::string(role))
        .then([self, ids, role, n](const caf::actor& a) {
          caf::anon_send(a, member_atom::value, ids);
          if (std::string_view(role) == "worker")
            self->request(a, std::chrono::seconds(5), partition_atom::value).then([n](int64_t begin, int64_t end) {
              events().info("view members={} partition=[{},{})", n, begin, end);
            });
          else
            self->request(a, std::chrono::seconds(5), get_atom::value).then([n](const std::string& coordinator) {
              events().info("view members={} coordinator={}", n, coordinator);
            });
        });
}

caf::behavior router(Router* self, gossip::Transport* transport, std::string cluster_id) {
  self->state.transport = transport;
  // Frames may arrive before init tells the router who it is: keep them until then.
  self->set_default_handler(caf::skip);
  return {[self, cluster_id](init_atom, const std::string& id, const std::string& address, const std::string& region,
                             uint64_t incarnation, uint64_t epoch_unix_ms, const std::vector<std::string>& seeds,
                             const caf::actor& supervisor) {
    self->state.supervisor = supervisor;
    self->state.self = {id,     address, incarnation, gossip::Member::State::alive,
                        region, {"coordinator", "parameter-shard", "worker", "monitor"}};
    self->state.epoch_unix_ms = epoch_unix_ms;
    self->set_default_handler(caf::print_and_drop);
    for (const auto& seed : seeds) send(self, seed, gossip::Join{self->state.self}, cluster_id);
    announce_view(self);
    self->become(caf::behavior{
        [self, cluster_id](wire_atom, const std::string& peer, const gossip::Message& m) {
          std::visit(
              [&](const auto& body) {
                using T = std::decay_t<decltype(body)>;
                if constexpr (std::is_same_v<T, gossip::Join>) {
                  const bool fresh = meet(self, body.member);
                  if (fresh) announce_view(self);
                  std::vector<gossip::Member> view{self->state.self};
                  for (const auto& [id, member] : self->state.members) view.push_back(member);
                  send(self, body.member.address, gossip::StateSync{view, true, self->state.epoch_unix_ms}, cluster_id);
                  if (fresh) send_shard(self, body.member, cluster_id);
                } else if constexpr (std::is_same_v<T, gossip::StateSync>) {
                  // The cluster epoch (emulated partitions count from it) is the earliest any member
                  // started with: every node converges on the same one, whoever joins whom.
                  if (body.epoch_unix_ms && body.epoch_unix_ms < self->state.epoch_unix_ms) {
                    self->state.epoch_unix_ms = body.epoch_unix_ms;
                    self->state.transport->set_epoch_unix_ms(body.epoch_unix_ms);
                  }
                  bool changed = false;
                  for (const auto& member : body.members)
                    if (meet(self, member)) {
                      changed = true;
                      send(self, member.address, gossip::Join{self->state.self}, cluster_id);
                      send_shard(self, member, cluster_id);
                    }
                  if (changed) announce_view(self);
                } else if constexpr (std::is_same_v<T, gossip::ParamPush>) {
                  const double sum = std::accumulate(body.chunk.data.begin(), body.chunk.data.end(), 0.0);
                  events().info("param_push_received from={} shard={} version={} elements={} sum={:.6g}", peer,
                                body.shard, body.version, body.chunk.data.size(), sum);
                } else if constexpr (std::is_same_v<T, gossip::Leave>) {
                  if (self->state.members.erase(body.member.id)) {
                    events().info("member_left id={}", body.member.id);
                    announce_view(self);
                  }
                } else {
                  events().debug("message_ignored from={} kind={}", peer, gossip::kind_name(m.body));
                }
              },
              m.body);
        },
        [](peer_atom, bool up, const std::string& peer, const std::string& detail) {
          events().info("{} id={} {}", up ? "peer_up" : "peer_down", peer, detail);
        },
    });
  }};
}

/// Writes the ready file atomically: a reader sees nothing or the whole address.
bool write_ready_file(const std::string& path, const std::string& address) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << address << "\n";
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

uint64_t unix_ms() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

}  // namespace

int run_node(const NodeOptions& o) {
  // Signals are taken by sigwait in this thread only: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  for (int s : {SIGINT, SIGTERM, SIGUSR1}) sigaddset(&signals, s);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const uint64_t incarnation = unix_ms();  // above any incarnation an earlier run of this id used
  gossip::MetricsRegistry metrics;  // before the actors: the monitor role reads it until they are gone
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};

  gossip::TransportOptions topts;
  const auto colon = o.listen.rfind(':');
  if (colon == std::string::npos) {
    fmt::print(stderr, "tepdist node: --listen {}: expected host:port\n", o.listen);
    return 2;
  }
  topts.listen_host = o.listen.substr(0, colon);
  topts.listen_port = static_cast<uint16_t>(std::atoi(o.listen.c_str() + colon + 1));
  topts.identity = {o.config.cluster.cluster_id, o.name, o.region, o.secret, ""};
  topts.limits.max_frame_bytes = static_cast<uint32_t>(o.config.cluster.max_frame_mb) << 20;
  topts.send_queue_bytes = static_cast<size_t>(o.config.cluster.send_queue_mb) << 20;
  topts.reconnect_max_ms = static_cast<uint64_t>(o.config.cluster.reconnect_max_ms);
  topts.network = o.config.network.model;
  topts.epoch_unix_ms = incarnation;  // until membership carries the cluster epoch
  topts.seed = incarnation;
  topts.metrics = &metrics;

  std::mutex failure_mutex;  // the supervisor's end, told by the watcher below
  std::string failure;
  caf::actor router_actor;
  std::mutex router_mutex;  // the transport thread reads router_actor; it is set once, below
  auto to_router = [&](auto... xs) {
    std::lock_guard lock(router_mutex);
    if (router_actor) caf::anon_send(router_actor, xs...);
  };
  gossip::TransportEvents tevents{
      [&](const std::string& peer, gossip::Message m) { to_router(wire_atom::value, peer, std::move(m)); },
      [&](const std::string& peer, const std::string& address) {
        to_router(peer_atom::value, true, peer, "address=" + address);
      },
      [&](const std::string& peer, const std::string& reason) {
        to_router(peer_atom::value, false, peer, "reason=\"" + reason + "\"");
      },
      [&](const std::string& peer, const std::string& reason) {
        events().warn("peer_refused peer={} reason=\"{}\"", peer, reason);
      }};
  gossip::Transport transport(topts, tevents);
  Teardown teardown(sys, transport);
  {
    std::lock_guard lock(router_mutex);
    router_actor = sys.spawn(router, &transport, o.config.cluster.cluster_id);
  }
  teardown.add(router_actor);
  auto bound = transport.start();
  if (!bound) {
    fmt::print(stderr, "tepdist node: {}\n", bound.error());
    return 1;
  }
  const std::string id = o.name.empty() ? *bound : o.name;  // the transport made the same choice

  // The roles, under the supervisor. The shard holds deterministic values so a receiver's
  // checksum can be compared.
  ShardSnapshot shard{0, 0, std::vector<float>(o.shard_elements)};
  for (size_t i = 0; i < shard.values.size(); ++i) shard.values[i] = static_cast<float>(i % 97) * 0.01f;
  constexpr int64_t training_samples = 60000;  // Fashion-MNIST's; the job will say, once jobs run
  auto sup = sys.spawn(supervisor,
                       std::vector<RoleSpec>{coordinator_role(id), parameter_shard_role("parameter-shard", shard),
                                             worker_role(id, training_samples), monitor_role(&metrics)},
                       SupervisorOptions{});
  teardown.add(caf::actor(sup));
  caf::anon_send(router_actor, init_atom::value, id, *bound, o.region, incarnation, incarnation, o.join,
                 caf::actor(sup));

  // The supervisor's end wakes the main thread through SIGUSR1.
  auto watcher = sys.spawn([&, sup](caf::event_based_actor* self) -> caf::behavior {
    self->monitor(sup);
    self->set_down_handler([&](const caf::down_msg& d) {
      {
        std::lock_guard lock(failure_mutex);
        failure = d.reason ? sys.render(d.reason) : "supervisor stopped";
      }
      ::kill(::getpid(), SIGUSR1);
    });
    return {[](get_atom) {}};
  });
  teardown.add(watcher);

  if (!o.ready_file.empty() && !write_ready_file(o.ready_file, *bound)) {
    fmt::print(stderr, "tepdist node: cannot write the ready file {}\n", o.ready_file);
    return 1;
  }
  events().info("node_ready id={} address={} region={} incarnation={}", id, *bound, o.region, incarnation);

  int sig = 0;
  sigwait(&signals, &sig);
  int status = 0;
  if (sig == SIGUSR1) {
    std::lock_guard lock(failure_mutex);
    fmt::print(stderr, "tepdist node: stopping: {}\n", failure);
    status = 1;
  } else {
    events().info("node_stopping id={} signal={}", id, sig == SIGTERM ? "SIGTERM" : "SIGINT");
  }
  return status;  // teardown: transport, then actors
}

}  // namespace tepdist::actors

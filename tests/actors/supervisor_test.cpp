// The supervisor and a real role under CAF's test coordinator: one message at a time, the clock
// moved by hand, so every run is the same.

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/send.hpp>
#include <caf/system_messages.hpp>

#include <catch2/catch.hpp>
#include <chrono>
#include <optional>
#include <variant>

#include "actors/supervisor.hpp"
#include "tests/actors/snapshot_role.hpp"

using namespace tepdist::actors;
using namespace tepdist::actors::test;
using namespace std::chrono_literals;

namespace {

struct Node {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::scheduler::test_coordinator* sched = nullptr;
  caf::actor sup, watcher;
  std::optional<caf::error> sup_down;  // the supervisor's exit reason, once it exits

  explicit Node(int max_restarts) {
    cfg.set("scheduler.policy", caf::atom("testing"));
    sys = std::make_unique<caf::actor_system>(cfg);
    sched = &dynamic_cast<caf::scheduler::test_coordinator&>(sys->scheduler());
    sup = sys->spawn(supervisor, std::vector<RoleSpec>{parameter_shard_role("parameter-shard", {0, 0, {1, 2, 3, 4}})},
                     SupervisorOptions{max_restarts, 60s});
    // A watcher standing in for the node's main: it learns how the supervisor ended.
    watcher = sys->spawn([this](caf::event_based_actor* self) -> caf::behavior {
      self->monitor(sup);
      self->set_down_handler([this](const caf::down_msg& d) { sup_down = d.reason; });
      return {[](get_atom) {}};  // a behavior keeps the watcher alive to see the down message
    });
    sched->run();
  }
  ~Node() {
    caf::anon_send_exit(sup, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(watcher, caf::exit_reason::user_shutdown);
    sched->run();
  }

  /// Sends a request from a probe actor, runs everything, and returns the reply (or the error).
  template <class T, class Dest, class... Ts>
  std::variant<std::monostate, T, caf::error> ask(const Dest& dest, Ts... xs) {
    std::variant<std::monostate, T, caf::error> out;
    sys->spawn([&out, dest, xs...](caf::event_based_actor* self) {
      self->request(dest, 10s, xs...).then([&out](T v) { out = std::move(v); }, [&out](caf::error& e) { out = e; });
    });
    sched->run();
    return out;
  }

  parameter_shard_actor shard() {
    auto r = ask<caf::actor>(sup, get_atom::value, role_atom::value, std::string("parameter-shard"));
    REQUIRE(std::holds_alternative<caf::actor>(r));
    return caf::actor_cast<parameter_shard_actor>(std::get<caf::actor>(r));
  }

  void crash(const parameter_shard_actor& a) {
    caf::anon_send_exit(a, caf::exit_reason::kill);
    sched->run();
  }
};

}  // namespace

TEST_CASE("a restarted role has its committed state back and its uncommitted state gone", "[actors][supervisor]") {
  Node n(3);
  auto shard = n.shard();
  const std::vector<float> grad{1, 1, 1, 1};
  CHECK(std::get<uint64_t>(n.ask<uint64_t>(shard, push_atom::value, uint64_t{0}, grad, 0.5f)) == 1);
  CHECK(std::get<uint64_t>(n.ask<uint64_t>(shard, push_atom::value, uint64_t{1}, grad, 0.5f)) == 2);
  CHECK(std::get<uint64_t>(n.ask<uint64_t>(shard, commit_atom::value)) == 2);
  CHECK(std::get<uint64_t>(n.ask<uint64_t>(shard, push_atom::value, uint64_t{2}, grad, 0.5f)) == 3);  // not committed

  n.crash(shard);
  auto restarted = n.shard();
  CHECK(restarted != shard);
  const auto state = std::get<ShardSnapshot>(n.ask<ShardSnapshot>(restarted, get_atom::value));
  CHECK(state.version == 2);
  CHECK(state.values == std::vector<float>{0, 1, 2, 3});
  CHECK_FALSE(n.sup_down.has_value());  // one failure: the node carries on
}

TEST_CASE("a role that never committed restarts from its initial state", "[actors][supervisor]") {
  Node n(3);
  auto shard = n.shard();
  n.ask<uint64_t>(shard, push_atom::value, uint64_t{0}, std::vector<float>{1, 1, 1, 1}, 1.0f);
  n.crash(shard);
  const auto state = std::get<ShardSnapshot>(n.ask<ShardSnapshot>(n.shard(), get_atom::value));
  CHECK(state.version == 0);
  CHECK(state.values == std::vector<float>{1, 2, 3, 4});
}

TEST_CASE("the (K+1)-th failure within the window stops the node with an error naming the role",
          "[actors][supervisor]") {
  Node n(2);
  n.crash(n.shard());
  n.crash(n.shard());
  CHECK_FALSE(n.sup_down.has_value());  // K = 2 failures: restarted each time
  n.crash(n.shard());
  REQUIRE(n.sup_down.has_value());
  CHECK(*n.sup_down);  // a non-empty reason: the node exits non-zero
  const std::string why = n.sys->render(*n.sup_down);
  CHECK_THAT(why, Catch::Contains("parameter-shard") && Catch::Contains("3 failures"));
}

TEST_CASE("failures further apart than the window are each forgiven", "[actors][supervisor]") {
  Node n(1);
  for (int i = 0; i < 4; ++i) {
    n.crash(n.shard());
    n.sched->clock().current_time += 61s;
  }
  CHECK_FALSE(n.sup_down.has_value());
}

TEST_CASE("a gradient of the wrong size is refused and changes nothing", "[actors][shard]") {
  Node n(3);
  auto shard = n.shard();
  auto r = n.ask<uint64_t>(shard, push_atom::value, uint64_t{0}, std::vector<float>{1, 2}, 1.0f);
  REQUIRE(std::holds_alternative<caf::error>(r));
  CHECK_THAT(n.sys->render(std::get<caf::error>(r)), Catch::Contains("4 values"));
  CHECK(std::get<ShardSnapshot>(n.ask<ShardSnapshot>(shard, get_atom::value)).version == 0);
}

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/send.hpp>

#include <catch2/catch.hpp>
#include <chrono>

#include "actors/roles/cluster_roles.hpp"

using namespace tepdist::actors;
using namespace std::chrono_literals;

TEST_CASE("the coordinator is the lowest live id, wherever it is asked", "[actors][roles]") {
  CHECK(coordinator_of("n2", {"n3", "n1"}) == "n1");
  CHECK(coordinator_of("n1", {"n3", "n2"}) == "n1");
  CHECK(coordinator_of("solo", {}) == "solo");
}

TEST_CASE("worker partitions are disjoint, cover every sample and agree across nodes", "[actors][roles]") {
  const std::vector<std::string> ids{"c", "a", "d", "b"};
  int64_t covered = 0, expected_begin = 0;
  for (const std::string self : {"a", "b", "c", "d"}) {  // in rank order
    std::vector<std::string> others;
    for (const auto& id : ids)
      if (id != self) others.push_back(id);
    const auto [begin, end] = partition_of(self, others, 1001);
    CHECK(begin == expected_begin);
    CHECK(end - begin >= 250);
    covered += end - begin;
    expected_begin = end;
  }
  CHECK(covered == 1001);
}

TEST_CASE("a restarted coordinator resumes with the view it committed", "[actors][roles]") {
  caf::actor_system_config cfg;
  cfg.set("scheduler.policy", caf::atom("testing"));
  caf::actor_system sys{cfg};
  auto& sched = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  auto sup = sys.spawn(supervisor, std::vector<RoleSpec>{coordinator_role("n5")}, SupervisorOptions{3, 60s});
  sched.run();
  // Each asks from a probe actor and runs everything, so the reply is there when it returns.
  auto coordinator_of_role = [&](const caf::actor& dest) {
    std::string out;
    sys.spawn([&, dest](caf::event_based_actor* self) {
      self->request(dest, 10s, get_atom::value).then([&](const std::string& s) { out = s; });
    });
    sched.run();
    return out;
  };
  auto role = [&] {
    caf::actor out;
    sys.spawn([&](caf::event_based_actor* self) {
      self->request(sup, 10s, get_atom::value, role_atom::value, std::string("coordinator"))
          .then([&](const caf::actor& a) { out = a; });
    });
    sched.run();
    return out;
  };
  const caf::actor first = role();
  caf::anon_send(first, member_atom::value, std::vector<std::string>{"n5", "n9", "n2"});
  sched.run();
  CHECK(coordinator_of_role(first) == "n2");
  caf::anon_send_exit(first, caf::exit_reason::kill);
  sched.run();
  const caf::actor second = role();
  CHECK(second != first);
  CHECK(coordinator_of_role(second) == "n2");
  caf::anon_send_exit(sup, caf::exit_reason::user_shutdown);
  sched.run();
}

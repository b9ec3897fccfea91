// The coordinator's decisions as functions of a view: who assigns jobs, whom a node obeys, and
// what counts as a change of a job's ring.

#include <catch2/catch.hpp>

#include "elastic/coordination.hpp"

using tepdist::gossip::JobStart;
using tepdist::gossip::Member;
namespace elastic = tepdist::elastic;

namespace {

Member node(const std::string& id, uint64_t incarnation, uint64_t boot_id) {
  return Member{id, id + ":1", incarnation, Member::State::alive, "local", {"coordinator", "worker"}, {}, boot_id};
}

std::vector<Member> view() { return {node("b", 5, 22), node("a", 7, 11), node("c", 1, 33)}; }

JobStart request() {
  JobStart j;
  j.job_id = 9;
  j.submitter = "s:1";
  return j;
}

}  // namespace

TEST_CASE("the lowest live id assigns a job, signed with its boot id and each worker's", "[elastic][coordination]") {
  CHECK_FALSE(elastic::assign_job(request(), view(), "b"));
  auto job = elastic::assign_job(request(), view(), "a");
  REQUIRE(job);
  CHECK(job->coordinator == "a");
  CHECK(job->coordinator_boot_id == 11);
  CHECK(job->workers == std::vector<std::string>{"a", "b", "c"});
  CHECK(job->worker_boot_ids == std::vector<uint64_t>{11, 22, 33});
  CHECK(elastic::check_assignment(*job, view()));
}

TEST_CASE("an assignment holds while its coordinator refutes suspicions, not once it restarts",
          "[elastic][coordination]") {
  auto job = elastic::assign_job(request(), view(), "a");
  REQUIRE(job);
  // a refuted a suspicion since it signed: a higher incarnation, the same run.
  auto refuted = view();
  refuted[1].incarnation = 9;
  CHECK(elastic::check_assignment(*job, refuted));
  // a restarted: another boot id. Whatever it assigned before is not its current word.
  auto restarted = view();
  restarted[1].boot_id = 12;
  const auto refused = elastic::check_assignment(*job, restarted);
  REQUIRE_FALSE(refused);
  CHECK_THAT(refused.error(), Catch::Contains("boot"));
  // A view that has not heard of a yet names another coordinator: refused, saying whom.
  const std::vector<Member> behind{node("b", 5, 22), node("c", 1, 33)};
  const auto early = elastic::check_assignment(*job, behind);
  REQUIRE_FALSE(early);
  CHECK_THAT(early.error(), Catch::Contains("the coordinator is b"));
}

TEST_CASE("a worker that restarts is a change of the ring, one that refutes is not", "[elastic][coordination]") {
  auto job = elastic::assign_job(request(), view(), "a");
  REQUIRE(job);
  CHECK(elastic::ring_changes(*job, view()).empty());
  auto refuted = view();
  refuted[2].incarnation = 40;
  CHECK(elastic::ring_changes(*job, refuted).empty());
  auto restarted = view();
  restarted[2].boot_id = 34;
  CHECK(elastic::ring_changes(*job, restarted) == std::vector<std::string>{"c (restarted)"});
  auto dead = view();
  dead[0].state = Member::State::dead;
  CHECK(elastic::ring_changes(*job, dead) == std::vector<std::string>{"b (dead)"});
}

TEST_CASE("the duty rule picks the lowest live id and ignores the dead, whatever the order offered",
          "[elastic][coordination]") {
  const std::vector<std::string> ids{"n3", "n1", "n2", "n0"};
  elastic::LowestLiveId rule;
  CHECK(rule.holder() == nullptr);
  for (const auto& id : ids) rule.offer(id, id != "n0");  // n0 is dead
  REQUIRE(rule.holder());
  CHECK(*rule.holder() == "n1");
  // coordinator_in and job_duty_holder agree with it on the same view.
  std::vector<Member> v = view();
  v.push_back(node("0", 1, 44));
  v.back().state = Member::State::dead;
  REQUIRE(elastic::coordinator_in(v));
  CHECK(elastic::coordinator_in(v)->id == "a");
}

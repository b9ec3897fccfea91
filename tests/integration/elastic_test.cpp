// Elastic training as a user meets it: `tepdist run` on three local nodes, and while the job runs
// nodes are killed, restarted, added and stopped. Each fault is injected on an event the launcher
// prints (a progress line, a new generation), never after a sleep; each job must finish and learn
// as a fault-free one does.

#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "tests/support/jobs.hpp"
#include "tests/support/process.hpp"
#include "tests/support/processes.hpp"
#include "tests/support/temp_dir.hpp"

namespace fs = std::filesystem;
using tepdist::test::all_gone;
using tepdist::test::Child;
using tepdist::test::processes_mentioning;
using tepdist::test::read_json;
using tepdist::test::TempDir;

namespace {

/// Fashion-MNIST, 6,144 training samples, 12 epochs of 32 steps at 3 x 64: long enough for a
/// sequence of faults, each of which costs about a second and a half.
std::string elastic_job(const TempDir& dir) {
  return tepdist::test::fashion_subset_job(dir, "epochs = 12\nlog_every_steps = 4\n");
}

/// A `tepdist run` of three local nodes, started and training, and the nodes the test adds.
struct ElasticRun {
  const TempDir& dir;
  std::string mode;
  std::unique_ptr<Child> run;
  std::string seed;  // where an added node joins
  std::vector<std::unique_ptr<Child>> added;

  /// Waits for the training to start; `fault`, if given, is run instead, once the nodes are up
  /// (the job is being submitted to them), and the test waits for what it causes.
  ElasticRun(const TempDir& d, std::string m, std::vector<std::string> extra = {},
             const std::function<void(ElasticRun&)>& fault = {})
      : dir(d), mode(std::move(m)) {
    // Without balancing: these tests count the generations their faults make, and on a loaded
    // machine gossip and async would add rebalancing ones (tested on their own, in job control).
    std::vector<std::string> argv = {TEPDIST_BINARY, "run", elastic_job(dir), "--mode", mode,
                                     "--nodes", "3", "--set", "elastic.balance=false",
                                     "--out", (dir.path / "out").string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    run = std::make_unique<Child>(argv);
    const auto hint = run->wait_for("add a node:", std::chrono::seconds(60));
    REQUIRE(hint);
    seed = hint->substr(hint->rfind(' ') + 1);
    if (fault) fault(*this);
    else REQUIRE(run->wait_for("samples/s", std::chrono::seconds(60)));
  }

  ~ElasticRun() {
    for (auto& c : added) c->signal(SIGKILL);
  }

  pid_t pid_of(const std::string& name) {
    const auto pids = processes_mentioning((dir.path / "out").string(), "--name " + name);
    REQUIRE(pids.size() == 1);
    return pids[0];
  }

  /// Starts `tepdist node` on the job's cluster file under `name`, joining through the first node.
  void add_node(const std::string& name, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv{TEPDIST_BINARY, "node", (dir.path / "out" / "cluster.toml").string(), "--name", name,
                                  "--join", seed, "--set", "compute.threads=1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    added.push_back(std::make_unique<Child>(argv));
  }


  /// Runs `tepdist COMMAND ... cluster.toml --peer SEED`; its exit status and everything it printed.
  std::pair<int, std::string> client(std::vector<std::string> args) {
    args.insert(args.begin(), TEPDIST_BINARY);
    for (std::string extra : {(dir.path / "out" / "cluster.toml").string(), std::string("--peer"), seed})
      args.push_back(extra);
    Child c(args);
    const int status = c.wait();
    return {status, c.all()};
  }

  /// Waits for the next generation line, whatever its number (a proposal that did not install in
  /// time is proposed again under the next number, so numbers may skip), and checks what it says
  /// changed. `then_steps`: training goes on in it before the next fault.
  std::string expect_next_generation(const std::string& change, bool then_steps = true) {
    const auto line = run->wait_for("generation ", std::chrono::seconds(60));
    INFO(run->all());
    REQUIRE(line);
    CHECK_THAT(*line, Catch::Contains(change));
    if (then_steps) {
      const bool stepped = run->wait_for("samples/s", std::chrono::seconds(60)).has_value();
      INFO("and after it: " << run->all().substr(run->all().find(*line)));
      REQUIRE(stepped);
    }
    return *line;
  }

  /// Waits for the first generation line that says `change` (a node that dies and is restarted at
  /// once may be seen gone and then joined, or only restarted, as membership happens to see it).
  std::string expect_generation_saying(const std::vector<std::string>& any_of) {
    for (;;) {
      const auto line = run->wait_for("generation ", std::chrono::seconds(60));
      INFO(run->all());
      REQUIRE(line);
      for (const auto& change : any_of)
        if (line->find(change) != std::string::npos) {
          REQUIRE(run->wait_for("samples/s", std::chrono::seconds(60)));
          return *line;
        }
    }
  }

  /// Waits until `nodes` of the nodes have logged a line containing every one of `words`.
  void wait_for_logs(const std::vector<std::string>& words, size_t nodes) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (;;) {
      size_t said_it = 0;
      const auto said = [&](std::istream& in) {
        for (std::string l; std::getline(in, l);)
          if (std::ranges::all_of(words, [&](const std::string& w) { return l.find(w) != std::string::npos; }))
            return true;
        return false;
      };
      for (const auto& f : fs::directory_iterator(dir.path / "out" / "logs"))
        if (std::ifstream in(f.path()); f.path().filename().string().starts_with("node-") && said(in)) ++said_it;
      for (auto& c : added)  // nodes the test started write to their own output
        if (std::istringstream in(c->all()); said(in)) ++said_it;
      if (said_it >= nodes) return;
      INFO(run->all());
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // polls the logs for the event
    }
  }

  /// Async: waits until every node of the generation `line` announced ("generation N: ...") has
  /// said its shards have their state (shards_ready in its log).
  void wait_for_shards(const std::string& line, size_t nodes_in_it = 3) {
    std::smatch m;
    REQUIRE(std::regex_search(line, m, std::regex("generation ([0-9]+):")));
    wait_for_logs({"shards_ready", "generation=" + m[1].str() + " "}, nodes_in_it);
  }

  /// The job ends by itself; its result.json.
  nlohmann::json finish() {
    const int status = run->wait();
    INFO(run->all());
    REQUIRE(status == 0);
    for (auto& c : added) {
      c->signal(SIGTERM);
      c->wait();
    }
    CHECK(all_gone(dir.path.string(), std::chrono::seconds(10)));
    return read_json(dir.path / "out" / "result.json");
  }
};

/// Whether any log under `dir` (the launcher's nodes, nodes a test added) contains `text`.
bool logs_contain(const fs::path& dir, const std::string& text) {
  for (const auto& f : fs::recursive_directory_iterator(dir))
    if (f.is_regular_file() && f.path().extension() == ".log") {
      std::ifstream in(f.path());
      const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (log.find(text) != std::string::npos) return true;
    }
  return false;
}

/// What every elastic job must show at its end: it learned (the fault-free runs of this job reach
/// about 0.85), the generations the faults made, and in sync replicas that are bit-identical.
/// Async with four workers learns less at this rate (staleness about 6 against 4.4 with three),
/// and a constant-rate run's end point is noisy: on a 2-core VM, 17 runs of the join test (alone,
/// beside a busy loop, under ctest -j2) ended at 0.80-0.85, three workers at 0.85-0.87, and one CI
/// run at 0.765. Hence its own floor. It catches a job that stopped learning; an update lost to a
/// shard move need not show in it, which the tests check by the logs (shard_lost) instead.
void check_result(const nlohmann::json& r, const std::string& mode, size_t workers, size_t generations,
                  size_t faults) {
  INFO(r.dump(2));
  CHECK(r["mode"] == mode);
  CHECK(r["nodes"] == workers);
  CHECK(r["test_accuracy"].get<double>() >= (mode == "async" && workers >= 4 ? 0.74 : 0.78));
  CHECK(r["generations"].size() == generations);
  CHECK(r["membership_events"].get<size_t>() >= faults);
  CHECK(r["workers"].size() == workers);
  if (mode == "sync") {
    std::set<std::string> checksums;
    for (const auto& w : r["workers"]) checksums.insert(w["parameter_checksum"].get<std::string>());
    CHECK(checksums.size() == 1);
    CHECK(r["epochs"] == 12);
    // Every epoch's samples once, whoever died or joined (the job's count, not the survivors' own).
    CHECK(r["samples"] == 12 * 6144);
  }
}

}  // namespace

TEST_CASE("sync: kill -9 of a worker, then of the coordinator's node, the launcher restarts each and the job goes on",
          "[integration][elastic]") {
  TempDir dir;
  ElasticRun r(dir, "sync");
  ::kill(r.pid_of("node-01"), SIGKILL);
  CHECK(r.run->wait_for("local node node-01 died (signal 9); restarted it", std::chrono::seconds(30)));
  r.expect_generation_saying({"restarted node-01", "joined node-01"});
  ::kill(r.pid_of("node-00"), SIGKILL);  // the duty holder, rank 0, the submitter's seed
  r.expect_generation_saying({"restarted node-00", "joined node-00"});
  const auto result = r.finish();
  check_result(result, "sync", 3, result["generations"].size(), 2);
  CHECK(result["generations"].size() >= 3);
}

TEST_CASE("sync and gossip with their state kept apart, as on a device: the donors pull it to serve it, the "
          "restarted worker pushes what it pulled, and every worker ends with the same model",
          "[integration][elastic]") {
  // [compute] emulate_device: the host's copy of the state is NaN while it is out of date, so a
  // donor serving it without its pull, or a puller stepping without its push, ends apart; and a
  // host write of the parameters never pushed (gossip's mixings) fails an invariant check, which
  // would show as a node's death in its log.
  for (const std::string mode : {"sync", "gossip"}) {
    DYNAMIC_SECTION(mode) {
      TempDir dir;
      ElasticRun r(dir, mode, {"--set", "compute.emulate_device=true"});
      ::kill(r.pid_of("node-01"), SIGKILL);
      r.expect_generation_saying({"restarted node-01", "joined node-01"});
      const auto result = r.finish();
      check_result(result, mode, 3, result["generations"].size(), 1);
      // Sync's replicas are compared by check_result; gossip's final average is one ring's.
      std::set<std::string> checksums;
      for (const auto& w : result["workers"]) checksums.insert(w["parameter_checksum"].get<std::string>());
      CHECK(checksums.size() == 1);
      if (mode == "gossip") CHECK(result["gossip_exchanges"].get<int>() > 0);
      CHECK(logs_contain(dir.path / "out", "state_pulled"));
      CHECK(logs_contain(dir.path / "out", "emulate_device"));
      CHECK_FALSE(logs_contain(dir.path / "out", "invariant violated"));
    }
  }
}

TEST_CASE("gossip with restart = never: kill -9 of a worker, then of the coordinator's node, the last one finishes",
          "[integration][elastic]") {
  TempDir dir;
  ElasticRun r(dir, "gossip", {"--set", "elastic.restart=\"never\""});
  ::kill(r.pid_of("node-01"), SIGKILL);
  r.expect_next_generation("gone node-01");
  ::kill(r.pid_of("node-00"), SIGKILL);
  r.expect_next_generation("gone node-00");
  check_result(r.finish(), "gossip", 1, 3, 2);
}

TEST_CASE("async: kill -9 of a node holding primaries, the launcher restarts it, and every shard goes on",
          "[integration][elastic]") {
  // Updates mode, the default. (Gradients mode's failover is tested over the simulated network in
  // tests/elastic/async_shards_test.cpp; on this job it reaches only 0.73 without faults.)
  TempDir dir;
  ElasticRun r(dir, "async");
  ::kill(r.pid_of("node-01"), SIGKILL);
  CHECK(r.run->wait_for("local node node-01 died (signal 9); restarted it", std::chrono::seconds(30)));
  // With replication 2, a second death is survived once the first one's shards have two holders
  // again: every node says when the shards it holds in the generation have their state.
  const auto back = r.expect_generation_saying({"restarted node-01", "joined node-01"});
  r.wait_for_shards(back);
  ::kill(r.pid_of("node-00"), SIGKILL);  // the duty holder, rank 0, the submitter's seed
  r.wait_for_shards(r.expect_generation_saying({"restarted node-00", "joined node-00"}));
  const auto result = r.finish();
  check_result(result, "async", 3, result["generations"].size(), 2);
  CHECK(result["generations"].size() >= 3);
  // The new holders took each shard from a survivor, and no acknowledged update was lost: the
  // job learned as a fault-free one does (check_result), and no node refused a shard message
  // for want of its shard.
  CHECK(logs_contain(dir.path / "out", "shard_fetched"));
  CHECK_FALSE(logs_contain(dir.path / "out", "shard_lost"));
}

TEST_CASE("async: a node's shard host fails, takes its trainer with it, and the node rejoins as a restarted member",
          "[integration][elastic]") {
  // The shard host is an actor of its own, linked to its trainer. Were it not linked, its failure
  // would leave the node training with its shards unserved: nothing would restart, and the
  // generation below would never come (the other workers would wait for those primaries).
  TempDir dir;
  ElasticRun r(dir, "async");
  ::kill(r.pid_of("node-01"), SIGRTMIN + 2);  // fault injection: the shard host fails, the process lives
  r.wait_for_shards(r.expect_generation_saying({"restarted node-01"}));
  const auto result = r.finish();
  check_result(result, "async", 3, result["generations"].size(), 1);
  const auto log = tepdist::test::read_bytes(dir.path / "out" / "logs" / "node-1.log");
  CHECK_THAT(log, Catch::Contains("shard_host_crashing") && Catch::Contains("trainer_restarted"));
  CHECK_FALSE(logs_contain(dir.path / "out", "shard_lost"));
}

TEST_CASE("async: a node that joins fetches the shards placed on it striped over their holders, and the job goes on",
          "[integration][elastic]") {
  // Pieces of 64 KiB: each shard (about 72,000 values) is five. With replication 2 a shard that
  // moves to the joiner has two holders of its state, the primary and its replica, and the joiner
  // pulls from both at once (the source's manifest names them; the digest checks what came).
  TempDir dir;
  ElasticRun r(dir, "async", {"--set", "job.ring_chunk_kb=64"});
  r.add_node("node-03");
  r.wait_for_shards(r.expect_generation_saying({"joined node-03"}), 4);
  const std::string joiner = r.added[0]->all();
  INFO(joiner);
  CHECK_THAT(joiner, Catch::Contains("shard_fetched") && Catch::Contains("striped pieces=") &&
                         Catch::Contains("donors=2"));
  CHECK_THAT(joiner, !Catch::Contains("shard_stripes_refused") && !Catch::Contains("shard_stripes_abandoned"));
  const auto result = r.finish();
  check_result(result, "async", 4, result["generations"].size(), 1);
  CHECK_FALSE(logs_contain(dir.path / "out", "shard_lost"));
}

TEST_CASE("async with replication 1: a dead node takes its shards with it, and the run says which", "[integration][elastic]") {
  TempDir dir;
  ElasticRun r(dir, "async", {"--set", "elastic.replication=1", "--set", "elastic.restart=\"never\""});
  ::kill(r.pid_of("node-01"), SIGKILL);
  const int status = r.run->wait();
  INFO(r.run->all());
  CHECK(status != 0);
  CHECK_THAT(r.run->all(), Catch::Contains("no surviving holder") && Catch::Contains("held by node-01") &&
                               Catch::Contains("replication = 1"));
  CHECK(all_gone(dir.path.string(), std::chrono::seconds(10)));
}

TEST_CASE("async with replication 1: a node that leaves hands its shards over before it goes, and the job goes on",
          "[integration][elastic]") {
  TempDir dir;
  ElasticRun r(dir, "async", {"--set", "elastic.replication=1", "--set", "elastic.restart=\"never\""});
  ::kill(r.pid_of("node-02"), SIGTERM);  // a drain and a graceful leave: its shards have no other copy
  r.expect_next_generation("gone node-02");
  const auto result = r.finish();
  check_result(result, "async", 2, 2, 1);
  CHECK(result["generations"][1]["removed"] == nlohmann::json::array({"node-02"}));
  const auto leaver = tepdist::test::read_bytes(dir.path / "out" / "logs" / "node-2.log");
  CHECK_THAT(leaver, Catch::Contains("handing_over") && Catch::Contains("shards_handed_over"));
}

TEST_CASE("async with replication 1: a node told to leave while it is still starting the job hands its shards over",
          "[integration][elastic]") {
  // A node loads the data set as it starts the job (a few hundred ms); node-02's SIGTERM comes
  // meanwhile (once every node has logged the assignment), so its drain waits behind the start. Its
  // shards exist from that start only: the drain must wait for them, not take them for none (as
  // it did while the shard host had not placed them yet).
  TempDir dir;
  ElasticRun r(dir, "async", {"--set", "elastic.replication=1", "--set", "elastic.restart=\"never\""},
               [](ElasticRun& run) {
                 run.wait_for_logs({"job_accepted"}, 3);
                 ::kill(run.pid_of("node-02"), SIGTERM);
               });
  r.expect_next_generation("gone node-02");
  check_result(r.finish(), "async", 2, 2, 1);
  const auto leaver = tepdist::test::read_bytes(dir.path / "out" / "logs" / "node-2.log");
  CHECK_THAT(leaver, Catch::Contains("handing_over") && Catch::Contains("shards_handed_over"));
}

TEST_CASE("a worker stopped past its death and continued comes back into the job", "[integration][elastic]") {
  for (const std::string mode : {"sync", "gossip"}) {
    INFO(mode);
    TempDir dir;
    ElasticRun r(dir, mode);
    const pid_t victim = r.pid_of("node-01");
    ::kill(victim, SIGSTOP);
    r.expect_next_generation("gone node-01");
    ::kill(victim, SIGCONT);
    r.expect_next_generation("joined node-01");
    check_result(r.finish(), mode, 3, 3, 2);
  }
}

// (No ": " late in a test name: Catch 2.13's console reporter wraps such a name forever when the
// test fails, so a failure here hung until ctest's timeout instead of saying what failed.)
TEST_CASE("a node joins a running job, status shows it in the generation, and one leaves, and the job goes on with them",
          "[integration][elastic]") {
  for (const std::string mode : {"sync", "gossip", "async"}) {
    INFO(mode);
    TempDir dir;
    ElasticRun r(dir, mode);
    r.add_node("node-09");
    const auto joined = r.expect_next_generation("joined node-09");
    // Async: the joiner holds shards of its own from here; a holder leaving before they came
    // would take the only copy of some with it.
    if (mode == "async") r.wait_for_shards(joined, 4);
    // The status document: the generation, and each of its workers with a position.
    const auto [status_rc, status_out] = r.client({"status", "--json"});
    INFO(status_out);
    REQUIRE(status_rc == 0);
    const auto doc = nlohmann::json::parse(status_out);
    REQUIRE(doc["job"].is_object());
    CHECK(doc["job"]["mode"] == mode);
    CHECK(doc["job"]["generation"].get<int>() >= 2);
    CHECK(doc["job"]["workers"].size() == 4);
    CHECK(doc["job"]["step"].get<int>() > 0);
    CHECK(doc["job"]["lr"].get<double>() > 0);
    // The answering worker knows its own speed at least (sync: everyone's, and their shares).
    CHECK(std::ranges::any_of(doc["job"]["workers"], [](const auto& w) { return w["samples_per_second"].is_number(); }));
    if (mode == "sync")
      for (const auto& w : doc["job"]["workers"]) CHECK(w["share"].is_number());
    // A leave naming nobody is refused, saying so, and harms nothing.
    const auto [unknown_rc, unknown_out] = r.client({"leave", "node-77"});
    CHECK(unknown_rc == 1);
    CHECK_THAT(unknown_out, Catch::Contains("no member named node-77"));
    if (mode == "sync") {
      // `tepdist leave`: the node drains (its step ends and is committed) and leaves.
      const auto [leave_rc, leave_out] = r.client({"leave", "node-02"});
      INFO(leave_out);
      CHECK(leave_rc == 0);
      // The step under way when it was asked ended and was committed: the next generation
      // resumes right after it, not before.
      const std::smatch drained = [&] {
        std::smatch m;
        std::regex_search(leave_out, m, std::regex("node-02: drained: job [0-9]+ generation [0-9]+ after step ([0-9]+)"));
        return m;
      }();
      REQUIRE(drained.size() == 2);
      const auto line = r.expect_next_generation("gone node-02");
      CHECK_THAT(line, Catch::EndsWith("resuming at step " + drained[1].str()));
    } else {
      ::kill(r.pid_of("node-02"), SIGTERM);  // the same drain and leave
      r.expect_next_generation("gone node-02");
    }
    const auto result = r.finish();
    check_result(result, mode, 3, 3, 2);
    CHECK(result["generations"][1]["added"] == nlohmann::json::array({"node-09"}));
    CHECK(result["generations"][2]["removed"] == nlohmann::json::array({"node-02"}));
    // The rate follows the global batch (SGD: the linear rule, lr 0.05 meant for 3 x 64): it rises
    // toward 4/3 of it with the joiner, back with the leave, in sync and in gossip (whose cap, 4,
    // is far above); async's does not follow it (each update is one worker's batch).
    const auto& rates = result["lr_history"];
    REQUIRE(rates.size() >= 1);
    CHECK(rates[0]["lr"].get<double>() == Approx(0.05));
    double highest = 0;
    for (const auto& e : rates) highest = std::max(highest, e["lr"].get<double>());
    if (mode == "async") CHECK(highest == Approx(0.05));
    else CHECK(highest > 0.05 * 1.05);
    CHECK(highest <= 0.05 * 4 / 3 + 1e-6);
  }
}

TEST_CASE("async and gossip with a cosine schedule, a node joins, and the rate still reaches its floor at the job's end",
          "[integration][elastic]") {
  // The schedule is read at the job's samples consumed. Four workers where there were three each
  // train a quarter of the rest: counted in their own local steps, the job would end with the
  // schedule about a fifth short of its end, the rate still near a tenth of lr.
  for (const std::string mode : {"gossip", "async"}) {
    INFO(mode);
    TempDir dir;
    ElasticRun r(dir, mode, {"--set", "optimizer.schedule=\"cosine\""});
    r.add_node("node-09");
    r.expect_next_generation("joined node-09");
    const auto result = r.finish();
    const auto& rates = result["lr_history"];
    INFO(rates.dump());
    REQUIRE(rates.size() >= 2);
    CHECK(rates.back()["lr"].get<double>() < 0.02 * 0.05);
  }
}

namespace {

/// The fault below comes at the job's end, armed at its start: half the epochs are enough, and the
/// test runs each mode's job whole.
const std::vector<std::string> half_the_epochs = {"--set", "job.epochs=6"};

/// Arms node-00 to die, as rank 0, just before it completes the job (SIGRTMIN+3, fault injection:
/// after the others reported done); the generation line that follows its death, and the result.
std::pair<std::string, nlohmann::json> rank0_dies_at_the_end(ElasticRun& r) {
  ::kill(r.pid_of("node-00"), SIGRTMIN + 3);
  const auto line = r.run->wait_for("generation ", std::chrono::seconds(120));
  INFO(r.run->all());
  REQUIRE(line);
  auto result = r.finish();
  // Six epochs end near 0.82 (0.82 to 0.84 measured, one run a mode): the floor catches a final
  // model that is not the trained one, not a weaker run.
  CHECK(result["test_accuracy"].get<double>() >= 0.7);
  return {*line, std::move(result)};
}

}  // namespace

TEST_CASE("rank 0 dies just before it completes the job, after the others reported done, and they end the job again",
          "[integration][elastic]") {
  // The others keep the job after their own done until rank 0 says it is complete. Were they to
  // let it go at once, nobody would hold the job any more: no generation would come, and the run
  // would wait for rank 0's report until its timeout.
  for (const std::string mode : {"sync", "gossip", "async"}) {
    INFO(mode);
    TempDir dir;
    ElasticRun r(dir, mode, half_the_epochs);
    const auto [line, result] = rank0_dies_at_the_end(r);
    CHECK_THAT(r.run->all(), Catch::Contains("local node node-00 died (signal 9); restarted it"));
    // Membership sees the restart (the usual case: it is back in a tenth of a second), or, should
    // the restart be slower than the death is found, first the death: the job may then end without it.
    INFO(line);
    if (line.find("restarted node-00") != std::string::npos) {
      // Every worker's done report counts, even one that overtook the record of its generation
      // on its way to the submitter (result.json once lost it).
      CHECK(result["workers"].size() == 3);
    } else {
      CHECK_THAT(line, Catch::Contains("gone node-00"));
      CHECK(result["workers"].size() >= 2);
    }
    CHECK(result["generations"].size() >= 2);
    CHECK(logs_contain(dir.path / "out", "fault_armed"));
    CHECK(logs_contain(dir.path / "out", "job_released"));
  }
}

TEST_CASE("rank 0 dies just before it completes the job and is not restarted, and the survivors end it under a new rank 0",
          "[integration][elastic]") {
  // Every done report so far counts for nothing under the new rank 0 (a submitter that kept them
  // ended the job on the first report of the new generation, before its rank 0 had evaluated).
  for (const std::string mode : {"sync", "async"}) {
    INFO(mode);
    TempDir dir;
    auto extra = half_the_epochs;
    extra.insert(extra.end(), {"--set", "elastic.restart=\"never\""});
    ElasticRun r(dir, mode, extra);
    const auto [line, result] = rank0_dies_at_the_end(r);
    CHECK_THAT(line, Catch::Contains("gone node-00"));
    CHECK(result["workers"].size() == 2);
    for (const auto& w : result["workers"]) CHECK(w["rank"].get<int>() < 2);
    CHECK(fs::exists(dir.path / "out" / "model.safetensors"));
  }
}

TEST_CASE("a worker's trainer role crashes, its supervisor restarts it, and it rejoins the job", "[integration][elastic]") {
  TempDir dir;
  ElasticRun r(dir, "sync");
  ::kill(r.pid_of("node-01"), SIGUSR2);  // fault injection: the trainer role crashes, the process lives
  // The node announces a new run of itself; the job takes it back as a joiner that pulls the state.
  r.expect_next_generation("restarted node-01");
  const auto result = r.finish();
  check_result(result, "sync", 3, 2, 1);
  CHECK(result["generations"][1]["restarted"] == nlohmann::json::array({"node-01"}));
}

TEST_CASE("a worker alive to membership that blocks the ring is evicted, the job goes on, and it comes back",
          "[integration][elastic]") {
  TempDir dir;
  // A step that waits 4 s for its previous worker evicts it (the default is 60 s).
  ElasticRun r(dir, "sync", {"--set", "job.step_timeout_s=4"});
  // Fault injection: node-01's trainer blocks its thread for three step timeouts; its router
  // goes on answering probes, so membership never holds it dead.
  ::kill(r.pid_of("node-01"), SIGRTMIN);
  r.expect_next_generation("gone node-01");
  // Its trainer runs again, reads that it was left out, and says so: it is taken back as a joiner
  // that pulls the state.
  r.expect_next_generation("joined node-01");
  const auto result = r.finish();
  // node-01 stayed a member of the cluster throughout: an eviction and a return, not a death.
  CHECK(result["membership_event_list"].empty());
  check_result(result, "sync", 3, 3, 2);
  CHECK(result["generations"][1]["removed"] == nlohmann::json::array({"node-01"}));
  CHECK(result["generations"][2]["added"] == nlohmann::json::array({"node-01"}));
  // Evicted because its trainer did not answer the ring check (not at twice the timeout).
  CHECK(logs_contain(dir.path / "out", "its trainer did not answer"));
}

TEST_CASE("a joiner that cannot run the job declines it, saying why, and the job goes on without it",
          "[integration][elastic]") {
  TempDir dir;
  // Ring messages of 2 MiB; the joiner's frames are limited to 1 MiB, so it cannot take part.
  ElasticRun r(dir, "sync", {"--set", "job.ring_chunk_kb=2048"});
  r.add_node("node-09", {"--set", "cluster.max_frame_mb=1"});
  // Proposed as a joiner (generation 2), it declines on the install, and the next generation,
  // at once, leaves it out again (training may not step in between).
  r.expect_next_generation("joined node-09", false);
  r.expect_next_generation("gone node-09");
  const auto result = r.finish();
  check_result(result, "sync", 3, 3, 2);
  INFO(r.added[0]->all());
  CHECK_THAT(r.added[0]->all(), Catch::Contains("job_declined") && Catch::Contains("does not fit this node's frames"));
}


TEST_CASE("kill -9 of every node at once: the restarted nodes hold nothing, and the run fails saying the state is lost",
          "[integration][elastic]") {
  TempDir dir;
  ElasticRun r(dir, "sync");
  std::vector<pid_t> pids;
  for (const auto* name : {"node-00", "node-01", "node-02"}) pids.push_back(r.pid_of(name));
  for (const pid_t pid : pids) ::kill(pid, SIGKILL);
  // The launcher restarts them; in their new runs they hold neither the job nor its state. The
  // run ends once that has lasted its grace (15 s), not at the report timeout (step_timeout_s +
  // 120 s), naming each worker.
  const int status = r.run->wait();
  INFO(r.run->all());
  CHECK(status != 0);
  CHECK_THAT(r.run->all(), Catch::Contains("lost its state") && Catch::Contains("node-00 restarted") &&
                               Catch::Contains("node-02 restarted") && Catch::Contains("without a checkpoint"));
  CHECK(all_gone(dir.path.string(), std::chrono::seconds(10)));
}

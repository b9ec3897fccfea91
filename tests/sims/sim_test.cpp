// The simulator as a user runs it (`tepdist sim`): scenarios hold their invariants, a seed
// replays a run exactly in another process, a broken invariant fails with the seed to replay it.

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "elastic/placement.hpp"
#include "tests/support/process.hpp"
#include "tests/support/temp_dir.hpp"

using tepdist::test::Child;

namespace {

const std::string scenarios = std::string(TEPDIST_SOURCE_DIR) + "/sims/scenarios/";

struct Result {
  int status;
  std::string out;
};

Result sim(std::vector<std::string> args) {
  std::vector<std::string> argv{TEPDIST_BINARY, "sim"};
  argv.insert(argv.end(), args.begin(), args.end());
  Child c(argv);
  const int status = c.wait();
  return {status, c.all()};
}

/// The report of scenario file `path` run with `seed`, which must hold every invariant's run.
nlohmann::json report_of_file(const std::string& path, int seed) {
  const auto r = sim({path, "--seed", std::to_string(seed), "--json"});
  INFO(r.out);
  REQUIRE(r.status == 0);
  return nlohmann::json::parse(r.out);
}

nlohmann::json report(const std::string& scenario, int seed) { return report_of_file(scenarios + scenario, seed); }

/// The report whether or not an invariant broke (exit 1 still prints one).
nlohmann::json any_report(const std::string& scenario, int seed) {
  const auto r = sim({scenarios + scenario, "--seed", std::to_string(seed), "--json"});
  INFO(r.out);
  REQUIRE((r.status == 0 || r.status == 1));
  return nlohmann::json::parse(r.out);
}

}  // namespace

TEST_CASE("the fast scenarios hold every invariant", "[sims]") {
  for (const char* s : {"kill_one_of_100.toml", "churn.toml", "partition_heals.toml", "three_regions.toml", "pause.toml"}) {
    INFO(s);
    const auto r = report(s, 1);
    CHECK(r["broken"].empty());
  }
}

TEST_CASE("a kill is detected by everyone, and the report says how fast", "[sims]") {
  const auto r = report("kill_one_of_100.toml", 2);
  REQUIRE(r["detection_s"]["all"].size() == 1);
  const double detection = r["detection_s"]["p50"];
  CHECK(detection > 0);
  CHECK(detection < 30);  // LAN knobs: suspicion at least 4 x log10(100) x 1 s, plus dissemination
  CHECK(r["false_positives"] == 0);
}

TEST_CASE("one seed replays exactly in another process, another seed differs", "[sims]") {
  const auto a = report("churn.toml", 5), b = report("churn.toml", 5), c = report("churn.toml", 6);
  CHECK(a["event_log_hash"] == b["event_log_hash"]);
  CHECK(a["events"] == b["events"]);
  CHECK(a["event_log_hash"] != c["event_log_hash"]);
}

TEST_CASE("a broken invariant exits non-zero and prints the seed to replay it", "[sims]") {
  tepdist::test::TempDir dir;
  const auto file = dir.path / "too_short.toml";
  // Killed 0.4 s before the end, less than the shortest suspicion at 10 nodes (3 x log10(11) x
  // 200 ms): nobody can have declared it dead yet.
  std::ofstream(file) << "[scenario]\nnodes = 10\nduration_s = 30\n[[fault]]\nkind = \"kill\"\nat_s = 29.6\nnodes = [4]\n";
  const auto r = sim({file.string(), "--seed", "42"});
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("BROKEN killed_detected") && Catch::Contains("--seed 42"));
}

TEST_CASE("a bad scenario file is refused, naming the file, line and key", "[sims]") {
  tepdist::test::TempDir dir;
  const auto file = dir.path / "bad.toml";
  std::ofstream(file) << "[scenario]\nnodes = 10\n\n[[fault]]\nkind = \"explode\"\n";
  const auto r = sim({file.string()});
  CHECK(r.status == 2);
  CHECK_THAT(r.out, Catch::Contains("bad.toml:5") && Catch::Contains("explode"));
}

TEST_CASE("loaded nodes handle their inputs late, and a seed replays the load exactly", "[sims]") {
  // Whether the invariants hold is the slow sweep's business (100 seeds); here: the load is real
  // and drawn from the seed. Half of 100 nodes stall for 100-600 ms every 1.5 s on average.
  const auto a = any_report("loaded_nodes.toml", 1), again = any_report("loaded_nodes.toml", 1);
  CHECK(a["event_log_hash"] == again["event_log_hash"]);
  CHECK(a["events"] == again["events"]);
  CHECK(a["max_lateness_ms"] == again["max_lateness_ms"]);
  for (int seed : {1, 2, 3}) {
    INFO("seed " << seed);
    const auto r = seed == 1 ? a : any_report("loaded_nodes.toml", seed);
    CHECK(r["loaded_nodes"] == 50);
    CHECK(r["late_inputs"].get<uint64_t>() > 100);  // over a probe timeout (100 ms) late
    CHECK(r["late_ticks"].get<uint64_t>() > 10);
    CHECK(r["max_lateness_ms"].get<double>() > 300);  // a long stall, with what queued behind it
    CHECK(r["detection_s"]["all"].size() == 2);
    if (seed != 1) CHECK(r["event_log_hash"] != a["event_log_hash"]);
  }
}

TEST_CASE("a load fault without nodes, or load knobs on another fault, is refused by name", "[sims]") {
  tepdist::test::TempDir dir;
  const auto no_nodes = dir.path / "no_nodes.toml";
  std::ofstream(no_nodes) << "[scenario]\nnodes = 10\n\n[[fault]]\nkind = \"load\"\nstall_max_ms = 300\n";
  const auto a = sim({no_nodes.string()});
  CHECK(a.status == 2);
  CHECK_THAT(a.out, Catch::Contains("no_nodes.toml:4") && Catch::Contains("fraction"));
  const auto misplaced = dir.path / "misplaced.toml";
  std::ofstream(misplaced) << "[scenario]\nnodes = 10\n\n[[fault]]\nkind = \"kill\"\nnodes = [1]\nservice_ms = 5\n";
  const auto b = sim({misplaced.string()});
  CHECK(b.status == 2);
  CHECK_THAT(b.out, Catch::Contains("misplaced.toml:7") &&
                        Catch::Contains("fault[1].service_ms applies only to kind = \"load\""));
}

TEST_CASE("an elastic job holds its invariants through kills, restarts, partitions, joins, leaves and pauses",
          "[sims][job]") {
  for (const char* s : {"elastic_job.toml", "elastic_churn.toml"})
    for (int seed = 1; seed <= 25; ++seed) {
      INFO(s << " seed " << seed);
      const auto r = report(s, seed);
      CHECK(r["broken"].empty());
      CHECK(r["job"]["generations"].get<int>() >= 5);  // the faults made new generations
      CHECK(r["job"]["epochs"].get<int>() >= 10);      // and the job trained through them
    }
}

TEST_CASE("an async job's shards: none of the updates declared durable is lost, none is applied twice, and every "
          "shard is back to two holders, through kills, a restart, a pause, joins, a leave and a node cut off",
          "[sims][job][async]") {
  for (int seed = 1; seed <= 5; ++seed) {
    INFO("async_churn.toml seed " << seed);
    const auto r = report("async_churn.toml", seed);
    CHECK(r["broken"].empty());
    CHECK(r["job"]["generations"].get<int>() >= 6);
    const auto& shards = r["job"]["shards"];
    CHECK(shards["lost"] == "");
    // The protocol ran and the faults made it work: updates applied and made durable, states
    // taken over by new holders, resends a new primary already held answered as such.
    CHECK(shards["applied"].get<uint64_t>() > 10000);
    CHECK(shards["durable"].get<uint64_t>() > 10000);
    CHECK(shards["takeovers"].get<uint64_t>() >= 14);
    CHECK(shards["duplicates"].get<uint64_t>() > 0);
  }
}

TEST_CASE("async with a majority quorum: shards whose holders are all cut off are waited for, not lost",
          "[sims][job][async]") {
  tepdist::test::TempDir dir;
  const auto file = dir.path / "cut_off.toml";
  // Five nodes, 30 shards with two holders each: about three shards have both holders among
  // nodes 3 and 4, which a partition cuts off for 8 s. The three on the other side are a
  // majority and go on; they must wait for those shards rather than declare them lost.
  std::ofstream(file) << R"([scenario]
nodes = 5
duration_s = 45
[job]
samples = 6000
batch = 16
step_ms = 40
shards = 30
replication = 2
[[fault]]
kind = "partition"
at_s = 8
duration_s = 8
nodes = [3, 4]
[invariants]
no_false_positives = false
)";
  // The scenario means something only if some shard has both holders on the cut-off side (the
  // simulator names its nodes n00000, n00001, ...).
  const std::vector<std::string> ids{"n00000", "n00001", "n00002", "n00003", "n00004"};
  int cut_off = 0;
  for (const auto& holders : tepdist::elastic::place_shards(30, ids, 2))
    cut_off += holders[0] >= "n00003" && holders[1] >= "n00003";
  REQUIRE(cut_off > 0);
  for (int seed = 1; seed <= 3; ++seed) {
    INFO("seed " << seed);
    const auto report = report_of_file(file.string(), seed);
    CHECK(report["broken"].empty());
    CHECK(report["job"]["lost"] == "");
    CHECK(report["job"]["shards"]["lost"] == "");
    // The partition made the cluster change (a generation without nodes 3 and 4, or one waited
    // for), and the job went on after the heal with all five.
    CHECK(report["job"]["generations"].get<int>() >= 2);
    CHECK(report["job"]["shards"]["applied"].get<uint64_t>() > 1000);
  }
}

TEST_CASE("async: a node joins once no batch is started, and every update is durable at the end: a primary restored "
          "from a source that stays its replica counts that replica's copy",
          "[sims][job][async]") {
  tepdist::test::TempDir dir;
  const auto file = dir.path / "join_drained.toml";
  // Four nodes, 12 shards with two holders each; workers start no batch after 6 s, and a fifth
  // node joins at 8 s. No push follows the join's generation, so only the acks its install brings
  // can make the restored primaries' states durable.
  std::ofstream(file) << R"([scenario]
nodes = 4
duration_s = 24
[job]
samples = 6000
batch = 16
step_ms = 40
shards = 12
replication = 2
drain_s = 18
[[fault]]
kind = "join"
at_s = 8
count = 1
)";
  // It means something only if some shard moves to a primary that did not hold it while one of its
  // holders stays on as a replica: that holder is the only source the new primary can have.
  const std::vector<std::string> before{"n00000", "n00001", "n00002", "n00003"};
  auto after = before;
  after.push_back("n00004");
  const auto old_holders = tepdist::elastic::place_shards(12, before, 2);
  const auto new_holders = tepdist::elastic::place_shards(12, after, 2);
  int moved = 0;
  for (size_t s = 0; s < 12; ++s) {
    const auto& o = old_holders[s];
    const auto held = [&](const std::string& id) { return std::find(o.begin(), o.end(), id) != o.end(); };
    moved += !held(new_holders[s][0]) && held(new_holders[s][1]);
  }
  REQUIRE(moved > 0);
  for (int seed = 1; seed <= 3; ++seed) {
    INFO("seed " << seed);
    const auto report = report_of_file(file.string(), seed);
    CHECK(report["broken"].empty());
    CHECK(report["job"]["generations"].get<int>() >= 2);
    CHECK(report["job"]["shards"]["takeovers"].get<uint64_t>() > 0);
  }
}

TEST_CASE("with quorum = \"any\" a partition forks the job, and the invariants say so", "[sims][job]") {
  tepdist::test::TempDir dir;
  const auto file = dir.path / "fork.toml";
  // Six nodes split three and three for 10 s; `quorum` is the [job] table's line for it.
  auto write = [&](const std::string& quorum) {
    std::ofstream(file) << "[scenario]\nnodes = 6\nduration_s = 40\n[job]\n" << quorum << R"([[fault]]
kind = "partition"
at_s = 5
duration_s = 10
nodes = [0, 1, 2]
[invariants]
no_false_positives = false
)";
  };
  write("quorum = \"any\"\n");
  const auto r = sim({file.string(), "--seed", "1"});
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("one_side") || Catch::Contains("one_generation"));
  // The same partition with a majority quorum: three of six is no majority, so neither side goes
  // on until the heal, and nothing breaks.
  write("");
  const auto safe = sim({file.string(), "--seed", "1"});
  INFO(safe.out);
  CHECK(safe.status == 0);
}

// The simulator as a user runs it (`tepdist sim`): scenarios hold their invariants, a seed
// replays a run exactly in another process, a broken invariant fails with the seed to replay it.

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

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

nlohmann::json report(const std::string& scenario, int seed) {
  const auto r = sim({scenarios + scenario, "--seed", std::to_string(seed), "--json"});
  INFO(r.out);
  REQUIRE(r.status == 0);
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

TEST_CASE("one seed replays exactly in another process; another seed differs", "[sims]") {
  const auto a = report("churn.toml", 5), b = report("churn.toml", 5), c = report("churn.toml", 6);
  CHECK(a["event_log_hash"] == b["event_log_hash"]);
  CHECK(a["events"] == b["events"]);
  CHECK(a["event_log_hash"] != c["event_log_hash"]);
}

TEST_CASE("a broken invariant exits non-zero and prints the seed to replay it", "[sims]") {
  tepdist::test::TempDir dir;
  const auto file = dir.path / "too_short.toml";
  // Killed a second before the end: nobody can have declared it dead yet.
  std::ofstream(file) << "[scenario]\nnodes = 10\nduration_s = 30\n[[fault]]\nkind = \"kill\"\nat_s = 29\nnodes = [4]\n";
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

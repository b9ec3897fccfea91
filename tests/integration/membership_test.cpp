// SWIM over the real transport: five node processes on loopback, one killed and restarted, one
// stopped gracefully, and `tepdist status` asked what it sees.

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "tests/support/process.hpp"
#include "tests/support/temp_dir.hpp"

using tepdist::test::Child;
using tepdist::test::field;

namespace {

struct Nodes {
  tepdist::test::TempDir dir;
  std::string secret_file = (dir.path / "secret").string();
  std::map<std::string, std::unique_ptr<Child>> nodes;

  Nodes() {
    std::ofstream(secret_file) << "membership test secret\n";
    ::chmod(secret_file.c_str(), 0600);
  }

  std::vector<std::string> common() {
    // Fast probes, so a death is detected within seconds; the defaults are the LAN profile's.
    return {"--set", "cluster.secret_file=" + secret_file, "--set", "membership.probe_interval_ms=200",
            "--set", "membership.probe_timeout_ms=100"};
  }

  Child& start(const std::string& name, const std::string& seed) {
    std::vector<std::string> argv{TEPDIST_BINARY, "node", "--name", name};
    for (auto& a : common()) argv.push_back(a);
    if (!seed.empty()) argv.insert(argv.end(), {"--join", seed});
    auto& slot = nodes[name];
    slot.reset();  // reap an earlier process of that name first
    slot = std::make_unique<Child>(argv);
    return *slot;
  }
};

}  // namespace

TEST_CASE("a cluster of five detects a kill, takes the restart back, and tells a leave from a death",
          "[integration][membership]") {
  Nodes c;
  const auto ready = c.start("n1", "").wait_for("node_ready");
  REQUIRE(ready);
  const std::string seed = field(*ready, "address");
  for (const char* n : {"n2", "n3", "n4", "n5"}) c.start(n, seed);
  for (auto& [name, node] : c.nodes) {
    INFO(name);
    REQUIRE(node->seen("view members=5 coordinator=n1"));
  }
  const auto first_n3 = c.nodes["n1"]->seen("member_joined id=n3");
  REQUIRE(first_n3);

  // SIGKILL n3: everyone else declares it dead.
  c.nodes["n3"]->signal(SIGKILL);
  c.nodes["n3"]->wait();
  for (const char* n : {"n1", "n2", "n4", "n5"}) {
    INFO(n);
    CHECK(c.nodes[n]->seen("member_dead id=n3"));
  }

  // Restarted at once with the same name: alive again, with a higher incarnation.
  c.start("n3", seed);
  for (const char* n : {"n1", "n2", "n4", "n5"}) {
    INFO(n);
    // Join lines for n3, in order, until one carries an incarnation above the first run's.
    auto line = c.nodes[n]->wait_for("member_joined id=n3 ");
    while (line && std::stoull(field(*line, "incarnation")) <= std::stoull(field(*first_n3, "incarnation")))
      line = c.nodes[n]->wait_for("member_joined id=n3 ");
    REQUIRE(line);
  }

  // SIGTERM n4: a graceful leave, marked left and never dead.
  c.nodes["n4"]->signal(SIGTERM);
  CHECK(c.nodes["n4"]->wait() == 0);
  for (const char* n : {"n1", "n2", "n3", "n5"}) {
    INFO(n);
    const bool left = c.nodes[n]->seen("member_left id=n4").has_value();
    const bool dead = c.nodes[n]->all().find("member_dead id=n4") != std::string::npos;
    // This has failed now and then under CPU load (a live n4 suspected, then neither its
    // refutation nor its leave heard): every node's log, n4's too, for the diagnosis.
    if (!left || dead)
      for (auto& [name, node] : c.nodes) UNSCOPED_INFO("--- " << name << "'s log:\n" << node->all());
    CHECK(left);
    CHECK_FALSE(dead);
  }

  // And `tepdist status` shows it all.
  std::vector<std::string> argv{TEPDIST_BINARY, "status", "--peer", seed, "--json"};
  for (auto& a : c.common()) argv.push_back(a);
  Child status(argv);
  REQUIRE(status.wait() == 0);
  const std::string out = status.all();
  const auto view = nlohmann::json::parse(out.substr(out.find('{')));
  std::map<std::string, std::string> state;
  for (const auto& m : view["members"]) state[m["id"]] = m["state"];
  CHECK(state["n1"] == "alive");
  CHECK(state["n3"] == "alive");
  CHECK(state["n4"] == "left");
  CHECK(state["n5"] == "alive");

  for (auto& [name, node] : c.nodes)
    if (name != "n4") node->signal(SIGTERM);
  for (auto& [name, node] : c.nodes)
    if (name != "n4") CHECK(node->wait() == 0);
}

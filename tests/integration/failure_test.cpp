// Failures that send no goodbye, on real processes: one of five nodes loses its link (it runs in a
// network namespace of its own, whose only link is taken down), briefly or until it holds the
// others dead, or is stopped with SIGSTOP. The other four must declare it dead within a bound, take
// it back within a bound once it can be heard again, and never declare anyone else dead. The times
// measured are printed, one line a phase ("failure_test: ..."). The link tests need root and
// iproute2, and say they were skipped (a warning) where they cannot run.

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <utility>

#include "tests/support/netns.hpp"
#include "tests/support/process.hpp"
#include "tests/support/temp_dir.hpp"

using tepdist::test::Child;
using tepdist::test::field;
using tepdist::test::log_time;
using Clock = std::chrono::system_clock;  // the nodes' log lines carry wall-clock times
/// Per node, how long something took, or nullopt where it did not happen in time.
using Timings = std::map<std::string, std::optional<Clock::duration>>;

namespace {

// With probes every 200 ms a death is known everywhere in about 1.3 s and a node is taken back
// within a reconnect interval or two (2 s each); the bounds leave room for a loaded 2-core machine.
constexpr auto detection_bound = std::chrono::seconds(10);
constexpr auto take_back_bound = std::chrono::seconds(20);
// A node cut off suspects the others one probe at a time, and slows its own probes as they fail
// (Lifeguard's local health awareness), so it takes longer to declare all four dead.
constexpr auto cut_off_bound = std::chrono::seconds(40);

/// The last liveness event `log` records for member `id`, as (kind, line): kind is the word after
/// "member_" (joined, alive_again, restarted, suspected, dead, left), or "" if there is none.
/// `updated` is skipped: it changes details, not liveness.
std::pair<std::string, std::string> last_event(const std::string& log, const std::string& id) {
  const std::string suffix = " id=" + id + " ";
  for (size_t end = log.size(); end > 0;) {
    const size_t start = log.rfind('\n', end - 1);
    const size_t from = start == std::string::npos ? 0 : start + 1;
    const std::string line = log.substr(from, end - from);
    end = start == std::string::npos ? 0 : start;
    const size_t at = line.find(" member_");
    if (at == std::string::npos) continue;
    const size_t kind_end = line.find(suffix, at);
    if (kind_end == std::string::npos || line.find(' ', at + 1) != kind_end) continue;
    const std::string kind = line.substr(at + 8, kind_end - at - 8);
    if (kind != "updated") return {kind, line};
  }
  return {"", ""};
}

bool dead(const std::string& kind) { return kind == "dead"; }
bool alive(const std::string& kind) { return kind == "joined" || kind == "alive_again" || kind == "restarted"; }

/// The ids `log` ever declared dead.
std::vector<std::string> deaths(const std::string& log) {
  std::vector<std::string> ids;
  for (size_t at = 0; (at = log.find(" member_dead id=", at)) != std::string::npos; ++at)
    ids.push_back(field(log.substr(at, log.find('\n', at) - at), "id"));
  return ids;
}

std::string millis(Clock::duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}

struct Cluster {
  tepdist::test::TempDir dir;
  std::string secret_file = (dir.path / "secret").string();
  std::map<std::string, std::unique_ptr<Child>> nodes;

  Cluster() {
    std::ofstream(secret_file) << "failure test secret\n";
    ::chmod(secret_file.c_str(), 0600);
  }

  /// Starts a node; `wrap` turns its argv into the command to run (`ip netns exec`, say).
  Child& start(const std::string& name, const std::string& seed, const std::string& listen,
               const std::function<std::vector<std::string>(std::vector<std::string>)>& wrap = {}) {
    // Fast probes, as in the membership test, so a death is detected within seconds.
    std::vector<std::string> argv{TEPDIST_BINARY, "node", "--name", name, "--listen", listen};
    for (std::string set : {"cluster.secret_file=" + secret_file, std::string("membership.probe_interval_ms=200"),
                            std::string("membership.probe_timeout_ms=100")})
      argv.insert(argv.end(), {"--set", set});
    if (!seed.empty()) argv.insert(argv.end(), {"--join", seed});
    auto& slot = nodes[name];
    slot = std::make_unique<Child>(wrap ? wrap(argv) : argv);
    return *slot;
  }

  /// Every node's log, for a failure's diagnosis.
  void dump_logs() {
    for (auto& [name, node] : nodes) UNSCOPED_INFO("--- " << name << "'s log:\n" << node->all());
  }
};

/// Waits, within `bound` of `since`, until each of `observers` holds `victim` in a state `wanted`
/// accepts; the time each took by its own log line, or nullopt for one that did not in time. Reads
/// every node's output between waits, so none fills its pipe and blocks on logging.
Timings wait_everywhere(Cluster& c, const std::vector<std::string>& observers, const std::string& victim,
                        bool (*wanted)(const std::string&), Clock::time_point since, Clock::duration bound) {
  Timings took;
  for (const auto& name : observers) {
    for (auto& [other, node] : c.nodes) node->all();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(since + bound - Clock::now());
    Child& node = *c.nodes.at(name);
    if (!node.wait_until([&](const std::string& log) { return wanted(last_event(log, victim).first); },
                         std::max(left, std::chrono::milliseconds(0)))) {
      took[name] = std::nullopt;
      continue;
    }
    const auto line = last_event(node.all(), victim).second;
    took[name] = log_time(line).value_or(Clock::now()) - since;
  }
  return took;
}

/// One line for the test's output: "n5 dead after link down: n1 1290 ms, n2 1301 ms, ...".
void report(const std::string& what, const Timings& took) {
  std::string line = "failure_test: " + what + ":";
  for (const auto& [name, d] : took)
    line += " " + name + " " + (!d ? "not in time" : *d < Clock::duration::zero() ? "never lost" : millis(*d)) + ",";
  line.pop_back();
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

void require_all(const Timings& took, Cluster& c) {
  for (const auto& [name, d] : took) {
    if (!d) c.dump_logs();  // unscoped messages go with the next assertion, passing or not
    INFO(name);
    REQUIRE(d);
  }
}

/// The whole scenario: `fail` makes `victim` go silent, `recover` undoes it. The four others must
/// declare it dead, take it back, and declare nobody else dead; the victim must take them back.
/// With `both_sides`, the victim (which can still run) must also declare the four dead before
/// `recover`, so the take-back is a healed partition that each side holds dead, where only the
/// reconnect attempts bring them together again.
void fail_and_recover(Cluster& c, const std::string& victim, const std::string& how, bool both_sides,
                      const std::function<void()>& fail, const std::function<void()>& recover) {
  std::vector<std::string> others;
  for (auto& [name, node] : c.nodes)
    if (name != victim) others.push_back(name);
  for (auto& [name, node] : c.nodes) {
    INFO(name);
    REQUIRE(node->seen("view members=5 coordinator=n1"));
  }

  const auto failed_at = Clock::now();
  fail();
  const auto declared = wait_everywhere(c, others, victim, dead, failed_at, detection_bound);
  report(victim + " declared dead after " + how, declared);
  require_all(declared, c);
  if (both_sides) {
    Timings dead_there;
    for (const auto& other : others)
      dead_there[other] = wait_everywhere(c, {victim}, other, dead, failed_at, cut_off_bound)[victim];
    report(victim + ", cut off, declares each other node dead after " + how, dead_there);
    require_all(dead_there, c);
  }

  const auto recovered_at = Clock::now();
  recover();
  const auto back = wait_everywhere(c, others, victim, alive, recovered_at, take_back_bound);
  report(victim + " taken back after the " + how + " ended", back);
  require_all(back, c);
  // And the victim, which held them all dead or suspect meanwhile, takes them back too.
  Timings back_there;
  for (const auto& other : others)
    back_there[other] = wait_everywhere(c, {victim}, other, alive, recovered_at, take_back_bound)[victim];
  const auto victim_log = c.nodes.at(victim)->all();
  report(victim + " takes back each other node after the " + how + " ended (it declared " +
             std::to_string(deaths(victim_log).size()) + " dead meanwhile)",
         back_there);
  require_all(back_there, c);

  // No false deaths: the four never declared anyone but the victim dead.
  std::map<std::string, std::string> wrongly;  // observer -> the live members it declared dead
  for (const auto& name : others)
    for (const auto& id : deaths(c.nodes.at(name)->all()))
      if (id != victim) wrongly[name] += " " + id;
  bool dumped = false;
  for (const auto& name : others) {
    if (!wrongly[name].empty() && !std::exchange(dumped, true)) c.dump_logs();
    INFO(name << " declared dead:" << wrongly[name]);
    CHECK(wrongly[name].empty());
  }

  for (auto& [name, node] : c.nodes) node->signal(SIGTERM);
  for (auto& [name, node] : c.nodes) {
    INFO(name);
    CHECK(node->wait() == 0);
  }
}

/// Starts n1-n4 in the root namespace and n5 inside `ns`, all reachable from one another.
void start_with_one_in(Cluster& c, const tepdist::test::NetnsHost& ns) {
  const std::string listen = ns.root_address() + ":0";  // reachable from inside the namespace
  const auto ready = c.start("n1", "", listen).wait_for("node_ready");
  REQUIRE(ready);
  const std::string seed = field(*ready, "address");
  for (const char* n : {"n2", "n3", "n4"}) c.start(n, seed, listen);
  c.start("n5", seed, ns.host_address() + ":0", [&](std::vector<std::string> argv) { return ns.inside(argv); });
}

/// Five nodes, n5 in a network namespace of its own; its link goes down and comes up again.
/// until_all_dead: the link stays down until n5 holds the other four dead (else only until they
/// hold n5 dead, before n5, whose own probes slow down as they fail, has declared anyone).
void cut_off_n5(bool until_all_dead) {
  auto host = tepdist::test::NetnsHost::create();
  if (!host) {
    WARN("skipped: no network namespace for the cut-off node (" << host.error() << ")");
    return;
  }
  auto& ns = **host;
  Cluster c;  // declared after the namespace, so the nodes are killed before it is deleted
  start_with_one_in(c, ns);
  fail_and_recover(
      c, "n5", "link down", until_all_dead, [&] { REQUIRE(ns.set_link(false).status == 0); },
      [&] { REQUIRE(ns.set_link(true).status == 0); });
}

}  // namespace

TEST_CASE(
    "a cluster of five declares a node dead when its link goes down, takes it back when the link comes up, "
    "and declares no one else dead",
    "[integration][membership][failure]") {
  cut_off_n5(false);
}

// When the link comes up, n5's verdicts (each of the four dead, at the incarnation it still holds)
// reach the four in the same message as n5's own return. Taken as deaths, they made the four declare
// each other dead until those refuted (6 to 12 false deaths a heal, 16 runs in 16); they are
// accusations now, which the accused refute (gossip/swim/swim.cpp, merge).
TEST_CASE(
    "a node cut off until it holds the other four dead is taken back when its link comes up, and no one on "
    "the other side is declared dead",
    "[integration][membership][failure]") {
  cut_off_n5(true);
}

TEST_CASE(
    "a cluster of five declares a stopped node dead, takes it back when it continues, and declares no one "
    "else dead",
    "[integration][membership][failure]") {
  Cluster c;
  const auto ready = c.start("n1", "", "127.0.0.1:0").wait_for("node_ready");
  REQUIRE(ready);
  const std::string seed = field(*ready, "address");
  for (const char* n : {"n2", "n3", "n4", "n5"}) c.start(n, seed, "127.0.0.1:0");
  fail_and_recover(
      c, "n3", "SIGSTOP", false, [&] { c.nodes.at("n3")->signal(SIGSTOP); },
      [&] { c.nodes.at("n3")->signal(SIGCONT); });
}

// Real node processes on loopback: they connect, authenticate and agree on the coordinator, refuse
// strangers, and are always reaped.

#include <sys/stat.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "tests/support/process.hpp"

namespace fs = std::filesystem;
using tepdist::test::Child;
using tepdist::test::field;

namespace {

struct Cluster {
  fs::path dir = fs::temp_directory_path() / ("tepdist-nodes-" + std::to_string(::getpid()) + "-" +
                                              std::to_string(reinterpret_cast<uintptr_t>(this)));
  Cluster() {
    fs::create_directories(dir);
    write_secret("secret", "correct horse battery staple");
  }
  ~Cluster() { fs::remove_all(dir); }

  std::string write_secret(const std::string& name, const std::string& value) {
    const auto p = dir / name;
    std::ofstream(p) << value << "\n";
    ::chmod(p.c_str(), 0600);
    return p.string();
  }

  std::vector<std::string> node(const std::string& name, std::vector<std::string> extra = {},
                                const std::string& secret = "secret") {
    std::vector<std::string> argv{TEPDIST_BINARY, "node", "--name", name, "--set",
                                  "cluster.secret_file=" + (dir / secret).string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }
};

/// The names of process `pid`'s threads.
std::set<std::string> thread_names(pid_t pid) {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& task : fs::directory_iterator(fs::path("/proc") / std::to_string(pid) / "task", ec)) {
    std::string name;
    std::getline(std::ifstream(task.path() / "comm"), name);
    if (!name.empty()) names.insert(name);
  }
  return names;
}

}  // namespace

TEST_CASE("three nodes connect, authenticate and agree on the coordinator, then stop cleanly", "[integration][node]") {
  Cluster c;
  const auto ready_file = c.dir / "n1.ready";
  Child n1(c.node("n1", {"--ready-file", ready_file.string()}));
  const auto ready = n1.wait_for("node_ready");
  REQUIRE(ready);
  const std::string seed = field(*ready, "address");
  std::string from_file;
  std::ifstream(ready_file) >> from_file;  // written before node_ready is printed
  CHECK(from_file == seed);
  Child n2(c.node("n2", {"--join", seed}));
  Child n3(c.node("n3", {"--join", seed}));
  // Once each sees all three, they name the same coordinator: the lowest id.
  for (Child* n : {&n1, &n2, &n3}) {
    const auto coordinator = n->wait_for("view members=3 coordinator=");
    INFO(n->all());
    REQUIRE(coordinator);
    CHECK(field(*coordinator, "coordinator") == "n1");
  }
  CHECK_THAT(n3.all(), Catch::Contains("member_joined id=n2"));  // learned through the seed
  // Each role's thread says what it is (top -H, ps -L): the detached actors name their threads as
  // they start, which may be a moment after the view settles, so the names are polled for.
  const std::set<std::string> roles{"trainer", "router", "uv-loop"};
  std::set<std::string> named;
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);;) {
    named = thread_names(n1.pid());
    if (std::includes(named.begin(), named.end(), roles.begin(), roles.end()) ||
        std::chrono::steady_clock::now() > until)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const auto& role : roles) {
    INFO("threads of n1: " << Catch::Detail::stringify(std::vector<std::string>(named.begin(), named.end())));
    CHECK(named.count(role) == 1);
  }
  for (Child* n : {&n1, &n2, &n3}) n->signal(SIGTERM);
  for (Child* n : {&n1, &n2, &n3}) CHECK(n->wait() == 0);
}

TEST_CASE("a node started by hand takes its own device and slowdown from its command line, its [nodes.NAME] table "
          "first, and otherwise the job's device",
          "[integration][node]") {
  Cluster c;
  const auto ready_line = [&](std::vector<std::string> extra) {
    Child n(c.node("n1", std::move(extra)));
    const auto ready = n.wait_for("node_ready");
    n.signal(SIGTERM);
    const int status = n.wait();
    INFO(n.all());
    CHECK(status == 0);
    REQUIRE(ready);
    return *ready;
  };
  // Nothing of its own: each job's compute.device holds (no job is run here: which device a
  // trainer then opens is the cuda integration test's).
  const auto plain = ready_line({});
  CHECK(field(plain, "device") == "job");
  CHECK(field(plain, "slowdown") == "1");
  const auto set = ready_line({"--set", "compute.device=5", "--set", "compute.slowdown=2"});
  CHECK(field(set, "device") == "5");
  CHECK(field(set, "slowdown") == "2");
  const auto table = ready_line({"--set", "compute.device=5", "--set", "nodes.n1.device=7"});
  CHECK(field(table, "device") == "7");
}

TEST_CASE("a node with the wrong secret is refused and joins nobody", "[integration][node]") {
  Cluster c;
  c.write_secret("other", "a guess at the secret");
  Child n1(c.node("n1"));
  const auto ready = n1.wait_for("node_ready");
  REQUIRE(ready);
  Child intruder(c.node("intruder", {"--join", field(*ready, "address")}, "other"));
  const auto refused = intruder.wait_for("peer_refused");
  REQUIRE(refused);
  CHECK_THAT(*refused, Catch::Contains("wrong secret"));
  CHECK_THAT(n1.all(), !Catch::Contains("member_joined"));
}

TEST_CASE("a node from another cluster is refused, naming both cluster ids", "[integration][node]") {
  Cluster c;
  Child n1(c.node("n1"));
  const auto ready = n1.wait_for("node_ready");
  REQUIRE(ready);
  Child stranger(c.node("stranger", {"--set", "cluster.cluster_id=elsewhere", "--join", field(*ready, "address")}));
  const auto refused = n1.wait_for("peer_refused");
  REQUIRE(refused);
  CHECK_THAT(*refused, Catch::Contains("cluster id mismatch") && Catch::Contains("elsewhere"));
}

TEST_CASE("a node says why it cannot start: port taken, loose secret file", "[integration][node]") {
  Cluster c;
  Child n1(c.node("n1"));
  const auto ready = n1.wait_for("node_ready");
  REQUIRE(ready);
  Child clash(c.node("n2", {"--listen", field(*ready, "address")}));
  CHECK(clash.wait() == 1);
  CHECK_THAT(clash.all(), Catch::Contains(field(*ready, "address")) && Catch::Contains("address already in use"));

  const auto loose = c.dir / "loose";
  std::ofstream(loose) << "x\n";
  ::chmod(loose.c_str(), 0644);
  Child careless(c.node("n3", {}, "loose"));
  CHECK(careless.wait() == 2);
  CHECK_THAT(careless.all(), Catch::Contains("0600") && Catch::Contains(loose.string()));
}

TEST_CASE("a node whose router fails stops, non-zero, saying so, and its peer sees it go", "[integration][node]") {
  Cluster c;
  Child n1(c.node("n1"));
  const auto ready = n1.wait_for("node_ready");
  REQUIRE(ready);
  Child n2(c.node("n2", {"--join", field(*ready, "address")}));
  REQUIRE(n1.wait_for("view members=2"));
  // The fault: n2's router throws. Without it n2 could not answer a probe while keeping its port.
  n2.signal(SIGRTMIN + 1);
  REQUIRE(n2.wait_for("the router (membership and every frame) stopped"));
  CHECK(n2.wait() == 1);
  INFO(n1.all());
  CHECK(n1.wait_for("member_dead id=n2", std::chrono::seconds(30)));
  n1.signal(SIGTERM);
  CHECK(n1.wait() == 0);
}

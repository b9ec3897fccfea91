// The monitor's HTTP endpoint on the nodes of a running job: what `tepdist run` prints, what a
// scraper and the dashboard get.

#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <thread>

#include "tests/support/jobs.hpp"
#include "tests/support/process.hpp"
#include "tests/support/processes.hpp"
#include "tests/support/temp_dir.hpp"

namespace fs = std::filesystem;
using tepdist::test::Child;
using tepdist::test::TempDir;
using tepdist::test::all_gone;

namespace {

/// Parses a scrape with Debian's prometheus_client (its text-format parser raises on anything
/// malformed) and prints the value of tepdist_train_steps_total.
constexpr const char* parse_scrape = R"PY(
import sys
from prometheus_client.parser import text_string_to_metric_families
steps = None
families = 0
for family in text_string_to_metric_families(open(sys.argv[1]).read()):
    families += 1
    for sample in family.samples:
        if sample.name == "tepdist_train_steps_total":
            steps = sample.value
if steps is None:
    sys.exit("no tepdist_train_steps_total in %d families" % families)
print("steps=%d" % steps)
)PY";

/// The steps in a scrape, checked by the strict parser; -1 if it refused the text.
long scraped_steps(const TempDir& dir, const std::string& text, const std::string& name) {
  const auto file = dir.path / name;
  std::ofstream(file) << text;
  // Debian's python3: the set-up script installs python3-prometheus-client for it.
  Child parse({"/usr/bin/python3", "-c", parse_scrape, file.string()});
  const int status = parse.wait();
  INFO(parse.all());
  CHECK(status == 0);
  std::smatch m;
  const std::string out = parse.all();
  if (status != 0 || !std::regex_search(out, m, std::regex("steps=(\\d+)"))) return -1;
  return std::stol(m[1]);
}

/// `tepdist run` of a 2-node job in `mode` on synthetic data, and node-00's endpoint, as the run
/// prints it: host and port.
struct WatchedRun {
  std::unique_ptr<Child> run;
  std::string host;
  int port = 0;
};

WatchedRun start_watched(const TempDir& dir, const std::string& mode) {
  const std::string job =
      tepdist::test::fashion_subset_job(dir, "mode = \"" + mode + "\"\nepochs = 1000\nlog_every_steps = 8\n");
  WatchedRun w;
  w.run = std::make_unique<Child>(std::vector<std::string>{TEPDIST_BINARY, "run", job, "--nodes", "2", "--set",
                                                           "data.dataset=\"synthetic\"", "--out",
                                                           (dir.path / "out").string()});
  const auto line = w.run->wait_for("dashboard:", std::chrono::seconds(60));
  INFO(w.run->all());
  REQUIRE(line);
  std::smatch m;
  REQUIRE(std::regex_search(*line, m, std::regex("http://(127\\.0\\.0\\.1):(\\d+)/")));
  w.host = m[1].str();
  w.port = std::stoi(m[2]);
  return w;
}

}  // namespace

TEST_CASE("the nodes' HTTP endpoints show the running job: /metrics parses and its counters rise, /status is the status document",
          "[integration][run][monitor]") {
  TempDir dir;
  const auto watched = start_watched(dir, "sync");
  auto& run = *watched.run;
  INFO(run.all());
  httplib::Client client(watched.host, watched.port);
  client.set_read_timeout(std::chrono::seconds(10));
  // The ready file names the same endpoint.
  std::ifstream ready(dir.path / "out" / "run" / "node-0.ready");
  std::string address, http;
  std::getline(ready, address);
  std::getline(ready, http);
  CHECK(http == "http=" + watched.host + ":" + std::to_string(watched.port));

  REQUIRE(run.wait_for("samples/s", std::chrono::seconds(60)));  // training
  auto first = client.Get("/metrics");
  REQUIRE(first);
  CHECK(first->status == 200);
  const long before = scraped_steps(dir, first->body, "first.prom");
  CHECK(before > 0);
  CHECK_THAT(first->body, Catch::Contains("tepdist_worker_samples_per_second{node=\"node-00\",mode=\"sync\"}") &&
                              Catch::Contains("tepdist_transport_sent_bytes_total{node=\"node-00\",peer=") &&
                              Catch::Contains("tepdist_learning_rate{") && Catch::Contains("tepdist_train_step_seconds_bucket{"));
  REQUIRE(run.wait_for("samples/s", std::chrono::seconds(60)));  // the next progress report: more steps
  auto second = client.Get("/metrics");
  REQUIRE(second);
  CHECK(scraped_steps(dir, second->body, "second.prom") > before);

  // The router's copy of the job follows the steps a few times a second: ask until it shows one
  // (nothing pushes a status to wait on).
  nlohmann::json doc;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  do {
    auto status = client.Get("/status");
    REQUIRE(status);
    REQUIRE(status->status == 200);
    doc = nlohmann::json::parse(status->body);
    // A step, a point of history (one a second) and an evaluation (every epoch: 48 steps here).
    const auto measured = [](const nlohmann::json& w) {
      return w["samples_per_second"].is_number() && w["samples_per_second"].get<double>() > 0;
    };
    // And node-01's own figures, which only the monitor gossip brings to node-00.
    const auto gossiped = [](const nlohmann::json& nodes) {
      return std::any_of(nodes.begin(), nodes.end(), [](const nlohmann::json& n) {
        return n["id"] == "node-01" && n["figures"].contains("step") && n["figures"]["step"].get<double>() > 0 &&
               n["figures"].contains("step_seconds");
      });
    };
    if (doc["job"].is_object() && doc["job"]["step"].get<int64_t>() > 0 && !doc["job"]["history"].empty() &&
        !doc["job"]["evaluations"].empty() &&
        std::all_of(doc["job"]["workers"].begin(), doc["job"]["workers"].end(), measured) && gossiped(doc["nodes"]))
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  } while (std::chrono::steady_clock::now() < deadline);
  INFO(doc.dump(1));
  CHECK(doc["source"] == address);
  std::set<std::string> members;
  for (const auto& member : doc["members"]) members.insert(member["id"].get<std::string>());
  CHECK(members.count("node-00") == 1);
  CHECK(members.count("node-01") == 1);
  REQUIRE(doc["job"].is_object());
  CHECK(doc["job"]["mode"] == "sync");
  CHECK(doc["job"]["lr"].get<double>() > 0);
  REQUIRE(doc["job"]["workers"].size() == 2);
  for (const auto& w : doc["job"]["workers"]) {
    REQUIRE(w["samples_per_second"].is_number());
    CHECK(w["samples_per_second"].get<double>() > 0);
  }
  // The course of the job: node-00 holds rank 0's duties in the first generation, so its
  // evaluations are there; its history has a point a second, with the rate and a speed.
  REQUIRE_FALSE(doc["job"]["history"].empty());
  const auto& point = doc["job"]["history"].back();
  CHECK(point["samples_per_second"].get<double>() > 0);
  CHECK(point["lr"].get<double>() > 0);
  CHECK(point["step"].get<int64_t>() > 0);
  REQUIRE_FALSE(doc["job"]["evaluations"].empty());
  const double accuracy = doc["job"]["evaluations"].back()["test_accuracy"].get<double>();
  CHECK(accuracy > 0);
  CHECK(accuracy <= 1);
  REQUIRE(doc["job"]["generations"].size() == 1);
  // The membership timeline: node-00 saw node-01 join.
  CHECK(std::any_of(doc["events"].begin(), doc["events"].end(),
                    [](const nlohmann::json& e) { return e["member"] == "node-01" && e["kind"] == "joined"; }));
  // Every node's figures, gossiped: node-01's step and bytes are here, fresh.
  std::map<std::string, nlohmann::json> nodes;
  for (const auto& n : doc["nodes"]) nodes[n["id"].get<std::string>()] = n;
  REQUIRE(nodes.count("node-01") == 1);
  CHECK(nodes["node-01"]["stale"] == false);
  CHECK(nodes["node-01"]["figures"]["step"].get<double>() > 0);
  CHECK(nodes["node-01"]["figures"]["bytes_out"].get<double>() > 0);
  CHECK(nodes["node-01"]["figures"]["step_seconds"].get<double>() > 0);  // of its steps in the last round
  CHECK(nodes["node-01"]["figures"]["send_queue_bytes"].get<double>() >= 0);
  CHECK(doc["job"]["generations"][0]["workers"] == 2);

  // tepdist status --watch asks again and again, until interrupted.
  Child watch({TEPDIST_BINARY, "status", (dir.path / "out" / "cluster.toml").string(), "--peer", address, "--watch", "0.2"});
  for (int i = 0; i < 3; ++i) REQUIRE(watch.wait_for("learning rate in effect", std::chrono::seconds(20)));
  watch.signal(SIGINT);
  watch.wait();

  auto page = client.Get("/");
  REQUIRE(page);
  CHECK(page->status == 200);
  CHECK_THAT(page->body, Catch::Contains("<svg id=\"chart-speed\""));

  run.signal(SIGINT);
  CHECK(run.wait() == 130);
  CHECK(all_gone(dir.path.string(), std::chrono::seconds(10)));
}

TEST_CASE("an async job's endpoint shows each worker's push staleness, in /metrics and per worker in /status",
          "[integration][run][monitor]") {
  TempDir dir;
  const auto watched = start_watched(dir, "async");
  auto& run = *watched.run;
  INFO(run.all());
  httplib::Client client(watched.host, watched.port);
  client.set_read_timeout(std::chrono::seconds(10));
  REQUIRE(run.wait_for("samples/s", std::chrono::seconds(60)));  // training
  // Each worker's figures reach node-00 by the monitor gossip, a round every 2 s: ask until both
  // workers' staleness is there (nothing pushes a status to wait on).
  nlohmann::json doc;
  const auto known = [](const nlohmann::json& w) { return w["staleness"].is_number() && w["lag_steps"].is_number(); };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  do {
    auto status = client.Get("/status");
    REQUIRE(status);
    REQUIRE(status->status == 200);
    doc = nlohmann::json::parse(status->body);
    if (doc["job"].is_object() && doc["job"]["workers"].size() == 2 &&
        std::all_of(doc["job"]["workers"].begin(), doc["job"]["workers"].end(), known))
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  } while (std::chrono::steady_clock::now() < deadline);
  INFO(doc.dump(1));
  REQUIRE(doc["job"].is_object());
  CHECK(doc["job"]["mode"] == "async");
  REQUIRE(doc["job"]["workers"].size() == 2);
  for (const auto& w : doc["job"]["workers"]) {
    REQUIRE(known(w));
    CHECK(w["staleness"].get<double>() >= 0);
    CHECK(w["lag_steps"].get<double>() >= 0);
    CHECK(w["step"].get<double>() > 0);
  }
  // The furthest worker lags nobody.
  CHECK(std::any_of(doc["job"]["workers"].begin(), doc["job"]["workers"].end(),
                    [](const nlohmann::json& w) { return w["lag_steps"].get<double>() == 0; }));
  auto scrape = client.Get("/metrics");
  REQUIRE(scrape);
  CHECK(scraped_steps(dir, scrape->body, "async.prom") > 0);  // the strict parser takes the histogram too
  CHECK_THAT(scrape->body, Catch::Contains("tepdist_async_push_staleness_bucket{node=\"node-00\",mode=\"async\",le=\"0\"}") &&
                               Catch::Contains("tepdist_worker_staleness{node=\"node-00\",mode=\"async\"}"));

  run.signal(SIGINT);
  CHECK(run.wait() == 130);
  CHECK(all_gone(dir.path.string(), std::chrono::seconds(10)));
}

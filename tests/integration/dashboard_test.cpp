// The dashboard in a real browser: Debian's chromium driven over WebDriver (chromium-driver, both
// installed by scripts/setup.sh), on the page a node of a running 3-node job serves.

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>

#include "tests/support/jobs.hpp"
#include "tests/support/process.hpp"
#include "tests/support/processes.hpp"
#include "tests/support/temp_dir.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using tepdist::test::Child;
using tepdist::test::TempDir;
using tepdist::test::all_gone;

namespace {

/// A loopback port nobody listens on now (bound, read, closed: the driver takes it next).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

/// A WebDriver session's commands (W3C protocol, JSON over HTTP).
class WebDriver {
 public:
  explicit WebDriver(int port) : client_("127.0.0.1", port) {
    client_.set_read_timeout(std::chrono::seconds(60));
    client_.set_connection_timeout(std::chrono::seconds(10));
  }
  json call(const std::string& method, const std::string& path, const json& body = json::object()) {
    const auto res = method == "GET"      ? client_.Get(path.c_str())
                     : method == "DELETE" ? client_.Delete(path.c_str())
                                          : client_.Post(path.c_str(), body.dump(), "application/json");
    INFO(method << " " << path);
    REQUIRE(res);
    INFO(res->body);
    REQUIRE(res->status == 200);
    return json::parse(res->body)["value"];
  }

 private:
  httplib::Client client_;
};

/// What the page shows, read in the page: rows, chart points, the job's line, the document it drew.
constexpr const char* read_page = R"JS(
const points = id => {
  const line = document.querySelector(id + " polyline");
  return line ? line.getAttribute("points").trim().split(/\s+/).length : 0;
};
return {
  members: document.querySelectorAll("#members tbody tr").length,
  nodes: document.querySelectorAll("#nodes tbody tr").length,
  lossPoints: points("#chart-loss"),
  accuracyPoints: points("#chart-accuracy"),
  bytesSeries: document.querySelectorAll("#chart-bytes polyline").length,
  workers: Array.from(document.querySelectorAll("#workers tbody tr")).map(r => Array.from(r.cells).map(c => c.textContent)),
  timeline: Array.from(document.querySelectorAll("#timeline tbody tr")).map(r => r.textContent),
  job: document.getElementById("job").textContent,
  error: document.getElementById("error").textContent,
  drawn: window.lastStatus || null
};
)JS";

/// Standard base64 (a WebDriver screenshot) to bytes.
std::string base64_decode(const std::string& in) {
  static const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  uint32_t bits = 0;
  int count = 0;
  for (const char c : in) {
    const auto v = alphabet.find(c);
    if (v == std::string::npos) continue;  // padding, line breaks
    bits = (bits << 6) | static_cast<uint32_t>(v);
    if ((count += 6) >= 8) {
      count -= 8;
      out += static_cast<char>((bits >> count) & 0xff);
    }
  }
  return out;
}

/// Kills whatever still mentions the test's folder when the test ends, passed or not (a browser
/// left by a failed assertion included).
struct Reaper {
  std::string needle;
  ~Reaper() { all_gone(needle, std::chrono::milliseconds(0)); }
};

}  // namespace

TEST_CASE("the dashboard in a real browser lists the members and draws the status it fetched, and holds 50 nodes",
          "[integration][monitor][browser]") {
  TempDir dir;
  const Reaper reaper{dir.path.string()};
  const int driver_port = free_port();
  // The browser's profile and the driver's log in the test's folder: every process of it mentions
  // the folder, so all_gone finds them, whatever happens.
  Child driver({"/usr/bin/chromedriver", "--port=" + std::to_string(driver_port),
                "--log-path=" + (dir.path / "chromedriver.log").string()});
  REQUIRE(driver.wait_for("started successfully", std::chrono::seconds(30)));

  const std::string job = tepdist::test::fashion_subset_job(dir, "mode = \"sync\"\nepochs = 1000\nlog_every_steps = 8\n");
  Child run({TEPDIST_BINARY, "run", job, "--nodes", "3", "--set", "data.dataset=\"synthetic\"", "--out",
             (dir.path / "out").string()});
  const auto line = run.wait_for("dashboard:", std::chrono::seconds(60));
  INFO(run.all());
  REQUIRE(line);
  std::smatch m;
  REQUIRE(std::regex_search(*line, m, std::regex("(http://127\\.0\\.0\\.1:\\d+/)")));
  const std::string url = m[1];
  REQUIRE(run.wait_for("samples/s", std::chrono::seconds(60)));

  WebDriver wd(driver_port);
  const json caps = {{"capabilities",
                      {{"alwaysMatch",
                        {{"browserName", "chrome"},
                         {"goog:chromeOptions",
                          {{"binary", "/usr/bin/chromium"},
                           {"args", {"--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                     "--window-size=1300,1900", "--user-data-dir=" + (dir.path / "profile").string()}}}}}}}}};
  const std::string session = wd.call("POST", "/session", caps)["sessionId"];
  const std::string at = "/session/" + session;
  wd.call("POST", at + "/url", {{"url", url}});

  // The page polls /status every 2 s: read it until it shows the 3 nodes' figures, a loss chart
  // and an evaluation (nothing in the page announces a redraw to wait on).
  json page;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  do {
    page = wd.call("POST", at + "/execute/sync", {{"script", read_page}, {"args", json::array()}});
    const auto& w = page["workers"];
    const bool steps = w.size() == 3 && std::ranges::all_of(w, [](const json& row) { return row[2] != ""; });
    if (page["drawn"].is_object() && page["nodes"].get<int>() >= 3 && page["lossPoints"].get<int>() >= 2 &&
        page["accuracyPoints"].get<int>() >= 1 && page["bytesSeries"].get<int>() >= 3 && steps)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  } while (std::chrono::steady_clock::now() < deadline);
  INFO(page.dump(1));
  REQUIRE(page["drawn"].is_object());
  const auto& drawn = page["drawn"];
  CHECK(page["error"] == "");
  // Every member listed, the launcher's submitter too; every node's figures.
  CHECK(page["members"] == drawn["members"].size());
  CHECK(drawn["members"].size() == 4);
  CHECK(page["nodes"].get<int>() >= 3);
  // The charts have a point for each point of the document the page drew.
  CHECK(page["lossPoints"] == drawn["job"]["history"].size());
  CHECK(page["accuracyPoints"] == drawn["job"]["evaluations"].size());
  // Bytes per node: a line for each node whose summaries came at least twice since the page opened.
  CHECK(page["bytesSeries"].get<int>() >= 3);
  // Each worker's step and lag, from its own figures (sync: the ring keeps them within a step or two).
  REQUIRE(page["workers"].size() == 3);
  for (const auto& row : page["workers"]) {
    REQUIRE(row.size() == 7);
    CHECK(row[2] != "");
    CHECK(row[3] != "");
  }
  // The timeline: the members' events and the generation, one row each.
  CHECK(page["timeline"].size() == drawn["events"].size() + drawn["job"]["generations"].size());
  CHECK_THAT(page["timeline"].dump(), Catch::Contains("generation 1: 3 workers"));
  CHECK(page["lossPoints"].get<int>() >= 2);
  // The accuracy shown is the last evaluation's.
  REQUIRE_FALSE(drawn["job"]["evaluations"].empty());
  const double accuracy = drawn["job"]["evaluations"].back()["test_accuracy"];
  char shown[32];
  std::snprintf(shown, sizeof shown, "test accuracy %.4f", accuracy);
  CHECK_THAT(page["job"].get<std::string>(), Catch::Contains(shown));

  // A picture of it (the README's, when TEPDIST_DASHBOARD_PNG names where to put it).
  const std::string png64 = wd.call("GET", at + "/screenshot");
  CHECK(png64.size() > 1000);
  if (const char* where = std::getenv("TEPDIST_DASHBOARD_PNG")) {
    std::ofstream(fs::path(where), std::ios::binary) << base64_decode(png64);
  }

  // Fifty nodes: the same page, served here beside a generated status document of 50 members, 50
  // nodes' figures (5 of them stale) and 50 workers, must show them all without growing sideways.
  const auto served = httplib::Client(url.substr(0, url.size() - 1)).Get("/");  // scheme, host and port
  REQUIRE(served);
  const std::string html = served->body;
  json doc = drawn;
  doc["members"] = json::array();
  doc["nodes"] = json::array();
  doc["job"]["workers"] = json::array();
  for (int i = 0; i < 50; ++i) {
    char id[16];
    std::snprintf(id, sizeof id, "node-%02d", i);
    doc["members"].push_back({{"id", id}, {"state", i < 45 ? "alive" : "dead"}, {"incarnation", 1},
                              {"address", "10.0.0." + std::to_string(i + 1) + ":7000"}, {"region", "eu-west"},
                              {"roles", {"coordinator", "parameter-shard", "worker", "monitor"}}, {"shards", json::array()}});
    doc["nodes"].push_back({{"id", id}, {"state", i < 45 ? "alive" : "dead"}, {"stale", i >= 45}, {"age_s", i < 45 ? 0 : 30},
                            {"unix_ms", 1}, {"figures", {{"generation", 3}, {"step", 1000 + i}, {"samples_per_second", 900 + i},
                                                         {"loss", 0.5}, {"bytes_in", 1e9}, {"bytes_out", 1e9}}}});
    doc["job"]["workers"].push_back({{"id", id}, {"position", 100 * i}, {"samples_per_second", 900 + i}, {"share", 64}});
  }
  httplib::Server fake;
  fake.Get("/", [&](const httplib::Request&, httplib::Response& res) { res.set_content(html, "text/html"); });
  fake.Get("/status", [&](const httplib::Request&, httplib::Response& res) { res.set_content(doc.dump(), "application/json"); });
  const int fake_port = fake.bind_to_any_port("127.0.0.1");
  REQUIRE(fake_port > 0);
  std::thread serving([&] { fake.listen_after_bind(); });
  struct Stop {
    httplib::Server& s;
    std::thread& t;
    ~Stop() {
      s.stop();
      t.join();
    }
  } stop{fake, serving};
  wd.call("POST", at + "/url", {{"url", "http://127.0.0.1:" + std::to_string(fake_port) + "/"}});
  constexpr const char* read_large = R"JS(
return {
  members: document.querySelectorAll("#members tbody tr").length,
  nodes: document.querySelectorAll("#nodes tbody tr").length,
  stale: document.querySelectorAll("#nodes tbody td.stale").length,
  workers: document.querySelectorAll("#workers tbody tr").length,
  series: document.querySelectorAll("#chart-speed polyline").length,
  overflow: document.documentElement.scrollWidth - window.innerWidth
};
)JS";
  json large;
  const auto large_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  do {
    large = wd.call("POST", at + "/execute/sync", {{"script", read_large}, {"args", json::array()}});
    if (large["nodes"] == 50) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  } while (std::chrono::steady_clock::now() < large_deadline);
  INFO(large.dump(1));
  CHECK(large["members"] == 50);
  CHECK(large["nodes"] == 50);
  CHECK(large["stale"] == 5);
  CHECK(large["workers"] == 50);
  CHECK(large["series"] == 45);  // a line per live node; the stale ones are not drawn on
  CHECK(large["overflow"].get<int>() <= 0);  // no sideways scrolling at 1300 px
  wd.call("DELETE", at);

  run.signal(SIGINT);
  CHECK(run.wait() == 130);
  driver.signal(SIGTERM);
  driver.wait();
  CHECK(all_gone(dir.path.string(), std::chrono::seconds(10)));
}

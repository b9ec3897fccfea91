// The monitor's HTTP endpoint on its own: what it serves, what it refuses, and that a crowd of idle
// connections neither stops it nor piles up in it.

#include "actors/monitor_http.hpp"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <set>
#include <thread>
#include <string>
#include <vector>

using tepdist::actors::MonitorHttp;
using tepdist::actors::MonitorHttpOptions;
using tepdist::actors::MonitorHttpViews;

namespace {

MonitorHttpViews fixed_views(std::atomic<int>* status_calls = nullptr) {
  MonitorHttpViews v;
  v.metrics = [] { return std::string("# TYPE up gauge\nup 1\n"); };
  v.status_json = [status_calls]() -> std::expected<std::string, std::string> {
    if (status_calls) ++*status_calls;
    return std::string("{\"source\": \"127.0.0.1:1\"}\n");
  };
  return v;
}

std::pair<std::string, int> host_port(const std::string& address) {
  const auto colon = address.rfind(':');
  return {address.substr(0, colon), std::stoi(address.substr(colon + 1))};
}

/// A TCP connection to `address` that sends nothing (closed with the object).
struct IdleConnection {
  int fd = -1;
  explicit IdleConnection(const std::string& address) {
    const auto [host, port] = host_port(address);
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  IdleConnection(const IdleConnection&) = delete;
  IdleConnection(IdleConnection&& o) noexcept : fd(o.fd) { o.fd = -1; }
  ~IdleConnection() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

TEST_CASE("the monitor endpoint serves metrics, the status document and the dashboard, and refuses every other method",
          "[actors][monitor]") {
  MonitorHttp http({"127.0.0.1:0"}, fixed_views());
  const auto bound = http.start();
  REQUIRE(bound);
  const auto [host, port] = host_port(*bound);
  CHECK(host == "127.0.0.1");
  CHECK(port > 0);
  httplib::Client client(host, port);

  auto metrics = client.Get("/metrics");
  REQUIRE(metrics);
  CHECK(metrics->status == 200);
  CHECK(metrics->body == "# TYPE up gauge\nup 1\n");
  CHECK(metrics->get_header_value("Content-Type") == "text/plain; version=0.0.4; charset=utf-8");

  auto status = client.Get("/status");
  REQUIRE(status);
  CHECK(status->status == 200);
  CHECK(status->body == "{\"source\": \"127.0.0.1:1\"}\n");
  CHECK(status->get_header_value("Content-Type") == "application/json");

  auto page = client.Get("/");
  REQUIRE(page);
  CHECK(page->status == 200);
  CHECK_THAT(page->body, Catch::Contains("<svg id=\"chart-speed\"") && Catch::Contains("fetch(\"/status\""));
  // Self-contained: nothing the page loads comes from anywhere but this node.
  CHECK_THAT(page->body, !Catch::Contains("src=") && !Catch::Contains("<link") && !Catch::Contains("@import") &&
                             !Catch::Contains("url("));

  auto missing = client.Get("/admin");
  REQUIRE(missing);
  CHECK(missing->status == 404);
  for (const auto& method : {"POST", "PUT", "DELETE", "PATCH"}) {
    INFO(method);
    httplib::Request req;
    req.method = method;
    req.path = "/status";
    auto res = client.send(req);
    REQUIRE(res);
    CHECK(res->status == 405);
    CHECK(res->get_header_value("Allow") == "GET, HEAD");
  }
}

TEST_CASE("a status the node cannot give is answered 503 with the reason", "[actors][monitor]") {
  MonitorHttpViews v = fixed_views();
  v.status_json = []() -> std::expected<std::string, std::string> { return std::unexpected(std::string("the router did not answer")); };
  MonitorHttp http({"127.0.0.1:0"}, std::move(v));
  const auto bound = http.start();
  REQUIRE(bound);
  const auto [host, port] = host_port(*bound);
  httplib::Client client(host, port);
  auto res = client.Get("/status");
  REQUIRE(res);
  CHECK(res->status == 503);
  CHECK_THAT(res->body, Catch::Contains("the router did not answer"));
}

TEST_CASE("an oversized request header is refused and the endpoint goes on serving", "[actors][monitor]") {
  std::atomic<int> calls{0};
  MonitorHttp http({"127.0.0.1:0"}, fixed_views(&calls));
  const auto bound = http.start();
  REQUIRE(bound);
  const auto [host, port] = host_port(*bound);
  httplib::Client client(host, port);
  auto refused = client.Get("/status", {{"X-Filler", std::string(16 * 1024, 'a')}});
  // Refused outright (400) or cut off: either way the view was never asked.
  if (refused) CHECK(refused->status == 400);
  CHECK(calls == 0);
  auto fine = client.Get("/status");
  REQUIRE(fine);
  CHECK(fine->status == 200);
  CHECK(calls == 1);
}

TEST_CASE("idle connections beyond the workers wait in the kernel, not in the endpoint, and a request behind them is served",
          "[actors][monitor]") {
  MonitorHttpOptions o{"127.0.0.1:0"};
  o.threads = 2;
  o.timeout = std::chrono::seconds(2);  // an idle connection holds a worker for the keep-alive wait, 1 s
  MonitorHttp http(o, fixed_views());
  const auto bound = http.start();
  REQUIRE(bound);
  const auto [host, port] = host_port(*bound);
  // Two at the workers, two queued, the rest in the kernel's backlog: none is read until its turn,
  // and each holds a worker for the keep-alive wait (1 s), so the last is served after about 4 s.
  std::vector<IdleConnection> idle;
  for (int i = 0; i < 8; ++i) idle.emplace_back(*bound);
  for (const auto& c : idle) REQUIRE(c.fd >= 0);
  // What the endpoint has accepted (this process's sockets on its port with a peer): the workers'
  // and the queue's, and the one the accepting thread holds while it waits for room. Counted by
  // socket (inode), not descriptor: the endpoint's watchdog holds a duplicate of each it serves.
  const auto accepted = [port = port] {
    std::set<ino_t> sockets;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
      const int fd = std::atoi(entry.path().filename().c_str());
      sockaddr_in local{}, peer{};
      socklen_t local_len = sizeof local, peer_len = sizeof peer;
      struct stat st{};
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) == 0 && local.sin_family == AF_INET &&
          ntohs(local.sin_port) == port && ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) == 0 &&
          ::fstat(fd, &st) == 0)
        sockets.insert(st.st_ino);
    }
    return sockets.size();
  };
  // The accepting thread takes what it can at once, up to the bound: awaited, then it is the bound
  // exactly (a queue without one takes all 8 in a burst, so this sees more, not the bound).
  const size_t limit = 2 * o.threads + 1;
  size_t taken = 0;
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
       (taken = accepted()) < limit && std::chrono::steady_clock::now() < until;)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(taken == limit);
  httplib::Client client(host, port);
  client.set_connection_timeout(std::chrono::seconds(10));
  client.set_read_timeout(std::chrono::seconds(10));
  auto res = client.Get("/metrics");
  REQUIRE(res);
  CHECK(res->status == 200);
}

TEST_CASE("an address the endpoint cannot listen on is an error naming it", "[actors][monitor]") {
  MonitorHttp first({"127.0.0.1:0"}, fixed_views());
  const auto bound = first.start();
  REQUIRE(bound);
  MonitorHttp second({*bound}, fixed_views());
  const auto clash = second.start();
  REQUIRE_FALSE(clash);
  CHECK_THAT(clash.error(), Catch::Contains(*bound));
  MonitorHttp nonsense({"nowhere"}, fixed_views());
  const auto bad = nonsense.start();
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error(), Catch::Contains("nowhere"));
}

TEST_CASE("stopping the endpoint cuts off a client in the middle of its request", "[actors][monitor]") {
  MonitorHttpOptions o{"127.0.0.1:0"};
  o.timeout = std::chrono::seconds(600);  // past the test's ctest timeout (300 s): only the cut ends it
  MonitorHttp http(o, fixed_views());
  const auto bound = http.start();
  REQUIRE(bound);
  IdleConnection slow(*bound);
  REQUIRE(slow.fd >= 0);
  const std::string part = "GET /metrics HTTP/1.1\r\nHost: x\r\n";  // and never the blank line
  REQUIRE(::send(slow.fd, part.data(), part.size(), 0) == static_cast<ssize_t>(part.size()));
  http.stop();  // returns: the connection was shut down under the worker reading it
  char byte = 0;
  CHECK(::recv(slow.fd, &byte, 1, 0) <= 0);  // the server's end is gone (closed or reset)
}

TEST_CASE("clients that never finish their requests are cut off at the deadline, every one, and the request behind "
          "them is served",
          "[actors][monitor]") {
  // Two workers, and a read timeout past the test's own timeout: a client that sends part of a
  // request and then a byte now and then (here: nothing more) held a worker until the timeout of
  // each read; only the deadline frees it. Both workers are held so: the watchdog names each
  // connection by the socket the accept just made and holds a duplicate of it, which is a socket on
  // the port too; the first one's duplicate, taken for a new connection, left every later one
  // unnamed and never cut off, so the request behind them waited for the read timeout.
  MonitorHttpOptions o{"127.0.0.1:0"};
  o.threads = 2;
  o.timeout = std::chrono::seconds(600);
  o.deadline = std::chrono::milliseconds(500);
  MonitorHttp http(o, fixed_views());
  const auto bound = http.start();
  REQUIRE(bound);
  const std::string part = "GET /metrics HTTP/1.1\r\nHost: x\r\n";  // and never the blank line
  std::vector<IdleConnection> slow;
  for (int i = 0; i < 2; ++i) {
    slow.emplace_back(*bound);
    REQUIRE(slow.back().fd >= 0);
    REQUIRE(::send(slow.back().fd, part.data(), part.size(), 0) == static_cast<ssize_t>(part.size()));
  }
  const auto [host, port] = host_port(*bound);
  httplib::Client client(host, port);
  client.set_connection_timeout(std::chrono::seconds(10));
  client.set_read_timeout(std::chrono::seconds(10));
  auto res = client.Get("/metrics");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->get_header_value("Connection") == "close");  // one request per connection
  for (const auto& c : slow) {
    timeval tv{10, 0};
    ::setsockopt(c.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char byte = 0;
    errno = 0;
    CHECK(::recv(c.fd, &byte, 1, 0) <= 0);  // cut off: closed or reset, not timed out here (errno)
    CHECK(errno != EAGAIN);
  }
}

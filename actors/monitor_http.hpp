#pragma once
// The monitor's HTTP endpoint ([monitor] http): read-only views of one node for people and for
// scrapers, served by cpp-httplib on threads of its own.
//
//   GET /metrics   the node's metrics registry, Prometheus text exposition format 0.0.4
//   GET /status    the status document as JSON: the same bytes as `tepdist status --json` asked of
//                  this node (elastic/status.hpp)
//   GET /          the dashboard: one self-contained page that polls /status (no asset from
//                  anywhere else)
//
// Nothing on it changes the cluster: only GET (and HEAD) are answered, other methods get 405. It is
// bounded whoever connects: a fixed pool of worker threads, a short read and write timeout, request
// lines and headers of at most 8 KiB each (cpp-httplib's limits, 400 beyond), no request bodies,
// and while every worker is busy new connections wait in the kernel's listen backlog instead of in
// memory here. One request per connection, and a connection is cut off `deadline` after a worker
// began serving it: the read and write timeouts count per read and per write, so without it a client
// sending (or reading) one byte within each timeout held a worker for hours. It needs no secret,
// so it listens on loopback unless the operator names another address.

#include <chrono>
#include <cstddef>
#include <expected>
#include <functional>
#include <memory>
#include <string>

namespace tepdist::actors {

struct MonitorHttpOptions {
  std::string listen = "127.0.0.1:0";  ///< host:port, host an IP address; port 0: any free one
  size_t threads = 4;                   ///< connections served at once
  std::chrono::milliseconds timeout{5000};  ///< per read and per write of one connection
  /// A connection's whole life, its one request read and answered (give or take a tenth of it).
  std::chrono::milliseconds deadline{10000};
};

/// What the endpoint shows. Each is called on a server thread, at most `threads` at a time.
struct MonitorHttpViews {
  std::function<std::string()> metrics;
  /// The status document as JSON, or why there is none (answered 503 with the reason).
  std::function<std::expected<std::string, std::string>()> status_json;
};

class MonitorHttp {
 public:
  MonitorHttp(MonitorHttpOptions options, MonitorHttpViews views);
  ~MonitorHttp();  ///< stops serving and joins its threads
  MonitorHttp(const MonitorHttp&) = delete;
  MonitorHttp& operator=(const MonitorHttp&) = delete;

  /// Binds and starts serving; the bound address (host:port), or why not, naming the address.
  std::expected<std::string, std::string> start();
  void stop();

  /// The dashboard page (served at /).
  static const std::string& dashboard_html();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tepdist::actors

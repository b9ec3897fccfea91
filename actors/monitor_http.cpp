#include "actors/monitor_http.hpp"

#include <fmt/format.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "actors/router.hpp"  // node_events()
#include "base/thread_name.hpp"

namespace tepdist::actors {
namespace {

/// An accepted connection: its descriptor, and its socket's inode (a descriptor number is reused
/// once closed; the inode tells one connection from the next on it).
struct Accepted {
  int fd;
  ino_t inode;
  auto operator<=>(const Accepted&) const = default;
};

ino_t inode_of(int fd) {
  struct stat st{};
  return ::fstat(fd, &st) == 0 ? st.st_ino : 0;
}

/// This process's accepted connections on local TCP port `port`: sockets bound to it that have a
/// peer (the listening socket has none; a client of the port here has another local port).
std::vector<Accepted> accepted_on(int port) {
  std::vector<Accepted> fds;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    sockaddr_storage local{}, peer{};
    socklen_t local_len = sizeof local, peer_len = sizeof peer;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) continue;
    int local_port = -1;
    if (local.ss_family == AF_INET) local_port = ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
    else if (local.ss_family == AF_INET6) local_port = ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port);
    if (local_port != port) continue;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) == 0) fds.push_back({fd, inode_of(fd)});
  }
  return fds;
}

/// The connections the pool has taken, each with when a worker began serving it: what the
/// deadline's watchdog cuts off. httplib hands the pool a closure, not the socket, so the pool
/// names the socket itself as it takes it: the accepting thread calls enqueue() right after each
/// accept(), so the one accepted connection on the port that is not yet here is the new one. Each
/// is held through a duplicate of its descriptor, so the watchdog shuts down that very socket
/// even when the worker has closed its own descriptor and the number went to another.
class Connections {
 public:
  using Clock = std::chrono::steady_clock;

  /// The connection just accepted on `port` (none found: {-1, 0}, never cut off).
  Accepted take(int port) {
    std::lock_guard lock(mutex_);
    Accepted found{-1, 0};
    // By socket, not descriptor: the duplicates held here are sockets on the port with a peer too.
    const auto known = [&](const Accepted& c) {
      return std::ranges::any_of(open_, [&](const auto& entry) { return entry.first.inode == c.inode; });
    };
    for (const auto& c : accepted_on(port))
      if (!known(c)) {
        if (found.fd >= 0) return {-1, 0};  // two unknown: cannot tell which is new
        found = c;
      }
    if (found.fd < 0) return found;
    const int held = ::fcntl(found.fd, F_DUPFD_CLOEXEC, 0);
    if (held < 0) return {-1, 0};
    open_.emplace(found, Open{held, std::nullopt});
    return found;
  }
  void serving(const Accepted& c) {
    std::lock_guard lock(mutex_);
    if (auto it = open_.find(c); it != open_.end()) it->second.since = Clock::now();
  }
  void done(const Accepted& c) {
    std::lock_guard lock(mutex_);
    if (auto it = open_.find(c); it != open_.end()) {
      ::close(it->second.held);
      open_.erase(it);
    }
  }
  bool empty() const {
    std::lock_guard lock(mutex_);
    return open_.empty();
  }
  /// Shuts down every connection served for `deadline` or longer (its worker then closes it).
  void cut_overdue(std::chrono::milliseconds deadline) const {
    std::lock_guard lock(mutex_);
    const auto now = Clock::now();
    for (const auto& [c, o] : open_)
      if (o.since && now - *o.since >= deadline) ::shutdown(o.held, SHUT_RDWR);
  }

 private:
  struct Open {
    int held;  // a duplicate of the connection's descriptor, closed with done()
    std::optional<Clock::time_point> since;
  };
  mutable std::mutex mutex_;
  std::map<Accepted, Open> open_;
};

/// cpp-httplib's task queue with a bound: at most `workers` connections served at once and as many
/// waiting; beyond that the accepting thread waits, so further connections wait in the kernel's
/// listen backlog (and are refused once it is full) instead of piling up here. (httplib's own pool
/// queues every accepted connection without limit.) Each connection is registered in
/// `connections` from its accept until its worker closed it.
class BoundedPool final : public httplib::TaskQueue {
 public:
  BoundedPool(size_t workers, Connections& connections, int port)
      : capacity_(workers), connections_(connections), port_(port) {
    for (size_t i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
  }

  void enqueue(std::function<void()> fn) override {
    auto serve = [fn = std::move(fn), &connections = connections_, c = connections_.take(port_)] {
      connections.serving(c);
      fn();  // httplib closes the socket before it returns
      connections.done(c);
    };
    std::unique_lock lock(mutex_);
    space_.wait(lock, [&] { return jobs_.size() < capacity_ || shutdown_; });
    if (shutdown_) {
      lock.unlock();
      serve();  // the connection is the job's to close: served (or timed out) here, never leaked
      return;
    }
    jobs_.push_back(std::move(serve));
    ready_.notify_one();
  }

  void shutdown() override {
    {
      std::lock_guard lock(mutex_);
      shutdown_ = true;
    }
    ready_.notify_all();
    space_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [&] { return !jobs_.empty() || shutdown_; });
        if (jobs_.empty()) return;  // shut down, and nothing left to serve
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      space_.notify_one();
      fn();
    }
  }

  const size_t capacity_;
  Connections& connections_;
  const int port_;
  std::mutex mutex_;
  std::condition_variable ready_, space_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  bool shutdown_ = false;
};

/// "host:port" or "[v6]:port" into host and port; nullopt if it is neither.
std::optional<std::pair<std::string, int>> split_address(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) return std::nullopt;
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = -1;
  try {
    size_t used = 0;
    port = std::stoi(text.substr(colon + 1), &used);
    if (used != text.size() - colon - 1) return std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (port < 0 || port > 65535) return std::nullopt;
  return std::pair{host, port};
}

/// A JSON string literal of `text`.
std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (const unsigned char ch : text) {
    if (ch == '"' || ch == '\\') out += fmt::format("\\{}", static_cast<char>(ch));
    else if (ch < 0x20) out += fmt::format("\\u{:04x}", ch);
    else out += static_cast<char>(ch);
  }
  return out + "\"";
}

void common_headers(httplib::Response& res) {
  res.set_header("Cache-Control", "no-store");
  res.set_header("X-Content-Type-Options", "nosniff");
}

}  // namespace

struct MonitorHttp::Impl {
  MonitorHttpOptions options;
  MonitorHttpViews views;
  httplib::Server server;
  std::thread thread;
  int port = 0;                       // bound
  std::atomic<bool> ended{false};     // listen_after_bind returned
  std::atomic<bool> stopping{false};  // stop() was called
  Connections connections;            // accepted and not yet closed
  std::thread watchdog;
  std::mutex watch_mutex;
  std::condition_variable watch_stop;

  /// Cuts off (shuts down, for its worker to close) every connection served for the deadline or
  /// longer, within a tenth of the deadline.
  void watch() {
    const auto every = std::clamp<std::chrono::milliseconds>(options.deadline / 10, std::chrono::milliseconds(20),
                                                             std::chrono::milliseconds(1000));
    std::unique_lock lock(watch_mutex);
    while (!watch_stop.wait_for(lock, every, [&] { return stopping.load(); })) {
      if (!connections.empty()) connections.cut_overdue(options.deadline);
    }
  }
};

MonitorHttp::MonitorHttp(MonitorHttpOptions options, MonitorHttpViews views) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->views = std::move(views);
}

MonitorHttp::~MonitorHttp() { stop(); }

std::expected<std::string, std::string> MonitorHttp::start() {
  auto& i = *impl_;
  const auto address = split_address(i.options.listen);
  if (!address) return std::unexpected(fmt::format("monitor.http \"{}\" is not host:port", i.options.listen));
  auto& server = i.server;
  const size_t threads = std::max<size_t>(1, i.options.threads);
  server.new_task_queue = [threads, &i] { return new BoundedPool(threads, i.connections, i.port); };
  server.set_read_timeout(i.options.timeout);
  server.set_write_timeout(i.options.timeout);
  // A connection waits a second at most for its request, and serves one: the deadline is then the
  // request's (a dashboard polls every two seconds, a scraper less often; a connection each costs
  // them a loopback handshake).
  server.set_keep_alive_timeout(std::clamp<time_t>(
      std::chrono::duration_cast<std::chrono::seconds>(i.options.timeout).count(), 0, 1));
  server.set_keep_alive_max_count(1);
  server.set_payload_max_length(0);  // no request has a body here
  // SO_REUSEADDR (a restarted node gets its port back), not httplib's SO_REUSEPORT, with which a
  // second node given the same port would bind it too and take half of its requests.
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  // Read-only: what is not GET or HEAD changes nothing and is told so.
  server.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "GET" || req.method == "HEAD") return httplib::Server::HandlerResponse::Unhandled;
    common_headers(res);
    res.status = 405;
    res.set_header("Allow", "GET, HEAD");
    res.set_header("Connection", "close");  // a body it sent is not read: the connection ends here
    res.set_content(fmt::format("{} is not served here: the endpoint is read-only\n", req.method), "text/plain");
    return httplib::Server::HandlerResponse::Handled;
  });
  server.Get("/metrics", [&i](const httplib::Request&, httplib::Response& res) {
    common_headers(res);
    res.set_content(i.views.metrics ? i.views.metrics() : std::string(), "text/plain; version=0.0.4; charset=utf-8");
  });
  server.Get("/status", [&i](const httplib::Request&, httplib::Response& res) {
    common_headers(res);
    auto doc = i.views.status_json ? i.views.status_json() : std::unexpected(std::string("no status view"));
    if (!doc) {
      res.status = 503;
      res.set_content(fmt::format("{{\"error\": {}}}\n", json_string(doc.error())), "application/json");
      return;
    }
    res.set_content(*doc, "application/json");
  });
  server.Get("/", [](const httplib::Request&, httplib::Response& res) {
    common_headers(res);
    res.set_header("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'");
    res.set_content(dashboard_html(), "text/html; charset=utf-8");
  });
  const auto& [host, port] = *address;
  int bound = port;
  if (port == 0) bound = server.bind_to_any_port(host);
  else if (!server.bind_to_port(host, port)) bound = -1;
  if (bound < 0) return std::unexpected(fmt::format("monitor.http: cannot listen on {}", i.options.listen));
  i.port = bound;
  i.thread = std::thread([&i] {
    base::name_this_thread("http");
    i.server.listen_after_bind();
    i.ended = true;
    if (!i.stopping)
      node_events().warn("monitor_http_stopped address={} reason=\"accepting connections failed\"", i.options.listen);
  });
  // stop() only reaches a server that runs: wait for it (a thread's start, not a peer).
  while (!server.is_running() && !i.ended) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  i.watchdog = std::thread([&i] {
    base::name_this_thread("http-watchdog");
    i.watch();
  });
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, bound) : fmt::format("{}:{}", host, bound);
}

void MonitorHttp::stop() {
  if (!impl_ || !impl_->thread.joinable()) return;
  auto& i = *impl_;
  {
    std::lock_guard lock(i.watch_mutex);
    i.stopping = true;
  }
  i.watch_stop.notify_all();
  if (i.watchdog.joinable()) i.watchdog.join();
  i.server.stop();
  // The workers finish the connections they serve before the server's thread ends, and a client
  // that trickles bytes could keep one forever: cut every accepted connection off (shut down, not
  // closed, so the worker that owns the descriptor closes it) until the thread is done.
  while (!i.ended) {
    for (const auto& c : accepted_on(i.port)) ::shutdown(c.fd, SHUT_RDWR);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  i.thread.join();
}

}  // namespace tepdist::actors

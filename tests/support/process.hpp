#pragma once
// A child process for multi-process tests: started with its stdout and stderr on a pipe, read line
// by line with a deadline (waiting on the pipe, never sleeping), and always killed and reaped.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace tepdist::test {

class Child {
 public:
  explicit Child(std::vector<std::string> argv) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      ::dup2(fds[1], STDERR_FILENO);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    out_ = fds[0];
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) ::close(out_);
  }

  pid_t pid() const { return pid_; }

  /// The next line containing `needle`, waiting at most `limit`; everything read is kept in all().
  /// Lines are consumed: a second call finds the next such line.
  std::optional<std::string> wait_for(const std::string& needle,
                                      std::chrono::milliseconds limit = std::chrono::seconds(20)) {
    return scan(needle, limit, scanned_);
  }

  /// The first line containing `needle` the child ever wrote, waiting for it if need be; consumes
  /// nothing.
  std::optional<std::string> seen(const std::string& needle, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
    size_t from = 0;
    return scan(needle, limit, from);
  }

  /// Waits until `done` holds for everything the child wrote so far, reading more as it comes;
  /// false if it still does not at the deadline (or the child closed its output).
  bool wait_until(const std::function<bool(const std::string&)>& done,
                  std::chrono::milliseconds limit = std::chrono::seconds(20)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (read_some(0)) {
    }
    while (!done(buffer_)) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !read_some(static_cast<int>(left.count()))) return false;
      while (read_some(0)) {
      }
    }
    return true;
  }

 private:
  std::optional<std::string> scan(const std::string& needle, std::chrono::milliseconds limit, size_t& from) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (true) {
      for (size_t end; (end = buffer_.find('\n', from)) != std::string::npos;) {
        std::string line = buffer_.substr(from, end - from);
        from = end + 1;
        if (line.find(needle) != std::string::npos) return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !read_some(static_cast<int>(left.count()))) return std::nullopt;
    }
  }

 public:
  /// Everything the child wrote so far (after draining what is ready now).
  const std::string& all() {
    while (read_some(0)) {
    }
    return buffer_;
  }

  void signal(int sig) { ::kill(pid_, sig); }

  /// Waits for the exit, reading what the child writes meanwhile (a child blocked on a full pipe
  /// would never exit); returns the exit status, or 128 + signal.
  int wait() {
    int status = 0;
    while (!eof_) {
      const pid_t done = ::waitpid(pid_, &status, WNOHANG);
      if (done == pid_ || (done < 0 && errno != EINTR)) {
        reaped_ = true;
        break;
      }
      // Wakes for output, or after 50 ms to look at the exit again (a grandchild may hold the pipe).
      while (read_some(50)) {
      }
    }
    // The child closed its output: nothing more to read while it ends.
    while (!reaped_ && ::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
    while (read_some(0)) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  bool read_some(int timeout_ms) {
    pollfd p{out_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return false;
    char chunk[4096];
    const ssize_t n = ::read(out_, chunk, sizeof chunk);
    if (n == 0) eof_ = true;
    if (n <= 0) return false;
    buffer_.append(chunk, static_cast<size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int out_ = -1;
  bool reaped_ = false;
  bool eof_ = false;  // the child (and all that share its output) closed the pipe
  std::string buffer_;
  size_t scanned_ = 0;
};

/// The value of key=... in a log line ("address=127.0.0.1:4000" -> "127.0.0.1:4000").
inline std::string field(const std::string& line, const std::string& key) {
  const auto at = line.find(key + "=");
  if (at == std::string::npos) return "";
  const auto start = at + key.size() + 1;
  return line.substr(start, line.find(' ', start) - start);
}

/// When a node logged `line`, from its "2024-05-01T12:00:00.123 ..." prefix (local time, as spdlog
/// writes it); nullopt for a line without one.
inline std::optional<std::chrono::system_clock::time_point> log_time(const std::string& line) {
  std::tm tm{};
  int ms = 0;
  if (std::sscanf(line.c_str(), "%d-%d-%dT%d:%d:%d.%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                  &tm.tm_sec, &ms) != 7)
    return std::nullopt;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  tm.tm_isdst = -1;
  return std::chrono::system_clock::from_time_t(std::mktime(&tm)) + std::chrono::milliseconds(ms);
}

}  // namespace tepdist::test

#pragma once
// Processes of a test, found by what their command lines mention (the test's own directory), and
// waited for on pidfds, not by sleeping.

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tepdist::test {

/// Pids of the processes whose command line mentions `needle` (the test's own directory), and
/// `also` if given.
inline std::vector<pid_t> processes_mentioning(const std::string& needle, const std::string& also = "") {
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(needle) != std::string::npos && cmdline.find(also) != std::string::npos &&
        std::stoi(name) != ::getpid())
      out.push_back(std::stoi(name));
  }
  return out;
}

/// Waits (on pidfds, not by sleeping) until every process mentioning needle has exited; false if
/// some are still there after `limit`. Kills the stragglers either way.
inline bool all_gone(const std::string& needle, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (pid_t pid : processes_mentioning(needle)) {
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (fd < 0) continue;  // already gone
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    const bool exited = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count()))) == 1;
    ::close(fd);
    if (!exited) {
      for (pid_t straggler : processes_mentioning(needle)) {
        std::ifstream in("/proc/" + std::to_string(straggler) + "/cmdline");
        std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
        fprintf(stderr, "still running after %lld ms: pid %d: %s\n", static_cast<long long>(limit.count()), straggler,
                cmdline.c_str());
        ::kill(straggler, SIGKILL);
      }
      return false;
    }
  }
  return true;
}

inline nlohmann::json read_json(const std::filesystem::path& file) {
  std::ifstream in(file);
  return nlohmann::json::parse(in);
}

/// A file's bytes ("" if it cannot be read).
inline std::string read_bytes(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// What a failed run's reader needs first, short enough to survive a truncated CI log: the last
/// `tail_lines` lines of its output, then the lines of the node logs under `logs` that tell of
/// trouble (a failure, a refusal, a suspicion or death, a restart), at most `log_lines`.
inline std::string failure_digest(const std::string& output, const std::filesystem::path& logs, size_t tail_lines = 12,
                                  size_t log_lines = 40) {
  size_t start = output.size();  // of the tail: just past the newline before its first line
  for (size_t n = 0; n <= tail_lines && start > 0; ++n) {
    const size_t newline = output.rfind('\n', start - 1);
    start = newline == std::string::npos ? 0 : newline;
  }
  std::string out = "the run's last lines:\n" + output.substr(start == 0 ? 0 : start + 1);
  static constexpr const char* trouble[] = {"job_failed",   "_refused",         "member_suspected", "member_dead",
                                            "shard_lost",   "trainer_restarted", "job_cancelled",    "hold_ends_job",
                                            "job_ended_without_done"};
  std::error_code ec;
  size_t kept = 0;
  for (const auto& entry : std::filesystem::directory_iterator(logs, ec)) {
    std::ifstream in(entry.path());
    for (std::string line; kept < log_lines && std::getline(in, line);)
      if (std::any_of(std::begin(trouble), std::end(trouble), [&](const char* t) { return line.find(t) != std::string::npos; })) {
        out.append("\n").append(entry.path().filename().string()).append(": ").append(line);
        ++kept;
      }
  }
  return out;
}

/// The float data of a .safetensors file written by tepdist (the header skipped).
inline std::vector<float> tensor_data(const std::filesystem::path& file) {
  const std::string bytes = read_bytes(file);
  if (bytes.size() < 8) return {};
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), sizeof header);
  if (header > bytes.size() - 8) return {};
  std::vector<float> out((bytes.size() - 8 - header) / sizeof(float));
  std::memcpy(out.data(), bytes.data() + 8 + header, out.size() * sizeof(float));
  return out;
}

}  // namespace tepdist::test

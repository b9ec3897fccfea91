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

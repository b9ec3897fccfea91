#pragma once
// A fresh directory under the system's temporary directory, removed with everything in it when
// the test ends.

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace tepdist::test {

struct TempDir {
  std::filesystem::path path;

  TempDir() {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("tepdist-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    // TEPDIST_KEEP_TEST_DIRS=1 keeps them (logs of a failure to read); the path is in the output.
    if (const char* keep = std::getenv("TEPDIST_KEEP_TEST_DIRS"); keep && *keep == '1') return;
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace tepdist::test

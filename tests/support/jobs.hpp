#pragma once
// The job file the `tepdist run` tests share: Fashion-MNIST, 6,144 training samples (32 global
// steps of 3 x 64 an epoch), 2,000 test samples, SGD, and membership knobs quick enough that a
// killed node is seen dead in about a second.

#include <fstream>
#include <string>

#include "tests/support/temp_dir.hpp"

namespace tepdist::test {

/// Writes dir/job.toml with `job_keys` (lines of the [job] table) and returns its path.
inline std::string fashion_subset_job(const TempDir& dir, const std::string& job_keys) {
  const auto path = dir.path / "job.toml";
  std::ofstream(path) << "[job]\n" << job_keys << R"(seed = 3
[data]
train_samples = 6144
test_samples = 2000
[optimizer]
lr = 0.05
momentum = 0.9
[membership]
probe_interval_ms = 200
probe_timeout_ms = 100
suspicion_mult = 2
)";
  return path.string();
}

}  // namespace tepdist::test

#pragma once
// `tepdist train`: single-process training from a job file.

#include <optional>
#include <string>
#include <vector>

namespace tepdist::cli {

struct TrainArgs {
  std::optional<std::string> config;   ///< job file; none: the built-in defaults
  std::optional<int> epochs;           ///< --epochs, overrides job.epochs
  std::optional<int> threads;          ///< --threads, overrides compute.threads
  std::vector<std::string> overrides;  ///< --set section.key=value
  std::string out = "out";             ///< --out
  bool resume = false;                 ///< --resume: continue from OUT/checkpoint
};

/// Runs the job; returns the process exit status (0 ok, 1 failure at run time, 2 bad input,
/// 130 interrupted).
int run_train(const TrainArgs& args);

}  // namespace tepdist::cli

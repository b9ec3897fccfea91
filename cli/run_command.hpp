#pragma once
// `tepdist run`: one job on a cluster. With [cluster] local_nodes = N it is the one-command cluster:
// it starts N `tepdist node` processes on loopback, waits for them to form a cluster, joins it as
// the submitter, trains, writes the results and stops every node it started (also on Ctrl-C and on
// errors; if the launcher itself is killed, each node gets SIGTERM from the kernel through
// PR_SET_PDEATHSIG and leaves). Without local nodes it joins the cluster at [cluster] seeds.

#include <optional>
#include <string>
#include <vector>

namespace tepdist::cli {

struct RunArgs {
  std::optional<std::string> config;  ///< none: the built-in configs/quickstart.toml
  std::optional<int> nodes;
  std::optional<std::string> mode;
  std::optional<int> epochs;
  std::vector<std::string> overrides;
  std::string out = "tepdist-run";
  std::string listen = "127.0.0.1:0";  ///< where the submitter listens: reachable from the nodes
  /// Submit to a running cluster and exit once the job trains; the job goes on without this
  /// process and rank 0 saves its result on its node ([cluster] results_dir).
  bool detach = false;
  /// Continue a job from the newest checkpoint in [elastic] checkpoint_dir (default OUT/checkpoints)
  /// that checks out, on any number of nodes (sync jobs).
  bool resume = false;
};

int run_run_command(const RunArgs& args);

}  // namespace tepdist::cli

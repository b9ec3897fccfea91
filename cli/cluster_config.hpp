#pragma once
// What the cluster subcommands (node, status) load first: the job file and the cluster secret.

#include <optional>
#include <string>
#include <vector>

#include "elastic/config.hpp"

namespace tepdist::cli {

struct ClusterConfig {
  elastic::JobConfig config;
  std::string secret;
};

/// Loads and validates the job file (none: the defaults) with its overrides, then the secret.
/// On failure, prints "tepdist COMMAND: why" to stderr and returns nothing (exit status 2).
std::optional<ClusterConfig> load_cluster_config(const std::string& command, const std::optional<std::string>& file,
                                                 const std::vector<std::string>& overrides);

}  // namespace tepdist::cli

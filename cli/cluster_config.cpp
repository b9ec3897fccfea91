#include "cli/cluster_config.hpp"

#include <fmt/core.h>

namespace tepdist::cli {

std::optional<ClusterConfig> load_cluster_config(const std::string& command, const std::optional<std::string>& file,
                                                 const std::vector<std::string>& overrides) {
  std::optional<std::filesystem::path> path;
  if (file) path = *file;
  auto config = elastic::load_config(path, overrides);
  if (!config) {
    fmt::print(stderr, "tepdist {}: {}\n", command, config.error().message);
    return std::nullopt;
  }
  auto secret = elastic::load_secret(config->cluster);
  if (!secret) {
    fmt::print(stderr, "tepdist {}: {}: {}\n", command, config->source, secret.error().message);
    return std::nullopt;
  }
  return ClusterConfig{std::move(*config), std::move(*secret)};
}

}  // namespace tepdist::cli

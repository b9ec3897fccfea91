#include "cli/node_command.hpp"

#include <fmt/core.h>

#include "actors/node.hpp"
#include "elastic/config.hpp"

namespace tepdist::cli {

int run_node_command(const NodeArgs& args) {
  std::optional<std::filesystem::path> file;
  if (args.config) file = *args.config;
  auto config = elastic::load_config(file, args.overrides);
  if (!config) {
    fmt::print(stderr, "tepdist node: {}\n", config.error().message);
    return 2;
  }
  auto secret = elastic::load_secret(config->cluster);
  if (!secret) {
    fmt::print(stderr, "tepdist node: {}: {}\n", config->source, secret.error().message);
    return 2;
  }
  actors::NodeOptions o;
  o.config = *config;
  o.secret = *secret;
  o.name = args.name;
  o.region = args.region.empty() ? "local" : args.region;
  o.listen = args.listen;
  o.join = args.join;
  o.ready_file = args.ready_file;
  return actors::run_node(o);
}

}  // namespace tepdist::cli

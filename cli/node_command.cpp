#include "cli/node_command.hpp"

#include "actors/node.hpp"
#include "cli/cluster_config.hpp"

namespace tepdist::cli {

int run_node_command(const NodeArgs& args) {
  auto loaded = load_cluster_config("node", args.config, args.overrides);
  if (!loaded) return 2;
  actors::NodeOptions o;
  o.config = std::move(loaded->config);
  o.secret = std::move(loaded->secret);
  o.name = args.name;
  // --region, else the node's [nodes.NAME] table (a node named by its address has none).
  o.region = !args.region.empty() ? args.region : o.config.node(args.name).region;
  o.listen = args.listen;
  o.join = args.join.empty() ? o.config.cluster.seeds : args.join;
  o.threads = o.config.compute.threads;
  // Emulation of a slower node: its [nodes.NAME] table, else [compute].
  const double own = o.config.node(args.name).slowdown;
  o.slowdown = own > 0 ? own : o.config.compute.slowdown;
  o.ready_file = args.ready_file;
  return actors::run_node(o);
}

}  // namespace tepdist::cli

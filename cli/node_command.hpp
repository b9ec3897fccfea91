#pragma once
// `tepdist node`: one node of a cluster, in this process, until SIGTERM or SIGINT.

#include <optional>
#include <string>
#include <vector>

namespace tepdist::cli {

struct NodeArgs {
  std::optional<std::string> config;
  std::vector<std::string> overrides;
  std::string listen = "127.0.0.1:0";
  std::vector<std::string> join;
  std::string name;
  std::string region;
  std::string ready_file;
};

int run_node_command(const NodeArgs& args);

}  // namespace tepdist::cli

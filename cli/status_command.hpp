#pragma once
// `tepdist status`: asks one member of a cluster for its view and prints it.

#include <optional>
#include <string>
#include <vector>

namespace tepdist::cli {

struct StatusArgs {
  std::optional<std::string> config;
  std::vector<std::string> overrides;
  std::string peer;
  bool json = false;
  /// Ask again every this many seconds until interrupted (0: once).
  double watch_s = 0;
};

int run_status_command(const StatusArgs& args);

}  // namespace tepdist::cli

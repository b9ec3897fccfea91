#pragma once
// `tepdist leave NODE`: asks a member of a running cluster to drain and leave gracefully, the way
// SIGTERM on its process does: the step under way ends, no other starts, then the node announces
// its leave and exits; a job goes on in a generation without it.

#include <optional>
#include <string>
#include <vector>

namespace tepdist::cli {

struct LeaveArgs {
  std::optional<std::string> config;
  std::vector<std::string> overrides;
  std::string peer;  ///< any member: its view says where NODE listens
  std::string node;
};

/// 0 once the node has drained and is leaving; 1 when it cannot (no such live member, refused,
/// no answer), with the reason on stderr; 2 for a bad config.
int run_leave_command(const LeaveArgs& args);

}  // namespace tepdist::cli

#pragma once
// The root of a node's actor tree: a one-for-one supervisor with snapshots.
//
// Each role actor is spawned from its last committed snapshot (an empty message on first start)
// and sends the supervisor a new snapshot at each commit point: (commit_atom, role name, snapshot).
// When a role fails (exits with a non-empty reason) the supervisor restarts it from the last
// snapshot: committed state comes back, uncommitted state is gone. More than max_restarts failures
// within window, counted over all roles, means restarting is not helping: the supervisor quits with
// an error naming the role and the count, and the node exits non-zero.

#include <caf/actor.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/message.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/timespan.hpp>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tepdist::actors {

/// How to (re)start one role: spawn it, linked to nothing, handing it the supervisor (to commit
/// snapshots to) and its last snapshot.
struct RoleSpec {
  std::string name;
  std::function<caf::actor(caf::local_actor& parent, const caf::actor& supervisor, const caf::message& snapshot)> spawn;
};

struct SupervisorOptions {
  int max_restarts = 3;                      ///< failures tolerated within window
  caf::timespan window = std::chrono::seconds(60);
};

struct SupervisorState {
  struct Child {
    RoleSpec spec;
    caf::actor actor;
    caf::message snapshot;
    int restarts = 0;
  };
  std::map<std::string, Child> children;  // by role name
  std::deque<caf::actor_clock::time_point> failures;
  static inline const char* name = "tepdist.supervisor";
};

/// Answers (get_atom, role_atom, name) with the role's current actor, and takes (commit_atom,
/// name, snapshot) from roles.
caf::behavior supervisor(caf::stateful_actor<SupervisorState>* self, std::vector<RoleSpec> roles,
                         SupervisorOptions options);

}  // namespace tepdist::actors

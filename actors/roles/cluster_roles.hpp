#pragma once
// The roles every node runs besides its parameter shard, as far as they go before training:
//
//   coordinator  tracks the members this node knows and answers who coordinates: the lowest live
//                id (the rule the control plane obeys; commands arrive with the distributed modes)
//   worker       owns a disjoint partition of the training samples: partition k of n, where k is
//                this node's rank among the sorted live ids
//   monitor      answers with the node's metrics in the Prometheus text format
//
// The router tells coordinator and worker of membership changes with (member_atom, ids). Both
// commit the view they act on, so a restart resumes with it instead of an empty one.

#include <caf/stateful_actor.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "actors/atoms.hpp"
#include "actors/supervisor.hpp"
#include "gossip/metrics/registry.hpp"

namespace tepdist::actors {

using member_atom = caf::atom_constant<caf::atom("member")>;
using partition_atom = caf::atom_constant<caf::atom("partition")>;

/// The coordinator of a set of live ids: the lowest.
std::string coordinator_of(const std::string& self, const std::vector<std::string>& others);

/// Sample range [begin, end) of `samples` owned by `self` among the live ids: rank k of n by id.
std::pair<int64_t, int64_t> partition_of(const std::string& self, const std::vector<std::string>& others,
                                         int64_t samples);

/// (member_atom, ids) updates the view; (get_atom) -> coordinator id.
RoleSpec coordinator_role(std::string self_id);
/// (member_atom, ids) updates the view; (partition_atom) -> (begin, end) of the training samples.
RoleSpec worker_role(std::string self_id, int64_t samples);
/// (get_atom) -> the metrics in the Prometheus text format. The registry must outlive the role.
RoleSpec monitor_role(const gossip::MetricsRegistry* metrics);

}  // namespace tepdist::actors

#pragma once
// The monitor role: answers with the node's metrics in the Prometheus text format. (The monitoring
// issue makes it collect and share training figures.)

#include "actors/atoms.hpp"
#include "actors/supervisor.hpp"
#include "gossip/metrics/registry.hpp"

namespace tepdist::actors {

/// (get_atom) -> the metrics in the Prometheus text format. The registry must outlive the role.
RoleSpec monitor_role(const gossip::MetricsRegistry* metrics);

}  // namespace tepdist::actors

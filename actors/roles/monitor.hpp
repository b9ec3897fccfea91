#pragma once
// The monitor role: every node's figures, on every node, by gossip. No central collector.
//
// Every `every` it builds this node's summary (from its router's status answer and its metrics
// registry: job, generation, step, samples/s, loss, rate, last test accuracy, bytes in and out,
// each tagged with when it was taken), puts it in its table of every node's latest summary, and
// sends the table to `fanout` random live members as a MetricsSnapshot frame (entries labelled
// node=ID; about a dozen entries a node). A table that comes in is merged node by node, the newer
// summary winning. So each node holds O(N) figures, sends O(N) per round to a few peers, and any
// node can show the whole cluster (HTTP /status, `tepdist status`). The table goes to the router
// after each change, for status answers; only members of the node's view are kept (a node
// forgotten by membership is dropped with it, so a hostile peer cannot grow the table with made-up
// ids), and a dead or left member's last summary stays, marked stale where it is shown.
//
// It also answers (get_atom) with the node's metrics in the Prometheus text format.

#include <chrono>
#include <string>

#include "actors/atoms.hpp"
#include "actors/supervisor.hpp"
#include "gossip/metrics/registry.hpp"
#include "gossip/transport/transport.hpp"
#include "elastic/status.hpp"
#include "gossip/wire/messages.hpp"

namespace tepdist::actors {

struct MonitorOptions {
  const gossip::MetricsRegistry* metrics = nullptr;  ///< must outlive the role
  gossip::Transport* transport = nullptr;            ///< null: the table is kept, nothing is sent
  std::string cluster_id, self_id;
  uint64_t incarnation = 0;
  std::chrono::milliseconds every{2000};
  size_t fanout = 2;
};

/// The role. The router registers it with (monitor_atom, actor) and sends it MetricsSnapshot frames
/// (wire_atom, peer, address, Message); it sends the router (monitor_atom, MetricsSnapshot) with
/// the table, and asks it (get_atom, status_atom) each round.
RoleSpec monitor_role(MonitorOptions options, caf::actor router);

}  // namespace tepdist::actors

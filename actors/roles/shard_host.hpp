#pragma once
// The shard host: the async mode's parameter-shard actor. For one job it holds every shard this
// node is primary or replica for (elastic/async_shards.hpp does the protocol), answers workers'
// pushes and pulls, and forwards applied updates to the replicas. It runs detached, on its own
// thread, so a push is answered while this node's trainer is busy with a forward pass; the router
// sends it every ShardUpdate frame while it is registered (shards_atom).
//
// It obeys the job's membership: pushes and pulls only from the job's workers, replications only
// from the shard's primary; anything else, and anything the core refuses, is logged and dropped.

#include <caf/actor.hpp>
#include <caf/local_actor.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "elastic/async_shards.hpp"
#include "elastic/placement.hpp"
#include "gossip/transport/transport.hpp"

namespace tepdist::actors {

/// What the trainer reads when the job ends (written on the host's thread).
struct ShardHostCounters {
  std::atomic<uint64_t> applied{0};   ///< updates applied by the shards this node is primary for
  std::atomic<uint64_t> staleness_sum{0};  ///< over the applied updates
};

struct ShardHostInit {
  gossip::Transport* transport = nullptr;
  std::string cluster_id, self_id, self_address;
  caf::actor trainer;  ///< answers to this node's own worker go there, not over the network
  uint64_t incarnation = 0;
  uint64_t job_id = 0;
  std::vector<std::string> workers, addresses;  ///< the job's, in rank order
  elastic::Placement placement;                 ///< holders of each shard, primary first
  /// The shards held here, by shard index (moved in).
  std::map<uint32_t, std::unique_ptr<elastic::ShardServer>> shards;
  std::shared_ptr<ShardHostCounters> counters;
};

/// Spawns the host for one job.
caf::actor spawn_shard_host(caf::local_actor& parent, std::shared_ptr<ShardHostInit> init);

}  // namespace tepdist::actors

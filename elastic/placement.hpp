#pragma once
// Where parameter shards live: rendezvous (highest-random-weight) hashing. Each shard ranks every
// live member by a hash of (shard, member id) and lives on the top r: the first is the primary,
// the rest replicas. The hash is fixed (not std::hash), so every node computes the same placement
// from the same member list, in any order. Adding a member moves only the shards it now wins
// (about 1/(N+1) of them); removing one moves only its own.
//
// One adjustment: when there are at least as many shards as members, a member that would be
// primary for none takes the primaryship of the shard where it ranks best among those whose
// primary holds more than one, so every member serves at least one shard.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gossip/wire/messages.hpp"

namespace tepdist::elastic {

/// The hash rendezvous ranks by; stable across builds and machines.
uint64_t rendezvous_weight(uint32_t shard, const std::string& member);

/// placement[s] lists shard s's holders, primary first; min(replicas, members) of them.
using Placement = std::vector<std::vector<std::string>>;

/// Rendezvous placement: shard s's primary is the member of highest rendezvous_weight(s, member),
/// its replicas the next heaviest, so a change of members moves only the shards it must. With
/// `regions` (aligned with `members`; empty: none known) naming more than one region, the replicas
/// are the heaviest member of each region not holding the shard yet, then the heaviest of the rest:
/// every shard is held in min(replicas, regions) regions, so a partition or the loss of one region
/// leaves a copy of every shard elsewhere. With shards >= members every member is primary of at
/// least one (a member without one takes the shard it weighs most on, from a primary with others).
Placement place_shards(uint32_t shards, std::span<const std::string> members, int replicas,
                       std::span<const std::string> regions = {});

/// Where an async job's shards go when a generation is installed, and where their state comes
/// from. Every generation places the shards afresh over its workers; every holder of the new
/// placement takes the shard's state from one source, named by the record (shard_sources: job
/// control picks the acker that reported the highest version of the shard; a holder still
/// fetching it reports nothing), so all holders start a generation from one state and any move of
/// a primary (the every-member-a-primary adjustment included) is a transfer of state. Any holder
/// that survives holds every update acknowledged as durable (it holds a prefix of its primary's
/// updates, and durable means on every holder); what it lacks was never acknowledged, and
/// workers send it again (AsyncWorker::retarget).
struct ShardPlan {
  Placement placement;
  /// Per shard: the member whose state the holders take; empty in the first generation, where
  /// every holder starts from the job's initial parameters.
  std::vector<std::string> sources;
  /// Shards none of whose holders survived, each with why ("shard 3 (held by a, b)").
  std::vector<std::string> lost;
};

/// The plan for `record`'s generation: its workers, its shard sources, and (to name the holders
/// of a lost shard) the generation before's workers.
ShardPlan plan_shards(const gossip::JobStart& record, uint32_t shards, int replicas);

}  // namespace tepdist::elastic

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

namespace tepdist::elastic {

/// The hash rendezvous ranks by; stable across builds and machines.
uint64_t rendezvous_weight(uint32_t shard, const std::string& member);

/// placement[s] lists shard s's holders, primary first; min(replicas, members) of them.
using Placement = std::vector<std::vector<std::string>>;

Placement place_shards(uint32_t shards, std::span<const std::string> members, int replicas);

}  // namespace tepdist::elastic

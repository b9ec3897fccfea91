#pragma once
// A small stateful role for the supervisor's tests: a vector of floats updated by pushes, and how
// it survives a crash: at each commit it hands the supervisor a snapshot, and a restart begins from
// the last one. Test code only: no node runs it (async jobs keep their parameters in a shard host,
// actors/roles/shard_host.hpp).

#include <caf/meta/type_name.hpp>
#include <caf/typed_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/replies_to.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "actors/atoms.hpp"
#include "actors/supervisor.hpp"

namespace tepdist::actors::test {

/// A shard's whole state: what a commit hands the supervisor and a restart starts from.
struct ShardSnapshot {
  uint32_t shard = 0;
  uint64_t version = 0;        ///< updates applied
  std::vector<float> values;
  friend bool operator==(const ShardSnapshot&, const ShardSnapshot&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ShardSnapshot& x) {
  return f(caf::meta::type_name("tepdist.test.shard_snapshot"), x.shard, x.version, x.values);
}

/// push: (base version, gradient, learning rate) -> new version; values -= lr * gradient.
/// commit: hands the supervisor a snapshot -> the committed version.
/// get: the current state.
using parameter_shard_actor =
    caf::typed_actor<caf::replies_to<push_atom, uint64_t, std::vector<float>, float>::with<uint64_t>,
                     caf::replies_to<commit_atom>::with<uint64_t>, caf::replies_to<get_atom>::with<ShardSnapshot>>;

struct ParameterShardState {
  ShardSnapshot shard;
  caf::actor supervisor;
  std::string role;
  static inline const char* name = "tepdist.test.parameter_shard";
};

parameter_shard_actor::behavior_type parameter_shard(parameter_shard_actor::stateful_pointer<ParameterShardState> self,
                                                     caf::actor supervisor, std::string role, ShardSnapshot start);

/// The supervisor's recipe for a parameter-shard role named `role`, starting (the first time)
/// from `initial`.
RoleSpec parameter_shard_role(std::string role, ShardSnapshot initial);

}  // namespace tepdist::actors::test

#include "tests/actors/snapshot_role.hpp"

#include <caf/actor_cast.hpp>
#include <caf/local_actor.hpp>
#include <caf/sec.hpp>
#include <caf/send.hpp>
#include <fmt/format.h>

namespace tepdist::actors::test {

parameter_shard_actor::behavior_type parameter_shard(parameter_shard_actor::stateful_pointer<ParameterShardState> self,
                                                     caf::actor supervisor, std::string role, ShardSnapshot start) {
  self->state.shard = std::move(start);
  self->state.supervisor = std::move(supervisor);
  self->state.role = std::move(role);
  return {
      [self](push_atom, uint64_t, const std::vector<float>& gradient, float lr) -> caf::result<uint64_t> {
        auto& s = self->state.shard;
        if (gradient.size() != s.values.size())
          return caf::make_error(caf::sec::invalid_argument,
                                 fmt::format("shard {} has {} values, the gradient {}", s.shard, s.values.size(),
                                             gradient.size()));
        for (size_t i = 0; i < gradient.size(); ++i) s.values[i] -= lr * gradient[i];
        return ++s.version;
      },
      [self](commit_atom) -> uint64_t {
        caf::anon_send(self->state.supervisor, commit_atom::value, self->state.role, caf::make_message(self->state.shard));
        return self->state.shard.version;
      },
      [self](get_atom) { return self->state.shard; },
  };
}

RoleSpec parameter_shard_role(std::string role, ShardSnapshot initial) {
  return {role, [role, initial](caf::local_actor& parent, const caf::actor& supervisor, const caf::message& snapshot) {
            const ShardSnapshot start =
                snapshot.match_elements<ShardSnapshot>() ? snapshot.get_as<ShardSnapshot>(0) : initial;
            return caf::actor_cast<caf::actor>(parent.spawn(parameter_shard, supervisor, role, start));
          }};
}

}  // namespace tepdist::actors::test

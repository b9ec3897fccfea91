#include "actors/roles/cluster_roles.hpp"

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/local_actor.hpp>
#include <caf/send.hpp>

#include <algorithm>

namespace tepdist::actors {
namespace {

struct ViewState {
  std::string self;
  std::vector<std::string> others;  // live ids besides self, as last told
  caf::actor supervisor;
  std::string role;
};

std::vector<std::string> view_from(const caf::message& snapshot) {
  return snapshot.match_elements<std::vector<std::string>>() ? snapshot.get_as<std::vector<std::string>>(0)
                                                             : std::vector<std::string>{};
}

/// Stores a new view and commits it: a restart resumes from the last view, not an empty one.
void take_view(caf::stateful_actor<ViewState>* self, std::vector<std::string> ids) {
  ids.erase(std::remove(ids.begin(), ids.end(), self->state.self), ids.end());
  self->state.others = std::move(ids);
  caf::anon_send(self->state.supervisor, commit_atom::value, self->state.role, caf::make_message(self->state.others));
}

}  // namespace

std::string coordinator_of(const std::string& self, const std::vector<std::string>& others) {
  std::string lowest = self;
  for (const auto& id : others) lowest = std::min(lowest, id);
  return lowest;
}

std::pair<int64_t, int64_t> partition_of(const std::string& self, const std::vector<std::string>& others,
                                         int64_t samples) {
  std::vector<std::string> ids = others;
  ids.push_back(self);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  const auto n = static_cast<int64_t>(ids.size());
  const auto k = static_cast<int64_t>(std::find(ids.begin(), ids.end(), self) - ids.begin());
  return {samples * k / n, samples * (k + 1) / n};
}

RoleSpec coordinator_role(std::string self_id) {
  return {"coordinator", [self_id](caf::local_actor& parent, const caf::actor& sup, const caf::message& snapshot) {
            return parent.spawn([self_id, sup, snapshot](caf::stateful_actor<ViewState>* self) -> caf::behavior {
              self->state = {self_id, view_from(snapshot), sup, "coordinator"};
              return {
                  [self](member_atom, std::vector<std::string> ids) { take_view(self, std::move(ids)); },
                  [self](get_atom) { return coordinator_of(self->state.self, self->state.others); },
              };
            });
          }};
}

RoleSpec worker_role(std::string self_id, int64_t samples) {
  return {"worker", [self_id, samples](caf::local_actor& parent, const caf::actor& sup, const caf::message& snapshot) {
            return parent.spawn([self_id, samples, sup, snapshot](caf::stateful_actor<ViewState>* self) -> caf::behavior {
              self->state = {self_id, view_from(snapshot), sup, "worker"};
              return {
                  [self](member_atom, std::vector<std::string> ids) { take_view(self, std::move(ids)); },
                  [self, samples](partition_atom) {
                    const auto [begin, end] = partition_of(self->state.self, self->state.others, samples);
                    return caf::make_message(begin, end);
                  },
              };
            });
          }};
}

RoleSpec monitor_role(const gossip::MetricsRegistry* metrics) {
  return {"monitor", [metrics](caf::local_actor& parent, const caf::actor&, const caf::message&) {
            return parent.spawn([metrics](caf::event_based_actor*) -> caf::behavior {
              return {[metrics](get_atom) { return metrics->render_prometheus(); }};
            });
          }};
}

}  // namespace tepdist::actors

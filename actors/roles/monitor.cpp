#include "actors/roles/monitor.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/local_actor.hpp>

namespace tepdist::actors {

RoleSpec monitor_role(const gossip::MetricsRegistry* metrics) {
  return {"monitor", [metrics](caf::local_actor& parent, const caf::actor&, const caf::message&) {
            return parent.spawn([metrics](caf::event_based_actor*) -> caf::behavior {
              return {[metrics](get_atom) { return metrics->render_prometheus(); }};
            });
          }};
}

}  // namespace tepdist::actors

#include "actors/supervisor.hpp"

#include <caf/actor_clock.hpp>
#include <caf/actor_system.hpp>
#include <caf/system_messages.hpp>
#include <caf/sec.hpp>
#include <fmt/format.h>

#include "actors/atoms.hpp"

namespace tepdist::actors {
namespace {

void start(caf::stateful_actor<SupervisorState>* self, SupervisorState::Child& child) {
  child.actor = child.spec.spawn(*self, caf::actor_cast<caf::actor>(self), child.snapshot);
  self->monitor(child.actor);
}

}  // namespace

/// The supervisor's children go when it goes: nothing else holds them (a detached role would
/// otherwise keep its thread, and the node's shutdown, waiting).
void stop_children(caf::stateful_actor<SupervisorState>* self, const caf::error& reason) {
  for (auto& [name, child] : self->state.children) {
    self->demonitor(child.actor);
    self->send_exit(child.actor, reason ? reason : caf::make_error(caf::exit_reason::user_shutdown));
  }
}

caf::behavior supervisor(caf::stateful_actor<SupervisorState>* self, std::vector<RoleSpec> roles,
                         SupervisorOptions options) {
  for (auto& spec : roles) {
    auto& child = self->state.children[spec.name];
    child.spec = std::move(spec);
    start(self, child);
  }
  self->set_exit_handler([self](caf::exit_msg& m) {
    stop_children(self, m.reason);
    self->quit(m.reason);
  });
  self->set_down_handler([self, options](const caf::down_msg& down) {
    for (auto& [name, child] : self->state.children) {
      if (down.source != child.actor.address()) continue;
      if (!down.reason) return;  // a clean exit is not a failure (the node is stopping)
      const auto now = self->clock().now();
      auto& failures = self->state.failures;
      failures.push_back(now);
      while (!failures.empty() && now - failures.front() > options.window) failures.pop_front();
      if (static_cast<int>(failures.size()) > options.max_restarts) {
        stop_children(self, caf::exit_reason::user_shutdown);
        self->quit(caf::make_error(
            caf::sec::runtime_error,
            fmt::format("role {} failed ({}): {} failures within {} s, more than the {} restarts allowed", name,
                        self->system().render(down.reason), failures.size(),
                        std::chrono::duration_cast<std::chrono::seconds>(options.window).count(),
                        options.max_restarts)));
        return;
      }
      ++child.restarts;
      start(self, child);
      return;
    }
  });
  return {
      [self](commit_atom, const std::string& role, const caf::message& snapshot) {
        auto it = self->state.children.find(role);
        if (it != self->state.children.end()) it->second.snapshot = snapshot;
      },
      [self](get_atom, role_atom, const std::string& role) -> caf::result<caf::actor> {
        auto it = self->state.children.find(role);
        if (it == self->state.children.end())
          return caf::make_error(caf::sec::runtime_error, "no role named " + role);
        return it->second.actor;
      },
  };
}

}  // namespace tepdist::actors

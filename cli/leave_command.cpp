#include "cli/leave_command.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>

#include "cli/cluster_client.hpp"
#include "actors/launcher.hpp"
#include "elastic/coordination.hpp"

namespace tepdist::cli {

int run_leave_command(const LeaveArgs& args) {
  const auto fail = [](const std::string& why) {
    fmt::print(stderr, "tepdist leave: {}\n", why);
    return 1;
  };
  auto loaded = actors::load_cluster_config("leave", args.config, args.overrides);
  if (!loaded) return 2;
  ClusterClient client(loaded->config, loaded->secret, "leave");
  if (auto ok = client.start(); !ok) return fail(ok.error());
  const auto view = client.ask_view(args.peer, std::chrono::seconds(5));
  if (!view) return fail(view.error());

  const auto it = std::find_if(view->members.begin(), view->members.end(),
                               [&](const gossip::Member& m) { return m.id == args.node; });
  if (it == view->members.end()) {
    std::string ids;
    for (const auto& m : view->members) ids += (ids.empty() ? "" : ", ") + m.id;
    return fail(fmt::format("{} knows no member named {} (members: {})", args.peer, args.node, ids));
  }
  if (!elastic::is_live(*it))
    return fail(fmt::format("{} is {} already, as {} sees it", args.node,
                            it->state == gossip::Member::State::dead ? "dead" : "gone", args.peer));

  using Kind = gossip::LeaveRequest::Kind;
  client.send(it->address, gossip::LeaveRequest{args.node, Kind::request});
  // The node answers at once (accepted or refused), then once drained; a drain is bounded by the
  // node (30 s), so a minute without the last answer means it is gone some other way.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool accepted = false;
  while (std::chrono::steady_clock::now() < deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    auto next = client.next(left);
    if (!next) return fail(accepted ? fmt::format("{} accepted, then {}", args.node, next.error()) : next.error());
    if (!*next) break;
    const auto* answer = std::get_if<gossip::LeaveRequest>(&(*next)->body);
    if (!answer || answer->node != args.node) continue;
    switch (answer->kind) {
      case Kind::refused: return fail(fmt::format("{} refused: {}", args.node, answer->detail));
      case Kind::accepted:
        accepted = true;
        fmt::print("{}: {}\n", args.node, answer->detail);
        break;
      case Kind::done: fmt::print("{}: {}; leaving\n", args.node, answer->detail); return 0;
      case Kind::request: break;
    }
  }
  return fail(fmt::format("{} did not say it had drained within 60 s", args.node));
}

}  // namespace tepdist::cli

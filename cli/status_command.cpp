#include "cli/status_command.hpp"

#include <fmt/core.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>

#include "cli/cluster_config.hpp"
#include "gossip/transport/transport.hpp"

namespace tepdist::cli {
namespace {

const char* state_name(gossip::Member::State s) {
  switch (s) {
    case gossip::Member::State::alive: return "alive";
    case gossip::Member::State::suspect: return "suspect";
    case gossip::Member::State::dead: return "dead";
    case gossip::Member::State::left: return "left";
  }
  return "?";
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

}  // namespace

int run_status_command(const StatusArgs& args) {
  auto loaded = load_cluster_config("status", args.config, args.overrides);
  if (!loaded) return 2;
  const elastic::JobConfig* config = &loaded->config;
  const std::string* secret = &loaded->secret;

  // A short-lived, authenticated client: it asks with an empty state sync, which members answer
  // with their whole view without taking the asker for a member.
  std::mutex mutex;
  std::condition_variable answered;
  std::optional<gossip::StateSync> view;
  std::optional<std::string> refused;
  gossip::TransportEvents events;
  events.on_message = [&](const std::string&, const std::string&, gossip::Message m) {
    if (auto* sync = std::get_if<gossip::StateSync>(&m.body); sync && sync->reply) {
      std::lock_guard lock(mutex);
      view = *sync;
      answered.notify_all();
    }
  };
  events.on_refused = [&](const std::string&, const std::string& reason) {
    std::lock_guard lock(mutex);
    refused = reason;
    answered.notify_all();
  };
  gossip::TransportOptions o;
  o.identity = {config->cluster.cluster_id, "status-" + std::to_string(::getpid()), "local", *secret, ""};
  gossip::Transport transport(o, events);
  if (auto bound = transport.start(); !bound) {
    fmt::print(stderr, "tepdist status: {}\n", bound.error());
    return 1;
  }
  transport.send(args.peer, {o.identity.node_id, 1, config->cluster.cluster_id, gossip::StateSync{{}, false, 0}});
  std::unique_lock lock(mutex);
  if (!answered.wait_for(lock, std::chrono::seconds(5), [&] { return view || refused; })) {
    fmt::print(stderr, "tepdist status: no answer from {} within 5 s (is a node listening there?)\n", args.peer);
    return 1;
  }
  if (refused) {
    fmt::print(stderr, "tepdist status: {} refused: {}\n", args.peer, *refused);
    return 1;
  }
  // Each member's shards of the running async job, if the answering node has one: "0p 3r" is
  // primary of shard 0 and replica of shard 3.
  const auto shards_of = [&](const std::string& id) {
    std::vector<std::pair<uint32_t, bool>> held;
    for (const auto& s : view->shards)
      for (size_t k = 0; k < s.holders.size(); ++k)
        if (s.holders[k] == id) held.emplace_back(s.shard, k == 0);
    return held;
  };
  if (args.json) {
    nlohmann::json out = {{"peer", args.peer}, {"epoch_unix_ms", view->epoch_unix_ms}, {"members", nlohmann::json::array()}};
    for (const auto& m : view->members) {
      nlohmann::json shards = nlohmann::json::array();
      for (const auto& [shard, primary] : shards_of(m.id)) shards.push_back({{"shard", shard}, {"primary", primary}});
      out["members"].push_back({{"id", m.id},
                                {"state", state_name(m.state)},
                                {"incarnation", m.incarnation},
                                {"address", m.address},
                                {"region", m.region},
                                {"roles", m.roles},
                                {"shards", shards}});
    }
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  fmt::print("{:<16} {:<8} {:>15} {:<22} {:<10} {:<40} {}\n", "ID", "STATE", "INCARNATION", "ADDRESS", "REGION", "ROLES",
             "SHARDS");
  for (const auto& m : view->members) {
    std::string shards;
    for (const auto& [shard, primary] : shards_of(m.id)) shards += fmt::format("{}{}{}", shards.empty() ? "" : " ", shard, primary ? "p" : "r");
    fmt::print("{:<16} {:<8} {:>15} {:<22} {:<10} {:<40} {}\n", m.id, state_name(m.state), m.incarnation, m.address,
               m.region, join(m.roles), shards.empty() ? "-" : shards);
  }
  fmt::print("{} members as {} sees them\n", view->members.size(), args.peer);
  return 0;
}

}  // namespace tepdist::cli

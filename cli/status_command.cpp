#include "cli/status_command.hpp"

#include <fmt/core.h>

#include <chrono>

#include "cli/cluster_client.hpp"
#include "cli/cluster_config.hpp"
#include "elastic/status.hpp"

namespace tepdist::cli {

int run_status_command(const StatusArgs& args) {
  auto loaded = load_cluster_config("status", args.config, args.overrides);
  if (!loaded) return 2;
  const elastic::JobConfig* config = &loaded->config;
  const std::string* secret = &loaded->secret;

  ClusterClient client(*config, *secret, "status");
  if (auto ok = client.start(); !ok) {
    fmt::print(stderr, "tepdist status: {}\n", ok.error());
    return 1;
  }
  auto view = client.ask_view(args.peer, std::chrono::seconds(5));
  if (!view) {
    fmt::print(stderr, "tepdist status: {}\n", view.error());
    return 1;
  }
  auto doc = elastic::status_document(args.peer, *view);
  // Async: each shard's version, from its primary (one short question each; one that does not
  // answer leaves its shards' versions unknown).
  for (const auto& m : elastic::shard_primaries(doc))
    if (auto answer = client.ask_view(m.address, std::chrono::seconds(2))) elastic::add_versions(doc, m.id, *answer);
  fmt::print("{}", args.json ? elastic::status_json(doc) + "\n" : elastic::status_table(doc));
  return 0;
}

}  // namespace tepdist::cli

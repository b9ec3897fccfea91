#include "cli/status_command.hpp"

#include <fmt/core.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "cli/cluster_client.hpp"
#include "actors/launcher.hpp"
#include "elastic/status.hpp"

namespace tepdist::cli {

int run_status_command(const StatusArgs& args) {
  auto loaded = actors::load_cluster_config("status", args.config, args.overrides);
  if (!loaded) return 2;
  const elastic::JobConfig* config = &loaded->config;
  const std::string* secret = &loaded->secret;

  ClusterClient client(*config, *secret, "status");
  if (auto ok = client.start(); !ok) {
    fmt::print(stderr, "tepdist status: {}\n", ok.error());
    return 1;
  }
  const bool clear = args.watch_s > 0 && !args.json && isatty(STDOUT_FILENO);
  for (;;) {
    auto view = client.ask_view(args.peer, std::chrono::seconds(5));
    if (!view) {
      fmt::print(stderr, "tepdist status: {}\n", view.error());
      if (args.watch_s <= 0) return 1;
    } else {
      auto doc = elastic::status_document(args.peer, *view);
      // Async: each shard's version, from its primary (one short question each; one that does not
      // answer leaves its shards' versions unknown).
      for (const auto& m : elastic::shard_primaries(doc))
        if (auto answer = client.ask_view(m.address, std::chrono::seconds(2))) elastic::add_versions(doc, m.id, *answer);
      if (clear) fmt::print("\x1b[H\x1b[2J");  // a terminal: the table in place
      fmt::print("{}", args.json ? elastic::status_json(doc) + "\n" : elastic::status_table(doc));
      std::fflush(stdout);
    }
    if (args.watch_s <= 0) return 0;
    // --watch: until interrupted (SIGINT ends the process; nothing here needs undoing).
    std::this_thread::sleep_for(std::chrono::duration<double>(args.watch_s));
  }
}

}  // namespace tepdist::cli

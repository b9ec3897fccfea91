#pragma once
// The gossip library's logger: stable event names with key=value fields, e.g.
//   peer_refused peer=127.0.0.1:40112 reason="wrong proof ..."

#include <spdlog/spdlog.h>

namespace tepdist::gossip {

/// The "gossip" logger (stderr), made on first use.
spdlog::logger& log();

}  // namespace tepdist::gossip

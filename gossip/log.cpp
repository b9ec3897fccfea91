#include "gossip/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace tepdist::gossip {

spdlog::logger& log() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    auto existing = spdlog::get("gossip");
    return existing ? existing : spdlog::stderr_color_mt("gossip");
  }();
  return *logger;
}

}  // namespace tepdist::gossip

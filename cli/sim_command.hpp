#pragma once
// `tepdist sim`: runs a scenario in the deterministic simulator.

#include <cstdint>
#include <optional>
#include <string>

namespace tepdist::cli {

struct SimArgs {
  std::string scenario;
  std::optional<uint64_t> seed;  ///< none: 1
  bool json = false;
};

/// 0 when every invariant held, 1 when one broke (the seed is printed to replay it), 2 on bad input.
int run_sim_command(const SimArgs& args);

}  // namespace tepdist::cli

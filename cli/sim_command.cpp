#include "cli/sim_command.hpp"

#include <fmt/core.h>

#include "sims/simulation.hpp"

namespace tepdist::cli {

int run_sim_command(const SimArgs& args) {
  auto scenario = sims::load_scenario(args.scenario);
  if (!scenario) {
    fmt::print(stderr, "tepdist sim: {}\n", scenario.error());
    return 2;
  }
  const auto report = sims::simulate(*scenario, args.seed.value_or(1));
  fmt::print("{}", sims::format_report(report, args.json));
  return report.broken.empty() ? 0 : 1;
}

}  // namespace tepdist::cli

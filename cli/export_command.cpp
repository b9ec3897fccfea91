#include "cli/export_command.hpp"

#include <fmt/core.h>

#include <filesystem>

#include "compute/io/checkpoint.hpp"
#include "elastic/checkpoints.hpp"

namespace tepdist::cli {

int run_export_command(const ExportArgs& args) {
  namespace fs = std::filesystem;
  fs::path part = args.checkpoint;
  std::error_code ec;
  if (fs::is_directory(part, ec)) {
    auto found = elastic::latest_checkpoint(part);
    if (!found) {
      fmt::print(stderr, "tepdist export: {}\n", found.error());
      return 1;
    }
    for (const auto& why : found->passed_over) fmt::print(stderr, "tepdist export: passed over: {}\n", why);
    part = found->part;
  }
  if (auto ok = compute::export_checkpoint_safetensors(part, args.out); !ok) {
    fmt::print(stderr, "tepdist export: {}\n", ok.error().message);
    return 1;
  }
  const auto summary = compute::check_checkpoint(part);
  fmt::print("exported {} (step {}{}) to {}\n", part.string(), summary ? summary->state.step : 0,
             summary && summary->state.job ? fmt::format(", job {}", summary->state.job->job_id) : std::string(),
             args.out);
  return 0;
}

}  // namespace tepdist::cli

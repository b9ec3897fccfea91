#include "elastic/checkpoints.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "compute/io/files.hpp"

namespace tepdist::elastic {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::string stem_of(int64_t step) { return fmt::format("step-{:08}", step); }

/// The manifests in `dir`, newest (highest step) first.
std::vector<fs::path> manifests_in(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const auto name = entry.path().filename().string();
    if (!name.starts_with("step-") || entry.path().extension() != ".json") continue;
    try {
      found.emplace_back(std::stoll(name.substr(5)), entry.path());
    } catch (const std::exception&) {
      // not one of ours
    }
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<fs::path> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

}  // namespace

bool CheckpointPolicy::due(int64_t step, double now_s) {
  if (last_s_ < 0) last_s_ = now_s;
  return (every_steps_ > 0 && step - last_step_ >= every_steps_) || (every_s_ > 0 && now_s - last_s_ >= every_s_);
}

std::expected<fs::path, std::string> write_checkpoint(const fs::path& dir, compute::Model& model,
                                                      compute::Optimizer& optimizer, const compute::TrainingState& state,
                                                      int64_t keep) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return std::unexpected(fmt::format("cannot create {}: {}", dir.string(), ec.message()));
  const std::string stem = stem_of(state.step);
  const fs::path part = dir / (stem + ".ckpt"), manifest = dir / (stem + ".json");
  if (auto ok = compute::save_checkpoint(part, model, optimizer, state); !ok) return std::unexpected(ok.error().message);
  // The manifest records the part as written (read back: what a resume will find).
  auto summary = compute::check_checkpoint(part);
  if (!summary) return std::unexpected(summary.error().message);
  json m = {{"format", "tepdist cluster checkpoint"},
            {"step", state.step},
            {"epoch", state.epoch},
            {"seed", state.seed},
            {"parts", json::array({{{"file", part.filename().string()},
                                    {"bytes", summary->bytes},
                                    {"crc32", fmt::format("{:08x}", summary->crc)}}})}};
  if (state.job)
    m["job"] = {{"job_id", state.job->job_id},     {"generation", state.job->generation},
                {"mode", state.job->mode},         {"position", state.job->position},
                {"samples", state.job->samples},   {"reference_batch", state.job->reference_batch}};
  if (auto ok = compute::write_file_atomically(manifest, m.dump(2) + "\n"); !ok) return std::unexpected(ok.error().message);
  // The oldest beyond `keep` go, manifest first (a part without one is not a checkpoint).
  const auto all = manifests_in(dir);
  for (size_t i = static_cast<size_t>(std::max<int64_t>(1, keep)); i < all.size(); ++i) {
    fs::remove(all[i], ec);
    fs::remove(fs::path(all[i]).replace_extension(".ckpt"), ec);
  }
  return manifest;
}

std::expected<FoundCheckpoint, std::string> latest_checkpoint(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::unexpected(fmt::format("{} is not a folder of checkpoints", dir.string()));
  FoundCheckpoint found;
  for (const auto& manifest : manifests_in(dir)) {
    auto text = compute::read_file(manifest);
    if (!text) {
      found.passed_over.push_back(text.error().message);
      continue;
    }
    try {
      const json m = json::parse(*text);
      const json& part = m.at("parts").at(0);
      const fs::path path = dir / part.at("file").get<std::string>();
      auto summary = compute::check_checkpoint(path);
      if (!summary) {
        found.passed_over.push_back(summary.error().message);
        continue;
      }
      if (summary->bytes != part.at("bytes").get<uint64_t>() ||
          fmt::format("{:08x}", summary->crc) != part.at("crc32").get<std::string>()) {
        found.passed_over.push_back(fmt::format("{}: does not match its manifest {} (size or CRC-32)", path.string(),
                                                manifest.string()));
        continue;
      }
      found.part = path;
      found.manifest = manifest;
      found.state = summary->state;
      return found;
    } catch (const json::exception& e) {
      found.passed_over.push_back(fmt::format("{}: malformed manifest: {}", manifest.string(), e.what()));
    }
  }
  std::string why;
  for (const auto& p : found.passed_over) why += "; " + p;
  return std::unexpected(fmt::format("{} holds no usable checkpoint{}", dir.string(), why));
}

}  // namespace tepdist::elastic

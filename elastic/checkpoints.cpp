#include "elastic/checkpoints.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <tuple>
#include <nlohmann/json.hpp>

#include "compute/io/files.hpp"

namespace tepdist::elastic {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::string stem_of(int64_t step) { return fmt::format("step-{:08}", step); }

/// The manifests in `dir`, the most recently written first (a folder may hold several jobs' or
/// runs' checkpoints: a step number alone does not say which is newer), then by step.
std::vector<fs::path> manifests_in(const fs::path& dir) {
  std::vector<std::tuple<int64_t, int64_t, fs::path>> found;  // written ns, step, path
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const auto name = entry.path().filename().string();
    if (!name.starts_with("step-") || entry.path().extension() != ".json") continue;
    int64_t written = 0, step = 0;
    if (auto text = compute::read_file(entry.path())) {
      const json m = json::parse(*text, nullptr, false);
      if (m.is_object() && m.value("written_unix_ns", json(0)).is_number_integer())
        written = m.value("written_unix_ns", int64_t{0});
      if (m.is_object() && m.value("step", json(0)).is_number_integer()) step = m.value("step", int64_t{0});
    }
    found.emplace_back(written, step, entry.path());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return std::tie(std::get<0>(a), std::get<1>(a)) > std::tie(std::get<0>(b), std::get<1>(b));
  });
  std::vector<fs::path> out;
  for (auto& f : found) out.push_back(std::move(std::get<2>(f)));
  return out;
}

int64_t unix_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

bool CheckpointPolicy::due(int64_t step, double now_s) {
  if (last_s_ < 0) last_s_ = now_s;
  // By steps: a multiple of every_steps passed since the last one, so files fall on the same
  // steps whoever writes them (a new rank 0, a resumed job).
  return (every_steps_ > 0 && step / every_steps_ > last_step_ / every_steps_) ||
         (every_s_ > 0 && now_s - last_s_ >= every_s_);
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
            {"written_unix_ns", unix_ns()},
            {"step", state.step},
            {"epoch", state.epoch},
            {"seed", state.seed},
            {"parts", json::array({{{"file", part.filename().string()},
                                    {"bytes", summary->bytes},
                                    {"crc32", fmt::format("{:08x}", summary->crc)}}})}};
  if (state.job)
    m["job"] = {{"job_id", state.job->job_id},     {"generation", state.job->generation},
                {"mode", state.job->mode},         {"position", state.job->position},
                {"samples", state.job->samples},   {"reference_batch", state.job->reference_batch},
                {"lr_factor", state.job->lr_factor}};
  if (auto ok = compute::write_file_atomically(manifest, m.dump(2) + "\n"); !ok) return std::unexpected(ok.error().message);
  // The oldest beyond `keep` go, never the one just written, manifest first (a part without one
  // is not a checkpoint; a manifest left without its part would be).
  const auto all = manifests_in(dir);
  size_t kept = 1;  // this one
  for (const auto& older : all) {
    if (older == manifest || kept++ < static_cast<size_t>(std::max<int64_t>(1, keep))) continue;
    if (fs::remove(older, ec) && !ec) fs::remove(fs::path(older).replace_extension(".ckpt"), ec);
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
      const auto file = part.at("file").get<std::string>();
      if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
        found.passed_over.push_back(fmt::format("{}: names a part outside its folder", manifest.string()));
        continue;
      }
      const fs::path path = dir / file;
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

// Cluster checkpoints on disk: the part, its manifest written last, the newest kept, and a damaged
// newest one passed over with the reason.

#include <catch2/catch.hpp>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <limits>

#include <fmt/format.h>
#include <zlib.h>

#include "compute/io/files.hpp"
#include "compute/presets.hpp"
#include "elastic/checkpoints.hpp"
#include "tests/support/temp_dir.hpp"

using namespace tepdist;
namespace fs = std::filesystem;
using tepdist::test::TempDir;

namespace {

compute::TrainingState at_step(int64_t step) {
  return {step, step / 10, 7, compute::TrainingState::Job{5, 2, "sync", static_cast<uint64_t>(step % 10) * 64,
                                                          static_cast<uint64_t>(step) * 64, 64}};
}

/// A small model and its optimiser: what a checkpoint saves.
struct Trained {
  std::unique_ptr<compute::Model> model = compute::make_mlp(8, 10);
  std::unique_ptr<compute::Optimizer> optimizer;
  Trained() {
    REQUIRE(model->build({1, 28, 28}, 1).has_value());
    optimizer = std::move(*compute::make_optimizer({}, model->parameters().size()));
  }
};

}  // namespace

TEST_CASE("checkpoints: the newest that checks out is found, older ones beyond keep are removed",
          "[elastic][checkpoints]") {
  TempDir dir;
  Trained t;
  auto& [model, optimizer] = t;
  const fs::path folder = dir.path / "checkpoints";
  for (int64_t step : {10, 20, 30, 40}) {
    model->parameters()[0] = static_cast<float>(step);  // tells the checkpoints apart
    const auto manifest = elastic::write_checkpoint(folder, *model, *optimizer, at_step(step), 3);
    REQUIRE(manifest.has_value());
    CHECK(manifest->filename() == fmt::format("step-{:08}.json", step));
  }
  // keep = 3: the one at step 10 is gone, part and manifest.
  CHECK_FALSE(fs::exists(folder / "step-00000010.json"));
  CHECK_FALSE(fs::exists(folder / "step-00000010.ckpt"));
  CHECK(fs::exists(folder / "step-00000020.ckpt"));

  auto found = elastic::latest_checkpoint(folder);
  REQUIRE(found.has_value());
  CHECK(found->part == folder / "step-00000040.ckpt");
  CHECK(found->state.step == 40);
  CHECK(found->state.job == at_step(40).job);
  CHECK(found->passed_over.empty());

  // The newest damaged (a byte flipped, the size unchanged): reported, and the one before used.
  {
    std::fstream f(folder / "step-00000040.ckpt", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  found = elastic::latest_checkpoint(folder);
  REQUIRE(found.has_value());
  CHECK(found->state.step == 30);
  REQUIRE(found->passed_over.size() == 1);
  CHECK_THAT(found->passed_over[0], Catch::Contains("step-00000040.ckpt") && Catch::Contains("checksum"));

  // A part whose manifest says otherwise (rewritten after the manifest) is not taken either.
  REQUIRE(compute::save_checkpoint(folder / "step-00000030.ckpt", *model, *optimizer, at_step(31)).has_value());
  found = elastic::latest_checkpoint(folder);
  REQUIRE(found.has_value());
  CHECK(found->state.step == 20);
  CHECK_THAT(found->passed_over.back(), Catch::Contains("does not match its manifest"));
}

TEST_CASE("checkpoints: a new run into a folder of an older run's later steps keeps what it writes, and is the newest",
          "[elastic][checkpoints]") {
  TempDir dir;
  Trained t;
  auto& [model, optimizer] = t;
  const fs::path folder = dir.path / "checkpoints";
  for (int64_t step : {90, 95, 100}) REQUIRE(elastic::write_checkpoint(folder, *model, *optimizer, at_step(step), 3));
  auto fresh = at_step(5);
  fresh.job->job_id = 6;
  REQUIRE(elastic::write_checkpoint(folder, *model, *optimizer, fresh, 3));
  CHECK(fs::exists(folder / "step-00000005.json"));
  CHECK_FALSE(fs::exists(folder / "step-00000090.json"));  // the oldest written goes, not the lowest step
  const auto found = elastic::latest_checkpoint(folder);
  REQUIRE(found.has_value());
  CHECK(found->state.step == 5);
  CHECK(found->state.job->job_id == 6);
}

TEST_CASE("checkpoints: a diverged state is not written, and one an older build wrote is passed over",
          "[elastic][checkpoints]") {
  TempDir dir;
  Trained t;
  auto& [model, optimizer] = t;
  const fs::path folder = dir.path / "checkpoints";
  model->parameters()[0] = 1234.5f;  // found again in the file below
  REQUIRE(elastic::write_checkpoint(folder, *model, *optimizer, at_step(10), 3));
  // A parameter that is not finite: refused, naming it; the one at step 10 stays the newest.
  const auto& second = model->named_parameters().at(1);
  auto& bad = model->parameters()[static_cast<size_t>(second.offset) + 3];
  const float kept = bad;
  bad = std::numeric_limits<float>::quiet_NaN();
  const auto refused = elastic::write_checkpoint(folder, *model, *optimizer, at_step(20), 3);
  REQUIRE_FALSE(refused);
  CHECK_THAT(refused.error(), Catch::Contains("step-00000020.ckpt") && Catch::Contains("not written") &&
                                  Catch::Contains(fmt::format("parameter of {}, element 3, is nan", second.name)));
  CHECK_FALSE(fs::exists(folder / "step-00000020.ckpt"));
  CHECK_FALSE(fs::exists(folder / "step-00000020.json"));
  bad = kept;
  // An optimiser buffer that is not finite, the same.
  auto buffers = optimizer->state();
  REQUIRE_FALSE(buffers.empty());
  buffers[0].second[0] = std::numeric_limits<float>::infinity();
  const auto refused_optimizer = elastic::write_checkpoint(folder, *model, *optimizer, at_step(20), 3);
  REQUIRE_FALSE(refused_optimizer);
  CHECK_THAT(refused_optimizer.error(), Catch::Contains("optimizer " + buffers[0].first) && Catch::Contains("inf"));
  buffers[0].second[0] = 0;
  // A file with a NaN in it and a right CRC (as a build before this check wrote it): a newer one
  // than step 10, passed over for it, saying why.
  REQUIRE(elastic::write_checkpoint(folder, *model, *optimizer, at_step(30), 3));
  {
    auto bytes = *compute::read_file(folder / "step-00000030.ckpt");
    const float marker = 1234.5f, nan = std::numeric_limits<float>::quiet_NaN();
    const auto at = bytes.find(std::string_view(reinterpret_cast<const char*>(&marker), sizeof marker));
    REQUIRE(at != std::string::npos);
    std::memcpy(bytes.data() + at, &nan, sizeof nan);
    const auto crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size() - sizeof(uint32_t))));
    std::memcpy(bytes.data() + bytes.size() - sizeof crc, &crc, sizeof crc);
    REQUIRE(compute::write_file_atomically(folder / "step-00000030.ckpt", bytes));
  }
  const auto found = elastic::latest_checkpoint(folder);
  REQUIRE(found.has_value());
  CHECK(found->state.step == 10);
  REQUIRE(found->passed_over.size() == 1);
  CHECK_THAT(found->passed_over[0], Catch::Contains("step-00000030.ckpt") && Catch::Contains("not finite"));
}

TEST_CASE("checkpoints: a folder with none, or no folder, is an error naming it", "[elastic][checkpoints]") {
  TempDir dir;
  const auto missing = elastic::latest_checkpoint(dir.path / "nowhere");
  REQUIRE_FALSE(missing.has_value());
  CHECK_THAT(missing.error(), Catch::Contains("nowhere") && Catch::Contains("not a folder"));
  fs::create_directories(dir.path / "empty");
  const auto empty = elastic::latest_checkpoint(dir.path / "empty");
  REQUIRE_FALSE(empty.has_value());
  CHECK_THAT(empty.error(), Catch::Contains("empty") && Catch::Contains("no usable checkpoint"));
}

TEST_CASE("checkpoints: due every N steps, every T seconds, or never", "[elastic][checkpoints]") {
  elastic::CheckpointPolicy never(0, 0);
  CHECK_FALSE(never.enabled());
  CHECK_FALSE(never.due(1000, 1e6));
  elastic::CheckpointPolicy steps(8, 0);
  CHECK_FALSE(steps.due(7, 0));
  CHECK(steps.due(8, 0));
  steps.taken(8, 0);
  CHECK_FALSE(steps.due(15, 100));
  CHECK(steps.due(16, 100));
  elastic::CheckpointPolicy time(0, 30);
  CHECK_FALSE(time.due(1, 100));  // the first call starts its clock
  CHECK_FALSE(time.due(2, 129));
  CHECK(time.due(3, 130));
}

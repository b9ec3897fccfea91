#pragma once
// Cluster checkpoints: what a job leaves on disk so that its model outlives it, and (next) so that
// `tepdist run --resume` can continue it.
//
//   DIR/step-00000123.ckpt   the state at step 123: parameters, optimiser state and where the job
//                            stands (compute/io/checkpoint.hpp's format, CRC-32 at its end),
//                            written to a temporary name, fsynced and renamed
//   DIR/step-00000123.json   its manifest, written the same way and last: the job, mode,
//                            generation, step, epoch, position, samples, reference batch, and each
//                            part's file, size and CRC-32, and when it was written. A part
//                            without a manifest is a write cut short and is not a checkpoint.
//
// A folder may hold several runs' checkpoints (a run into an old --out, a resume): the newest is
// the one written last, not the highest step.
//
// A sync job's state is whole on every worker (the replicas are bit-identical), so the worker with
// rank-0 duties writes the one part at a step boundary: a consistent cut by construction. The last
// `keep` checkpoints are kept. Reading picks the newest whose part checks out against its manifest;
// a damaged newer one is reported and passed over.

#include <cstdint>
#include <expected>
#include <filesystem>
#include <string>
#include <vector>

#include "compute/io/checkpoint.hpp"

namespace tepdist::elastic {

/// When a checkpoint is due: at every multiple of `every_steps` steps and/or every `every_s`
/// seconds (0: not by that measure; both 0: never).
class CheckpointPolicy {
 public:
  CheckpointPolicy(int64_t every_steps, double every_s) : every_steps_(every_steps), every_s_(every_s) {}
  bool enabled() const { return every_steps_ > 0 || every_s_ > 0; }
  /// At step `step`, `now_s` seconds on some clock: due since the last one taken (or the start).
  bool due(int64_t step, double now_s);
  void taken(int64_t step, double now_s) {
    last_step_ = step;
    last_s_ = now_s;
  }

 private:
  int64_t every_steps_;
  double every_s_;
  int64_t last_step_ = 0;
  double last_s_ = -1;  // the first call starts the clock
};

/// Writes the checkpoint of `state` (its step names the files) into `dir`, creating it, then
/// removes all but the `keep` written last (never this one). The manifest's path.
std::expected<std::filesystem::path, std::string> write_checkpoint(const std::filesystem::path& dir, compute::Model& model,
                                                                   compute::Optimizer& optimizer,
                                                                   const compute::TrainingState& state, int64_t keep);

struct FoundCheckpoint {
  std::filesystem::path part;      ///< the .ckpt file
  std::filesystem::path manifest;  ///< its .json
  compute::TrainingState state;
  std::vector<std::string> passed_over;  ///< newer ones that did not check out, and why
};

/// The newest checkpoint in `dir` whose part matches its manifest (size and CRC-32) and checks out
/// whole. An error names the folder: missing, or holding no checkpoint (with why each was passed
/// over).
std::expected<FoundCheckpoint, std::string> latest_checkpoint(const std::filesystem::path& dir);

}  // namespace tepdist::elastic

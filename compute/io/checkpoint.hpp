#pragma once
// Checkpoints (to resume training) and .safetensors files (to exchange models).
//
// Checkpoint layout, little-endian:
//   "TEPDCKPT" | u32 version | u64 header bytes | JSON header | float32 buffers | u32 CRC-32
// The header names the parameters (name, shape, offset), the optimiser and its buffers, the step,
// epoch, seed and random-source states; the buffers follow in the header's order. The CRC covers
// everything before it, so a torn or corrupted file is detected, never half-loaded.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "compute/error.hpp"
#include "compute/model.hpp"
#include "compute/optimizer.hpp"
#include "compute/rng.hpp"

namespace tepdist::compute {

/// The training loop's position, saved beside the model and optimiser.
struct TrainingState {
  int64_t step = 0;   ///< updates applied
  int64_t epoch = 0;  ///< epochs completed
  uint64_t seed = 0;
  /// A cluster job's checkpoint (tepdist run) also says which job it was and where in the epoch
  /// it stood; `tepdist train`'s has none.
  struct Job {
    uint64_t job_id = 0, generation = 0;
    std::string mode;
    uint64_t position = 0;         ///< in the epoch's permutation
    uint64_t samples = 0;          ///< consumed since the job began
    uint64_t reference_batch = 0;  ///< the global batch epochs and the schedule are counted in
    /// Gossip and async: the positions not consumed at the cut, as (epoch, begin, end) triples in
    /// epoch and position order (whichever workers held them); a resumed job re-splits them over
    /// its workers. Sync: empty (`position` says where the epoch stands).
    std::vector<uint64_t> remaining = {};
    /// The plateau decays in effect at the cut ([optimizer] plateau_factor, compounded): a resumed
    /// job goes on at the decayed rate. 1: none (and absent from the file).
    double lr_factor = 1;
    friend bool operator==(const Job&, const Job&) = default;
  };
  std::optional<Job> job;
};

Result<void> save_checkpoint(const std::filesystem::path& path, Model& model, Optimizer& optimizer,
                             const TrainingState& state);

/// Restores model parameters, the model's random source and the optimiser from path. The file must
/// match the model (same names and shapes) and the optimiser (same kind); nothing is changed unless
/// everything checks out.
Result<TrainingState> load_checkpoint(const std::filesystem::path& path, Model& model, Optimizer& optimizer);

/// Checks a checkpoint file whole (magic, version, CRC-32) without a model; its CRC-32 (the
/// file's last four bytes) and what it says of the training.
struct CheckpointSummary {
  uint32_t crc = 0;
  uint64_t bytes = 0;
  TrainingState state;
};
Result<CheckpointSummary> check_checkpoint(const std::filesystem::path& path);

/// Writes a checkpoint's parameters as a .safetensors file, without a model: the names and shapes
/// are in its header. The same bytes export_safetensors writes for the model it was saved from.
Result<void> export_checkpoint_safetensors(const std::filesystem::path& checkpoint, const std::filesystem::path& out);

/// Writes the parameters as a .safetensors file: the stable names, dtype F32, row-major shapes.
Result<void> export_safetensors(const std::filesystem::path& path, const Model& model);

/// Loads parameters from a .safetensors file; every model parameter must be there with its shape.
Result<void> import_safetensors(const std::filesystem::path& path, Model& model);

}  // namespace tepdist::compute

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
};

Result<void> save_checkpoint(const std::filesystem::path& path, Model& model, Optimizer& optimizer,
                             const TrainingState& state);

/// Restores model parameters, the model's random source and the optimiser from path. The file must
/// match the model (same names and shapes) and the optimiser (same kind); nothing is changed unless
/// everything checks out.
Result<TrainingState> load_checkpoint(const std::filesystem::path& path, Model& model, Optimizer& optimizer);

/// Writes the parameters as a .safetensors file: the stable names, dtype F32, row-major shapes.
Result<void> export_safetensors(const std::filesystem::path& path, const Model& model);

/// Loads parameters from a .safetensors file; every model parameter must be there with its shape.
Result<void> import_safetensors(const std::filesystem::path& path, Model& model);

}  // namespace tepdist::compute

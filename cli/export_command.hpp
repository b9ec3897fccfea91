#pragma once
// `tepdist export CHECKPOINT --out model.safetensors`: the model of a checkpoint, as a
// .safetensors file. CHECKPOINT is a folder of cluster checkpoints (the newest that checks out is
// taken: elastic/checkpoints.hpp) or one checkpoint file (a cluster part, or `tepdist train`'s
// OUT/checkpoint). No model or job file is needed: names and shapes are in the checkpoint.

#include <string>

namespace tepdist::cli {

struct ExportArgs {
  std::string checkpoint;
  std::string out = "model.safetensors";
};

/// 0 once written; 1 when the checkpoint cannot be read (named, with why), or the file written.
int run_export_command(const ExportArgs& args);

}  // namespace tepdist::cli

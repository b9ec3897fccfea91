#pragma once
// Choosing a backend by the name a config uses.

#include <memory>
#include <string_view>

#include "compute/backend.hpp"
#include "compute/error.hpp"

namespace tepdist::compute {

/// What a config says of the backend besides its name ([compute] device and deterministic, both
/// for cuda only; emulate_device, for the host backends only: Backend::emulate_device).
struct BackendOptions {
  int device = 0;
  bool deterministic = true;
  bool emulate_device = false;
};

/// "onednn" (fast, the default), "ref" (the readable reference) or "cuda" (CUDA device
/// options.device, where this build has the backend and the machine a device; an error says which
/// is missing); anything else is an error listing the names.
Result<std::unique_ptr<Backend>> make_backend(std::string_view name, const BackendOptions& options = {});

/// Whether this build has the cuda backend (CMake found CUDA, cuDNN and NCCL).
bool cuda_built();

}  // namespace tepdist::compute

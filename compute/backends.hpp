#pragma once
// Choosing a backend by the name a config uses.

#include <memory>
#include <string_view>

#include "compute/backend.hpp"
#include "compute/error.hpp"

namespace tepdist::compute {

/// "onednn" (fast, the default), "ref" (the readable reference) or "cuda" (CUDA device `device`,
/// where this build has the backend and the machine a device; an error says which is missing);
/// anything else is an error listing the names.
Result<std::unique_ptr<Backend>> make_backend(std::string_view name, int device = 0);

/// Whether this build has the cuda backend (CMake found CUDA, cuDNN and NCCL).
bool cuda_built();

}  // namespace tepdist::compute

#pragma once
// The oneDNN backend: the same kernels as compute/ref, on oneDNN 2.6 primitives. Each kernel object
// creates its primitives once for its geometry and keeps every buffer it needs between calls;
// primitives choose their preferred (blocked) layouts and the kernel reorders at its edges.

#include <memory>

#include "compute/backend.hpp"

namespace tepdist::compute {

std::unique_ptr<Backend> make_onednn_backend();

}  // namespace tepdist::compute

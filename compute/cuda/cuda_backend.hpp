#pragma once
// The CUDA backend: cuDNN for convolutions, cuBLAS for the linear layers, own kernels
// (kernels.cu) for pooling, ReLU, the loss and the optimisers. Strict float32 throughout (cuDNN's
// FMA math, no TF32), checked against the reference backend like the oneDNN one.
//
// It computes on the device at every level: the whole-network plan keeps activations in device
// memory, and make_resident() keeps parameters, gradient and optimiser state there too, so a step
// moves only the batch in and the loss out. The per-layer kernels of the Backend interface, which
// take host views, copy their operands in and out (tests and the layer-by-layer path use them).

#include <memory>

#include "compute/backend.hpp"
#include "compute/error.hpp"

namespace tepdist::compute {

/// The CUDA backend on device `device` (an index as cudaSetDevice takes it). `deterministic`:
/// cuDNN's first-ranked deterministic convolution algorithms, so a rerun computes the same bits;
/// else the fastest it measures, atomics included. An error says why there is no backend: no CUDA
/// device or driver here, or an index past the devices there are.
Result<std::unique_ptr<Backend>> make_cuda_backend(int device, bool deterministic = true);

}  // namespace tepdist::compute

#include "compute/backends.hpp"

#include <fmt/format.h>

#include "compute/onednn/onednn_backend.hpp"
#include "compute/ref/ref_backend.hpp"
#ifdef TEPDIST_HAVE_CUDA
#include "compute/cuda/cuda_backend.hpp"
#endif

namespace tepdist::compute {

bool cuda_built() {
#ifdef TEPDIST_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

Result<std::unique_ptr<Backend>> make_backend(std::string_view name, const BackendOptions& options) {
  if (name == "onednn" || name == "ref") {
    std::unique_ptr<Backend> backend = name == "onednn" ? make_onednn_backend() : make_ref_backend();
    backend->emulate_device(options.emulate_device);
    return backend;
  }
  if (name == "cuda") {
    if (options.emulate_device)
      return fail(Errc::invalid_argument,
                  "compute.emulate_device emulates, on a host backend (onednn, ref), the state a device keeps; "
                  "backend 'cuda' keeps it on its device already");
#ifdef TEPDIST_HAVE_CUDA
    return make_cuda_backend(options.device, options.deterministic);
#else
    (void)options;
    return fail(Errc::invalid_argument,
                "backend 'cuda' is not in this build: CMake found no CUDA toolkit with cuDNN and NCCL when it was "
                "configured (see the README's GPU section)");
#endif
  }
  return fail(Errc::invalid_argument, fmt::format("unknown backend '{}' (known: onednn, ref, cuda)", name));
}

}  // namespace tepdist::compute

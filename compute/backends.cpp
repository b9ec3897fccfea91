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
  if (name == "onednn") return make_onednn_backend();
  if (name == "ref") return make_ref_backend();
  if (name == "cuda") {
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

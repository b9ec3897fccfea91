#pragma once
// cuBLAS, opened when the first cuda backend is made instead of linked. Every tepdist process
// links the compute library, and loading libcublas alone costs a process about 0.34 s and 218 MB
// resident before main (its static initialisers; an empty program linked to it, on the
// development machines): a node, `tepdist status`, every test would pay it without a GPU.

#include <cublas_v2.h>

#include "compute/error.hpp"

namespace tepdist::compute::cuda {

/// The cuBLAS functions the backend calls.
struct Cublas {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasGetVersion_v2) get_version;
  decltype(&cublasSgemm_v2) sgemm;
  decltype(&cublasGetStatusString) status_string;
};

/// The functions, loaded on the first call (any thread; once): an error names the library and
/// what the loader said when it cannot be opened or lacks one of them.
Result<const Cublas*> cublas();

}  // namespace tepdist::compute::cuda

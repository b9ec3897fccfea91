#include "compute/cuda/cublas.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <mutex>
#include <string>

namespace tepdist::compute::cuda {
namespace {

/// The soname of the cuBLAS this was compiled against: libcublas.so.13 for CUDA 13.
std::string library_name() { return fmt::format("libcublas.so.{}", CUBLAS_VER_MAJOR); }

Result<Cublas> load() {
  const std::string name = library_name();
  void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);  // kept open for the process's life
  if (!lib)
    return fail(Errc::invalid_argument,
                fmt::format("compute.backend \"cuda\": cannot open {} ({}); it comes with CUDA's cuBLAS", name,
                            dlerror()));
  Cublas api{};
  bool missing = false;
  std::string which;
  auto bind = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
    if (!fn && !missing) missing = true, which = symbol;
  };
  bind(api.create, "cublasCreate_v2");
  bind(api.destroy, "cublasDestroy_v2");
  bind(api.set_stream, "cublasSetStream_v2");
  bind(api.set_math_mode, "cublasSetMathMode");
  bind(api.get_version, "cublasGetVersion_v2");
  bind(api.sgemm, "cublasSgemm_v2");
  bind(api.status_string, "cublasGetStatusString");
  if (missing)
    return fail(Errc::invalid_argument, fmt::format("compute.backend \"cuda\": {} has no {}", name, which));
  return api;
}

}  // namespace

Result<const Cublas*> cublas() {
  static std::once_flag once;
  static Result<Cublas> loaded = fail(Errc::invalid_argument, "");
  std::call_once(once, [] { loaded = load(); });
  if (!loaded) return std::unexpected(loaded.error());
  return &*loaded;
}

}  // namespace tepdist::compute::cuda

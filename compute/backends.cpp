#include "compute/backends.hpp"

#include <fmt/format.h>

#include "compute/onednn/onednn_backend.hpp"
#include "compute/ref/ref_backend.hpp"

namespace tepdist::compute {

Result<std::unique_ptr<Backend>> make_backend(std::string_view name) {
  if (name == "onednn") return make_onednn_backend();
  if (name == "ref") return make_ref_backend();
  return fail(Errc::invalid_argument, fmt::format("unknown backend '{}' (known: onednn, ref)", name));
}

}  // namespace tepdist::compute

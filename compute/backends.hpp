#pragma once
// Choosing a backend by the name a config uses.

#include <memory>
#include <string_view>

#include "compute/backend.hpp"
#include "compute/error.hpp"

namespace tepdist::compute {

/// "onednn" (fast, the default) or "ref" (the readable reference); anything else is an error
/// listing the names.
Result<std::unique_ptr<Backend>> make_backend(std::string_view name);

}  // namespace tepdist::compute

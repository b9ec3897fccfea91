#pragma once

#include <memory>
#include <span>

#include "compute/backend.hpp"
#include "compute/onednn/common.hpp"

namespace tepdist::compute::onednn {

/// Plans conv2d / max_pool2d / relu / flatten / linear networks ending in a linear layer; null for
/// anything else (the model then runs layer by layer).
std::unique_ptr<NetworkPlan> plan_network(Context& ctx, std::span<const PlannedLayer> layers);

}  // namespace tepdist::compute::onednn

#pragma once
// The pieces of a training step that every mode shares: gradients of the loss on one batch, and
// evaluation on a data set. Updating parameters is the optimiser's business (single-node) or the
// distributed mode's (after averaging gradients), so it is not here.

#include <cstdint>
#include <span>

#include "compute/backend.hpp"
#include "compute/data/dataset.hpp"
#include "compute/model.hpp"

namespace tepdist::compute {

/// Buffers for the loss, kept between steps so a step allocates nothing once warm.
struct LossScratch {
  Tensor probs, dlogits;
};

/// Forward and backward on the batch (x [n, sample...], labels [n]): fills model.gradients() with
/// the gradient of the mean softmax cross-entropy and returns that loss.
float compute_gradients(Model& model, Backend& backend, ConstTensorView x, std::span<const int32_t> labels,
                        LossScratch& scratch);

struct Evaluation {
  double accuracy = 0.0;  ///< fraction of samples whose arg-max class is the label
  double loss = 0.0;      ///< mean softmax cross-entropy
  int64_t samples = 0;
};

/// Runs the model in inference mode over all of data, batch samples at a time.
Evaluation evaluate(Model& model, Backend& backend, const Dataset& data, int64_t batch = 256);

}  // namespace tepdist::compute

#pragma once
// The pieces of a training step that every mode shares: gradients of the loss on one batch, and
// evaluation on a data set. Updating parameters is the optimiser's business (single-node) or the
// distributed mode's (after averaging gradients), so it is not here.

#include <cstdint>
#include <span>

#include "compute/backend.hpp"
#include "compute/data/dataset.hpp"
#include "compute/error.hpp"
#include "compute/model.hpp"

namespace tepdist::compute {

/// Buffers for the loss, kept between steps so a step allocates nothing once warm.
struct LossScratch {
  Tensor probs, dlogits;
};

/// Forward and backward on the batch (x [n, sample...], labels [n]): fills model.gradients() with
/// the gradient of the mean softmax cross-entropy and returns that loss (NaN when the forward
/// met a NaN: see backend.hpp). Refuses, before touching the gradients, an x that is not a batch
/// of the model's samples and labels that are not n values in [0, model.classes()); the error
/// names the shapes or the label, its index and the number of classes. `ready`, when set, hears of
/// each layer's gradients as they become final (GradientsReady), unless the loss is not finite:
/// such a step's gradients are going nowhere.
Result<float> try_compute_gradients(Model& model, Backend& backend, ConstTensorView x, std::span<const int32_t> labels,
                                    LossScratch& scratch, const GradientsReady& ready = {});

/// The divergence rule, every trainer alike (`tepdist train`, and the workers of every cluster
/// mode): step `step`, whose loss and gradient these are, is refused (Errc::diverged, naming the
/// step and what is not finite) before it steps an optimiser or leaves the worker. Left to go on,
/// a NaN spreads to every parameter (every replica, every shard) and training ends "done" with a
/// model that predicts nothing.
Result<void> check_finite_step(int64_t step, float loss, std::span<const float> gradient);
/// The same rule where the gradient is checked where it lives (ResidentState::gradient_finite).
Result<void> check_finite_step(int64_t step, float loss, bool gradient_finite);

struct Evaluation {
  double accuracy = 0.0;  ///< fraction of samples whose arg-max class is the label
  double loss = 0.0;      ///< mean softmax cross-entropy
  int64_t samples = 0;
};

/// Runs the model in inference mode over all of data, batch samples at a time. A sample whose
/// probabilities hold a NaN counts as wrong. Refuses data whose samples or labels do not fit the
/// model, as try_compute_gradients does.
Result<Evaluation> try_evaluate(Model& model, Backend& backend, const Dataset& data, int64_t batch = 256);

}  // namespace tepdist::compute

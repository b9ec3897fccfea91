#pragma once
// Training state kept where the backend computes: the parameters, their gradient and the
// optimiser's buffers. For host backends (onednn, ref) that is the model's own flat buffers, and
// every sync point below is a no-op; the CUDA backend keeps all three in device memory, so a step
// (compute_gradients, then step) moves nothing between host and device but the batch in and the
// loss out.
//
// The sync points are the one place a host copy is made, each where the wire or a file needs one:
//   pull_parameters   model.parameters() <- resident: evaluation, checkpoints, export, the API's
//                     model, state transfer, gossip's mixings and final average
//   push_parameters   resident <- model.parameters(): after a checkpoint, the wire (a pulled
//                     state, a mixing) or a program changed them
//   pull_gradients    model.gradients() <- resident: a gradient the sync ring averages
//   push_gradients    resident <- model.gradients(): the averaged gradient back
//   pull_optimizer / push_optimizer: optimizer().state() <-> resident, for checkpoints
//
// Between a change of the resident state and its pull, the host's copy is stale (on a device) or
// NaN ([compute] emulate_device: a host backend keeping the state apart, for tests on machines
// without a device): the parameters and optimiser buffers after step(), the gradient after
// compute_gradients(). optimizer().steps() is always current.

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "compute/backend.hpp"
#include "compute/error.hpp"
#include "compute/model.hpp"
#include "compute/optimizer.hpp"
#include "compute/tensor.hpp"

namespace tepdist::compute {

class ResidentState {
 public:
  virtual ~ResidentState() = default;

  /// Forward, loss and backward on one batch (x [n, sample...], labels [n]); the gradient stays
  /// resident and the mean loss comes back (NaN when the forward met one). Refuses what
  /// try_compute_gradients refuses, before touching the gradient.
  virtual Result<float> compute_gradients(ConstTensorView x, std::span<const int32_t> labels) = 0;
  /// Whether every element of the resident gradient is finite (the divergence rule, train.hpp).
  virtual bool gradient_finite() = 0;
  /// The optimiser's update of the resident parameters from the resident gradient.
  virtual void step(float lr) = 0;
  /// The optimiser: its name and step count always; its state buffers after pull_optimizer().
  virtual Optimizer& optimizer() = 0;
  /// Where the state lives, for logs and results ("host memory", "cuda:0 (NVIDIA H200)").
  virtual std::string where() const = 0;

  virtual void pull_parameters() = 0;
  virtual void push_parameters() = 0;
  virtual void pull_gradients() = 0;
  virtual void push_gradients() = 0;
  virtual void pull_optimizer() = 0;
  virtual void push_optimizer() = 0;
};

/// The resident state of model (built) on backend, with a fresh optimiser made from options (bad
/// options are errors naming the option). A backend that cannot run one of the model's layers
/// refuses it here, naming the layer.
Result<std::unique_ptr<ResidentState>> make_resident(Model& model, Backend& backend, const OptimizerOptions& options);

}  // namespace tepdist::compute

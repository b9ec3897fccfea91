#pragma once
// A model: layers run in order, their parameters in one flat buffer with stable names.
//
// Users compose a model either by listing layers (presets, TOML) or as their own class:
//
//   class MyNet : public tepdist::compute::Model {
//    public:
//     MyNet() {
//       add<Conv2d>(1, 20, 5);   // named conv1: parameters conv1.weight, conv1.bias
//       add<MaxPool2d>(2);
//       add<Relu>();
//       add<Flatten>();
//       add<Linear>(0, 10);      // in_features 0: inferred at build()
//     }
//   };
//
// The flat parameter and gradient buffers are what optimisers update in one sweep and what later
// travels on the wire; every layer sees views into them.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "compute/error.hpp"
#include "compute/layers.hpp"
#include "compute/rng.hpp"
#include "compute/tensor.hpp"

namespace tepdist::compute {

/// One parameter tensor: "conv1.weight", its shape and where it starts in the flat buffer.
struct NamedParameter {
  std::string name;
  Shape shape;
  int64_t offset;
};

class Model {
 public:
  Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  Model(Model&&) = default;
  Model& operator=(Model&&) = default;
  virtual ~Model() = default;

  /// Appends a layer named after its kind and position (conv1, pool2, fc1, ...).
  template <class L, class... Args>
  L& add(Args&&... args) {
    return static_cast<L&>(add(std::make_unique<L>(std::forward<Args>(args)...)));
  }
  /// Appends a layer; an empty name is replaced by the automatic one.
  Layer& add(std::unique_ptr<Layer> layer, std::string name = "");

  /// Fixes every shape from one sample's shape ([1, 28, 28] for Fashion-MNIST), allocates the flat
  /// buffers and draws the initial parameters from seed. Fails naming the first layer that does not
  /// fit. Call once, after the last add().
  Result<void> build(const Shape& sample_shape, uint64_t seed);
  bool built() const { return built_; }

  /// Runs every layer on x [n, sample...] and returns the last output (the logits), valid until the
  /// next forward. x must stay alive and unchanged until backward(). Refuses, naming both shapes,
  /// an x that is not a batch of one or more samples of sample_shape(): every backend reads x
  /// with the model's shapes, so this is the one place they are checked.
  Result<ConstTensorView> forward(Backend& backend, ConstTensorView x, bool training);
  /// Back-propagates dlogits (the loss gradient with respect to the last forward's result) through
  /// every layer, overwriting gradients(); tells `ready`, when set, of each layer's range of them
  /// as soon as it is final (see GradientsReady in backend.hpp).
  void backward(Backend& backend, ConstTensorView dlogits, const GradientsReady& ready = {});

  std::span<float> parameters() { return params_; }
  std::span<const float> parameters() const { return params_; }
  std::span<float> gradients() { return grads_; }
  std::span<const float> gradients() const { return grads_; }
  const std::vector<NamedParameter>& named_parameters() const { return named_; }
  /// The shape of one sample, as given to build().
  const Shape& sample_shape() const { return sample_shape_; }
  /// Number of classes the model outputs.
  int64_t classes() const;

  /// The layers as a backend plans them for this batch size, parameter offsets filled in.
  std::vector<PlannedLayer> planned_layers(int64_t batch) const;

  /// The model's own random source (dropout masks); part of a checkpoint.
  Rng& rng() { return rng_; }
  /// One line per layer with its name, description and output shape.
  std::string summary() const;
  /// What a batch of this size runs on: the backend (with what it dispatches to) and, when it
  /// plans the whole network, each stage's kernels and layouts, else "layer by layer". Makes the
  /// plan if it is not made yet (the one the batch's forward then uses).
  std::string compute_path(Backend& backend, int64_t batch);

 private:
  struct Entry {
    std::string name;
    std::unique_ptr<Layer> layer;
    Shape output;  // for a batch of one
    int64_t params_begin = 0, params_end = 0;  // the layer's parameters in the flat buffers
  };

  std::vector<Entry> layers_;
  std::vector<NamedParameter> named_;
  std::vector<float> params_, grads_;
  Shape sample_shape_;
  Rng rng_;
  bool built_ = false;

  /// The backend's whole-network plan for this batch size, made on first use; null when the
  /// backend runs layer by layer.
  NetworkPlan* plan_for(Backend& backend, int64_t batch);

  struct PlanEntry {
    int64_t batch;
    std::unique_ptr<NetworkPlan> plan;  // null: the backend declined
  };
  uint64_t plans_backend_ = 0;  ///< Backend::id() the plans were made for
  std::vector<PlanEntry> plans_;          // a few batch sizes, least recently used first
  NetworkPlan* last_plan_ = nullptr;      // the plan the last forward ran, if any
  bool forwarded_ = false;                // a forward has run since build(): backward has its input

  ConstTensorView input_;                 // what the last forward saw
  std::vector<Tensor> activations_;       // one output per layer
  Tensor grad_ping_, grad_pong_;          // input gradients, alternating down the layers
};

}  // namespace tepdist::compute

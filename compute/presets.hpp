#pragma once
// Ready-made models and models described as data (a TOML [model] layers list).

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "compute/error.hpp"
#include "compute/model.hpp"

namespace tepdist::compute {

/// The examples' LeNet (and the PyTorch baseline's): conv 1->20 5x5, max-pool 2, ReLU,
/// conv 20->50 5x5, max-pool 2, ReLU, linear 800->500, ReLU, linear 500->10.
std::unique_ptr<Model> make_lenet();
/// A wider CNN for 28x28 images, 3.3 million parameters and about 12 times LeNet's arithmetic:
/// conv 1->64 3x3 padding 1, max-pool 2, ReLU, conv 64->128 3x3 padding 1, max-pool 2, ReLU,
/// linear 6272->512, ReLU, linear 512->10 (bench/gpu_torch.py builds the same in PyTorch).
std::unique_ptr<Model> make_widecnn();
/// A two-layer perceptron: flatten, linear ->hidden, ReLU, linear ->classes.
std::unique_ptr<Model> make_mlp(int64_t hidden = 256, int64_t classes = 10);
/// The preset called name ("lenet", "widecnn", "mlp"), or an error listing the presets.
Result<std::unique_ptr<Model>> make_preset(const std::string& name);

/// One layer as written in a config: its type, optional name and numeric arguments.
struct LayerSpec {
  std::string type;
  std::string name;  ///< empty: automatic (conv1, fc2, ...)
  std::vector<std::pair<std::string, double>> args;
  friend bool operator==(const LayerSpec&, const LayerSpec&) = default;
};

/// A layer from its spec; unknown types, unknown or missing arguments and non-integer sizes are
/// errors naming the argument.
Result<std::unique_ptr<Layer>> make_layer(const LayerSpec& spec);
/// A model from a list of layer specs; errors say which layer (1-based).
Result<std::unique_ptr<Model>> make_model(const std::vector<LayerSpec>& layers);

}  // namespace tepdist::compute

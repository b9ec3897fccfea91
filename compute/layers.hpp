#pragma once
// Layers: the pieces a model is composed of. A layer knows its shapes and parameters and runs its
// maths through kernels the backend makes; it owns no parameter memory (the model does, in one flat
// buffer) but owns its kernels and whatever it must remember between forward and backward.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "compute/backend.hpp"
#include "compute/error.hpp"
#include "compute/rng.hpp"
#include "compute/tensor.hpp"

namespace tepdist::compute {

/// The kernels one layer has made, one per geometry it has run (a training batch, a last partial
/// batch, an evaluation batch), so a backend plans each shape once. Bounded: the oldest goes first.
template <class Geometry, class Kernel>
class KernelCache {
 public:
  template <class Make>
  Kernel& get(Backend& backend, const Geometry& g, Make make) {
    if (backend.id() != backend_id_) {  // not the address: a new backend may reuse a dead one's
      entries_.clear();
      backend_id_ = backend.id();
    }
    for (auto& [geometry, kernel] : entries_)
      if (geometry == g) return *kernel;
    if (entries_.size() == max_entries) entries_.erase(entries_.begin());
    entries_.emplace_back(g, make(backend, g));
    return *entries_.back().second;
  }

 private:
  static constexpr size_t max_entries = 4;
  uint64_t backend_id_ = 0;
  std::vector<std::pair<Geometry, std::unique_ptr<Kernel>>> entries_;
};

/// What a layer is run with for one forward or backward pass.
struct PassContext {
  Backend& backend;
  bool training;
  Rng& rng;  ///< The model's random source (dropout masks).
};

/// A parameter a layer asks the model for: its local name ("weight"), shape and the bound b of the
/// uniform initialisation U(-b, b).
struct ParamSpec {
  std::string name;
  Shape shape;
  float init_bound;
};

class Layer {
 public:
  virtual ~Layer() = default;

  /// The kind, as written in a TOML model ("conv2d"); also the stem of automatic names.
  virtual std::string_view kind() const = 0;
  /// Prefix of automatic names: conv1, fc2, pool1, ...
  virtual std::string_view name_stem() const { return kind(); }
  /// Checks the input shape (batch first) and fixes the layer's own; returns the output shape.
  virtual Result<Shape> configure(const Shape& input) = 0;
  /// The parameters this layer needs, in order; valid after configure().
  virtual std::vector<ParamSpec> parameter_specs() const { return {}; }
  /// Hands the layer views into the model's flat buffers, one per parameter_specs() entry.
  virtual void bind(std::span<const TensorView> params, std::span<const TensorView> grads) {
    (void)params;
    (void)grads;
  }
  virtual void forward(PassContext& ctx, ConstTensorView x, TensorView y) = 0;
  /// Writes the parameter gradients and, when dx.data is not null, the input gradient.
  /// x and y are what the last forward saw and produced.
  virtual void backward(PassContext& ctx, ConstTensorView x, ConstTensorView y, ConstTensorView dy,
                        TensorView dx) = 0;
  /// One line for model summaries: "conv2d 1->20 5x5".
  virtual std::string describe() const = 0;
  /// The layer for a whole-network plan at this batch size (offsets are the model's to fill);
  /// kind other means the layer cannot be planned.
  virtual PlannedLayer plan(int64_t batch) const {
    (void)batch;
    return {};
  }
};

class Conv2d final : public Layer {
 public:
  /// in_channels 0: taken from the input shape.
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride = 1, int64_t padding = 0);
  std::string_view kind() const override { return "conv2d"; }
  std::string_view name_stem() const override { return "conv"; }
  Result<Shape> configure(const Shape& input) override;
  std::vector<ParamSpec> parameter_specs() const override;
  void bind(std::span<const TensorView> params, std::span<const TensorView> grads) override;
  void forward(PassContext& ctx, ConstTensorView x, TensorView y) override;
  void backward(PassContext& ctx, ConstTensorView x, ConstTensorView y, ConstTensorView dy, TensorView dx) override;
  std::string describe() const override;
  PlannedLayer plan(int64_t batch) const override;

 private:
  Conv2dKernel& kernel_for(Backend& backend, int64_t batch);
  int64_t in_, out_, kernel_, stride_, padding_;
  Conv2dGeometry geometry_{};
  TensorView weight_, bias_, dweight_, dbias_;
  KernelCache<Conv2dGeometry, Conv2dKernel> kernels_;
};

class MaxPool2d final : public Layer {
 public:
  explicit MaxPool2d(int64_t kernel, int64_t stride = 0);  // stride 0: same as kernel
  std::string_view kind() const override { return "max_pool2d"; }
  std::string_view name_stem() const override { return "pool"; }
  Result<Shape> configure(const Shape& input) override;
  void forward(PassContext& ctx, ConstTensorView x, TensorView y) override;
  void backward(PassContext& ctx, ConstTensorView x, ConstTensorView y, ConstTensorView dy, TensorView dx) override;
  std::string describe() const override;
  PlannedLayer plan(int64_t batch) const override;

 private:
  MaxPool2dKernel& kernel_for(Backend& backend, int64_t batch);
  int64_t kernel_, stride_;
  Pool2dGeometry geometry_{};
  KernelCache<Pool2dGeometry, MaxPool2dKernel> kernels_;
  MaxPool2dKernel* last_ = nullptr;  // the kernel of the last forward, which holds its argmax
};

class Relu final : public Layer {
 public:
  std::string_view kind() const override { return "relu"; }
  Result<Shape> configure(const Shape& input) override {
    input_ = input;
    return input;
  }
  void forward(PassContext& ctx, ConstTensorView x, TensorView y) override;
  void backward(PassContext& ctx, ConstTensorView x, ConstTensorView y, ConstTensorView dy, TensorView dx) override;
  std::string describe() const override { return "relu"; }
  PlannedLayer plan(int64_t batch) const override;

 private:
  Shape input_;
};

class Flatten final : public Layer {
 public:
  std::string_view kind() const override { return "flatten"; }
  Result<Shape> configure(const Shape& input) override;
  void forward(PassContext& ctx, ConstTensorView x, TensorView y) override;
  void backward(PassContext& ctx, ConstTensorView x, ConstTensorView y, ConstTensorView dy, TensorView dx) override;
  std::string describe() const override { return "flatten"; }
  PlannedLayer plan(int64_t batch) const override;

 private:
  Shape input_;
};

class Linear final : public Layer {
 public:
  /// in_features 0: taken from the input shape.
  Linear(int64_t in_features, int64_t out_features);
  std::string_view kind() const override { return "linear"; }
  std::string_view name_stem() const override { return "fc"; }
  Result<Shape> configure(const Shape& input) override;
  std::vector<ParamSpec> parameter_specs() const override;
  void bind(std::span<const TensorView> params, std::span<const TensorView> grads) override;
  void forward(PassContext& ctx, ConstTensorView x, TensorView y) override;
  void backward(PassContext& ctx, ConstTensorView x, ConstTensorView y, ConstTensorView dy, TensorView dx) override;
  std::string describe() const override;
  PlannedLayer plan(int64_t batch) const override;

 private:
  LinearKernel& kernel_for(Backend& backend, int64_t batch);
  int64_t in_, out_;
  TensorView weight_, bias_, dweight_, dbias_;
  KernelCache<LinearGeometry, LinearKernel> kernels_;
};

/// Inverted dropout: in training, zeroes each element with probability p and scales the rest by
/// 1/(1-p); in evaluation, the identity.
class Dropout final : public Layer {
 public:
  explicit Dropout(float p);
  std::string_view kind() const override { return "dropout"; }
  Result<Shape> configure(const Shape& input) override;
  void forward(PassContext& ctx, ConstTensorView x, TensorView y) override;
  void backward(PassContext& ctx, ConstTensorView x, ConstTensorView y, ConstTensorView dy, TensorView dx) override;
  std::string describe() const override;
  float p() const { return p_; }

 private:
  float p_;
  std::vector<float> mask_;  // 0 or 1/(1-p) per element of the last training forward
  bool last_training_ = false;
};

}  // namespace tepdist::compute

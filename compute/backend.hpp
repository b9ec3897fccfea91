#pragma once
// The backend interface: every kernel the layers run. A backend makes one kernel object per layer
// and shape (batch size included) so an implementation can plan once and reuse its plan, its
// scratch memory and its workspaces for every step of that shape.
//
// All tensors are dense row-major float32; images are NCHW. Kernels overwrite their outputs
// (gradients included: a parameter is used once per step, so nothing needs accumulating).
//
// NaN propagates, in every backend alike: the ReLU of NaN is NaN, a max-pool window holding a NaN
// gives NaN (its first NaN is the maximum the gradient goes to), a NaN logit makes its row's
// probabilities and the loss NaN. A diverging run then shows a NaN loss instead of a healthy one.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "compute/error.hpp"
#include "compute/tensor.hpp"

namespace tepdist::compute {

class Model;
class ResidentState;
struct OptimizerOptions;

/// A 2-D convolution: x [n, c, h, w] * w [k, c, r, s] + b [k] -> y [n, k, oh, ow].
struct Conv2dGeometry {
  int64_t n, c, h, w;  // input
  int64_t k, r, s;     // output channels, kernel height and width
  int64_t stride = 1, pad = 0;

  int64_t oh() const { return (h + 2 * pad - r) / stride + 1; }
  int64_t ow() const { return (w + 2 * pad - s) / stride + 1; }
  Shape input() const { return {n, c, h, w}; }
  Shape weight() const { return {k, c, r, s}; }
  Shape output() const { return {n, k, oh(), ow()}; }
  friend bool operator==(const Conv2dGeometry&, const Conv2dGeometry&) = default;
};

/// Max pooling without padding: x [n, c, h, w] -> y [n, c, oh, ow], window kernel, step stride.
struct Pool2dGeometry {
  int64_t n, c, h, w;
  int64_t kernel, stride;

  int64_t oh() const { return (h - kernel) / stride + 1; }
  int64_t ow() const { return (w - kernel) / stride + 1; }
  Shape input() const { return {n, c, h, w}; }
  Shape output() const { return {n, c, oh(), ow()}; }
  friend bool operator==(const Pool2dGeometry&, const Pool2dGeometry&) = default;
};

/// A fully connected layer: x [n, in] * w[out, in]^T + b [out] -> y [n, out].
struct LinearGeometry {
  int64_t n, in, out;
  friend bool operator==(const LinearGeometry&, const LinearGeometry&) = default;
};

class Conv2dKernel {
 public:
  virtual ~Conv2dKernel() = default;
  virtual void forward(ConstTensorView x, ConstTensorView w, ConstTensorView b, TensorView y) = 0;
  /// dx = conv_transpose(dy, w).
  virtual void backward_data(ConstTensorView dy, ConstTensorView w, TensorView dx) = 0;
  /// dw = correlation of x with dy, db = dy summed over n, oh, ow.
  virtual void backward_weights(ConstTensorView x, ConstTensorView dy, TensorView dw, TensorView db) = 0;
};

class MaxPool2dKernel {
 public:
  virtual ~MaxPool2dKernel() = default;
  /// Remembers where each maximum came from, for the next backward.
  virtual void forward(ConstTensorView x, TensorView y) = 0;
  /// Routes dy to the positions the last forward picked; dx is zero elsewhere.
  virtual void backward(ConstTensorView dy, TensorView dx) = 0;
};

class LinearKernel {
 public:
  virtual ~LinearKernel() = default;
  virtual void forward(ConstTensorView x, ConstTensorView w, ConstTensorView b, TensorView y) = 0;
  /// dx [n, in] = dy [n, out] * w [out, in].
  virtual void backward_data(ConstTensorView dy, ConstTensorView w, TensorView dx) = 0;
  /// dw [out, in] = dy^T * x, db [out] = dy summed over n.
  virtual void backward_weights(ConstTensorView x, ConstTensorView dy, TensorView dw, TensorView db) = 0;
};

/// One layer as a backend sees it when planning a whole network: its kind, its geometry for one
/// batch size and where its parameters start in the model's flat buffers.
struct PlannedLayer {
  enum class Kind { conv2d, max_pool2d, relu, flatten, linear, other };
  Kind kind = Kind::other;
  Shape input;  ///< batch included
  Conv2dGeometry conv{};
  Pool2dGeometry pool{};
  LinearGeometry linear{};
  int64_t weight_offset = -1, bias_offset = -1;  ///< into the flat parameter and gradient buffers
  int64_t params_begin = 0, params_end = 0;      ///< all of the layer's parameters there (empty: none)
  std::string name{};  ///< the model's name for the layer (conv1, dropout1), for errors
};

/// Told during a backward pass that elements [begin, end) of the flat gradient buffer are final
/// for this step: nothing writes them again before the next backward. Called once per layer with
/// parameters, in the order the backward finishes them (the last layer's first), the ranges
/// covering the buffer exactly once. A sync worker sends those gradients on while the backward
/// goes on with the layers before.
using GradientsReady = std::function<void(size_t begin, size_t end)>;

/// A whole network planned at once for one batch size: the backend owns every activation and
/// gradient buffer in the layouts it prefers, fuses what it can, and converts only at the edges
/// (the plain NCHW input, the plain [n, classes] logits, the plain parameter and gradient buffers).
class NetworkPlan {
 public:
  virtual ~NetworkPlan() = default;
  /// Runs the network on x; returns the logits, owned by the plan, valid until the next forward.
  virtual ConstTensorView forward(ConstTensorView x, std::span<const float> params) = 0;
  /// Back-propagates dlogits through the last forward, overwriting every parameter gradient, and
  /// tells `ready`, when it is set, of each range as it becomes final (see GradientsReady).
  virtual void backward(ConstTensorView dlogits, std::span<const float> params, std::span<float> grads,
                        const GradientsReady& ready) = 0;
  /// The kernels and layouts each stage runs, one "stage: ..." entry per stage, joined by "; ":
  /// which fast path a machine took (oneDNN picks layouts by the CPU's instructions, and our
  /// direct kernels run only on the layouts they are written for).
  virtual std::string path() const = 0;
};

/// The labels of a batch of n for a model of `classes` outputs: n values in [0, classes). An
/// error names the first bad label and its index (every backend indexes the logits with them).
Result<void> check_labels(std::span<const int32_t> labels, int64_t n, int64_t classes);

class Backend {
 public:
  Backend() : id_(next_id()) {}
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  virtual ~Backend() = default;
  /// Unique among every backend this process makes, unlike its address, which a later backend
  /// may reuse: kernel and plan caches key on it, so they never run a dead backend's kernels.
  uint64_t id() const { return id_; }
  virtual std::string_view name() const = 0;
  /// The backend and what it runs on, for logs and results (oneDNN: its version and the
  /// instruction set it dispatches to on this CPU).
  virtual std::string describe() const { return std::string(name()); }
  /// Threads for intra-op parallelism; 0 means every core. For the calling thread only (OpenMP
  /// keeps the team size per thread): every thread that computes with this backend calls it, or
  /// it computes with every core (an evaluator on a thread of its own did, on nodes given one).
  virtual void set_threads(int threads) = 0;
  /// The threads this backend's kernels use when called from the calling thread.
  virtual int threads_here() const { return 1; }

  virtual std::unique_ptr<Conv2dKernel> make_conv2d(const Conv2dGeometry& g) = 0;
  virtual std::unique_ptr<MaxPool2dKernel> make_max_pool2d(const Pool2dGeometry& g) = 0;
  virtual std::unique_ptr<LinearKernel> make_linear(const LinearGeometry& g) = 0;

  /// A plan for the whole network, or null when this backend runs layer by layer (the default) or
  /// cannot plan one of the layers; the model then uses the per-layer kernels.
  virtual std::unique_ptr<NetworkPlan> plan_network(std::span<const PlannedLayer> layers) {
    (void)layers;
    return nullptr;
  }

  /// Refuses, naming the first, a layer this backend cannot run where it computes (the CUDA
  /// backend cannot run dropout on the device): such a model must not quietly run on the host.
  virtual Result<void> check_layers(std::span<const PlannedLayer> layers) const {
    (void)layers;
    return {};
  }

  /// Training state for model kept in this backend's own memory (see resident.hpp), or null when
  /// the backend computes on the host's buffers (the default: make_resident then keeps the state
  /// in the model). An error names a layer the backend cannot run. A host backend told to
  /// emulate a device keeps it apart (resident.hpp, EmulatedDevice).
  virtual Result<std::unique_ptr<ResidentState>> make_resident(Model& model, const OptimizerOptions& options);

  /// [compute] emulate_device, for the host backends: make_resident keeps the state in memory of
  /// its own and leaves the model's copy NaN while it is out of date, as a device's would be
  /// stale, so tests on a machine without a device exercise every sync point.
  void emulate_device(bool on) { emulate_device_ = on; }
  bool emulates_device() const { return emulate_device_; }

  /// y = max(x, 0), any shape, NaN where x is NaN; x and y may alias.
  virtual void relu_forward(ConstTensorView x, TensorView y) = 0;
  /// dx = dy where y > 0, else 0; dy and dx may alias.
  virtual void relu_backward(ConstTensorView y, ConstTensorView dy, TensorView dx) = 0;

  /// logits [n, classes], labels [n] -> probs = softmax(logits); returns the mean cross-entropy
  /// over the batch. Refuses, before any kernel runs, an empty batch and labels that are not n
  /// values in [0, classes), naming the first bad label and its index: every backend indexes the
  /// logits with them unchecked, so this is the one place they are checked.
  Result<float> softmax_cross_entropy_forward(ConstTensorView logits, std::span<const int32_t> labels,
                                              TensorView probs);
  /// dlogits = (probs - onehot(labels)) / n: the gradient of the mean loss. Refuses labels as the
  /// forward does (the backward writes at each label's position).
  Result<void> softmax_cross_entropy_backward(ConstTensorView probs, std::span<const int32_t> labels,
                                              TensorView dlogits);

 private:
  /// The kernels behind the two above, called with labels already checked and shapes agreeing.
  virtual float do_softmax_cross_entropy_forward(ConstTensorView logits, std::span<const int32_t> labels,
                                                 TensorView probs) = 0;
  virtual void do_softmax_cross_entropy_backward(ConstTensorView probs, std::span<const int32_t> labels,
                                                 TensorView dlogits) = 0;

  static uint64_t next_id() {
    static std::atomic<uint64_t> counter{0};
    return ++counter;
  }
  uint64_t id_;
  bool emulate_device_ = false;
};

}  // namespace tepdist::compute

#include "compute/ref/ref_backend.hpp"

#include <omp.h>

namespace tepdist::compute {
namespace {

class RefBackend final : public Backend {
 public:
  std::string_view name() const override { return "ref"; }
  void set_threads(int threads) override { omp_set_num_threads(threads > 0 ? threads : omp_get_num_procs()); }
  int threads_here() const override { return omp_get_max_threads(); }

  std::unique_ptr<Conv2dKernel> make_conv2d(const Conv2dGeometry& g) override { return ref::make_conv2d(g); }
  std::unique_ptr<MaxPool2dKernel> make_max_pool2d(const Pool2dGeometry& g) override {
    return ref::make_max_pool2d(g);
  }
  std::unique_ptr<LinearKernel> make_linear(const LinearGeometry& g) override { return ref::make_linear(g); }

  void relu_forward(ConstTensorView x, TensorView y) override { ref::relu_forward(x, y); }
  void relu_backward(ConstTensorView y, ConstTensorView dy, TensorView dx) override { ref::relu_backward(y, dy, dx); }

 private:
  float do_softmax_cross_entropy_forward(ConstTensorView logits, std::span<const int32_t> labels,
                                         TensorView probs) override {
    return ref::softmax_cross_entropy_forward(logits, labels, probs);
  }
  void do_softmax_cross_entropy_backward(ConstTensorView probs, std::span<const int32_t> labels,
                                         TensorView dlogits) override {
    ref::softmax_cross_entropy_backward(probs, labels, dlogits);
  }
};

}  // namespace

std::unique_ptr<Backend> make_ref_backend() { return std::make_unique<RefBackend>(); }

}  // namespace tepdist::compute

// Reference fully connected layer.
//
// Shape contract:
//   x [n, in]   w [out, in]   b [out]   y [n, out]
//   y  = x * w^T + b
//   dx = dy * w
//   dw = dy^T * x,  db = dy summed over n


#include "compute/ref/gemm.hpp"
#include "compute/ref/ref_backend.hpp"
#include "base/check.hpp"

namespace tepdist::compute::ref {
namespace {

class Linear final : public LinearKernel {
 public:
  explicit Linear(const LinearGeometry& g) : g_(g) {}

  void forward(ConstTensorView x, ConstTensorView w, ConstTensorView b, TensorView y) override {
    TEPDIST_CHECK(x.elements() == g_.n * g_.in && w.elements() == g_.out * g_.in && b.elements() == g_.out);
    TEPDIST_CHECK(y.elements() == g_.n * g_.out);
    gemm_nt(g_.n, g_.out, g_.in, x.data, w.data, y.data, false);
    for (int64_t i = 0; i < g_.n; ++i)
      for (int64_t o = 0; o < g_.out; ++o) y.data[i * g_.out + o] += b.data[o];
  }

  void backward_data(ConstTensorView dy, ConstTensorView w, TensorView dx) override {
    TEPDIST_CHECK(dy.elements() == g_.n * g_.out && dx.elements() == g_.n * g_.in);
    gemm_nn(g_.n, g_.in, g_.out, dy.data, w.data, dx.data, false);
  }

  void backward_weights(ConstTensorView x, ConstTensorView dy, TensorView dw, TensorView db) override {
    TEPDIST_CHECK(x.elements() == g_.n * g_.in && dy.elements() == g_.n * g_.out);
    TEPDIST_CHECK(dw.elements() == g_.out * g_.in && db.elements() == g_.out);
    gemm_tn(g_.out, g_.in, g_.n, dy.data, x.data, dw.data, false);
    for (int64_t o = 0; o < g_.out; ++o) db.data[o] = 0.0f;
    for (int64_t i = 0; i < g_.n; ++i)
      for (int64_t o = 0; o < g_.out; ++o) db.data[o] += dy.data[i * g_.out + o];
  }

 private:
  LinearGeometry g_;
};

}  // namespace

std::unique_ptr<LinearKernel> make_linear(const LinearGeometry& g) { return std::make_unique<Linear>(g); }

}  // namespace tepdist::compute::ref

// Reference max pooling without padding.
//
// Shape contract:
//   x [n, c, h, w] -> y [n, c, oh, ow],  oh = (h - kernel) / stride + 1, ow likewise
//   argmax_ [n*c*oh*ow]: the flat index into x of each output's maximum (first one on ties); a
//   window holding a NaN has that NaN as its maximum (the first NaN), so NaN propagates
//   backward: dx = 0, then dx[argmax[i]] += dy[i]

#include <cmath>
#include <cstdint>
#include <vector>

#include "compute/ref/ref_backend.hpp"
#include "base/check.hpp"

namespace tepdist::compute::ref {
namespace {

class MaxPool2d final : public MaxPool2dKernel {
 public:
  explicit MaxPool2d(const Pool2dGeometry& g) : g_(g), argmax_(static_cast<size_t>(g.output().elements())) {}

  void forward(ConstTensorView x, TensorView y) override {
    TEPDIST_CHECK(x.shape == g_.input() && y.shape == g_.output());
    const int64_t oh = g_.oh(), ow = g_.ow();
#pragma omp parallel for schedule(static)
    for (int64_t plane = 0; plane < g_.n * g_.c; ++plane) {
      const int64_t base = plane * g_.h * g_.w;
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          int64_t best = base + (oy * g_.stride) * g_.w + ox * g_.stride;
          for (int64_t ky = 0; ky < g_.kernel; ++ky)
            for (int64_t kx = 0; kx < g_.kernel; ++kx) {
              const int64_t i = base + (oy * g_.stride + ky) * g_.w + ox * g_.stride + kx;
              // !(v <= best) takes a larger v or a NaN v; a NaN best is kept: the first NaN wins
              if (!std::isnan(x.data[best]) && !(x.data[i] <= x.data[best])) best = i;
            }
          const int64_t out = (plane * oh + oy) * ow + ox;
          y.data[out] = x.data[best];
          argmax_[static_cast<size_t>(out)] = best;
        }
    }
  }

  void backward(ConstTensorView dy, TensorView dx) override {
    TEPDIST_CHECK(dy.shape == g_.output() && dx.shape == g_.input());
    for (int64_t i = 0; i < dx.elements(); ++i) dx.data[i] = 0.0f;
    for (int64_t i = 0; i < dy.elements(); ++i) dx.data[argmax_[static_cast<size_t>(i)]] += dy.data[i];
  }

 private:
  Pool2dGeometry g_;
  std::vector<int64_t> argmax_;
};

}  // namespace

std::unique_ptr<MaxPool2dKernel> make_max_pool2d(const Pool2dGeometry& g) {
  return std::make_unique<MaxPool2d>(g);
}

}  // namespace tepdist::compute::ref

// Reference 2-D convolution by im2col and a plain matrix product, one sample at a time.
//
// Shape contract:
//   x  [n, c, h, w]      w  [k, c, r, s]      b [k]
//   y  [n, k, oh, ow]    oh = (h + 2 pad - r) / stride + 1, ow likewise
// For one sample, col [c*r*s, oh*ow] holds the input patch under each output position, so
//   y_n [k, oh*ow]        = w [k, c*r*s] * col
//   dcol [c*r*s, oh*ow]   = w^T * dy_n            (then scattered back into dx_n by col2im)
//   dw [k, c*r*s]        += dy_n * col^T          (summed over the batch)

#include <omp.h>

#include <vector>

#include "compute/ref/gemm.hpp"
#include "compute/ref/ref_backend.hpp"
#include "base/check.hpp"

namespace tepdist::compute::ref {
namespace {

class Conv2d final : public Conv2dKernel {
 public:
  explicit Conv2d(const Conv2dGeometry& g) : g_(g), crs_(g.c * g.r * g.s), p_(g.oh() * g.ow()) {}

  void forward(ConstTensorView x, ConstTensorView w, ConstTensorView b, TensorView y) override {
    TEPDIST_CHECK(x.shape == g_.input() && w.shape == g_.weight() && y.shape == g_.output());
    TEPDIST_CHECK(b.elements() == g_.k);
    prepare_scratch(crs_ * p_);
#pragma omp parallel
    {
      float* col = scratch_[static_cast<size_t>(omp_get_thread_num())].data();
#pragma omp for schedule(static)
      for (int64_t n = 0; n < g_.n; ++n) {
        im2col(x.data + n * g_.c * g_.h * g_.w, col);
        float* yn = y.data + n * g_.k * p_;
        gemm_nn(g_.k, p_, crs_, w.data, col, yn, false);
        for (int64_t k = 0; k < g_.k; ++k)
          for (int64_t p = 0; p < p_; ++p) yn[k * p_ + p] += b.data[k];
      }
    }
  }

  void backward_data(ConstTensorView dy, ConstTensorView w, TensorView dx) override {
    TEPDIST_CHECK(dy.shape == g_.output() && w.shape == g_.weight() && dx.shape == g_.input());
    prepare_scratch(crs_ * p_);
#pragma omp parallel
    {
      float* dcol = scratch_[static_cast<size_t>(omp_get_thread_num())].data();
#pragma omp for schedule(static)
      for (int64_t n = 0; n < g_.n; ++n) {
        gemm_tn(crs_, p_, g_.k, w.data, dy.data + n * g_.k * p_, dcol, false);
        col2im(dcol, dx.data + n * g_.c * g_.h * g_.w);
      }
    }
  }

  void backward_weights(ConstTensorView x, ConstTensorView dy, TensorView dw, TensorView db) override {
    TEPDIST_CHECK(x.shape == g_.input() && dy.shape == g_.output() && dw.shape == g_.weight());
    TEPDIST_CHECK(db.elements() == g_.k);
    // Each thread sums its samples into a private [dw | db] block; the blocks are added at the end.
    const int64_t partial = g_.k * crs_ + g_.k;
    prepare_scratch(crs_ * p_ + partial);
#pragma omp parallel
    {
      float* col = scratch_[static_cast<size_t>(omp_get_thread_num())].data();
      float* pdw = col + crs_ * p_;
      float* pdb = pdw + g_.k * crs_;
      for (int64_t i = 0; i < partial; ++i) pdw[i] = 0.0f;
#pragma omp for schedule(static)
      for (int64_t n = 0; n < g_.n; ++n) {
        im2col(x.data + n * g_.c * g_.h * g_.w, col);
        const float* dyn = dy.data + n * g_.k * p_;
        gemm_nt(g_.k, crs_, p_, dyn, col, pdw, true);
        for (int64_t k = 0; k < g_.k; ++k)
          for (int64_t p = 0; p < p_; ++p) pdb[k] += dyn[k * p_ + p];
      }
    }
    for (int64_t i = 0; i < dw.elements(); ++i) dw.data[i] = 0.0f;
    for (int64_t k = 0; k < g_.k; ++k) db.data[k] = 0.0f;
    for (const auto& block : scratch_) {
      const float* pdw = block.data() + crs_ * p_;
      for (int64_t i = 0; i < dw.elements(); ++i) dw.data[i] += pdw[i];
      for (int64_t k = 0; k < g_.k; ++k) db.data[k] += pdw[g_.k * crs_ + k];
    }
  }

 private:
  // One block per thread of the team that will run; all blocks take part in the final sums, so
  // there are exactly as many as threads.
  void prepare_scratch(int64_t floats) {
    scratch_.resize(static_cast<size_t>(omp_get_max_threads()));
    for (auto& block : scratch_) block.assign(static_cast<size_t>(floats), 0.0f);
  }

  /// col [c*r*s, oh*ow] from one sample's image [c, h, w]; zero where the patch hangs over the edge.
  void im2col(const float* image, float* col) const {
    const int64_t oh = g_.oh(), ow = g_.ow();
    for (int64_t c = 0; c < g_.c; ++c)
      for (int64_t r = 0; r < g_.r; ++r)
        for (int64_t s = 0; s < g_.s; ++s) {
          float* row = col + ((c * g_.r + r) * g_.s + s) * p_;
          for (int64_t y = 0; y < oh; ++y) {
            const int64_t iy = y * g_.stride + r - g_.pad;
            for (int64_t x = 0; x < ow; ++x) {
              const int64_t ix = x * g_.stride + s - g_.pad;
              const bool inside = iy >= 0 && iy < g_.h && ix >= 0 && ix < g_.w;
              row[y * ow + x] = inside ? image[(c * g_.h + iy) * g_.w + ix] : 0.0f;
            }
          }
        }
  }

  /// The adjoint of im2col: adds each column entry back onto the pixel it was read from.
  void col2im(const float* col, float* image) const {
    const int64_t oh = g_.oh(), ow = g_.ow();
    for (int64_t i = 0; i < g_.c * g_.h * g_.w; ++i) image[i] = 0.0f;
    for (int64_t c = 0; c < g_.c; ++c)
      for (int64_t r = 0; r < g_.r; ++r)
        for (int64_t s = 0; s < g_.s; ++s) {
          const float* row = col + ((c * g_.r + r) * g_.s + s) * p_;
          for (int64_t y = 0; y < oh; ++y) {
            const int64_t iy = y * g_.stride + r - g_.pad;
            if (iy < 0 || iy >= g_.h) continue;
            for (int64_t x = 0; x < ow; ++x) {
              const int64_t ix = x * g_.stride + s - g_.pad;
              if (ix >= 0 && ix < g_.w) image[(c * g_.h + iy) * g_.w + ix] += row[y * ow + x];
            }
          }
        }
  }

  Conv2dGeometry g_;
  int64_t crs_;  // rows of col: one per weight of an output channel
  int64_t p_;    // columns of col: one per output position
  std::vector<std::vector<float>> scratch_;
};

}  // namespace

std::unique_ptr<Conv2dKernel> make_conv2d(const Conv2dGeometry& g) { return std::make_unique<Conv2d>(g); }

}  // namespace tepdist::compute::ref

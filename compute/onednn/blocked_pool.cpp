// 2x2 max pooling on nChw8c (see blocked_pool.hpp).

#include "compute/onednn/blocked_pool.hpp"

#include <algorithm>

#include "compute/onednn/window_max.hpp"

namespace tepdist::compute::onednn {
namespace {

using window::kLanes;

TEPDIST_AVX2 void forward_plane(const Pool2dGeometry& g, const float* x, float* y, uint8_t* where) {
  const int64_t oh = g.oh(), ow = g.ow(), row = g.w * kLanes;
  for (int64_t r = 0; r < oh; ++r)
    for (int64_t c = 0; c < ow; ++c) {
      const float* p = x + (2 * r * g.w + 2 * c) * kLanes;
      const window::Pick m = window::window_max(_mm256_loadu_ps(p), _mm256_loadu_ps(p + kLanes),
                                                _mm256_loadu_ps(p + row), _mm256_loadu_ps(p + row + kLanes));
      const int64_t at = (r * ow + c) * kLanes;
      _mm256_storeu_ps(y + at, m.max);
      window::store_codes(where + at, m.code);
    }
}

TEPDIST_AVX2 void backward_plane(const Pool2dGeometry& g, const float* dy, const uint8_t* where, float* dx) {
  const int64_t oh = g.oh(), ow = g.ow(), row = g.w * kLanes;
  // A row or column past the last whole window (odd h or w) gets no gradient.
  if (g.h > 2 * oh) std::fill_n(dx + 2 * oh * row, (g.h - 2 * oh) * row, 0.0f);
  if (g.w > 2 * ow)
    for (int64_t i = 0; i < 2 * oh; ++i) std::fill_n(dx + i * row + 2 * ow * kLanes, (g.w - 2 * ow) * kLanes, 0.0f);
  for (int64_t r = 0; r < oh; ++r)
    for (int64_t c = 0; c < ow; ++c) {
      const int64_t at = (r * ow + c) * kLanes;
      const __m256 d = _mm256_loadu_ps(dy + at);
      const __m256i code = window::load_codes(where + at);
      float* p = dx + (2 * r * g.w + 2 * c) * kLanes;
      _mm256_storeu_ps(p, window::only_at(d, code, 0));
      _mm256_storeu_ps(p + kLanes, window::only_at(d, code, 1));
      _mm256_storeu_ps(p + row, window::only_at(d, code, 2));
      _mm256_storeu_ps(p + row + kLanes, window::only_at(d, code, 3));
    }
}

}  // namespace

bool BlockedMaxPool::supports(const Pool2dGeometry& g) {
  return g.kernel == 2 && g.stride == 2 && g.h >= 2 && g.w >= 2 && __builtin_cpu_supports("avx2") &&
         __builtin_cpu_supports("fma");
}

BlockedMaxPool::BlockedMaxPool(const Pool2dGeometry& g)
    : g_(g),
      planes_(g.n * ((g.c + kLanes - 1) / kLanes)),
      where_(static_cast<size_t>(planes_ * g.oh() * g.ow() * kLanes)) {}

void BlockedMaxPool::forward(const float* x, float* y) {
  const int64_t in = g_.h * g_.w * kLanes, out = g_.oh() * g_.ow() * kLanes;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < planes_; ++p) forward_plane(g_, x + p * in, y + p * out, where_.data() + p * out);
}

void BlockedMaxPool::backward(const float* dy, float* dx) {
  const int64_t in = g_.h * g_.w * kLanes, out = g_.oh() * g_.ow() * kLanes;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < planes_; ++p) backward_plane(g_, dy + p * out, where_.data() + p * out, dx + p * in);
}

}  // namespace tepdist::compute::onednn

// A convolution's weight and bias gradients on nChw8c (see conv_backward_weights.hpp).

#include "compute/onednn/conv_backward_weights.hpp"

#include <omp.h>

#include <algorithm>

#include "compute/onednn/window_max.hpp"

namespace tepdist::compute::onednn {
namespace {

using window::kLanes;

struct Args {
  const float* x;   // the sample's input at the tap's offset and the group's first channel block
  const float* dy;  // the sample's output gradient at the group's first output channel
  float* dw;        // this thread's sums at the tap, the first output channel and channel block
  int64_t oh, ow;   // output plane
  int64_t h, w;     // input plane
  int64_t cblocks;  // channel blocks (the sums' stride per output channel)
};

/// sums[k0 + j, block b] += sum over positions of dy[k0 + j, pos] * x[block b, pos + tap].
template <int NK, int NB>
TEPDIST_AVX2 void tile(const Args& a) {
  __m256 acc[NK][NB];
#pragma GCC unroll 4
  for (int j = 0; j < NK; ++j)
#pragma GCC unroll 3
    for (int b = 0; b < NB; ++b) acc[j][b] = _mm256_setzero_ps();
  const int64_t xplane = a.h * a.w * kLanes;
  for (int64_t oy = 0; oy < a.oh; ++oy) {
    const float* xr = a.x + oy * a.w * kLanes;
    const float* dr = a.dy + oy * a.ow * kLanes;
    for (int64_t ox = 0; ox < a.ow; ++ox) {
      __m256 xv[NB];
#pragma GCC unroll 3
      for (int b = 0; b < NB; ++b) xv[b] = _mm256_loadu_ps(xr + b * xplane + ox * kLanes);
#pragma GCC unroll 4
      for (int j = 0; j < NK; ++j) {
        const __m256 d = _mm256_broadcast_ss(dr + ox * kLanes + j);
#pragma GCC unroll 3
        for (int b = 0; b < NB; ++b) acc[j][b] = _mm256_fmadd_ps(d, xv[b], acc[j][b]);
      }
    }
  }
  window::add_tile(acc, a.dw, a.cblocks * kLanes, kLanes);
}

template <int NB>
void channels(const Args& a, int64_t nk) {
  switch (nk) {
    case 4: return tile<4, NB>(a);
    case 3: return tile<3, NB>(a);
    case 2: return tile<2, NB>(a);
    default: return tile<1, NB>(a);
  }
}

/// db[k] += sum over positions of dy[k, pos], 8 output channels per vector.
TEPDIST_AVX2 void bias_sums(const float* dy, int64_t positions, int64_t kblocks, float* db) {
  for (int64_t kb = 0; kb < kblocks; ++kb) {
    __m256 s = _mm256_loadu_ps(db + kb * kLanes);
    const float* d = dy + kb * positions * kLanes;
    for (int64_t p = 0; p < positions; ++p) s = _mm256_add_ps(s, _mm256_loadu_ps(d + p * kLanes));
    _mm256_storeu_ps(db + kb * kLanes, s);
  }
}

}  // namespace

bool ConvBackwardWeights::supports(const Conv2dGeometry& g) {
  return g.stride == 1 && g.pad == 0 && g.oh() >= 1 && g.ow() >= 1 && __builtin_cpu_supports("avx2") &&
         __builtin_cpu_supports("fma");
}

ConvBackwardWeights::ConvBackwardWeights(const Conv2dGeometry& g)
    : g_(g), cblocks_((g.c + kLanes - 1) / kLanes), kblocks_((g.k + kLanes - 1) / kLanes) {}

void ConvBackwardWeights::run(const float* x, const float* dy, float* dw, float* db) {
  const int64_t taps = g_.r * g_.s, oh = g_.oh(), ow = g_.ow();
  const size_t wsums = static_cast<size_t>(taps * g_.k * cblocks_ * kLanes), need = wsums + static_cast<size_t>(kblocks_ * kLanes);
  sums_.resize(static_cast<size_t>(std::max(omp_get_max_threads(), 1)));
  for (auto& s : sums_) s.assign(need, 0.0f);
  const int64_t in = cblocks_ * g_.h * g_.w * kLanes, out = kblocks_ * oh * ow * kLanes;
#pragma omp parallel
  {
    float* mine = sums_[static_cast<size_t>(omp_get_thread_num())].data();
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g_.n; ++n) {
      const float* xs = x + n * in;
      const float* dys = dy + n * out;
      bias_sums(dys, oh * ow, kblocks_, mine + wsums);
      for (int64_t t = 0; t < taps; ++t) {
        const int64_t kh = t / g_.s, kw = t % g_.s;
        for (int64_t k0 = 0; k0 < g_.k; k0 += 4) {
          // Groups of 4 output channels never straddle a block of 8.
          const int64_t nk = std::min<int64_t>(4, g_.k - k0);
          for (int64_t b0 = 0; b0 < cblocks_; b0 += 3) {
            const int64_t nb = std::min<int64_t>(3, cblocks_ - b0);
            const Args a{xs + b0 * g_.h * g_.w * kLanes + (kh * g_.w + kw) * kLanes,
                         dys + (k0 / kLanes) * oh * ow * kLanes + k0 % kLanes,
                         mine + ((t * g_.k + k0) * cblocks_ + b0) * kLanes,
                         oh,
                         ow,
                         g_.h,
                         g_.w,
                         cblocks_};
            if (nb == 3) channels<3>(a, nk);
            else if (nb == 2) channels<2>(a, nk);
            else channels<1>(a, nk);
          }
        }
      }
    }
  }
  // Add up the threads' sums (into the first's), then unpack them into the plain [k, c, r, s] and
  // [k] gradients.
  std::vector<float>& total = sums_.front();
  for (size_t i = 1; i < sums_.size(); ++i)
    for (size_t j = 0; j < need; ++j) total[j] += sums_[i][j];
  for (int64_t t = 0; t < taps; ++t)
    for (int64_t k = 0; k < g_.k; ++k)
      for (int64_t c = 0; c < g_.c; ++c)
        dw[(k * g_.c + c) * taps + t] = total[static_cast<size_t>(((t * g_.k + k) * cblocks_ + c / kLanes) * kLanes + c % kLanes)];
  for (int64_t k = 0; k < g_.k; ++k) db[k] = total[wsums + static_cast<size_t>(k)];
}

}  // namespace tepdist::compute::onednn

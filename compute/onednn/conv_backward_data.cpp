// A convolution's input gradient on nChw8c (see conv_backward_data.hpp).

#include "compute/onednn/conv_backward_data.hpp"

#include <algorithm>

#include "compute/onednn/window_max.hpp"

namespace tepdist::compute::onednn {
namespace {

using window::kLanes;

struct Args {
  const float* dy;  // the sample's output gradient
  const float* w;   // packed weights at the tap and the group's first channel block
  float* dx;        // the sample's input gradient at the tap's offset and the group's first block
  int64_t k;        // output channels
  int64_t oh, ow;   // output gradient plane
  int64_t h, w_in;  // input gradient plane
  int64_t cblocks;  // channel blocks in the packed weights (their stride per output channel)
};

/// Adds, for NP output positions from (oy, ox) and NB channel blocks, sum over k of
/// dy[k, oy, ox + j] * w[k, tap, block] into dx at (oy, ox + j) shifted by the tap.
template <int NP, int NB>
TEPDIST_AVX2 void tile(const Args& a, int64_t oy, int64_t ox) {
  __m256 acc[NP][NB];
#pragma GCC unroll 4
  for (int j = 0; j < NP; ++j)
#pragma GCC unroll 3
    for (int b = 0; b < NB; ++b) acc[j][b] = _mm256_setzero_ps();
  const int64_t plane = a.oh * a.ow * kLanes, wstride = a.cblocks * kLanes;
  const float* d = a.dy + (oy * a.ow + ox) * kLanes;
  const float* wk = a.w;
  for (int64_t k0 = 0; k0 < a.k; k0 += kLanes, d += plane) {
    const int64_t lanes = std::min<int64_t>(kLanes, a.k - k0);
    for (int64_t l = 0; l < lanes; ++l, wk += wstride) {
      __m256 wv[NB];
#pragma GCC unroll 3
      for (int b = 0; b < NB; ++b) wv[b] = _mm256_loadu_ps(wk + b * kLanes);
#pragma GCC unroll 4
      for (int j = 0; j < NP; ++j) {
        const __m256 dv = _mm256_broadcast_ss(d + j * kLanes + l);
#pragma GCC unroll 3
        for (int b = 0; b < NB; ++b) acc[j][b] = _mm256_fmadd_ps(dv, wv[b], acc[j][b]);
      }
    }
  }
  window::add_tile(acc, a.dx + (oy * a.w_in + ox) * kLanes, kLanes, a.h * a.w_in * kLanes);
}

template <int NB>
void row(const Args& a, int64_t oy) {
  int64_t ox = 0;
  for (; ox + 4 <= a.ow; ox += 4) tile<4, NB>(a, oy, ox);
  switch (a.ow - ox) {
    case 3: tile<3, NB>(a, oy, ox); break;
    case 2: tile<2, NB>(a, oy, ox); break;
    case 1: tile<1, NB>(a, oy, ox); break;
    default: break;
  }
}

}  // namespace

bool ConvBackwardData::supports(const Conv2dGeometry& g) {
  return g.stride == 1 && g.pad == 0 && g.oh() >= 1 && g.ow() >= 1 && __builtin_cpu_supports("avx2") &&
         __builtin_cpu_supports("fma");
}

ConvBackwardData::ConvBackwardData(const Conv2dGeometry& g)
    : g_(g),
      cblocks_((g.c + kLanes - 1) / kLanes),
      kblocks_((g.k + kLanes - 1) / kLanes),
      wpk_(static_cast<size_t>(g.r * g.s * g.k * cblocks_ * kLanes), 0.0f) {}

void ConvBackwardData::run(const float* dy, const float* w, float* dx) {
  const int64_t taps = g_.r * g_.s, cpad = cblocks_ * kLanes;
  // [k, c, r, s] -> [tap][k][c padded to blocks of 8]
  for (int64_t k = 0; k < g_.k; ++k)
    for (int64_t c = 0; c < g_.c; ++c)
      for (int64_t t = 0; t < taps; ++t)
        wpk_[static_cast<size_t>((t * g_.k + k) * cpad + c)] = w[(k * g_.c + c) * taps + t];
  const int64_t in = cblocks_ * g_.h * g_.w * kLanes, out = kblocks_ * g_.oh() * g_.ow() * kLanes;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < g_.n; ++n) {
    float* dxs = dx + n * in;
    std::fill_n(dxs, in, 0.0f);
    for (int64_t b0 = 0; b0 < cblocks_; b0 += 3) {
      const int64_t nb = std::min<int64_t>(3, cblocks_ - b0);
      for (int64_t kh = 0; kh < g_.r; ++kh)
        for (int64_t kw = 0; kw < g_.s; ++kw) {
          const Args a{dy + n * out,
                       wpk_.data() + ((kh * g_.s + kw) * g_.k * cblocks_ + b0) * kLanes,
                       dxs + b0 * g_.h * g_.w * kLanes + (kh * g_.w + kw) * kLanes,
                       g_.k,
                       g_.oh(),
                       g_.ow(),
                       g_.h,
                       g_.w,
                       cblocks_};
          for (int64_t oy = 0; oy < g_.oh(); ++oy) {
            if (nb == 3) row<3>(a, oy);
            else if (nb == 2) row<2>(a, oy);
            else row<1>(a, oy);
          }
        }
    }
  }
}

}  // namespace tepdist::compute::onednn

// The fused first convolution, 2x2 max pool and ReLU (see first_conv.hpp).
//
// Register blocking, forward: for one pooled output and up to three blocks of 8 channels, the
// four convolution outputs of its window are 12 accumulators; each kernel tap broadcasts four
// input pixels and loads one weight vector per block (7 loads for 12 FMAs). Backward: the dense
// gradient of the convolution output (zero except at each window's maximum) is rebuilt per sample
// and channel group, then the weight gradient is a reduction over output positions with four taps
// times up to three blocks in registers.
//
// The kernels are compiled for AVX2 and FMA by function attributes (TEPDIST_AVX2), not a global
// -mavx2, and supports() checks the CPU before a plan uses them.

#include "compute/onednn/first_conv.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "compute/onednn/window_max.hpp"

namespace tepdist::compute::onednn {
namespace {

using window::kLanes;

/// One sample's input plane, zero-padded when pad > 0 (into `buffer`), else the input itself.
const float* padded_plane(const Conv2dGeometry& g, const float* x, int64_t n, float* buffer) {
  const float* plane = x + n * g.h * g.w;
  if (g.pad == 0) return plane;
  const int64_t wp = g.w + 2 * g.pad, hp = g.h + 2 * g.pad;
  std::fill_n(buffer, hp * wp, 0.0f);
  for (int64_t i = 0; i < g.h; ++i) std::copy_n(plane + i * g.w, g.w, buffer + (i + g.pad) * wp + g.pad);
  return buffer;
}

struct ForwardArgs {
  const float* x;      // the sample's (padded) plane
  int64_t wp;          // its row length
  int64_t r, s;        // kernel
  const float* w;      // packed weights of the group's first block, [r][s][8] per block
  const float* b;      // packed bias of the group's first block
  int64_t ph, pw;
  float* y;            // the sample's output at the group's first block
  uint8_t* where;      // likewise for the window positions
};

/// acc[b] += x * w[b] for every block b.
template <int NB>
TEPDIST_AVX2 inline void fma_all(__m256* acc, __m256 x, const __m256* w) {
#pragma GCC unroll 3
  for (int b = 0; b < NB; ++b) acc[b] = _mm256_fmadd_ps(x, w[b], acc[b]);
}

template <int NB>
TEPDIST_AVX2 void forward_group(const ForwardArgs& a) {
  const int64_t wstride = a.r * a.s * kLanes, ystride = a.ph * a.pw * kLanes;
  for (int64_t pr = 0; pr < a.ph; ++pr)
    for (int64_t pc = 0; pc < a.pw; ++pc) {
      __m256 c00[NB], c01[NB], c10[NB], c11[NB];  // the window's four convolution outputs
#pragma GCC unroll 3
      for (int b = 0; b < NB; ++b) c00[b] = c01[b] = c10[b] = c11[b] = _mm256_loadu_ps(a.b + b * kLanes);
      const float* corner = a.x + 2 * pr * a.wp + 2 * pc;
      for (int64_t kh = 0; kh < a.r; ++kh) {
        const float* row = corner + kh * a.wp;
        const float* wrow = a.w + kh * a.s * kLanes;
        for (int64_t kw = 0; kw < a.s; ++kw) {
          // 12 accumulators, 3 weight vectors and one pixel at a time: all 16 registers, no spill
          __m256 wv[NB];
#pragma GCC unroll 3
          for (int b = 0; b < NB; ++b) wv[b] = _mm256_loadu_ps(wrow + b * wstride + kw * kLanes);
          fma_all<NB>(c00, _mm256_broadcast_ss(row + kw), wv);
          fma_all<NB>(c01, _mm256_broadcast_ss(row + kw + 1), wv);
          fma_all<NB>(c10, _mm256_broadcast_ss(row + a.wp + kw), wv);
          fma_all<NB>(c11, _mm256_broadcast_ss(row + a.wp + kw + 1), wv);
        }
      }
      const int64_t at = (pr * a.pw + pc) * kLanes;
      for (int b = 0; b < NB; ++b) {
        const window::Pick p = window::window_max_before_relu(c00[b], c01[b], c10[b], c11[b]);
        // _mm256_max_ps(a, b) returns b where either is NaN: max(0, m) keeps a NaN m, as the
        // reference's ReLU does, where max(m, 0) (oneDNN's ReLU) would make it 0.
        _mm256_storeu_ps(a.y + b * ystride + at, _mm256_max_ps(_mm256_setzero_ps(), p.max));
        window::store_codes(a.where + b * ystride + at, p.code);
      }
    }
}

struct BackwardArgs {
  const float* x;        // the sample's (padded) plane
  int64_t wp;
  int64_t r, s;
  const float* y;        // the sample's output, its gradient and the window positions, at the
  const float* dy;       // group's first block
  const uint8_t* where;
  int64_t ph, pw;
  float* dense;          // scratch: [2 ph][2 pw][NB][8]
  float* dw;             // this thread's packed weight-gradient sums at the group's first block
  float* db;             // and bias sums
};

/// Scatters the pooled, ReLU-masked gradient to the window positions of the maxima: the gradient
/// of the convolution output over the 2 ph x 2 pw positions the windows cover.
template <int NB>
TEPDIST_AVX2 void dense_gradient(const BackwardArgs& a) {
  const int64_t ystride = a.ph * a.pw * kLanes, ow2 = 2 * a.pw;
  __m256 bias[NB];
  for (int b = 0; b < NB; ++b) bias[b] = _mm256_loadu_ps(a.db + b * kLanes);
  for (int64_t pr = 0; pr < a.ph; ++pr)
    for (int64_t pc = 0; pc < a.pw; ++pc) {
      const int64_t at = (pr * a.pw + pc) * kLanes;
      for (int b = 0; b < NB; ++b) {
        const __m256 alive = _mm256_cmp_ps(_mm256_loadu_ps(a.y + b * ystride + at), _mm256_setzero_ps(), _CMP_GT_OQ);
        const __m256 d = _mm256_and_ps(_mm256_loadu_ps(a.dy + b * ystride + at), alive);
        bias[b] = _mm256_add_ps(bias[b], d);
        const __m256i code = window::load_codes(a.where + b * ystride + at);
        for (int q = 0; q < 4; ++q) {
          const int64_t oy = 2 * pr + q / 2, ox = 2 * pc + q % 2;
          _mm256_storeu_ps(a.dense + ((oy * ow2 + ox) * NB + b) * kLanes, window::only_at(d, code, q));
        }
      }
    }
  for (int b = 0; b < NB; ++b) _mm256_storeu_ps(a.db + b * kLanes, bias[b]);
}

/// Adds sum over positions of x[position + tap] * dense[position] for NT taps from `first`.
template <int NB, int NT>
TEPDIST_AVX2 void weight_taps(const BackwardArgs& a, int64_t first) {
  const int64_t oh2 = 2 * a.ph, ow2 = 2 * a.pw, taps = a.r * a.s;
  int64_t offset[NT];
  for (int j = 0; j < NT; ++j) offset[j] = (first + j) / a.s * a.wp + (first + j) % a.s;
  __m256 acc[NT][NB];
#pragma GCC unroll 4
  for (int j = 0; j < NT; ++j)
#pragma GCC unroll 3
    for (int b = 0; b < NB; ++b) acc[j][b] = _mm256_setzero_ps();
  for (int64_t oy = 0; oy < oh2; ++oy) {
    const float* xrow = a.x + oy * a.wp;
    const float* grow = a.dense + oy * ow2 * NB * kLanes;
    for (int64_t ox = 0; ox < ow2; ++ox) {
      __m256 g[NB];
#pragma GCC unroll 3
      for (int b = 0; b < NB; ++b) g[b] = _mm256_loadu_ps(grow + (ox * NB + b) * kLanes);
#pragma GCC unroll 4
      for (int j = 0; j < NT; ++j) {
        const __m256 xv = _mm256_broadcast_ss(xrow + ox + offset[j]);
#pragma GCC unroll 3
        for (int b = 0; b < NB; ++b) acc[j][b] = _mm256_fmadd_ps(xv, g[b], acc[j][b]);
      }
    }
  }
  window::add_tile(acc, a.dw + first * kLanes, kLanes, taps * kLanes);  // the sums are [block][tap][8]
}

template <int NB>
TEPDIST_AVX2 void backward_group(const BackwardArgs& a) {
  dense_gradient<NB>(a);
  const int64_t taps = a.r * a.s;
  int64_t t = 0;
  for (; t + 4 <= taps; t += 4) weight_taps<NB, 4>(a, t);
  switch (taps - t) {
    case 3: weight_taps<NB, 3>(a, t); break;
    case 2: weight_taps<NB, 2>(a, t); break;
    case 1: weight_taps<NB, 1>(a, t); break;
    default: break;
  }
}

/// Runs fn<NB>(block0, NB) over the channel blocks in groups of at most three.
template <class Fn>
void for_each_group(int64_t blocks, Fn&& fn) {
  for (int64_t b0 = 0; b0 < blocks; b0 += 3) fn(b0, std::min<int64_t>(3, blocks - b0));
}

}  // namespace

bool FirstConvPool::supports(const Conv2dGeometry& conv, const Pool2dGeometry& pool) {
  return conv.c == 1 && conv.stride == 1 && pool.kernel == 2 && pool.stride == 2 && pool.c == conv.k &&
         pool.h == conv.oh() && pool.w == conv.ow() && conv.oh() >= 2 && conv.ow() >= 2 &&
         __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

FirstConvPool::FirstConvPool(const Conv2dGeometry& conv)
    : g_(conv),
      blocks_((conv.k + kLanes - 1) / kLanes),
      oh_(conv.oh()),
      ow_(conv.ow()),
      ph_(oh_ / 2),
      pw_(ow_ / 2),
      hp_(conv.h + 2 * conv.pad),
      wp_(conv.w + 2 * conv.pad),
      wpk_(static_cast<size_t>(blocks_ * conv.r * conv.s * kLanes), 0.0f),
      bpk_(static_cast<size_t>(blocks_ * kLanes), 0.0f),
      where_(static_cast<size_t>(conv.n * blocks_ * ph_ * pw_ * kLanes)) {}

void FirstConvPool::forward(const float* x, const float* w, const float* b, float* y) {
  const int64_t taps = g_.r * g_.s;
  for (int64_t oc = 0; oc < g_.k; ++oc) {
    const int64_t block = oc / kLanes, lane = oc % kLanes;
    for (int64_t t = 0; t < taps; ++t) wpk_[static_cast<size_t>((block * taps + t) * kLanes + lane)] = w[oc * taps + t];
    bpk_[static_cast<size_t>(block * kLanes + lane)] = b[oc];
  }
  const size_t plane = static_cast<size_t>(hp_ * wp_);
  scratch_.resize(static_cast<size_t>(std::max(omp_get_max_threads(), 1)));
  const int64_t sample = blocks_ * ph_ * pw_ * kLanes;
#pragma omp parallel
  {
    std::vector<float>& mine = scratch_[static_cast<size_t>(omp_get_thread_num())];
    if (mine.size() < plane) mine.resize(plane);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g_.n; ++n) {
      const float* xs = padded_plane(g_, x, n, mine.data());
      for_each_group(blocks_, [&](int64_t b0, int64_t nb) {
        const ForwardArgs a{xs, wp_, g_.r, g_.s, wpk_.data() + b0 * taps * kLanes, bpk_.data() + b0 * kLanes,
                            ph_, pw_, y + n * sample + b0 * ph_ * pw_ * kLanes,
                            where_.data() + n * sample + b0 * ph_ * pw_ * kLanes};
        if (nb == 3) forward_group<3>(a);
        else if (nb == 2) forward_group<2>(a);
        else forward_group<1>(a);
      });
    }
  }
}

void FirstConvPool::backward(const float* x, const float* y, const float* dy, float* dw, float* db) {
  const int64_t taps = g_.r * g_.s;
  const size_t plane = static_cast<size_t>(hp_ * wp_), dense = static_cast<size_t>(4 * ph_ * pw_ * 3 * kLanes),
               wsums = static_cast<size_t>(blocks_ * taps * kLanes), bsums = static_cast<size_t>(blocks_ * kLanes);
  const size_t need = plane + dense + wsums + bsums;
  scratch_.resize(static_cast<size_t>(std::max(omp_get_max_threads(), 1)));
  for (auto& s : scratch_) {
    if (s.size() < need) s.resize(need);
    std::fill_n(s.data() + plane + dense, wsums + bsums, 0.0f);
  }
  const int64_t sample = blocks_ * ph_ * pw_ * kLanes;
#pragma omp parallel
  {
    float* mine = scratch_[static_cast<size_t>(omp_get_thread_num())].data();
    float* wsum = mine + plane + dense;
    float* bsum = wsum + wsums;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g_.n; ++n) {
      const float* xs = padded_plane(g_, x, n, mine);
      for_each_group(blocks_, [&](int64_t b0, int64_t nb) {
        const int64_t at = n * sample + b0 * ph_ * pw_ * kLanes;
        const BackwardArgs a{xs,           wp_,           g_.r, g_.s, y + at, dy + at, where_.data() + at, ph_, pw_,
                             mine + plane, wsum + b0 * taps * kLanes, bsum + b0 * kLanes};
        if (nb == 3) backward_group<3>(a);
        else if (nb == 2) backward_group<2>(a);
        else backward_group<1>(a);
      });
    }
  }
  // Sum the threads' partial sums and unpack them into the plain [k, 1, r, s] and [k] layouts.
  for (int64_t oc = 0; oc < g_.k; ++oc) {
    const int64_t block = oc / kLanes, lane = oc % kLanes;
    for (int64_t t = 0; t < taps; ++t) {
      float sum = 0.0f;
      for (const auto& s : scratch_) sum += s[plane + dense + static_cast<size_t>((block * taps + t) * kLanes + lane)];
      dw[oc * taps + t] = sum;
    }
    float sum = 0.0f;
    for (const auto& s : scratch_) sum += s[plane + dense + wsums + static_cast<size_t>(block * kLanes + lane)];
    db[oc] = sum;
  }
}

}  // namespace tepdist::compute::onednn

// The direct AVX2 kernels of the oneDNN plans (compute/onednn/first_conv.hpp, blocked_pool.hpp,
// conv_backward_data.hpp, conv_backward_weights.hpp)
// against the reference, on LeNet's shapes and on ones that exercise every code path: channel
// counts that are not a multiple of 8 and that need one, two and three blocks per group, padding,
// odd convolution outputs (a row and a column no window covers), kernel sizes whose tap count is
// not a multiple of 4, and inputs full of ties (the first maximum must win, as in the reference).
//
// On a CPU without AVX2 the kernels are never planned; these tests then check only that.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "compute/onednn/blocked_pool.hpp"
#include "compute/onednn/conv_backward_data.hpp"
#include "compute/onednn/conv_backward_weights.hpp"
#include "compute/onednn/first_conv.hpp"
#include "compute/ref/ref_backend.hpp"
#include "compute/rng.hpp"
#include "compute/tensor.hpp"

using namespace tepdist::compute;
using tepdist::compute::onednn::BlockedMaxPool;
using tepdist::compute::onednn::ConvBackwardData;
using tepdist::compute::onednn::ConvBackwardWeights;
using tepdist::compute::onednn::FirstConvPool;

namespace {

constexpr int64_t kLanes = 8;

/// Values in [-1, 1), or small integers (many equal values, exact sums) when `ties`.
Tensor random_tensor(Shape s, uint64_t seed, bool ties) {
  Tensor t(s);
  Rng r(seed);
  for (float& v : t.span()) v = ties ? static_cast<float>(r.below(3)) - 1.0f : r.uniform(-1.0f, 1.0f);
  return t;
}

int64_t blocks(int64_t c) { return (c + kLanes - 1) / kLanes; }

bool cpu_has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

/// Whether a convolution gradient kernel runs here: with AVX2 it must take `g` and decline its
/// strided and padded variants; without, decline `g` (and the test has nothing to compare).
template <class Kernel>
bool takes_only_stride_1_unpadded(const Conv2dGeometry& g) {
  if (!cpu_has_avx2()) {
    CHECK_FALSE(Kernel::supports(g));
    WARN("no AVX2 and FMA on this CPU: the direct kernel is not used, nothing to compare");
    return false;
  }
  REQUIRE(Kernel::supports(g));
  CHECK_FALSE(Kernel::supports(Conv2dGeometry{g.n, g.c, g.h, g.w, g.k, g.r, g.s, 2, 0}));
  CHECK_FALSE(Kernel::supports(Conv2dGeometry{g.n, g.c, g.h, g.w, g.k, g.r, g.s, 1, 1}));
  return true;
}

/// [n, c, h, w] -> nChw8c, channels past c set to `pad_value`.
std::vector<float> to_blocked(const Tensor& t, float pad_value = 0.0f) {
  const auto& d = t.shape().dims();
  const int64_t n = d[0], c = d[1], hw = d[2] * d[3];
  std::vector<float> out(static_cast<size_t>(n * blocks(c) * hw * kLanes), pad_value);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < hw; ++p)
        out[static_cast<size_t>(((i * blocks(c) + ch / kLanes) * hw + p) * kLanes + ch % kLanes)] =
            t.data()[(i * c + ch) * hw + p];
  return out;
}

/// nChw8c -> [n, c, h, w]; `padding` receives the values of the channels past c.
Tensor from_blocked(const std::vector<float>& b, Shape s, std::vector<float>* padding = nullptr) {
  Tensor t(s);
  const auto& d = s.dims();
  const int64_t n = d[0], c = d[1], hw = d[2] * d[3];
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < blocks(c) * kLanes; ++ch)
      for (int64_t p = 0; p < hw; ++p) {
        const float v = b[static_cast<size_t>(((i * blocks(c) + ch / kLanes) * hw + p) * kLanes + ch % kLanes)];
        if (ch < c) t.data()[(i * c + ch) * hw + p] = v;
        else if (padding) padding->push_back(v);
      }
  return t;
}

void require_close(const Tensor& got, const Tensor& want, double tolerance) {
  REQUIRE(got.shape() == want.shape());
  double worst = 0.0;
  int64_t worst_at = 0;
  for (int64_t i = 0; i < got.elements(); ++i) {
    double excess = std::abs(got[i] - want[i]) - tolerance * (1.0 + std::abs(want[i]));
    if (std::isnan(excess)) excess = INFINITY;  // an output never written keeps its NaN fill
    if (excess > worst) worst = excess, worst_at = i;
  }
  INFO("worst element " << worst_at << ": direct " << got[worst_at] << ", ref " << want[worst_at]);
  CHECK(worst == 0.0);
}

/// NaN exactly where `want` is NaN, and within `tolerance` of it elsewhere.
void require_nan_alike(const Tensor& got, const Tensor& want, double tolerance) {
  REQUIRE(got.shape() == want.shape());
  int64_t wrong = 0, first_wrong = -1;
  for (int64_t i = 0; i < got.elements(); ++i) {
    const bool nan = std::isnan(want[i]);
    if (nan != std::isnan(got[i]) || (!nan && std::abs(got[i] - want[i]) > tolerance * (1.0 + std::abs(want[i])))) {
      if (wrong++ == 0) first_wrong = i;
    }
  }
  INFO(wrong << " elements differ, the first at " << first_wrong << ": direct "
             << (first_wrong >= 0 ? got[first_wrong] : 0.0f) << ", ref "
             << (first_wrong >= 0 ? want[first_wrong] : 0.0f));
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("the fused first convolution, pool and relu agree with the reference", "[compute][onednn][direct]") {
  const Conv2dGeometry g = GENERATE(Conv2dGeometry{8, 1, 28, 28, 20, 5, 5, 1, 0},  // LeNet conv1: one group of 3
                                    Conv2dGeometry{3, 1, 9, 11, 13, 3, 3, 1, 1},   // 2 blocks, padded, odd output
                                    Conv2dGeometry{2, 1, 10, 10, 30, 4, 2, 1, 0},  // 4 blocks: 3 + 1, 8 taps
                                    Conv2dGeometry{2, 1, 6, 7, 4, 2, 3, 1, 2},     // 1 partial block, wide pad
                                    Conv2dGeometry{2, 1, 9, 12, 16, 3, 5, 1, 0});  // 2 whole blocks, 15 taps
  const bool ties = GENERATE(false, true);
  const Pool2dGeometry p{g.n, g.k, g.oh(), g.ow(), 2, 2};
  CAPTURE(g.k, g.h, g.w, g.r, g.s, g.pad, ties);
  if (!cpu_has_avx2()) {
    CHECK_FALSE(FirstConvPool::supports(g, p));
    WARN("no AVX2 and FMA on this CPU: the fused kernel is not used, nothing to compare");
    return;
  }
  REQUIRE(FirstConvPool::supports(g, p));
  const Conv2dGeometry rgb{g.n, 3, g.h, g.w, g.k, g.r, g.s, 1, g.pad};
  CHECK_FALSE(FirstConvPool::supports(rgb, Pool2dGeometry{g.n, g.k, rgb.oh(), rgb.ow(), 2, 2}));  // 3 input channels
  CHECK_FALSE(FirstConvPool::supports(g, Pool2dGeometry{g.n, g.k, g.oh(), g.ow(), 3, 2}));

  const Tensor x = random_tensor(g.input(), 1, ties), w = random_tensor(g.weight(), 2, ties),
               b = random_tensor({g.k}, 3, ties), dout = random_tensor(p.output(), 4, false);
  // The reference: conv -> pool -> relu, and back.
  auto ref = make_ref_backend();
  auto conv = ref->make_conv2d(g);
  auto pool = ref->make_max_pool2d(p);
  Tensor c(g.output()), pooled(p.output()), want(p.output());
  conv->forward(x, w, b, c);
  pool->forward(c, pooled);
  ref->relu_forward(pooled, want);
  Tensor dpooled(p.output()), dc(g.output()), want_dw(g.weight()), want_db({g.k});
  ref->relu_backward(want, dout, dpooled);
  pool->backward(dpooled, dc);
  conv->backward_weights(x, dc, want_dw, want_db);

  FirstConvPool fused(g);
  REQUIRE(fused.blocks() == blocks(g.k));
  std::vector<float> y(static_cast<size_t>(g.n * blocks(g.k) * p.oh() * p.ow() * kLanes), NAN);
  fused.forward(x.data(), w.data(), b.data(), y.data());
  std::vector<float> padding;
  require_close(from_blocked(y, p.output(), &padding), want, ties ? 0.0 : 1e-5);
  for (float v : padding) CHECK(v == 0.0f);  // the next layer reads the padded channels as zeros

  Tensor dw(g.weight()), db({g.k});
  fused.backward(x.data(), y.data(), to_blocked(dout, NAN).data(), dw.data(), db.data());
  require_close(dw, want_dw, 1e-4);
  require_close(db, want_db, 1e-4);

  // A second step with other weights: the kernel repacks them and overwrites the gradients.
  const Tensor w2 = random_tensor(g.weight(), 7, ties);
  conv->forward(x, w2, b, c);
  pool->forward(c, pooled);
  ref->relu_forward(pooled, want);
  fused.forward(x.data(), w2.data(), b.data(), y.data());
  require_close(from_blocked(y, p.output()), want, ties ? 0.0 : 1e-5);
  ref->relu_backward(want, dout, dpooled);
  pool->backward(dpooled, dc);
  conv->backward_weights(x, dc, want_dw, want_db);
  fused.backward(x.data(), y.data(), to_blocked(dout, NAN).data(), dw.data(), db.data());
  require_close(dw, want_dw, 1e-4);
  require_close(db, want_db, 1e-4);
}

TEST_CASE("the blocked 2x2 max pool agrees with the reference", "[compute][onednn][direct]") {
  const Pool2dGeometry g = GENERATE(Pool2dGeometry{8, 50, 8, 8, 2, 2},  // LeNet's second pool
                                    Pool2dGeometry{3, 5, 7, 9, 2, 2});  // a partial block, odd sides
  const bool ties = GENERATE(false, true);
  CAPTURE(g.c, g.h, g.w, ties);
  if (!cpu_has_avx2()) {
    CHECK_FALSE(BlockedMaxPool::supports(g));
    WARN("no AVX2 and FMA on this CPU: the blocked pool is not used, nothing to compare");
    return;
  }
  REQUIRE(BlockedMaxPool::supports(g));
  CHECK_FALSE(BlockedMaxPool::supports(Pool2dGeometry{1, 8, 7, 7, 3, 2}));

  const Tensor x = random_tensor(g.input(), 11, ties), dy = random_tensor(g.output(), 12, false);
  auto ref = make_ref_backend();
  auto pool = ref->make_max_pool2d(g);
  Tensor want(g.output()), want_dx(g.input());
  pool->forward(x, want);
  pool->backward(dy, want_dx);

  BlockedMaxPool blocked(g);
  std::vector<float> y(static_cast<size_t>(g.n * blocks(g.c) * g.oh() * g.ow() * kLanes), NAN);
  blocked.forward(to_blocked(x).data(), y.data());
  require_close(from_blocked(y, g.output()), want, 0.0);  // a maximum is picked, not computed: exact
  std::vector<float> dx(static_cast<size_t>(g.n * blocks(g.c) * g.h * g.w * kLanes), NAN);
  blocked.backward(to_blocked(dy).data(), dx.data());
  require_close(from_blocked(dx, g.input()), want_dx, 0.0);  // each place gets one gradient or none
}

TEST_CASE("the direct convolution input gradient agrees with the reference", "[compute][onednn][direct]") {
  const Conv2dGeometry g = GENERATE(Conv2dGeometry{8, 20, 12, 12, 50, 5, 5, 1, 0},  // LeNet conv2
                                    Conv2dGeometry{2, 13, 9, 7, 11, 3, 3, 1, 0},    // 2 blocks, rows of 4 + 1
                                    Conv2dGeometry{3, 30, 6, 9, 9, 2, 4, 1, 0},     // 4 blocks: 3 + 1, rows of 4 + 2
                                    Conv2dGeometry{1, 8, 5, 7, 16, 1, 1, 1, 0},     // 1x1, rows of 4 + 3
                                    Conv2dGeometry{2, 3, 4, 4, 5, 4, 4, 1, 0});     // one output position
  CAPTURE(g.c, g.k, g.h, g.w, g.r, g.s);
  if (!takes_only_stride_1_unpadded<ConvBackwardData>(g)) return;

  auto ref = make_ref_backend();
  auto conv = ref->make_conv2d(g);
  ConvBackwardData direct(g);
  for (uint64_t seed : {21u, 22u}) {  // twice: the weights are repacked, dx overwritten
    const Tensor w = random_tensor(g.weight(), seed, false), dy = random_tensor(g.output(), seed + 10, false);
    Tensor want(g.input());
    conv->backward_data(dy, w, want);
    std::vector<float> dx(static_cast<size_t>(g.n * blocks(g.c) * g.h * g.w * kLanes), NAN);
    direct.run(to_blocked(dy, NAN).data(), w.data(), dx.data());  // padded channels of dy: not read
    std::vector<float> padding;
    require_close(from_blocked(dx, g.input(), &padding), want, 1e-4);
    for (float v : padding) CHECK(v == 0.0f);
  }
}

TEST_CASE("the direct convolution weight gradient agrees with the reference", "[compute][onednn][direct]") {
  const Conv2dGeometry g = GENERATE(Conv2dGeometry{8, 20, 12, 12, 50, 5, 5, 1, 0},  // LeNet conv2: 4 x 12 + 2
                                    Conv2dGeometry{2, 13, 9, 7, 11, 3, 3, 1, 0},    // 2 blocks, k 4 + 4 + 3
                                    Conv2dGeometry{3, 30, 6, 9, 9, 2, 4, 1, 0},     // 4 blocks: 3 + 1, k 4 + 4 + 1
                                    Conv2dGeometry{1, 8, 5, 7, 16, 1, 1, 1, 0},     // 1x1
                                    Conv2dGeometry{2, 5, 6, 6, 6, 3, 3, 1, 0});     // k 4 + 2
  CAPTURE(g.c, g.k, g.h, g.w, g.r, g.s);
  if (!takes_only_stride_1_unpadded<ConvBackwardWeights>(g)) return;

  auto ref = make_ref_backend();
  auto conv = ref->make_conv2d(g);
  ConvBackwardWeights direct(g);
  for (uint64_t seed : {31u, 32u}) {  // twice: the sums start again from zero
    const Tensor x = random_tensor(g.input(), seed, false), dy = random_tensor(g.output(), seed + 10, false);
    Tensor want_dw(g.weight()), want_db({g.k}), dw(g.weight()), db({g.k});
    std::fill_n(dw.data(), dw.elements(), NAN);  // every gradient must be written
    std::fill_n(db.data(), db.elements(), NAN);
    conv->backward_weights(x, dy, want_dw, want_db);
    direct.run(to_blocked(x, NAN).data(), to_blocked(dy, NAN).data(), dw.data(), db.data());  // padding: unused
    require_close(dw, want_dw, 1e-4);
    require_close(db, want_db, 1e-4);
  }
}

TEST_CASE("the fused first convolution, pool and relu give NaN for a window with a NaN anywhere, as the reference",
          "[compute][onednn][direct][nan]") {
  // A 1x1 kernel: a NaN pixel makes exactly one convolution output NaN, at the place in its window
  // chosen (0: top left, 1: top right, 2: bottom left, 3: bottom right).
  const Conv2dGeometry g{2, 1, 6, 8, 9, 1, 1, 1, 0};  // 9 channels: one whole block, one partial
  const int64_t place = GENERATE(0, 1, 2, 3);
  CAPTURE(place);
  const Pool2dGeometry p{g.n, g.k, g.oh(), g.ow(), 2, 2};
  if (!cpu_has_avx2()) {
    WARN("no AVX2 and FMA on this CPU: the fused kernel is not used, nothing to compare");
    return;
  }
  Tensor x = random_tensor(g.input(), 1, false);
  const Tensor w = random_tensor(g.weight(), 2, false), b = random_tensor({g.k}, 3, false),
               dout = random_tensor(p.output(), 4, false);
  x[(1 * g.h + 2 + place / 2) * g.w + 4 + place % 2] = NAN;  // sample 1, window (1, 2)

  auto ref = make_ref_backend();
  auto conv = ref->make_conv2d(g);
  auto pool = ref->make_max_pool2d(p);
  Tensor c(g.output()), pooled(p.output()), want(p.output());
  conv->forward(x, w, b, c);
  pool->forward(c, pooled);
  ref->relu_forward(pooled, want);
  for (int64_t k = 0; k < g.k; ++k) REQUIRE(std::isnan(want[((1 * g.k + k) * p.oh() + 1) * p.ow() + 2]));
  Tensor dpooled(p.output()), dc(g.output()), want_dw(g.weight()), want_db({g.k});
  ref->relu_backward(want, dout, dpooled);
  pool->backward(dpooled, dc);
  conv->backward_weights(x, dc, want_dw, want_db);

  FirstConvPool fused(g);
  std::vector<float> y(static_cast<size_t>(g.n * blocks(g.k) * p.oh() * p.ow() * kLanes));
  fused.forward(x.data(), w.data(), b.data(), y.data());
  require_nan_alike(from_blocked(y, p.output()), want, 1e-5);
  Tensor dw(g.weight()), db({g.k});
  fused.backward(x.data(), y.data(), to_blocked(dout).data(), dw.data(), db.data());
  require_nan_alike(dw, want_dw, 1e-4);  // NaN: the NaN pixel times its (zero) gradient
  require_nan_alike(db, want_db, 1e-4);  // finite: a NaN output passes no gradient through the ReLU
}

TEST_CASE("the blocked 2x2 max pool gives NaN for a window with a NaN anywhere, its gradient at the first NaN",
          "[compute][onednn][direct][nan]") {
  const Pool2dGeometry g{2, 9, 6, 6, 2, 2};  // 9 channels: one whole block, one partial
  if (!cpu_has_avx2()) {
    WARN("no AVX2 and FMA on this CPU: the blocked pool is not used, nothing to compare");
    return;
  }
  Tensor x = random_tensor(g.input(), 11, false);
  const Tensor dy = random_tensor(g.output(), 12, false);
  auto at = [&](int64_t n, int64_t c, int64_t row, int64_t col) -> float& {
    return x[((n * 9 + c) * 6 + row) * 6 + col];
  };
  // In one channel of each block: windows (0, 0), (0, 1), (0, 2), (1, 0) hold a NaN at place 0, 1,
  // 2, 3 in turn; window (2, 2) holds two, at places 1 and 3.
  for (auto [n, c] : {std::pair<int64_t, int64_t>{0, 3}, {1, 8}}) {
    for (int64_t q = 0; q < 4; ++q) at(n, c, 2 * (q / 3) + q / 2, 2 * (q % 3) + q % 2) = NAN;
    at(n, c, 4, 5) = at(n, c, 5, 5) = NAN;
  }
  auto ref = make_ref_backend();
  auto pool = ref->make_max_pool2d(g);
  Tensor want(g.output()), want_dx(g.input());
  pool->forward(x, want);
  pool->backward(dy, want_dx);
  REQUIRE(std::isnan(want[((1 * 9 + 8) * 3 + 2) * 3 + 2]));

  BlockedMaxPool blocked(g);
  std::vector<float> y(static_cast<size_t>(g.n * blocks(g.c) * g.oh() * g.ow() * kLanes));
  blocked.forward(to_blocked(x).data(), y.data());
  require_nan_alike(from_blocked(y, g.output()), want, 0.0);
  std::vector<float> dx(static_cast<size_t>(g.n * blocks(g.c) * g.h * g.w * kLanes));
  blocked.backward(to_blocked(dy).data(), dx.data());
  require_close(from_blocked(dx, g.input()), want_dx, 0.0);  // finite: each gradient at its window's first NaN
}

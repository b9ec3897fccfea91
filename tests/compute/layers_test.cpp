// Every layer against the maths: forward against a direct transcription of the definition, and
// backward against central finite differences of the forward.

#include <catch2/catch.hpp>
#include <cmath>
#include <memory>

#include "compute/layers.hpp"
#include "compute/ref/ref_backend.hpp"

using namespace tepdist::compute;

namespace {

/// A layer with its own parameter and gradient buffers, as a model would bind it.
struct Harness {
  std::unique_ptr<Layer> layer;
  Shape in, out;
  std::vector<float> params, grads;
  std::unique_ptr<Backend> backend = make_ref_backend();
  Rng rng{7};
  uint64_t dropout_seed = 99;

  Harness(std::unique_ptr<Layer> l, Shape input) : layer(std::move(l)), in(input) {
    auto shape = layer->configure(in);
    REQUIRE(shape.has_value());
    out = *shape;
    int64_t total = 0;
    for (const auto& p : layer->parameter_specs()) total += p.shape.elements();
    params.resize(static_cast<size_t>(total));
    grads.resize(static_cast<size_t>(total));
    Rng init(3);
    for (float& v : params) v = init.uniform(-1.0f, 1.0f);
    std::vector<TensorView> p, g;
    int64_t offset = 0;
    for (const auto& spec : layer->parameter_specs()) {
      p.push_back({params.data() + offset, spec.shape});
      g.push_back({grads.data() + offset, spec.shape});
      offset += spec.shape.elements();
    }
    layer->bind(p, g);
  }

  Tensor forward(const Tensor& x, bool training = true) {
    Tensor y(out.with_batch(x.shape()[0]));
    rng.reseed(dropout_seed);  // the same dropout mask on every call
    PassContext ctx{*backend, training, rng};
    layer->forward(ctx, x, y);
    return y;
  }

  /// L = sum(y * r): a loss whose gradient with respect to y is r.
  double loss(const Tensor& x, const Tensor& r) {
    const Tensor y = forward(x);
    double l = 0.0;
    for (int64_t i = 0; i < y.elements(); ++i) l += static_cast<double>(y[i]) * r[i];
    return l;
  }
};

Tensor random_tensor(Shape s, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Tensor t(s);
  Rng r(seed);
  for (float& v : t.span()) v = r.uniform(lo, hi);
  return t;
}

/// Checks dL/dx and dL/dparams from backward() against (L(v + h) - L(v - h)) / 2h at every
/// element. Float32 forward passes with h = 1e-2 leave about 1e-3 of relative noise in the
/// differences, so 2e-2 relative (with a 1e-3 absolute floor) separates noise from a wrong gradient.
void check_gradients(Harness& h, Tensor x) {
  const Tensor r = random_tensor(h.out.with_batch(x.shape()[0]), 11);
  const Tensor y = h.forward(x);
  Tensor dx(x.shape());
  PassContext ctx{*h.backend, true, h.rng};
  h.layer->backward(ctx, x, y, r, dx);
  const std::vector<float> analytic_params = h.grads;

  constexpr float step = 1e-2f;
  auto check = [&](float& v, float analytic, const char* what, int64_t i) {
    const float saved = v;
    v = saved + step;
    const double up = h.loss(x, r);
    v = saved - step;
    const double down = h.loss(x, r);
    v = saved;
    const double numeric = (up - down) / (2.0 * step);
    INFO(what << "[" << i << "]: analytic " << analytic << ", numeric " << numeric);
    CHECK(std::abs(analytic - numeric) <= 2e-2 * std::abs(numeric) + 1e-3);
  };
  for (int64_t i = 0; i < x.elements(); ++i) check(x[i], dx[i], "dx", i);
  for (size_t i = 0; i < h.params.size(); ++i)
    check(h.params[i], analytic_params[i], "dparam", static_cast<int64_t>(i));
}

/// Values kept at least `gap` away from zero and from each other, so ReLU kinks and max-pool
/// ties sit outside the finite-difference step.
Tensor separated_tensor(Shape s, uint64_t seed, float gap = 0.05f) {
  Tensor t(s);
  std::vector<float> values(static_cast<size_t>(t.elements()));
  for (size_t i = 0; i < values.size(); ++i) values[i] = (static_cast<float>(i) + 1.0f) * gap;
  Rng r(seed);
  for (size_t i = values.size(); i > 1; --i) std::swap(values[i - 1], values[r.below(i)]);
  for (int64_t i = 0; i < t.elements(); ++i)
    t[i] = values[static_cast<size_t>(i)] * (i % 3 == 0 ? -1.0f : 1.0f);
  return t;
}

}  // namespace

TEST_CASE("conv2d forward matches the definition of convolution", "[compute][layers][conv2d]") {
  const int64_t stride = GENERATE(1, 2), pad = GENERATE(0, 1);
  Harness h(std::make_unique<Conv2d>(2, 3, 3, stride, pad), {2, 2, 6, 5});
  const Tensor x = random_tensor(h.in, 5);
  const Tensor y = h.forward(x);
  const Shape o = h.out;
  const float* w = h.params.data();
  const float* b = w + 3 * 2 * 3 * 3;
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t k = 0; k < 3; ++k)
      for (int64_t oy = 0; oy < o[2]; ++oy)
        for (int64_t ox = 0; ox < o[3]; ++ox) {
          double sum = b[k];
          for (int64_t c = 0; c < 2; ++c)
            for (int64_t r = 0; r < 3; ++r)
              for (int64_t s = 0; s < 3; ++s) {
                const int64_t iy = oy * stride + r - pad, ix = ox * stride + s - pad;
                if (iy < 0 || iy >= 6 || ix < 0 || ix >= 5) continue;
                sum += static_cast<double>(w[((k * 2 + c) * 3 + r) * 3 + s]) * x[((n * 2 + c) * 6 + iy) * 5 + ix];
              }
          CHECK(y[((n * 3 + k) * o[2] + oy) * o[3] + ox] == Approx(sum).margin(1e-5));
        }
}

TEST_CASE("conv2d gradients match finite differences", "[compute][layers][conv2d]") {
  const int64_t stride = GENERATE(1, 2), pad = GENERATE(0, 1);
  Harness h(std::make_unique<Conv2d>(2, 3, 3, stride, pad), {2, 2, 5, 5});
  check_gradients(h, random_tensor(h.in, 5));
}

TEST_CASE("conv2d rejects inputs it cannot take, naming what is wrong", "[compute][layers][conv2d]") {
  Conv2d wrong_channels(3, 4, 3);
  auto r = wrong_channels.configure({1, 1, 8, 8});
  REQUIRE_FALSE(r.has_value());
  CHECK_THAT(r.error().message, Catch::Contains("expects 3 input channels"));
  Conv2d too_big(1, 4, 9);
  REQUIRE_FALSE(too_big.configure({1, 1, 8, 8}).has_value());
  Conv2d flat(1, 4, 3);
  REQUIRE_FALSE(flat.configure({1, 64}).has_value());
}

TEST_CASE("max_pool2d picks window maxima and routes gradients to them", "[compute][layers][pool]") {
  Harness h(std::make_unique<MaxPool2d>(2), {1, 1, 4, 4});
  Tensor x(h.in);
  for (int64_t i = 0; i < 16; ++i) x[i] = static_cast<float>((i * 7) % 16);
  const Tensor y = h.forward(x);
  // rows of x: [0 7 14 5] [12 3 10 1] [8 15 6 13] [4 11 2 9]
  CHECK(y[0] == 12.0f);
  CHECK(y[1] == 14.0f);
  CHECK(y[2] == 15.0f);
  CHECK(y[3] == 13.0f);
}

TEST_CASE("max_pool2d gives NaN for a window holding a NaN anywhere and routes its gradient to the first NaN",
          "[compute][layers][pool][nan]") {
  Harness h(std::make_unique<MaxPool2d>(2), {1, 1, 4, 4});
  Tensor x(h.in);
  for (int64_t i = 0; i < 16; ++i) x[i] = static_cast<float>((i * 7) % 16);
  // rows of x: [0 N 14 5] [12 3 10 1] [8 15 6 N] [4 11 N 9]: NaN second in window 0, second and
  // third in window 3 (windows in order: top left, top right, bottom left, bottom right)
  x[1] = x[11] = x[14] = NAN;
  const Tensor y = h.forward(x);
  CHECK(std::isnan(y[0]));
  CHECK(y[1] == 14.0f);
  CHECK(y[2] == 15.0f);
  CHECK(std::isnan(y[3]));

  Tensor dy(h.out), dx(h.in);
  for (int64_t i = 0; i < 4; ++i) dy[i] = static_cast<float>(i + 1);
  PassContext ctx{*h.backend, true, h.rng};
  h.layer->backward(ctx, x, y, dy, dx);
  for (int64_t i = 0; i < 16; ++i) {
    INFO("dx[" << i << "]");
    const float want = i == 1 ? 1.0f : i == 2 ? 2.0f : i == 9 ? 3.0f : i == 11 ? 4.0f : 0.0f;
    CHECK(dx[i] == want);
  }
}

TEST_CASE("max_pool2d gradients match finite differences, overlapping windows too", "[compute][layers][pool]") {
  const int64_t kernel = GENERATE(2, 3);
  Harness h(std::make_unique<MaxPool2d>(kernel, 2), {2, 2, 7, 7});
  check_gradients(h, separated_tensor(h.in, 3));
}

TEST_CASE("relu gradients match finite differences", "[compute][layers][relu]") {
  Harness h(std::make_unique<Relu>(), {2, 3, 4, 4});
  const Tensor x = separated_tensor(h.in, 4);
  const Tensor y = h.forward(x);
  for (int64_t i = 0; i < x.elements(); ++i) CHECK(y[i] == std::max(x[i], 0.0f));
  check_gradients(h, x);
}

TEST_CASE("flatten keeps the values and their order", "[compute][layers][flatten]") {
  Harness h(std::make_unique<Flatten>(), {2, 3, 2, 2});
  CHECK(h.out == Shape{2, 12});
  const Tensor x = random_tensor(h.in, 1);
  const Tensor y = h.forward(x);
  for (int64_t i = 0; i < x.elements(); ++i) CHECK(y[i] == x[i]);
  check_gradients(h, x);
}

TEST_CASE("linear forward is x w^T + b and its gradients match finite differences", "[compute][layers][linear]") {
  Harness h(std::make_unique<Linear>(5, 4), {3, 5});
  const Tensor x = random_tensor(h.in, 2);
  const Tensor y = h.forward(x);
  const float* w = h.params.data();
  const float* b = w + 20;
  for (int64_t n = 0; n < 3; ++n)
    for (int64_t o = 0; o < 4; ++o) {
      double sum = b[o];
      for (int64_t i = 0; i < 5; ++i) sum += static_cast<double>(x[n * 5 + i]) * w[o * 5 + i];
      CHECK(y[n * 4 + o] == Approx(sum).margin(1e-5));
    }
  check_gradients(h, x);
}

TEST_CASE("dropout drops about p of its inputs in training, none in evaluation", "[compute][layers][dropout]") {
  Harness h(std::make_unique<Dropout>(0.25f), {4, 1000});
  Tensor x(h.in);
  for (float& v : x.span()) v = 1.0f;
  const Tensor train = h.forward(x, true);
  int64_t zeros = 0;
  for (float v : train.span()) {
    if (v == 0.0f)
      ++zeros;
    else
      CHECK(v == Approx(1.0f / 0.75f));
  }
  CHECK(zeros > 850);  // 1000 expected of 4000; the bounds are over 5 standard deviations out
  CHECK(zeros < 1150);
  const Tensor eval = h.forward(x, false);
  for (float v : eval.span()) CHECK(v == 1.0f);
  check_gradients(h, random_tensor(h.in, 9));
}

TEST_CASE("dropout refuses a probability p outside 0 <= p < 1", "[compute][layers][dropout]") {
  CHECK_FALSE(Dropout(1.0f).configure({1, 4}).has_value());
  CHECK_FALSE(Dropout(-0.1f).configure({1, 4}).has_value());
}

TEST_CASE("softmax cross-entropy gives the mean loss and its gradient", "[compute][layers][loss]") {
  auto backend = make_ref_backend();
  Tensor logits = random_tensor({3, 4}, 8, -3.0f, 3.0f);
  const std::vector<int32_t> labels{0, 3, 2};
  Tensor probs({3, 4}), grad({3, 4});
  const float loss = backend->softmax_cross_entropy_forward(logits, labels, probs).value();
  double expected = 0.0;
  for (int64_t n = 0; n < 3; ++n) {
    double z = 0.0;
    for (int64_t j = 0; j < 4; ++j) z += std::exp(static_cast<double>(logits[n * 4 + j]));
    expected += std::log(z) - logits[n * 4 + labels[static_cast<size_t>(n)]];
    double row = 0.0;
    for (int64_t j = 0; j < 4; ++j) row += probs[n * 4 + j];
    CHECK(row == Approx(1.0));
  }
  CHECK(loss == Approx(expected / 3.0));

  REQUIRE(backend->softmax_cross_entropy_backward(probs, labels, grad).has_value());
  for (int64_t i = 0; i < 12; ++i) {
    const float saved = logits[i];
    Tensor scratch({3, 4});
    logits[i] = saved + 1e-2f;
    const double up = backend->softmax_cross_entropy_forward(logits, labels, scratch).value();
    logits[i] = saved - 1e-2f;
    const double down = backend->softmax_cross_entropy_forward(logits, labels, scratch).value();
    logits[i] = saved;
    CHECK(grad[i] == Approx((up - down) / 2e-2).margin(1e-3));
  }
}

TEST_CASE("softmax cross-entropy stays finite for huge logits", "[compute][layers][loss]") {
  auto backend = make_ref_backend();
  Tensor logits({1, 3});
  logits[0] = 1000.0f, logits[1] = -1000.0f, logits[2] = 999.0f;
  Tensor probs({1, 3});
  const std::vector<int32_t> label{2};
  const float loss = backend->softmax_cross_entropy_forward(logits, label, probs).value();
  CHECK(std::isfinite(loss));
  CHECK(loss == Approx(std::log(1.0 + std::exp(-1.0)) + 1.0));
}

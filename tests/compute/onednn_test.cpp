// Every oneDNN kernel against the reference, on LeNet's own shapes and on awkward ones.
//
// Tolerances: both backends compute in float32 but sum in different orders (oneDNN in vector
// blocks with FMA, the reference row by row), so results differ by rounding that grows with the
// number of terms in each sum, about sqrt(terms) * 6e-8 * |typical partial sum|. The largest sums
// here have ~5,000 terms of magnitude <= 1, so 1e-4 relative plus 1e-4 absolute leaves an order of
// magnitude of room for rounding while any indexing or layout bug (errors of order 1) fails.

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <string>

#include "compute/backends.hpp"
#include "compute/onednn/onednn_backend.hpp"
#include "compute/optimizer.hpp"
#include "compute/presets.hpp"
#include "compute/ref/ref_backend.hpp"
#include "compute/train.hpp"

using namespace tepdist::compute;

namespace {

Tensor random_tensor(Shape s, uint64_t seed) {
  Tensor t(s);
  Rng r(seed);
  for (float& v : t.span()) v = r.uniform(-1.0f, 1.0f);
  return t;
}

void require_close(const Tensor& got, const Tensor& want, double tolerance = 1e-4) {
  REQUIRE(got.shape() == want.shape());
  double worst = 0.0;
  int64_t worst_at = 0;
  for (int64_t i = 0; i < got.elements(); ++i) {
    double excess = std::abs(got[i] - want[i]) - tolerance * (1.0 + std::abs(want[i]));
    if (std::isnan(excess)) excess = INFINITY;  // NaN > worst is false: it would pass unseen
    if (excess > worst) worst = excess, worst_at = i;
  }
  INFO("worst element " << worst_at << ": onednn " << got[worst_at] << ", ref " << want[worst_at]);
  CHECK(worst == 0.0);
}

/// NaN exactly where `want` is NaN, and within `tolerance` of it elsewhere.
void require_nan_alike(ConstTensorView got, ConstTensorView want, double tolerance = 1e-4) {
  REQUIRE(got.shape == want.shape);
  int64_t wrong = 0, first_wrong = -1;
  for (int64_t i = 0; i < got.elements(); ++i) {
    const float g = got.data[i], w = want.data[i];
    if (std::isnan(w) != std::isnan(g) || (!std::isnan(w) && std::abs(g - w) > tolerance * (1.0 + std::abs(w))))
      if (wrong++ == 0) first_wrong = i;
  }
  INFO(wrong << " elements differ, the first at " << first_wrong << ": onednn "
             << (first_wrong >= 0 ? got.data[first_wrong] : 0.0f) << ", ref "
             << (first_wrong >= 0 ? want.data[first_wrong] : 0.0f));
  CHECK(wrong == 0);
}

struct Backends {
  std::unique_ptr<Backend> fast = make_onednn_backend(), ref = make_ref_backend();
};

}  // namespace

TEST_CASE("onednn conv2d agrees with the reference", "[compute][onednn][conv2d]") {
  Backends b;
  const Conv2dGeometry g = GENERATE(Conv2dGeometry{8, 1, 28, 28, 20, 5, 5, 1, 0},   // LeNet conv1
                                    Conv2dGeometry{8, 20, 12, 12, 50, 5, 5, 1, 0},  // LeNet conv2
                                    Conv2dGeometry{3, 3, 9, 7, 5, 3, 3, 2, 1});     // strided, padded, odd
  auto fast = b.fast->make_conv2d(g);
  auto ref = b.ref->make_conv2d(g);
  const Tensor x = random_tensor(g.input(), 1), w = random_tensor(g.weight(), 2), bias = random_tensor({g.k}, 3),
               dy = random_tensor(g.output(), 4);
  Tensor y1(g.output()), y2(g.output());
  fast->forward(x, w, bias, y1);
  ref->forward(x, w, bias, y2);
  require_close(y1, y2);

  Tensor dx1(g.input()), dx2(g.input());
  fast->backward_data(dy, w, dx1);
  ref->backward_data(dy, w, dx2);
  require_close(dx1, dx2);

  Tensor dw1(g.weight()), dw2(g.weight()), db1({g.k}), db2({g.k});
  fast->backward_weights(x, dy, dw1, db1);
  ref->backward_weights(x, dy, dw2, db2);
  require_close(dw1, dw2);
  require_close(db1, db2);
}

TEST_CASE("onednn max_pool2d agrees with the reference", "[compute][onednn][pool]") {
  Backends b;
  const Pool2dGeometry g = GENERATE(Pool2dGeometry{8, 20, 24, 24, 2, 2}, Pool2dGeometry{2, 3, 7, 7, 3, 2});
  auto fast = b.fast->make_max_pool2d(g);
  auto ref = b.ref->make_max_pool2d(g);
  const Tensor x = random_tensor(g.input(), 5), dy = random_tensor(g.output(), 6);
  Tensor y1(g.output()), y2(g.output()), dx1(g.input()), dx2(g.input());
  fast->forward(x, y1);
  ref->forward(x, y2);
  require_close(y1, y2, 0.0);  // a maximum is picked, not computed: exact
  fast->backward(dy, dx1);
  ref->backward(dy, dx2);
  require_close(dx1, dx2, 1e-6);  // overlapping windows add up to `kernel` gradients in any order
}

TEST_CASE("onednn linear agrees with the reference", "[compute][onednn][linear]") {
  Backends b;
  const LinearGeometry g = GENERATE(LinearGeometry{64, 800, 500}, LinearGeometry{7, 13, 3});
  auto fast = b.fast->make_linear(g);
  auto ref = b.ref->make_linear(g);
  const Tensor x = random_tensor({g.n, g.in}, 7), w = random_tensor({g.out, g.in}, 8), bias = random_tensor({g.out}, 9),
               dy = random_tensor({g.n, g.out}, 10);
  Tensor y1({g.n, g.out}), y2({g.n, g.out});
  fast->forward(x, w, bias, y1);
  ref->forward(x, w, bias, y2);
  require_close(y1, y2);
  Tensor dx1({g.n, g.in}), dx2({g.n, g.in});
  fast->backward_data(dy, w, dx1);
  ref->backward_data(dy, w, dx2);
  require_close(dx1, dx2);
  Tensor dw1({g.out, g.in}), dw2({g.out, g.in}), db1({g.out}), db2({g.out});
  fast->backward_weights(x, dy, dw1, db1);
  ref->backward_weights(x, dy, dw2, db2);
  require_close(dw1, dw2);
  require_close(db1, db2);
}

TEST_CASE("onednn's relu, max_pool2d and loss keep NaN as the reference does", "[compute][onednn][nan]") {
  Backends b;
  Tensor x = random_tensor({2, 3, 6, 6}, 13);
  x[7] = x[8] = NAN;                             // places 3 and 2 of two windows of a 2x2 pool
  for (int64_t i = 36; i < 40; ++i) x[i] = NAN;  // a row of channel 1

  // Over 2^16 floats: the oneDNN backend's ReLU runs in parallel.
  Tensor big = random_tensor({2, 3, 150, 150}, 15);
  big[0] = big[70000] = big[big.elements() - 1] = NAN;
  for (const Tensor* t : {&x, &big}) {
    Tensor y1(t->shape()), y2(t->shape());
    b.fast->relu_forward(*t, y1);
    b.ref->relu_forward(*t, y2);
    require_nan_alike(y1, y2, 0.0);
    CHECK(std::isnan(y1[t == &x ? 7 : 70000]));
  }

  for (const Pool2dGeometry g : {Pool2dGeometry{2, 3, 6, 6, 2, 2}, Pool2dGeometry{2, 3, 6, 6, 3, 1}}) {
    CAPTURE(g.kernel, g.stride);
    auto fast = b.fast->make_max_pool2d(g);
    auto ref = b.ref->make_max_pool2d(g);
    Tensor p1(g.output()), p2(g.output());
    fast->forward(x, p1);
    ref->forward(x, p2);
    require_nan_alike(p1, p2, 0.0);
    CHECK(std::isnan(p1[0]));  // the top left window holds x[7]
  }

  Tensor logits = random_tensor({3, 10}, 14);
  logits[14] = NAN;  // row 1
  const std::vector<int32_t> labels{1, 2, 3};
  Tensor q1({3, 10}), q2({3, 10});
  const float l1 = b.fast->softmax_cross_entropy_forward(logits, labels, q1).value();
  const float l2 = b.ref->softmax_cross_entropy_forward(logits, labels, q2).value();
  CHECK(std::isnan(l1));
  CHECK(std::isnan(l2));
  require_nan_alike(q1, q2, 1e-5);
}

TEST_CASE("onednn relu and softmax cross-entropy agree with the reference", "[compute][onednn][pointwise]") {
  Backends b;
  const Tensor x = random_tensor({16, 10}, 11), dy = random_tensor({16, 10}, 12);
  Tensor y1({16, 10}), y2({16, 10}), dx1({16, 10}), dx2({16, 10});
  b.fast->relu_forward(x, y1);
  b.ref->relu_forward(x, y2);
  require_close(y1, y2, 0.0);
  b.fast->relu_backward(y1, dy, dx1);
  b.ref->relu_backward(y2, dy, dx2);
  require_close(dx1, dx2, 0.0);

  std::vector<int32_t> labels(16);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int32_t>((i * 7) % 10);
  Tensor p1({16, 10}), p2({16, 10}), g1({16, 10}), g2({16, 10});
  const float l1 = b.fast->softmax_cross_entropy_forward(x, labels, p1).value();
  const float l2 = b.ref->softmax_cross_entropy_forward(x, labels, p2).value();
  CHECK(l1 == Approx(l2).epsilon(1e-5));  // float vs double accumulation over 10 terms
  require_close(p1, p2, 1e-5);
  REQUIRE(b.fast->softmax_cross_entropy_backward(p1, labels, g1).has_value());
  REQUIRE(b.ref->softmax_cross_entropy_backward(p2, labels, g2).has_value());
  require_close(g1, g2, 1e-5);
}

namespace {

/// One training step of the same model on both backends: the loss, every parameter's gradient
/// and the SGD-updated parameters must agree, and so must the logits of a later forward.
void compare_step(const std::function<std::unique_ptr<Model>()>& make, int64_t batch) {
  auto fast_model = make(), ref_model = make();
  REQUIRE(fast_model->build({1, 28, 28}, 3).has_value());
  REQUIRE(ref_model->build({1, 28, 28}, 3).has_value());
  Backends b;
  Tensor x({batch, 1, 28, 28});
  Rng r(5);
  for (float& v : x.span()) v = r.uniform();
  std::vector<int32_t> y(static_cast<size_t>(batch));
  for (auto& l : y) l = static_cast<int32_t>(r.below(10));
  LossScratch s1, s2;
  const auto loss1 = try_compute_gradients(*fast_model, *b.fast, x, y, s1);
  const auto loss2 = try_compute_gradients(*ref_model, *b.ref, x, y, s2);
  REQUIRE(loss1.has_value());
  REQUIRE(loss2.has_value());
  CHECK(*loss1 == Approx(*loss2).epsilon(1e-5));
  for (const auto& p : ref_model->named_parameters()) {
    INFO(p.name);
    Tensor g1(p.shape), g2(p.shape);
    std::copy_n(fast_model->gradients().data() + p.offset, p.shape.elements(), g1.data());
    std::copy_n(ref_model->gradients().data() + p.offset, p.shape.elements(), g2.data());
    require_close(g1, g2);
  }
  auto o1 = std::move(*make_optimizer({}, fast_model->parameters().size()));
  auto o2 = std::move(*make_optimizer({}, ref_model->parameters().size()));
  o1->step(fast_model->parameters(), fast_model->gradients(), 0.01f);
  o2->step(ref_model->parameters(), ref_model->gradients(), 0.01f);
  Tensor p1({static_cast<int64_t>(fast_model->parameters().size())}), p2(p1.shape());
  std::copy(fast_model->parameters().begin(), fast_model->parameters().end(), p1.data());
  std::copy(ref_model->parameters().begin(), ref_model->parameters().end(), p2.data());
  require_close(p1, p2, 1e-6);

  // The same evaluation logits through the planned (or not) forward as well.
  const ConstTensorView l1 = fast_model->forward(*b.fast, x, false).value();
  Tensor logits(l1.shape);
  std::copy_n(l1.data, l1.elements(), logits.data());
  const ConstTensorView l2 = ref_model->forward(*b.ref, x, false).value();
  Tensor want(l2.shape);
  std::copy_n(l2.data, l2.elements(), want.data());
  require_close(logits, want);
}

/// Strided and padded convolutions, a pool first, a standalone ReLU and no fusable pattern, and a
/// plain convolution of 9 to 11 channels (on AVX2, its gradients by the direct kernels).
class Awkward : public Model {
 public:
  Awkward() {
    add<MaxPool2d>(2);
    add<Relu>();
    add<Conv2d>(0, 9, 3, 2, 1);
    add<Conv2d>(0, 11, 2, 1, 0);
    add<Conv2d>(0, 4, 3, 1, 1);
    add<MaxPool2d>(3, 2);
    add<Flatten>();
    add<Linear>(0, 32);
    add<Linear>(0, 10);
  }
};

/// A convolution with a ReLU after it (the plan's own ReLU pass after the primitive), then a
/// convolution, pool and ReLU that is not the first layer (the ReLU after the blocked pool).
class ConvRelu : public Model {
 public:
  ConvRelu() {
    add<Conv2d>(0, 6, 3);
    add<Relu>();
    add<Conv2d>(0, 10, 3);
    add<MaxPool2d>(2);
    add<Relu>();
    add<Flatten>();
    add<Linear>(0, 10);
  }
};

/// The plan declines dropout: the model runs oneDNN's per-layer kernels.
class PerLayer : public Model {
 public:
  PerLayer() {
    add<Conv2d>(0, 6, 3);
    add<MaxPool2d>(2);
    add<Relu>();
    add<Flatten>();
    add<Dropout>(0.5f);
    add<Linear>(0, 10);
  }
};

}  // namespace

TEST_CASE("a NaN in the input or in any parameter gives NaN logits and a NaN loss on onednn as on the reference",
          "[compute][onednn][nan]") {
  const std::function<std::unique_ptr<Model>()> makes[] = {
      make_lenet, [] { return make_mlp(); }, [] { return std::unique_ptr<Model>(new Awkward()); },
      [] { return std::unique_ptr<Model>(new ConvRelu()); }, [] { return std::unique_ptr<Model>(new PerLayer()); }};
  Backends b;
  const int64_t batch = 4;
  Tensor x({batch, 1, 28, 28});
  Rng r(6);
  for (float& v : x.span()) v = r.uniform();
  const std::vector<int32_t> y{3, 1, 4, 1};
  for (size_t m = 0; m < std::size(makes); ++m) {
    auto probe = makes[m]();
    REQUIRE(probe->build({1, 28, 28}, 3).has_value());
    // (-1: the input; else a parameter tensor, NaN at its middle element)
    for (int64_t where = -1; where < static_cast<int64_t>(probe->named_parameters().size()); ++where) {
      CAPTURE(m, where >= 0 ? probe->named_parameters()[static_cast<size_t>(where)].name : "input");
      auto fast_model = makes[m](), ref_model = makes[m]();
      REQUIRE(fast_model->build({1, 28, 28}, 3).has_value());
      REQUIRE(ref_model->build({1, 28, 28}, 3).has_value());
      Tensor input = x;
      if (where < 0) {
        input[1 * 28 * 28 + 13 * 28 + 11] = NAN;  // sample 1, at an odd row and column
      } else {
        const auto& p = probe->named_parameters()[static_cast<size_t>(where)];
        fast_model->parameters()[p.offset + p.shape.elements() / 2] = NAN;
        ref_model->parameters()[p.offset + p.shape.elements() / 2] = NAN;
      }
      LossScratch s1, s2;
      const auto loss1 = try_compute_gradients(*fast_model, *b.fast, input, y, s1);
      const auto loss2 = try_compute_gradients(*ref_model, *b.ref, input, y, s2);
      REQUIRE(loss1.has_value());
      REQUIRE(loss2.has_value());
      CHECK(std::isnan(*loss1));
      CHECK(std::isnan(*loss2));
      for (const auto& p : ref_model->named_parameters()) {  // the gradients: NaN where the reference's are
        INFO(p.name);
        require_nan_alike({fast_model->gradients().data() + p.offset, p.shape},
                          {ref_model->gradients().data() + p.offset, p.shape});
      }
      CHECK(std::any_of(ref_model->gradients().begin(), ref_model->gradients().end(),
                        [](float v) { return std::isnan(v); }));
      const ConstTensorView logits1 = fast_model->forward(*b.fast, input, false).value();
      Tensor got(logits1.shape);
      std::copy_n(logits1.data, logits1.elements(), got.data());
      const ConstTensorView want = ref_model->forward(*b.ref, input, false).value();
      require_nan_alike(got, want);
      if (where < 0)
        for (int64_t i = 0; i < want.elements(); ++i) CHECK(std::isnan(want.data[i]) == (i / 10 == 1));
    }
  }
}

TEST_CASE("a whole training step on onednn agrees with the reference: loss, gradients, parameters",
          "[compute][onednn][model]") {
  compare_step(make_lenet, 32);
  compare_step(make_lenet, 7);  // an odd last batch
  compare_step([] { return make_mlp(); }, 16);
  compare_step([] { return std::unique_ptr<Model>(new Awkward()); }, 8);
  compare_step([] { return std::unique_ptr<Model>(new ConvRelu()); }, 6);
  compare_step([] { return std::unique_ptr<Model>(new PerLayer()); }, 5);
}

TEST_CASE("onednn plans LeNet, MLP and odd networks whole, and declines what it cannot plan",
          "[compute][onednn][model]") {
  Backends b;
  auto layers_of = [](Model& m, int64_t batch) { return m.planned_layers(batch); };
  auto lenet = make_lenet();
  REQUIRE(lenet->build({1, 28, 28}, 0).has_value());
  CHECK(b.fast->plan_network(layers_of(*lenet, 64)) != nullptr);
  CHECK(b.ref->plan_network(layers_of(*lenet, 64)) == nullptr);
  auto mlp = make_mlp();
  REQUIRE(mlp->build({1, 28, 28}, 0).has_value());
  CHECK(b.fast->plan_network(layers_of(*mlp, 64)) != nullptr);
  Awkward awkward;
  REQUIRE(awkward.build({1, 28, 28}, 0).has_value());
  CHECK(b.fast->plan_network(layers_of(awkward, 5)) != nullptr);
  Model with_dropout;
  with_dropout.add<Flatten>();
  with_dropout.add<Dropout>(0.5f);
  with_dropout.add<Linear>(0, 10);
  REQUIRE(with_dropout.build({1, 28, 28}, 0).has_value());
  CHECK(b.fast->plan_network(layers_of(with_dropout, 5)) == nullptr);
}

TEST_CASE("LeNet's plan runs the direct kernels on every AVX2 machine, AVX-512 ones included, and says so",
          "[compute][onednn][model]") {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    WARN("skipped: this CPU lacks AVX2 or FMA, for which the direct kernels are written");
    return;
  }
  Backends b;
  auto lenet = make_lenet();
  REQUIRE(lenet->build({1, 28, 28}, 0).has_value());
  const std::string path = lenet->compute_path(*b.fast, 64);
  INFO(path);
  CHECK(path.starts_with("onednn (oneDNN "));
  CHECK(path.find("conv+max pool+ReLU: direct (out nChw8c)") != std::string::npos);
  // oneDNN alone would pick nChw16c on AVX-512, and conv2's gradients and the second pool would
  // then run on oneDNN's kernels and the reference's.
  CHECK(path.find("conv: forward oneDNN (in nChw8c, out nChw8c), weight gradient direct, input gradient direct") !=
        std::string::npos);
  CHECK(path.find("; max pool+ReLU: direct (out nChw8c)") != std::string::npos);  // the second pool
  CHECK(lenet->compute_path(*b.ref, 64) == "ref, batch 64: layer by layer");
}

TEST_CASE("a model run by one oneDNN backend after another gets the same results from each",
          "[compute][onednn]") {
  // Kernel and plan caches key on Backend::id(), not on the address a new backend may reuse.
  const Dataset data = make_synthetic(300, 5);
  auto model = make_lenet();
  REQUIRE(model->build(data.sample_shape(), 0).has_value());
  auto first = std::move(*make_backend("onednn"));
  const uint64_t first_id = first->id();
  const auto reference = try_evaluate(*model, *first, data);
  REQUIRE(reference.has_value());
  first.reset();
  for (int i = 0; i < 20; ++i) {
    auto next = std::move(*make_backend("onednn"));
    CHECK(next->id() != first_id);
    const auto e = try_evaluate(*model, *next, data);
    REQUIRE(e.has_value());
    CHECK(e->accuracy == reference->accuracy);
    CHECK(e->loss == Approx(reference->loss).epsilon(1e-5));
  }
}

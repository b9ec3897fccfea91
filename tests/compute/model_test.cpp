#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "compute/backends.hpp"
#include "compute/model.hpp"
#include "compute/presets.hpp"
#include "compute/ref/ref_backend.hpp"

using namespace tepdist::compute;

namespace {

/// A model defined the way a user of the C++ API would: a class composed of layers.
class TinyNet : public Model {
 public:
  TinyNet() {
    add<Conv2d>(0, 4, 3);
    add<Relu>();
    add<MaxPool2d>(2);
    add(std::make_unique<Flatten>(), "flat");
    add<Linear>(0, 10);
  }
};

}  // namespace

TEST_CASE("lenet has the baseline's layers, stable parameter names and 431,080 parameters", "[compute][model]") {
  auto m = make_lenet();
  REQUIRE(m->build({1, 28, 28}, 0).has_value());
  const auto& p = m->named_parameters();
  REQUIRE(p.size() == 8);
  const char* names[] = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                         "fc1.weight",   "fc1.bias",   "fc2.weight",   "fc2.bias"};
  for (size_t i = 0; i < 8; ++i) CHECK(p[i].name == names[i]);
  CHECK(p[0].shape == Shape{20, 1, 5, 5});
  CHECK(p[2].shape == Shape{50, 20, 5, 5});
  CHECK(p[4].shape == Shape{500, 800});
  CHECK(p[7].shape == Shape{10});
  CHECK(m->parameters().size() == 431080);
  CHECK(m->classes() == 10);
  // Parameters are laid out back to back in one buffer, in name order.
  for (size_t i = 1; i < p.size(); ++i) CHECK(p[i].offset == p[i - 1].offset + p[i - 1].shape.elements());
}

TEST_CASE("initial parameters follow the seed and PyTorch's fan-in bound", "[compute][model]") {
  auto a = make_lenet(), b = make_lenet(), c = make_lenet();
  REQUIRE(a->build({1, 28, 28}, 5).has_value());
  REQUIRE(b->build({1, 28, 28}, 5).has_value());
  REQUIRE(c->build({1, 28, 28}, 6).has_value());
  CHECK(std::equal(a->parameters().begin(), a->parameters().end(), b->parameters().begin()));
  CHECK_FALSE(std::equal(a->parameters().begin(), a->parameters().end(), c->parameters().begin()));
  const auto& fc1 = a->named_parameters()[4];
  const float bound = 1.0f / std::sqrt(800.0f);
  float largest = 0.0f;
  for (int64_t i = 0; i < fc1.shape.elements(); ++i) largest = std::max(largest, std::abs(a->parameters()[fc1.offset + i]));
  CHECK(largest <= bound);
  CHECK(largest > 0.99f * bound);
}

TEST_CASE("a user-defined model class gets automatic and explicit names and inferred sizes", "[compute][model]") {
  TinyNet net;
  REQUIRE(net.build({1, 8, 8}, 1).has_value());
  const auto& p = net.named_parameters();
  REQUIRE(p.size() == 4);
  CHECK(p[0].name == "conv1.weight");
  CHECK(p[0].shape == Shape{4, 1, 3, 3});
  CHECK(p[2].name == "fc1.weight");
  CHECK(p[2].shape == Shape{10, 4 * 3 * 3});
  CHECK_THAT(net.summary(), Catch::Contains("flat"));
}

TEST_CASE("building a model that does not fit its input names the layer", "[compute][model]") {
  Model m;
  m.add<Conv2d>(1, 4, 3);
  m.add<Linear>(0, 10);
  auto r = m.build({1, 8, 8}, 0);
  REQUIRE_FALSE(r.has_value());
  CHECK_THAT(r.error().message, Catch::Contains("fc1") && Catch::Contains("flatten"));
}

TEST_CASE("forward and backward run for any batch size and fill every gradient", "[compute][model]") {
  auto m = make_lenet();
  REQUIRE(m->build({1, 28, 28}, 0).has_value());
  auto backend = make_ref_backend();
  for (int64_t n : {1, 5, 3}) {
    Tensor x({n, 1, 28, 28});
    Rng r(n);
    for (float& v : x.span()) v = r.uniform();
    const ConstTensorView logits = m->forward(*backend, x, true).value();
    CHECK(logits.shape == Shape{n, 10});
    Tensor dlogits(logits.shape);
    for (float& v : dlogits.span()) v = 1.0f;
    std::fill(m->gradients().begin(), m->gradients().end(), 0.0f);
    m->backward(*backend, dlogits);
    for (const auto& p : m->named_parameters()) {
      double norm = 0.0;
      for (int64_t i = 0; i < p.shape.elements(); ++i) norm += std::abs(m->gradients()[p.offset + i]);
      INFO(p.name << " with batch " << n);
      CHECK(norm > 0.0);
    }
  }
}

TEST_CASE("models are made from layer specs, and bad specs name the layer and argument", "[compute][model]") {
  auto good = make_model({{"conv2d", "", {{"out_channels", 6}, {"kernel", 5}}},
                          {"relu", "", {}},
                          {"flatten", "", {}},
                          {"dropout", "drop", {{"p", 0.5}}},
                          {"linear", "head", {{"out_features", 10}}}});
  REQUIRE(good.has_value());
  REQUIRE((*good)->build({1, 28, 28}, 0).has_value());
  CHECK((*good)->named_parameters()[2].name == "head.weight");

  auto missing = make_model({{"conv2d", "", {{"kernel", 5}}}});
  REQUIRE_FALSE(missing.has_value());
  CHECK_THAT(missing.error().message, Catch::Contains("layer 1") && Catch::Contains("out_channels"));
  auto unknown = make_model({{"relu", "", {}}, {"linear", "", {{"out_features", 10}, {"bias", 1}}}});
  REQUIRE_FALSE(unknown.has_value());
  CHECK_THAT(unknown.error().message, Catch::Contains("layer 2") && Catch::Contains("'bias'"));
  auto fractional = make_model({{"linear", "", {{"out_features", 2.5}}}});
  REQUIRE_FALSE(fractional.has_value());
  auto type = make_model({{"conv3d", "", {}}});
  REQUIRE_FALSE(type.has_value());
  CHECK_THAT(type.error().message, Catch::Contains("conv3d"));
}

TEST_CASE("two layers with one name are refused", "[compute][model]") {
  Model m;
  m.add(std::make_unique<Flatten>(), "x");
  m.add(std::make_unique<Linear>(0, 2), "x");
  auto r = m.build({4}, 0);
  REQUIRE_FALSE(r.has_value());
  CHECK_THAT(r.error().message, Catch::Contains("'x'"));
}

TEST_CASE("a model refuses an input that is not a batch of its samples, naming both shapes, in every backend",
          "[compute][model][shapes]") {
  const std::string name = GENERATE("ref", "onednn");
  CAPTURE(name);
  auto backend = std::move(*make_backend(name));
  auto m = make_lenet();
  REQUIRE(m->build({1, 28, 28}, 0).has_value());
  const Shape wrong =
      GENERATE(Shape{4, 1, 32, 32}, Shape{4, 3, 28, 28}, Shape{4, 784}, Shape{1, 28, 28}, Shape{0, 1, 28, 28});
  CAPTURE(wrong.to_string());
  // Room for the largest of the wrong shapes, so a kernel that ran anyway would read only this.
  std::vector<float> data(4 * 3 * 32 * 32, 0.5f);
  const auto logits = m->forward(*backend, ConstTensorView{data.data(), wrong}, true);
  REQUIRE_FALSE(logits.has_value());
  CHECK(logits.error().code == Errc::invalid_argument);
  CHECK_THAT(logits.error().message, Catch::Contains("[n, 1, 28, 28]") && Catch::Contains(wrong.to_string()));

  // The model is unharmed: the right shape runs next.
  const Tensor x({2, 1, 28, 28});
  const auto ok = m->forward(*backend, x, true);
  REQUIRE(ok.has_value());
  CHECK(ok->shape == Shape{2, 10});
}

namespace {

/// A small network with a layer oneDNN's plans do not take (dropout, here at p = 0).
std::unique_ptr<Model> with_dropout() {
  auto m = make_model({{"conv2d", "", {{"out_channels", 6}, {"kernel", 5}}},
                       {"relu", "", {}},
                       {"flatten", "", {}},
                       {"dropout", "", {{"p", 0.0}}},
                       {"linear", "", {{"out_features", 32}}},
                       {"relu", "", {}},
                       {"linear", "", {{"out_features", 10}}}});
  REQUIRE(m.has_value());
  return std::move(*m);
}

}  // namespace

TEST_CASE("the backward pass hands on each layer's gradients once they are final, last layer first, in every backend",
          "[compute][model][ready]") {
  const std::string name = GENERATE("ref", "onednn");
  const bool dropout = GENERATE(false, true);  // a layer oneDNN does not plan: layer by layer there too
  CAPTURE(name, dropout);
  auto backend = std::move(*make_backend(name));
  auto made = dropout ? with_dropout() : make_lenet();
  auto& m = *made;
  REQUIRE(m.build({1, 28, 28}, 3).has_value());
  Tensor x({8, 1, 28, 28});
  Rng r(8);
  for (float& v : x.span()) v = r.uniform();
  Tensor dlogits({8, 10});
  for (float& v : dlogits.span()) v = r.uniform(-1.0f, 1.0f);

  REQUIRE(m.forward(*backend, x, true).has_value());
  m.backward(*backend, dlogits);
  const std::vector<float> plain(m.gradients().begin(), m.gradients().end());

  struct Handed {
    size_t begin, end;
    std::vector<float> values;  // as they were when handed on
  };
  std::vector<Handed> handed;
  std::fill(m.gradients().begin(), m.gradients().end(), std::nanf(""));
  REQUIRE(m.forward(*backend, x, true).has_value());
  m.backward(*backend, dlogits, [&](size_t begin, size_t end) {
    handed.push_back({begin, end, {m.gradients().begin() + static_cast<ptrdiff_t>(begin),
                                   m.gradients().begin() + static_cast<ptrdiff_t>(end)}});
  });
  // One range per layer with parameters, the last layer's first, together the whole buffer once.
  const size_t layers_with_parameters = m.named_parameters().size() / 2;
  REQUIRE(handed.size() == layers_with_parameters);
  size_t expected_end = m.gradients().size();
  for (const auto& h : handed) {
    CHECK(h.end == expected_end);
    REQUIRE(h.begin < h.end);
    expected_end = h.begin;
    // Final when handed on: what the whole backward leaves there, and what it computes without a hook.
    for (size_t i = h.begin; i < h.end; ++i) {
      REQUIRE(h.values[i - h.begin] == m.gradients()[i]);
      REQUIRE(plain[i] == m.gradients()[i]);
    }
  }
  CHECK(expected_end == 0);
}

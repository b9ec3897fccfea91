#include <catch2/catch.hpp>

#include "compute/optimizer.hpp"
#include "compute/presets.hpp"
#include "compute/ref/ref_backend.hpp"
#include "compute/train.hpp"

using namespace tepdist::compute;

namespace {

/// Trains model on data for `epochs`, with SGD lr 0.05 momentum 0.9, batch 32; returns the
/// final parameters.
std::vector<float> train(Model& model, const Dataset& data, int epochs, uint64_t seed) {
  auto backend = make_ref_backend();
  backend->set_threads(2);
  auto opt = std::move(*make_optimizer({}, model.parameters().size()));
  LossScratch scratch;
  Tensor x;
  std::vector<int32_t> y;
  for (int e = 0; e < epochs; ++e) {
    const auto order = shuffled_indices(data.size(), seed, e);
    for (int64_t start = 0; start < data.size(); start += 32) {
      const std::span<const int64_t> idx(order.data() + start, static_cast<size_t>(std::min<int64_t>(32, data.size() - start)));
      gather_batch(data, idx, x, y);
      compute_gradients(model, *backend, x, y, scratch);
      opt->step(model.parameters(), model.gradients(), 0.05f);
    }
  }
  return {model.parameters().begin(), model.parameters().end()};
}

}  // namespace

TEST_CASE("lenet learns the synthetic classes from chance to nearly all right", "[compute][train]") {
  const Dataset all = make_synthetic(1200, 4);
  const Dataset train_set = all.head(1000);
  std::vector<int64_t> rest(200);
  std::iota(rest.begin(), rest.end(), 1000);
  const Dataset test_set = subset(all, rest);
  auto model = make_lenet();
  REQUIRE(model->build(train_set.sample_shape(), 0).has_value());
  auto backend = make_ref_backend();
  const Evaluation before = evaluate(*model, *backend, test_set);
  CHECK(before.accuracy < 0.3);
  train(*model, train_set, 2, 0);
  const Evaluation after = evaluate(*model, *backend, test_set);
  CHECK(after.accuracy > 0.95);
  CHECK(after.loss < before.loss);
}

TEST_CASE("training is deterministic given the seed", "[compute][train]") {
  const Dataset data = make_synthetic(256, 1);
  auto a = make_lenet(), b = make_lenet(), c = make_lenet();
  for (auto* m : {a.get(), b.get()}) REQUIRE(m->build(data.sample_shape(), 7).has_value());
  REQUIRE(c->build(data.sample_shape(), 8).has_value());
  const auto pa = train(*a, data, 1, 7);
  const auto pb = train(*b, data, 1, 7);
  const auto pc = train(*c, data, 1, 8);
  CHECK(pa == pb);
  CHECK(pa != pc);
}

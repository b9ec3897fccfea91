#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <csignal>
#include <numeric>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

#include "compute/backends.hpp"
#include "compute/optimizer.hpp"
#include "compute/presets.hpp"
#include "compute/ref/ref_backend.hpp"
#include "compute/resident.hpp"
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
      REQUIRE(try_compute_gradients(model, *backend, x, y, scratch).has_value());
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
  const auto before = try_evaluate(*model, *backend, test_set);
  REQUIRE(before.has_value());
  CHECK(before->accuracy < 0.3);
  train(*model, train_set, 2, 0);
  const auto after = try_evaluate(*model, *backend, test_set);
  REQUIRE(after.has_value());
  CHECK(after->accuracy > 0.95);
  CHECK(after->loss < before->loss);
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

TEST_CASE("a training step refuses a bad label or a batch of the wrong shape and leaves the gradients as they were",
          "[compute][train][labels][shapes]") {
  const std::string name = GENERATE("ref", "onednn");
  CAPTURE(name);
  auto backend = std::move(*make_backend(name));
  const Dataset data = make_synthetic(8, 3);
  auto model = make_lenet();
  REQUIRE(model->build(data.sample_shape(), 0).has_value());
  Tensor x;
  std::vector<int32_t> y;
  const std::vector<int64_t> all{0, 1, 2, 3, 4, 5, 6, 7};
  gather_batch(data, all, x, y);
  LossScratch scratch;
  std::fill(model->gradients().begin(), model->gradients().end(), 7.0f);
  auto untouched = [&] {
    return std::all_of(model->gradients().begin(), model->gradients().end(), [](float g) { return g == 7.0f; });
  };

  y[5] = 10;
  const auto bad_label = try_compute_gradients(*model, *backend, x, y, scratch);
  REQUIRE_FALSE(bad_label.has_value());
  CHECK_THAT(bad_label.error().message, Catch::Contains("label 10 at index 5") && Catch::Contains("10 classes"));
  CHECK(untouched());

  y[5] = 1;
  const ConstTensorView flat{x.data(), {8, 28 * 28}};
  const auto bad_shape = try_compute_gradients(*model, *backend, flat, y, scratch);
  REQUIRE_FALSE(bad_shape.has_value());
  CHECK_THAT(bad_shape.error().message, Catch::Contains("[n, 1, 28, 28]") && Catch::Contains("[8, 784]"));
  CHECK(untouched());

  const auto fine = try_compute_gradients(*model, *backend, x, y, scratch);
  REQUIRE(fine.has_value());
  CHECK(std::isfinite(*fine));
  CHECK_FALSE(untouched());
}

TEST_CASE("evaluation refuses a data set whose labels the model has no class for, in every backend",
          "[compute][train][labels]") {
  const std::string name = GENERATE("ref", "onednn");
  CAPTURE(name);
  auto backend = std::move(*make_backend(name));
  Dataset data = make_synthetic(300, 3);
  auto model = make_lenet();
  REQUIRE(model->build(data.sample_shape(), 0).has_value());
  data.labels[290] = 12;  // in the second batch of 256
  const auto e = try_evaluate(*model, *backend, data);
  REQUIRE_FALSE(e.has_value());
  CHECK_THAT(e.error().message, Catch::Contains("label 12 at index 34") && Catch::Contains("10 classes"));
}

TEST_CASE("a model with a NaN parameter evaluates to a NaN loss and no right answers, in every backend",
          "[compute][train][nan]") {
  const std::string name = GENERATE("ref", "onednn");
  CAPTURE(name);
  auto backend = std::move(*make_backend(name));
  const Dataset data = make_synthetic(200, 3);
  REQUIRE(std::count(data.labels.begin(), data.labels.end(), 0) > 0);  // a NaN row's arg-max used to be 0
  auto model = make_lenet();
  REQUIRE(model->build(data.sample_shape(), 0).has_value());
  model->parameters()[model->named_parameters().back().offset] = NAN;  // fc2.bias[0]
  const auto e = try_evaluate(*model, *backend, data);
  REQUIRE(e.has_value());
  CHECK(std::isnan(e->loss));
  CHECK(e->accuracy == 0.0);
}

TEST_CASE("a step whose loss is not finite hands no gradients on, in every backend", "[compute][train][nan]") {
  const std::string name = GENERATE("ref", "onednn");
  CAPTURE(name);
  auto backend = std::move(*make_backend(name));
  const Dataset data = make_synthetic(16, 3);
  auto model = make_lenet();
  REQUIRE(model->build(data.sample_shape(), 0).has_value());
  LossScratch scratch;
  Tensor x;
  std::vector<int32_t> y;
  std::vector<int64_t> idx(16);
  std::iota(idx.begin(), idx.end(), 0);
  gather_batch(data, idx, x, y);
  size_t handed = 0;
  const GradientsReady ready = [&](size_t begin, size_t end) { handed += end - begin; };
  REQUIRE(try_compute_gradients(*model, *backend, x, y, scratch, ready).has_value());
  CHECK(handed == model->gradients().size());
  handed = 0;
  model->parameters()[model->named_parameters().back().offset] = NAN;  // fc2.bias[0]: a NaN loss
  const auto loss = try_compute_gradients(*model, *backend, x, y, scratch, ready);
  REQUIRE(loss.has_value());
  CHECK(std::isnan(*loss));
  CHECK(handed == 0);
}

namespace {

/// Two LeNets built alike (one stepped directly, one through a resident state), Adam's options,
/// and a batch of six random samples with labels 0 to 5.
struct ResidentCase {
  std::unique_ptr<Model> direct = make_lenet(), through = make_lenet();
  OptimizerOptions options;
  Tensor x{{6, 1, 28, 28}};
  std::vector<int32_t> y{0, 1, 2, 3, 4, 5};
  ResidentCase() {
    REQUIRE(direct->build({1, 28, 28}, 4).has_value());
    REQUIRE(through->build({1, 28, 28}, 4).has_value());
    options.name = "adam";
    Rng r(3);
    for (float& v : x.span()) v = r.uniform();
  }
};

}  // namespace

TEST_CASE("the host backends' resident state is the model's own buffers: a step through it is the plain step",
          "[compute][train][resident]") {
  auto backend = make_ref_backend();
  ResidentCase c;
  auto& [direct, through, o, x, y] = c;
  auto resident = std::move(make_resident(*through, *backend, o).value());
  CHECK(resident->where() == "host memory");
  auto optimizer = std::move(make_optimizer(o, direct->parameters().size()).value());
  LossScratch scratch;
  for (int step = 0; step < 2; ++step) {
    const float want = try_compute_gradients(*direct, *backend, x, y, scratch).value();
    CHECK(resident->compute_gradients(x, y).value() == want);
    CHECK(resident->gradient_finite());
    optimizer->step(direct->parameters(), direct->gradients(), 0.01f);
    resident->step(0.01f);
  }
  resident->pull_parameters();  // a no-op: the model's buffers are the state
  CHECK(std::equal(direct->parameters().begin(), direct->parameters().end(), through->parameters().begin()));
  CHECK(resident->optimizer().steps() == 2);
  // the same refusals as try_compute_gradients, the gradient untouched
  const std::vector<int32_t> bad{0, 1, 2, 3, 4, 10};
  const auto refused = resident->compute_gradients(x, bad);
  REQUIRE_FALSE(refused.has_value());
  CHECK_THAT(refused.error().message, Catch::Contains("label 10 at index 5"));
  // and a gradient that is not finite is seen
  through->gradients()[7] = NAN;
  CHECK_FALSE(resident->gradient_finite());
  CHECK_FALSE(check_finite_step(3, 0.5f, resident->gradient_finite()).has_value());
}

TEST_CASE("an emulated device keeps the state apart: the same steps, and the host's copy NaN until it is pulled",
          "[compute][train][resident]") {
  auto plain = make_backend("ref").value();
  auto emulating = make_backend("ref", {.emulate_device = true}).value();
  CHECK(plain->make_resident(*make_lenet(), {}).value() == nullptr);  // a host backend: the model's buffers
  ResidentCase c;
  auto& [direct, through, o, x, y] = c;
  auto resident = std::move(make_resident(*through, *emulating, o).value());
  CHECK_THAT(resident->where(), Catch::Contains("emulate_device"));
  auto optimizer = std::move(make_optimizer(o, direct->parameters().size()).value());
  LossScratch scratch;
  const auto all_nan = [](std::span<const float> s) { return std::ranges::all_of(s, [](float v) { return std::isnan(v); }); };
  for (int step = 0; step < 2; ++step) {
    const float want = try_compute_gradients(*direct, *plain, x, y, scratch).value();
    CHECK(resident->compute_gradients(x, y).value() == want);
    CHECK(all_nan(through->gradients()));  // the gradient is the state's, not yet pulled
    resident->pull_gradients();
    CHECK(std::ranges::equal(direct->gradients(), through->gradients()));
    optimizer->step(direct->parameters(), direct->gradients(), 0.01f);
    resident->step(0.01f);
    CHECK(all_nan(through->parameters()));
    for (auto& [name, buffer] : resident->optimizer().state()) CHECK(all_nan(buffer));
  }
  CHECK(resident->optimizer().steps() == 2);
  resident->pull_parameters();
  resident->pull_optimizer();
  CHECK(std::ranges::equal(direct->parameters(), through->parameters()));
  const auto want_state = optimizer->state();
  const auto got_state = resident->optimizer().state();
  REQUIRE(want_state.size() == got_state.size());
  for (size_t k = 0; k < want_state.size(); ++k) CHECK(std::ranges::equal(want_state[k].second, got_state[k].second));
  // One more step of each; whether they end alike.
  const auto step_both = [&] {
    (void)resident->compute_gradients(x, y).value();
    resident->step(0.01f);
    resident->pull_parameters();
    (void)try_compute_gradients(*direct, *plain, x, y, scratch).value();
    optimizer->step(direct->parameters(), direct->gradients(), 0.01f);
    return std::ranges::equal(direct->parameters(), through->parameters());
  };
  // A pushed write to the host's copy is the state's: both take the same change.
  direct->parameters()[0] += 1.0f;
  through->parameters()[0] += 1.0f;
  resident->push_parameters();
  CHECK(step_both());
  // One without its push, which a device would lose at the next step, is a failed invariant at
  // the next compute or pull (in a child process: the check aborts).
  const auto aborts = [&](auto&& then) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      // The check's message and abort are expected: nothing of them on the test's output (Catch's
      // own SIGABRT handler would report a crash there).
      ::signal(SIGABRT, SIG_DFL);
      ::close(STDOUT_FILENO);
      ::close(STDERR_FILENO);
      through->parameters()[3] += 1.0f;
      then();
      ::_exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
  };
  CHECK(aborts([&] { (void)resident->compute_gradients(x, y); }));
  CHECK(aborts([&] { resident->pull_parameters(); }));
  CHECK_FALSE(aborts([&] { resident->push_parameters(); }));  // the sync point the write needs
  CHECK(step_both());  // the children's writes were theirs
  // The refusals are the host's.
  const std::vector<int32_t> bad{0, 1, 2, 3, 4, 10};
  CHECK_FALSE(resident->compute_gradients(x, bad).has_value());
  CHECK_THAT(make_backend("cuda", {.emulate_device = true}).error().message,
             Catch::Contains("keeps it on its device already"));
}

TEST_CASE("asking for the cuda backend where it cannot run says why", "[compute][backend]") {
  auto made = make_backend("cuda");
  if (made) {
    WARN("this machine has a CUDA device: the [cuda] tests check the backend");
    return;
  }
  if (cuda_built())
    CHECK_THAT(made.error().message, Catch::Contains("no CUDA device here"));
  else
    CHECK_THAT(made.error().message, Catch::Contains("not in this build"));
  CHECK_THAT(make_backend("tpu").error().message, Catch::Contains("known: onednn, ref, cuda"));
}

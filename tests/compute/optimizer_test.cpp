#include <catch2/catch.hpp>
#include <cmath>

#include "compute/optimizer.hpp"

using namespace tepdist::compute;

namespace {

std::unique_ptr<Optimizer> make(OptimizerOptions o, size_t n) {
  auto r = make_optimizer(o, n);
  REQUIRE(r.has_value());
  return std::move(*r);
}

}  // namespace

TEST_CASE("sgd with momentum follows torch.optim.SGD", "[compute][optimizer]") {
  OptimizerOptions o;
  o.momentum = 0.9f;
  auto opt = make(o, 1);
  std::vector<float> p{1.0f};
  const std::vector<float> g{0.5f};
  opt->step(p, g, 0.1f);  // buf = 0.5, p = 1 - 0.05
  CHECK(p[0] == Approx(0.95f));
  opt->step(p, g, 0.1f);  // buf = 0.9 * 0.5 + 0.5 = 0.95, p = 0.95 - 0.095
  CHECK(p[0] == Approx(0.855f));
  CHECK(opt->steps() == 2);
}

TEST_CASE("sgd with nesterov and weight decay", "[compute][optimizer]") {
  OptimizerOptions o;
  o.momentum = 0.5f;
  o.nesterov = true;
  o.weight_decay = 0.1f;
  auto opt = make(o, 1);
  std::vector<float> p{2.0f};
  const std::vector<float> g{1.0f};
  opt->step(p, g, 0.1f);  // g' = 1 + 0.2 = 1.2; buf = 1.2; step = 1.2 + 0.5 * 1.2 = 1.8
  CHECK(p[0] == Approx(2.0f - 0.18f));
}

TEST_CASE("plain sgd without momentum keeps no state", "[compute][optimizer]") {
  OptimizerOptions o;
  o.momentum = 0.0f;
  auto opt = make(o, 3);
  CHECK(opt->state().empty());
  std::vector<float> p{1.0f, 2.0f, 3.0f};
  opt->step(p, std::vector<float>{1.0f, 1.0f, 1.0f}, 0.5f);
  CHECK(p == std::vector<float>{0.5f, 1.5f, 2.5f});
}

TEST_CASE("adam's first step moves each parameter by about lr against its gradient's sign", "[compute][optimizer]") {
  OptimizerOptions o;
  o.name = "adam";
  auto opt = make(o, 2);
  std::vector<float> p{1.0f, 1.0f};
  opt->step(p, std::vector<float>{3.0f, -0.001f}, 0.01f);
  CHECK(p[0] == Approx(0.99f).epsilon(1e-5));
  CHECK(p[1] == Approx(1.01f).epsilon(1e-3));
  REQUIRE(opt->state().size() == 2);
}

TEST_CASE("adamw decays weights apart from the gradient, adam folds decay into it", "[compute][optimizer]") {
  OptimizerOptions o;
  o.weight_decay = 0.5f;
  o.name = "adamw";
  auto w = make(o, 1);
  o.name = "adam";
  auto a = make(o, 1);
  std::vector<float> pw{2.0f}, pa{2.0f};
  const std::vector<float> zero{0.0f};
  w->step(pw, zero, 0.1f);  // 2 * (1 - 0.05) = 1.9, then no gradient step
  a->step(pa, zero, 0.1f);  // gradient 0 + 0.5 * 2 = 1: an Adam step of about lr
  CHECK(pw[0] == Approx(1.9f));
  CHECK(pa[0] == Approx(1.9f).epsilon(1e-4));
  w->step(pw, zero, 0.1f);
  CHECK(pw[0] == Approx(1.9f * 0.95f));
}

TEST_CASE("a change of optimiser carries its state only to one that keeps the same buffers", "[compute][optimizer]") {
  OptimizerOptions adam;
  adam.name = "adam";
  auto from = make(adam, 2);
  std::vector<float> p{1.0f, 1.0f};
  from->step(p, std::vector<float>{1.0f, -2.0f}, 0.01f);
  from->step(p, std::vector<float>{0.5f, -1.0f}, 0.01f);

  // AdamW keeps Adam's moments: they and the step count carry on, bit for bit.
  OptimizerOptions adamw = adam;
  adamw.name = "adamw";
  auto to = make(adamw, 2);
  CHECK(same_layout(*from, *to));
  CHECK(carry_state(*from, *to));
  CHECK(to->steps() == 2);
  for (size_t b = 0; b < 2; ++b) {
    const auto x = from->state()[b].second, y = to->state()[b].second;
    CHECK(std::vector<float>(x.begin(), x.end()) == std::vector<float>(y.begin(), y.end()));
    CHECK(y[0] != 0.0f);
  }

  // SGD with momentum keeps another buffer: it starts afresh, at step 0.
  OptimizerOptions sgd;
  sgd.momentum = 0.9f;
  auto other = make(sgd, 2);
  CHECK_FALSE(same_layout(*from, *other));
  CHECK_FALSE(carry_state(*from, *other));
  CHECK(other->steps() == 0);
  CHECK(other->state()[0].second[0] == 0.0f);

  // A buffer of another size is another layout too.
  auto shorter = make(adam, 1);
  CHECK_FALSE(carry_state(*from, *shorter));
}

TEST_CASE("bad optimiser options are refused by name", "[compute][optimizer]") {
  OptimizerOptions o;
  o.name = "lion";
  auto r = make_optimizer(o, 1);
  REQUIRE_FALSE(r.has_value());
  CHECK_THAT(r.error().message, Catch::Contains("lion"));
  o = {};
  o.momentum = 0.0f;
  o.nesterov = true;
  CHECK_FALSE(make_optimizer(o, 1).has_value());
}

TEST_CASE("schedules: constant, step, cosine, each after a linear warm-up", "[compute][schedule]") {
  ScheduleOptions s;
  s.base_lr = 1.0f;
  s.warmup_steps = 4;
  auto constant = LrSchedule::make(s);
  REQUIRE(constant.has_value());
  CHECK(constant->at(0) == Approx(0.25f));
  CHECK(constant->at(3) == Approx(1.0f));
  CHECK(constant->at(1000) == Approx(1.0f));

  s.kind = "step";
  s.step_size = 10;
  s.gamma = 0.5f;
  auto step = LrSchedule::make(s);
  REQUIRE(step.has_value());
  CHECK(step->at(4 + 9) == Approx(1.0f));
  CHECK(step->at(4 + 10) == Approx(0.5f));
  CHECK(step->at(4 + 25) == Approx(0.25f));

  s.kind = "cosine";
  s.total_steps = 104;
  s.min_lr = 0.1f;
  auto cosine = LrSchedule::make(s);
  REQUIRE(cosine.has_value());
  CHECK(cosine->at(4) == Approx(1.0f));
  CHECK(cosine->at(54) == Approx(0.55f));
  CHECK(cosine->at(104) == Approx(0.1f));
  CHECK(cosine->at(500) == Approx(0.1f));

  s.total_steps = 3;  // shorter than the warm-up
  CHECK_FALSE(LrSchedule::make(s).has_value());
}

#include <catch2/catch.hpp>

#include "compute/rng.hpp"
#include "compute/tensor.hpp"

using namespace tepdist::compute;

TEST_CASE("a shape knows its element count, its sample shape and a batch of it", "[compute][tensor]") {
  const Shape s{64, 1, 28, 28};
  CHECK(s.rank() == 4);
  CHECK(s.elements() == 64 * 28 * 28);
  CHECK(s.sample() == Shape{1, 28, 28});
  CHECK(s.with_batch(3) == Shape{3, 1, 28, 28});
  CHECK(s.sample().prepend(5) == Shape{5, 1, 28, 28});
  CHECK(Shape{}.elements() == 1);
  CHECK(s.to_string() == "[64, 1, 28, 28]");
}

TEST_CASE("a tensor is zero-initialised and keeps its buffer when shrunk", "[compute][tensor]") {
  Tensor t({2, 3});
  for (float v : t.span()) CHECK(v == 0.0f);
  t[5] = 7.0f;
  const float* before = t.data();
  t.resize({2, 2});
  CHECK(t.elements() == 4);
  CHECK(t.data() == before);
}

TEST_CASE("the random source is reproducible from its seed and its saved state", "[compute][rng]") {
  Rng a(42), b(42), c(43);
  for (int i = 0; i < 10; ++i) {
    const uint64_t x = a.next();
    CHECK(x == b.next());
    CHECK(x != c.next());
  }
  const auto saved = a.state();
  const float u = a.uniform();
  a.set_state(saved);
  CHECK(a.uniform() == u);
}

TEST_CASE("uniform draws stay in range and below() is unbiased enough to hit every value", "[compute][rng]") {
  Rng r(1);
  int hits[7] = {};
  for (int i = 0; i < 7000; ++i) {
    const float u = r.uniform(-2.0f, 3.0f);
    REQUIRE(u >= -2.0f);
    REQUIRE(u < 3.0f);
    ++hits[r.below(7)];
  }
  for (int h : hits) CHECK(h > 800);  // 1000 expected each; 800 is over 6 standard deviations away
}

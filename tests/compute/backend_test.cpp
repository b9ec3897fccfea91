// The checks at the boundary every backend goes through (compute/backend.cpp): a label the data
// set brought is refused with an error that names it before any kernel indexes with it, in every
// backend alike. Out-of-bounds writes are caught without a sanitizer: the outputs are views into
// larger buffers whose tails hold canaries that must survive.

#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "compute/backends.hpp"
#include "compute/rng.hpp"

using namespace tepdist::compute;

namespace {

constexpr float canary = 1234.5f;
constexpr int64_t tail = 64;  // canaries past each output: more than a label can overshoot by here

/// A [n, classes] view at the start of a buffer with `tail` canaries after it.
struct Guarded {
  std::vector<float> buffer;
  TensorView view;

  explicit Guarded(Shape s) : buffer(static_cast<size_t>(s.elements() + tail), canary) { view = {buffer.data(), s}; }
  bool tail_intact() const {
    for (size_t i = static_cast<size_t>(view.elements()); i < buffer.size(); ++i)
      if (buffer[i] != canary) return false;
    return true;
  }
};

Tensor logits_of(Shape s) {
  Tensor t(s);
  Rng r(2);
  for (float& v : t.span()) v = r.uniform(-2.0f, 2.0f);
  return t;
}

}  // namespace

TEST_CASE("the loss refuses a label outside 0 to classes - 1, naming it, its index and the classes, in every backend",
          "[compute][backend][labels]") {
  const std::string name = GENERATE("ref", "onednn");
  const int32_t bad = GENERATE(10, 11, 63, -1);
  CAPTURE(name, bad);
  auto backend = std::move(*make_backend(name));
  const Tensor logits = logits_of({4, 10});
  const std::vector<int32_t> labels{3, 0, 9, bad};  // the last row: an overshoot runs past the buffer
  Guarded probs({4, 10}), dlogits({4, 10});

  const auto loss = backend->softmax_cross_entropy_forward(logits, labels, probs.view);
  REQUIRE_FALSE(loss.has_value());
  CHECK(loss.error().code == Errc::invalid_argument);
  CHECK_THAT(loss.error().message, Catch::Contains(fmt::format("label {} at index 3", bad)) &&
                                       Catch::Contains("[0, 10)") && Catch::Contains("10 classes"));
  const auto grad = backend->softmax_cross_entropy_backward(probs.view, labels, dlogits.view);
  REQUIRE_FALSE(grad.has_value());
  CHECK_THAT(grad.error().message, Catch::Contains(fmt::format("label {} at index 3", bad)));
  CHECK(probs.tail_intact());
  CHECK(dlogits.tail_intact());

  // The bounds themselves are labels: 0 and classes - 1 pass.
  const std::vector<int32_t> edges{0, 9, 9, 0};
  const auto fine = backend->softmax_cross_entropy_forward(logits, edges, probs.view);
  REQUIRE(fine.has_value());
  CHECK(std::isfinite(*fine));
  CHECK(backend->softmax_cross_entropy_backward(probs.view, edges, dlogits.view).has_value());
  CHECK(probs.tail_intact());
  CHECK(dlogits.tail_intact());
}

TEST_CASE("the loss refuses labels that do not match the batch in number, and an empty batch, in every backend",
          "[compute][backend][labels]") {
  const std::string name = GENERATE("ref", "onednn");
  CAPTURE(name);
  auto backend = std::move(*make_backend(name));
  const Tensor logits = logits_of({4, 10});
  const std::vector<int32_t> three{1, 2, 3}, five{1, 2, 3, 4, 5};
  Guarded probs({4, 10});
  for (const auto* labels : {&three, &five}) {
    const auto loss = backend->softmax_cross_entropy_forward(logits, *labels, probs.view);
    REQUIRE_FALSE(loss.has_value());
    CHECK_THAT(loss.error().message,
               Catch::Contains(fmt::format("{} labels for a batch of 4 samples", labels->size())));
    CHECK_FALSE(backend->softmax_cross_entropy_backward(probs.view, *labels, probs.view).has_value());
  }
  CHECK(probs.tail_intact());

  const Tensor none({0, 10});
  Tensor none_probs({0, 10});
  const auto empty = backend->softmax_cross_entropy_forward(none, {}, none_probs);
  REQUIRE_FALSE(empty.has_value());
  CHECK_THAT(empty.error().message, Catch::Contains("empty"));
}

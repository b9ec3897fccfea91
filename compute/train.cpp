#include "compute/train.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "base/check.hpp"

namespace tepdist::compute {

Result<float> try_compute_gradients(Model& model, Backend& backend, ConstTensorView x, std::span<const int32_t> labels,
                                    LossScratch& scratch, const GradientsReady& ready) {
  const auto logits = model.forward(backend, x, true);
  if (!logits) return std::unexpected(logits.error());
  scratch.probs.resize(logits->shape);
  scratch.dlogits.resize(logits->shape);
  const auto loss = backend.softmax_cross_entropy_forward(*logits, labels, scratch.probs);
  if (!loss) return loss;
  const auto dlogits = backend.softmax_cross_entropy_backward(scratch.probs, labels, scratch.dlogits);
  TEPDIST_CHECK(dlogits.has_value());  // the labels the forward accepted
  static const GradientsReady none;
  model.backward(backend, scratch.dlogits, std::isfinite(*loss) ? ready : none);
  return loss;
}

Result<void> check_finite_step(int64_t step, float loss, std::span<const float> gradient) {
  return check_finite_step(step, loss, std::all_of(gradient.begin(), gradient.end(), [](float g) { return std::isfinite(g); }));
}

Result<void> check_finite_step(int64_t step, float loss, bool gradient_finite) {
  if (!std::isfinite(loss))
    return fail(Errc::diverged, fmt::format("step {}: the loss is {}: the model diverged (lower optimizer.lr)", step, loss));
  if (!gradient_finite)
    return fail(Errc::diverged,
                fmt::format("step {}: the gradient is not finite (the loss is {}): the model diverged (lower optimizer.lr)",
                            step, loss));
  return {};
}

Result<Evaluation> try_evaluate(Model& model, Backend& backend, const Dataset& data, int64_t batch) {
  TEPDIST_CHECK(batch > 0);
  Evaluation e;
  Tensor x, probs;
  std::vector<int32_t> y;
  std::vector<int64_t> indices(static_cast<size_t>(batch));
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int64_t start = 0; start < data.size(); start += batch) {
    const int64_t n = std::min(batch, data.size() - start);
    indices.resize(static_cast<size_t>(n));
    std::iota(indices.begin(), indices.end(), start);
    gather_batch(data, indices, x, y);
    const auto logits = model.forward(backend, x, false);
    if (!logits) return std::unexpected(logits.error());
    probs.resize(logits->shape);
    const auto loss = backend.softmax_cross_entropy_forward(*logits, y, probs);
    if (!loss) return std::unexpected(loss.error());
    loss_sum += static_cast<double>(*loss) * static_cast<double>(n);
    const int64_t classes = logits->shape[1];
    for (int64_t i = 0; i < n; ++i) {
      const float* p = probs.data() + i * classes;
      // max_element skips a NaN after the first element: a NaN row would pass for a guess.
      if (std::none_of(p, p + classes, [](float v) { return std::isnan(v); }) &&
          std::max_element(p, p + classes) - p == y[static_cast<size_t>(i)])
        ++correct;
    }
  }
  e.samples = data.size();
  if (e.samples > 0) {
    e.accuracy = static_cast<double>(correct) / static_cast<double>(e.samples);
    e.loss = loss_sum / static_cast<double>(e.samples);
  }
  return e;
}

}  // namespace tepdist::compute

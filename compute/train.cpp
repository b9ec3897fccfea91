#include "compute/train.hpp"

#include <algorithm>
#include <numeric>

namespace tepdist::compute {

float compute_gradients(Model& model, Backend& backend, ConstTensorView x, std::span<const int32_t> labels,
                        LossScratch& scratch) {
  const ConstTensorView logits = model.forward(backend, x, true);
  scratch.probs.resize(logits.shape);
  scratch.dlogits.resize(logits.shape);
  const float loss = backend.softmax_cross_entropy_forward(logits, labels, scratch.probs);
  backend.softmax_cross_entropy_backward(scratch.probs, labels, scratch.dlogits);
  model.backward(backend, scratch.dlogits);
  return loss;
}

Evaluation evaluate(Model& model, Backend& backend, const Dataset& data, int64_t batch) {
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
    const ConstTensorView logits = model.forward(backend, x, false);
    probs.resize(logits.shape);
    loss_sum += static_cast<double>(backend.softmax_cross_entropy_forward(logits, y, probs)) * static_cast<double>(n);
    const int64_t classes = logits.shape[1];
    for (int64_t i = 0; i < n; ++i) {
      const float* p = probs.data() + i * classes;
      if (std::max_element(p, p + classes) - p == y[static_cast<size_t>(i)]) ++correct;
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

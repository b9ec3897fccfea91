// Reference ReLU and softmax cross-entropy.
//
// Shape contract:
//   relu: x, y, dy, dx all the same shape (any)
//   softmax cross-entropy: logits, probs, dlogits [n, classes]; labels [n], each in [0, classes)
//   (Backend checks the labels before calling these)
//     loss = -(1/n) sum_i log softmax(logits_i)[labels_i]
//     dlogits = (probs - onehot(labels)) / n
//
// NaN propagates: std::max(x, 0) returns x unless x < 0, which a NaN never is; a NaN logit makes
// its row's sum NaN, so its probabilities and the loss are NaN.

#include <algorithm>
#include <cmath>

#include "compute/ref/ref_backend.hpp"
#include "base/check.hpp"

namespace tepdist::compute::ref {

void relu_forward(ConstTensorView x, TensorView y) {
  TEPDIST_CHECK(x.elements() == y.elements());
  for (int64_t i = 0; i < x.elements(); ++i) y.data[i] = std::max(x.data[i], 0.0f);
}

void relu_backward(ConstTensorView y, ConstTensorView dy, TensorView dx) {
  TEPDIST_CHECK(y.elements() == dy.elements() && dy.elements() == dx.elements());
  for (int64_t i = 0; i < y.elements(); ++i) dx.data[i] = y.data[i] > 0.0f ? dy.data[i] : 0.0f;
}

float softmax_cross_entropy_forward(ConstTensorView logits, std::span<const int32_t> labels, TensorView probs) {
  const int64_t n = logits.shape[0], classes = logits.elements() / n;
  TEPDIST_CHECK(static_cast<int64_t>(labels.size()) == n && probs.elements() == logits.elements());
  double loss = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float* z = logits.data + i * classes;
    float* p = probs.data + i * classes;
    const float zmax = *std::max_element(z, z + classes);  // subtracting the max keeps exp finite
    double sum = 0.0;
    for (int64_t j = 0; j < classes; ++j) sum += std::exp(static_cast<double>(z[j] - zmax));
    for (int64_t j = 0; j < classes; ++j) p[j] = static_cast<float>(std::exp(static_cast<double>(z[j] - zmax)) / sum);
    loss += std::log(sum) - static_cast<double>(z[labels[static_cast<size_t>(i)]] - zmax);
  }
  return static_cast<float>(loss / static_cast<double>(n));
}

void softmax_cross_entropy_backward(ConstTensorView probs, std::span<const int32_t> labels, TensorView dlogits) {
  const int64_t n = probs.shape[0], classes = probs.elements() / n;
  TEPDIST_CHECK(static_cast<int64_t>(labels.size()) == n && dlogits.elements() == probs.elements());
  const float inv_n = 1.0f / static_cast<float>(n);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < classes; ++j) {
      const float onehot = j == labels[static_cast<size_t>(i)] ? 1.0f : 0.0f;
      dlogits.data[i * classes + j] = (probs.data[i * classes + j] - onehot) * inv_n;
    }
}

}  // namespace tepdist::compute::ref

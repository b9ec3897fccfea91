// The checks every backend's loss goes through (see backend.hpp): the labels come from a user's
// data set, so a bad one is an error value here, where the kernels below would index with it.

#include "compute/backend.hpp"

#include <fmt/format.h>

#include "base/check.hpp"

namespace tepdist::compute {

Result<void> check_labels(std::span<const int32_t> labels, int64_t n, int64_t classes) {
  if (n == 0) return fail(Errc::invalid_argument, "loss: the batch is empty; a mean loss needs one sample");
  if (static_cast<int64_t>(labels.size()) != n)
    return fail(Errc::invalid_argument, fmt::format("loss: {} labels for a batch of {} samples", labels.size(), n));
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] < 0 || labels[i] >= classes)
      return fail(Errc::invalid_argument,
                  fmt::format("loss: label {} at index {} of the batch is outside [0, {}): the model has {} classes",
                              labels[i], i, classes, classes));
  return {};
}

Result<float> Backend::softmax_cross_entropy_forward(ConstTensorView logits, std::span<const int32_t> labels,
                                                     TensorView probs) {
  // The shapes are the model's and the caller's scratch: a mismatch is our bug, not the data's.
  TEPDIST_CHECK(logits.shape.rank() == 2 && probs.shape == logits.shape);
  if (auto ok = check_labels(labels, logits.shape[0], logits.shape[1]); !ok) return std::unexpected(ok.error());
  return do_softmax_cross_entropy_forward(logits, labels, probs);
}

Result<void> Backend::softmax_cross_entropy_backward(ConstTensorView probs, std::span<const int32_t> labels,
                                                     TensorView dlogits) {
  TEPDIST_CHECK(probs.shape.rank() == 2 && dlogits.shape == probs.shape);
  if (auto ok = check_labels(labels, probs.shape[0], probs.shape[1]); !ok) return ok;
  do_softmax_cross_entropy_backward(probs, labels, dlogits);
  return {};
}

}  // namespace tepdist::compute

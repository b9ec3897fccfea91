#pragma once
// The reference backend: plain loops that a reader can check against the maths, one kernel per
// file, the shape contract at the top of each. Every fast backend is tested against this one.

#include <memory>

#include "compute/backend.hpp"

namespace tepdist::compute {

std::unique_ptr<Backend> make_ref_backend();

}  // namespace tepdist::compute

namespace tepdist::compute::ref {

std::unique_ptr<Conv2dKernel> make_conv2d(const Conv2dGeometry& g);
std::unique_ptr<MaxPool2dKernel> make_max_pool2d(const Pool2dGeometry& g);
std::unique_ptr<LinearKernel> make_linear(const LinearGeometry& g);
void relu_forward(ConstTensorView x, TensorView y);
void relu_backward(ConstTensorView y, ConstTensorView dy, TensorView dx);
float softmax_cross_entropy_forward(ConstTensorView logits, std::span<const int32_t> labels, TensorView probs);
void softmax_cross_entropy_backward(ConstTensorView probs, std::span<const int32_t> labels, TensorView dlogits);

}  // namespace tepdist::compute::ref

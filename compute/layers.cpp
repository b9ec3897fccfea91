#include "compute/layers.hpp"

#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include "base/check.hpp"

namespace tepdist::compute {
namespace {

// PyTorch's default for conv and linear layers (Kaiming-uniform with a = sqrt(5)) comes down to
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases alike; matching it keeps our runs
// comparable with the baseline's.
float fan_in_bound(int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); }

Result<void> check_positive(std::string_view layer, std::string_view field, int64_t value) {
  if (value > 0) return {};
  return fail(Errc::invalid_argument, fmt::format("{}: {} must be positive, got {}", layer, field, value));
}

}  // namespace

// ---- Conv2d ----------------------------------------------------------------------------------

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride, int64_t padding)
    : in_(in_channels), out_(out_channels), kernel_(kernel), stride_(stride), padding_(padding) {}

Result<Shape> Conv2d::configure(const Shape& input) {
  for (auto [field, value] : {std::pair{"out_channels", out_}, {"kernel", kernel_}, {"stride", stride_}})
    if (auto ok = check_positive("conv2d", field, value); !ok) return std::unexpected(ok.error());
  if (padding_ < 0) return fail(Errc::invalid_argument, "conv2d: padding must not be negative");
  if (input.rank() != 4)
    return fail(Errc::invalid_argument,
                fmt::format("conv2d needs an image input [n, c, h, w], got {}", input.to_string()));
  if (in_ != 0 && in_ != input[1])
    return fail(Errc::invalid_argument,
                fmt::format("conv2d expects {} input channels but its input has {}", in_, input[1]));
  in_ = input[1];
  geometry_ = {input[0], in_, input[2], input[3], out_, kernel_, kernel_, stride_, padding_};
  if (geometry_.oh() < 1 || geometry_.ow() < 1)
    return fail(Errc::invalid_argument, fmt::format("conv2d {}x{} kernel does not fit the {}x{} input", kernel_,
                                                    kernel_, input[2], input[3]));
  return geometry_.output();
}

std::vector<ParamSpec> Conv2d::parameter_specs() const {
  const float bound = fan_in_bound(in_ * kernel_ * kernel_);
  return {{"weight", {out_, in_, kernel_, kernel_}, bound}, {"bias", {out_}, bound}};
}

void Conv2d::bind(std::span<const TensorView> params, std::span<const TensorView> grads) {
  weight_ = params[0], bias_ = params[1], dweight_ = grads[0], dbias_ = grads[1];
}

Conv2dKernel& Conv2d::kernel_for(Backend& backend, int64_t batch) {
  Conv2dGeometry g = geometry_;
  g.n = batch;
  return kernels_.get(backend, g, [](Backend& b, const Conv2dGeometry& geo) { return b.make_conv2d(geo); });
}

void Conv2d::forward(PassContext& ctx, ConstTensorView x, TensorView y) {
  kernel_for(ctx.backend, x.shape[0]).forward(x, weight_, bias_, y);
}

void Conv2d::backward(PassContext& ctx, ConstTensorView x, ConstTensorView, ConstTensorView dy, TensorView dx) {
  auto& kernel = kernel_for(ctx.backend, x.shape[0]);
  kernel.backward_weights(x, dy, dweight_, dbias_);
  if (dx.data) kernel.backward_data(dy, weight_, dx);
}

PlannedLayer Conv2d::plan(int64_t batch) const {
  PlannedLayer p{.kind = PlannedLayer::Kind::conv2d, .input = geometry_.input().with_batch(batch), .conv = geometry_};
  p.conv.n = batch;
  return p;
}

std::string Conv2d::describe() const {
  return fmt::format("conv2d {}->{} {}x{} stride {} padding {}", in_, out_, kernel_, kernel_, stride_, padding_);
}

// ---- MaxPool2d -------------------------------------------------------------------------------

MaxPool2d::MaxPool2d(int64_t kernel, int64_t stride) : kernel_(kernel), stride_(stride == 0 ? kernel : stride) {}

Result<Shape> MaxPool2d::configure(const Shape& input) {
  for (auto [field, value] : {std::pair{"kernel", kernel_}, {"stride", stride_}})
    if (auto ok = check_positive("max_pool2d", field, value); !ok) return std::unexpected(ok.error());
  if (input.rank() != 4)
    return fail(Errc::invalid_argument,
                fmt::format("max_pool2d needs an image input [n, c, h, w], got {}", input.to_string()));
  geometry_ = {input[0], input[1], input[2], input[3], kernel_, stride_};
  if (geometry_.oh() < 1 || geometry_.ow() < 1)
    return fail(Errc::invalid_argument,
                fmt::format("max_pool2d window {} does not fit the {}x{} input", kernel_, input[2], input[3]));
  return geometry_.output();
}

MaxPool2dKernel& MaxPool2d::kernel_for(Backend& backend, int64_t batch) {
  Pool2dGeometry g = geometry_;
  g.n = batch;
  return kernels_.get(backend, g, [](Backend& b, const Pool2dGeometry& geo) { return b.make_max_pool2d(geo); });
}

void MaxPool2d::forward(PassContext& ctx, ConstTensorView x, TensorView y) {
  last_ = &kernel_for(ctx.backend, x.shape[0]);
  last_->forward(x, y);
}

void MaxPool2d::backward(PassContext& ctx, ConstTensorView x, ConstTensorView, ConstTensorView dy, TensorView dx) {
  auto& kernel = kernel_for(ctx.backend, x.shape[0]);
  TEPDIST_CHECK(&kernel == last_ && "backward must follow the forward it differentiates");
  if (dx.data) kernel.backward(dy, dx);
}

PlannedLayer MaxPool2d::plan(int64_t batch) const {
  PlannedLayer p{.kind = PlannedLayer::Kind::max_pool2d, .input = geometry_.input().with_batch(batch), .pool = geometry_};
  p.pool.n = batch;
  return p;
}

std::string MaxPool2d::describe() const { return fmt::format("max_pool2d {}x{} stride {}", kernel_, kernel_, stride_); }

// ---- Relu, Flatten ---------------------------------------------------------------------------

void Relu::forward(PassContext& ctx, ConstTensorView x, TensorView y) { ctx.backend.relu_forward(x, y); }

void Relu::backward(PassContext& ctx, ConstTensorView, ConstTensorView y, ConstTensorView dy, TensorView dx) {
  if (dx.data) ctx.backend.relu_backward(y, dy, dx);
}

PlannedLayer Relu::plan(int64_t batch) const {
  return {.kind = PlannedLayer::Kind::relu, .input = input_.with_batch(batch)};
}

PlannedLayer Flatten::plan(int64_t batch) const {
  return {.kind = PlannedLayer::Kind::flatten, .input = input_.with_batch(batch)};
}

Result<Shape> Flatten::configure(const Shape& input) {
  if (input.rank() < 1) return fail(Errc::invalid_argument, "flatten needs a batched input");
  input_ = input;
  return Shape{input[0], input.elements() / input[0]};
}

void Flatten::forward(PassContext&, ConstTensorView x, TensorView y) {
  std::memcpy(y.data, x.data, static_cast<size_t>(x.elements()) * sizeof(float));
}

void Flatten::backward(PassContext&, ConstTensorView, ConstTensorView, ConstTensorView dy, TensorView dx) {
  if (dx.data) std::memcpy(dx.data, dy.data, static_cast<size_t>(dy.elements()) * sizeof(float));
}

// ---- Linear ----------------------------------------------------------------------------------

Linear::Linear(int64_t in_features, int64_t out_features) : in_(in_features), out_(out_features) {}

Result<Shape> Linear::configure(const Shape& input) {
  if (auto ok = check_positive("linear", "out_features", out_); !ok) return std::unexpected(ok.error());
  if (input.rank() != 2)
    return fail(Errc::invalid_argument,
                fmt::format("linear needs a flat input [n, features], got {} (add a flatten layer before it)",
                            input.to_string()));
  if (in_ != 0 && in_ != input[1])
    return fail(Errc::invalid_argument,
                fmt::format("linear expects {} input features but its input has {}", in_, input[1]));
  in_ = input[1];
  return Shape{input[0], out_};
}

std::vector<ParamSpec> Linear::parameter_specs() const {
  const float bound = fan_in_bound(in_);
  return {{"weight", {out_, in_}, bound}, {"bias", {out_}, bound}};
}

void Linear::bind(std::span<const TensorView> params, std::span<const TensorView> grads) {
  weight_ = params[0], bias_ = params[1], dweight_ = grads[0], dbias_ = grads[1];
}

LinearKernel& Linear::kernel_for(Backend& backend, int64_t batch) {
  return kernels_.get(backend, LinearGeometry{batch, in_, out_},
                      [](Backend& b, const LinearGeometry& geo) { return b.make_linear(geo); });
}

void Linear::forward(PassContext& ctx, ConstTensorView x, TensorView y) {
  kernel_for(ctx.backend, x.shape[0]).forward(x, weight_, bias_, y);
}

void Linear::backward(PassContext& ctx, ConstTensorView x, ConstTensorView, ConstTensorView dy, TensorView dx) {
  auto& kernel = kernel_for(ctx.backend, x.shape[0]);
  kernel.backward_weights(x, dy, dweight_, dbias_);
  if (dx.data) kernel.backward_data(dy, weight_, dx);
}

PlannedLayer Linear::plan(int64_t batch) const {
  return {.kind = PlannedLayer::Kind::linear, .input = Shape{batch, in_}, .linear = {batch, in_, out_}};
}

std::string Linear::describe() const { return fmt::format("linear {}->{}", in_, out_); }

// ---- Dropout ---------------------------------------------------------------------------------

Dropout::Dropout(float p) : p_(p) {}

Result<Shape> Dropout::configure(const Shape& input) {
  if (!(p_ >= 0.0f && p_ < 1.0f)) return fail(Errc::invalid_argument, fmt::format("dropout: p must be in [0, 1), got {}", p_));
  return input;
}

void Dropout::forward(PassContext& ctx, ConstTensorView x, TensorView y) {
  last_training_ = ctx.training && p_ > 0.0f;
  if (!last_training_) {
    std::memcpy(y.data, x.data, static_cast<size_t>(x.elements()) * sizeof(float));
    return;
  }
  mask_.resize(static_cast<size_t>(x.elements()));
  const float keep_scale = 1.0f / (1.0f - p_);
  for (int64_t i = 0; i < x.elements(); ++i) {
    mask_[static_cast<size_t>(i)] = ctx.rng.uniform() < p_ ? 0.0f : keep_scale;
    y.data[i] = x.data[i] * mask_[static_cast<size_t>(i)];
  }
}

void Dropout::backward(PassContext&, ConstTensorView, ConstTensorView, ConstTensorView dy, TensorView dx) {
  if (!dx.data) return;
  for (int64_t i = 0; i < dy.elements(); ++i)
    dx.data[i] = last_training_ ? dy.data[i] * mask_[static_cast<size_t>(i)] : dy.data[i];
}

std::string Dropout::describe() const { return fmt::format("dropout p={}", p_); }

}  // namespace tepdist::compute

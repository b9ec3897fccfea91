#pragma once
// Dense float32 tensors: an owned buffer (Tensor) and non-owning views into buffers owned
// elsewhere (TensorView, ConstTensorView). Layout is row-major; images are NCHW.

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>
#include "base/check.hpp"

namespace tepdist::compute {

/// A shape of rank 0 to 4. Fixed capacity, so shapes never allocate on the hot path.
class Shape {
 public:
  static constexpr int max_rank = 4;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  /// From a list of dims (at most max_rank, each >= 0: checked).
  explicit Shape(std::span<const int64_t> dims);

  int rank() const { return rank_; }
  int64_t operator[](int i) const {
    TEPDIST_CHECK(i >= 0 && i < rank_);
    return dims_[static_cast<size_t>(i)];
  }
  /// Product of the dimensions (1 for rank 0).
  int64_t elements() const;
  /// The shape with the first dimension (batch) replaced by n.
  Shape with_batch(int64_t n) const;
  /// The shape with n put in front: a batch of n samples of this shape.
  Shape prepend(int64_t n) const;
  /// Everything but the first dimension, i.e. the shape of one sample.
  Shape sample() const;
  std::string to_string() const;
  std::vector<int64_t> dims() const { return {dims_.begin(), dims_.begin() + rank_}; }

  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i)
      if (a.dims_[static_cast<size_t>(i)] != b.dims_[static_cast<size_t>(i)]) return false;
    return true;
  }

 private:
  std::array<int64_t, max_rank> dims_{};
  int rank_ = 0;
};

/// A read-only view of elements() floats with a shape. Does not own its data.
struct ConstTensorView {
  const float* data = nullptr;
  Shape shape;

  int64_t elements() const { return shape.elements(); }
  std::span<const float> span() const { return {data, static_cast<size_t>(elements())}; }
};

/// A writable view of elements() floats with a shape. Does not own its data.
struct TensorView {
  float* data = nullptr;
  Shape shape;

  int64_t elements() const { return shape.elements(); }
  std::span<float> span() const { return {data, static_cast<size_t>(elements())}; }
  operator ConstTensorView() const { return {data, shape}; }
};

/// An owned, zero-initialised float32 buffer with a shape.
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Shape shape) : shape_(shape), data_(static_cast<size_t>(shape.elements()), 0.0f) {}

  const Shape& shape() const { return shape_; }
  int64_t elements() const { return shape_.elements(); }
  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  std::span<float> span() { return data_; }
  std::span<const float> span() const { return data_; }
  float& operator[](int64_t i) { return data_[static_cast<size_t>(i)]; }
  float operator[](int64_t i) const { return data_[static_cast<size_t>(i)]; }

  TensorView view() { return {data_.data(), shape_}; }
  ConstTensorView view() const { return {data_.data(), shape_}; }
  operator TensorView() { return view(); }
  operator ConstTensorView() const { return view(); }

  /// Gives the tensor a new shape, reallocating only when it needs more room than it has.
  /// Contents are unspecified afterwards.
  void resize(Shape shape) {
    shape_ = shape;
    data_.resize(static_cast<size_t>(shape.elements()));
  }

 private:
  Shape shape_;
  std::vector<float> data_;
};

/// FNV-1a (64-bit) over the values' bytes: replicas compare equal by it (done reports, and
/// parameters a program hands a running job).
uint64_t checksum(std::span<const float> values);

}  // namespace tepdist::compute

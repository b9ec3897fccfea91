#include "compute/tensor.hpp"
#include "base/check.hpp"


namespace tepdist::compute {

Shape::Shape(std::initializer_list<int64_t> dims) {
  TEPDIST_CHECK(dims.size() <= max_rank);
  for (int64_t d : dims) {
    TEPDIST_CHECK(d >= 0);
    dims_[static_cast<size_t>(rank_++)] = d;
  }
}

Shape::Shape(std::span<const int64_t> dims) {
  TEPDIST_CHECK(dims.size() <= max_rank);
  for (int64_t d : dims) {
    TEPDIST_CHECK(d >= 0);
    dims_[static_cast<size_t>(rank_++)] = d;
  }
}

int64_t Shape::elements() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<size_t>(i)];
  return n;
}

Shape Shape::with_batch(int64_t n) const {
  TEPDIST_CHECK(rank_ >= 1);
  Shape s = *this;
  s.dims_[0] = n;
  return s;
}

Shape Shape::prepend(int64_t n) const {
  TEPDIST_CHECK(rank_ < max_rank);
  Shape s;
  s.dims_[0] = n;
  for (int i = 0; i < rank_; ++i) s.dims_[static_cast<size_t>(i + 1)] = dims_[static_cast<size_t>(i)];
  s.rank_ = rank_ + 1;
  return s;
}

Shape Shape::sample() const {
  TEPDIST_CHECK(rank_ >= 1);
  Shape s;
  for (int i = 1; i < rank_; ++i) s.dims_[static_cast<size_t>(s.rank_++)] = dims_[static_cast<size_t>(i)];
  return s;
}

std::string Shape::to_string() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[static_cast<size_t>(i)]);
  }
  return s + "]";
}

uint64_t checksum(std::span<const float> values) {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  for (size_t k = 0; k < values.size_bytes(); ++k) h = (h ^ bytes[k]) * 0x100000001b3ull;
  return h;
}

}  // namespace tepdist::compute

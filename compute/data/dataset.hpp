#pragma once
// Data sets in memory, shuffling, partitions and batches.

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "compute/error.hpp"
#include "compute/tensor.hpp"

namespace tepdist::compute {

/// Labelled samples of any shape, all in memory, of one of two kinds: bytes (images: a quarter of
/// the memory of floats, Fashion-MNIST's training set is 47 MB instead of 188 MB), scaled to
/// [0, 1] floats when a batch is gathered; or floats (features, images already normalised), taken
/// as they are.
struct Dataset {
  enum class Kind : uint8_t { bytes, floats };
  Kind kind = Kind::bytes;
  std::vector<uint8_t> pixels;  ///< bytes: [n, ...sample]
  std::vector<float> features;  ///< floats: [n, ...sample]
  Shape sample;                 ///< [c, h, w] for images, [f] for feature vectors, ...
  std::vector<int32_t> labels;  ///< [n]
  int64_t classes = 10;

  /// Float samples [n, ...sample] (values.size() = n x sample elements) and their labels.
  static Dataset of_floats(Shape sample, std::vector<float> values, std::vector<int32_t> labels, int64_t classes);
  /// Byte samples, as above (scaled by 1/255 when gathered).
  static Dataset of_bytes(Shape sample, std::vector<uint8_t> values, std::vector<int32_t> labels, int64_t classes);

  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  const Shape& sample_shape() const { return sample; }
  bool floats() const { return kind == Kind::floats; }
  /// Bytes the samples take (not the labels).
  size_t sample_bytes() const { return floats() ? features.size() * sizeof(float) : pixels.size(); }
  /// The first n samples (all when n is 0 or too large).
  Dataset head(int64_t n) const;
  /// Whether the parts agree: the sample buffer holds size() samples of sample_shape(), every
  /// label is in [0, classes), every float is finite. The error names the first thing wrong.
  Result<void> check() const;
};

/// An IDX array (the MNIST file format): unsigned bytes with up to 4 dimensions.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;
};

/// Reads an IDX file, gzip-compressed or not. Errors name the file and what is wrong with it.
Result<IdxArray> read_idx(const std::filesystem::path& path);

/// Pairs an IDX image file [n, h, w] with an IDX label file [n]; limit 0 keeps every sample.
Result<Dataset> load_idx_dataset(const std::filesystem::path& images, const std::filesystem::path& labels,
                                 int64_t limit = 0);

/// Where Debian's dataset-fashion-mnist package puts the files.
inline const std::filesystem::path fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";

/// The Fashion-MNIST split "train" (60,000) or "test" (10,000) from dir; a missing file is an
/// error that names it and the Debian package that provides it.
Result<Dataset> load_fashion_mnist(const std::filesystem::path& dir, const std::string& split, int64_t limit = 0);

/// A learnable stand-in for tests: each class is a fixed random 28x28 pattern, each sample that
/// pattern plus uniform noise, clipped to [0, 1]. Deterministic given seed.
Dataset make_synthetic(int64_t samples, uint64_t seed, int64_t classes = 10);

/// 0..n-1 in an order drawn from (seed, epoch): the same pair gives the same order everywhere.
std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed, int64_t epoch);

/// Part `part` of `parts` disjoint, contiguous slices of indices; sizes differ by at most one.
std::span<const int64_t> partition(std::span<const int64_t> indices, int64_t part, int64_t parts);

/// Copies the samples at indices into x [indices.size(), c, h, w] (scaled to [0, 1]) and y,
/// resizing both.
void gather_batch(const Dataset& data, std::span<const int64_t> indices, Tensor& x, std::vector<int32_t>& y);

/// The samples at indices as a data set of their own.
Dataset subset(const Dataset& data, std::span<const int64_t> indices);

}  // namespace tepdist::compute

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

/// Labelled images, all in memory as bytes (a quarter of the memory of floats: Fashion-MNIST's
/// training set is 47 MB instead of 188 MB); batches are scaled to [0, 1] floats when gathered.
struct Dataset {
  std::vector<uint8_t> pixels;  ///< [n, c, h, w]
  Shape sample;                 ///< [c, h, w]
  std::vector<int32_t> labels;  ///< [n]
  int64_t classes = 10;

  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  const Shape& sample_shape() const { return sample; }
  /// The first n samples (all when n is 0 or too large).
  Dataset head(int64_t n) const;
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

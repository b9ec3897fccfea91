#pragma once
// Small data sets a test writes itself, as the Fashion-MNIST files a job's data.dir names
// (train-* and t10k-*), with the labels the test chooses: a label the model has no class for
// cannot come from the synthetic data set.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace tepdist::test {

/// An IDX file of unsigned bytes (zero, zero, type 0x08, rank, big-endian sizes, the bytes). Not
/// compressed, although the names end in .gz: zlib's gzread reads a file without a gzip header as
/// it is, so the loader takes it.
inline void write_idx(const std::filesystem::path& path, const std::vector<uint32_t>& dims,
                      const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.put(0).put(0).put(0x08).put(static_cast<char>(dims.size()));
  for (const uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) out.put(static_cast<char>((d >> shift) & 0xff));
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

/// dir/STEM-images-idx3-ubyte.gz, one side x side image per label (one bright pixel, its place set by
/// the label), and dir/STEM-labels-idx1-ubyte.gz holding `labels`. stem: "train" or "t10k".
inline void write_idx_split(const std::filesystem::path& dir, const std::string& stem,
                            const std::vector<uint8_t>& labels, uint32_t side = 8) {
  const auto n = static_cast<uint32_t>(labels.size());
  std::vector<uint8_t> pixels(static_cast<size_t>(n) * side * side, 0);
  for (uint32_t i = 0; i < n; ++i) pixels[static_cast<size_t>(i) * side * side + labels[i] % (side * side)] = 255;
  write_idx(dir / (stem + "-images-idx3-ubyte.gz"), {n, side, side}, pixels);
  write_idx(dir / (stem + "-labels-idx1-ubyte.gz"), {n}, labels);
}

/// A data set in dir whose training split has `train_samples` labels 0 to 9 and whose test split
/// (16 samples) has a 10 at index 3: a label the model the training split builds (10 classes)
/// does not have, which only an evaluation meets.
inline void write_set_with_a_bad_test_label(const std::filesystem::path& dir, size_t train_samples) {
  std::vector<uint8_t> train(train_samples), test(16);
  for (size_t i = 0; i < train.size(); ++i) train[i] = static_cast<uint8_t>(i % 10);
  for (size_t i = 0; i < test.size(); ++i) test[i] = static_cast<uint8_t>(i % 10);
  test[3] = 10;
  write_idx_split(dir, "train", train);
  write_idx_split(dir, "t10k", test);
}

}  // namespace tepdist::test

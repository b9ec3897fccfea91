#include "compute/data/dataset.hpp"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

#include "compute/rng.hpp"
#include "base/check.hpp"

namespace tepdist::compute {
namespace {

constexpr int64_t max_idx_elements = int64_t{1} << 31;  // 2 GiB of bytes: far past any IDX data set

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};

}  // namespace

Dataset Dataset::of_floats(Shape sample, std::vector<float> values, std::vector<int32_t> labels, int64_t classes) {
  Dataset d;
  d.kind = Kind::floats;
  d.sample = std::move(sample);
  d.features = std::move(values);
  d.labels = std::move(labels);
  d.classes = classes;
  return d;
}

Dataset Dataset::of_bytes(Shape sample, std::vector<uint8_t> values, std::vector<int32_t> labels, int64_t classes) {
  Dataset d;
  d.sample = std::move(sample);
  d.pixels = std::move(values);
  d.labels = std::move(labels);
  d.classes = classes;
  return d;
}

Result<void> Dataset::check() const {
  if (sample.rank() == 0 || sample.elements() <= 0)
    return fail(Errc::invalid_argument, fmt::format("the sample shape {} holds no values", sample.to_string()));
  if (classes < 1) return fail(Errc::invalid_argument, fmt::format("{} classes: a data set needs at least one", classes));
  const auto want = static_cast<size_t>(size() * sample.elements());
  const size_t have = floats() ? features.size() : pixels.size();
  const size_t other = floats() ? pixels.size() : features.size();
  if (have != want || other != 0)
    return fail(Errc::invalid_argument,
                fmt::format("{} labels of {} samples need {} {} values; the data set holds {}{}", size(),
                            sample.to_string(), want, floats() ? "float" : "byte", have,
                            other ? fmt::format(" (and {} of the other kind)", other) : std::string()));
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] < 0 || labels[i] >= classes)
      return fail(Errc::invalid_argument,
                  fmt::format("sample {}'s label {} is outside the {} classes [0, {})", i, labels[i], classes, classes));
  for (size_t i = 0; i < features.size(); ++i)
    if (!std::isfinite(features[i]))
      return fail(Errc::invalid_argument,
                  fmt::format("sample {} holds a value that is not finite ({})", i / static_cast<size_t>(sample.elements()),
                              features[i]));
  return {};
}

Dataset Dataset::head(int64_t n) const {
  if (n <= 0 || n >= size()) n = size();
  std::vector<int64_t> first(static_cast<size_t>(n));
  std::iota(first.begin(), first.end(), 0);
  return subset(*this, first);
}

Result<IdxArray> read_idx(const std::filesystem::path& path) {
  std::unique_ptr<gzFile_s, GzCloser> file(gzopen(path.c_str(), "rb"));
  if (!file) return fail(Errc::io, fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno)));
  gzbuffer(file.get(), 1 << 17);
  auto read_exact = [&](void* out, size_t n) {
    return gzread(file.get(), out, static_cast<unsigned>(n)) == static_cast<int>(n);
  };
  unsigned char magic[4];
  if (!read_exact(magic, 4)) return fail(Errc::corrupt, fmt::format("{}: too short for an IDX header", path.string()));
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 || magic[3] < 1 || magic[3] > 4)
    return fail(Errc::corrupt, fmt::format("{}: not an IDX file of unsigned bytes (magic {:02x}{:02x}{:02x}{:02x})",
                                           path.string(), magic[0], magic[1], magic[2], magic[3]));
  IdxArray a;
  int64_t total = 1;
  for (int i = 0; i < magic[3]; ++i) {
    unsigned char be[4];
    if (!read_exact(be, 4)) return fail(Errc::corrupt, fmt::format("{}: header cut short", path.string()));
    const int64_t d = (int64_t{be[0]} << 24) | (int64_t{be[1]} << 16) | (int64_t{be[2]} << 8) | int64_t{be[3]};
    total *= d;
    if (total > max_idx_elements)
      return fail(Errc::corrupt, fmt::format("{}: dimensions claim more than {} bytes", path.string(), max_idx_elements));
    a.dims.push_back(d);
  }
  a.bytes.resize(static_cast<size_t>(total));
  if (total > 0 && !read_exact(a.bytes.data(), a.bytes.size()))
    return fail(Errc::corrupt, fmt::format("{}: holds fewer than the {} bytes its header promises", path.string(), total));
  unsigned char extra;
  if (gzread(file.get(), &extra, 1) != 0)
    return fail(Errc::corrupt, fmt::format("{}: has bytes beyond what its header describes", path.string()));
  return a;
}

Result<Dataset> load_idx_dataset(const std::filesystem::path& images_path, const std::filesystem::path& labels_path,
                                 int64_t limit) {
  auto images = read_idx(images_path);
  if (!images) return std::unexpected(images.error());
  auto labels = read_idx(labels_path);
  if (!labels) return std::unexpected(labels.error());
  if (images->dims.size() != 3)
    return fail(Errc::corrupt, fmt::format("{}: expected images [n, h, w], found {} dimensions",
                                           images_path.string(), images->dims.size()));
  if (labels->dims.size() != 1 || labels->dims[0] != images->dims[0])
    return fail(Errc::mismatch, fmt::format("{}: {} labels for {} images in {}", labels_path.string(),
                                            labels->dims.empty() ? 0 : labels->dims[0], images->dims[0],
                                            images_path.string()));
  int64_t n = images->dims[0];
  if (limit > 0) n = std::min(n, limit);
  const int64_t h = images->dims[1], w = images->dims[2];
  Dataset d;
  d.sample = {1, h, w};
  images->bytes.resize(static_cast<size_t>(n * h * w));
  d.pixels = std::move(images->bytes);
  d.labels.resize(static_cast<size_t>(n));
  int32_t max_label = 0;
  for (int64_t i = 0; i < n; ++i) {
    d.labels[static_cast<size_t>(i)] = labels->bytes[static_cast<size_t>(i)];
    max_label = std::max(max_label, d.labels[static_cast<size_t>(i)]);
  }
  d.classes = std::max<int64_t>(10, max_label + 1);
  return d;
}

Result<Dataset> load_fashion_mnist(const std::filesystem::path& dir, const std::string& split, int64_t limit) {
  if (split != "train" && split != "test")
    return fail(Errc::invalid_argument, fmt::format("unknown split '{}' (train or test)", split));
  const std::string stem = split == "train" ? "train" : "t10k";
  const auto images = dir / (stem + "-images-idx3-ubyte.gz");
  const auto labels = dir / (stem + "-labels-idx1-ubyte.gz");
  for (const auto& f : {images, labels})
    if (!std::filesystem::exists(f))
      return fail(Errc::io, fmt::format("{}: missing; Fashion-MNIST comes from the Debian package "
                                        "dataset-fashion-mnist (apt-get install dataset-fashion-mnist)",
                                        f.string()));
  return load_idx_dataset(images, labels, limit);
}

Dataset make_synthetic(int64_t samples, uint64_t seed, int64_t classes) {
  constexpr int64_t side = 28, pixels = side * side;
  Rng rng(seed);
  std::vector<float> prototypes(static_cast<size_t>(classes * pixels));
  for (float& v : prototypes) v = rng.uniform() < 0.5f ? 0.2f : 0.8f;
  Dataset d;
  d.classes = classes;
  d.sample = {1, side, side};
  d.pixels.resize(static_cast<size_t>(samples * pixels));
  d.labels.resize(static_cast<size_t>(samples));
  for (int64_t i = 0; i < samples; ++i) {
    const auto label = static_cast<int32_t>(rng.below(static_cast<uint64_t>(classes)));
    d.labels[static_cast<size_t>(i)] = label;
    for (int64_t p = 0; p < pixels; ++p) {
      const float v = prototypes[static_cast<size_t>(label * pixels + p)] + rng.uniform(-0.35f, 0.35f);
      d.pixels[static_cast<size_t>(i * pixels + p)] = static_cast<uint8_t>(std::clamp(v, 0.0f, 1.0f) * 255.0f + 0.5f);
    }
  }
  return d;
}

std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  Rng rng(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(epoch) + 1);
  for (int64_t i = n - 1; i > 0; --i)  // Fisher-Yates
    std::swap(order[static_cast<size_t>(i)], order[rng.below(static_cast<uint64_t>(i + 1))]);
  return order;
}

std::span<const int64_t> partition(std::span<const int64_t> indices, int64_t part, int64_t parts) {
  TEPDIST_CHECK(parts > 0 && part >= 0 && part < parts);
  const auto n = static_cast<int64_t>(indices.size());
  const int64_t begin = n * part / parts, end = n * (part + 1) / parts;
  return indices.subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
}

void gather_batch(const Dataset& data, std::span<const int64_t> indices, Tensor& x, std::vector<int32_t>& y) {
  const auto n = static_cast<int64_t>(indices.size());
  const int64_t per = data.sample.elements();
  x.resize(data.sample.prepend(n));
  y.resize(static_cast<size_t>(n));
  constexpr float scale = 1.0f / 255.0f;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t src = indices[static_cast<size_t>(i)];
    float* dst = x.data() + i * per;
    if (data.floats()) {
      std::copy_n(data.features.data() + src * per, per, dst);
    } else {
      const uint8_t* in = data.pixels.data() + src * per;
      for (int64_t p = 0; p < per; ++p) dst[p] = static_cast<float>(in[p]) * scale;
    }
    y[static_cast<size_t>(i)] = data.labels[static_cast<size_t>(src)];
  }
}

Dataset subset(const Dataset& data, std::span<const int64_t> indices) {
  const int64_t per = data.sample.elements();
  Dataset d;
  d.kind = data.kind;
  d.sample = data.sample;
  d.classes = data.classes;
  if (data.floats()) d.features.resize(indices.size() * static_cast<size_t>(per));
  else d.pixels.resize(indices.size() * static_cast<size_t>(per));
  d.labels.resize(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    const auto to = static_cast<int64_t>(i) * per;
    if (data.floats()) std::copy_n(data.features.data() + indices[i] * per, per, d.features.data() + to);
    else std::copy_n(data.pixels.data() + indices[i] * per, per, d.pixels.data() + to);
    d.labels[i] = data.labels[static_cast<size_t>(indices[i])];
  }
  return d;
}

}  // namespace tepdist::compute

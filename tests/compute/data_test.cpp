#include <unistd.h>
#include <zlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>

#include "tests/support/temp_dir.hpp"
#include "compute/data/dataset.hpp"

using namespace tepdist::compute;
namespace fs = std::filesystem;
using tepdist::test::TempDir;

namespace {

std::string idx_bytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data) {
  std::string s{'\0', '\0', '\x08', static_cast<char>(dims.size())};
  for (uint32_t d : dims)
    for (int shift : {24, 16, 8, 0}) s += static_cast<char>((d >> shift) & 0xff);
  s.append(data.begin(), data.end());
  return s;
}

void write_gz(const fs::path& p, const std::string& bytes) {
  gzFile f = gzopen(p.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  gzclose(f);
}

void write_plain(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

}  // namespace

TEST_CASE("IDX files are read gzipped or plain, and images pair with labels", "[compute][data]") {
  TempDir dir;
  std::vector<uint8_t> pixels(3 * 2 * 2);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 20);
  write_gz(dir.path / "img.gz", idx_bytes({3, 2, 2}, pixels));
  write_plain(dir.path / "lbl", idx_bytes({3}, {7, 0, 9}));
  auto d = load_idx_dataset(dir.path / "img.gz", dir.path / "lbl");
  REQUIRE(d.has_value());
  CHECK(d->size() == 3);
  CHECK(d->sample_shape() == Shape{1, 2, 2});
  CHECK(d->labels == std::vector<int32_t>{7, 0, 9});

  Tensor x;
  std::vector<int32_t> y;
  const std::vector<int64_t> pick{2, 0};
  gather_batch(*d, pick, x, y);
  CHECK(x.shape() == Shape{2, 1, 2, 2});
  CHECK(x[0] == Approx(160.0f / 255.0f));
  CHECK(x[4] == 0.0f);
  CHECK(y == std::vector<int32_t>{9, 7});

  auto limited = load_idx_dataset(dir.path / "img.gz", dir.path / "lbl", 2);
  REQUIRE(limited.has_value());
  CHECK(limited->size() == 2);
}

TEST_CASE("malformed IDX files are refused with the file's name and the reason", "[compute][data]") {
  TempDir dir;
  const auto p = dir.path / "bad";
  auto expect = [&](const std::string& bytes, const std::string& reason) {
    write_plain(p, bytes);
    auto r = read_idx(p);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == Errc::corrupt);
    CHECK_THAT(r.error().message, Catch::Contains(p.string()) && Catch::Contains(reason));
  };
  expect("", "too short");
  expect(std::string("\x00\x00\x0d\x01\x00\x00\x00\x01x", 9), "not an IDX file");
  expect(idx_bytes({4}, {1, 2}), "fewer than");
  expect(idx_bytes({2}, {1, 2, 3}), "beyond");
  expect(idx_bytes({0xffffffu, 0xffffffu}, {}), "more than");
}

TEST_CASE("images and labels that disagree in count are refused", "[compute][data]") {
  TempDir dir;
  write_plain(dir.path / "img", idx_bytes({2, 1, 1}, {1, 2}));
  write_plain(dir.path / "lbl", idx_bytes({3}, {1, 2, 3}));
  auto r = load_idx_dataset(dir.path / "img", dir.path / "lbl");
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::mismatch);
}

TEST_CASE("a missing Fashion-MNIST file names itself and the Debian package", "[compute][data]") {
  TempDir dir;
  auto r = load_fashion_mnist(dir.path, "train");
  REQUIRE_FALSE(r.has_value());
  CHECK_THAT(r.error().message,
             Catch::Contains("train-images-idx3-ubyte.gz") && Catch::Contains("dataset-fashion-mnist"));
}

TEST_CASE("shuffles are permutations fixed by (seed, epoch)", "[compute][data]") {
  const auto a = shuffled_indices(1000, 3, 0);
  CHECK(a == shuffled_indices(1000, 3, 0));
  CHECK(a != shuffled_indices(1000, 3, 1));
  CHECK(a != shuffled_indices(1000, 4, 0));
  CHECK(std::set<int64_t>(a.begin(), a.end()).size() == 1000);
  CHECK(*std::max_element(a.begin(), a.end()) == 999);
}

TEST_CASE("partitions are disjoint, cover everything and differ in size by at most one", "[compute][data]") {
  const auto all = shuffled_indices(103, 0, 0);
  for (int64_t parts : {1, 2, 3, 7, 103}) {
    std::set<int64_t> seen;
    size_t smallest = all.size(), largest = 0;
    for (int64_t k = 0; k < parts; ++k) {
      const auto part = partition(all, k, parts);
      smallest = std::min(smallest, part.size());
      largest = std::max(largest, part.size());
      for (int64_t i : part) CHECK(seen.insert(i).second);
    }
    CHECK(seen.size() == all.size());
    CHECK(largest - smallest <= 1);
  }
}

TEST_CASE("synthetic data is deterministic, labelled in range and in [0, 1]", "[compute][data]") {
  const Dataset a = make_synthetic(200, 1), b = make_synthetic(200, 1), c = make_synthetic(200, 2);
  CHECK(a.pixels == b.pixels);
  CHECK(a.labels == b.labels);
  CHECK(a.pixels != c.pixels);
  for (int32_t l : a.labels) CHECK((l >= 0 && l < 10));
  CHECK(a.head(50).size() == 50);
  CHECK(a.head(0).size() == 200);
}

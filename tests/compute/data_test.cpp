#include <unistd.h>
#include <zlib.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "tests/support/temp_dir.hpp"
#include "compute/data/dataset.hpp"
#include "compute/data/dataset_file.hpp"
#include "compute/io/files.hpp"

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

TEST_CASE("float samples are gathered as they are, byte samples scaled to [0, 1], and subsets keep the kind",
          "[compute][data]") {
  const Dataset f = Dataset::of_floats({3}, {1.5f, -2.0f, 0.25f, 7.0f, 8.0f, 9.0f}, {0, 1}, 2);
  REQUIRE(f.check());
  Tensor x;
  std::vector<int32_t> y;
  const std::vector<int64_t> second{1};
  gather_batch(f, second, x, y);
  CHECK(x.shape() == Shape({1, 3}));
  CHECK(std::vector<float>(x.data(), x.data() + 3) == std::vector<float>{7.0f, 8.0f, 9.0f});
  CHECK(y == std::vector<int32_t>{1});
  const Dataset part = f.head(1);
  CHECK(part.floats());
  CHECK(part.features == std::vector<float>{1.5f, -2.0f, 0.25f});
  const Dataset b = Dataset::of_bytes({2}, {0, 255, 51, 102}, {1, 0}, 2);
  gather_batch(b, second, x, y);
  CHECK(std::vector<float>(x.data(), x.data() + 2) == std::vector<float>{51 * (1.0f / 255.0f), 102 * (1.0f / 255.0f)});
}

TEST_CASE("a data set whose parts disagree is refused, naming what is wrong", "[compute][data]") {
  CHECK_THAT(Dataset::of_floats({3}, {1, 2, 3, 4}, {0}, 2).check().error().message,
             Catch::Contains("need 3 float values") && Catch::Contains("holds 4"));
  CHECK_THAT(Dataset::of_floats({2}, {1, 2}, {5}, 2).check().error().message,
             Catch::Contains("sample 0's label 5 is outside the 2 classes"));
  CHECK_THAT(Dataset::of_floats({2}, {1, std::nanf("")}, {0}, 2).check().error().message,
             Catch::Contains("not finite"));
}

TEST_CASE("data set files keep floats and bytes of any sample shape exactly, and refuse a corrupted file",
          "[compute][data]") {
  TempDir dir;
  const Dataset f = Dataset::of_floats({2, 3}, {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, -1, -2, -3, -4, -5, 1e30f}, {2, 0}, 3);
  REQUIRE(save_dataset(dir.path / "f.tds", f));
  const auto back = load_dataset(dir.path / "f.tds");
  REQUIRE(back);
  CHECK(back->floats());
  CHECK(back->sample == f.sample);
  CHECK(back->features == f.features);
  CHECK(back->labels == f.labels);
  CHECK(back->classes == 3);
  const Dataset b = make_synthetic(20, 3);
  REQUIRE(save_dataset(dir.path / "b.tds", b));
  const auto bytes = load_dataset(dir.path / "b.tds");
  REQUIRE(bytes);
  CHECK_FALSE(bytes->floats());
  CHECK(bytes->pixels == b.pixels);
  CHECK(bytes->sample == b.sample);
  // One flipped byte in the data: the CRC-32 says so.
  auto text = read_file(dir.path / "f.tds");
  REQUIRE(text);
  text->back() ^= 0x01;
  write_plain(dir.path / "bad.tds", *text);
  CHECK_THAT(load_dataset(dir.path / "bad.tds").error().message, Catch::Contains("bad.tds") && Catch::Contains("CRC-32"));
  // Not a data set at all.
  write_plain(dir.path / "junk.tds", "12345678{}");
  CHECK_THAT(load_dataset(dir.path / "junk.tds").error().message, Catch::Contains("junk.tds: not a tepdist data set file"));
  // Shapes whose sizes wrap (2^62 + 1 times 4 elements is 4 in 64 bits) are refused before
  // anything is read or allocated.
  const std::string body(20, '\0');
  const auto crc = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(body.data()), 20);
  const std::string header = R"({"__metadata__":{"format":"tepdist-dataset","classes":"2","crc32":")" +
                             std::to_string(crc) + R"("},"x":{"dtype":"U8","shape":[1,4611686018427387905,4],)" +
                             R"("data_offsets":[0,16]},"y":{"dtype":"I32","shape":[1],"data_offsets":[16,20]}})";
  std::string crafted(8, '\0');
  const uint64_t length = header.size();
  std::memcpy(crafted.data(), &length, 8);
  write_plain(dir.path / "wrap.tds", crafted + header + body);
  CHECK_THAT(load_dataset(dir.path / "wrap.tds").error().message,
             Catch::Contains("wrap.tds") && Catch::Contains("samples too large to hold"));
  // A data set that does not check out is not written.
  CHECK_FALSE(save_dataset(dir.path / "no.tds", Dataset::of_floats({2}, {1}, {0}, 2)));
  CHECK_FALSE(fs::exists(dir.path / "no.tds"));
}

// A job's files over the wire: describing them, and the fetcher's pieces, window, retries and refusals.

#include "elastic/job_files.hpp"

#include <catch2/catch.hpp>
#include <fstream>
#include <map>

#include "tests/support/temp_dir.hpp"

using tepdist::gossip::FileFetch;
using tepdist::gossip::FilePiece;
using tepdist::gossip::JobFile;
namespace elastic = tepdist::elastic;

namespace {

std::vector<uint8_t> bytes_of(size_t n, uint8_t seed) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(seed + i * 7);
  return b;
}

JobFile file_of(const std::string& path, const std::vector<uint8_t>& b) {
  return {path, b.size(), elastic::fnv1a(b.data(), b.size())};
}

/// The submitter's side: answers a fetch from the files it holds.
FilePiece answer(const std::map<uint64_t, std::vector<uint8_t>>& held, const FileFetch& f) {
  FilePiece p{f.job_id, f.checksum, f.offset};
  const auto it = held.find(f.checksum);
  if (it == held.end()) {
    p.refused = "no such file";
    return p;
  }
  const auto end = std::min<uint64_t>(it->second.size(), f.offset + f.length);
  p.data.assign(it->second.begin() + static_cast<ptrdiff_t>(f.offset), it->second.begin() + static_cast<ptrdiff_t>(end));
  return p;
}

}  // namespace

TEST_CASE("a file is described by its size and the FNV-1a of its bytes, read in pieces", "[elastic][files]") {
  tepdist::test::TempDir dir;
  const auto b = bytes_of(3u << 20 | 5, 1);  // over a read buffer, not a multiple of it
  const auto path = (dir.path / "train.tds").string();
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  const auto f = elastic::describe_file(path);
  REQUIRE(f);
  CHECK(f->size == b.size());
  CHECK(f->checksum == elastic::fnv1a(b.data(), b.size()));
  CHECK(elastic::fnv1a(nullptr, 0) == elastic::fnv1a_basis);
  const uint8_t a = 'a';
  CHECK(elastic::fnv1a(&a, 1) == 0xaf63dc4c8601ec8cull);  // the published FNV-1a 64 of "a"
  const auto missing = elastic::describe_file((dir.path / "none").string());
  REQUIRE_FALSE(missing);
  CHECK_THAT(missing.error(), Catch::Contains("none"));
}

TEST_CASE("the fetcher asks for every piece of every file, a window at a time, and each arrives once",
          "[elastic][files]") {
  const auto train = bytes_of(10 * 1000 + 17, 3), init = bytes_of(999, 9), empty = bytes_of(0, 0);
  const std::map<uint64_t, std::vector<uint8_t>> held{{file_of("t", train).checksum, train},
                                                      {file_of("i", init).checksum, init}};
  elastic::FileFetcher::Options o;
  o.piece_bytes = 1000;
  o.window = 3;
  auto fetcher = elastic::FileFetcher::make(7, {file_of("t", train), file_of("e", empty), file_of("i", init)}, o);
  REQUIRE(fetcher);
  CHECK(fetcher->complete(1));  // nothing to fetch of an empty file
  std::vector<FileFetch> asked;
  fetcher->start(0, asked);
  CHECK(asked.size() == 3);
  std::vector<std::vector<uint8_t>> written{std::vector<uint8_t>(train.size()), {}, std::vector<uint8_t>(init.size())};
  size_t pieces = 0;
  double now = 0;
  while (!asked.empty()) {
    const auto f = asked.front();
    asked.erase(asked.begin());
    const auto piece = answer(held, f);
    std::vector<FileFetch> more;
    auto w = fetcher->on_piece(now += 1, piece, more);
    REQUIRE(w);
    REQUIRE(w->has_value());
    std::copy((*w)->data->begin(), (*w)->data->end(), written[(*w)->file].begin() + static_cast<ptrdiff_t>((*w)->offset));
    ++pieces;
    // The same piece again (a resend crossed the answer) is taken for nothing.
    std::vector<FileFetch> none;
    auto again = fetcher->on_piece(now, piece, none);
    REQUIRE(again);
    CHECK_FALSE(again->has_value());
    asked.insert(asked.end(), more.begin(), more.end());
    CHECK(asked.size() <= 3);
  }
  CHECK(fetcher->done());
  CHECK(pieces == 11 + 1);
  CHECK(written[0] == train);
  CHECK(written[2] == init);
}

TEST_CASE("the fetcher asks again for what is overdue, gives up when nothing comes, and takes a refusal as the end",
          "[elastic][files]") {
  const auto train = bytes_of(2500, 3);
  elastic::FileFetcher::Options o;
  o.piece_bytes = 1000;
  o.window = 2;
  o.retry_ms = 100;
  o.give_up_ms = 1000;
  auto fetcher = elastic::FileFetcher::make(7, {file_of("t", train)}, o);
  REQUIRE(fetcher);
  std::vector<FileFetch> asked;
  fetcher->start(0, asked);
  REQUIRE(asked.size() == 2);
  std::vector<FileFetch> again;
  REQUIRE(fetcher->on_tick(50, again));
  CHECK(again.empty());
  REQUIRE(fetcher->on_tick(150, again));
  CHECK(again == asked);  // both, as first asked
  // A piece of the wrong size (or another file's) is an error naming it.
  FilePiece short_piece{7, file_of("t", train).checksum, 0, bytes_of(10, 3)};
  std::vector<FileFetch> more;
  const auto bad = fetcher->on_piece(200, short_piece, more);
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error(), Catch::Contains("holds 10 bytes"));
  // Another job's piece, or an unknown file's, is nothing.
  auto other = fetcher->on_piece(200, FilePiece{8, file_of("t", train).checksum, 0, bytes_of(1000, 3)}, more);
  REQUIRE(other);
  CHECK_FALSE(other->has_value());
  const auto gone = fetcher->on_tick(1200, again);
  REQUIRE_FALSE(gone);
  CHECK_THAT(gone.error(), Catch::Contains("no piece"));
  FilePiece refused{7, file_of("t", train).checksum, 0, {}, "no file of that checksum in job 7"};
  const auto r = fetcher->on_piece(1200, refused, more);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error(), Catch::Contains("t") && Catch::Contains("no file of that checksum"));
  // The same bytes listed twice are to be fetched once: a fetcher asked for both refuses.
  const auto twice = elastic::FileFetcher::make(7, {file_of("t", train), file_of("u", train)}, o);
  REQUIRE_FALSE(twice);
  CHECK_THAT(twice.error(), Catch::Contains("same bytes"));
  // A record that asks for more than this node fetches is refused before anything is asked.
  o.max_file_bytes = 1000;
  const auto big = elastic::FileFetcher::make(7, {file_of("t", train)}, o);
  REQUIRE_FALSE(big);
  CHECK_THAT(big.error(), Catch::Contains("2500 bytes"));
}

TEST_CASE("a config's file paths are replaced by where this node has the bytes", "[elastic][files]") {
  tepdist::elastic::JobConfig c;
  c.data.dataset = "files";
  c.data.train_file = "/there/train.tds";
  c.data.test_file = "/there/test.tds";
  c.model.init_file = "/there/init.safetensors";
  const std::vector<JobFile> files{{"/there/train.tds", 1, 1}, {"/there/test.tds", 1, 2}, {"/there/init.safetensors", 1, 3}};
  elastic::use_local_files(c, files, {"/cache/1", "", "/cache/3"});
  CHECK(c.data.train_file == "/cache/1");
  CHECK(c.data.test_file == "/there/test.tds");  // readable where it is
  CHECK(c.model.init_file == "/cache/3");
  CHECK(elastic::cached_name("/cache", files[2]) == "/cache/0000000000000003");
}

// The ring all-reduce core as N ranks in one process over a mock transport that delivers the
// messages in flight in a random order and lets ranks start each step at random moments.

#include "gossip/collective/ring_allreduce.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <numeric>
#include <random>

#include <csignal>
#include <sys/wait.h>
#include <unistd.h>

using tepdist::gossip::RingChunk;
using tepdist::gossip::collective::RingAllReduce;

namespace {

struct Ring {
  uint32_t n;
  size_t elements;
  /// Ranks offer their buffers piece by piece before they start (a backward pass finishing its
  /// layers), in random pieces and order; a rank may start before it offered everything.
  bool overlap = false;
  std::vector<RingAllReduce> ranks;
  std::vector<std::vector<float>> buffers;
  std::vector<std::pair<uint32_t, RingChunk>> in_flight;  // (to, chunk)
  std::mt19937_64 random{7};

  Ring(uint32_t world, size_t e, size_t chunk) : n(world), elements(e) {
    for (uint32_t r = 0; r < n; ++r) ranks.emplace_back(RingAllReduce::Options{5, r, n, e, chunk});
    buffers.resize(n);
  }

  void send_from(uint32_t r, std::vector<RingChunk>& out) {
    for (auto& c : out) in_flight.emplace_back((r + 1) % n, std::move(c));
    out.clear();
  }

  /// Runs one step: every rank starts at a random moment among the deliveries; returns the
  /// expected sums, computed in double.
  std::vector<double> step(uint64_t s) {
    std::vector<double> sum(elements, 0.0);
    std::uniform_real_distribution<float> value(-1, 1);
    // A rank's values are written into its buffer as they are offered, or at its start: until
    // then the buffer holds NaN, which a chunk sent too early would carry into every sum.
    std::vector<std::vector<float>> values(n);
    std::vector<std::vector<std::pair<size_t, size_t>>> pieces(n);
    for (uint32_t r = 0; r < n; ++r) {
      values[r].resize(elements);
      for (size_t i = 0; i < elements; ++i) sum[i] += values[r][i] = value(random);
      buffers[r].assign(elements, overlap ? std::nanf("") : 0.0f);
      if (!overlap) continue;
      std::vector<size_t> cuts{0, elements};
      for (size_t k = random() % 8; k-- > 0;) cuts.push_back(random() % (elements + 1));
      std::sort(cuts.begin(), cuts.end());
      for (size_t k = 0; k + 1 < cuts.size(); ++k)
        if (cuts[k] < cuts[k + 1]) pieces[r].emplace_back(cuts[k], cuts[k + 1]);
      std::shuffle(pieces[r].begin(), pieces[r].end(), random);
    }
    const auto write = [&](uint32_t r, size_t begin, size_t end) {
      std::copy(values[r].begin() + static_cast<ptrdiff_t>(begin), values[r].begin() + static_cast<ptrdiff_t>(end),
                buffers[r].begin() + static_cast<ptrdiff_t>(begin));
    };
    std::vector<uint32_t> waiting(n);
    std::iota(waiting.begin(), waiting.end(), 0u);
    std::vector<RingChunk> out;
    while (!waiting.empty() || !in_flight.empty()) {
      if (!waiting.empty() && (in_flight.empty() || random() % 3 == 0)) {
        const size_t i = random() % waiting.size();
        const uint32_t r = waiting[i];
        if (!pieces[r].empty() && random() % 4 != 0) {
          const auto [begin, end] = pieces[r].back();
          pieces[r].pop_back();
          write(r, begin, end);
          REQUIRE(ranks[r].can_offer(s));
          ranks[r].offer(s, buffers[r], begin, end, out);
          send_from(r, out);
          continue;
        }
        waiting.erase(waiting.begin() + static_cast<ptrdiff_t>(i));
        for (const auto& [begin, end] : pieces[r]) write(r, begin, end);
        if (!overlap) write(r, 0, elements);
        ranks[r].start(s, buffers[r], out);
        send_from(r, out);
        continue;
      }
      const size_t i = random() % in_flight.size();
      auto [to, chunk] = std::move(in_flight[i]);
      in_flight.erase(in_flight.begin() + static_cast<ptrdiff_t>(i));
      REQUIRE(ranks[to].on_chunk(chunk, out));
      send_from(to, out);
    }
    return sum;
  }
};

}  // namespace

TEST_CASE("ring all-reduce sums over every rank, identically on all, for any geometry", "[gossip][ring]") {
  const auto [world, elements, chunk] = GENERATE(table<uint32_t, size_t, size_t>({
      {1, 100, 16}, {2, 1000, 64}, {3, 1000, 64}, {4, 10007, 128}, {5, 3, 1}, {7, 1000, 1000}, {4, 431080, 65536},
  }));
  const bool overlap = GENERATE(false, true);
  INFO("world " << world << ", elements " << elements << ", chunk " << chunk << (overlap ? ", offered early" : ""));
  Ring ring(world, elements, chunk);
  ring.overlap = overlap;
  for (uint64_t s = 1; s <= 3; ++s) {
    const auto sum = ring.step(s);
    for (uint32_t r = 0; r < world; ++r) {
      REQUIRE(ring.ranks[r].done());
      // Every rank holds the very same bits.
      REQUIRE(std::memcmp(ring.buffers[r].data(), ring.buffers[0].data(), elements * sizeof(float)) == 0);
    }
    for (size_t i = 0; i < elements; ++i) REQUIRE(std::abs(ring.buffers[0][i] - sum[i]) < 1e-4 * world);
  }
}

TEST_CASE("each rank sends 2(N-1)/N of the buffer per step, none much more than another", "[gossip][ring]") {
  const bool overlap = GENERATE(false, true);
  for (uint32_t world : {2u, 3u, 4u, 8u}) {
    const size_t elements = 100003;
    Ring ring(world, elements, 4096);
    ring.overlap = overlap;  // the same chunks, whenever they go
    const int steps = 2;
    for (int s = 1; s <= steps; ++s) ring.step(static_cast<uint64_t>(s));
    const double ideal = 2.0 * (world - 1) / world * elements * sizeof(float) * steps;
    double total = 0, most = 0;
    for (const auto& r : ring.ranks) {
      const double sent = static_cast<double>(r.bytes_sent());
      CHECK(sent == Approx(ideal).epsilon(0.15));
      total += sent;
      most = std::max(most, sent);
    }
    CHECK(most <= 1.3 * total / world);
  }
}

TEST_CASE("two ranks exchange whole buffers: the later one is done the moment it starts", "[gossip][ring]") {
  RingAllReduce r0({1, 0, 2, 8, 4}), r1({1, 1, 2, 8, 4});
  std::vector<float> b0(8, 1.0f), b1(8, 2.0f);
  std::vector<RingChunk> to1, to0;
  // Rank 1 is ready first: its whole buffer goes out, two chunks of 4.
  r1.start(1, b1, to0);
  REQUIRE(to0.size() == 2);
  REQUIRE_FALSE(r1.done());
  // They reach rank 0 before it starts: kept, not acted on (its buffer is not ready yet).
  for (auto& c : to0) REQUIRE(r0.on_chunk(c, to1));
  REQUIRE(to1.empty());
  REQUIRE_FALSE(r0.done());
  for (float v : b0) REQUIRE(v == 1.0f);
  // Rank 0 starts and needs nothing more: the ring would have sent its half and waited for the sum.
  to0.clear();
  r0.start(1, b0, to1);
  REQUIRE(r0.done());
  for (float v : b0) REQUIRE(v == 3.0f);
  REQUIRE(to1.size() == 2);  // its own buffer, as it was before the sum, for rank 1
  for (const auto& c : to1)
    for (float v : c.chunk.data) REQUIRE(v == 1.0f);
  for (auto& c : to1) REQUIRE(r1.on_chunk(c, to0));
  REQUIRE(to0.empty());  // nothing to pass on
  REQUIRE(r1.done());
  REQUIRE(b0 == b1);
  // Rank 0 goes on to step 2 at once; its chunks reach rank 1 before it starts step 2.
  std::vector<float> c0(8, 10.0f), c1(8, 20.0f);
  to1.clear();
  r0.start(2, c0, to1);
  REQUIRE_FALSE(r0.done());
  for (auto& c : to1) REQUIRE(r1.on_chunk(c, to0));
  REQUIRE(to0.empty());
  r1.start(2, c1, to0);
  REQUIRE(r1.done());
  for (auto& c : to0) REQUIRE(r0.on_chunk(c, to1));
  REQUIRE(r0.done());
  for (float v : c0) REQUIRE(v == 30.0f);
  REQUIRE(c0 == c1);
}

TEST_CASE("a rank's finished parts go before it starts, each chunk once wholly offered", "[gossip][ring]") {
  RingAllReduce r0({1, 0, 2, 10, 4}), r1({1, 1, 2, 10, 4});
  std::vector<float> b0(10, std::nanf("")), b1(10, 2.0f);
  std::vector<RingChunk> to1, to0;
  // Rank 0's backward finishes the end of its buffer first: [6, 10) completes no chunk of [0, 4),
  // [4, 8), [8, 10) but the last.
  REQUIRE(r0.can_offer(1));
  std::fill(b0.begin() + 6, b0.end(), 1.0f);
  r0.offer(1, b0, 6, 10, to1);
  REQUIRE(to1.size() == 1);
  CHECK(to1[0].chunk.offset == 8);
  CHECK(to1[0].chunk.step == 1);
  std::fill(b0.begin() + 3, b0.begin() + 6, 1.0f);
  r0.offer(1, b0, 3, 6, to1);
  REQUIRE(to1.size() == 2);
  CHECK(to1[1].chunk.offset == 4);
  for (const auto& c : to1)
    for (float v : c.chunk.data) REQUIRE(v == 1.0f);
  // They reach rank 1, already done with the step before (none here): kept for its start.
  for (auto& c : to1) REQUIRE(r1.on_chunk(c, to0));
  to1.clear();
  REQUIRE(to0.empty());
  // Rank 0 starts with the rest: only the chunk not sent yet goes.
  std::fill(b0.begin(), b0.begin() + 3, 1.0f);
  r0.start(1, b0, to1);
  REQUIRE(to1.size() == 1);
  CHECK(to1[0].chunk.offset == 0);
  r1.start(1, b1, to0);
  REQUIRE_FALSE(r1.done());
  for (auto& c : to1) REQUIRE(r1.on_chunk(c, to0));
  REQUIRE(r1.done());
  for (auto& c : to0) REQUIRE(r0.on_chunk(c, to1));
  REQUIRE(r0.done());
  for (float v : b0) REQUIRE(v == 3.0f);
  REQUIRE(b0 == b1);
  // Offers are for the step after the ring's, once it is summed; one of step 1 is not.
  CHECK_FALSE(r0.can_offer(1));
  CHECK(r0.can_offer(2));
  CHECK_FALSE(r0.can_offer(3));
  // A ring of three: only the rank's own segment goes in round 0 ([3, 6) for rank 1 of 3 over 10,
  // in chunks [3, 5) and [5, 6)).
  RingAllReduce mid({1, 1, 3, 10, 2});
  std::vector<float> b(10, 1.0f);
  std::vector<RingChunk> out;
  mid.offer(1, b, 0, 4, out);
  REQUIRE(out.empty());
  mid.offer(1, b, 4, 10, out);
  REQUIRE(out.size() == 2);
  CHECK(out[0].chunk.offset == 3);
  CHECK(out[0].chunk.data.size() == 2);
  CHECK(out[1].chunk.offset == 5);
  CHECK(out[1].chunk.data.size() == 1);
  out.clear();
  mid.start(1, b, out);
  CHECK(out.empty());
}

TEST_CASE("an element offered twice in one step fails an invariant check, even in a chunk not yet whole",
          "[gossip][ring]") {
  // The caller's bug, not the wire's: it aborts (in a child process here). Chunks of 4 over 10.
  const auto aborts = [](auto&& offers) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      ::signal(SIGABRT, SIG_DFL);  // not Catch's handler: the abort is expected
      ::close(STDOUT_FILENO);
      ::close(STDERR_FILENO);
      RingAllReduce r({1, 0, 2, 10, 4});
      std::vector<float> b(10, 1.0f);
      std::vector<RingChunk> out;
      offers(r, b, out);
      ::_exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
  };
  // [1, 2) twice while [0, 1) and [2, 4) are still holes: the counts alone (2 of 4) would pass.
  CHECK(aborts([](RingAllReduce& r, std::vector<float>& b, std::vector<RingChunk>& out) {
    r.offer(1, b, 1, 2, out);
    r.offer(1, b, 1, 2, out);
  }));
  // Overlapping ranges, neither whole.
  CHECK(aborts([](RingAllReduce& r, std::vector<float>& b, std::vector<RingChunk>& out) {
    r.offer(1, b, 4, 6, out);
    r.offer(1, b, 5, 7, out);
  }));
  // A chunk already sent, offered again.
  CHECK(aborts([](RingAllReduce& r, std::vector<float>& b, std::vector<RingChunk>& out) {
    r.offer(1, b, 0, 4, out);
    r.offer(1, b, 3, 4, out);
  }));
  // Disjoint pieces in any order are fine.
  CHECK_FALSE(aborts([](RingAllReduce& r, std::vector<float>& b, std::vector<RingChunk>& out) {
    r.offer(1, b, 2, 3, out);
    r.offer(1, b, 0, 1, out);
    r.offer(1, b, 3, 10, out);
    r.offer(1, b, 1, 2, out);
  }));
}

TEST_CASE("chunks that do not fit the ring are refused with a reason and change nothing", "[gossip][ring]") {
  RingAllReduce r1({9, 1, 3, 30, 4});
  std::vector<float> buffer(30, 1.0f);
  std::vector<RingChunk> out;
  r1.start(1, buffer, out);
  out.clear();
  auto data = std::make_shared<const std::vector<float>>(4, 5.0f);
  auto chunk = [&](uint64_t job, uint8_t phase, uint32_t round, uint64_t step, uint64_t offset, size_t n, uint64_t total) {
    return RingChunk{job, phase, round, {step, 0, offset, total, std::span<const float>(data->data(), n), data}};
  };
  // Rank 1 of 3 receives segment 0 ([0, 10)) in reduce round 0, in chunks of 4, 4 and 2.
  const std::vector<std::pair<RingChunk, std::string>> bad = {
      {chunk(8, 0, 0, 1, 0, 4, 30), "job"},
      {chunk(9, 2, 0, 1, 0, 4, 30), "phase"},
      {chunk(9, 0, 2, 1, 0, 4, 30), "round"},
      {chunk(9, 0, 0xffffffffu, 1, 0, 4, 30), "round"},
      {chunk(9, 1, 0xffffffffu, 1, 0, 4, 30), "round"},
      {chunk(9, 0, 0, 1, 0, 4, 31), "elements"},
      {chunk(9, 0, 0, 1, 10, 4, 30), "offset"},
      {chunk(9, 0, 0, 1, 2, 4, 30), "offset"},
      {chunk(9, 0, 0, 1, 8, 4, 30), "elements at offset"},
      {chunk(9, 0, 0, 3, 0, 4, 30), "step"},
  };
  for (const auto& [c, why] : bad) {
    auto r = r1.on_chunk(c, out);
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error(), Catch::Contains(why));
  }
  REQUIRE(out.empty());
  for (float v : buffer) REQUIRE(v == 1.0f);
  // Two ranks exchange in phase 0 only, whole buffers in chunks from offset 0.
  RingAllReduce pair({9, 1, 2, 30, 4});
  pair.start(1, buffer, out);
  out.clear();
  for (const auto& [c, why] : std::vector<std::pair<RingChunk, std::string>>{
           {chunk(9, 1, 0, 1, 0, 4, 30), "phase 1 between two ranks"},
           {chunk(9, 0, 1, 1, 0, 4, 30), "round"},
           {chunk(9, 0, 0, 1, 30, 4, 30), "offset"},
           {chunk(9, 0, 0, 1, 28, 4, 30), "elements at offset"}}) {
    auto r = pair.on_chunk(c, out);
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error(), Catch::Contains(why));
  }
  REQUIRE(out.empty());
  for (float v : buffer) REQUIRE(v == 1.0f);
  // A ring of one takes no chunks at all.
  RingAllReduce alone({9, 0, 1, 30, 4});
  std::vector<float> own(30, 1.0f);
  alone.start(1, own, out);
  REQUIRE_FALSE(alone.on_chunk(chunk(9, 0, 0, 1, 0, 4, 30), out));
  REQUIRE(out.empty());
  REQUIRE(r1.on_chunk(chunk(9, 0, 0, 1, 0, 4, 30), out));
  CHECK(buffer[0] == 6.0f);
  auto again = r1.on_chunk(chunk(9, 0, 0, 1, 0, 4, 30), out);
  REQUIRE_FALSE(again);
  CHECK_THAT(again.error(), Catch::Contains("duplicate"));
  CHECK(buffer[0] == 6.0f);
}

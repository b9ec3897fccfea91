// The gossip averaging core as N ranks in one process over a mock network that delivers in a
// random order, with ranks stepping between deliveries.

#include "gossip/collective/gossip_average.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <numeric>
#include <random>

using tepdist::gossip::GossipAverage;
using tepdist::gossip::collective::GossipAveraging;

namespace {

GossipAveraging::Options options(uint32_t rank, uint32_t world, size_t elements, size_t chunk, uint64_t every = 1) {
  return {3, rank, world, elements, chunk, every, 16};
}

}  // namespace

TEST_CASE("one exchange leaves both sides with the average when the active side did not step",
          "[gossip][average]") {
  GossipAveraging a(options(0, 2, 5, 2)), p(options(1, 2, 5, 2));
  REQUIRE(a.active());
  REQUIRE_FALSE(p.active());
  CHECK(a.partner(12345) == 1);
  std::vector<float> xa{1, 2, 3, 4, 5}, xp{3, 2, 1, 0, -1};
  REQUIRE(a.after_step());
  std::vector<GossipAverage> requests, replies;
  a.begin(9, xa, requests);
  CHECK(requests.size() == 3);  // chunks of 2, 2 and 1
  CHECK(a.in_flight());
  for (const auto& r : requests) REQUIRE(p.on_request(r, xp, replies));
  for (const auto& r : replies) REQUIRE(a.on_reply(r, xa));
  CHECK(xa == std::vector<float>{2, 2, 2, 2, 2});
  CHECK(xp == xa);
  CHECK_FALSE(a.in_flight());
  CHECK(a.completed() == 1);
  CHECK(p.answered() == 1);
}

TEST_CASE("local steps taken during an exchange are kept on top of the average", "[gossip][average]") {
  GossipAveraging a(options(0, 2, 3, 8)), p(options(1, 2, 3, 8));
  std::vector<float> xa{4, 4, 4}, xp{0, 0, 0};
  std::vector<GossipAverage> requests, replies;
  a.begin(1, xa, requests);
  for (auto& v : xa) v -= 1;  // a local step while the request travels
  REQUIRE(p.on_request(requests[0], xp, replies));
  REQUIRE(a.on_reply(replies[0], xa));
  CHECK(xp == std::vector<float>{2, 2, 2});
  CHECK(xa == std::vector<float>{1, 1, 1});  // the average 2, then the step's -1
}

TEST_CASE("gossip refuses what does not belong and changes nothing", "[gossip][average]") {
  GossipAveraging a(options(0, 4, 4, 2)), p(options(1, 4, 4, 2));
  std::vector<float> xa{1, 1, 1, 1}, xp{0, 0, 0, 0};
  std::vector<GossipAverage> requests, replies;
  // An active rank answers no request; an answer with no exchange in flight is refused.
  auto r = a.on_request(GossipAverage{3, 1, false, requests.empty() ? tepdist::gossip::TensorChunk{} : requests[0].chunk},
                        xa, replies);
  CHECK_FALSE(r);
  a.begin(5, xa, requests);
  auto bad = requests[0];
  bad.chunk.offset = 1;  // not on a chunk boundary
  CHECK_FALSE(p.on_request(bad, xp, replies));
  bad = requests[0];
  bad.job_id = 4;
  CHECK_FALSE(p.on_request(bad, xp, replies));
  std::vector<float> nan{NAN, 0};
  bad = requests[0];
  bad.chunk.data = nan;
  CHECK_FALSE(p.on_request(bad, xp, replies));
  CHECK(xp == std::vector<float>{0, 0, 0, 0});
  REQUIRE(p.on_request(requests[0], xp, replies));
  auto wrong = replies[0];
  wrong.exchange = 6;
  auto refused = a.on_reply(wrong, xa);
  REQUIRE_FALSE(refused);
  CHECK_THAT(refused.error(), Catch::Contains("not in flight"));
  REQUIRE(a.on_reply(replies[0], xa));
  CHECK_FALSE(a.on_reply(replies[0], xa));  // the same chunk twice
  CHECK(xa == std::vector<float>{0.5f, 0.5f, 1, 1});
}

TEST_CASE("an unanswered exchange is abandoned after timeout_steps and a new one can start", "[gossip][average]") {
  GossipAveraging a({3, 0, 2, 4, 4, 2, 3});
  std::vector<float> x(4, 1.0f);
  std::vector<GossipAverage> out;
  CHECK_FALSE(a.after_step());
  REQUIRE(a.after_step());
  a.begin(1, x, out);
  CHECK_FALSE(a.after_step());
  CHECK_FALSE(a.after_step());
  CHECK(a.in_flight());
  CHECK_FALSE(a.after_step());  // third step: abandoned, and 5 is odd
  CHECK_FALSE(a.in_flight());
  CHECK(a.abandoned() == 1);
  CHECK(a.after_step());
}

TEST_CASE("N ranks gossiping over a shuffled network reach consensus and keep the mean", "[gossip][average]") {
  const uint32_t world = GENERATE(2u, 5u, 8u);
  const size_t elements = 37, chunk = 8;
  std::mt19937_64 random(world);
  std::vector<GossipAveraging> ranks;
  std::vector<std::vector<float>> x(world, std::vector<float>(elements));
  std::uniform_real_distribution<float> value(-10, 10);
  for (uint32_t r = 0; r < world; ++r) {
    ranks.emplace_back(options(r, world, elements, chunk, 1));
    for (auto& v : x[r]) v = value(random);
  }
  const auto mean_of = [&](size_t i) {
    double s = 0;
    for (uint32_t r = 0; r < world; ++r) s += x[r][i];
    return s / world;
  };
  std::vector<double> mean(elements);
  for (size_t i = 0; i < elements; ++i) mean[i] = mean_of(i);
  struct InFlight {
    uint32_t to;
    GossipAverage m;
  };
  std::vector<InFlight> network;
  std::map<uint64_t, uint32_t> requester;  // exchange id -> active rank
  uint64_t next_id = 1;
  for (int round = 0; round < 400; ++round) {
    // Each active rank "steps" (x unchanged: pure averaging) and may begin an exchange.
    for (uint32_t r = 0; r < world; ++r) {
      if (!ranks[r].after_step()) continue;
      std::vector<GossipAverage> out;
      const uint32_t to = ranks[r].partner(random());
      requester[next_id] = r;
      ranks[r].begin(next_id++, x[r], out);
      for (auto& m : out) network.push_back({to, std::move(m)});
    }
    // Deliver everything in flight in a random order; answers go back to their requester.
    while (!network.empty()) {
      const size_t i = random() % network.size();
      auto [to, m] = std::move(network[i]);
      network.erase(network.begin() + static_cast<ptrdiff_t>(i));
      if (m.reply) {
        REQUIRE(ranks[to].on_reply(m, x[to]));
      } else {
        std::vector<GossipAverage> out;
        REQUIRE(ranks[to].on_request(m, x[to], out));
        for (auto& o : out) network.push_back({requester.at(m.exchange), std::move(o)});
      }
    }
  }
  // Pairwise averaging keeps the sum: the consensus is the mean the ranks started with.
  for (size_t i = 0; i < elements; ++i) {
    for (uint32_t r = 0; r < world; ++r) CHECK(std::abs(x[r][i] - mean[i]) < 1e-3);
  }
}

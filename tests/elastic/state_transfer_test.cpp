// State transfer between a puller and donors over a lossy mock network.

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <numeric>

#include "elastic/state_transfer.hpp"
#include "gossip/wire/codec.hpp"

using namespace tepdist;

namespace {

struct Holder {
  std::vector<float> params, momentum;
  elastic::StateView view() { return elastic::StateView({params, momentum}); }
};

Holder filled(size_t n, float base) {
  Holder h{std::vector<float>(n), std::vector<float>(n)};
  std::iota(h.params.begin(), h.params.end(), base);
  std::iota(h.momentum.begin(), h.momentum.end(), -base);
  return h;
}

}  // namespace

TEST_CASE("a state view reads and writes across its buffers", "[elastic][state]") {
  Holder h = filled(10, 0);
  const auto v = h.view();
  CHECK(v.size() == 20);
  std::vector<float> out(6);
  REQUIRE(v.read(7, out));
  CHECK(out == std::vector<float>{7, 8, 9, 0, 1, 2});
  const std::vector<float> in = {-1, -2, -3};
  REQUIRE(v.write(9, in));
  CHECK(h.params[9] == -1);
  CHECK(h.momentum[0] == -2);
  CHECK_FALSE(v.read(18, out));
}

TEST_CASE("a state pulled from three donors, striped, with lost pieces asked again of the next donor",
          "[elastic][state]") {
  const size_t n = 1000;
  Holder donor = filled(n, 5);
  Holder puller{std::vector<float>(n), std::vector<float>(n)};
  elastic::StatePuller p({7, 42, 2 * n, 64, 5000, {"a", "b", "c"}});
  std::vector<std::pair<std::string, gossip::StatePull>> asks;
  p.start(0, asks);
  CHECK(asks.size() == p.pieces());
  std::map<std::string, size_t> per_donor;
  for (const auto& [to, ask] : asks) per_donor[to] += ask.count;
  CHECK(per_donor.size() == 3);  // striped over all three
  // Donor "b" is gone: its requests are lost.
  auto serve = [&](const std::vector<std::pair<std::string, gossip::StatePull>>& list) {
    for (const auto& [to, ask] : list) {
      if (to == "b") continue;
      auto pieces = elastic::serve_state(ask, {7, 0, 42}, donor.view(), 64);
      REQUIRE(pieces);
      for (const auto& piece : *pieces) REQUIRE(p.on_piece(piece, puller.view()));
    }
  };
  serve(asks);
  CHECK_FALSE(p.done());
  asks.clear();
  p.on_tick(1000, asks);
  CHECK(asks.empty());  // not yet due
  p.on_tick(5000, asks);
  CHECK_FALSE(asks.empty());
  for (const auto& [to, ask] : asks) CHECK(to == "c");  // b's stripe, from the next donor
  serve(asks);
  CHECK(p.done());
  CHECK(puller.params == donor.params);
  CHECK(puller.momentum == donor.momentum);
}

TEST_CASE("a donor refuses another step or job and ranges outside its state, a puller refuses what it did not ask for",
          "[elastic][state]") {
  Holder donor = filled(100, 1);
  CHECK_FALSE(elastic::serve_state({7, 41, 0, 10}, {7, 0, 42}, donor.view(), 64));
  CHECK_FALSE(elastic::serve_state({8, 42, 0, 10}, {7, 0, 42}, donor.view(), 64));
  CHECK_FALSE(elastic::serve_state({7, 42, 190, 20}, {7, 0, 42}, donor.view(), 64));
  CHECK_FALSE(elastic::serve_state({7, 42, 0, 0}, {7, 0, 42}, donor.view(), 64));
  Holder puller{std::vector<float>(100), std::vector<float>(100)};
  elastic::StatePuller p({7, 42, 200, 64, 5000, {"a"}});
  const auto odd = elastic::serve_state({7, 42, 3, 10}, {7, 0, 42}, donor.view(), 64);
  REQUIRE(odd);
  CHECK_FALSE(p.on_piece(odd->front(), puller.view()));
  const auto other_step = elastic::serve_state({7, 43, 0, 64}, {7, 0, 43}, donor.view(), 64);
  REQUIRE(other_step);
  CHECK_FALSE(p.on_piece(other_step->front(), puller.view()));
  CHECK(std::all_of(puller.params.begin(), puller.params.end(), [](float x) { return x == 0; }));
}

TEST_CASE("the job's state is served and taken only as of the puller's generation, even at the same step",
          "[elastic][state]") {
  // At a between-epochs hold a program may set the parameters anew: generation 4's state at step
  // 42 is not generation 3's at step 42.
  Holder old_state = filled(100, 1), new_state = filled(100, 9);
  Holder puller{std::vector<float>(100), std::vector<float>(100)};
  elastic::StatePuller::Options o{7, 42, 200, 64, 5000, {"a"}};
  o.generation = 4;
  elastic::StatePuller p(o);
  std::vector<std::pair<std::string, gossip::StatePull>> asks;
  p.start(0, asks);
  REQUIRE_FALSE(asks.empty());
  for (const auto& [to, ask] : asks) CHECK(ask.generation == 4);
  // A donor still in generation 3 does not serve generation 4's pull...
  const auto refused = elastic::serve_state(asks.front().second, {7, 3, 42}, old_state.view(), 64);
  REQUIRE_FALSE(refused);
  CHECK(refused.error() == "the state here is generation 3's, not generation 4's");
  // ...and a piece of generation 3's state that reaches the puller anyway is refused.
  const auto stale = elastic::serve_state({7, 42, 0, 64, false, 0, 0, 3}, {7, 3, 42}, old_state.view(), 64);
  REQUIRE(stale);
  CHECK(stale->front().generation == 3);
  const auto taken = p.on_piece(stale->front(), puller.view());
  REQUIRE_FALSE(taken);
  CHECK(taken.error() == "a piece of generation 3's state, not generation 4's");
  CHECK(std::all_of(puller.params.begin(), puller.params.end(), [](float x) { return x == 0; }));
  for (const auto& [to, ask] : asks) {
    auto pieces = elastic::serve_state(ask, {7, 4, 42}, new_state.view(), 64);
    REQUIRE(pieces);
    for (const auto& piece : *pieces) REQUIRE(p.on_piece(piece, puller.view()));
  }
  CHECK(p.done());
  CHECK(puller.params == new_state.params);
}

TEST_CASE("a shard's state pulled striped: the pulls and pieces name the shard, and a piece of another is refused",
          "[elastic][state]") {
  Holder donor = filled(300, 2);
  Holder puller{std::vector<float>(300), std::vector<float>(300)};
  // Shard 5 at version 42, whose digest the source named.
  elastic::StatePuller p({7, 42, 600, 64, 2000, {"a", "b"}, true, 5, 0xd16e57});
  std::vector<std::pair<std::string, gossip::StatePull>> asks;
  p.start(0, asks);
  REQUIRE_FALSE(asks.empty());
  for (const auto& [to, ask] : asks) {
    CHECK(ask.of_shard);
    CHECK(ask.shard == 5);
    CHECK(ask.digest == 0xd16e57);
  }
  // The job's state, or another shard's, at the same step is not this shard's.
  auto job_state = elastic::serve_state({7, 42, 0, 64}, {7, 0, 42}, donor.view(), 64);
  REQUIRE(job_state);
  CHECK_FALSE(job_state->front().of_shard);
  CHECK_FALSE(p.on_piece(job_state->front(), puller.view()));
  auto other = elastic::serve_state({7, 42, 0, 64, true, 4, 0xd16e57}, {7, 0, 42}, donor.view(), 64);
  REQUIRE(other);
  CHECK_FALSE(p.on_piece(other->front(), puller.view()));
  for (const auto& [to, ask] : asks) {
    auto pieces = elastic::serve_state(ask, {7, 0, 42}, donor.view(), 64);
    REQUIRE(pieces);
    for (const auto& piece : *pieces) {
      CHECK(piece.of_shard);
      CHECK(piece.chunk.shard == 5);
      REQUIRE(p.on_piece(piece, puller.view()));
    }
  }
  CHECK(p.done());
  CHECK(puller.params == donor.params);
  CHECK(puller.momentum == donor.momentum);
}

TEST_CASE("a donor's refusal moves what it was asked for to the next donor at once", "[elastic][state]") {
  Holder donor = filled(200, 3);
  Holder puller{std::vector<float>(200), std::vector<float>(200)};
  elastic::StatePuller p({7, 42, 400, 64, 2000, {"a", "b"}, true, 1, 99});
  std::vector<std::pair<std::string, gossip::StatePull>> asks;
  p.start(0, asks);
  std::vector<std::pair<std::string, gossip::StatePull>> again;
  p.refused("a", 10, again);  // "a" holds another state: its stripe goes to "b" now, not after 2 s
  REQUIRE_FALSE(again.empty());
  for (const auto& [to, ask] : again) CHECK(to == "b");
  for (const auto* list : {&asks, &again})
    for (const auto& [to, ask] : *list) {
      if (to == "a") continue;
      auto pieces = elastic::serve_state(ask, {7, 0, 42}, donor.view(), 64);
      REQUIRE(pieces);
      for (const auto& piece : *pieces) REQUIRE(p.on_piece(piece, puller.view()));
    }
  CHECK(p.done());
  CHECK(puller.params == donor.params);
  // With one donor there is nobody else to ask: the ticks ask it again.
  elastic::StatePuller alone({7, 42, 400, 64, 2000, {"a"}, true, 1, 99});
  alone.start(0, asks);
  again.clear();
  alone.refused("a", 10, again);
  CHECK(again.empty());
}

TEST_CASE("a refusal of the job's state moves the stripe at once, and only a refusal of this pull does",
          "[elastic][state]") {
  Holder donor = filled(200, 5);
  Holder puller{std::vector<float>(200), std::vector<float>(200)};
  elastic::StatePuller::Options o{7, 42, 400, 64, 5000, {"a", "b"}};
  o.generation = 4;
  elastic::StatePuller p(o);
  std::vector<std::pair<std::string, gossip::StatePull>> asks;
  p.start(0, asks);
  const auto to_a = std::find_if(asks.begin(), asks.end(), [](const auto& ask) { return ask.first == "a"; });
  REQUIRE(to_a != asks.end());
  // The refusal names the pull it answers, and carries nothing.
  const auto no = elastic::refusal_of(to_a->second);
  CHECK(elastic::is_refusal(no));
  CHECK(no.generation == 4);
  CHECK(no.chunk.step == 42);
  CHECK_FALSE(no.of_shard);
  // It crosses the wire whatever the pull's offset (a malformed frame would close the link).
  for (const auto& [to, ask] : asks) {
    INFO(ask.offset);
    const gossip::Message m{"node-a", 1, "cluster-1", elastic::refusal_of(ask)};
    const auto bytes = gossip::encode(m).flatten();
    const auto decoded = gossip::decode_bytes(std::span(bytes).subspan(gossip::frame_header_bytes));
    REQUIRE(decoded.has_value());
    CHECK(decoded->body == m.body);
    CHECK(elastic::is_refusal(std::get<gossip::StatePiece>(decoded->body)));
  }
  const auto served = elastic::serve_state(to_a->second, {7, 4, 42}, donor.view(), 64);
  REQUIRE(served);
  CHECK_FALSE(elastic::is_refusal(served->front()));
  // A refusal of another generation's pull, or another step's, is not this pull's: nothing moves.
  std::vector<std::pair<std::string, gossip::StatePull>> again;
  for (const auto& [generation, step] : {std::pair<uint64_t, uint64_t>{3, 42}, {4, 41}}) {
    auto other = to_a->second;
    other.generation = generation;
    other.step = step;
    const auto moved = p.on_refusal(elastic::refusal_of(other), "a", 10, again);
    CHECK_FALSE(moved);
    CHECK(again.empty());
  }
  CHECK(p.on_refusal(no, "a", 10, again));
  REQUIRE_FALSE(again.empty());
  for (const auto& [to, ask] : again) CHECK(to == "b");
  // "b" serves all of it: the pull ends without waiting for the 5 s retry.
  for (const auto* list : {&asks, &again})
    for (const auto& [to, ask] : *list) {
      if (to == "a") continue;
      auto pieces = elastic::serve_state(ask, {7, 4, 42}, donor.view(), 64);
      REQUIRE(pieces);
      for (const auto& piece : *pieces) REQUIRE(p.on_piece(piece, puller.view()));
    }
  CHECK(p.done());
  CHECK(puller.params == donor.params);
  CHECK(puller.momentum == donor.momentum);
}

TEST_CASE("a stripe every donor refused waits for the retry instead of going round the donors", "[elastic][state]") {
  // Donors that all refuse for a while (a generation the puller has not installed yet) would
  // otherwise be asked round and round at the rate their refusals come back.
  elastic::StatePuller::Options o{7, 42, 400, 400, 5000, {"a", "b"}};
  o.generation = 4;
  elastic::StatePuller p(o);  // one piece per donor: [0, 200) of "a", [200, 400) of "b"
  std::vector<std::pair<std::string, gossip::StatePull>> asks, again;
  p.start(0, asks);
  REQUIRE(asks.size() == 2);
  const auto no = elastic::refusal_of(asks.front().second);
  REQUIRE(p.on_refusal(no, "a", 1, again));  // a's stripe goes to b
  REQUIRE(again.size() == 1);
  CHECK(again[0].first == "b");
  CHECK(again[0].second.offset == 0);
  again.clear();
  REQUIRE(p.on_refusal(no, "b", 2, again));  // b's own stripe goes to a; a's, refused by both, waits
  REQUIRE(again.size() == 1);
  CHECK(again[0].first == "a");
  CHECK(again[0].second.offset == 200);
  again.clear();
  REQUIRE(p.on_refusal(no, "a", 3, again));  // now both stripes were refused by both
  CHECK(again.empty());
  p.on_tick(1 + 4999, again);  // stripe [0, 200) was last asked at 1, [200, 400) at 2
  CHECK(again.empty());
  p.on_tick(2 + 5000, again);  // the retry asks both again, one donor each
  REQUIRE(again.size() == 2);
  CHECK(again[0].first != again[1].first);
  // ... and after it a refusal moves a stripe at once again.
  std::vector<std::pair<std::string, gossip::StatePull>> moved;
  REQUIRE(p.on_refusal(no, again[0].first, 5004, moved));
  CHECK(moved.size() == 1);
}

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>

#include "gossip/transport/handshake.hpp"
#include "gossip/wire/wire.capnp.h"

using namespace tepdist::gossip;
namespace wire = tepdist::wire;

namespace {

std::vector<uint64_t> body_of(const OutFrame& f) {
  const auto bytes = f.flatten();
  std::vector<uint64_t> words((bytes.size() - frame_header_bytes) / 8);
  std::memcpy(words.data(), bytes.data() + frame_header_bytes, words.size() * 8);
  return words;
}

Identity id(std::string node, std::string secret = "s3cret", std::string cluster = "c1") {
  return {std::move(cluster), std::move(node), "eu-west", std::move(secret), "127.0.0.1:1"};
}

struct Outcome {
  Handshake::Step initiator_end, responder_end;
};

/// Runs a whole handshake between two fresh parties.
Outcome run(Identity a, Identity b) {
  Handshake i(Handshake::Role::initiator, std::move(a), fresh_nonce());
  Handshake r(Handshake::Role::responder, std::move(b), fresh_nonce());
  Outcome o;
  auto challenge = r.on_frame(body_of(i.hello()));
  if (!challenge.send) {
    o.responder_end = std::move(challenge);
    return o;
  }
  o.initiator_end = i.on_frame(body_of(*challenge.send));
  if (o.initiator_end.send) o.responder_end = r.on_frame(body_of(*o.initiator_end.send));
  return o;
}

}  // namespace

TEST_CASE("two nodes with the same secret and cluster authenticate each other", "[gossip][auth]") {
  Handshake i(Handshake::Role::initiator, id("a"), fresh_nonce());
  Handshake r(Handshake::Role::responder, id("b"), fresh_nonce());
  auto challenge = r.on_frame(body_of(i.hello()));
  REQUIRE(challenge.send);
  REQUIRE_FALSE(challenge.refused);
  auto finish = i.on_frame(body_of(*challenge.send));
  REQUIRE(finish.done);
  REQUIRE(finish.send);
  CHECK(i.peer_id() == "b");
  auto done = r.on_frame(body_of(*finish.send));
  CHECK(done.done);
  CHECK(r.peer_id() == "a");
  CHECK(r.peer_region() == "eu-west");
}

TEST_CASE("a peer with another secret is refused, whichever side holds the wrong one", "[gossip][auth]") {
  // The initiator checks the responder's proof first, so it is the one that notices; the
  // responder's own check of a bad proof is exercised by the replay test below.
  for (auto [initiator_secret, responder_secret] : {std::pair{"wrong", "s3cret"}, std::pair{"s3cret", "wrong"}}) {
    const auto o = run(id("a", initiator_secret), id("b", responder_secret));
    REQUIRE(o.initiator_end.refused);
    CHECK_THAT(*o.initiator_end.refused, Catch::Contains("wrong secret"));
    CHECK_FALSE(o.initiator_end.send);  // nothing more goes to a peer that failed its proof
  }
}

TEST_CASE("a peer from another cluster is refused, naming both cluster ids", "[gossip][auth]") {
  const auto o = run(id("a", "s3cret", "other"), id("b"));
  REQUIRE(o.responder_end.refused);
  CHECK_THAT(*o.responder_end.refused, Catch::Contains("cluster id mismatch") && Catch::Contains("other"));
}

TEST_CASE("a recorded handshake replayed to the responder is refused", "[gossip][auth]") {
  // Record a genuine initiator's Hello and Proof...
  Handshake i(Handshake::Role::initiator, id("a"), fresh_nonce());
  Handshake r1(Handshake::Role::responder, id("b"), fresh_nonce());
  const auto hello = body_of(i.hello());
  auto challenge = r1.on_frame(hello);
  auto finish = i.on_frame(body_of(*challenge.send));
  const auto recorded_proof = body_of(*finish.send);
  REQUIRE(r1.on_frame(recorded_proof).done);
  // ...and replay both to a fresh responder, which challenges with a new nonce.
  Handshake r2(Handshake::Role::responder, id("b"), fresh_nonce());
  REQUIRE(r2.on_frame(hello).send);
  auto replayed = r2.on_frame(recorded_proof);
  CHECK_FALSE(replayed.done);
  REQUIRE(replayed.refused);
  CHECK_THAT(*replayed.refused, Catch::Contains("replayed"));
}

TEST_CASE("malformed handshake frames are refused, not crashed on", "[gossip][auth]") {
  Handshake r(Handshake::Role::responder, id("b"), fresh_nonce());
  auto step = r.on_frame(std::vector<uint64_t>(4, 0xabababababababab));
  REQUIRE(step.refused);
  Handshake r2(Handshake::Role::responder, id("b"), fresh_nonce());
  CHECK(r2.on_frame({}).refused);
}

TEST_CASE("a peer claiming the node's own id is refused (no reflected proofs)", "[gossip][auth]") {
  const auto o = run(id("b"), id("b"));
  REQUIRE(o.responder_end.refused);
  CHECK_THAT(*o.responder_end.refused, Catch::Contains("own id"));
}

namespace {

/// A Hello as a man in the middle would rewrite it: copied field by field, with `edit` applied.
template <class Edit>
std::vector<uint64_t> rewritten_hello(const OutFrame& hello, Edit edit) {
  const auto words = body_of(hello);
  capnp::FlatArrayMessageReader reader({reinterpret_cast<const capnp::word*>(words.data()), words.size()});
  capnp::MallocMessageBuilder mb;
  mb.setRoot(reader.getRoot<wire::Hello>());
  edit(mb.getRoot<wire::Hello>());
  const auto flat = capnp::messageToFlatArray(mb);
  return {reinterpret_cast<const uint64_t*>(flat.begin()), reinterpret_cast<const uint64_t*>(flat.end())};
}

}  // namespace

TEST_CASE("both ends derive the same frame keys, one per direction, fresh per connection", "[gossip][auth][seal]") {
  auto handshake = [] {
    auto i = std::make_unique<Handshake>(Handshake::Role::initiator, id("a"), fresh_nonce());
    auto r = std::make_unique<Handshake>(Handshake::Role::responder, id("b"), fresh_nonce());
    auto challenge = r->on_frame(body_of(i->hello()));
    auto finish = i->on_frame(body_of(*challenge.send));
    REQUIRE(r->on_frame(body_of(*finish.send)).done);
    return std::pair{std::move(i), std::move(r)};
  };
  const auto [i, r] = handshake();
  CHECK(i->send_key() == r->receive_key());
  CHECK(i->receive_key() == r->send_key());
  CHECK(i->send_key() != i->receive_key());
  const auto [i2, r2] = handshake();
  CHECK(i2->send_key() != i->send_key());  // same secret, same ids: other keys
}

TEST_CASE("a Hello whose region, listen address, lane or ephemeral key is rewritten on the path fails the proofs",
          "[gossip][auth][seal]") {
  using Edit = std::function<void(wire::Hello::Builder)>;
  const std::vector<std::pair<const char*, Edit>> edits{
      {"region", [](wire::Hello::Builder h) { h.setRegion("elsewhere"); }},
      {"listen address", [](wire::Hello::Builder h) { h.setListenAddress("10.0.0.66:1"); }},
      {"lane", [](wire::Hello::Builder h) { h.setLane(1); }},
      {"ephemeral key", [](wire::Hello::Builder h) {
         const EphemeralKey mine;  // the attacker's own
         h.setEphemeral(kj::arrayPtr(mine.public_key().data(), mine.public_key().size()));
       }}};
  for (const auto& [what, edit] : edits) {
    INFO(what);
    Handshake i(Handshake::Role::initiator, id("a"), fresh_nonce());
    Handshake r(Handshake::Role::responder, id("b"), fresh_nonce());
    auto challenge = r.on_frame(rewritten_hello(i.hello(), edit));
    REQUIRE(challenge.send);  // the responder cannot tell...
    auto finish = i.on_frame(body_of(*challenge.send));
    REQUIRE(finish.refused);  // ...but the initiator's check of its proof fails
    CHECK_FALSE(finish.done);
  }
}

TEST_CASE("an ephemeral key of low order or the wrong size is refused", "[gossip][auth][seal]") {
  for (const size_t size : {size_t{32}, size_t{31}}) {
    Handshake i(Handshake::Role::initiator, id("a"), fresh_nonce());
    Handshake r(Handshake::Role::responder, id("b"), fresh_nonce());
    const std::vector<uint8_t> zero(size, 0);  // the all-zero point: every shared secret would be zero
    auto step = r.on_frame(rewritten_hello(i.hello(), [&](wire::Hello::Builder h) {
      h.setEphemeral(kj::arrayPtr(zero.data(), zero.size()));
    }));
    REQUIRE(step.refused);
    CHECK_FALSE(step.send);
  }
}

TEST_CASE("sealed frames open in order under the matching key only", "[gossip][seal]") {
  FrameKey key{}, other{};
  key[0] = 1;
  other[0] = 2;
  for (const auto p : {FrameProtection::encrypted, FrameProtection::authenticated}) {
    INFO(protection_name(p));
    FrameSealer writer(p, key), reader(p, key), stranger(p, other);
    const auto m1 = encode({"a", 1, "c1", Ping{1, {}}}).flatten();
    const auto m2 = encode({"a", 1, "c1", Ping{2, {}}}).flatten();
    const auto s1 = writer.seal_flat(m1), s2 = writer.seal_flat(m2);
    auto open = [](FrameSealer& f, std::vector<uint8_t> sealed) -> std::expected<std::vector<uint8_t>, std::string> {
      auto n = f.open(sealed.data(), {sealed.data() + frame_header_bytes, sealed.size() - frame_header_bytes});
      if (!n) return std::unexpected(n.error());
      return std::vector<uint8_t>(sealed.begin() + frame_header_bytes, sealed.begin() + frame_header_bytes + *n);
    };
    CHECK_FALSE(open(stranger, s1));
    FrameSealer in_order(p, key), out_of_order(p, key);
    CHECK_FALSE(open(out_of_order, s2));  // frame 1 where frame 0 is due
    auto o1 = open(in_order, s1);
    REQUIRE(o1);
    CHECK(std::equal(o1->begin(), o1->end(), m1.begin() + 4));
    auto o2 = open(in_order, s2);
    REQUIRE(o2);
    CHECK(std::equal(o2->begin(), o2->end(), m2.begin() + 4));
    auto cut = s1;
    cut[0] -= 8;  // the length prefix is authenticated too
    CHECK_FALSE(open(reader, cut));
  }
}

TEST_CASE("a frame sealed under a ticket on another thread is the frame sealed in place at its counter",
          "[gossip][seal]") {
  FrameKey key{};
  key[3] = 7;
  auto tensor = std::make_shared<std::vector<float>>(100000);
  for (size_t i = 0; i < tensor->size(); ++i) (*tensor)[i] = static_cast<float>(i) * 0.5f;
  const OutFrame big = encode({"a", 1, "c1", TensorChunk{1, 0, 0, tensor->size(), *tensor, tensor}});
  const OutFrame small = encode({"a", 1, "c1", Ping{9, {}}});
  auto flat = [](const FrameSealer::Sealed& s) {
    std::vector<uint8_t> out;
    for (const auto& p : s.pieces)
      out.insert(out.end(), static_cast<const uint8_t*>(p.data), static_cast<const uint8_t*>(p.data) + p.size);
    return out;
  };
  for (const auto p : {FrameProtection::encrypted, FrameProtection::authenticated}) {
    INFO(protection_name(p));
    FrameSealer in_place(p, key), ticketed(p, key), reader(p, key);
    // Frame 0 in place, frames 1 and 2 by tickets taken in order but sealed in reverse, on threads.
    const auto s0 = flat(ticketed.seal(small));
    const FrameSealer::Ticket t1 = ticketed.reserve(), t2 = ticketed.reserve();
    CHECK(t1.counter == 1);
    CHECK(t2.counter == 2);
    FrameSealer::Sealed s2, s1;
    std::thread([&] { s2 = FrameSealer::seal(t2, small); }).join();
    std::thread([&] { s1 = FrameSealer::seal(t1, big); }).join();
    const auto e0 = flat(in_place.seal(small)), e1 = flat(in_place.seal(big)), e2 = flat(in_place.seal(small));
    CHECK(s0 == e0);
    CHECK(flat(s1) == e1);
    CHECK(flat(s2) == e2);
    CHECK(ticketed.frames() == 3);
    // The receiver opens them in counter order, and only in it.
    for (auto sealed : {flat(s1), flat(s2)}) CHECK_FALSE(FrameSealer(p, key).open(sealed.data(), {sealed.data() + 4, sealed.size() - 4}));
    for (auto sealed : {e0, flat(s1), flat(s2)}) {
      auto n = reader.open(sealed.data(), {sealed.data() + 4, sealed.size() - 4});
      CHECK(n.has_value());
    }
  }
}

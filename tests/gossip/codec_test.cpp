#include <catch2/catch.hpp>
#include <cstring>

#include "compute/rng.hpp"
#include "gossip/wire/codec.hpp"

using namespace tepdist::gossip;

namespace {

Member member(const std::string& id, Member::State state = Member::State::alive) {
  Member m{id, id + ":7000", 17, state, "eu-west", {"worker", "parameter-shard"}};
  if (state == Member::State::suspect) m.accuser = "node-z";
  return m;
}

Message envelope(Body body) { return {"node-a", 1700000000123, "cluster-1", std::move(body)}; }

/// Encodes, flattens into one buffer as it would arrive, and decodes.
Message round_trip(const Message& m) {
  const auto bytes = encode(m).flatten();
  REQUIRE(bytes.size() > frame_header_bytes);
  auto length = frame_length(bytes.data(), {});
  REQUIRE(length.has_value());
  REQUIRE(*length == bytes.size() - frame_header_bytes);
  auto decoded = decode_bytes(std::span(bytes).subspan(frame_header_bytes));
  INFO((decoded ? std::string() : decoded.error().message));
  REQUIRE(decoded.has_value());
  return *decoded;
}

}  // namespace

TEST_CASE("every message kind survives the wire unchanged", "[gossip][wire]") {
  std::vector<float> tensor(1000);
  for (size_t i = 0; i < tensor.size(); ++i) tensor[i] = static_cast<float>(i) * 0.5f - 3.0f;
  const TensorChunk chunk{42, 3, 100, 5000, std::span<const float>(tensor), nullptr};
  const std::vector<Body> bodies = {
      Ping{1, {member("a"), member("b", Member::State::suspect)}},
      Ack{2, {member("c", Member::State::dead)}},
      PingReq{3, member("d"), {member("e", Member::State::left)}},
      Join{member("f")},
      Leave{member("g", Member::State::left)},
      StateSync{{member("h"), member("i")}, true, 1700000000000},
      StateSync{{member("h")}, true, 17, {{0, {"h", "i"}}, {1, {"i"}}}},
      StateSync{{member("h")}, true, 17, {}, JobStatus{4, "gossip", 3, "training", {12, 1, 640, 60640}, {{"h", 640}, {"i", 512}}}},
      StateSync{{member("h")}, true, 17, {{0, {"h", "i"}}}, JobStatus{4, "async", 3, "training", {12, 1, 640, 60640}, {{"h", 640}}, {{0, 91}, {5, 88}}}},
      chunk,
      ParamPull{7, 99},
      ParamPush{7, 100, chunk},
      Control{"node-0", 5, Control::Command::evaluate, 11, {1, 2, 3}},
      MetricsSnapshot{{{"frames_in", {{"peer", "b"}}, 12.0}, {"queue_depth", {}, 3.5}}},
      JobStart{9, "[job]\nmode = \"sync\"\n", "127.0.0.1:9000", {"a", "b"}, {"127.0.0.1:1", "127.0.0.1:2"}, "a", 4, "submitter-7"},
      RingChunk{9, 1, 2, chunk},
      JobReport{9, JobReport::Kind::done, 1, 2, 300, 0.5, 1234.5, 3, 0.88, 0.4, 12.5, 19200, 1 << 20, 0xfeed, "", 0.75, 11.5},
      JobReport{9, JobReport::Kind::failed, 0, 0, 7, 0, 0, 3, 0, 0, 0, 0, 0, 0, "node b died", 0, 0},
      JobReport{9, JobReport::Kind::done, 2, 1, 40, 0.3, 0, 4, 0, 0, 2.5, 640, 0, 0, "", 0, 1.5, 17, 230, 12, 690},
      ShardUpdate{9, 2, ShardUpdate::Kind::push, 31, 0.04f, chunk},
      ShardUpdate{9, 2, ShardUpdate::Kind::replicate, 32, 0.01f, chunk},
      ShardUpdate{9, 5, ShardUpdate::Kind::pull, 0, 0, {}},
      ShardState{9, 2, 33, true, 12, chunk},
      ShardUpdate{9, 2, ShardUpdate::Kind::push, 31, 0.04f, chunk, "node-03", 0xb007, 17, true},
      ShardUpdate{9, 2, ShardUpdate::Kind::replicate, 32, 0.01f, chunk, "node-03", 0xb007, 17},
      ShardUpdate{9, 2, ShardUpdate::Kind::ack, 32, 0, {}},
      ShardState{9, 2, 34, false, 1, chunk, 17, 30, true},
      ShardState{9, 2, 0, false, 0, {}, 0, 34, false, ShardState::Kind::durable},
      ShardUpdate{9, 2, ShardUpdate::Kind::push, 31, 0.04f, chunk, "node-03", 0xb007, 17, false, 4, 1280},
      ShardUpdate{9, 2, ShardUpdate::Kind::fetch, 0, 0, {}, "", 0, 0, false, 4},
      ShardState{9, 2, 34, false, 1, chunk, 17, 30, false, ShardState::Kind::values, 4},
      ShardTransfer{9, 2, 4, 34, 120, chunk, {{"node-03", 0xb007, 17}, {"node-01", 5, 2}}},
      ShardTransfer{9, 2, 4, 0, 0, {}, {}, "this node does not hold shard 2"},
      ShardTransfer{9, 2, 4, 34, 120, chunk, {{"node-03", 0xb007, 17}}, {}, {{"node-03", 4096}, {"node-01", 0}}},
      JobStart{9, "[job]", "127.0.0.1:9000", {"a", "b"}, {"127.0.0.1:1", "127.0.0.1:2"}, "a", 4, "submitter-7", {5, 6},
               3, JobProgress{40, 1, 192, 6336}, {"a"}, 3, 192, {}, 3, {"a", "b", "c"}, {5, 6, 7}, {"a", "", "b"}},
      GenerationVote{9, GenerationVote::Kind::ack, 4, 3, {}, JobProgress{41, 1, 384, 6528}, true, 77, "", {{"b", 640}},
                     {{0, 12}, {5, 7}}},
      GossipAverage{9, 77, true, chunk},
      Control{"node-0", 5, Control::Command::job_finished, 11, {}},
      Control{"node-1", 6, Control::Command::ring_check_answer, 12, {1, 2, 3, 4, 5, 6, 7, 8}},
      Control{"node-0", 5, Control::Command::target_reached, 11, {}},
      JobStart{9, "[job]", "127.0.0.1:9000", {"a", "b"}, {"127.0.0.1:1", "127.0.0.1:2"}, "a", 4, "submitter-7", {5, 6},
               3, JobProgress{40, 1, 192, 6336}, {"a"}, 3, 192, {{0, 0, 10, 1, 0, 10}, {0, 10, 20}}},
      GossipAverage{9, 78, false, chunk, 4, 1234},
      RingChunk{9, 0, 1, chunk, 3},
      GenerationVote{9, GenerationVote::Kind::propose, 4, 3, {"a", "c"}},
      GenerationVote{9, GenerationVote::Kind::ack, 4, 3, {}, JobProgress{41, 1, 384, 6528}, true, 77, "", {{"b", 640}}},
      GenerationVote{9, GenerationVote::Kind::refuse, 6, 3, {}, {}, false, 0, "promised generation 6"},
      GenerationVote{9, GenerationVote::Kind::evict, 3, 3, {"b"}},
      StatePull{9, 41, 1000, 4096},
      LeaveRequest{"node-02", LeaveRequest::Kind::done, "after step 41"},
      StatePiece{9, chunk},
  };
  for (const auto& body : bodies) {
    INFO(kind_name(body));
    const Message m = envelope(body);
    CHECK(round_trip(m) == m);
  }
}

TEST_CASE("a tensor is sent from its own buffer and received in place", "[gossip][wire]") {
  auto tensor = std::make_shared<std::vector<float>>(431080, 0.25f);
  const std::span<const float> view(*tensor);
  const OutFrame frame = encode(envelope(TensorChunk{1, 0, 0, tensor->size(), view, tensor}));
  bool referenced = false;
  for (const auto& piece : frame.pieces()) referenced |= piece.data == tensor->data();
  CHECK(referenced);
  // The frame keeps the snapshot alive after its owner lets go.
  std::weak_ptr<std::vector<float>> watch = tensor;
  tensor.reset();
  CHECK_FALSE(watch.expired());

  const auto bytes = frame.flatten();
  auto decoded = decode_bytes(std::span(bytes).subspan(frame_header_bytes));
  REQUIRE(decoded.has_value());
  const auto& chunk = std::get<TensorChunk>(decoded->body);
  CHECK(chunk.data.size() == 431080);
  CHECK(chunk.data[431079] == 0.25f);
  CHECK(chunk.owner != nullptr);
}

TEST_CASE("tensor slices not whole words from a word boundary are copied, never over-read", "[gossip][wire]") {
  std::vector<float> tensor(9, 1.0f);
  const std::span<const float> shifted(tensor.data() + 1, 8);  // starts 4 bytes past a word boundary
  const std::span<const float> odd(tensor.data(), 7);          // ends 4 bytes short of one
  for (auto slice : {shifted, odd}) {
    const Message m = envelope(TensorChunk{1, 0, 1, 9, slice, nullptr});
    const OutFrame frame = encode(m);
    for (const auto& piece : frame.pieces()) CHECK(piece.data != static_cast<const void*>(slice.data()));
    CHECK(round_trip(m) == m);
  }
}

TEST_CASE("a length prefix over the limit or not in whole words is refused", "[gossip][wire]") {
  uint8_t header[4];
  const uint32_t huge = 1u << 30;
  std::memcpy(header, &huge, 4);
  auto r = frame_length(header, {});
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == WireErrc::too_large);
  const uint32_t odd = 12;
  std::memcpy(header, &odd, 4);
  CHECK(frame_length(header, {}).error().code == WireErrc::truncated);
}

TEST_CASE("garbage, truncated frames and unknown kinds become errors, never crashes", "[gossip][wire]") {
  const auto bytes = encode(envelope(Ping{9, {member("a")}})).flatten();
  const auto body = std::span(bytes).subspan(frame_header_bytes);

  SECTION("cut short") {
    auto r = decode_bytes(body.first(body.size() - 8));
    REQUIRE_FALSE(r.has_value());
  }
  SECTION("random words") {
    tepdist::compute::Rng rng(3);
    for (int trial = 0; trial < 500; ++trial) {
      std::vector<uint8_t> junk(8 * (1 + rng.below(64)));
      for (auto& b : junk) b = static_cast<uint8_t>(rng.next());
      (void)decode_bytes(junk);  // must return, error or not
    }
    std::vector<uint8_t> junk(64, 0xab);
    CHECK_FALSE(decode_bytes(junk).has_value());
  }
  SECTION("a kind from the future") {
    std::vector<uint8_t> patched(body.begin(), body.end());
    // After the 8-byte segment table: the root pointer (word 0), then the Envelope's data section,
    // whose union discriminant is its fifth 16-bit element (see wire.capnp.h, Envelope::which()).
    const uint16_t future = 99;
    std::memcpy(patched.data() + 8 + 8 + 8, &future, 2);
    auto r = decode_bytes(patched);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == WireErrc::unknown_kind);
  }
  SECTION("a tensor chunk claiming to lie outside its tensor") {
    std::vector<float> t(4, 1.0f);
    const auto chunk = encode(envelope(TensorChunk{1, 0, 10, 12, std::span<const float>(t), nullptr})).flatten();
    auto r = decode_bytes(std::span(chunk).subspan(frame_header_bytes));
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == WireErrc::malformed);
  }
}

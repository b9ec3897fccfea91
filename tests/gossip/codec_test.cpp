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
      StateSync{{member("h")}, true, 17, {}, JobStatus{4, "sync", 3, "training", {12, 1, 640, 60640}, {{"h", 640}}, {}, {{"h", 812.5, 88}, {"i", 402.25, 40}}, 0.0125}},
      StateSync{{member("h")}, true, 17, {}, JobStatus{4, "sync", 3, "training", {12, 1, 640, 60640}, {{"h", 640}}, {},
                                                     {{"h", 812.5, 88}}, 0.0125, 0.4375,
                                                     {{48, 0, 2.5, 0.8125, 0.5}, {96, 1, 5.25, 0.84375, 0.4375}},
                                                     {{40, 2.0, 0.625, 6400.5, 0.0125}},
                                                     {{1, 0, 2, 1796273776109}, {2, 40, 3, 1796273779109}}}},
      StateSync{{member("h")}, true, 17, {}, std::nullopt,
                MetricsSnapshot{{{"unix_ms", {{"node", "h"}}, 1796273776109.0}, {"step", {{"node", "h"}}, 40.0}}},
                {{1796273776109, "joined", "i"}, {1796273779109, "dead", "j"}}},
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
      JobReport{9, JobReport::Kind::done, 0, 2, 300, 0.5, 0, 2, 0.9, 0.3, 12.5, 640, 0, 1, "", 0, 1.5, 0, 0, 0, 0, 0.02,
                {}, "cuda:0 (NVIDIA H200)", 3},
      JobReport{9, JobReport::Kind::progress, 0, 1, 40, 0.3, 900, 2, 0, 0, 2.5, 640, 0, 0, "", 0, 1.5, 0, 0, 0, 0, 0.02,
                {{"node-00", 600, 88}, {"node-01", 300, 40}}},
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
      ShardUpdate{9, 2, ShardUpdate::Kind::fetch, 33, 0, {}, "node-01", 0, 0, false, 4, 0, 0x5eed5eed5eed5eedull},
      ShardState{9, 2, 34, false, 1, chunk, 17, 30, false, ShardState::Kind::values, 4},
      ShardTransfer{9, 2, 4, 34, 120, chunk, {{"node-03", 0xb007, 17}, {"node-01", 5, 2}}},
      ShardTransfer{9, 2, 4, 0, 0, {}, {}, "this node does not hold shard 2"},
      ShardTransfer{9, 2, 4, 33, 0, {}, {}, {}, {}, true},
      ShardTransfer{9, 2, 4, 34, 120, chunk, {{"node-03", 0xb007, 17}}, {}, {{"node-03", 4096}, {"node-01", 0}}},
      // A striped fetch's manifest: the holders of the state, its digest, its length and no values.
      ShardTransfer{9, 2, 4, 34, 120, TensorChunk{34, 2, 0, 143692, {}, nullptr}, {{"node-03", 0xb007, 17}}, {},
                    {{"node-03", 4096}}, false, {"127.0.0.1:4001", "127.0.0.1:4002"}, 0x1234abcd5678ef90ull, true},
      JobStart{9, "[job]", "127.0.0.1:9000", {"a", "b"}, {"127.0.0.1:1", "127.0.0.1:2"}, "a", 4, "submitter-7", {5, 6},
               3, JobProgress{40, 1, 192, 6336}, {"a"}, 3, 192, {}, 3, {"a", "b", "c"}, {5, 6, 7}, {"a", "", "b"},
               {"east", "west"}, {"east", "", "west"}},
      GenerationVote{9, GenerationVote::Kind::ack, 4, 3, {}, JobProgress{41, 1, 384, 6528}, true, 77, "", {{"b", 640}},
                     {{0, 12}, {5, 7}}},
      GossipAverage{9, 77, true, chunk},
      Control{"node-0", 5, Control::Command::job_finished, 11, {}},
      Control{"node-1", 6, Control::Command::ring_check_answer, 12, {1, 2, 3, 4, 5, 6, 7, 8}},
      Control{"node-0", 5, Control::Command::target_reached, 11, {}},
      JobStart{9, "[job]", "127.0.0.1:9000", {"a", "b"}, {"127.0.0.1:1", "127.0.0.1:2"}, "a", 4, "submitter-7", {5, 6},
               3, JobProgress{40, 1, 192, 6336}, {"a"}, 3, 192, {{0, 0, 10, 1, 0, 10}, {0, 10, 20}}},
      [] {
        JobStart j{9, "[job]", "127.0.0.1:9000", {"a"}, {"127.0.0.1:1"}, "a", 4, "submitter-7", {5}, 4};
        j.lr_factor = 0.25;  // a plateau decay the record carries
        j.released_epochs = 2;  // a job that pauses between epochs: two released
        j.reset_file = "/tmp/out/job-1/params-2.safetensors";  // with parameters the program set
        j.reset_checksum = 0x1234567890abcdefull;
        j.reset_epochs = 2;
        j.files = {{"/tmp/out/data/train.tds", 47040123, 0xfeedfacecafebeefull}, {"/tmp/out/init.safetensors", 1, 2}};
        j.reset_file_size = 4096;
        j.reset_file_checksum = 0xabcdef;
        j.optimizer = "optimizer.lr=0.001\noptimizer.momentum=0";
        return j;
      }(),
      FileFetch{9, 0xfeedfacecafebeefull, 1u << 20, 1u << 20},
      FilePiece{9, 0xfeedfacecafebeefull, 1u << 20, {0, 1, 2, 255}},
      FilePiece{9, 7, 0, {}, "no file of checksum 0000000000000007 in job 9"},
      Control{"trainer-1", 5, Control::Command::release_epochs, 11, {3, 0, 0, 0}},
      Control{"trainer-1", 5, Control::Command::job_complete, 11, {}},
      [] {
        JobReport r;
        r.job_id = 9;
        r.kind = JobReport::Kind::held;  // rank 0 waits after two epochs, at step 128
        r.epoch = 2;
        r.step = 128;
        return r;
      }(),
      GossipAverage{9, 78, false, chunk, 4, 1234},
      RingChunk{9, 0, 1, chunk, 3},
      GenerationVote{9, GenerationVote::Kind::propose, 4, 3, {"a", "c"}},
      GenerationVote{9, GenerationVote::Kind::ack, 4, 3, {}, JobProgress{41, 1, 384, 6528}, true, 77, "", {{"b", 640}}},
      GenerationVote{9, GenerationVote::Kind::refuse, 6, 3, {}, {}, false, 0, "promised generation 6"},
      GenerationVote{9, GenerationVote::Kind::evict, 3, 3, {"b"}},
      StatePull{9, 41, 1000, 4096, false, 0, 0, 12},  // the job's state, as of generation 12
      StatePull{9, 34, 16384, 16384, true, 2, 0x1234abcd5678ef90ull},  // of shard 2's state at version 34
      LeaveRequest{"node-02", LeaveRequest::Kind::done, "after step 41"},
      StatePiece{9, chunk, false, 12},
      StatePiece{9, chunk, true},
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

namespace {

/// A message's one list of one (empty) member rewritten, as a hostile peer would, into `count`
/// members of zero words each: Cap'n Proto reads each as a default Member, and the frame keeps its size.
std::vector<uint8_t> with_empty_members(const Body& body, uint32_t count) {
  auto bytes = encode(envelope(body)).flatten();
  auto* words = reinterpret_cast<uint64_t*>(bytes.data() + frame_header_bytes + 8);  // past the segment table
  const size_t n = (bytes.size() - frame_header_bytes - 8) / 8;
  // The composite list's tag (a struct pointer whose offset is the count: 1 element of 3 data
  // words and 5 pointers) and the list pointer to it (element size 7, composite, of 8 words).
  const uint64_t tag = (uint64_t{1} << 2) | (uint64_t{3} << 32) | (uint64_t{5} << 48);
  bool tag_found = false, pointer_found = false;
  for (size_t i = 0; i < n; ++i) {
    if (words[i] == tag) {
      words[i] = uint64_t{count} << 2;  // count elements of no data and no pointers
      tag_found = true;
    } else if ((words[i] & 3) == 1 && ((words[i] >> 32) & 7) == 7 && (words[i] >> 35) == 8) {
      words[i] &= 0xffffffffull | (uint64_t{7} << 32);  // a list of 0 words in all
      pointer_found = true;
    }
  }
  REQUIRE(tag_found);
  REQUIRE(pointer_found);
  return std::vector<uint8_t>(bytes.begin() + frame_header_bytes, bytes.end());
}

/// A state sync of one empty member, padded with honest shard records to about `bytes`, so that
/// Cap'n Proto's traversal limit (4 reads a word) lets a long list through.
StateSync padded_sync(size_t bytes) {
  StateSync s{{Member{}}, false, 0};
  for (uint32_t i = 0; i * 1000 < bytes; ++i) s.shards.push_back({i, {std::string(1000, 'p')}});
  return s;
}

}  // namespace

TEST_CASE("a frame of empty list entries is refused before it is decoded, by its cap or by the frame's budget",
          "[gossip][wire][limits]") {
  SECTION("16.5 million members in a 63 MiB frame (2.9 GB decoded before the caps): over its kind's limit") {
    auto r = decode_bytes(with_empty_members(padded_sync(63u << 20), 16'500'000));
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == WireErrc::too_large);
    CHECK_THAT(r.error().message, Catch::Contains("state_sync frame"));
  }
  SECTION("2 million members in a frame within that limit: over the cap on any list of members") {
    auto r = decode_bytes(with_empty_members(padded_sync(15u << 20), 2'000'000));
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == WireErrc::over_limit);
    CHECK_THAT(r.error().message, Catch::Contains("a state sync's members") && Catch::Contains("2000000"));
  }
  SECTION("60,000 members: under the cap, but far more than a frame of 130 KB can honestly hold") {
    // Padded with honest content so that Cap'n Proto's traversal limit (4 reads a word) lets the
    // list through: the decode budget is what stops it.
    const auto body = with_empty_members(padded_sync(128'000), 60'000);
    CHECK(body.size() > 128'000);
    auto r = decode_bytes(body);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == WireErrc::over_limit);
    CHECK_THAT(r.error().message, Catch::Contains("budget"));
  }
  SECTION("a handful: what a real ping carries still decodes") {
    auto r = decode_bytes(with_empty_members(Ping{1, {Member{}}}, 3));
    REQUIRE(r.has_value());
    CHECK(std::get<Ping>(r->body).updates.size() == 3);
  }
}

TEST_CASE("a view of 60,000 members decodes: the caps leave room for the clusters membership serves",
          "[gossip][wire][limits]") {
  StateSync s;
  for (int i = 0; i < 60'000; ++i) s.members.push_back(member("node-" + std::to_string(i)));
  const auto decoded = round_trip(envelope(s));
  CHECK(std::get<StateSync>(decoded.body).members.size() == 60'000);
}

TEST_CASE("each kind has its own frame limit: a ping may not be a tensor's size", "[gossip][wire][limits]") {
  Ping big{1, {}};
  for (int i = 0; big.updates.size() < 12'000; ++i) big.updates.push_back(member(std::string(64, 'a' + i % 26)));
  const auto bytes = encode(envelope(big)).flatten();
  REQUIRE(bytes.size() > wire_caps::probe_frame_bytes);
  auto r = decode_bytes(std::span(bytes).subspan(frame_header_bytes));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == WireErrc::too_large);
  CHECK_THAT(r.error().message, Catch::Contains("ping frame"));
  // A tensor chunk of the same size is fine.
  std::vector<float> t(bytes.size() / sizeof(float), 0.25f);
  const auto chunk = round_trip(envelope(TensorChunk{1, 0, 0, t.size(), t, nullptr}));
  CHECK(std::get<TensorChunk>(chunk.body).data.size() == t.size());
}

TEST_CASE("texts over their cap are refused: an id is a name, not a megabyte", "[gossip][wire][limits]") {
  const auto bytes = encode(envelope(Join{member(std::string(wire_caps::name_bytes + 1, 'x'))})).flatten();
  auto r = decode_bytes(std::span(bytes).subspan(frame_header_bytes));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == WireErrc::over_limit);
  CHECK_THAT(r.error().message, Catch::Contains("a member's id"));
}

TEST_CASE("a release's argument decodes to what was encoded, and a malformed one to nothing", "[gossip][codec]") {
  using tepdist::gossip::Release;
  const Release plain{3};
  CHECK(plain.encode().size() == 4);
  CHECK(Release::decode(plain.encode()) == plain);
  Release full;
  full.epochs = 4;
  full.reset_file.path = "/out/job-1/params-4.safetensors";
  full.reset_file.size = 4096;
  full.reset_file.checksum = 0xfeed;
  full.reset_checksum = 0x1234;
  full.optimizer = "optimizer.lr=0.001";
  CHECK(Release::decode(full.encode()) == full);
  Release optimizer_only;
  optimizer_only.epochs = 5;
  optimizer_only.optimizer = "optimizer.momentum=0";
  CHECK(Release::decode(optimizer_only.encode()) == optimizer_only);
  auto bad = full.encode();
  bad.resize(20);  // shorter than its fixed part
  CHECK_FALSE(Release::decode(bad));
  bad = full.encode();
  bad[28] = 0xff;  // a path running past the end
  bad[31] = 0x7f;
  CHECK_FALSE(Release::decode(bad));
}

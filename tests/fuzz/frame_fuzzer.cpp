// Fuzz target for the frame decoder: the bytes a hostile peer can send after the handshake. Built
// for AFL++ as frame_afl (tests/fuzz/afl_coverage.cpp, scripts/fuzz.sh):
//
//   scripts/fuzz.sh frame 1000000      (from the corpus in tests/fuzz/corpus/frame)
//   build/tests/frame_afl FILE         (replays one input)
//   build/tests/frame_afl -make_corpus=DIR   (writes the seed corpus: one frame of every kind)
//
// The length prefix is taken from the input's size, whole words of it, whatever the input's own
// prefix says, so mutations land in what Cap'n Proto and the codec read (the prefix check has unit
// tests of its own). A frame that decodes must survive a round trip. Any crash, sanitizer report
// or uncaught exception fails the run.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "gossip/wire/codec.hpp"

using namespace tepdist::gossip;

namespace {

Member member(int i) {
  return {"node-" + std::to_string(i), "127.0.0.1:" + std::to_string(7000 + i), 17u + static_cast<unsigned>(i),
          Member::State::suspect, "eu-west", {"worker"}};
}

std::vector<Message> every_kind() {
  static const std::vector<float> tensor(64, 0.5f);
  const TensorChunk chunk{3, 1, 0, 64, tensor, nullptr};
  const std::vector<Body> bodies{
      Ping{1, {member(1), member(2)}}, Ack{2, {member(3)}}, PingReq{3, member(4), {member(5)}}, Join{member(6)},
      Leave{member(7)}, StateSync{{member(8), member(9)}, true, 123},
      StateSync{{member(8)}, true, 5, {}, JobStatus{1, "sync", 2, "voting", {3, 0, 96, 96}, {{"a", 96}}}}, chunk, ParamPull{1, 9}, ParamPush{1, 10, chunk},
      Control{"node-0", 5, Control::Command::evaluate, 7, {1, 2, 3}}, MetricsSnapshot{{{"m", {{"k", "v"}}, 1.5}}},
      JobStart{1, "[job]", "127.0.0.1:1", {"a"}, {"127.0.0.1:2"}, "a", 1, "s"}, RingChunk{1, 0, 0, chunk},
      JobReport{1, JobReport::Kind::progress, 0, 1, 2, 0.5, 10, 2, 0, 0, 1, 64, 0, 0, "", 0, 0},
      ShardUpdate{1, 0, ShardUpdate::Kind::push, 3, 0.1f, chunk}, ShardState{1, 0, 4, false, 1, chunk},
      GossipAverage{1, 2, false, chunk},
      GenerationVote{1, GenerationVote::Kind::ack, 2, 1, {"a"}, JobProgress{1, 0, 64, 64}, true, 5},
      StatePull{1, 2, 0, 64}, StatePiece{1, chunk},
      LeaveRequest{"n", LeaveRequest::Kind::request}};
  std::vector<Message> out;
  for (const auto& b : bodies) out.push_back({"fuzz", 1, "c1", b});
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  for (int i = 1; i < *argc; ++i) {
    const std::string arg = (*argv)[i];
    if (arg.rfind("-make_corpus=", 0) == 0) {  // write the seed corpus and stop
      const std::filesystem::path dir = arg.substr(13);
      std::filesystem::create_directories(dir);
      int n = 0;
      for (const auto& m : every_kind()) {
        const auto bytes = encode(m).flatten();
        std::ofstream(dir / (std::string(kind_name(m.body)) + std::to_string(n++)), std::ios::binary)
            .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
      }
      std::exit(0);
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < frame_header_bytes) return 0;
  std::vector<uint8_t> fixed(data, data + frame_header_bytes + (size - frame_header_bytes) / 8 * 8);
  const uint32_t body = static_cast<uint32_t>(fixed.size() - frame_header_bytes);
  std::memcpy(fixed.data(), &body, sizeof body);
  data = fixed.data(), size = fixed.size();
  const auto length = frame_length(data, {});
  if (!length) return 0;
  auto message = decode_bytes({data + frame_header_bytes, *length});
  if (message) {
    // A frame that decodes must survive a round trip: re-encoded, decoded and encoded again, it
    // gives the same bytes (bytes, not values: a NaN in a tensor is not equal to itself).
    const auto again = encode(*message).flatten();
    auto twice = decode_bytes({again.data() + frame_header_bytes, again.size() - frame_header_bytes});
    if (!twice || encode(*twice).flatten() != again) std::abort();
  }
  return 0;
}

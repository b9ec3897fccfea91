// libFuzzer target for the frame decoder: the bytes a hostile peer can send after the handshake.
//
//   frame_fuzzer -runs=20000 CORPUS_DIR       (CORPUS_DIR: frame_fuzzer -make_corpus=DIR first)
//
// The seed corpus is one valid frame of every message kind. The custom mutator lets libFuzzer
// mutate a frame's body and then, most of the time, rewrites the length prefix to match, so most
// inputs get past the length check and exercise Cap'n Proto's decoding and ours; the rest keep
// their mutated prefix to exercise the length check itself. At exit the target reports how many
// inputs reached the decoder and fails if that is under half. Any crash, sanitizer report or
// uncaught exception fails the run.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "gossip/wire/codec.hpp"

using namespace tepdist::gossip;

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

// Built with g++ (clang 14 cannot compile this project's C++23), the target gets GCC's
// -fsanitize-coverage=trace-cmp: libFuzzer's value profile then guides mutation by the operands of
// integer comparisons. GCC also reports float comparisons, which libFuzzer has no hook for.
extern "C" void __sanitizer_cov_trace_cmpf(float, float) {}
extern "C" void __sanitizer_cov_trace_cmpd(double, double) {}

namespace {

size_t inputs = 0, reached_decoder = 0;

void report() {
  std::fprintf(stderr, "frame_fuzzer: %zu inputs, %zu reached the decoder (%.0f%%)\n", inputs, reached_decoder,
               inputs ? 100.0 * static_cast<double>(reached_decoder) / static_cast<double>(inputs) : 0.0);
  if (inputs > 0 && reached_decoder * 2 < inputs) {
    std::fprintf(stderr, "frame_fuzzer: fewer than half the inputs reached the decoder\n");
    std::_Exit(3);
  }
}

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
  std::atexit(report);
  return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  size = LLVMFuzzerMutate(data, size, max_size);
  // Most of the time, keep the frame self-consistent: a whole number of words with a matching
  // length prefix, so the mutation lands in what Cap'n Proto and the codec read.
  if (seed % 8 != 0 && size >= frame_header_bytes + 8) {
    size = frame_header_bytes + (size - frame_header_bytes) / 8 * 8;
    const uint32_t body = static_cast<uint32_t>(size - frame_header_bytes);
    std::memcpy(data, &body, sizeof body);
  }
  return size;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ++inputs;
  if (size < frame_header_bytes) return 0;
  const auto length = frame_length(data, {});
  if (!length || *length != size - frame_header_bytes) return 0;
  ++reached_decoder;
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

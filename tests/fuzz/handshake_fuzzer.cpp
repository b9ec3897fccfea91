// Fuzz target for the handshake and the sealed frames after it: what a stranger, or a peer on the
// path, can send before and after authentication. Built for AFL++ (handshake_afl; see
// tests/fuzz/afl_coverage.cpp and scripts/fuzz.sh):
//
//   scripts/fuzz.sh handshake 1000000
//
// An input is a mode byte, then frames, each a 2-byte little-endian length and that many bytes
// (padded with zeros to whole words, as the transport reads them):
//   mode 0  a responder reads the frames as a stranger's Hello and Proof;
//   mode 1  an initiator sends its Hello and reads the frames as the Challenge;
//   mode 2  a real handshake between two ends, each of its three frames XORed with the next input
//           frame on the way (a peer on the path: nothing rewritten must pass, and a zero mask
//           must), then the remaining frames are opened as sealed frames under the session's key;
//   mode 3  the same, and the remaining frames are a real sealed frame XORed with each.
// Any crash, sanitizer report, uncaught exception, or a handshake that succeeds with an altered
// frame, fails the run (abort).

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <optional>
#include <span>
#include <vector>

#include "gossip/transport/frame_seal.hpp"
#include "gossip/transport/handshake.hpp"

using namespace tepdist::gossip;

namespace {

Identity identity(const char* id) { return {"fuzz", id, "local", "a fuzzing secret, 32 bytes long!", "127.0.0.1:9"}; }

/// The input's frames, as the transport would hand them over.
struct Frames {
  std::span<const uint8_t> rest;
  std::optional<std::vector<uint8_t>> next() {
    if (rest.size() < 2) return std::nullopt;
    const size_t n = std::min<size_t>(rest[0] | (size_t{rest[1]} << 8), rest.size() - 2);
    std::vector<uint8_t> f(rest.begin() + 2, rest.begin() + 2 + static_cast<ptrdiff_t>(n));
    rest = rest.subspan(2 + n);
    return f;
  }
};

std::vector<uint64_t> words(const std::vector<uint8_t>& bytes) {
  std::vector<uint64_t> w((bytes.size() + 7) / 8, 0);
  if (!bytes.empty()) std::memcpy(w.data(), bytes.data(), bytes.size());
  return w;
}

/// A frame's body (no length prefix), XORed with mask (cycled); whether anything changed.
std::vector<uint64_t> altered(const OutFrame& frame, const std::vector<uint8_t>& mask, bool& changed) {
  auto flat = frame.flatten();
  std::vector<uint8_t> body(flat.begin() + frame_header_bytes, flat.end());
  for (size_t i = 0; i < body.size() && !mask.empty(); ++i) {
    const uint8_t m = mask[i % mask.size()];
    changed |= m != 0;
    body[i] ^= m;
  }
  return words(body);
}

void stranger_frames(Handshake& h, Frames& in) {
  while (auto f = in.next()) {
    const auto step = h.on_frame(words(*f));
    if (step.refused || step.done) return;
  }
}

void path_attack(Frames& in, bool real_sealed) {
  Handshake i(Handshake::Role::initiator, identity("a"), fresh_nonce());
  Handshake r(Handshake::Role::responder, identity("b"), fresh_nonce());
  bool changed = false;
  const auto mask = [&] { return in.next().value_or(std::vector<uint8_t>{}); };
  auto challenge = r.on_frame(altered(i.hello(), mask(), changed));
  if (!challenge.send) return;
  auto proof = i.on_frame(altered(*challenge.send, mask(), changed));
  if (!proof.send) return;
  auto done = r.on_frame(altered(*proof.send, mask(), changed));
  if (!done.done) {
    if (!changed) std::abort();  // an untouched handshake must succeed
    return;
  }
  // It succeeded (a change may have fallen in padding the proofs do not cover): then both ends
  // must agree on who is who and on the keys, or a peer on the path has got between them.
  if (i.send_key() != r.receive_key() || i.receive_key() != r.send_key() || r.peer_id() != "a" || i.peer_id() != "b")
    std::abort();
  FrameSealer writer(i.protection(), i.send_key()), reader(r.protection(), r.receive_key());
  const auto ping = encode({"a", 1, "fuzz", Ping{1, {}}}).flatten();
  while (auto f = in.next()) {
    std::vector<uint8_t> sealed = real_sealed ? writer.seal_flat(ping) : *f;
    bool touched = !real_sealed;
    if (real_sealed)
      for (size_t k = 0; k < sealed.size() && !f->empty(); ++k) {
        touched |= (*f)[k % f->size()] != 0;
        sealed[k] ^= (*f)[k % f->size()];
      }
    if (sealed.size() < frame_header_bytes) return;
    const auto opened = reader.open(sealed.data(), {sealed.data() + frame_header_bytes, sealed.size() - frame_header_bytes});
    if (opened && touched) std::abort();  // an altered (or made-up) frame passed its tag
    if (!opened) return;  // the transport closes the connection here
  }
}

}  // namespace

/// `-make_corpus=DIR`: writes one seed per mode (real frames, zero masks) and exits.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  for (int k = 1; k < *argc; ++k) {
    const std::string arg = (*argv)[k];
    if (arg.rfind("-make_corpus=", 0) != 0) continue;
    const std::filesystem::path dir = arg.substr(13);
    std::filesystem::create_directories(dir);
    auto frame = [](std::vector<uint8_t>& out, const std::vector<uint8_t>& bytes) {
      out.push_back(static_cast<uint8_t>(bytes.size())), out.push_back(static_cast<uint8_t>(bytes.size() >> 8));
      out.insert(out.end(), bytes.begin(), bytes.end());
    };
    auto body = [](const OutFrame& f) {
      const auto flat = f.flatten();
      return std::vector<uint8_t>(flat.begin() + frame_header_bytes, flat.end());
    };
    Handshake i(Handshake::Role::initiator, identity("a"), fresh_nonce());
    Handshake r(Handshake::Role::responder, identity("b"), fresh_nonce());
    const auto hello = body(i.hello());
    const auto challenge = r.on_frame(words(hello));
    const auto proof = i.on_frame(words(body(*challenge.send)));
    std::vector<std::vector<uint8_t>> seeds(4);
    for (auto& s : seeds) s.push_back(static_cast<uint8_t>(&s - seeds.data()));
    frame(seeds[0], hello), frame(seeds[0], body(*proof.send));
    frame(seeds[1], body(*challenge.send));
    for (int mode : {2, 3})
      for (int f = 0; f < 5; ++f) frame(seeds[mode], std::vector<uint8_t>(8, 0));
    for (size_t m = 0; m < seeds.size(); ++m)
      std::ofstream(dir / ("mode" + std::to_string(m)), std::ios::binary)
          .write(reinterpret_cast<const char*>(seeds[m].data()), static_cast<std::streamsize>(seeds[m].size()));
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Frames in{{data + 1, size - 1}};
  switch (data[0] % 4) {
    case 0: {
      Handshake r(Handshake::Role::responder, identity("b"), fresh_nonce());
      stranger_frames(r, in);
      break;
    }
    case 1: {
      Handshake i(Handshake::Role::initiator, identity("a"), fresh_nonce());
      (void)i.hello();
      stranger_frames(i, in);
      break;
    }
    case 2: path_attack(in, false); break;
    case 3: path_attack(in, true); break;
  }
  return 0;
}

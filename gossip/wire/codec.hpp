#pragma once
// Messages to frames and back. A frame on a stream is a 4-byte little-endian length and a Cap'n
// Proto message of that many bytes (segment table, then segments). Decoding treats every byte as
// hostile: sizes, nesting and traversal are bounded, and anything malformed becomes a WireError,
// never an exception or a crash.

#include <capnp/message.h>

#include <cstdint>
#include <expected>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gossip/wire/messages.hpp"

namespace tepdist::gossip {

enum class WireErrc {
  too_large,     ///< the length prefix exceeds the limit
  truncated,     ///< fewer bytes than a valid message needs
  malformed,     ///< Cap'n Proto refused it (bad pointers, segment table, text...)
  unknown_kind,  ///< a union member this build does not know
  over_limit,    ///< traversal or nesting limit exceeded
};

struct WireError {
  WireErrc code;
  std::string message;
};

template <class T>
using WireResult = std::expected<T, WireError>;

struct WireLimits {
  uint32_t max_frame_bytes = 64u << 20;  ///< 64 MiB: a LeNet gradient is 1.7 MB; bounds a hostile length
  int nesting_limit = 8;                 ///< the schema nests at most 4 deep
};

constexpr size_t frame_header_bytes = 4;

/// A frame ready to write: header, segment table and segments, as pieces to hand to writev. It
/// owns the builder and whatever the message's tensors reference, until it is destroyed.
class OutFrame {
 public:
  struct Piece {
    const void* data;
    size_t size;
  };
  OutFrame() = default;
  OutFrame(std::unique_ptr<capnp::MallocMessageBuilder> builder, std::vector<std::shared_ptr<const void>> keep_alive);

  const std::vector<Piece>& pieces() const { return pieces_; }
  size_t bytes() const { return bytes_; }
  /// The frame as one contiguous buffer (tests, fuzzing corpora, the link emulator's accounting).
  std::vector<uint8_t> flatten() const;

 private:
  std::unique_ptr<capnp::MallocMessageBuilder> builder_;
  std::vector<std::shared_ptr<const void>> keep_alive_;
  std::vector<uint32_t> header_;  // length prefix and segment table, as 32-bit words
  std::vector<Piece> pieces_;
  size_t bytes_ = 0;
};

/// Builds the frame for a message; tensor chunks are referenced, not copied, when their data starts
/// and ends on an 8-byte boundary (Cap'n Proto sends external data in whole words), copied otherwise.
OutFrame encode(const Message& message);

/// Reads the length prefix of a frame: the body size in bytes (a whole number of 8-byte words),
/// or too_large / truncated.
WireResult<uint32_t> frame_length(const uint8_t header[frame_header_bytes], const WireLimits& limits);

/// Decodes a frame body (the bytes after the length prefix, read into 8-byte words so tensors
/// can be viewed in place). Received tensor chunks view the body, which they keep alive.
WireResult<Message> decode(std::vector<uint64_t> body, const WireLimits& limits = {});

/// The same, from bytes (tests and fuzzing): a copy into words first.
WireResult<Message> decode_bytes(std::span<const uint8_t> body, const WireLimits& limits = {});

}  // namespace tepdist::gossip

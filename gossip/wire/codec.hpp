#pragma once
// Messages to frames and back. A frame on a stream is a 4-byte little-endian length and a Cap'n
// Proto message of that many bytes (segment table, then segments). Decoding treats every byte as
// hostile: sizes, nesting and traversal are bounded, each kind has its own frame limit, every list
// and text is checked against its cap and the frame's decode budget before it is allocated, and
// anything malformed becomes a WireError, never an exception or a crash.

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

/// An allocator whose growth leaves new elements uninitialised: frame memory is written by the
/// socket read before anything looks at it, and zeroing 2 MB a frame is a pass of its own.
template <class T>
struct uninitialized_allocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = uninitialized_allocator<U>;
  };
  using std::allocator<T>::allocator;
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
};

/// A received frame's body, in whole 8-byte words (so tensors can be viewed in place).
using FrameWords = std::vector<uint64_t, uninitialized_allocator<uint64_t>>;

/// Caps on what one decoded message may hold, from what the protocol needs: a frame over them is
/// refused (over_limit) before anything is allocated for it.
namespace wire_caps {
constexpr size_t members = 65536;             ///< a view, a list of workers, cursors, boot ids
constexpr size_t shards = 1u << 20;           ///< shards of a job, as listed in placements and votes
constexpr size_t holders = 64;                ///< holders of one shard (replication)
constexpr size_t roles = 64;                  ///< roles of one member
constexpr size_t span_values = 3 * 65536;     ///< one worker's position spans, (epoch, begin, end) each
constexpr size_t metrics = 65536, labels = 64;
constexpr size_t status_points = 1024;       ///< a status's evaluations, history points, generations
constexpr size_t name_bytes = 1024;           ///< ids, addresses, regions, roles, modes, metric names
constexpr size_t reason_bytes = 64u << 10;    ///< errors, refusals, details
constexpr size_t config_bytes = 1u << 20;     ///< a job's TOML text
/// Per-kind frame limits (the body's bytes): probes and joins, control messages, job records and
/// votes. The kinds that carry a tensor may use the whole configured frame.
constexpr uint32_t probe_frame_bytes = 1u << 20;
constexpr uint32_t control_frame_bytes = 256u << 10;
constexpr uint32_t record_frame_bytes = 4u << 20;
}  // namespace wire_caps

/// The largest frame of any membership kind (a state sync of wire_caps::members members): the
/// limit of a membership lane, whatever the configured frame size.
constexpr uint32_t max_membership_frame_bytes = 16u << 20;

/// What a frame of this many bytes may decode into, in bytes of lists and texts (tensors are viewed
/// in place and cost nothing): a few times the frame, so no frame amplifies into more.
constexpr size_t decode_budget_bytes(size_t frame_bytes) { return 8 * frame_bytes + (64u << 10); }

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

/// Where the memory of received frames is counted (the transport's receive budgets): charge() is
/// told what decoding a frame allocated, release() the frame's whole charge once the message and
/// every tensor viewing the frame are gone. release() may come from any thread, after the decode
/// call returned, and must not throw.
class FrameAccount {
 public:
  virtual ~FrameAccount() = default;
  virtual void charge(size_t bytes) noexcept = 0;
  virtual void release(size_t bytes) noexcept = 0;
};

/// Decodes a frame body (the bytes after the length prefix, read into 8-byte words so tensors
/// can be viewed in place). Received tensor chunks view the body, and the message holds it
/// (Message::frame), both keeping it alive. With an account, `charged` bytes are already counted
/// for the body; decoding adds what its lists and texts take, and the sum is released when the body
/// is freed, an error included.
WireResult<Message> decode(FrameWords body, const WireLimits& limits = {},
                           std::shared_ptr<FrameAccount> account = {}, size_t charged = 0);

/// The same, from bytes (tests and fuzzing): a copy into words first.
WireResult<Message> decode_bytes(std::span<const uint8_t> body, const WireLimits& limits = {});

}  // namespace tepdist::gossip

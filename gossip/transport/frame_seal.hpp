#pragma once
// Frames after the handshake, sealed: every frame carries an AEAD tag under a key of its
// direction and connection, over a counter that both ends keep (the nonce is never sent). A frame
// injected, replayed, reordered, cut or altered on the path fails the tag and ends the connection.
//
//   wire frame   [length L, 4 bytes LE][body, L - 16 bytes][tag, 16 bytes]
//   encrypted    body = AES-256-GCM ciphertext of the Cap'n Proto message; AAD = the length bytes
//   authenticated body = the message in the clear; the tag is ChaCha20-Poly1305's (RFC 8439) over
//                AAD = length | body: the same integrity, no confidentiality, and Poly1305 runs
//                at about 1.6x GMAC's rate on these CPUs (8.5-9 against 5-6 GB/s a core, measured
//                on the AVX-512 machine), so authenticating costs the loop thread less
//   nonce        12 bytes: 4 zero bytes, then the frame's counter (big-endian), counted from 0
//                per direction and connection, assigned when the frame is written
//
// The keys come from the handshake's ephemeral X25519 exchange (gossip/transport/handshake.hpp),
// so a recorded connection stays closed to anyone who later learns the cluster secret. Sans-IO:
// the transport hands frames in and writes what comes out.

#include <array>
#include <cstdint>
#include <expected>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gossip/wire/codec.hpp"

namespace tepdist::gossip {

/// How frames after the handshake are protected. Both ends must agree (the handshake checks).
enum class FrameProtection : uint8_t {
  plain = 0,          ///< none: only for measuring the transport (`tepdist_transport_bench`)
  authenticated = 1,  ///< integrity and order (Poly1305), readable on the path
  encrypted = 2,      ///< integrity, order and confidentiality (AES-256-GCM): the default
};

const char* protection_name(FrameProtection p);

using FrameKey = std::array<uint8_t, 32>;
constexpr size_t frame_tag_bytes = 16;

/// Memory a sealed frame is written into, kept for reuse: fresh pages cost more than the cipher.
struct SealBuffer {
  std::unique_ptr<uint8_t[]> data;
  size_t capacity = 0;
};

/// One direction of one connection: seals what it writes, or opens what it reads, in order.
class FrameSealer {
 public:
  FrameSealer(FrameProtection protection, const FrameKey& key);
  ~FrameSealer();
  FrameSealer(FrameSealer&&) noexcept;
  FrameSealer& operator=(FrameSealer&&) noexcept;

  FrameProtection protection() const { return protection_; }

  using Buffer = SealBuffer;
  /// A frame sealed for writing: `pieces` (for writev) view `storage` and the frame passed in,
  /// which must stay alive until the write completes.
  struct Sealed {
    Buffer storage;  // the new length prefix, the ciphertext if any, the tag
    std::vector<OutFrame::Piece> pieces;
    size_t bytes = 0;
  };
  /// Seals the next frame, into `reuse` when it is large enough. The frame's own length prefix is
  /// replaced by one that counts the tag.
  Sealed seal(const OutFrame& frame, Buffer reuse = Buffer());
  /// The same for a frame already flat (length prefix included), as one buffer: tests and fuzzing.
  std::vector<uint8_t> seal_flat(std::span<const uint8_t> frame);

  /// A frame's place in this direction's order, taken now, to be sealed later on any thread (the
  /// transport seals large frames off its loop thread and writes them in counter order).
  struct Ticket {
    FrameProtection protection;
    FrameKey key;
    uint64_t counter;
    ~Ticket();  // wipes the key
  };
  Ticket reserve();
  /// Seals under a ticket, with a cipher context of the calling thread's own: the same bytes as
  /// seal() would have written for the frame at that counter.
  static Sealed seal(const Ticket& ticket, const OutFrame& frame, Buffer reuse = Buffer());

  /// Opens the next frame read: `body` holds the L bytes after the length prefix (ciphertext or
  /// clear body, then the tag); on success it holds the message in its first L - 16 bytes and the
  /// message's length is returned. Any failure is final for the connection.
  std::expected<size_t, std::string> open(const uint8_t header[frame_header_bytes], std::span<uint8_t> body);

  uint64_t frames() const { return counter_; }

 private:
  FrameProtection protection_;
  FrameKey key_;  // for tickets
  struct Cipher;
  std::unique_ptr<Cipher> cipher_;
  uint64_t counter_ = 0;
};

/// The keys of both directions of one connection, from the handshake.
struct SessionKeys {
  FrameKey initiator_to_responder{}, responder_to_initiator{};
};

/// An ephemeral X25519 key pair, one per connection; the private half never leaves the process.
class EphemeralKey {
 public:
  EphemeralKey();  ///< a fresh pair from OpenSSL's CSPRNG
  ~EphemeralKey();
  EphemeralKey(EphemeralKey&&) noexcept;
  EphemeralKey& operator=(EphemeralKey&&) noexcept;
  const std::array<uint8_t, 32>& public_key() const { return public_; }
  /// The shared secret with a peer's public key, or why there is none (a malformed or low-order key).
  std::expected<std::array<uint8_t, 32>, std::string> agree(std::span<const uint8_t> peer_public) const;

 private:
  struct Pkey;
  std::unique_ptr<Pkey> key_;
  std::array<uint8_t, 32> public_{};
};

/// HKDF-SHA256: both directions' keys from the exchange's shared secret, salted with a hash of the
/// handshake's whole transcript, so the keys belong to this one authenticated handshake.
SessionKeys derive_session_keys(std::span<const uint8_t> shared, std::span<const uint8_t> transcript);

}  // namespace tepdist::gossip

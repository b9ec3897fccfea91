#pragma once
// Peer authentication and key agreement, sans-IO: a mutual HMAC-SHA256 challenge-response over
// fresh nonces and ephemeral X25519 keys, run on every connection before anything else is read.
//
//   initiator -> responder   Hello     {version, cluster id, node id, region, listen address, lane,
//                                       frame protection, nonce_i, X25519 key e_i}
//   responder -> initiator   Challenge {node id, region, nonce_r, X25519 key e_r,
//                                       HMAC(secret, T | "responder")}
//   initiator -> responder   Proof     {HMAC(secret, T | "initiator")}
//
// T = "tepdist-auth-v2" | cluster id | initiator id | responder id | initiator region | responder
// region | initiator listen address | lane | protection | nonce_i | nonce_r | e_i | e_r, each
// length-prefixed: everything either side says is signed. The secret never crosses the wire. Each
// side's proof covers the other side's fresh nonce, so a recorded handshake replayed to either
// side fails; a peer with another secret or cluster id is refused with a reason and never reaches
// an actor. Once both proofs check, the frames' keys are HKDF(X25519(e_i, e_r), salt = SHA-256(T))
// (gossip/transport/frame_seal.hpp): the ephemeral keys are authenticated by the proofs, and
// forgotten with the connection, so a recorded session stays closed even to a later holder of
// the secret (forward secrecy).

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gossip/transport/frame_seal.hpp"
#include "gossip/wire/codec.hpp"

namespace tepdist::gossip {

/// Who this node is, as the handshake proves it.
struct Identity {
  std::string cluster_id;
  std::string node_id;
  std::string region;
  std::string secret;          ///< the cluster secret's bytes
  std::string listen_address;  ///< host:port this node accepts connections on
  FrameProtection frames = FrameProtection::encrypted;  ///< how frames after the handshake are sealed
};

using Nonce = std::array<uint8_t, 32>;

/// 32 bytes from OpenSSL's CSPRNG.
Nonce fresh_nonce();

class Handshake {
 public:
  enum class Role { initiator, responder };

  /// What the connection should do after a step.
  struct Step {
    std::optional<OutFrame> send;  ///< a frame to write, if any
    bool done = false;             ///< authenticated: the peer fields are valid
    std::optional<std::string> refused;  ///< why the peer is refused; close the connection
  };

  Handshake(Role role, Identity self, Nonce nonce);

  /// The initiator's first frame (its Hello, naming the connection's lane); the responder waits
  /// for one instead.
  OutFrame hello(uint8_t lane = 0);
  /// Feeds one received frame body (after the length prefix).
  Step on_frame(std::vector<uint64_t> body);

  const std::string& peer_id() const { return peer_id_; }
  const std::string& peer_region() const { return peer_region_; }
  /// The initiator's listen address, as its Hello gave it (responder side only).
  const std::string& peer_listen_address() const { return peer_listen_address_; }
  /// The lane the initiator's Hello named (responder side only): 0 bulk, 1 membership.
  uint8_t peer_lane() const { return peer_lane_; }
  bool done() const { return state_ == State::done; }
  /// Once done: the keys of both directions of this connection, and this side's for each.
  const SessionKeys& keys() const { return keys_; }
  const FrameKey& send_key() const {
    return role_ == Role::initiator ? keys_.initiator_to_responder : keys_.responder_to_initiator;
  }
  const FrameKey& receive_key() const {
    return role_ == Role::initiator ? keys_.responder_to_initiator : keys_.initiator_to_responder;
  }
  FrameProtection protection() const { return self_.frames; }

 private:
  enum class State { await_hello, await_challenge, await_proof, done, failed };
  Step refuse(std::string why);
  /// The transcript T, with the roles' fields in order (the header says what).
  std::vector<uint8_t> transcript() const;
  std::vector<uint8_t> proof(const std::vector<uint8_t>& transcript, const char* label) const;
  /// Derives the session keys from the exchange; false (and a reason) when the peer's key is bad.
  std::optional<std::string> agree(const std::vector<uint8_t>& transcript);

  Role role_;
  Identity self_;
  Nonce nonce_;
  Nonce peer_nonce_{};
  EphemeralKey ephemeral_;
  std::array<uint8_t, 32> peer_ephemeral_{};
  SessionKeys keys_;
  std::string peer_id_, peer_region_, peer_listen_address_;
  uint8_t peer_lane_ = 0;
  uint8_t lane_ = 0;  // initiator: the lane its Hello named
  State state_;
};

}  // namespace tepdist::gossip

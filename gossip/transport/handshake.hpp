#pragma once
// Peer authentication, sans-IO: a mutual HMAC-SHA256 challenge-response over fresh nonces, run
// on every connection before anything else is read.
//
//   initiator -> responder   Hello     {version, cluster id, node id, region, nonce_i}
//   responder -> initiator   Challenge {node id, region, nonce_r, HMAC(secret, T | "responder")}
//   initiator -> responder   Proof     {HMAC(secret, T | "initiator")}
//
// T = "tepdist-auth-v1" | cluster id | initiator id | responder id | nonce_i | nonce_r, each
// length-prefixed. The secret never crosses the wire. Each side's proof covers the other side's
// fresh nonce, so a recorded handshake replayed to either side fails; a peer with another
// secret or cluster id is refused with a reason and never reaches an actor.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gossip/wire/codec.hpp"

namespace tepdist::gossip {

/// Who this node is, as the handshake proves it.
struct Identity {
  std::string cluster_id;
  std::string node_id;
  std::string region;
  std::string secret;          ///< the cluster secret's bytes
  std::string listen_address;  ///< host:port this node accepts connections on
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

 private:
  enum class State { await_hello, await_challenge, await_proof, done, failed };
  Step refuse(std::string why);
  std::vector<uint8_t> proof(const std::string& initiator, const std::string& responder, const Nonce& ni,
                             const Nonce& nr, const char* label) const;

  Role role_;
  Identity self_;
  Nonce nonce_;
  Nonce peer_nonce_{};
  std::string peer_id_, peer_region_, peer_listen_address_;
  uint8_t peer_lane_ = 0;
  State state_;
};

}  // namespace tepdist::gossip

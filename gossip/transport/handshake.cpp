#include "gossip/transport/handshake.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fmt/format.h>
#include <kj/exception.h>
#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>
#include <stdexcept>

#include "gossip/wire/wire.capnp.h"

namespace tepdist::gossip {
namespace {

// 2: ephemeral keys and sealed frames; 3: state pulls and pieces name the generation (a donor of
// version 2 would send generation 0, which a puller refuses piece by piece: say so at the handshake)
constexpr uint32_t protocol_version = 3;
constexpr size_t proof_bytes = 32;

void append(std::vector<uint8_t>& out, const void* data, size_t n) {
  const uint32_t len = static_cast<uint32_t>(n);
  const auto* p = reinterpret_cast<const uint8_t*>(&len);
  out.insert(out.end(), p, p + sizeof len);
  out.insert(out.end(), static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + n);
}

template <class Fill>
OutFrame frame_of(Fill fill) {
  auto mb = std::make_unique<capnp::MallocMessageBuilder>();
  fill(*mb);
  return OutFrame(std::move(mb), {});
}

kj::ArrayPtr<const capnp::word> words_of(const std::vector<uint64_t>& body) {
  return {reinterpret_cast<const capnp::word*>(body.data()), body.size()};
}

capnp::ReaderOptions small_message_limits() {
  capnp::ReaderOptions o;
  o.traversalLimitInWords = 1024;  // a handshake message is a few dozen words
  o.nestingLimit = 4;
  return o;
}

bool copy_nonce(capnp::Data::Reader in, Nonce& out) {
  if (in.size() != out.size()) return false;
  std::memcpy(out.data(), in.begin(), out.size());
  return true;
}

}  // namespace

Nonce fresh_nonce() {
  Nonce n;
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) throw std::runtime_error("RAND_bytes failed");
  return n;
}

Handshake::Handshake(Role role, Identity self, Nonce nonce)
    : role_(role),
      self_(std::move(self)),
      nonce_(nonce),
      state_(role == Role::initiator ? State::await_challenge : State::await_hello) {}

std::vector<uint8_t> Handshake::transcript() const {
  const bool initiator = role_ == Role::initiator;
  const auto& ni = initiator ? nonce_ : peer_nonce_;
  const auto& nr = initiator ? peer_nonce_ : nonce_;
  const auto& ei = initiator ? ephemeral_.public_key() : peer_ephemeral_;
  const auto& er = initiator ? peer_ephemeral_ : ephemeral_.public_key();
  const uint8_t lane = initiator ? lane_ : peer_lane_;
  const uint8_t protection = static_cast<uint8_t>(self_.frames);
  std::vector<uint8_t> t;
  auto text = [&](const std::string& v) { append(t, v.data(), v.size()); };
  constexpr std::string_view tag = "tepdist-auth-v2";
  append(t, tag.data(), tag.size());
  text(self_.cluster_id);
  text(initiator ? self_.node_id : peer_id_);
  text(initiator ? peer_id_ : self_.node_id);
  text(initiator ? self_.region : peer_region_);
  text(initiator ? peer_region_ : self_.region);
  text(initiator ? self_.listen_address : peer_listen_address_);
  append(t, &lane, 1);
  append(t, &protection, 1);
  append(t, ni.data(), ni.size());
  append(t, nr.data(), nr.size());
  append(t, ei.data(), ei.size());
  append(t, er.data(), er.size());
  return t;
}

std::vector<uint8_t> Handshake::proof(const std::vector<uint8_t>& transcript, const char* label) const {
  std::vector<uint8_t> message = transcript;
  append(message, label, std::strlen(label));
  std::vector<uint8_t> mac(EVP_MAX_MD_SIZE);
  unsigned len = 0;
  HMAC(EVP_sha256(), self_.secret.data(), static_cast<int>(self_.secret.size()), message.data(), message.size(),
       mac.data(), &len);
  mac.resize(len);
  return mac;
}

std::optional<std::string> Handshake::agree(const std::vector<uint8_t>& transcript) {
  auto shared = ephemeral_.agree(peer_ephemeral_);
  if (!shared) return shared.error();
  keys_ = derive_session_keys(*shared, transcript);
  OPENSSL_cleanse(shared->data(), shared->size());
  return std::nullopt;
}

Handshake::Step Handshake::refuse(std::string why) {
  state_ = State::failed;
  Step s;
  s.refused = std::move(why);
  return s;
}

OutFrame Handshake::hello(uint8_t lane) {
  lane_ = lane;
  return frame_of([&](capnp::MallocMessageBuilder& mb) {
    auto h = mb.initRoot<wire::Hello>();
    h.setVersion(protocol_version);
    h.setClusterId(self_.cluster_id);
    h.setNodeId(self_.node_id);
    h.setRegion(self_.region);
    h.setListenAddress(self_.listen_address);
    h.setLane(lane);
    h.setNonce(kj::arrayPtr(nonce_.data(), nonce_.size()));
    h.setEphemeral(kj::arrayPtr(ephemeral_.public_key().data(), ephemeral_.public_key().size()));
    h.setProtection(static_cast<uint8_t>(self_.frames));
  });
}

Handshake::Step Handshake::on_frame(std::vector<uint64_t> body) {
  try {
    capnp::FlatArrayMessageReader reader(words_of(body), small_message_limits());
    switch (state_) {
      case State::await_hello: {
        const auto h = reader.getRoot<wire::Hello>();
        if (h.getVersion() != protocol_version)
          return refuse(fmt::format("protocol version {} (this node speaks {})", h.getVersion(), protocol_version));
        if (std::string_view(h.getClusterId().cStr()) != self_.cluster_id)
          return refuse(fmt::format("cluster id mismatch: peer is in '{}', this node in '{}'", h.getClusterId().cStr(),
                                    self_.cluster_id));
        if (!copy_nonce(h.getNonce(), peer_nonce_)) return refuse("malformed nonce");
        peer_id_ = h.getNodeId();
        // A peer claiming this node's id, or echoing its nonce, could relay this node's own proofs
        // back to it (a reflection attack): the transcript would be the same on both sides.
        if (peer_id_ == self_.node_id) return refuse("the peer claims this node's own id");
        if (peer_nonce_ == nonce_) return refuse("the peer echoed this node's nonce");
        peer_region_ = h.getRegion();
        peer_listen_address_ = h.getListenAddress();
        peer_lane_ = h.getLane();
        if (peer_lane_ > 1) return refuse(fmt::format("unknown lane {}", peer_lane_));
        if (h.getProtection() != static_cast<uint8_t>(self_.frames))
          return refuse(fmt::format("frame protection mismatch: the peer's frames are {}, this node's {} "
                                    "([cluster] encrypt must be the same on every node)",
                                    h.getProtection() <= 2 ? protection_name(static_cast<FrameProtection>(h.getProtection()))
                                                           : "unknown",
                                    protection_name(self_.frames)));
        if (!copy_nonce(h.getEphemeral(), peer_ephemeral_)) return refuse("malformed ephemeral key");
        state_ = State::await_proof;
        const auto t = transcript();
        if (auto bad = agree(t)) return refuse(*bad);
        const auto mac = proof(t, "responder");
        Step s;
        s.send = frame_of([&](capnp::MallocMessageBuilder& mb) {
          auto c = mb.initRoot<wire::Challenge>();
          c.setNodeId(self_.node_id);
          c.setRegion(self_.region);
          c.setNonce(kj::arrayPtr(nonce_.data(), nonce_.size()));
          c.setProof(kj::arrayPtr(mac.data(), mac.size()));
          c.setEphemeral(kj::arrayPtr(ephemeral_.public_key().data(), ephemeral_.public_key().size()));
        });
        return s;
      }
      case State::await_challenge: {
        const auto c = reader.getRoot<wire::Challenge>();
        if (!copy_nonce(c.getNonce(), peer_nonce_)) return refuse("malformed nonce");
        if (peer_nonce_ == nonce_) return refuse("the peer echoed this node's nonce");
        peer_id_ = c.getNodeId();
        if (peer_id_ == self_.node_id) return refuse("the peer claims this node's own id");
        peer_region_ = c.getRegion();
        if (!copy_nonce(c.getEphemeral(), peer_ephemeral_)) return refuse("malformed ephemeral key");
        const auto t = transcript();
        const auto expected = proof(t, "responder");
        const auto got = c.getProof();
        if (got.size() != proof_bytes || CRYPTO_memcmp(got.begin(), expected.data(), proof_bytes) != 0)
          return refuse("the peer does not hold the cluster secret (wrong secret)");
        if (auto bad = agree(t)) return refuse(*bad);
        const auto mac = proof(t, "initiator");
        state_ = State::done;
        Step s;
        s.done = true;
        s.send = frame_of([&](capnp::MallocMessageBuilder& mb) {
          mb.initRoot<wire::Proof>().setProof(kj::arrayPtr(mac.data(), mac.size()));
        });
        return s;
      }
      case State::await_proof: {
        const auto expected = proof(transcript(), "initiator");
        const auto got = reader.getRoot<wire::Proof>().getProof();
        if (got.size() != proof_bytes || CRYPTO_memcmp(got.begin(), expected.data(), proof_bytes) != 0)
          return refuse("wrong proof: the peer does not hold the cluster secret, or replayed an old handshake");
        state_ = State::done;
        Step s;
        s.done = true;
        return s;
      }
      case State::done:
      case State::failed: return refuse("handshake frame after the handshake ended");
    }
  } catch (const kj::Exception& e) {
    return refuse(fmt::format("malformed handshake: {}", e.getDescription().cStr()));
  }
  return refuse("unreachable");
}

}  // namespace tepdist::gossip

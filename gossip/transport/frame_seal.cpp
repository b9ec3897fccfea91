#include "gossip/transport/frame_seal.hpp"

#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/sha.h>

#include <cstring>
#include <stdexcept>

#include "base/check.hpp"

namespace tepdist::gossip {
namespace {

void put_le32(uint8_t* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

[[noreturn]] void openssl_failed(const char* what) { throw std::runtime_error(std::string("OpenSSL: ") + what + " failed"); }

const EVP_CIPHER* aead_of(FrameProtection p) {
  return p == FrameProtection::authenticated ? EVP_chacha20_poly1305() : EVP_aes_256_gcm();
}

/// The nonce of the frame at `counter`: 4 zero bytes, then the counter big-endian.
void nonce(uint64_t counter, uint8_t out[12]) {
  std::memset(out, 0, 4);
  for (int i = 0; i < 8; ++i) out[4 + i] = static_cast<uint8_t>(counter >> (8 * (7 - i)));
}

FrameSealer::Sealed seal_pieces(EVP_CIPHER_CTX* ctx, FrameProtection protection, uint64_t counter,
                                std::span<const OutFrame::Piece> in, size_t bytes, SealBuffer reuse);

/// The calling thread's cipher context, keyed to seal one ticket's frame; reset (its key wiped)
/// when this goes.
struct TicketCipher {
  EVP_CIPHER_CTX* ctx;
  explicit TicketCipher(const FrameSealer::Ticket& ticket) {
    thread_local const std::unique_ptr<EVP_CIPHER_CTX, void (*)(EVP_CIPHER_CTX*)> mine(EVP_CIPHER_CTX_new(),
                                                                                      EVP_CIPHER_CTX_free);
    ctx = mine.get();
    if (!ctx) openssl_failed("frame key setup");
    if (EVP_CipherInit_ex(ctx, aead_of(ticket.protection), nullptr, ticket.key.data(), nullptr, 1) != 1) {
      EVP_CIPHER_CTX_reset(ctx);  // (the destructor will not run): no key left in it
      openssl_failed("frame key setup");
    }
  }
  ~TicketCipher() { EVP_CIPHER_CTX_reset(ctx); }
  TicketCipher(const TicketCipher&) = delete;
  TicketCipher& operator=(const TicketCipher&) = delete;
};

}  // namespace

const char* protection_name(FrameProtection p) {
  switch (p) {
    case FrameProtection::plain: return "plain";
    case FrameProtection::authenticated: return "authenticated";
    case FrameProtection::encrypted: return "encrypted";
  }
  return "unknown";
}

struct FrameSealer::Cipher {
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  ~Cipher() { EVP_CIPHER_CTX_free(ctx); }
};

FrameSealer::FrameSealer(FrameProtection protection, const FrameKey& key)
    : protection_(protection), cipher_(std::make_unique<Cipher>()) {
  if (!cipher_->ctx) openssl_failed("EVP_CIPHER_CTX_new");
  // The key is set once; each frame sets only its nonce. Encrypt and decrypt differ only in
  // direction, and one sealer serves one: the caller says which by calling seal or open.
  if (EVP_CipherInit_ex(cipher_->ctx, aead_of(protection), nullptr, key.data(), nullptr, -1) != 1)
    openssl_failed("frame key setup");
  key_ = key;
}

FrameSealer::~FrameSealer() { OPENSSL_cleanse(key_.data(), key_.size()); }
FrameSealer::FrameSealer(FrameSealer&&) noexcept = default;
FrameSealer& FrameSealer::operator=(FrameSealer&&) noexcept = default;

FrameSealer::Sealed FrameSealer::seal(const OutFrame& frame, Buffer reuse) {
  return seal_pieces(cipher_->ctx, protection_, counter_++, frame.pieces(), frame.bytes(), std::move(reuse));
}

FrameSealer::Ticket::~Ticket() { OPENSSL_cleanse(key.data(), key.size()); }

FrameSealer::Ticket FrameSealer::reserve() {
  TEPDIST_CHECK(protection_ != FrameProtection::plain);
  return {protection_, key_, counter_++};
}

FrameSealer::Sealed FrameSealer::seal(const Ticket& ticket, const OutFrame& frame, Buffer reuse) {
  const TicketCipher cipher(ticket);
  return seal_pieces(cipher.ctx, ticket.protection, ticket.counter, frame.pieces(), frame.bytes(), std::move(reuse));
}

std::vector<uint8_t> FrameSealer::seal_flat(std::span<const uint8_t> frame) {
  const OutFrame::Piece piece{frame.data(), frame.size()};
  const Sealed s = seal_pieces(cipher_->ctx, protection_, counter_++, {&piece, 1}, frame.size(), {});
  std::vector<uint8_t> out;
  out.reserve(s.bytes);
  for (const auto& p : s.pieces)
    out.insert(out.end(), static_cast<const uint8_t*>(p.data), static_cast<const uint8_t*>(p.data) + p.size);
  return out;
}

namespace {

FrameSealer::Sealed seal_pieces(EVP_CIPHER_CTX* ctx, FrameProtection protection, uint64_t counter,
                                std::span<const OutFrame::Piece> in, size_t bytes, SealBuffer reuse) {
  TEPDIST_CHECK(protection != FrameProtection::plain);
  TEPDIST_CHECK(!in.empty() && in[0].size >= frame_header_bytes);
  const size_t body = bytes - frame_header_bytes;
  TEPDIST_CHECK(body + frame_tag_bytes <= UINT32_MAX);
  const bool encrypt = protection == FrameProtection::encrypted;
  FrameSealer::Sealed s;
  const size_t stored = frame_header_bytes + (encrypt ? body : 0) + frame_tag_bytes;
  s.storage = std::move(reuse);
  if (s.storage.capacity < stored) s.storage = {std::unique_ptr<uint8_t[]>(new uint8_t[stored]), stored};
  uint8_t* header = s.storage.data.get();
  put_le32(header, static_cast<uint32_t>(body + frame_tag_bytes));
  uint8_t iv[12];
  nonce(counter, iv);
  int n = 0;
  if (EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, iv) != 1 ||
      EVP_EncryptUpdate(ctx, nullptr, &n, header, frame_header_bytes) != 1)
    openssl_failed("frame setup");
  uint8_t* const cipher = header + frame_header_bytes;
  uint8_t* tag = header + stored - frame_tag_bytes;
  // Encrypted: small pieces (the segment table, the root segment) are copied into place and
  // encrypted there together with the head of the next big piece, so a tensor is encrypted in
  // whole 16-byte blocks (OpenSSL's fast path; a partial block before it halves the rate).
  size_t done = 0, staged = 0;  // bytes encrypted; bytes copied in after them, not yet encrypted
  auto encrypt_staged = [&] {
    if (staged == 0) return;
    if (EVP_EncryptUpdate(ctx, cipher + done, &n, cipher + done, static_cast<int>(staged)) != 1)
      openssl_failed("frame encrypt");
    done += staged;
    staged = 0;
  };
  if (encrypt) s.pieces.push_back({header, stored});
  else s.pieces.push_back({header, frame_header_bytes});
  constexpr size_t small_piece = 4096;
  for (size_t i = 0; i < in.size(); ++i) {
    const auto* data = static_cast<const uint8_t*>(in[i].data);
    size_t size = in[i].size;
    if (i == 0) data += frame_header_bytes, size -= frame_header_bytes;  // the old length prefix
    if (size == 0) continue;
    if (!encrypt) {
      if (EVP_EncryptUpdate(ctx, nullptr, &n, data, static_cast<int>(size)) != 1) openssl_failed("frame authentication");
      s.pieces.push_back({data, size});
      continue;
    }
    const size_t head = size < small_piece ? size : std::min(size, (16 - staged % 16) % 16);
    std::memcpy(cipher + done + staged, data, head);
    staged += head, data += head, size -= head;
    if (size == 0) continue;
    encrypt_staged();
    for (size_t left = size; left > 0;) {  // the rest of a big piece, straight from its memory
      const int chunk = static_cast<int>(std::min<size_t>(left, size_t{1} << 30));
      if (EVP_EncryptUpdate(ctx, cipher + done, &n, data, chunk) != 1) openssl_failed("frame encrypt");
      done += static_cast<size_t>(chunk), data += chunk, left -= static_cast<size_t>(chunk);
    }
  }
  encrypt_staged();
  if (EVP_EncryptFinal_ex(ctx, cipher + done, &n) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, frame_tag_bytes, tag) != 1)
    openssl_failed("frame tag");
  TEPDIST_CHECK(!encrypt || done == body);
  if (!encrypt) s.pieces.push_back({tag, frame_tag_bytes});
  s.bytes = frame_header_bytes + body + frame_tag_bytes;
  return s;
}

}  // namespace

namespace {

/// A frame opened with ctx at `counter`: the tag checked over the length prefix and the body, the
/// body decrypted in place when encrypted; the message's length, or why it failed.
std::expected<size_t, std::string> open_with(EVP_CIPHER_CTX* ctx, FrameProtection protection, uint64_t counter,
                                             const uint8_t header[frame_header_bytes], std::span<uint8_t> body) {
  TEPDIST_CHECK(protection != FrameProtection::plain);
  if (body.size() < frame_tag_bytes) return std::unexpected("a sealed frame shorter than its tag");
  const size_t message = body.size() - frame_tag_bytes;
  uint8_t iv[12];
  nonce(counter, iv);
  int n = 0;
  if (EVP_DecryptInit_ex(ctx, nullptr, nullptr, nullptr, iv) != 1 ||
      EVP_DecryptUpdate(ctx, nullptr, &n, header, frame_header_bytes) != 1)
    openssl_failed("frame setup");
  uint8_t* data = body.data();
  for (size_t done = 0; done < message;) {
    const int chunk = static_cast<int>(std::min<size_t>(message - done, size_t{1} << 30));
    // In place: decryption writes the plaintext over the ciphertext.
    const int ok = protection == FrameProtection::encrypted
                       ? EVP_DecryptUpdate(ctx, data + done, &n, data + done, chunk)
                       : EVP_DecryptUpdate(ctx, nullptr, &n, data + done, chunk);
    if (ok != 1) openssl_failed("frame decrypt");
    done += static_cast<size_t>(chunk);
  }
  uint8_t expected[frame_tag_bytes];
  std::memcpy(expected, data + message, frame_tag_bytes);
  if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, frame_tag_bytes, expected) != 1) openssl_failed("frame tag");
  uint8_t rest[16];
  if (EVP_DecryptFinal_ex(ctx, rest, &n) != 1)
    return std::unexpected("a frame failed authentication (altered, injected, replayed or out of order)");
  return message;
}

}  // namespace

std::expected<size_t, std::string> FrameSealer::open(const uint8_t header[frame_header_bytes], std::span<uint8_t> body) {
  return open_with(cipher_->ctx, protection_, counter_++, header, body);
}

struct EphemeralKey::Pkey {
  EVP_PKEY* key = nullptr;
  ~Pkey() { EVP_PKEY_free(key); }
};

EphemeralKey::EphemeralKey() : key_(std::make_unique<Pkey>()) {
  key_->key = EVP_PKEY_Q_keygen(nullptr, nullptr, "X25519");
  if (!key_->key) openssl_failed("X25519 key generation");
  size_t len = public_.size();
  if (EVP_PKEY_get_raw_public_key(key_->key, public_.data(), &len) != 1 || len != public_.size())
    openssl_failed("X25519 public key");
}

EphemeralKey::~EphemeralKey() = default;
EphemeralKey::EphemeralKey(EphemeralKey&&) noexcept = default;
EphemeralKey& EphemeralKey::operator=(EphemeralKey&&) noexcept = default;

std::expected<std::array<uint8_t, 32>, std::string> EphemeralKey::agree(std::span<const uint8_t> peer_public) const {
  if (peer_public.size() != 32) return std::unexpected("an ephemeral key of the wrong size");
  EVP_PKEY* peer = EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, peer_public.data(), peer_public.size());
  if (!peer) return std::unexpected("a malformed ephemeral key");
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new(key_->key, nullptr);
  std::array<uint8_t, 32> shared{};
  size_t len = shared.size();
  const bool ok = ctx && EVP_PKEY_derive_init(ctx) == 1 && EVP_PKEY_derive_set_peer(ctx, peer) == 1 &&
                  EVP_PKEY_derive(ctx, shared.data(), &len) == 1 && len == shared.size();
  EVP_PKEY_CTX_free(ctx);
  EVP_PKEY_free(peer);
  // OpenSSL refuses an all-zero result (a low-order point) in derive: a peer cannot force a known key.
  if (!ok) return std::unexpected("the key exchange failed (a low-order or malformed ephemeral key)");
  return shared;
}

SessionKeys derive_session_keys(std::span<const uint8_t> shared, std::span<const uint8_t> transcript) {
  uint8_t salt[SHA256_DIGEST_LENGTH];
  SHA256(transcript.data(), transcript.size(), salt);
  std::array<uint8_t, 64> okm{};
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr);
  static constexpr std::string_view info = "tepdist-frames-v2";
  size_t len = okm.size();
  const bool ok = ctx && EVP_PKEY_derive_init(ctx) == 1 && EVP_PKEY_CTX_set_hkdf_md(ctx, EVP_sha256()) == 1 &&
                  EVP_PKEY_CTX_set1_hkdf_salt(ctx, salt, sizeof salt) == 1 &&
                  EVP_PKEY_CTX_set1_hkdf_key(ctx, shared.data(), static_cast<int>(shared.size())) == 1 &&
                  EVP_PKEY_CTX_add1_hkdf_info(ctx, reinterpret_cast<const unsigned char*>(info.data()),
                                              static_cast<int>(info.size())) == 1 &&
                  EVP_PKEY_derive(ctx, okm.data(), &len) == 1 && len == okm.size();
  EVP_PKEY_CTX_free(ctx);
  if (!ok) openssl_failed("HKDF");
  SessionKeys k;
  std::memcpy(k.initiator_to_responder.data(), okm.data(), 32);
  std::memcpy(k.responder_to_initiator.data(), okm.data() + 32, 32);
  OPENSSL_cleanse(okm.data(), okm.size());
  return k;
}

}  // namespace tepdist::gossip

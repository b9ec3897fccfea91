// A hostile peer, for measuring what a node does under it (bench/hostile.sh, the README's table)
// and for the test that a node keeps training under it within a memory limit
// (tests/integration/hostile_test.cpp). It speaks the wire by hand over plain sockets; with the
// cluster's secret it is an authenticated peer that misbehaves, without it a stranger.
//
//   tepdist_hostile ADDRESS SECRET_FILE ATTACK [SECONDS]      (ATTACK: one below, or all)
//
// Before authentication (a stranger):
//   garbage   200 connections each announce a 2 GiB frame
//   idle      300 connections that send nothing, held SECONDS
//   hellos    300 connections that send a Hello and never prove the secret, held SECONDS
// After authentication (holding the secret):
//   amplify   a state sync of 2 million empty members in 15 MiB, then one of 16.5 million in 63 MiB
//   announce  40 connections each announce a 64 MiB frame, send 8 bytes of it, and wait SECONDS
//   flood     4 connections send 1 MiB tensor frames as fast as the node takes them for SECONDS,
//             never reading what it sends back
// One line per attack: what was sent and how many of its connections the node closed.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <memory>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gossip/transport/frame_seal.hpp"
#include "gossip/transport/handshake.hpp"
#include "gossip/wire/codec.hpp"

using namespace tepdist::gossip;
using Clock = std::chrono::steady_clock;

namespace {

struct Target {
  std::string address;  // host:port
  std::string secret;
  std::string cluster_id = "tepdist";
  double seconds = 3;
};

int connect_to(const std::string& address) {
  const auto colon = address.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  if (::inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr) != 1) return -1;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return -1;
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

bool write_all(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w, n -= static_cast<size_t>(w);
  }
  return true;
}

bool write_all(int fd, const std::vector<uint8_t>& bytes) { return write_all(fd, bytes.data(), bytes.size()); }

bool read_exactly(int fd, void* out, size_t n) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r, n -= static_cast<size_t>(r);
  }
  return true;
}

/// Whether the node has closed fd, waiting at most `wait_ms` (what it sent meanwhile is discarded).
bool closed_by_node(int fd, int wait_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(wait_ms);
  char sink[65536];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left))) <= 0) return false;
    const ssize_t r = ::recv(fd, sink, sizeof sink, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
}

size_t count_closed(const std::vector<int>& fds, int wait_ms) {
  size_t closed = 0;
  const auto deadline = Clock::now() + std::chrono::milliseconds(wait_ms);
  for (int fd : fds) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    closed += closed_by_node(fd, static_cast<int>(std::max<int64_t>(0, left)));
  }
  return closed;
}

void close_all(std::vector<int>& fds) {
  for (int fd : fds) ::close(fd);
  fds.clear();
}

/// An authenticated connection: the handshake done by hand, and the keys to seal frames with.
struct Authenticated {
  int fd = -1;
  std::optional<Handshake> handshake;
  std::optional<FrameSealer> sealer;

  Authenticated(const Target& t, const std::string& id) {
    fd = connect_to(t.address);
    if (fd >= 0 && !authenticate(t, id)) close();
  }
  ~Authenticated() { close(); }
  Authenticated(const Authenticated&) = delete;
  Authenticated& operator=(const Authenticated&) = delete;
  bool ok() const { return fd >= 0 && sealer; }
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  bool send(const std::vector<uint8_t>& flat_frame) { return ok() && write_all(fd, sealer->seal_flat(flat_frame)); }

 private:
  bool authenticate(const Target& t, const std::string& id) {
    handshake.emplace(Handshake::Role::initiator, Identity{t.cluster_id, id, "local", t.secret, "127.0.0.1:9"},
                      fresh_nonce());
    if (!write_all(fd, handshake->hello().flatten())) return false;
    uint32_t n = 0;
    if (!read_exactly(fd, &n, 4) || n > 4096 || n % 8) return false;
    std::vector<uint64_t> body(n / 8);
    if (!read_exactly(fd, body.data(), n)) return false;
    auto step = handshake->on_frame(std::move(body));
    if (!step.done || !step.send || !write_all(fd, step.send->flatten())) return false;
    sealer.emplace(handshake->protection(), handshake->send_key());
    return true;
  }
};

void report(const char* attack, const std::string& sent, size_t closed, size_t of) {
  std::printf("attack=%s sent=\"%s\" closed_by_node=%zu of=%zu\n", attack, sent.c_str(), closed, of);
  std::fflush(stdout);
}

// ---- before authentication ----

void garbage(const Target& t) {
  std::vector<int> fds;
  const uint8_t huge[4] = {0xff, 0xff, 0xff, 0x7f};
  for (int i = 0; i < 200; ++i)
    if (const int fd = connect_to(t.address); fd >= 0) {
      write_all(fd, huge, 4);
      fds.push_back(fd);
    }
  report("garbage", "200 connections announcing a 2 GiB frame before the handshake", count_closed(fds, 5000),
         fds.size());
  close_all(fds);
}

void idle(const Target& t) {
  std::vector<int> fds;
  for (int i = 0; i < 300; ++i)
    if (const int fd = connect_to(t.address); fd >= 0) fds.push_back(fd);
  const int hold_ms = static_cast<int>(t.seconds * 1000);
  report("idle", "300 connections sending nothing, held " + std::to_string(hold_ms) + " ms", count_closed(fds, hold_ms),
         fds.size());
  close_all(fds);
}

void hellos(const Target& t) {
  std::vector<int> fds;
  for (int i = 0; i < 300; ++i) {
    const int fd = connect_to(t.address);
    if (fd < 0) continue;
    Handshake h(Handshake::Role::initiator,
                Identity{t.cluster_id, "stranger-" + std::to_string(i), "local", "a guess of 16 bytes or more", "127.0.0.1:9"},
                fresh_nonce());
    write_all(fd, h.hello().flatten());
    fds.push_back(fd);
  }
  const int hold_ms = static_cast<int>(t.seconds * 1000);
  report("hellos", "300 Hellos never followed by a proof, held " + std::to_string(hold_ms) + " ms",
         count_closed(fds, hold_ms), fds.size());
  close_all(fds);
}

// ---- after authentication ----

/// A state sync of one empty member padded with honest shard records to about `bytes`, its member
/// list rewritten into `count` members of zero words each (a frame the size of the padding).
std::vector<uint8_t> amplified_sync(const std::string& cluster_id, size_t bytes, uint32_t count) {
  StateSync s{{Member{}}, false, 0};
  for (uint32_t i = 0; i * 1000 < bytes; ++i) s.shards.push_back({i, {std::string(1000, 'p')}});
  auto flat = encode({"intruder", 1, cluster_id, s}).flatten();
  auto* words = reinterpret_cast<uint64_t*>(flat.data() + frame_header_bytes + 8);
  const size_t n = (flat.size() - frame_header_bytes - 8) / 8;
  const uint64_t tag = (uint64_t{1} << 2) | (uint64_t{3} << 32) | (uint64_t{5} << 48);
  for (size_t i = 0; i < n; ++i)
    if (words[i] == tag) words[i] = uint64_t{count} << 2;
    else if ((words[i] & 3) == 1 && ((words[i] >> 32) & 7) == 7 && (words[i] >> 35) == 8)
      words[i] &= 0xffffffffull | (uint64_t{7} << 32);
  return flat;
}

void amplify(const Target& t) {
  size_t closed = 0, of = 0;
  for (const auto& [bytes, count] : {std::pair<size_t, uint32_t>{15u << 20, 2'000'000}, {63u << 20, 16'500'000}}) {
    Authenticated a(t, "intruder-amplify");
    if (!a.ok()) continue;
    ++of;
    a.send(amplified_sync(t.cluster_id, bytes, count));
    closed += closed_by_node(a.fd, 10000);
  }
  report("amplify", "state syncs of 2 million empty members (15 MiB) and 16.5 million (63 MiB)", closed, of);
}

void announce(const Target& t) {
  std::vector<std::unique_ptr<Authenticated>> conns;
  for (int i = 0; i < 40; ++i) {
    auto a = std::make_unique<Authenticated>(t, "intruder-announce-" + std::to_string(i));
    if (!a->ok()) continue;
    const uint32_t length = (64u << 20) + frame_tag_bytes;
    uint8_t start[12] = {};
    std::memcpy(start, &length, 4);
    write_all(a->fd, start, sizeof start);
    conns.push_back(std::move(a));
  }
  const int hold_ms = static_cast<int>(t.seconds * 1000);
  std::vector<int> fds;
  for (auto& a : conns) fds.push_back(a->fd);
  report("announce", "40 authenticated connections announcing 64 MiB frames and sending 8 bytes, held " +
                         std::to_string(hold_ms) + " ms",
         count_closed(fds, hold_ms), fds.size());
}

void flood(const Target& t) {
  std::vector<std::thread> threads;
  std::vector<size_t> sent(4, 0);
  std::vector<int> closed(4, 0);
  const auto until = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(t.seconds * 1000));
  for (size_t k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      Authenticated a(t, "intruder-flood-" + std::to_string(k));
      if (!a.ok()) return;
      ::fcntl(a.fd, F_SETFL, ::fcntl(a.fd, F_GETFL) | O_NONBLOCK);
      std::vector<float> tensor(262144, 1.0f);  // 1 MiB
      const auto frame = encode({"intruder-flood", 1, t.cluster_id, TensorChunk{1, 0, 0, tensor.size(), tensor, nullptr}})
                             .flatten();
      std::vector<uint8_t> pending;
      size_t at = 0;
      while (Clock::now() < until) {
        if (at == pending.size()) {
          pending = a.sealer->seal_flat(frame);
          at = 0;
        }
        const ssize_t w = ::send(a.fd, pending.data() + at, pending.size() - at, MSG_NOSIGNAL);
        if (w > 0) {
          at += static_cast<size_t>(w);
          if (at == pending.size()) sent[k] += pending.size();
        } else if (w < 0 && errno == EAGAIN) {
          pollfd p{a.fd, POLLOUT, 0};
          ::poll(&p, 1, 50);  // the node reads no faster than it takes: back-pressure
        } else {
          closed[k] = 1;
          return;
        }
      }
    });
  for (auto& th : threads) th.join();
  size_t total = 0;
  for (size_t s : sent) total += s;
  char what[160];
  std::snprintf(what, sizeof what, "4 authenticated connections of 1 MiB tensor frames for %.0f s: %zu MiB taken by the node",
                t.seconds, total >> 20);
  report("flood", what,
         static_cast<size_t>(std::count(closed.begin(), closed.end(), 1)), 4);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: tepdist_hostile ADDRESS SECRET_FILE ATTACK [SECONDS]\n");
    return 2;
  }
  Target t;
  t.address = argv[1];
  std::ifstream in(argv[2]);
  std::getline(in, t.secret);
  if (t.secret.empty()) {
    std::fprintf(stderr, "tepdist_hostile: no secret in %s\n", argv[2]);
    return 2;
  }
  if (argc > 4) t.seconds = std::stod(argv[4]);
  const std::string attack = argv[3];
  const std::vector<std::pair<std::string, std::function<void(const Target&)>>> attacks{
      {"garbage", garbage}, {"idle", idle}, {"hellos", hellos}, {"amplify", amplify}, {"announce", announce},
      {"flood", flood}};
  bool any = false;
  for (const auto& [name, run] : attacks)
    if (attack == "all" || attack == name) {
      run(t);
      any = true;
    }
  if (!any) {
    std::fprintf(stderr, "tepdist_hostile: unknown attack %s\n", attack.c_str());
    return 2;
  }
  return 0;
}

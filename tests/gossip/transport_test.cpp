// Transports on loopback inside one process: authentication, delivery, order, hostile peers,
// back-pressure, and the link emulator on the real clock (lower bounds and order only).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <algorithm>
#include <mutex>

#include "gossip/transport/transport.hpp"

using namespace tepdist::gossip;
using namespace std::chrono_literals;

namespace {

/// What a transport's events reported, waited on without sleeping.
struct Recorder {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::pair<std::string, Message>> messages;
  std::vector<std::string> up, down, refused;

  TransportEvents events() {
    return {[this](const std::string& peer, const std::string&, Message m) {
              record([&] { messages.emplace_back(peer, std::move(m)); });
            },
            [this](const std::string& peer, const std::string&) { record([&] { up.push_back(peer); }); },
            [this](const std::string& peer, const std::string&) { record([&] { down.push_back(peer); }); },
            [this](const std::string&, const std::string& why) { record([&] { refused.push_back(why); }); }};
  }
  template <class F>
  void record(F f) {
    {
      std::lock_guard lock(mutex);
      f();
    }
    changed.notify_all();
  }
  /// Waits until pred() holds (checked under the lock), at most `limit`.
  template <class P>
  bool wait(P pred, std::chrono::milliseconds limit = 10s) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, limit, pred);
  }
};

TransportOptions options(const std::string& id, const std::string& secret = "s3cret") {
  TransportOptions o;
  o.identity = {"c1", id, "local", secret, ""};
  o.handshake_timeout_ms = 2000;
  return o;
}

Message ping(uint64_t seq) { return {"a", 1, "c1", Ping{seq, {}}}; }

/// A raw TCP socket connected to the transport listening at address (host:port on loopback).
int connect_raw(const std::string& address) {
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  return fd;
}

/// A raw socket that completes a real handshake with the transport at address: a peer holding the
/// secret, speaking frames by hand.
struct RawPeer {
  int fd;
  Handshake hs;
  explicit RawPeer(const std::string& address, FrameProtection frames = FrameProtection::encrypted, uint8_t lane = 0)
      : fd(connect_raw(address)),
        hs(Handshake::Role::initiator, {"c1", "raw", "local", "s3cret", "127.0.0.1:9", frames}, fresh_nonce()) {
    write_all(hs.hello(lane).flatten());
    auto step = hs.on_frame(read_frame());
    REQUIRE(step.done);
    write_all(step.send->flatten());
  }
  ~RawPeer() { ::close(fd); }
  void write_all(const std::vector<uint8_t>& bytes) {
    REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  }
  std::vector<uint64_t> read_frame() {
    uint8_t header[4];
    REQUIRE(::recv(fd, header, 4, MSG_WAITALL) == 4);
    uint32_t n;
    std::memcpy(&n, header, 4);
    std::vector<uint64_t> body(n / 8);
    REQUIRE(::recv(fd, body.data(), n, MSG_WAITALL) == static_cast<ssize_t>(n));
    return body;
  }
  bool closed_by_peer() {
    char c;
    return ::read(fd, &c, 1) == 0;
  }
};


}  // namespace

TEST_CASE("two transports authenticate and deliver messages in order", "[gossip][transport]") {
  Recorder ra, rb;
  MetricsRegistry metrics;
  auto oa = options("a");
  oa.metrics = &metrics;
  Transport a(oa, ra.events()), b(options("b"), rb.events());
  const auto addr_b = b.start();
  REQUIRE(addr_b.has_value());
  const auto addr_a = a.start();
  REQUIRE(addr_a.has_value());
  for (uint64_t i = 0; i < 100; ++i) REQUIRE(a.send(*addr_b, ping(i)));
  REQUIRE(rb.wait([&] { return rb.messages.size() == 100; }));
  for (uint64_t i = 0; i < 100; ++i) {
    CHECK(rb.messages[i].first == "a");
    CHECK(std::get<Ping>(rb.messages[i].second.body).seq_no == i);
  }
  // b answers over the same connection: a sees no second handshake.
  REQUIRE(b.send(*addr_a, {"b", 1, "c1", Ack{7, {}}}));
  REQUIRE(ra.wait([&] { return ra.messages.size() == 1; }));
  CHECK(std::get<Ack>(ra.messages[0].second.body).seq_no == 7);
  CHECK(ra.up == std::vector<std::string>{"b"});
  CHECK(rb.up == std::vector<std::string>{"a"});
  // Per-peer traffic lands in the registry (every frame was written: b has seen them all).
  const Labels peer_b{{"peer", *addr_b}};
  CHECK(metrics.counter("tepdist_transport_sent_frames_total", peer_b).value() == 100);
  CHECK(metrics.counter("tepdist_transport_received_frames_total", peer_b).value() == 1);
  CHECK(metrics.counter("tepdist_transport_sent_bytes_total", peer_b).value() > 100 * 8);
  CHECK(metrics.histogram("tepdist_transport_send_latency_seconds", peer_b).count() == 100);
}

TEST_CASE("once a transport runs, a write to a closed peer fails with EPIPE and does not kill the process",
          "[gossip][transport]") {
  // libuv writes with write(2); by default a peer that closed mid-frame raised SIGPIPE and a node
  // exited with 141 when a cluster stopped together. The write below is what libuv does then.
  Recorder r;
  Transport t(options("a"), r.events());
  REQUIRE(t.start().has_value());
  int fds[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  close(fds[1]);
  const char byte = 1;
  CHECK(write(fds[0], &byte, 1) == -1);  // without SIGPIPE ignored, the test process dies here
  CHECK(errno == EPIPE);
  close(fds[0]);
}

TEST_CASE("a 1.7 MB tensor crosses intact", "[gossip][transport]") {
  Recorder rb;
  Transport a(options("a"), {}), b(options("b"), rb.events());
  const auto addr_b = b.start();
  REQUIRE(a.start().has_value());
  auto tensor = std::make_shared<std::vector<float>>(431080);
  for (size_t i = 0; i < tensor->size(); ++i) (*tensor)[i] = static_cast<float>(i % 1000) * 0.001f;
  REQUIRE(a.send(*addr_b, {"a", 1, "c1", TensorChunk{3, 0, 0, tensor->size(), *tensor, tensor}}));
  REQUIRE(rb.wait([&] { return rb.messages.size() == 1; }));
  const auto& chunk = std::get<TensorChunk>(rb.messages[0].second.body);
  REQUIRE(chunk.data.size() == tensor->size());
  CHECK(std::equal(chunk.data.begin(), chunk.data.end(), tensor->begin()));
}

TEST_CASE("a peer with the wrong secret never reaches the events", "[gossip][transport]") {
  Recorder rb, rm;
  Transport b(options("b"), rb.events()), mallory(options("m", "guess"), rm.events());
  const auto addr_b = b.start();
  REQUIRE(mallory.start().has_value());
  REQUIRE(mallory.send(*addr_b, ping(1)));
  // Mallory, the initiator, checks b's proof first and gives up: it cannot prove the secret.
  REQUIRE(rm.wait([&] { return !rm.refused.empty(); }));
  CHECK_THAT(rm.refused[0], Catch::Contains("wrong secret"));
  CHECK(rb.messages.empty());
  CHECK(rb.up.empty());
  CHECK(rm.up.empty());
}

TEST_CASE("hostile bytes close that connection only, the node keeps serving others", "[gossip][transport]") {
  Recorder rb;
  MetricsRegistry metrics;
  auto ob = options("b");
  ob.metrics = &metrics;
  Transport b(ob, rb.events()), a(options("a"), {});
  const auto addr_b = b.start();
  REQUIRE(a.start().has_value());
  auto raw = [&](const std::string& bytes) {
    const int fd = connect_raw(*addr_b);
    REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
    char c;
    const ssize_t n = ::read(fd, &c, 1);  // returns 0 once the node closes the connection on us
    ::close(fd);
    return n;
  };
  CHECK(raw(std::string("\xff\xff\xff\x7f", 4)) == 0);                            // a 2 GiB length prefix
  CHECK(raw(std::string("\x00\x00\x01\x00", 4)) == 0);  // 64 KiB: fine later, too big for a handshake
  CHECK(raw(std::string("\x10\x00\x00\x00", 4) + std::string(16, '\xab')) == 0);  // garbage in place of a Hello
  REQUIRE(rb.wait([&] { return !rb.refused.empty(); }));
  REQUIRE(a.send(*addr_b, ping(5)));
  REQUIRE(rb.wait([&] { return rb.messages.size() == 1; }));
  CHECK(metrics.counter("tepdist_transport_connections_refused_total").value() >= 1);
  CHECK(rb.up == std::vector<std::string>{"a"});
}

TEST_CASE("a slow or absent peer cannot grow a sender's memory without bound", "[gossip][transport]") {
  auto o = options("a");
  o.send_queue_bytes = 64 * 1024;
  Transport a(o, {});
  REQUIRE(a.start().has_value());
  // Nobody listens on port 1: frames wait for a connection that never comes.
  auto tensor = std::make_shared<std::vector<float>>(4096);  // 16 KiB per frame
  int accepted = 0;
  for (int i = 0; i < 100; ++i)
    accepted += a.send("127.0.0.1:1", {"a", 1, "c1", TensorChunk{1, 0, 0, tensor->size(), *tensor, tensor}});
  CHECK(accepted >= 3);
  CHECK(accepted <= 5);  // 64 KiB of 16 KiB frames, whatever the timing
}

TEST_CASE("a full bulk queue never refuses membership messages", "[gossip][transport][lanes]") {
  auto o = options("a");
  o.send_queue_bytes = 64 * 1024;
  Transport a(o, {});
  REQUIRE(a.start().has_value());
  auto tensor = std::make_shared<std::vector<float>>(4096);  // 16 KiB per frame
  const Message chunk{"a", 1, "c1", TensorChunk{1, 0, 0, tensor->size(), *tensor, tensor}};
  while (a.send("127.0.0.1:1", chunk)) {
  }
  // Tensors to that peer are refused now; its probes, acks, leaves and state syncs are not.
  CHECK_FALSE(a.send("127.0.0.1:1", chunk));
  CHECK(a.send("127.0.0.1:1", ping(1)));
  CHECK(a.send("127.0.0.1:1", {"a", 1, "c1", Ack{1, {}}}));
  CHECK(a.send("127.0.0.1:1", {"a", 1, "c1", Leave{Member{"a", "127.0.0.1:2", 2, Member::State::left, "local", {}}}}));
  CHECK(a.send("127.0.0.1:1", {"a", 1, "c1", StateSync{}}));
}

TEST_CASE("a probe sent after a burst of tensors does not wait behind them", "[gossip][transport][lanes]") {
  Recorder rb;
  auto oa = options("a");
  oa.send_queue_bytes = 256u << 20;
  Transport a(oa, {}), b(options("b"), rb.events());
  const auto addr_b = b.start();
  REQUIRE(addr_b.has_value());
  REQUIRE(a.start().has_value());
  // Connect both lanes first, so the race is between frames, not handshakes.
  auto small = std::make_shared<std::vector<float>>(1);
  REQUIRE(a.send(*addr_b, {"a", 1, "c1", TensorChunk{0, 0, 0, 1, *small, small}}));
  REQUIRE(a.send(*addr_b, ping(0)));
  REQUIRE(rb.wait([&] { return rb.messages.size() == 2; }));
  // 48 frames of 1.7 MB (a LeNet's gradient each), then one probe.
  constexpr int tensors = 48;
  auto tensor = std::make_shared<std::vector<float>>(431080);
  for (int i = 1; i <= tensors; ++i)
    REQUIRE(a.send(*addr_b, {"a", 1, "c1", TensorChunk{static_cast<uint64_t>(i), 0, 0, tensor->size(), *tensor, tensor}}));
  REQUIRE(a.send(*addr_b, ping(1)));
  REQUIRE(rb.wait([&] { return rb.messages.size() == 2 + tensors + 1; }, 30s));
  size_t probe_at = 0;
  for (size_t i = 2; i < rb.messages.size(); ++i)
    if (std::holds_alternative<Ping>(rb.messages[i].second.body)) probe_at = i - 2;
  // On one shared connection it would come last, behind 80 MB; on its own lane it overtakes.
  INFO("the probe arrived after " << probe_at << " of " << tensors << " tensor frames");
  CHECK(probe_at < tensors);
}

TEST_CASE("emulated latency holds frames at least that long and keeps their order", "[gossip][transport][link]") {
  NetworkModel model;
  model.set_link("us-east", "eu-west", {40.0, 5.0, 0.0, 0.0});
  auto oa = options("a"), ob = options("b");
  oa.identity.region = "us-east";
  ob.identity.region = "eu-west";
  oa.network = ob.network = model;
  Recorder ra, rb;
  Transport a(oa, ra.events()), b(ob, rb.events());
  const auto addr_a = a.start(), addr_b = b.start();
  REQUIRE(addr_a.has_value());
  // The first frame goes before any connection exists, when the peer's region is not yet known:
  // it waits for the handshake and is then delayed like any other (at least 40 - 5 ms).
  const auto first = std::chrono::steady_clock::now();
  REQUIRE(a.send(*addr_b, ping(0)));
  REQUIRE(rb.wait([&] { return rb.messages.size() == 1; }));
  CHECK(std::chrono::steady_clock::now() - first >= 35ms);
  // Echo: a -> b -> a crosses the link twice, so it takes at least 2 x (40 - 5) ms.
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t i = 1; i <= 20; ++i) REQUIRE(a.send(*addr_b, ping(i)));
  REQUIRE(rb.wait([&] { return rb.messages.size() == 21; }));
  REQUIRE(b.send(*addr_a, {"b", 1, "c1", Ack{99, {}}}));
  REQUIRE(ra.wait([&] { return ra.messages.size() == 1; }));
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  CHECK(elapsed >= 70ms);
  for (uint64_t i = 0; i <= 20; ++i) CHECK(std::get<Ping>(rb.messages[i].second.body).seq_no == i);
}

TEST_CASE("an authenticated peer that sends a hostile frame loses its connection, and only it",
          "[gossip][transport]") {
  Recorder rb;
  Transport b(options("b"), rb.events()), a(options("a"), {});
  const auto addr_b = b.start();
  REQUIRE(a.start().has_value());
  RawPeer raw(*addr_b);  // a real handshake from a raw socket: this peer holds the secret
  // Then a frame of a kind from the future, sealed as this connection's keys want it: it passes
  // the tag, the codec refuses it, and b closes this connection.
  FrameSealer sealer(raw.hs.protection(), raw.hs.send_key());
  raw.write_all(sealer.seal_flat(encode({"raw", 1, "c1", Ping{1, {}}}).flatten()));
  auto frame = encode({"raw", 1, "c1", Ping{2, {}}}).flatten();
  const uint16_t future = 99;
  std::memcpy(frame.data() + 4 + 8 + 8 + 8, &future, 2);  // the Envelope's union discriminant
  raw.write_all(sealer.seal_flat(frame));
  CHECK(raw.closed_by_peer());
  REQUIRE(rb.wait([&] { return !rb.down.empty(); }));
  CHECK(rb.messages.size() == 1);  // the well-formed one came through
  CHECK(rb.down[0] == "raw");
  // Everyone else is still served.
  REQUIRE(a.send(*addr_b, ping(3)));
  REQUIRE(rb.wait([&] { return rb.messages.size() == 2; }));
}


TEST_CASE("after the handshake, a frame altered, replayed or unsealed on the path ends that connection",
          "[gossip][transport][seal]") {
  Recorder rb;
  Transport b(options("b"), rb.events());
  const auto addr_b = b.start();
  REQUIRE(addr_b);
  const auto frame = encode({"raw", 1, "c1", Ping{7, {}}}).flatten();
  SECTION("one bit flipped in the body") {
    RawPeer raw(*addr_b);
    FrameSealer sealer(raw.hs.protection(), raw.hs.send_key());
    auto sealed = sealer.seal_flat(frame);
    sealed[12] ^= 0x01;
    raw.write_all(sealed);
    CHECK(raw.closed_by_peer());
  }
  SECTION("a frame recorded and sent again") {
    RawPeer raw(*addr_b);
    FrameSealer sealer(raw.hs.protection(), raw.hs.send_key());
    const auto sealed = sealer.seal_flat(frame);
    raw.write_all(sealed);
    REQUIRE(rb.wait([&] { return rb.messages.size() == 1; }));
    raw.write_all(sealed);
    CHECK(raw.closed_by_peer());
  }
  SECTION("a frame in the clear, as before sealing (an injection without the keys)") {
    RawPeer raw(*addr_b);
    raw.write_all(frame);
    CHECK(raw.closed_by_peer());
  }
  SECTION("a frame sealed under a key of another connection") {
    RawPeer raw(*addr_b), other(*addr_b);
    FrameSealer sealer(other.hs.protection(), other.hs.send_key());
    raw.write_all(sealer.seal_flat(frame));
    CHECK(raw.closed_by_peer());
  }
  REQUIRE(rb.wait([&] { return !rb.down.empty() || !rb.refused.empty(); }));
  CHECK(rb.messages.size() <= 1);
}

TEST_CASE("encrypted frames do not show the message on the wire, authenticated ones do, and both check",
          "[gossip][transport][seal]") {
  for (const auto frames : {FrameProtection::encrypted, FrameProtection::authenticated}) {
    Recorder rb;
    auto o = options("b");
    o.identity.frames = frames;
    Transport b(o, rb.events());
    const auto addr_b = b.start();
    REQUIRE(addr_b);
    RawPeer raw(*addr_b, frames);
    // A recognisable payload: a member id of 40 'Q's.
    const std::string marker(40, 'Q');
    const auto flat = encode({marker, 1, "c1", Ping{9, {}}}).flatten();
    FrameSealer sealer(frames, raw.hs.send_key());
    const auto sealed = sealer.seal_flat(flat);
    CHECK(sealed.size() == flat.size() + frame_tag_bytes);
    const bool visible = std::search(sealed.begin(), sealed.end(), marker.begin(), marker.end()) != sealed.end();
    CHECK(visible == (frames == FrameProtection::authenticated));
    raw.write_all(sealed);
    REQUIRE(rb.wait([&] { return rb.messages.size() == 1; }));
    CHECK(rb.messages[0].first == "raw");
    CHECK(std::get<Ping>(rb.messages[0].second.body).seq_no == 9);
  }
}

TEST_CASE("nodes whose frame protection differs are refused in the handshake, saying why",
          "[gossip][transport][seal]") {
  Recorder ra, rb;
  auto oa = options("a");
  oa.identity.frames = FrameProtection::authenticated;
  Transport b(options("b"), rb.events()), a(oa, ra.events());
  const auto addr_b = b.start();
  REQUIRE(a.start());
  REQUIRE(a.send(*addr_b, ping(1)));
  REQUIRE(rb.wait([&] { return !rb.refused.empty(); }));
  CHECK(rb.refused[0].find("frame protection mismatch") != std::string::npos);
  CHECK(rb.messages.empty());
}

namespace {

Message tensor_message(uint64_t step, const std::shared_ptr<std::vector<float>>& t) {
  return {"a", 1, "c1", TensorChunk{step, 0, 0, t->size(), *t, t}};
}

/// Keeps every message it is handed until told to let go, as a busy actor's mailbox would.
struct Hoarder {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Message> held;
  std::vector<uint64_t> steps;
  TransportEvents events() {
    return {[this](const std::string&, const std::string&, Message m) {
      {
        std::lock_guard lock(mutex);
        steps.push_back(std::get<TensorChunk>(m.body).step);
        held.push_back(std::move(m));
      }
      changed.notify_all();
    }};
  }
  size_t seen() {
    std::lock_guard lock(mutex);
    return steps.size();
  }
};

}  // namespace

TEST_CASE("a receiver that holds what it got stops reading at its budget, and reads on once it lets go",
          "[gossip][transport][backpressure]") {
  Hoarder hoard;
  auto ob = options("b");
  ob.receive_queue_bytes = 1u << 20;
  auto oa = options("a");
  oa.send_queue_bytes = 1u << 20;
  Transport b(ob, hoard.events()), a(oa, {});
  const auto addr_b = b.start();
  REQUIRE(addr_b);
  REQUIRE(a.start());
  auto tensor = std::make_shared<std::vector<float>>(65536);  // 256 KiB a frame
  constexpr size_t total = 256;                               // 64 MiB: more than the sockets hold
  size_t sent = 0;
  // Until a's queue stays full for a whole second: b has stopped reading.
  while (sent < total && a.send(*addr_b, tensor_message(sent, tensor), 1s)) ++sent;
  REQUIRE(sent < total);
  // b holds its budget's worth (1 MiB, and the frame that crossed it), not what the sockets had.
  const size_t before = hoard.seen();
  CHECK(before <= 5);
  CHECK(before >= 3);
  std::unique_lock lock(hoard.mutex);
  hoard.held.clear();  // released on this thread: the transport is woken to read on
  REQUIRE(hoard.changed.wait_for(lock, 10s, [&] { return hoard.steps.size() > before; }));
  for (size_t i = 0; i < hoard.steps.size(); ++i) CHECK(hoard.steps[i] == i);
}

TEST_CASE("messages let go as they come flow through a small budget, in order", "[gossip][transport][backpressure]") {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<uint64_t> steps;
  std::vector<Message> held;
  auto ob = options("b");
  ob.receive_queue_bytes = 1u << 20;
  // Holds the last two messages at any time, letting the oldest go when a new one comes (a consumer
  // that held more than its budget this way, waiting for the next message, would wait forever).
  Transport b(ob, {[&](const std::string&, const std::string&, Message m) {
                std::lock_guard lock(mutex);
                steps.push_back(std::get<TensorChunk>(m.body).step);
                held.push_back(std::move(m));
                if (held.size() > 2) held.erase(held.begin());
                changed.notify_all();
              }});
  auto oa = options("a");
  oa.send_queue_bytes = 1u << 20;
  Transport a(oa, {});
  const auto addr_b = b.start();
  REQUIRE(addr_b);
  REQUIRE(a.start());
  auto tensor = std::make_shared<std::vector<float>>(65536);
  constexpr size_t total = 128;
  for (size_t i = 0; i < total; ++i) REQUIRE(a.send(*addr_b, tensor_message(i, tensor), 10s));
  std::unique_lock lock(mutex);
  REQUIRE(changed.wait_for(lock, 30s, [&] { return steps.size() == total; }));
  for (size_t i = 0; i < total; ++i) CHECK(steps[i] == i);
}

TEST_CASE("a frame announced but not sent holds its share of the node only until it stalls",
          "[gossip][transport][backpressure]") {
  Recorder rb;
  auto ob = options("b");
  ob.receive_total_bytes = 8u << 20;
  ob.frame_stall_timeout_ms = 300;
  Transport b(ob, rb.events()), a(options("a"), {});
  const auto addr_b = b.start();
  REQUIRE(addr_b);
  REQUIRE(a.start());
  RawPeer stall(*addr_b);
  // A ping, then in the same write 6 MiB announced and 8 bytes of it: once the ping is delivered,
  // the node has admitted the big frame (6 MiB of its 8 reserved) and waits for the rest.
  FrameSealer sealer(stall.hs.protection(), stall.hs.send_key());
  auto bytes = sealer.seal_flat(encode({"raw", 1, "c1", Ping{1, {}}}).flatten());
  const uint32_t announced = (6u << 20) + frame_tag_bytes;
  bytes.resize(bytes.size() + 4 + 8, 0);
  std::memcpy(bytes.data() + bytes.size() - 12, &announced, 4);
  stall.write_all(bytes);
  REQUIRE(rb.wait([&] { return rb.messages.size() == 1; }));
  // A 4 MiB frame from a real peer does not fit beside it: it waits until the stalled connection is
  // closed, and then comes in.
  auto tensor = std::make_shared<std::vector<float>>(1u << 20);
  REQUIRE(a.send(*addr_b, tensor_message(1, tensor)));
  REQUIRE(rb.wait([&] { return rb.messages.size() == 2; }));
  CHECK(rb.down == std::vector<std::string>{"raw"});
  CHECK(stall.closed_by_peer());
}

TEST_CASE("strangers holding every handshake slot do not keep a peer out", "[gossip][transport][slots]") {
  Recorder rb;
  auto ob = options("b");
  ob.handshake_timeout_ms = 60000;  // the strangers' slots would stay taken for the whole test
  Transport b(ob, rb.events()), a(options("a"), {});
  const auto addr_b = b.start();
  REQUIRE(addr_b);
  REQUIRE(a.start());
  // 300 strangers (more than one address may hold) send a Hello, get the challenge, and never
  // prove anything.
  std::vector<int> strangers;
  for (int i = 0; i < 300; ++i) {
    strangers.push_back(connect_raw(*addr_b));
    Handshake h(Handshake::Role::initiator, {"c1", "stranger-" + std::to_string(i), "local", "a guess", "127.0.0.1:9"},
                fresh_nonce());
    const auto hello = h.hello().flatten();
    REQUIRE(::write(strangers.back(), hello.data(), hello.size()) == static_cast<ssize_t>(hello.size()));
  }
  REQUIRE(a.send(*addr_b, ping(1)));
  CHECK(rb.wait([&] { return rb.messages.size() == 1; }, 10s));
  for (int fd : strangers) ::close(fd);
}

TEST_CASE("a connection that sends no Hello is closed after a second, however long the handshake may take",
          "[gossip][transport][slots]") {
  auto ob = options("b");
  ob.handshake_timeout_ms = 60000;
  Transport b(ob, {});
  const auto addr_b = b.start();
  REQUIRE(addr_b);
  const int fd = connect_raw(*addr_b);
  timeval guard{10, 0};  // a test that hangs is worse than one that fails
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &guard, sizeof guard);
  char c;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(::read(fd, &c, 1) == 0);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  ::close(fd);
}

TEST_CASE("64 nodes' transports on one address reach one seed at once, on both lanes", "[gossip][transport][slots]") {
  Recorder rb;
  Transport seed(options("seed"), rb.events());
  const auto addr = seed.start();
  REQUIRE(addr);
  std::vector<std::unique_ptr<Transport>> nodes;
  for (int i = 0; i < 64; ++i) {
    nodes.push_back(std::make_unique<Transport>(options("node-" + std::to_string(i)), TransportEvents{}));
    REQUIRE(nodes.back()->start());
  }
  auto small = std::make_shared<std::vector<float>>(4);
  for (auto& n : nodes) {
    REQUIRE(n->send(*addr, ping(1)));
    REQUIRE(n->send(*addr, tensor_message(1, small)));
  }
  const bool all = rb.wait([&] { return rb.messages.size() == 128; }, 30s);
  INFO(rb.messages.size() << " messages, " << rb.up.size() << " up, " << rb.down.size() << " down");
  REQUIRE(all);
}

TEST_CASE("a tensor on the membership lane ends that connection", "[gossip][transport][lanes]") {
  Recorder rb;
  Transport b(options("b"), rb.events());
  const auto addr_b = b.start();
  REQUIRE(addr_b);
  RawPeer raw(*addr_b, FrameProtection::encrypted, 1);
  FrameSealer sealer(raw.hs.protection(), raw.hs.send_key());
  raw.write_all(sealer.seal_flat(encode({"raw", 1, "c1", Ping{1, {}}}).flatten()));
  std::vector<float> t(16, 1.0f);
  raw.write_all(sealer.seal_flat(encode({"raw", 1, "c1", TensorChunk{1, 0, 0, t.size(), t, nullptr}}).flatten()));
  CHECK(raw.closed_by_peer());
  CHECK(rb.messages.size() == 1);
}

TEST_CASE("forgetting a peer gives its queue's room back and stops dialling it", "[gossip][transport]") {
  auto o = options("a");
  o.send_queue_bytes = 64 * 1024;
  Transport a(o, {});
  REQUIRE(a.start().has_value());
  auto tensor = std::make_shared<std::vector<float>>(4096);  // 16 KiB per frame
  // Nobody listens on port 1: the queue fills and stays full.
  while (a.send("127.0.0.1:1", tensor_message(1, tensor))) {
  }
  CHECK_FALSE(a.send("127.0.0.1:1", tensor_message(2, tensor), 200ms));
  a.forget("127.0.0.1:1");
  // Room again, once the loop has dropped the queue (send waits for it).
  CHECK(a.send("127.0.0.1:1", tensor_message(3, tensor), 5s));
}

TEST_CASE("large tensors sealed off the loop thread and small ones sealed in place arrive in the order sent",
          "[gossip][transport][seal]") {
  // Large frames are sealed on libuv's pool while small ones behind them are sealed at once: the
  // small ones must still wait their turn, or the receiver's counter (and the order) breaks.
  for (const auto p : {FrameProtection::encrypted, FrameProtection::authenticated}) {
    INFO(protection_name(p));
    Recorder rb;
    auto oa = options("a"), ob = options("b");
    oa.identity.frames = ob.identity.frames = p;
    Transport a(oa, {}), b(ob, rb.events());
    const auto addr_b = b.start();
    REQUIRE(a.start().has_value());
    auto large = std::make_shared<std::vector<float>>(431080), small = std::make_shared<std::vector<float>>(64);
    for (size_t i = 0; i < large->size(); ++i) (*large)[i] = static_cast<float>(i % 977);
    for (size_t i = 0; i < small->size(); ++i) (*small)[i] = -static_cast<float>(i);
    constexpr uint64_t total = 60;
    auto tensor_of = [&](uint64_t i) { return i % 3 == 0 ? large : small; };
    for (uint64_t i = 0; i < total; ++i) REQUIRE(a.send(*addr_b, tensor_message(i, tensor_of(i)), 10s));
    REQUIRE(rb.wait([&] { return rb.messages.size() == total; }, 30s));
    CHECK(rb.down.empty());
    for (uint64_t i = 0; i < total; ++i) {
      INFO("message " << i);
      const auto& chunk = std::get<TensorChunk>(rb.messages[i].second.body);
      CHECK(chunk.step == i);
      const auto& sent = *tensor_of(i);
      REQUIRE(chunk.data.size() == sent.size());
      CHECK(std::equal(chunk.data.begin(), chunk.data.end(), sent.begin()));
    }
  }
}

TEST_CASE("a peer that goes while tensors are being sealed for it leaves the sender whole",
          "[gossip][transport][seal]") {
  // Its connection closes with seals still running on the pool: they finish into a closed
  // connection, give their bytes back, and the sender goes on with the next peer. (A sender stopped
  // in the middle of a burst is the same path, taken from its own side.)
  auto tensor = std::make_shared<std::vector<float>>(431080);
  auto o = options("a");
  o.send_queue_bytes = 256u << 20;
  Transport a(o, {});
  REQUIRE(a.start().has_value());
  {
    Transport b(options("b"), {});
    const auto addr_b = b.start();
    REQUIRE(addr_b);
    for (uint64_t i = 0; i < 100; ++i) REQUIRE(a.send(*addr_b, tensor_message(i, tensor)));
    b.stop();  // mid-burst: most of the 172 MB is still queued or sealing
  }
  Recorder rc;
  Transport c(options("c"), rc.events());
  const auto addr_c = c.start();
  REQUIRE(addr_c);
  REQUIRE(a.send(*addr_c, tensor_message(1000, tensor), 10s));
  REQUIRE(rc.wait([&] { return rc.messages.size() == 1; }));
  CHECK(std::get<TensorChunk>(rc.messages[0].second.body).step == 1000);
  for (uint64_t i = 0; i < 20; ++i) REQUIRE(a.send(*addr_c, tensor_message(i, tensor), 10s));
  a.stop();  // with seals for c in flight, most likely: returns, and frees what they held
}

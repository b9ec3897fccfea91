#include "gossip/transport/transport.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <uv.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <limits>
#include <cstring>
#include <deque>
#include <iterator>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "gossip/log.hpp"
#include "base/check.hpp"
#include "base/thread_name.hpp"

namespace tepdist::gossip {
namespace {

constexpr size_t scratch_bytes = 64 * 1024;
// Before a peer has proven it holds the secret it may send only handshake frames, which are a few
// hundred bytes: a stranger cannot make the node allocate more than this per connection...
constexpr uint32_t max_handshake_frame_bytes = 4096;
// ...nor hold more than this many connections in the handshake at once, nor more than this many
// from one address (a local cluster of 64 nodes dials one seed on 2 lanes each: 128 from 127.0.0.1).
// A connection that finds its address's slots, or all of them, taken takes the slot of the oldest
// one from its address (or from the address holding the most), preferring one that has not sent its
// Hello: a flood evicts its own, and a joiner, whose handshake is one round trip, gets through.
constexpr size_t max_pending_handshakes = 512;
constexpr size_t max_pending_per_address = 160;
// An inbound connection sends its Hello at once or is closed: a stranger holds a slot this long.
constexpr uint64_t hello_timeout_ms = 1000;
// Authenticated inbound connections beyond this many are closed as they come (a 64-node cluster
// needs 2 x 63).
constexpr size_t max_inbound_connections = 1024;
// A frame's body is allocated as its bytes arrive: at most this much ahead of them, then doubling,
// so an announced length reserves nothing until it is sent.
constexpr size_t initial_body_bytes = 4u << 20;
// The membership lane's receive budgets: per connection two of its largest frames, and the node's.
constexpr size_t membership_receive_bytes = 2 * size_t{max_membership_frame_bytes};
constexpr size_t membership_receive_total_bytes = 256u << 20;
// Refusals and closings of strangers' connections are logged at most once a second.
constexpr uint64_t refusal_log_interval_ms = 1000;
// A lane hands libuv at most this many bytes whose writes have not completed: the rest waits in
// the lane's queue, unsealed, and goes on as writes complete, so a burst of tensors is sealed as the
// socket drains, not all at once ahead of a membership probe (4 MiB measured 10% slower for
// authenticated frames).
constexpr size_t max_unwritten_bytes = 16u << 20;
// Frames of at least this size are sealed on libuv's thread pool, not on the loop thread, which on
// loopback also runs the kernel's whole send path: sealing there cost authenticated frames a
// quarter of their rate (0.77 of plain; 1.0 with the sender's tag left out, the receiver's kept:
// the AVX-512 machine, December 4). Smaller frames are sealed in place (the hop costs more than
// their seal). A connection has at most this many frames on the pool at once: one ahead of the one
// being written is the pipeline; more would only take the cores the loop needs. Received frames are
// opened on the loop thread: opening them on the pool too was measured at a fifth of the rate on
// the 2-core machine (each open took 2-5 ms there against 0.2 ms in place, the pool threads
// contending with both loops for two cores).
constexpr size_t offload_seal_bytes = 256u << 10;
constexpr size_t max_sealing_jobs = 2;
// Sealed frames' memory is kept for the next ones, up to this many buffers of at most this size.
constexpr size_t seal_pool_buffers = 4;
constexpr size_t seal_pool_max_bytes = 16u << 20;

double unix_ms_now() {
  return std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// Membership probes behave like datagrams under emulation: they may be lost, and they do not wait
/// behind a stream's big frames.
bool is_datagram(const Body& b) {
  return std::holds_alternative<Ping>(b) || std::holds_alternative<Ack>(b) || std::holds_alternative<PingReq>(b);
}

/// Each pair of nodes keeps one connection per lane. Membership has its own, with its own queue
/// and its own back-pressure budget: a probe never waits behind a tensor frame in a queue or in a
/// socket buffer, and a bulk queue that is full never refuses one (its ack would come late, or
/// not at all, and the prober would suspect a live node).
enum class Lane : uint8_t { bulk = 0, membership = 1 };

Lane lane_of(const Body& b) { return is_membership(b) ? Lane::membership : Lane::bulk; }

const char* lane_name(Lane lane) { return lane == Lane::bulk ? "bulk" : "membership"; }

/// The node's receive accounting, per lane, shared with every received frame's charge (which may
/// outlive the transport: a message can sit in an actor's mailbox after the loop has stopped).
///
/// A frame is admitted at its header only when the node can hold it: its announced length is
/// reserved against the lane's total while it is read (the buffer itself grows only as bytes come),
/// and an admitted frame is always read to its end. Once complete it is charged, with what decoding
/// allocated, to its connection until the last copy of the message is gone (on any thread). A
/// connection whose frames alive exceed its budget, or exceed an even share of the lane's total
/// while the total is over, waits at its next frame boundary: reading stops, TCP pushes back, and
/// the sender's queue fills. So only the connections that hold a backlog wait, a quiet one (the
/// coordinator's, with the next install) never does, and the two lanes never wait for each other.
struct Ledger {
  struct LaneTotal {
    std::atomic<size_t> held{0};  // frames delivered and alive, with what they decoded into
    size_t budget = 0;            // of held, node-wide (loop thread, set at start)
    size_t reserved = 0;          // announced lengths of frames being read (loop thread)
    size_t connections = 0;       // authenticated connections of the lane (loop thread)
  };
  LaneTotal lanes[2];
  std::atomic<int> paused{0};  // connections waiting for frames to be released
  std::mutex mutex;
  uv_async_t* wake = nullptr;  // guarded by mutex; null once the loop is gone

  /// Frames were released or reservations ended: paused readers may go on.
  void poke() {
    if (paused.load(std::memory_order_relaxed) == 0) return;
    std::lock_guard lock(mutex);
    if (wake) uv_async_send(wake);
  }
};

/// One authenticated connection's frames alive anywhere.
struct Credit final : FrameAccount {
  Credit(std::shared_ptr<Ledger> l, Lane lane, size_t b) : ledger(std::move(l)), lane_index(static_cast<size_t>(lane)), budget(b) {}
  void charge(size_t bytes) noexcept override {
    held.fetch_add(bytes, std::memory_order_relaxed);
    ledger->lanes[lane_index].held.fetch_add(bytes, std::memory_order_relaxed);
  }
  void release(size_t bytes) noexcept override {
    held.fetch_sub(bytes, std::memory_order_relaxed);
    ledger->lanes[lane_index].held.fetch_sub(bytes, std::memory_order_relaxed);
    ledger->poke();
  }
  const std::shared_ptr<Ledger> ledger;
  const size_t lane_index;
  const size_t budget;  // of held
  std::atomic<size_t> held{0};
};

/// Where a peer's lane is filed: its queue, its queued bytes. A bulk lane's key is the address.
std::string lane_key(const std::string& address, Lane lane) {
  return lane == Lane::bulk ? address : address + "#membership";
}
bool is_bulk_key(const std::string& key) { return key.find('#') == std::string::npos; }

/// How long written data may stay unacknowledged before the connection is given up (ms). A peer
/// whose host vanished (power, link) leaves a half-open connection that would otherwise take
/// frames for minutes; closed, the next frame dials afresh and reaches the peer once it is back,
/// a restarted one included. Emulated delay is spent before the write, so it does not count here.
constexpr unsigned tcp_user_timeout_ms = 10000;

/// A numeric host:port as a socket address; port 0 only where binding (any free port).
std::expected<sockaddr_storage, std::string> resolve(const std::string& address, bool allow_port_zero = false) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) return std::unexpected("expected host:port, got '" + address + "'");
  std::string host = address.substr(0, colon);
  const int port = std::atoi(address.c_str() + colon + 1);
  const std::string port_text = address.substr(colon + 1);
  if (port_text.empty() || port_text.find_first_not_of("0123456789") != std::string::npos || port > 65535 ||
      (port == 0 && !allow_port_zero))
    return std::unexpected("bad port in '" + address + "'");
  if (host == "localhost") host = "127.0.0.1";
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  sockaddr_storage ss{};
  if (uv_ip4_addr(host.c_str(), port, reinterpret_cast<sockaddr_in*>(&ss)) == 0) return ss;
  if (uv_ip6_addr(host.c_str(), port, reinterpret_cast<sockaddr_in6*>(&ss)) == 0) return ss;
  return std::unexpected("'" + host + "' is not a numeric IP address");
}

std::string peer_name(uv_tcp_t* tcp) {
  sockaddr_storage ss{};
  int len = sizeof ss;
  if (uv_tcp_getpeername(tcp, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "unknown";
  char ip[64] = {};
  if (ss.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    uv_ip4_name(in, ip, sizeof ip);
    return std::string(ip) + ":" + std::to_string(ntohs(in->sin_port));
  }
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
  uv_ip6_name(in6, ip, sizeof ip);
  return "[" + std::string(ip) + "]:" + std::to_string(ntohs(in6->sin6_port));
}

}  // namespace

struct Transport::Impl {
  struct Peer;
  struct WriteReq;

  /// One TCP connection, inbound or outbound, from handshake to close.
  struct Conn {
    Impl* impl;
    uv_tcp_t tcp{};
    uv_timer_t handshake_timer{};
    bool outbound;
    Peer* peer = nullptr;  // outbound: from the start; inbound: once authenticated
    Handshake handshake;
    std::string label;     // for logs: the address dialled, or the remote ip:port
    bool authenticated = false, closing = false;
    int open_handles = 0;
    size_t writing_bytes = 0;  // handed to libuv, write callback not yet run (written or not)
    // Frame reader: a 4-byte header, then a body read straight into word-aligned memory.
    uint8_t header[frame_header_bytes]{};
    uint8_t frame_header[frame_header_bytes]{};  // the header of the frame being read
    size_t header_have = 0;
    // Once authenticated (unless the frames are plain): this connection's two directions.
    std::optional<FrameSealer> sealer, opener;
    // Frames sealed and not yet handed to libuv, in counter order: the front is written once its
    // seal (on the pool) is done, so the socket sees frames in the order their counters were taken.
    std::deque<WriteReq*> sealing;
    size_t sealing_jobs = 0;  // seals running on the pool: the Conn is not deleted before they end
    FrameWords body;  // grows as the body arrives (initial_body_bytes, then doubling)
    size_t body_bytes = 0, body_have = 0;  // announced, received
    bool in_body = false;
    bool hello_seen = false;  // inbound: a first frame came (before it, the hello timeout runs)
    uint64_t accepted_ms = 0;  // inbound: loop time of the accept (which pending slot is oldest)
    std::string remote_host;   // inbound: the remote address without the port
    // Receive accounting, from the handshake's end (gossip/transport: Ledger).
    std::shared_ptr<Credit> credit;
    size_t reserved = 0;         // the frame being read: its length, reserved in the lane's total
    bool paused = false;         // waiting at a frame boundary for frames to be released
    uint32_t waiting_length = 0; // paused: the length the header waiting for admission announced
    std::vector<char> leftover;  // paused: bytes read past that header, not yet looked at
    size_t stall_mark = 0;       // body_have at the last stall check
    char scratch[scratch_bytes];

    Conn(Impl* i, bool out, Handshake hs) : impl(i), outbound(out), handshake(std::move(hs)) {}
  };

  struct Outgoing {
    OutFrame frame;
    double release_ms;  // epoch-relative; 0 for immediately
    size_t counted;     // bytes this frame holds in queued_bytes (0 for handshake frames)
    uint64_t sent_ns;   // uv_hrtime() when send() took it
    bool datagram;      // a membership probe: may be lost under emulation
  };

  /// A peer's metric handles, looked up once.
  struct PeerMetrics {
    Counter *frames_in = nullptr, *bytes_in = nullptr, *frames_out = nullptr, *bytes_out = nullptr;
    Histogram* latency = nullptr;
  };

  /// Everything about one address this node sends to.
  struct Peer {
    std::string address, id, region;
    Lane lane = Lane::bulk;
    std::string key;             // lane_key(address, lane)
    Conn* conn = nullptr;        // authenticated connection used for sending
    Conn* connecting = nullptr;  // outbound connection not yet authenticated
    std::deque<Outgoing> queue;
    uv_timer_t* timer = nullptr;  // next release or reconnect; owned, closed at stop
    uint64_t backoff_ms = 0;      // 0: connect at once
    bool unreachable_reported = false;  // a failed connect is told once, until the peer is up again
    double next_connect_ms = 0;   // loop time before which no reconnect is tried
    PeerMetrics metrics;
  };

  struct WriteReq {
    uv_write_t req{};
    Impl* impl;
    Conn* conn;  // alive until its write callbacks have run (libuv runs them before the close's)
    OutFrame frame;
    FrameSealer::Sealed sealed;  // the frame as written, when the connection seals its frames
    std::string address;  // lane_key: whose queued bytes it gives back
    size_t counted;
    uint64_t sent_ns;
    Histogram* latency;
    std::vector<uv_buf_t> bufs;
    // Sealed on the pool: the frame's place in order and the memory to seal into (taken on the
    // loop thread); `ready` once sealed, `error` if sealing failed.
    uv_work_t work{};
    std::optional<FrameSealer::Ticket> ticket;
    SealBuffer reuse;
    bool ready = false;
    std::string error;
  };

  TransportOptions opt;
  TransportEvents events;
  LinkEmulator emulator;
  std::mt19937_64 random;

  uv_loop_t loop{};
  uv_async_t wake{};
  uv_tcp_t listener{};
  std::thread thread;
  bool started = false, stopped = false;
  double unix_offset_ms = 0;             // loop time + this = unix time in ms
  std::atomic<uint64_t> epoch_unix_ms{0};  // the cluster epoch; set_epoch_unix_ms may move it

  struct Pending {
    std::string address;
    Lane lane;
    OutFrame frame;
    bool datagram;
    uint64_t sent_ns;
    bool forget = false;  // no frame: forget(address) (in order with the sends around it)
  };
  std::mutex mutex;  // guards inbox, queued_bytes and stopping
  std::condition_variable drained;  // notified when a peer's queue shrinks (senders waiting for room, drain)
  std::vector<Pending> inbox;
  std::unordered_map<std::string, size_t> queued_bytes;  // by lane_key
  bool stopping = false;

  // Loop thread only.
  std::shared_ptr<Ledger> ledger = std::make_shared<Ledger>();
  uv_async_t resume{};  // Ledger::poke: frames were released somewhere
  /// At most one line a second, saying how many it held back.
  struct Limiter {
    uint64_t next_ms = 0;
    size_t held_back = 0;
    std::optional<size_t> admit(uint64_t now_ms) {
      if (now_ms < next_ms) {
        ++held_back;
        return std::nullopt;
      }
      next_ms = now_ms + refusal_log_interval_ms;
      return std::exchange(held_back, 0);
    }
  } refusal_log, stranger_log;  // refused in the handshake; closed before it ended
  std::vector<SealBuffer> seal_pool;
  std::unordered_map<std::string, std::unique_ptr<Peer>> peers;
  std::unordered_set<Conn*> conns;

  Impl(TransportOptions o, TransportEvents e)
      : opt(std::move(o)), events(std::move(e)), emulator(opt.network, opt.identity.region), random(opt.seed) {}

  /// Milliseconds since the cluster epoch, on the loop's clock.
  double now_ms() {
    return static_cast<double>(uv_now(&loop)) + unix_offset_ms - static_cast<double>(epoch_unix_ms.load());
  }

  // ---- connections ----

  Conn* new_conn(bool outbound) {
    auto* c = new Conn(this, outbound,
                       Handshake(outbound ? Handshake::Role::initiator : Handshake::Role::responder, opt.identity,
                                 fresh_nonce()));
    uv_tcp_init(&loop, &c->tcp);
    c->tcp.data = c;
    uv_timer_init(&loop, &c->handshake_timer);
    c->handshake_timer.data = c;
    c->open_handles = 2;
    conns.insert(c);
    return c;
  }

  /// An outbound connection has handshake_timeout_ms to connect and authenticate. An inbound one
  /// must send its Hello within hello_timeout_ms (a peer sends it at once), then has the rest.
  void start_handshake_clock(Conn* c) {
    uv_timer_start(&c->handshake_timer, handshake_clock_fired,
                   c->outbound ? opt.handshake_timeout_ms : std::min(hello_timeout_ms, opt.handshake_timeout_ms), 0);
  }

  static void handshake_clock_fired(uv_timer_t* t) {
    auto* c = static_cast<Conn*>(t->data);
    Impl* impl = c->impl;
    if (c->outbound) return impl->fail(c, "handshake timed out");
    if (!c->hello_seen) return impl->fail(c, fmt::format("no Hello within {} ms", hello_timeout_ms));
    const uint64_t spent = uv_now(&impl->loop) - c->accepted_ms;
    if (spent >= impl->opt.handshake_timeout_ms) return impl->fail(c, "handshake timed out");
    uv_timer_start(t, handshake_clock_fired, impl->opt.handshake_timeout_ms - spent, 0);
  }

  size_t inbound_authenticated() const {
    return static_cast<size_t>(std::count_if(conns.begin(), conns.end(), [](const Conn* c) {
      return c->authenticated && !c->outbound && !c->closing;
    }));
  }

  void start_reading(Conn* c) {
    uv_tcp_nodelay(&c->tcp, 1);
    uv_os_fd_t fd;
    if (uv_fileno(reinterpret_cast<uv_handle_t*>(&c->tcp), &fd) == 0) {
      const unsigned timeout = tcp_user_timeout_ms;
      setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout, sizeof timeout);
    }
    read_on(c);
  }

  void read_on(Conn* c) {
    uv_read_start(
        reinterpret_cast<uv_stream_t*>(&c->tcp),
        [](uv_handle_t* h, size_t, uv_buf_t* buf) {
          auto* c = static_cast<Conn*>(h->data);
          if (c->in_body && c->body_bytes - c->body_have >= scratch_bytes) {  // big bodies land in place
            c->impl->make_room(c);
            buf->base = reinterpret_cast<char*>(c->body.data()) + c->body_have;
            buf->len = c->body.size() * sizeof(uint64_t) - c->body_have;
          } else {
            buf->base = c->scratch;
            buf->len = scratch_bytes;
          }
        },
        [](uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
          auto* c = static_cast<Conn*>(s->data);
          Impl* impl = c->impl;
          if (n < 0) {
            impl->fail(c, n == UV_EOF ? "closed by the peer" : uv_strerror(static_cast<int>(n)), false);
            return;
          }
          if (buf->base != c->scratch) {
            c->body_have += static_cast<size_t>(n);
            if (c->body_have == c->body_bytes) impl->frame_complete(c);
            return;
          }
          impl->on_bytes(c, c->scratch, static_cast<size_t>(n));
        });
  }

  void on_bytes(Conn* c, const char* p, size_t n) {
    while (n > 0 && !c->closing) {
      if (!c->in_body) {
        const size_t take = std::min(frame_header_bytes - c->header_have, n);
        std::memcpy(c->header + c->header_have, p, take);
        c->header_have += take, p += take, n -= take;
        if (c->header_have < frame_header_bytes) return;
        c->header_have = 0;
        WireLimits limits = opt.limits;
        if (!c->authenticated) limits.max_frame_bytes = std::min(limits.max_frame_bytes, max_handshake_frame_bytes);
        else {
          // A membership lane carries membership kinds only, whose largest is a state sync.
          if (lane_of(*c) == Lane::membership)
            limits.max_frame_bytes = std::min(limits.max_frame_bytes, max_membership_frame_bytes);
          if (c->opener) limits.max_frame_bytes += frame_tag_bytes;
        }
        auto length = frame_length(c->header, limits);
        if (!length) return fail(c, length.error().message);
        std::memcpy(c->frame_header, c->header, frame_header_bytes);
        if (c->credit && !admit(c, *length)) {
          c->waiting_length = *length;
          c->leftover.assign(p, p + n);
          return pause(c);
        }
        begin_body(c, *length);
      } else {
        make_room(c);
        const size_t take = std::min(c->body.size() * sizeof(uint64_t) - c->body_have, n);
        std::memcpy(reinterpret_cast<char*>(c->body.data()) + c->body_have, p, take);
        c->body_have += take, p += take, n -= take;
        if (c->body_have == c->body_bytes) frame_complete(c);
      }
    }
  }

  void begin_body(Conn* c, uint32_t length) {
    c->body_bytes = length;
    c->body_have = 0;
    c->in_body = true;
    resize_body(c, std::min<size_t>(length, initial_body_bytes));
  }

  /// The body buffer at `bytes`: a whole number of words, at least what has arrived.
  static void resize_body(Conn* c, size_t bytes) { c->body.resize(bytes / sizeof(uint64_t)); }

  /// Room for at least one more byte of the body: doubles it, up to the announced length.
  void make_room(Conn* c) {
    const size_t have = c->body.size() * sizeof(uint64_t);
    if (c->body_have < have) return;
    resize_body(c, std::min(c->body_bytes, std::max(2 * have, size_t{scratch_bytes})));
  }

  /// The lane a connection serves: the one its Hello named.
  static Lane lane_of(const Conn& c) {
    return c.outbound ? c.peer->lane : static_cast<Lane>(c.handshake.peer_lane());
  }

  void frame_complete(Conn* c) {
    c->in_body = false;
    c->hello_seen = true;
    FrameWords body = std::move(c->body);
    c->body = {};
    if (!c->authenticated) return handshake_step(c, std::vector<uint64_t>(body.begin(), body.end()));
    const size_t wire_bytes = c->body_bytes;
    end_reservation(c);
    // Opened whole once its last byte is in. (Opening the bytes as they came, while still in cache,
    // was measured slower: 0.49 of plain for authenticated frames against 0.58, on the 2-core VM.)
    if (c->opener) {
      auto opened = c->opener->open(c->frame_header, {reinterpret_cast<uint8_t*>(body.data()), c->body_bytes});
      if (!opened) return fail(c, opened.error());
      body.resize(*opened / sizeof(uint64_t));
    }
    // From here the frame is charged to its connection, and the charge goes with it: released when
    // its last user lets go (a decoding error included).
    const size_t charged = body.capacity() * sizeof(uint64_t);
    c->credit->charge(charged);
    auto message = decode(std::move(body), opt.limits, c->credit, charged);
    if (!message) return fail(c, "bad frame: " + message.error().message);
    if (message->cluster_id != opt.identity.cluster_id)
      return fail(c, "frame for cluster '" + message->cluster_id + "'");
    // The membership lane is never read behind tensors: nothing else may come on it.
    if (lane_of(*c) == Lane::membership && !is_membership(message->body))
      return fail(c, std::string("a ") + kind_name(message->body) + " frame on the membership lane");
    if (c->peer && c->peer->metrics.frames_in) {
      c->peer->metrics.frames_in->add();
      c->peer->metrics.bytes_in->add(frame_header_bytes + wire_bytes);
    }
    if (events.on_message) events.on_message(c->handshake.peer_id(), c->peer ? c->peer->address : "", std::move(*message));
  }

  // ---- receive budgets (back-pressure; see Ledger) ----

  /// Whether the frame whose header c has just read may be read now; if so, its length is reserved.
  bool admit(Conn* c, uint32_t length) {
    const Credit& k = *c->credit;
    auto& lane = ledger->lanes[k.lane_index];
    const size_t held = k.held.load(std::memory_order_relaxed);
    // A frame larger than the budget still comes in once nothing else of c's is held.
    if (held > 0 && held + length > k.budget) return false;
    const size_t total = lane.held.load(std::memory_order_relaxed);
    if (total > lane.budget && held > lane.budget / std::max<size_t>(1, lane.connections)) return false;
    // Frames being read: what the lane can hold besides, and always one.
    if (lane.reserved > 0 && lane.reserved + length > lane.budget) return false;
    lane.reserved += length;
    c->reserved = length;
    return true;
  }

  void end_reservation(Conn* c) {
    if (!c->reserved) return;
    ledger->lanes[c->credit->lane_index].reserved -= c->reserved;
    c->reserved = 0;
    ledger->poke();
  }

  void pause(Conn* c) {
    uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->tcp));
    c->paused = true;
    ledger->paused.fetch_add(1);
    if (opt.metrics)
      opt.metrics->counter("tepdist_transport_receive_paused_total", {}, "times reading from a peer waited for its frames to be consumed").add();
    log().debug("receive_paused peer={} lane={} held={} budget={}", c->handshake.peer_id(), lane_name(lane_of(*c)),
                c->credit->held.load(), c->credit->budget);
    // Something may have been released between the last look and now: look again then.
    ledger->poke();
  }

  /// Frames were released: every paused connection whose waiting frame is now admitted goes on.
  void resume_readers() {
    std::vector<Conn*> waiting;
    for (Conn* c : conns)
      if (c->paused) waiting.push_back(c);
    for (Conn* c : waiting) {
      if (!conns.count(c) || c->closing || !c->paused || !admit(c, c->waiting_length)) continue;
      c->paused = false;
      ledger->paused.fetch_sub(1);
      begin_body(c, c->waiting_length);
      const std::vector<char> rest = std::move(c->leftover);
      c->leftover = {};
      on_bytes(c, rest.data(), rest.size());
      if (!c->closing && !c->paused) read_on(c);
    }
  }

  /// Post-authentication: a frame of which no byte comes for a whole interval, while this node
  /// reads, is a peer holding a reservation it does not use.
  void start_stall_clock(Conn* c) {
    uv_timer_start(
        &c->handshake_timer,
        [](uv_timer_t* t) {
          auto* c = static_cast<Conn*>(t->data);
          if (c->in_body && !c->paused && c->body_have == c->stall_mark)
            return c->impl->fail(c, fmt::format("a frame of {} bytes stalled at {} for {} ms", c->body_bytes,
                                                c->body_have, c->impl->opt.frame_stall_timeout_ms));
          c->stall_mark = c->body_have;
        },
        opt.frame_stall_timeout_ms, opt.frame_stall_timeout_ms);
  }

  void handshake_step(Conn* c, std::vector<uint64_t> body) {
    auto step = c->handshake.on_frame(std::move(body));
    if (step.send) write(c, std::move(*step.send), "", 0);
    if (c->closing) return;  // the write failed and closed it
    if (step.refused) {
      if (opt.metrics) opt.metrics->counter("tepdist_transport_connections_refused_total", {}, "connections refused in the handshake").add();
      // A stranger can be refused a thousand times a second: said once a second, with a count.
      // (Refusals of connections this node dialled are all told: they say why it cannot join.)
      if (const auto more = c->outbound ? std::optional<size_t>(0) : refusal_log.admit(uv_now(&loop))) {
        log().warn("peer_refused peer={} reason=\"{}\"{}", c->label, *step.refused,
                   *more ? fmt::format(" refused_since_last={}", *more) : "");
        if (events.on_refused) events.on_refused(c->label, *step.refused);
      }
      return fail(c, *step.refused, false);
    }
    if (!step.done) return;
    if (!c->outbound && inbound_authenticated() >= max_inbound_connections)
      return fail(c, fmt::format("more than {} inbound connections", max_inbound_connections));
    c->authenticated = true;
    // Every frame from here on is sealed (the Proof above went out before this).
    if (c->handshake.protection() != FrameProtection::plain) {
      c->sealer.emplace(c->handshake.protection(), c->handshake.send_key());
      c->opener.emplace(c->handshake.protection(), c->handshake.receive_key());
    }
    const Lane lane = lane_of(*c);
    c->credit = std::make_shared<Credit>(ledger, lane, lane == Lane::bulk ? opt.receive_queue_bytes : membership_receive_bytes);
    ++ledger->lanes[static_cast<size_t>(lane)].connections;
    start_stall_clock(c);
    Peer* p = c->outbound ? c->peer : &peer(c->handshake.peer_listen_address(), static_cast<Lane>(c->handshake.peer_lane()));
    c->peer = p;
    p->id = c->handshake.peer_id();
    p->region = c->handshake.peer_region();
    if (p->connecting == c) p->connecting = nullptr;
    // The newest connection carries what goes to this peer: after a restart, the peer's fresh one
    // must win over a connection to its old process that nobody has seen fail yet. (Two nodes
    // dialling each other at once keep both; either serves.)
    p->conn = c;
    p->backoff_ms = 0;
    p->unreachable_reported = false;
    if (opt.metrics && !p->metrics.frames_in) {
      const Labels l{{"peer", p->address}};
      p->metrics = {&opt.metrics->counter("tepdist_transport_received_frames_total", l, "frames received from the peer"),
                    &opt.metrics->counter("tepdist_transport_received_bytes_total", l, "bytes received from the peer"),
                    &opt.metrics->counter("tepdist_transport_sent_frames_total", l, "frames written to the peer"),
                    &opt.metrics->counter("tepdist_transport_sent_bytes_total", l, "bytes written to the peer"),
                    &opt.metrics->histogram("tepdist_transport_send_latency_seconds", l, "send() to write completed, emulated delay included")};
    }
    log().debug("peer_up peer={} address={} region={} lane={}", p->id, p->address, p->region, lane_name(p->lane));
    if (events.on_peer_up) events.on_peer_up(p->id, p->address + " lane=" + lane_name(p->lane));
    schedule(*p);
    pump(*p);
  }

  /// Closes a connection; `warn` logs it as a problem (hostile or broken input) rather than news.
  void fail(Conn* c, const std::string& reason, bool warn = true) {
    if (c->closing) return;
    c->closing = true;
    // Strangers' connections are logged at the refusals' rate (a flood would flood the log).
    if (warn && (c->authenticated || c->outbound)) log().warn("connection_closed peer={} reason=\"{}\"", c->label, reason);
    else if (warn)
      if (const auto more = stranger_log.admit(uv_now(&loop)))
        log().warn("connection_closed peer={} reason=\"{}\"{}", c->label, reason,
                   *more ? fmt::format(" refused_since_last={}", *more) : "");
    Peer* p = c->peer;
    conns.erase(c);
    if (c->credit) {
      end_reservation(c);
      --ledger->lanes[c->credit->lane_index].connections;
      if (c->paused) ledger->paused.fetch_sub(1);
      c->paused = false;
      c->body = {};
    }
    if (p && p->connecting == c) {
      p->connecting = nullptr;
      // Never reached (refused, unreachable, timed out): tell once, so a joiner can say why.
      if (!c->authenticated && !p->conn && !p->unreachable_reported && events.on_peer_down) {
        p->unreachable_reported = true;
        events.on_peer_down(p->id.empty() ? p->address : p->id, reason);
      }
    }
    if (p && p->conn == c) {
      // Two nodes dialling each other at once end up with two connections: fall back on the other.
      p->conn = nullptr;
      for (Conn* other : conns)
        if (other->peer == p && other->authenticated && !other->closing) p->conn = other;
      if (!p->conn && events.on_peer_down) events.on_peer_down(p->id, reason + " (" + lane_name(p->lane) + " lane)");
    }
    auto on_closed = [](uv_handle_t* h) {
      auto* c = static_cast<Conn*>(h->data);
      --c->open_handles;
      c->impl->release_if_done(c);
    };
    uv_close(reinterpret_cast<uv_handle_t*>(&c->handshake_timer), on_closed);
    uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), on_closed);
    if (p && !p->queue.empty() && !stopping_loop()) {
      p->backoff_ms = p->backoff_ms ? std::min(p->backoff_ms * 2, opt.reconnect_max_ms)
                                    : std::max<uint64_t>(1, opt.reconnect_initial_ms);
      p->next_connect_ms = static_cast<double>(uv_now(&loop) + p->backoff_ms);
      pump(*p);
    }
  }

  bool stopping_loop() {
    std::lock_guard lock(mutex);
    return stopping;
  }

  void connect(Peer& p) {
    auto addr = resolve(p.address);
    if (!addr) {
      log().warn("connect_failed peer={} reason=\"{}\"", p.address, addr.error());
      drop_queue(p);
      return;
    }
    Conn* c = new_conn(true);
    c->peer = &p;
    c->label = p.address;
    p.connecting = c;
    auto* req = new uv_connect_t;
    req->data = c;
    start_handshake_clock(c);  // bounds the connect too: an address that never answers gives up
    const int rc = uv_tcp_connect(req, &c->tcp, reinterpret_cast<const sockaddr*>(&*addr), [](uv_connect_t* r, int status) {
      auto* c = static_cast<Conn*>(r->data);
      delete r;
      if (c->closing) return;
      if (status < 0) return c->impl->fail(c, std::string("connect: ") + uv_strerror(status), false);
      c->impl->start_reading(c);
      c->impl->write(c, c->handshake.hello(static_cast<uint8_t>(c->peer->lane)), "", 0);
    });
    if (rc != 0) {
      delete req;
      fail(c, std::string("connect: ") + uv_strerror(rc), false);
    }
  }

  void accept() {
    Conn* c = new_conn(false);
    if (uv_accept(reinterpret_cast<uv_stream_t*>(&listener), reinterpret_cast<uv_stream_t*>(&c->tcp)) != 0)
      return fail(c, "accept failed");
    c->label = peer_name(&c->tcp);
    c->remote_host = c->label.substr(0, c->label.rfind(':'));
    c->accepted_ms = uv_now(&loop);
    std::unordered_map<std::string, std::vector<Conn*>> pending;
    size_t count = 0;
    for (Conn* other : conns)
      if (other != c && !other->authenticated && !other->outbound && !other->closing) {
        pending[other->remote_host].push_back(other);
        ++count;
      }
    const auto mine = pending.find(c->remote_host);
    auto from = mine != pending.end() && mine->second.size() >= max_pending_per_address ? mine : pending.end();
    if (from == pending.end() && count >= max_pending_handshakes)
      from = std::max_element(pending.begin(), pending.end(),
                              [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
    if (from != pending.end()) {
      // The one to give up its slot: silent ones first, then the oldest.
      Conn* victim = *std::min_element(from->second.begin(), from->second.end(), [](const Conn* a, const Conn* b) {
        return std::pair(a->hello_seen, a->accepted_ms) < std::pair(b->hello_seen, b->accepted_ms);
      });
      fail(victim, "its handshake slot went to a newer connection (every slot was taken)");
    }
    start_reading(c);
    start_handshake_clock(c);
  }

  // ---- sending ----

  Peer& peer(const std::string& address, Lane lane) {
    auto& slot = peers[lane_key(address, lane)];
    if (!slot) {
      slot = std::make_unique<Peer>();
      slot->address = address;
      slot->lane = lane;
      slot->key = lane_key(address, lane);
      slot->timer = new uv_timer_t;
      uv_timer_init(&loop, slot->timer);
      slot->timer->data = slot.get();
    }
    return *slot;
  }

  /// Writes a frame on c; `key` (a lane_key) gets the frame's `counted` bytes back once written.
  /// Once authenticated, frames are sealed in the order they come here (the counter the receiver
  /// expects is the write order on this connection, whatever queue a frame came from): in place,
  /// or on the pool for a large one, and written in that order as their seals complete.
  void write(Conn* c, OutFrame frame, const std::string& key, size_t counted, uint64_t sent_ns = 0) {
    Histogram* latency = c->peer && counted ? c->peer->metrics.latency : nullptr;
    if (c->peer && counted && c->peer->metrics.frames_out) {
      c->peer->metrics.frames_out->add();
      c->peer->metrics.bytes_out->add(frame.bytes());
    }
    auto* w = new WriteReq{{}, this, c, std::move(frame), {}, key, counted, sent_ns, latency, {}, {}, {}, {}, false, {}};
    c->writing_bytes += w->frame.bytes();
    if (!c->authenticated || !c->sealer) return submit(w);
    SealBuffer reuse;
    if (!seal_pool.empty()) {
      reuse = std::move(seal_pool.back());
      seal_pool.pop_back();
    }
    // A membership connection's frames are sealed here whatever their size: libuv's pool is the
    // whole process's, and membership never waits behind tensors.
    if (w->frame.bytes() < offload_seal_bytes || lane_of(*c) == Lane::membership) {
      w->sealed = c->sealer->seal(w->frame, std::move(reuse));
      if (c->sealing.empty()) return submit(w);
      w->ready = true;  // behind frames still being sealed
      c->sealing.push_back(w);
      return;
    }
    w->ticket.emplace(c->sealer->reserve());
    w->reuse = std::move(reuse);
    w->work.data = w;
    c->sealing.push_back(w);
    ++c->sealing_jobs;
    uv_queue_work(
        &loop, &w->work,
        [](uv_work_t* r) {  // on a pool thread: touches only its WriteReq's frame, ticket and buffers
          auto* w = static_cast<WriteReq*>(r->data);
          thread_local const bool named = (base::name_this_thread("uv-seal"), true);
          (void)named;
          try {
            w->sealed = FrameSealer::seal(*w->ticket, w->frame, std::move(w->reuse));
          } catch (const std::exception& e) {
            w->error = e.what();
          }
          w->ticket.reset();
        },
        [](uv_work_t* r, int) {
          auto* w = static_cast<WriteReq*>(r->data);
          Conn* c = w->conn;
          --c->sealing_jobs;
          w->ready = true;
          c->impl->write_sealed(c, w->address);  // (a copy: w may be written and freed there)
        });
  }

  /// A seal of c's, for lane `key`, ended: hands c's sealed frames to libuv from the front, up to
  /// the first still being sealed. On a closing connection they are dropped instead (their bytes
  /// given back, as a failed write's).
  void write_sealed(Conn* c, std::string key) {
    while (!c->sealing.empty() && c->sealing.front()->ready) {
      WriteReq* w = c->sealing.front();
      c->sealing.pop_front();
      if (!c->closing && !w->error.empty()) fail(c, "sealing a frame: " + w->error);
      if (c->closing) {
        c->writing_bytes -= w->frame.bytes();
        give_back(w->address, w->counted);
        recycle(std::move(w->sealed.storage));
        delete w;
        continue;
      }
      submit(w);
    }
    if (release_if_done(c)) return;
    // The seal that ended made room for the next under max_sealing_jobs, whether or not a frame
    // could be written: the lane goes on.
    if (!key.empty())
      if (const auto it = peers.find(key); it != peers.end() && it->second->timer) pump(*it->second);
  }

  /// Deletes a closed connection once libuv has closed its handles and no seal of its is running;
  /// returns whether it did.
  bool release_if_done(Conn* c) {
    if (c->open_handles > 0 || c->sealing_jobs > 0) return false;
    TEPDIST_CHECK(c->sealing.empty());
    delete c;
    return true;
  }

  void recycle(SealBuffer b) {
    if (b.data && b.capacity <= seal_pool_max_bytes && seal_pool.size() < seal_pool_buffers)
      seal_pool.push_back(std::move(b));
  }

  /// Hands a frame, sealed if its connection seals, to libuv.
  void submit(WriteReq* w) {
    Conn* c = w->conn;
    for (const auto& piece : c->authenticated && c->sealer ? w->sealed.pieces : w->frame.pieces())
      w->bufs.push_back(uv_buf_init(const_cast<char*>(static_cast<const char*>(piece.data)),
                                    static_cast<unsigned>(piece.size)));
    w->req.data = w;
    const int rc = uv_write(&w->req, reinterpret_cast<uv_stream_t*>(&c->tcp), w->bufs.data(),
                            static_cast<unsigned>(w->bufs.size()), [](uv_write_t* r, int status) {
                              auto* w = static_cast<WriteReq*>(r->data);
                              if (w->latency) w->latency->observe(static_cast<double>(uv_hrtime() - w->sent_ns) / 1e9);
                              Impl* impl = w->impl;
                              w->conn->writing_bytes -= w->frame.bytes();
                              impl->give_back(w->address, w->counted);
                              impl->recycle(std::move(w->sealed.storage));
                              const std::string key = std::move(w->address);
                              delete w;
                              // Room again under max_unwritten_bytes: the lane goes on.
                              if (status == 0 && !key.empty())
                                if (const auto it = impl->peers.find(key); it != impl->peers.end() && it->second->timer)
                                  impl->pump(*it->second);
                            });
    if (rc != 0) {
      c->writing_bytes -= w->frame.bytes();
      give_back(w->address, w->counted);
      recycle(std::move(w->sealed.storage));
      delete w;
      fail(c, std::string("write: ") + uv_strerror(rc));
    }
  }

  /// Gives back a frame's share of its peer lane's send queue (it was written or dropped).
  void give_back(const std::string& key, size_t counted) {
    if (!counted) return;
    std::lock_guard lock(mutex);
    auto& q = queued_bytes[key];
    q -= std::min(q, counted);
    drained.notify_all();
    // The gauge is the bulk lane's, by peer address: membership's frames are small and few.
    if (opt.metrics && is_bulk_key(key))
      opt.metrics->gauge("tepdist_transport_send_queue_bytes", {{"peer", key}}, "bytes waiting to be written").set(static_cast<double>(q));
  }

  /// Both lanes of the peer at address: what waits is dropped (its bytes given back to senders)
  /// and no reconnection is tried until something new is sent there.
  void forget_peer(const std::string& address) {
    for (const Lane lane : {Lane::bulk, Lane::membership}) {
      const auto it = peers.find(lane_key(address, lane));
      if (it == peers.end()) continue;
      Peer& p = *it->second;
      drop_queue(p);
      if (p.timer) uv_timer_stop(p.timer);
      p.backoff_ms = 0;
      p.next_connect_ms = 0;
    }
  }

  void drop_queue(Peer& p) {
    for (auto& o : p.queue) give_back(p.key, o.counted);
    p.queue.clear();
  }

  /// Moves a peer forward: connect if needed, write what the emulator has released, and arm the
  /// timer for the next thing to do.
  void pump(Peer& p) {
    uv_timer_stop(p.timer);
    if (p.queue.empty()) return;
    if (!p.conn) {
      if (p.connecting) return;  // the handshake's end pumps again
      const double now = static_cast<double>(uv_now(&loop));
      if (now >= p.next_connect_ms) return connect(p);
      arm(p, p.next_connect_ms - now);
      return;
    }
    const double now = now_ms();
    // (NaN, unscheduled, compares false: the frame waits.)
    while (!p.queue.empty() && p.queue.front().release_ms <= now && p.conn->writing_bytes < max_unwritten_bytes &&
           p.conn->sealing_jobs < max_sealing_jobs) {
      Outgoing o = std::move(p.queue.front());
      p.queue.pop_front();
      write(p.conn, std::move(o.frame), p.key, o.counted, o.sent_ns);
      if (!p.conn) return;  // the write failed and closed it
    }
    // Released frames held back by max_unwritten_bytes or max_sealing_jobs go on from the write
    // or the seal's callback.
    if (!p.queue.empty() && !std::isnan(p.queue.front().release_ms) && p.queue.front().release_ms > now)
      arm(p, p.queue.front().release_ms - now);
  }

  void arm(Peer& p, double delay_ms) {
    uv_timer_start(
        p.timer, [](uv_timer_t* t) { static_cast<Transport::Impl*>(t->loop->data)->pump(*static_cast<Peer*>(t->data)); },
        static_cast<uint64_t>(std::max(0.0, std::ceil(delay_ms))), 0);
  }

  void enqueue(const std::string& address, Lane lane, OutFrame frame, bool datagram, uint64_t sent_ns) {
    Peer& p = peer(address, lane);
    const size_t bytes = frame.bytes();
    p.queue.push_back({std::move(frame), unscheduled, bytes, sent_ns, datagram});
    // The emulator needs the peer's region, which the handshake tells; until then frames wait.
    if (!emulator.active() || p.conn) schedule(p);
    pump(p);
  }

  // Release times: unscheduled (waiting for the peer's region) and immediately (no emulation).
  static constexpr double unscheduled = std::numeric_limits<double>::quiet_NaN();
  static constexpr double immediately = -std::numeric_limits<double>::infinity();

  /// Gives every queued frame without one its release time (the emulator's, or now), in order.
  void schedule(Peer& p) {
    for (auto it = p.queue.begin(); it != p.queue.end();) {
      if (!std::isnan(it->release_ms)) {
        ++it;
        continue;
      }
      auto release = release_time(p, it->frame.bytes(), it->datagram);
      if (!release) {  // a datagram the emulated link lost
        give_back(p.key, it->counted);
        it = p.queue.erase(it);
        continue;
      }
      it->release_ms = it == p.queue.begin() ? *release : std::max(*release, std::prev(it)->release_ms);
      ++it;
    }
  }

  std::optional<double> release_time(Peer& p, size_t bytes, bool datagram) {
    const std::string& address = p.address;
    double release_at = immediately;
    if (emulator.active()) {
      std::uniform_real_distribution<double> unit(0.0, 1.0);
      const double jitter = unit(random) * 2.0 - 1.0;
      if (datagram) {
        const auto r = emulator.datagram_release_ms(address, p.region, bytes, now_ms(), jitter, unit(random));
        if (!r) {
          if (opt.metrics) opt.metrics->counter("tepdist_link_emulator_dropped_datagrams_total", {}, "membership datagrams lost by the link emulator").add();
          return std::nullopt;
        }
        release_at = *r;
      } else {
        release_at = emulator.stream_release_ms(address, p.region, bytes, now_ms(), jitter);
      }
    }
    // A datagram released earlier than frames queued before it would overtake them; on one TCP
    // connection it cannot, so schedule() gives it its turn (the model's "not held back" is an
    // upper bound).
    return release_at;
  }

  void drain_inbox() {
    std::vector<Pending> batch;
    bool stop_now;
    {
      std::lock_guard lock(mutex);
      batch.swap(inbox);
      stop_now = stopping;
    }
    if (stop_now) return shutdown();
    for (auto& pending : batch)
      if (pending.forget)
        forget_peer(pending.address);
      else
        enqueue(pending.address, pending.lane, std::move(pending.frame), pending.datagram, pending.sent_ns);
  }

  void shutdown() {
    for (Conn* c : std::vector<Conn*>(conns.begin(), conns.end())) fail(c, "node stopping", false);
    for (auto& [address, p] : peers) {
      drop_queue(*p);
      uv_close(reinterpret_cast<uv_handle_t*>(p->timer),
               [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
      p->timer = nullptr;
    }
    forget_resume();
    uv_close(reinterpret_cast<uv_handle_t*>(&listener), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&wake), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&resume), nullptr);
  }

  /// Frames released after this (messages outliving the transport) poke nothing.
  void forget_resume() {
    std::lock_guard lock(ledger->mutex);
    ledger->wake = nullptr;
  }
};

Transport::Transport(TransportOptions options, TransportEvents events)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(events))) {}

Transport::~Transport() { stop(); }

std::expected<std::string, std::string> Transport::start() {
  Impl& i = *impl_;
  TEPDIST_CHECK(!i.started);
  // libuv writes to sockets with write(2): a peer that closes while a frame is going out would
  // kill this whole process with SIGPIPE (exit 141, seen when a cluster's nodes stop together).
  // Ignored, the write fails with EPIPE and only that connection goes.
  std::signal(SIGPIPE, SIG_IGN);
  uv_loop_init(&i.loop);
  i.loop.data = &i;
  uv_async_init(&i.loop, &i.wake, [](uv_async_t* h) { static_cast<Impl*>(h->loop->data)->drain_inbox(); });
  uv_async_init(&i.loop, &i.resume, [](uv_async_t* h) { static_cast<Impl*>(h->loop->data)->resume_readers(); });
  i.ledger->lanes[static_cast<size_t>(Lane::bulk)].budget = i.opt.receive_total_bytes;
  i.ledger->lanes[static_cast<size_t>(Lane::membership)].budget = membership_receive_total_bytes;
  {
    std::lock_guard lock(i.ledger->mutex);
    i.ledger->wake = &i.resume;
  }
  uv_tcp_init(&i.loop, &i.listener);
  i.listener.data = &i;
  auto fail_start = [&](const std::string& why) -> std::expected<std::string, std::string> {
    i.forget_resume();
    uv_close(reinterpret_cast<uv_handle_t*>(&i.listener), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&i.wake), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&i.resume), nullptr);
    uv_run(&i.loop, UV_RUN_DEFAULT);
    uv_loop_close(&i.loop);
    i.stopped = true;
    return std::unexpected(why);
  };
  const std::string wanted = i.opt.listen_host + ":" + std::to_string(i.opt.listen_port);
  auto addr = resolve(wanted, true);
  if (!addr) return fail_start("--listen " + wanted + ": " + addr.error());
  if (int rc = uv_tcp_bind(&i.listener, reinterpret_cast<const sockaddr*>(&*addr), 0); rc != 0)
    return fail_start("cannot bind " + wanted + ": " + uv_strerror(rc));
  if (int rc = uv_listen(reinterpret_cast<uv_stream_t*>(&i.listener), 128,
                         [](uv_stream_t* s, int status) {
                           if (status == 0) static_cast<Impl*>(s->data)->accept();
                         });
      rc != 0)
    return fail_start("cannot listen on " + wanted + ": " + uv_strerror(rc));
  sockaddr_storage bound{};
  int len = sizeof bound;
  uv_tcp_getsockname(&i.listener, reinterpret_cast<sockaddr*>(&bound), &len);
  const int port = ntohs(bound.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                                                    : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  const std::string host = i.opt.listen_host == "localhost" ? "127.0.0.1" : i.opt.listen_host;
  const std::string address = host + ":" + std::to_string(port);
  i.opt.identity.listen_address = address;
  if (i.opt.identity.node_id.empty()) i.opt.identity.node_id = address;  // the default id: host:port
  uv_update_time(&i.loop);
  i.unix_offset_ms = unix_ms_now() - static_cast<double>(uv_now(&i.loop));
  i.epoch_unix_ms = i.opt.epoch_unix_ms;
  i.started = true;
  i.thread = std::thread([&i] {
    base::name_this_thread("uv-loop");
    uv_run(&i.loop, UV_RUN_DEFAULT);
  });
  return address;
}

bool Transport::send(const std::string& address, const Message& message, std::chrono::milliseconds wait) {
  Impl& i = *impl_;
  OutFrame frame = encode(message);
  const size_t bytes = frame.bytes();
  const Lane lane = lane_of(message.body);
  {
    std::unique_lock lock(i.mutex);
    if (i.stopping || !i.started) return false;
    auto& queued = i.queued_bytes[lane_key(address, lane)];  // (a reference into the map stays valid)
    const auto room = [&] { return i.stopping || queued == 0 || queued + bytes <= i.opt.send_queue_bytes; };
    if (!room() && (wait.count() <= 0 || !i.drained.wait_for(lock, wait, room))) return false;
    if (i.stopping) return false;
    queued += bytes;
    if (i.opt.metrics && lane == Lane::bulk)
      i.opt.metrics->gauge("tepdist_transport_send_queue_bytes", {{"peer", address}}, "bytes waiting to be written").set(static_cast<double>(queued));
    i.inbox.push_back({address, lane, std::move(frame), is_datagram(message.body), uv_hrtime()});
    // Under the lock: once stop() has set stopping, no sender can touch the async handle, which the
    // loop closes on its way out.
    uv_async_send(&i.wake);
  }
  return true;
}

bool Transport::stopping() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->stopping || !impl_->started;
}

void Transport::forget(const std::string& address) {
  Impl& i = *impl_;
  std::lock_guard lock(i.mutex);
  if (i.stopping || !i.started) return;
  i.inbox.push_back({address, Lane::bulk, OutFrame(), false, 0, true});
  uv_async_send(&i.wake);
}

void Transport::stop() {
  Impl& i = *impl_;
  if (!i.started || i.stopped) return;
  {
    std::lock_guard lock(i.mutex);
    i.stopping = true;
    uv_async_send(&i.wake);
  }
  i.thread.join();
  uv_loop_close(&i.loop);
  i.stopped = true;
}

void Transport::set_epoch_unix_ms(uint64_t epoch) { impl_->epoch_unix_ms = epoch; }

bool Transport::drain(std::chrono::milliseconds limit) {
  Impl& i = *impl_;
  std::unique_lock lock(i.mutex);
  return i.drained.wait_for(lock, limit, [&] {
    return std::all_of(i.queued_bytes.begin(), i.queued_bytes.end(), [](const auto& kv) { return kv.second == 0; });
  });
}

}  // namespace tepdist::gossip

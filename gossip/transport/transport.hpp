#pragma once
// The transport: one libuv loop on its own thread moving authenticated frames between nodes.
//
// Threads and queues. Every libuv handle lives on the loop thread. Other threads (actors) call
// send(), which encodes the message on the caller's thread, takes the inbox lock, appends, and
// wakes the loop with uv_async_send; the loop drains the inbox whole. Received frames are decoded
// on the loop thread and handed to TransportEvents::on_message, which must only forward them (the
// node's callback does caf::anon_send). No other state is shared between threads, except the
// per-peer queued-byte counts that send() reads under the same lock to apply back-pressure, and
// large frames handed to libuv's thread pool to be sealed (each touched by one thread at a time).
//
// Connections. One TCP connection per peer pair is reused: outbound connections are made on the
// first send to an address; inbound ones are registered under the initiator's listen address from
// its Hello, so replies ride the same connection. Every connection starts with the handshake
// (gossip/transport/handshake.hpp) and nothing else is read until it succeeds. TCP_NODELAY is set.
// A failed connection is retried with capped exponential back-off while frames wait for it.
// Frames are a 4-byte length plus a Cap'n Proto message; after the handshake each also carries
// a tag under the connection's keys and a counter assigned as it is written (AES-GCM, encrypted,
// by default; gossip/transport/frame_seal.hpp). A frame whose length, tag or content is hostile
// closes that connection, with a log line naming the peer and the reason, and nothing else.
//
// Link emulation. With a network model, each frame is held until the link emulator releases it
// (bandwidth, latency, jitter, partitions), then written; frames to one peer stay in order.

#include <chrono>
#include <cstdint>
#include <expected>
#include <functional>
#include <memory>
#include <string>

#include "gossip/metrics/registry.hpp"
#include "gossip/transport/handshake.hpp"
#include "gossip/transport/link_emulator.hpp"
#include "gossip/wire/codec.hpp"

namespace tepdist::gossip {

struct TransportOptions {
  Identity identity;               ///< cluster id, node id (empty: the bound host:port), region, secret;
                                   ///< listen_address is filled in by start()
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;        ///< 0: any free port; start() returns the one bound
  WireLimits limits;
  size_t send_queue_bytes = 64u << 20;  ///< per peer: send() refuses beyond this (back-pressure)
  /// Receive back-pressure (bulk lane; membership has fixed budgets of its own): a connection whose
  /// received frames still alive anywhere in the node (messages not yet handled, tensors still
  /// viewed) exceed receive_queue_bytes is not read from until they are released; nor is one over
  /// an even share of receive_total_bytes while the node's total is over it. Frames being read are
  /// admitted within receive_total_bytes too.
  size_t receive_queue_bytes = 128u << 20;
  size_t receive_total_bytes = 1024u << 20;
  /// A frame of which no byte comes for this long, while this node reads, closes its connection
  /// (it holds a share of receive_total_bytes).
  uint64_t frame_stall_timeout_ms = 30000;
  uint64_t reconnect_initial_ms = 50;
  uint64_t reconnect_max_ms = 2000;
  uint64_t handshake_timeout_ms = 5000;
  NetworkModel network;            ///< empty: no emulation
  uint64_t epoch_unix_ms = 0;      ///< the cluster epoch partitions count from
  uint64_t seed = 0;               ///< jitter and loss draws
  /// Where to record per-peer traffic (labels: peer = host:port): tepdist_transport_received_frames_total,
  /// _received_bytes_total, _sent_frames_total, _sent_bytes_total, _send_queue_bytes (gauge),
  /// _send_latency_seconds (histogram: send() to write completed, emulated delay included), and
  /// tepdist_transport_connections_refused_total, _receive_paused_total,
  /// tepdist_link_emulator_dropped_datagrams_total. Null: not recorded. Must outlive the transport.
  MetricsRegistry* metrics = nullptr;
};

/// Called on the loop thread. Keep them short: forward, do not work.
struct TransportEvents {
  /// A frame from the peer with this id, on the connection registered under this address (its
  /// listen address: where replies go).
  std::function<void(const std::string& peer_id, const std::string& address, Message message)> on_message{};
  std::function<void(const std::string& peer_id, const std::string& address)> on_peer_up{};
  std::function<void(const std::string& peer, const std::string& reason)> on_peer_down{};
  /// A connection refused in its handshake (wrong secret, other cluster, replay, garbage).
  std::function<void(const std::string& peer, const std::string& reason)> on_refused{};
};

class Transport {
 public:
  Transport(TransportOptions options, TransportEvents events);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  /// Binds, starts the loop thread and returns the bound "host:port", or why it could not.
  std::expected<std::string, std::string> start();
  /// Queues message for the node listening at address. Thread-safe. When that peer's lane already
  /// has send_queue_bytes waiting, waits up to `wait` for room (no wait by default), then returns
  /// false, sending nothing: the caller backs off.
  bool send(const std::string& address, const Message& message,
            std::chrono::milliseconds wait = std::chrono::milliseconds(0));
  /// Whether stop() has begun (or start() has not succeeded): send() refuses everything then.
  bool stopping() const;
  /// Drops every frame still waiting for the node at address (both lanes), giving its queue's room
  /// back, and stops dialling it until something new is sent there: membership has declared it
  /// dead or gone, and what it was sent will never be read. Thread-safe; in order with send().
  void forget(const std::string& address);
  /// Closes every connection and joins the loop thread. Idempotent; the destructor calls it.
  void stop();
  /// Waits until every frame queued so far has been written (or dropped with its connection), at
  /// most `limit`; returns whether the queues emptied. A graceful leave uses it before stop().
  bool drain(std::chrono::milliseconds limit);
  /// Adopts the cluster epoch learned on joining (partitions are scheduled from it). Thread-safe.
  void set_epoch_unix_ms(uint64_t epoch);


 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tepdist::gossip

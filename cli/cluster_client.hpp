#pragma once
// A short-lived, authenticated client of a running cluster, for the commands that ask members
// something (`tepdist status`, `tepdist leave`). It is not a member: members answer its empty state
// sync with their view without taking it for one.

#include <chrono>
#include <condition_variable>
#include <deque>
#include <expected>
#include <mutex>
#include <optional>
#include <string>

#include "elastic/config.hpp"
#include "gossip/transport/transport.hpp"

namespace tepdist::cli {

class ClusterClient {
 public:
  /// `name` goes into the client's id ("status-<pid>"). Call start() before anything else.
  ClusterClient(const elastic::JobConfig& config, const std::string& secret, const std::string& name);
  /// Binds the client's transport; the error says why not.
  std::expected<void, std::string> start();

  /// Asks `peer` for its view (the status document's source); the error names the peer and why.
  std::expected<gossip::StateSync, std::string> ask_view(const std::string& peer, std::chrono::milliseconds limit);
  void send(const std::string& address, gossip::Body body);
  /// The next message received that is not a state sync (one arriving after `limit`: none), or the
  /// refusal of a connection, as an error.
  std::expected<std::optional<gossip::Message>, std::string> next(std::chrono::milliseconds limit);

 private:
  std::string cluster_id_, id_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::optional<gossip::StateSync> view_;
  std::deque<gossip::Message> inbox_;
  std::optional<std::string> refused_, lost_;
  gossip::TransportOptions options_;
  gossip::Transport transport_;
};

}  // namespace tepdist::cli

#pragma once
// The link emulator: the real-run half of the network simulator. A sans-IO queue model of the
// links from this node to its peers, driven by the transport with the loop's clock and tested with
// a fake one. Each link serialises frames at its bandwidth (so a big tensor delays what follows
// it), then adds its one-way latency and a jitter draw; frames on one stream are never reordered.
// During a scheduled partition between two regions, stream frames wait for it to heal (streams are
// delayed, not lost); membership datagrams are lost with the link's loss probability, and lost
// outright while partitioned.
//
// Times are milliseconds since the cluster epoch (the start time set by the first node or the
// launcher, learned by every node when it joins), so every node sees a partition at the same time.

#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tepdist::gossip {

/// One region pair's link, the same in both directions.
struct LinkProfile {
  double latency_ms = 0.0;      ///< one-way
  double jitter_ms = 0.0;       ///< the delay varies by up to +-jitter_ms
  double bandwidth_mbit = 0.0;  ///< Mbit/s; 0 means unlimited
  double loss = 0.0;            ///< probability a datagram is lost; streams are never lost
  friend bool operator==(const LinkProfile&, const LinkProfile&) = default;
};

struct Partition {
  double at_s = 0.0;        ///< since the cluster epoch
  double duration_s = 0.0;
  std::string a, b;         ///< the two regions cut apart (a == b cuts a region from itself)
  friend bool operator==(const Partition&, const Partition&) = default;
};

/// The whole emulated network: links per unordered region pair and scheduled partitions. Pairs
/// not listed are not emulated (no delay, no limit).
struct NetworkModel {
  std::map<std::pair<std::string, std::string>, LinkProfile> links;  ///< key: (min, max) of the pair
  std::vector<Partition> partitions;

  void set_link(const std::string& a, const std::string& b, const LinkProfile& p);
  const LinkProfile* link(const std::string& a, const std::string& b) const;
  /// When the partition between a and b that covers time t (ms) ends, if one does.
  std::optional<double> partitioned_until_ms(const std::string& a, const std::string& b, double t_ms) const;
  bool empty() const { return links.empty() && partitions.empty(); }
  friend bool operator==(const NetworkModel&, const NetworkModel&) = default;
};

class LinkEmulator {
 public:
  LinkEmulator(NetworkModel model, std::string self_region);

  /// When a stream frame of `bytes` handed over at now_ms may be delivered to `peer` (in
  /// peer_region): the transport writes it then. jitter_draw is uniform in [-1, 1].
  double stream_release_ms(const std::string& peer, const std::string& peer_region, size_t bytes, double now_ms,
                           double jitter_draw);

  /// The same for a membership datagram, or nothing if it is lost (loss_draw uniform in [0, 1)).
  /// Datagrams share the link's bandwidth with streams but are not held back to keep order.
  std::optional<double> datagram_release_ms(const std::string& peer, const std::string& peer_region, size_t bytes,
                                            double now_ms, double jitter_draw, double loss_draw);

  /// Forgets a peer's queue (after it disconnects).
  void forget(const std::string& peer) { links_.erase(peer); }
  bool active() const { return !model_.empty(); }
  const std::string& region() const { return self_region_; }

 private:
  struct LinkState {
    double free_at_ms = 0.0;       // when the link finishes serialising what it already holds
    double last_release_ms = 0.0;  // the latest stream release, to keep the stream in order
  };
  /// Serialises a frame; returns when its last bit leaves (before latency).
  double transmit(LinkState& s, const LinkProfile& p, size_t bytes, double start_ms);

  NetworkModel model_;
  std::string self_region_;
  std::unordered_map<std::string, LinkState> links_;
};

}  // namespace tepdist::gossip

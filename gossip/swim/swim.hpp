#pragma once
// SWIM membership with Lifeguard, sans-IO: no sockets, threads or clocks inside. The driver (an
// actor over the real transport, or the simulator) hands it the time and every message, calls
// tick() when next_deadline_ms() comes, and carries out what it returns: messages to send, by
// address, and events to report.
//
// Protocol (Das et al., SWIM, 2002; Dadgar et al., Lifeguard, 2017; as in hashicorp/memberlist):
//   - each probe interval, ping the next member of a randomly reshuffled round-robin order;
//   - no ack within probe_timeout: ask k other members to ping it (ping-req) and relay their ack;
//   - no ack by the end of the interval: the member is suspect, and the suspicion is gossiped;
//   - a suspect is declared dead when its suspicion times out (sooner when others confirm it);
//   - a member told it is suspect or dead refutes it with a higher incarnation;
//   - updates ride piggybacked on pings and acks; push-pull state syncs repair what gossip missed;
//   - dead and left members are remembered for dead_retention_ms so stale gossip cannot revive
//     them, while a restarted node, joining with a higher incarnation, is accepted at once.

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gossip/swim/awareness.hpp"
#include "gossip/swim/config.hpp"
#include "gossip/swim/dissemination.hpp"
#include "gossip/swim/suspicion.hpp"
#include "gossip/wire/messages.hpp"

namespace tepdist::gossip::swim {

struct Event {
  enum class Kind { joined, suspected, alive_again, dead, left, updated };
  Kind kind;
  Member member;
};

const char* event_name(Event::Kind k);

/// What one input asks the driver to do.
struct Output {
  struct Send {
    std::string address;
    Body body;
  };
  std::vector<Send> sends;
  std::vector<Event> events;
};

class Swim {
 public:
  /// below(n): a uniform draw in [0, n), from the driver's seeded source.
  Swim(Member self, Config config, std::function<uint64_t(uint64_t)> below);

  /// Starts membership through seeds (their addresses): a state sync with each.
  void join(double now_ms, const std::vector<std::string>& seeds, Output& out);
  /// Takes `view` as already known, without gossiping it or reporting events: a cluster formed
  /// before this node's history starts (the simulator begins from steady state this way).
  void adopt(double now_ms, const std::vector<Member>& view);
  /// Announces a graceful leave: members mark this node left, not dead.
  void leave(double now_ms, Output& out);
  /// Advances timers: probes, indirect probes, suspicion timeouts, push-pull, forgetting the dead.
  void tick(double now_ms, Output& out);
  /// Handles one message from `from` (the envelope's sender id) at `from_address` (where its
  /// transport accepts connections): replies go there even before the sender is a known member,
  /// so a joiner's probes are answered from its first ping.
  void on_message(double now_ms, const std::string& from, const std::string& from_address, const Body& body,
                  Output& out);

  /// When tick() next has something to do.
  double next_deadline_ms() const;

  const Member& self() const { return self_; }
  /// Every member this node knows, itself included, dead and left ones while remembered.
  std::vector<Member> members() const;
  /// Alive and suspect members, itself included.
  size_t live_count() const;
  int awareness() const { return awareness_.score(); }

 private:
  struct Known {
    Member member;
    double changed_ms = 0;
  };
  struct Probe {
    uint64_t seq;
    std::string target;
    double timeout_ms, interval_end_ms;
    bool indirect_sent = false;
  };
  struct Relay {
    std::string requester_address;
    uint64_t requester_seq;
    double expires_ms;
  };

  void merge(double now_ms, const Member& update, const std::string& from, Output& out);
  void refute(const Member& claim, Output& out);
  void suspect(double now_ms, Known& k, const std::string& accuser, Output& out);
  void declare(double now_ms, Known& k, Member::State state, Output& out);
  void send(Output& out, const std::string& address, Body body);
  std::vector<Member> piggyback();
  std::vector<Member> full_state() const;
  std::optional<std::string> next_probe_target();
  std::vector<const Known*> random_live(size_t count, const std::string& except);
  double suspicion_min_ms() const;
  int retransmit_limit() const;

  Member self_;
  Config config_;
  std::function<uint64_t(uint64_t)> below_;
  Awareness awareness_;
  Dissemination broadcasts_;
  std::map<std::string, Known> members_;  // by id, this node excluded
  size_t live_members_ = 0;               // alive or suspect among members_
  std::map<std::string, Suspicion> suspicions_;
  std::vector<std::string> probe_order_;
  size_t probe_index_ = 0;
  std::optional<Probe> probe_;
  std::map<uint64_t, Relay> relays_;
  std::map<std::string, std::pair<std::string, double>> unreachable_;  // dead: id -> (address, try until)
  std::multimap<double, std::string> forget_at_;  // when to forget a dead or departed member
  uint64_t seq_ = 0;
  double next_probe_ms_ = 0, next_push_pull_ms_ = 0, next_reminder_ms_ = 0, next_reconnect_ms_ = 0;
  std::vector<std::string> seeds_;  // retried until a state sync answers (a lost join)
  double next_join_ms_ = std::numeric_limits<double>::infinity();
  bool left_ = false;
};

}  // namespace tepdist::gossip::swim

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
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gossip/swim/awareness.hpp"
#include "gossip/swim/config.hpp"
#include "gossip/swim/directory.hpp"
#include "gossip/swim/dissemination.hpp"
#include "gossip/swim/suspicion.hpp"
#include "gossip/wire/messages.hpp"

namespace tepdist::gossip::swim {

struct Event {
  /// restarted: a live member came back with another boot id (a new process: its state is gone);
  /// refuted: this node outbid a suspicion, death or leave said of it (member: its new record).
  enum class Kind { joined, suspected, alive_again, dead, left, updated, restarted, refuted };
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
  /// below(n): a uniform draw in [0, n), from the driver's seeded source. directory: where member
  /// records are interned, shared by cores driven by one thread (none: this core's own).
  Swim(Member self, Config config, std::function<uint64_t(uint64_t)> below,
       std::shared_ptr<Directory> directory = nullptr);

  /// A live member of a view, interned: adopt() by many cores sharing one directory then costs no
  /// string work per core.
  struct Interned {
    uint32_t id, details;
    uint64_t incarnation;
  };
  static std::vector<Interned> intern(Directory& directory, const std::vector<Member>& view);

  /// Starts membership through seeds (their addresses): a state sync with each.
  void join(double now_ms, const std::vector<std::string>& seeds, Output& out);
  /// Takes `view` (interned in this core's directory) as already known, without gossiping it or
  /// reporting events: a cluster formed before this node's history starts (the simulator begins
  /// from steady state this way).
  void adopt(double now_ms, std::span<const Interned> view);
  /// Announces a graceful leave: members mark this node left, not dead.
  void leave(double now_ms, Output& out);
  /// What this node held for others is gone though its process lives on (a role restarted by its
  /// supervisor): it takes `boot_id` (not 0, not its current one) with a higher incarnation and
  /// spreads it, so members see the restart they would see after a process restart.
  void new_boot(double now_ms, uint64_t boot_id, Output& out);
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
  /// Every member this node knows, itself included (first), dead and left ones while remembered;
  /// the others in id order.
  std::vector<Member> members() const;
  /// The same without building records: each member's id and state, in no set order.
  void for_each_member(const std::function<void(const std::string& id, Member::State state)>& f) const;
  /// What this node holds about one member (itself included), if it knows it.
  std::optional<Member::State> state_of(const std::string& id) const;
  /// Alive and suspect members, itself included.
  size_t live_count() const;
  int awareness() const { return awareness_.score(); }

 private:
  /// What this node holds about one member, by the member's id number in the directory.
  struct Known {
    uint64_t incarnation = 0;
    uint32_t details = Directory::none;
    uint32_t accuser = Directory::none;  // a suspect's: the member whose probe failed
    Member::State state = Member::State::alive;
    bool present = false;  // known to this node
  };
  // Every node holds one per member: a simulated cluster of N holds N^2 of them.
  static_assert(sizeof(Known) <= 24);
  struct Probe {
    uint64_t seq;
    uint32_t target;
    double timeout_ms, interval_end_ms;
    bool indirect_sent = false;
    double defer_limit_ms = 0;  // past this, this node's lateness no longer pushes the verdict back
    uint64_t incarnation = 0;   // the target's when the probe went out
  };
  struct Relay {
    std::string requester_address;
    uint64_t requester_seq;
    double expires_ms;
  };

  Known* find(uint32_t id);
  const Known* find(uint32_t id) const;
  Known* find(const std::string& id);
  const Known* find(const std::string& id) const;
  Known& add(uint32_t id);
  Member record(uint32_t id) const;
  uint32_t number_of(const Known& k) const { return static_cast<uint32_t>(&k - table_.data()); }
  void merge(double now_ms, const Member& update, const std::string& from, Output& out);
  /// Queues news about another member for gossip, unless merging a state sync (quiet_).
  void spread(const Member& news);
  void refute(const Member& claim, Output& out);
  /// This node was not running (a late tick: stopped, starved of CPU), or trouble began somewhere
  /// (the first suspicion heard after a quiet spell): verdicts due now wait a probe timeout, as
  /// inputs that came meanwhile may wait unread, and awareness rises a step.
  void defer_verdicts(double now_ms);
  /// Gossips this node's newer record of k to correct a stale rumour about it.
  void correct(const Known& k);
  void suspect(double now_ms, Known& k, const std::string& accuser, Output& out);
  /// Lifeguard's buddy system: pings suspect n with its suspicion record first (reminder: the
  /// interval's reminder or the last call; else prompted by a message from it, at most once per
  /// probe interval).
  void tell_suspect(double now_ms, uint32_t n, Output& out, bool reminder);
  void declare(double now_ms, Known& k, Member::State state, Output& out);
  /// Pushes news marked urgent_ to urgent_fanout random live members (except `except`), once per
  /// input however many items it brought.
  void rush(Output& out, const std::string& except);
  void send(Output& out, const std::string& address, Body body);
  std::vector<Member> piggyback();
  std::vector<Member> full_state() const;
  std::optional<uint32_t> next_probe_target();
  std::vector<uint32_t> random_live(size_t count, uint32_t except);
  double suspicion_min_ms() const;
  double push_pull_delay_ms();
  int retransmit_limit() const;

  Member self_;
  Config config_;
  std::function<uint64_t(uint64_t)> below_;
  std::shared_ptr<Directory> directory_;
  Awareness awareness_;
  Dissemination broadcasts_;
  std::vector<Known> table_;  // by id number; this node's own entry never present
  size_t live_members_ = 0;   // alive or suspect in table_
  std::map<uint32_t, Suspicion> suspicions_;
  std::vector<uint32_t> probe_order_;
  size_t probe_index_ = 0;
  std::optional<Probe> probe_;
  std::map<uint64_t, Relay> relays_;
  std::map<uint32_t, std::pair<std::string, double>> unreachable_;  // dead: id -> (address, try until)
  std::multimap<double, std::pair<uint32_t, uint64_t>> forget_at_;  // when to forget (id, incarnation) dead or gone
  uint64_t seq_ = 0;
  double next_probe_ms_ = 0, next_push_pull_ms_ = 0, next_reminder_ms_ = 0, next_reconnect_ms_ = 0;
  std::vector<std::string> seeds_;  // retried until a state sync answers (a lost join)
  double next_join_ms_ = std::numeric_limits<double>::infinity();
  bool left_ = false;
  double due_ms_ = 0;  // the deadline last given to the driver (lateness is measured against it)
  bool quiet_ = false;  // merging a state sync: news about others is not spread again
  bool urgent_ = false; // this input brought a suspicion, death, leave or refutation: rush() it
};

}  // namespace tepdist::gossip::swim

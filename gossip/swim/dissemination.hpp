#pragma once
// Piggybacked dissemination: the latest news about each member waits here and rides on pings,
// acks and ping-reqs, within a byte budget: the sender's own record first, then deaths and leaves
// not yet sent `limit` times, then least-transmitted first and newest first among equals; until
// it has been sent about retransmit_mult * log10(N + 1) times (deaths and leaves three times that).

#include <cstdint>
#include <string>
#include <vector>

#include "gossip/wire/messages.hpp"

namespace tepdist::gossip::swim {

class Dissemination {
 public:
  /// Queues news about a member, replacing older news about the same member. own: news of the
  /// sending node itself (its refutation), which rides before everything else.
  void enqueue(const Member& m, bool own = false);
  /// Updates to piggyback on one message; each counts as transmitted once more, and is dropped
  /// once sent `limit` times (a death or leave: 3 x limit). The node's own news rides first.
  std::vector<Member> pick(size_t budget_bytes, int limit);
  size_t size() const { return items_.size(); }
  /// Whether news about this member is still waiting to be sent.
  bool contains(const std::string& id) const;
  /// The wire size a member record is reckoned at, for the budget.
  static size_t estimate_bytes(const Member& m);

 private:
  struct Item {
    Member member;
    int transmits = 0;
    uint64_t order = 0;  // higher is newer
    bool own = false;    // about the sending node itself
  };
  std::vector<Item> items_;
  uint64_t next_order_ = 0;
};

}  // namespace tepdist::gossip::swim

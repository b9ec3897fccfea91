#pragma once
// Piggybacked dissemination: the latest news about each member waits here and rides on pings,
// acks and ping-reqs, least-transmitted first and newest first among equals, within a byte budget,
// until it has been sent about retransmit_mult * log10(N + 1) times.

#include <cstdint>
#include <string>
#include <vector>

#include "gossip/wire/messages.hpp"

namespace tepdist::gossip::swim {

class Dissemination {
 public:
  /// Queues news about a member, replacing older news about the same member.
  void enqueue(const Member& m);
  /// Updates to piggyback on one message; each counts as transmitted once more, and is dropped
  /// once sent `limit` times.
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
  };
  std::vector<Item> items_;
  uint64_t next_order_ = 0;
};

}  // namespace tepdist::gossip::swim

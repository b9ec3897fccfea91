#pragma once
// Interned member records: the ids and details (address, region, roles, boot id) that SWIM cores refer to
// by number. A core's member table is then a flat array of small records indexed by id number
// rather than a map of strings, and cores that share a directory (the simulator's thousands, in
// one process) hold each distinct string once between them, not once each: that is what lets
// 10,000 simulated nodes, each knowing the other 9,999, fit in a few GB.
//
// Not thread-safe: share a directory only among cores driven by one thread. It only grows: an id
// or a set of details, once seen, keeps its number, so its size is what the cluster has ever had.

#include <cstdint>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "gossip/wire/messages.hpp"

namespace tepdist::gossip::swim {

class Directory {
 public:
  static constexpr uint32_t none = std::numeric_limits<uint32_t>::max();

  /// The number of an id, given one if it has none yet.
  uint32_t intern_id(const std::string& id);
  /// The number of an id, or none if it was never interned.
  uint32_t find_id(const std::string& id) const;
  const std::string& id(uint32_t number) const { return ids_[number]; }
  size_t ids() const { return ids_.size(); }

  /// The number of a member's address, region, roles and boot id, given one if new.
  uint32_t intern_details(const Member& m);

  /// A member record rebuilt from numbers; accuser: an id number, or none.
  Member member(uint32_t id, uint32_t details, uint64_t incarnation, Member::State state, uint32_t accuser) const;
  const std::string& address(uint32_t details) const { return details_[details].address; }
  uint64_t boot_id(uint32_t details) const { return details_[details].boot_id; }

 private:
  struct Details {
    std::string address, region;
    std::vector<std::string> roles;
    uint64_t boot_id = 0;
  };
  std::vector<std::string> ids_;
  std::unordered_map<std::string, uint32_t> id_numbers_;
  std::vector<Details> details_;
  std::unordered_map<std::string, uint32_t> details_numbers_;  // key: each field's length and bytes
};

}  // namespace tepdist::gossip::swim

#include "gossip/swim/directory.hpp"

namespace tepdist::gossip::swim {

uint32_t Directory::intern_id(const std::string& id) {
  const auto [it, added] = id_numbers_.try_emplace(id, static_cast<uint32_t>(ids_.size()));
  if (added) ids_.push_back(id);
  return it->second;
}

uint32_t Directory::find_id(const std::string& id) const {
  const auto it = id_numbers_.find(id);
  return it == id_numbers_.end() ? none : it->second;
}

uint32_t Directory::intern_details(const Member& m) {
  // Each field as its length and its bytes: no two different records share a key.
  std::string key;
  const auto add = [&](const std::string& field) {
    key += std::to_string(field.size());
    key += ':';
    key += field;
  };
  add(m.address);
  add(m.region);
  add(std::to_string(m.roles.size()));
  for (const auto& r : m.roles) add(r);
  add(std::to_string(m.boot_id));
  const auto [it, added] = details_numbers_.try_emplace(std::move(key), static_cast<uint32_t>(details_.size()));
  if (added) details_.push_back({m.address, m.region, m.roles, m.boot_id});
  return it->second;
}

Member Directory::member(uint32_t id, uint32_t details, uint64_t incarnation, Member::State state,
                         uint32_t accuser) const {
  const Details& d = details_[details];
  return Member{ids_[id], d.address, incarnation, state, d.region, d.roles,
                accuser == none ? std::string() : ids_[accuser], d.boot_id};
}

}  // namespace tepdist::gossip::swim

#include "gossip/swim/dissemination.hpp"

#include <algorithm>

namespace tepdist::gossip::swim {

size_t Dissemination::estimate_bytes(const Member& m) {
  size_t roles = 0;
  for (const auto& r : m.roles) roles += r.size() + 8;
  return 48 + m.id.size() + m.address.size() + m.region.size() + roles;  // pointers, lengths, padding
}

bool Dissemination::contains(const std::string& id) const {
  return std::any_of(items_.begin(), items_.end(), [&](const Item& i) { return i.member.id == id; });
}

void Dissemination::enqueue(const Member& m) {
  auto it = std::find_if(items_.begin(), items_.end(), [&](const Item& i) { return i.member.id == m.id; });
  if (it == items_.end()) {
    items_.push_back({m, 0, next_order_++});
  } else {
    *it = {m, 0, next_order_++};
  }
}

std::vector<Member> Dissemination::pick(size_t budget_bytes, int limit) {
  std::sort(items_.begin(), items_.end(), [](const Item& a, const Item& b) {
    return a.transmits != b.transmits ? a.transmits < b.transmits : a.order > b.order;
  });
  std::vector<Member> out;
  size_t used = 0;
  for (auto& item : items_) {
    const size_t bytes = estimate_bytes(item.member);
    if (used + bytes > budget_bytes) continue;
    used += bytes;
    out.push_back(item.member);
    ++item.transmits;
  }
  std::erase_if(items_, [limit](const Item& i) { return i.transmits >= limit; });
  return out;
}

}  // namespace tepdist::gossip::swim

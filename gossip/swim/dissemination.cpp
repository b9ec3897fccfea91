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
  // Least transmitted first, newest first among equals. Only the front of that order can fit the
  // budget, so only the front is sorted, and indices move rather than member records.
  std::vector<uint32_t> order(items_.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto before = [&](uint32_t a, uint32_t b) {
    const Item &x = items_[a], &y = items_[b];
    return x.transmits != y.transmits ? x.transmits < y.transmits : x.order > y.order;
  };
  const size_t front = std::min<size_t>(order.size(), budget_bytes / 48 + 1);  // 48: the smallest record
  std::partial_sort(order.begin(), order.begin() + static_cast<ptrdiff_t>(front), order.end(), before);
  std::vector<Member> out;
  size_t used = 0;
  for (size_t k = 0; k < front; ++k) {
    Item& item = items_[order[k]];
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

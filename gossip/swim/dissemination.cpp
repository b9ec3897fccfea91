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

void Dissemination::enqueue(const Member& m, bool own) {
  auto it = std::find_if(items_.begin(), items_.end(), [&](const Item& i) { return i.member.id == m.id; });
  if (it == items_.end()) {
    items_.push_back({m, 0, next_order_++, own});
  } else {
    *it = {m, 0, next_order_++, own};
  }
}

std::vector<Member> Dissemination::pick(size_t budget_bytes, int limit) {
  // Least transmitted first, newest first among equals (after the ranks below). Only the front of
  // that order can fit the budget, so only the front is sorted, and indices move rather than
  // member records.
  // Deaths and leaves ride ahead of all other news, however often that news was sent: each is
  // news every member must hear, and it is rare, while a cluster of busy nodes refuting
  // suspicions makes a steady stream of new incarnations that would otherwise crowd a death out
  // of a slow member's few messages until its gossip ran out (seen in the loaded-nodes scenario:
  // one member never heard of a kill). That priority lasts for a death's first `limit` sends; its
  // further sends compete as usual. The sender's own record (a refutation) goes before all.
  const auto terminal = [](const Item& i) {
    return i.member.state == Member::State::dead || i.member.state == Member::State::left;
  };
  // Each item's rank, computed once: 0 the sender's own, 1 an urgent death, 2 the rest.
  std::vector<uint32_t> order(items_.size());
  std::vector<uint8_t> rank(items_.size());
  for (uint32_t i = 0; i < order.size(); ++i) {
    const Item& item = items_[i];
    order[i] = i;
    rank[i] = item.own ? 0 : terminal(item) && item.transmits < limit ? 1 : 2;
  }
  const auto before = [&](uint32_t a, uint32_t b) {
    const Item &x = items_[a], &y = items_[b];
    if (rank[a] != rank[b]) return rank[a] < rank[b];
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
  // A death or leave is also sent three times as often: a member that hears from few others
  // (a slow one, or one the probes happen to miss) must still hear it before its gossip dies out.
  std::erase_if(items_, [&](const Item& i) { return i.transmits >= (terminal(i) ? 3 * limit : limit); });
  return out;
}

}  // namespace tepdist::gossip::swim

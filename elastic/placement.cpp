#include "elastic/placement.hpp"

#include <algorithm>
#include <map>
#include <fmt/format.h>
#include "base/check.hpp"

namespace tepdist::elastic {
namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

uint64_t mix(uint64_t z) {  // splitmix64's finaliser: every input bit reaches every output bit
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t rendezvous_weight(uint32_t shard, const std::string& member) {
  return mix(fnv1a(member) ^ mix(static_cast<uint64_t>(shard) + 0x9e3779b97f4a7c15ull));
}

Placement place_shards(uint32_t shards, std::span<const std::string> members_in, int replicas) {
  std::vector<std::string> members(members_in.begin(), members_in.end());
  std::sort(members.begin(), members.end());
  members.erase(std::unique(members.begin(), members.end()), members.end());
  Placement p(shards);
  if (members.empty()) return p;
  const size_t r = std::min(members.size(), static_cast<size_t>(std::max(1, replicas)));
  std::vector<std::pair<uint64_t, const std::string*>> ranked(members.size());
  for (uint32_t s = 0; s < shards; ++s) {
    for (size_t i = 0; i < members.size(); ++i) ranked[i] = {rendezvous_weight(s, members[i]), &members[i]};
    std::partial_sort(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(r), ranked.end(),
                      [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : *a.second < *b.second; });
    for (size_t i = 0; i < r; ++i) p[s].push_back(*ranked[i].second);
  }
  if (shards < members.size()) return p;

  // Every member primary for at least one shard: idle members, in id order, take the shard where
  // they weigh most among those whose primary has others.
  std::map<std::string, int> primaries;
  for (const auto& holders : p) ++primaries[holders[0]];
  for (const auto& m : members) {
    if (primaries[m] > 0) continue;
    int64_t best = -1;
    for (uint32_t s = 0; s < shards; ++s)
      if (primaries[p[s][0]] > 1 && (best < 0 || rendezvous_weight(s, m) > rendezvous_weight(static_cast<uint32_t>(best), m)))
        best = s;
    TEPDIST_CHECK(best >= 0 && "shards >= members leaves some primary with more than one");
    auto& holders = p[static_cast<size_t>(best)];
    --primaries[holders[0]];
    ++primaries[m];
    auto it = std::find(holders.begin(), holders.end(), m);
    if (it != holders.end()) holders.erase(it);
    holders.insert(holders.begin(), m);
    if (holders.size() > r) holders.pop_back();
  }
  return p;
}

ShardPlan plan_shards(const gossip::JobStart& record, uint32_t shards, int replicas) {
  ShardPlan plan{place_shards(shards, record.workers, replicas), std::vector<std::string>(shards), {}};
  if (record.previous_workers.empty()) return plan;  // the first generation
  const auto before = place_shards(shards, record.previous_workers, replicas);
  for (uint32_t s = 0; s < shards; ++s) {
    if (s < record.shard_sources.size() && !record.shard_sources[s].empty()) {
      plan.sources[s] = record.shard_sources[s];
      continue;
    }
    std::string held;
    for (const auto& h : before[s]) held += (held.empty() ? "" : ", ") + h;
    plan.lost.push_back(fmt::format("shard {} (held by {})", s, held));
  }
  return plan;
}

}  // namespace tepdist::elastic

#include "elastic/placement.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <string_view>
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

Placement place_shards(uint32_t shards, std::span<const std::string> members_in, int replicas,
                       std::span<const std::string> regions_in) {
  // Members in id order, each with its region ("" where none is known), duplicates dropped.
  std::vector<std::pair<std::string, std::string>> rows;
  for (size_t i = 0; i < members_in.size(); ++i)
    rows.emplace_back(members_in[i], i < regions_in.size() ? regions_in[i] : std::string());
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first == b.first; }),
             rows.end());
  Placement p(shards);
  if (rows.empty()) return p;
  const size_t r = std::min(rows.size(), static_cast<size_t>(std::max(1, replicas)));
  std::map<std::string, std::string> region_of(rows.begin(), rows.end());
  const bool spread = r > 1 && std::any_of(rows.begin(), rows.end(), [&](const auto& m) { return m.second != rows[0].second; });
  std::vector<std::pair<uint64_t, size_t>> ranked(rows.size());
  const auto heavier = [&](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : rows[a.second].first < rows[b.second].first;
  };
  for (uint32_t s = 0; s < shards; ++s) {
    for (size_t i = 0; i < rows.size(); ++i) ranked[i] = {rendezvous_weight(s, rows[i].first), i};
    if (!spread) {
      std::partial_sort(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(r), ranked.end(), heavier);
      for (size_t i = 0; i < r; ++i) p[s].push_back(rows[ranked[i].second].first);
      continue;
    }
    // Several regions: in weight order, first the heaviest member of each region not yet holding
    // the shard, then (fewer regions than holders) the heaviest of the rest. The primary is the
    // heaviest member either way, so a region changes only which members hold the replicas.
    std::sort(ranked.begin(), ranked.end(), heavier);
    std::vector<uint8_t> taken(rows.size(), 0);
    std::set<std::string_view> regions;
    for (const auto& [w, i] : ranked)
      if (p[s].size() < r && regions.insert(rows[i].second).second) {
        p[s].push_back(rows[i].first);
        taken[i] = 1;
      }
    for (const auto& [w, i] : ranked)
      if (p[s].size() < r && !taken[i]) p[s].push_back(rows[i].first);
  }
  if (shards < rows.size()) return p;

  // Every member primary for at least one shard: idle members, in id order, take the shard where
  // they weigh most among those whose primary has others.
  std::map<std::string, int> primaries;
  for (const auto& holders : p) ++primaries[holders[0]];
  for (const auto& [m, m_region] : rows) {
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
    if (holders.size() <= r) continue;
    // One holder too many: the last whose region another holder before it has, so the shard keeps
    // its regions; the last one if every region is held once.
    auto drop = holders.end() - 1;
    for (auto h = holders.end() - 1; h != holders.begin(); --h)
      if (std::any_of(holders.begin(), h, [&](const std::string& o) { return region_of[o] == region_of[*h]; })) {
        drop = h;
        break;
      }
    holders.erase(drop);
  }
  return p;
}

ShardPlan plan_shards(const gossip::JobStart& record, uint32_t shards, int replicas) {
  ShardPlan plan{place_shards(shards, record.workers, replicas, record.worker_regions), std::vector<std::string>(shards),
                 {}};
  if (record.previous_workers.empty()) return plan;  // the first generation
  const auto before = place_shards(shards, record.previous_workers, replicas, record.previous_regions);
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

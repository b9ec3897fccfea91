// Properties of shard placement, over many member sets.

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <map>
#include <set>

#include "elastic/placement.hpp"

using namespace tepdist::elastic;

namespace {

std::vector<std::string> members(int n, int offset = 0) {
  std::vector<std::string> m;
  for (int i = 0; i < n; ++i) {
    std::string id = "node-";
    id += std::to_string(i + offset);
    m.push_back(id);
  }
  return m;
}

std::map<std::string, int> primaries(const Placement& p) {
  std::map<std::string, int> count;
  for (const auto& holders : p) ++count[holders[0]];
  return count;
}

}  // namespace

TEST_CASE("every shard has r distinct holders, or all members when fewer", "[elastic][placement]") {
  const auto p = place_shards(64, members(5), 3);
  for (const auto& holders : p) {
    CHECK(holders.size() == 3);
    CHECK(std::set<std::string>(holders.begin(), holders.end()).size() == 3);
  }
  for (const auto& holders : place_shards(8, members(2), 3)) CHECK(holders.size() == 2);
}

TEST_CASE("the same members in any order give the same placement", "[elastic][placement]") {
  auto m = members(7);
  const auto a = place_shards(100, m, 2);
  std::reverse(m.begin(), m.end());
  CHECK(place_shards(100, m, 2) == a);
}

TEST_CASE("primaries are balanced within four standard deviations of the mean", "[elastic][placement]") {
  // 1,000 shards over 10 members: about 100 each, binomial spread sqrt(1000 * 0.1 * 0.9) = 9.5.
  for (const auto& [member, n] : primaries(place_shards(1000, members(10), 1))) {
    INFO(member);
    CHECK(n >= 100 - 38);
    CHECK(n <= 100 + 38);
  }
}

TEST_CASE("adding a member moves about 1/(N+1) of the primaries, all to it", "[elastic][placement]") {
  for (int n : {4, 9, 19}) {
    const auto before = place_shards(2000, members(n), 1);
    const auto grown = members(n + 1);
    const auto after = place_shards(2000, grown, 1);
    int moved = 0;
    for (size_t s = 0; s < before.size(); ++s)
      if (before[s][0] != after[s][0]) {
        ++moved;
        CHECK(after[s][0] == grown.back());
      }
    const double expected = 2000.0 / (n + 1);
    INFO("n=" << n << " moved " << moved << " expected about " << expected);
    CHECK(moved > expected * 0.75);
    CHECK(moved < expected * 1.25);
  }
}

TEST_CASE("removing a member moves only its own shards", "[elastic][placement]") {
  const auto all = members(8);
  const auto before = place_shards(500, all, 2);
  std::vector<std::string> fewer(all.begin(), all.end() - 1);
  const auto after = place_shards(500, fewer, 2);
  for (size_t s = 0; s < before.size(); ++s)
    if (before[s][0] != all.back()) CHECK(after[s][0] == before[s][0]);
}

TEST_CASE("with at least as many shards as members, every member is primary for one", "[elastic][placement]") {
  for (int n = 1; n <= 40; ++n)
    for (int extra : {0, 1, 3}) {
      const auto p = place_shards(static_cast<uint32_t>(n + extra), members(n, 100 * n), 2);
      INFO("members " << n << ", shards " << n + extra);
      CHECK(static_cast<int>(primaries(p).size()) == n);
    }
}

TEST_CASE("a generation's shards come from the sources its record names, or are lost naming their holders",
          "[elastic][placement]") {
  tepdist::gossip::JobStart first;
  first.workers = {"a", "b", "c", "d"};
  const auto initial = plan_shards(first, 8, 2);
  CHECK(initial.placement == place_shards(8, first.workers, 2));
  CHECK(initial.sources == std::vector<std::string>(8));  // all from the initial parameters
  CHECK(initial.lost.empty());

  tepdist::gossip::JobStart next = first;
  next.previous_workers = first.workers;
  next.workers = {"a", "c", "d", "e"};
  next.shard_sources = {"a", "c", "", "d", "a", "a", "c", "d"};
  const auto plan = plan_shards(next, 8, 2);
  CHECK(plan.placement == place_shards(8, next.workers, 2));
  CHECK(plan.sources[1] == "c");
  CHECK(plan.sources[2].empty());
  REQUIRE(plan.lost.size() == 1);
  const auto& held = initial.placement[2];
  CHECK(plan.lost[0] == fmt::format("shard 2 (held by {}, {})", held[0], held[1]));
}

namespace {

/// node-i in region r{i % n}.
std::vector<std::string> regions_of(const std::vector<std::string>& ids, int n) {
  std::vector<std::string> r;
  for (size_t i = 0; i < ids.size(); ++i) r.push_back(fmt::format("r{}", static_cast<int>(i) % n));
  return r;
}

size_t regions_held(const std::vector<std::string>& holders, const std::vector<std::string>& ids,
                    const std::vector<std::string>& regions) {
  std::set<std::string> held;
  for (const auto& h : holders) held.insert(regions[static_cast<size_t>(std::find(ids.begin(), ids.end(), h) - ids.begin())]);
  return held.size();
}

}  // namespace

TEST_CASE("with regions, every shard is held in min(r, regions) of them, its primary unchanged", "[elastic][placement]") {
  for (int n : {4, 7, 12})
    for (int nregions : {2, 3})
      for (int r : {2, 3}) {
        const auto ids = members(n);
        const auto regions = regions_of(ids, nregions);
        for (uint32_t shards : {3u, static_cast<uint32_t>(2 * n)}) {
          INFO("members " << n << ", regions " << nregions << ", replicas " << r << ", shards " << shards);
          const auto spread = place_shards(shards, ids, r, regions);
          const auto plain = place_shards(shards, ids, r);
          for (size_t s = 0; s < spread.size(); ++s) {
            CHECK(spread[s].size() == static_cast<size_t>(r));
            CHECK(std::set<std::string>(spread[s].begin(), spread[s].end()).size() == spread[s].size());
            CHECK(regions_held(spread[s], ids, regions) == static_cast<size_t>(std::min(r, nregions)));
            CHECK(spread[s][0] == plain[s][0]);  // a region moves replicas, never a primary
          }
          if (shards >= static_cast<uint32_t>(n)) CHECK(static_cast<int>(primaries(spread).size()) == n);
        }
      }
}

TEST_CASE("regions that are all one, or unknown, place as no regions do", "[elastic][placement]") {
  const auto ids = members(9);
  CHECK(place_shards(40, ids, 2, std::vector<std::string>(9, "a")) == place_shards(40, ids, 2));
  CHECK(place_shards(40, ids, 2, std::vector<std::string>(9)) == place_shards(40, ids, 2));
}

TEST_CASE("with regions, a member leaving moves only the shards it held", "[elastic][placement]") {
  const auto all = members(10);
  const auto regions = regions_of(all, 3);
  const auto before = place_shards(300, all, 2, regions);
  const std::vector<std::string> fewer(all.begin(), all.end() - 1);
  const std::vector<std::string> fewer_regions(regions.begin(), regions.end() - 1);
  const auto after = place_shards(300, fewer, 2, fewer_regions);
  for (size_t s = 0; s < before.size(); ++s)
    if (std::find(before[s].begin(), before[s].end(), all.back()) == before[s].end()) CHECK(after[s] == before[s]);
}

TEST_CASE("a generation's record carries its workers' regions into the plan", "[elastic][placement]") {
  tepdist::gossip::JobStart record;
  record.workers = {"a", "b", "c", "d"};
  record.worker_regions = {"east", "east", "west", "west"};
  for (const auto& holders : plan_shards(record, 16, 2).placement) {
    INFO(holders[0] << ", " << holders[1]);
    CHECK((holders[0] < "c") != (holders[1] < "c"));  // one in each region
  }
}

// Load balancing (elastic/balance.hpp) and the learning rate's scaling rules (elastic/progress.hpp),
// each as a plain class.

#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <vector>

#include "elastic/balance.hpp"
#include "elastic/progress.hpp"

using namespace tepdist;
using gossip::JobProgress;

namespace {

/// A constant schedule at `lr`: what the rate policies here scale.
compute::LrSchedule constant_rate(float lr) {
  compute::ScheduleOptions s;
  s.base_lr = lr;
  auto made = compute::LrSchedule::make(s);
  REQUIRE(made);
  return *made;
}
int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }
/// The tests' own oracle for a split's step: the slowest rank's share (or quanta) over its speed.
double step(const std::vector<int64_t>& shares, const std::vector<double>& speeds) {
  double t = 0;
  for (size_t r = 0; r < shares.size(); ++r) t = std::max(t, static_cast<double>(shares[r]) / speeds[r]);
  return t;
}
}  // namespace

TEST_CASE("speed meter: the median of the last steps, so one slow step moves nothing", "[elastic][balance]") {
  elastic::SpeedMeter m;
  CHECK(m.speed() == 0);
  for (int k = 0; k < 4; ++k) m.add(100, 0.1);  // 1000 samples/s
  m.add(100, 10.0);                             // one step a hundred times slower
  CHECK(m.speed() == Approx(1000));
  // A lasting change is followed within the window.
  for (int k = 0; k < 3; ++k) m.add(100, 0.2);
  CHECK(m.speed() == Approx(500));
  m.add(0, 1.0);  // a step with nothing to compute says nothing
  m.add(10, 0.0);
  CHECK(m.speed() == Approx(500));
}

TEST_CASE("sync shares: proportional to speed, reached smoothly, in quanta that sum to the global batch",
          "[elastic][balance]") {
  const int64_t global = 128, quantum = 8;
  std::vector<int64_t> shares = elastic::equal_shares(global, 2);
  CHECK(shares == std::vector<int64_t>{64, 64});
  const std::vector<double> speeds = {1000, 500};  // the second node at half speed
  std::vector<std::vector<int64_t>> seen;
  for (int step = 0; step < 12; ++step) {
    const auto next = elastic::sync_shares(shares, speeds, global, quantum);
    REQUIRE(sum(next) == global);
    for (const auto s : next) {
      CHECK(s % quantum == 0);
      CHECK(s >= quantum);
    }
    // Smooth: a step moves each share at most half-way (and a quantum of rounding).
    const double target0 = global * 2.0 / 3.0;
    CHECK(std::abs(static_cast<double>(next[0] - shares[0])) <=
          std::abs(target0 - static_cast<double>(shares[0])) / 2 + quantum);
    shares = next;
    seen.push_back(shares);
  }
  // Settled within a quantum of 2:1 (85.3 : 42.7), and steady.
  CHECK(std::abs(static_cast<double>(shares[0]) - global * 2.0 / 3.0) <= quantum);
  CHECK(seen[10] == seen[11]);
  CHECK(shares[0] > shares[1]);
}

TEST_CASE("sync shares: rounding never holds them a quantum off the fastest split", "[elastic][balance]") {
  // Measured in a two-node job (one node at slowdown 2): 6016 and 2276 samples/s want 92.9/35.1 of
  // 128. Half-way from 88/40 rounds back to 88/40 (a step of 17.6 ms, the slower node's 40), while
  // 96/32 takes 16.0 ms: 9% shorter. The shares must move there, and stay.
  const std::vector<double> speeds = {6016, 2276};
  CHECK(elastic::sync_shares(std::vector<int64_t>{88, 40}, speeds, 128, 8) == std::vector<int64_t>{96, 32});
  CHECK(elastic::sync_shares(std::vector<int64_t>{96, 32}, speeds, 128, 8) == std::vector<int64_t>{96, 32});
  // Whatever the speeds and the start, the settled shares' step is within the dead band of the
  // fastest split in quanta (found here by trying every split).
  const int64_t global = 128, quantum = 8, units = global / quantum;
  for (int slow = 1000; slow <= 6000; slow += 125) {
    const std::vector<double> v = {6000, static_cast<double>(slow)};
    double best = 1e9;
    for (int64_t a = 1; a < units; ++a) best = std::min(best, step({a * quantum, global - a * quantum}, v));
    for (const auto& start : {std::vector<int64_t>{64, 64}, std::vector<int64_t>{120, 8}, std::vector<int64_t>{8, 120}}) {
      std::vector<int64_t> s = start;
      for (int k = 0; k < 20; ++k) s = elastic::sync_shares(s, v, global, quantum);
      INFO("speeds 6000/" << slow << " from " << start[0] << "/" << start[1] << ": settled at " << s[0] << "/" << s[1]);
      CHECK(step(s, v) * (1 - elastic::min_gain) <= best);
    }
  }
}

TEST_CASE("fastest quanta: the split with the shortest step, as the one-by-one greedy finds it", "[elastic][balance]") {
  // Oracles: every split (few units), and the greedy one quantum at a time from one each (any units).
  auto one_by_one = [](const std::vector<double>& v, int64_t units) {
    std::vector<int64_t> u(v.size(), 1);
    for (auto k = static_cast<int64_t>(u.size()); k < units; ++k) {
      size_t best = 0;
      for (size_t r = 1; r < u.size(); ++r)
        if (static_cast<double>(u[r] + 1) / v[r] < static_cast<double>(u[best] + 1) / v[best]) best = r;
      ++u[best];
    }
    return u;
  };
  auto every_split = [&](const std::vector<double>& v, int64_t units) {
    double best = 1e300;
    std::vector<int64_t> u(v.size(), 1);
    auto walk = [&](auto&& self, size_t r, int64_t left) -> void {
      if (r + 1 == v.size()) {
        u[r] = left;
        best = std::min(best, step(u, v));
        return;
      }
      for (int64_t k = 1; k + static_cast<int64_t>(v.size() - r - 1) <= left; ++k) {
        u[r] = k;
        self(self, r + 1, left - k);
      }
    };
    walk(walk, 0, units);
    return best;
  };
  uint64_t x = 12345;  // a fixed LCG: the same cases every run
  auto next = [&] { return x = x * 6364136223846793005ULL + 1442695040888963407ULL, (x >> 33) % 10000; };
  for (int c = 0; c < 300; ++c) {
    const size_t ranks = 2 + next() % 3;
    std::vector<double> v(ranks);
    for (auto& s : v) s = 1 + static_cast<double>(next());
    if (c % 10 == 0) v[0] = v[1];                // ties
    if (c % 7 == 0) v.back() = v.front() / 500;  // one far slower: its floor is 0
    const auto units = static_cast<int64_t>(ranks + next() % (ranks == 4 ? 20 : 50));
    const auto got = elastic::fastest_quanta(v, units);
    INFO("case " << c << ": " << ranks << " ranks, " << units << " units");
    CHECK(sum(got) == units);
    CHECK(got == one_by_one(v, units));
    CHECK(step(got, v) == every_split(v, units));
  }
  // The floor of one quantum overshoots: 15 + 1 + 1 of 16.
  CHECK(elastic::fastest_quanta(std::vector<double>{1000, 1, 1}, 16) == std::vector<int64_t>{14, 1, 1});
  // A million quanta: what the one-by-one greedy gives, without its million rounds.
  const std::vector<double> v = {6016, 2276, 3001.5};
  CHECK(elastic::fastest_quanta(v, 1'000'000) == one_by_one(v, 1'000'000));
}

TEST_CASE("sync shares: unmeasured workers, tiny batches and one worker keep what they have", "[elastic][balance]") {
  const std::vector<int64_t> even = {32, 32, 32};
  CHECK(elastic::sync_shares(even, std::vector<double>{100, 0, 100}, 96, 8) == even);  // one not measured yet
  CHECK(elastic::sync_shares(even, std::vector<double>{100, 50, 100}, 96, 64) == even);  // 1 quantum, 3 workers
  CHECK(elastic::sync_shares(std::vector<int64_t>{96}, std::vector<double>{7}, 96, 8) == std::vector<int64_t>{96});
  // Shares that do not sum to the global batch (a bug elsewhere) are replaced by equal ones.
  CHECK(sum(elastic::sync_shares(std::vector<int64_t>{10, 10, 10}, std::vector<double>{0, 0, 0}, 96, 8)) == 96);
}

TEST_CASE("sync shares: never below one quantum, and what is not a quantum goes to the largest", "[elastic][balance]") {
  // One worker 100x slower: it keeps one quantum. 100 = 12 quanta of 8 and 4 over.
  std::vector<int64_t> shares = elastic::equal_shares(100, 3);
  for (int step = 0; step < 20; ++step) shares = elastic::sync_shares(shares, std::vector<double>{10, 1000, 1000}, 100, 8);
  CHECK(sum(shares) == 100);
  CHECK(shares[0] == 8);
  CHECK((shares[1] % 8 == 4) != (shares[2] % 8 == 4));  // the rest went to one of them
}

TEST_CASE("sync shares: ties go to the lower rank, so the answer depends on the inputs alone", "[elastic][balance]") {
  // Equal speeds from 8/80/8: half-way to 32 each wants 2.5, 7 and 2.5 quanta; the one unit left
  // over ties between ranks 0 and 2, and rank 0 takes it.
  CHECK(elastic::sync_shares(std::vector<int64_t>{8, 80, 8}, std::vector<double>{300, 300, 300}, 96, 8) ==
        std::vector<int64_t>{24, 56, 16});
}

TEST_CASE("sync slices with shares: contiguous runs that cover each step's positions once", "[elastic][balance]") {
  const int64_t n = 1000;
  const std::vector<int64_t> shares = {80, 16, 32};  // 128 = 2 workers x 64 would be the even split
  JobProgress p{3, 0, 384, 384};
  int64_t expected_begin = 384;
  for (int64_t r = 0; r < 3; ++r) {
    const auto [b, e] = elastic::sync_slice(p, n, shares, r);
    CHECK(b == expected_begin);
    CHECK(e - b == shares[static_cast<size_t>(r)]);
    expected_begin = e;
  }
  CHECK(expected_begin == 384 + 128);
  // The epoch's last, short step: the runs are cut at its end.
  p.position = 950;
  CHECK(elastic::sync_slice(p, n, shares, 0) == std::pair<int64_t, int64_t>{950, 1000});
  CHECK(elastic::sync_slice(p, n, shares, 1) == std::pair<int64_t, int64_t>{1000, 1000});
  // Equal shares are the slices of the fixed split.
  JobProgress q;
  const auto even = elastic::equal_shares(192, 3);
  for (int64_t r = 0; r < 3; ++r) CHECK(elastic::sync_slice(q, n, even, r) == elastic::sync_slice(q, n, 64, r));
}

TEST_CASE("straggler: the slowest, when far below the median of the others", "[elastic][balance]") {
  CHECK(elastic::straggler(std::vector<double>{1000, 990, 300}) == 2);
  CHECK(elastic::straggler(std::vector<double>{1000, 600}) == -1);
  CHECK(elastic::straggler(std::vector<double>{1000, 400}) == 1);
  CHECK(elastic::straggler(std::vector<double>{1000}) == -1);
  CHECK(elastic::straggler(std::vector<double>{0, 1000, 1000}) == -1);  // not measured is not slow
}

TEST_CASE("rate rules: linear, square root and none follow the global batch, and the cap bounds them",
          "[elastic][progress]") {
  const auto schedule = constant_rate(0.1f);
  using Rule = elastic::RatePolicy::Options::Rule;
  const int64_t n = 6400, ref = 128;
  auto rate_at = [&](Rule rule, double cap, int64_t global) {
    elastic::RatePolicy policy(schedule, {n, ref, 0, rule, cap});
    policy.set_generation({}, 0, global);
    return policy.at({});
  };
  CHECK(rate_at(Rule::linear, 0, 128) == Approx(0.1));  // at the reference batch: lr itself
  CHECK(rate_at(Rule::sqrt, 0, 128) == Approx(0.1));
  CHECK(rate_at(Rule::linear, 0, 512) == Approx(0.4));
  CHECK(rate_at(Rule::sqrt, 0, 512) == Approx(0.2));
  CHECK(rate_at(Rule::none, 0, 512) == Approx(0.1));
  CHECK(rate_at(Rule::linear, 0, 64) == Approx(0.05));
  CHECK(rate_at(Rule::sqrt, 0, 32) == Approx(0.05));
  CHECK(rate_at(Rule::linear, 1.0, 512) == Approx(0.1));  // capped
  CHECK(rate_at(Rule::linear, 1.0, 64) == Approx(0.05));  // the cap bounds only from above
  CHECK(elastic::RatePolicy::rule_named("sqrt") == Rule::sqrt);
  CHECK(elastic::RatePolicy::rule_named("none") == Rule::none);
  CHECK(elastic::RatePolicy::rule_named("linear") == Rule::linear);
}

TEST_CASE("rate rules by mode: sync follows the rule, gossip too up to 4 times, async not at all",
          "[elastic][progress]") {
  const auto schedule = constant_rate(0.1f);
  const int64_t ref = 256;  // 4 workers of 64
  const auto scale = [&](const std::string& mode, const std::string& rule, int64_t workers) {
    elastic::RatePolicy policy(schedule, elastic::RatePolicy::for_mode(mode, rule, 60000, ref, 8));
    return policy.scale_for(workers * 64);
  };
  CHECK(scale("sync", "linear", 8) == Approx(2));
  CHECK(scale("sync", "linear", 32) == Approx(8));
  CHECK(scale("sync", "sqrt", 16) == Approx(2));
  CHECK(scale("gossip", "linear", 8) == Approx(2));  // a gossip job that doubles doubles its rate
  CHECK(scale("gossip", "linear", 32) == Approx(elastic::gossip_max_scale));
  CHECK(elastic::gossip_max_scale == 4);
  CHECK(scale("gossip", "linear", 2) == Approx(0.5));  // and halves it when it halves
  CHECK(scale("gossip", "sqrt", 16) == Approx(2));
  CHECK(scale("async", "linear", 8) == Approx(1));
  CHECK(scale("async", "sqrt", 2) == Approx(1));
}

TEST_CASE("rate rules: a change ramps from the old batch's scale to the new one's by the rule", "[elastic][progress]") {
  const auto schedule = constant_rate(0.1f);
  elastic::RatePolicy policy(schedule, {6400, 128, 4, elastic::RatePolicy::Options::Rule::sqrt});
  const JobProgress at{10, 0, 1280, 1280};
  policy.set_generation(at, 128, 512);  // 1 worker -> 4 workers
  CHECK(policy.at(at) == Approx(0.1));  // the old scale
  JobProgress half = at;
  half.samples += 2 * 512;
  CHECK(policy.at(half) == Approx(0.15));  // half-way from 1 to 2
  JobProgress done = at;
  done.samples += 4 * 512;
  CHECK(policy.at(done) == Approx(0.2));
}

TEST_CASE("sync shares: equal nodes' noise does not move their shares (the dead band)", "[elastic][balance]") {
  const std::vector<int64_t> even = {64, 64, 64};
  CHECK(elastic::sync_shares(even, std::vector<double>{1000, 970, 1030}, 192, 8) == even);
  CHECK(elastic::sync_shares(even, std::vector<double>{1000, 1000, 1000}, 192, 8) == even);
  // A real difference does move them.
  CHECK(elastic::sync_shares(even, std::vector<double>{1000, 600, 1000}, 192, 8) != even);
}

TEST_CASE("resplit with weights: each epoch's rest cut in proportion, contiguous, every position once",
          "[elastic][balance]") {
  const auto lists = elastic::initial_spans(900, 2, 3);
  std::vector<elastic::Spans> rests;
  for (size_t k = 0; k < lists.size(); ++k) rests.push_back(elastic::rest_after(lists[k], 100 * k));
  const std::vector<double> weights = {3, 1, 2};
  const auto out = elastic::resplit(rests, 3, weights);
  REQUIRE(out.size() == 3);
  std::vector<std::vector<int>> used(2, std::vector<int>(900, 0));
  for (size_t w = 0; w < 3; ++w) {
    uint64_t per_epoch[2] = {0, 0};
    for (const auto& s : out[w]) {
      per_epoch[s.epoch] += s.end - s.begin;
      for (auto p = s.begin; p < s.end; ++p) ++used[s.epoch][p];
    }
    // Epoch 0's rest is 900 - 300 = 600, epoch 1's 900: shares 3:1:2 of each (floored).
    CHECK(per_epoch[0] == Approx(600.0 * weights[w] / 6).margin(1));
    CHECK(per_epoch[1] == Approx(900.0 * weights[w] / 6).margin(1));
  }
  for (int e = 0; e < 2; ++e)
    for (int p = 0; p < 900; ++p) CHECK(used[e][p] == (e == 0 && p % 300 < 100 * (p / 300) ? 0 : 1));
  // No weights, or weights that do not fit: the equal split.
  CHECK(elastic::resplit(rests, 3, std::vector<double>{1, 1, 1}) == elastic::resplit(rests, 3));
  CHECK(elastic::resplit(rests, 3, std::vector<double>{1, 0, 1}) == elastic::resplit(rests, 3));
  CHECK(elastic::resplit(rests, 3, std::vector<double>{1, 2}) == elastic::resplit(rests, 3));
}

TEST_CASE("plateau: the rate decays after `patience` evaluations without a better loss, and counts again",
          "[elastic][progress]") {
  elastic::PlateauPolicy off({0, 0.5});
  CHECK_FALSE(off.on_evaluation(1.0, 1.0));
  CHECK_FALSE(off.on_evaluation(2.0, 1.0));
  elastic::PlateauPolicy p({2, 0.5});
  CHECK_FALSE(p.on_evaluation(1.0, 1.0));     // the first is the best so far
  CHECK_FALSE(p.on_evaluation(0.8, 1.0));     // better
  CHECK_FALSE(p.on_evaluation(0.7999, 1.0));  // not better by 0.1%: one
  const auto first = p.on_evaluation(0.9, 1.0);  // two: decay
  REQUIRE(first);
  CHECK(*first == Approx(0.5));
  CHECK_FALSE(p.on_evaluation(0.85, 0.5));  // the count started again
  const auto second = p.on_evaluation(0.81, 0.5);
  REQUIRE(second);
  CHECK(*second == Approx(0.25));
  CHECK_FALSE(p.on_evaluation(0.5, 0.25));  // better again
  CHECK_FALSE(p.on_evaluation(std::nan(""), 0.25));  // a loss that is not a number decides nothing
}

TEST_CASE("plateau: the factor scales the rate on top of the batch scale", "[elastic][progress]") {
  const auto schedule = constant_rate(0.1f);
  elastic::RatePolicy policy(schedule, {6400, 128, 0});
  policy.set_generation({}, 0, 256);
  CHECK(policy.at({}) == Approx(0.2));
  policy.set_factor(0.5);
  CHECK(policy.at({}) == Approx(0.1));
  policy.set_factor(0);  // the record's "none"
  CHECK(policy.at({}) == Approx(0.2));
}

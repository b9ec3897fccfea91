#include "elastic/balance.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/check.hpp"

namespace tepdist::elastic {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The predicted step of `shares`: the slowest rank's share over its speed.
double step_time(std::span<const int64_t> shares, std::span<const double> speeds) {
  double t = 0;
  for (size_t r = 0; r < shares.size(); ++r) t = std::max(t, static_cast<double>(shares[r]) / speeds[r]);
  return t;
}

}  // namespace

// Every rank one quantum, then each further quantum to the rank that would finish its next one
// soonest (ties to the lower rank): greedy is exact for a min-max of linear times. It starts from
// the floor of the proportional split (at least one each): rank r's k-th quantum ends at k / speed_r,
// and those ending by units / total are among the first the greedy would hand out (there are at
// most `units` of them), so it ends where the one-by-one greedy does, after at most a quantum per
// rank rather than `units` rounds (unless the floor of one quantum overshoots, below).
std::vector<int64_t> fastest_quanta(std::span<const double> speeds, int64_t units) {
  TEPDIST_CHECK(units >= static_cast<int64_t>(speeds.size()));
  for (const double s : speeds) TEPDIST_CHECK(s > 0 && std::isfinite(s));
  const double total = std::accumulate(speeds.begin(), speeds.end(), 0.0);
  std::vector<int64_t> u(speeds.size(), 1);
  for (size_t r = 0; r < u.size(); ++r)
    u[r] = std::max<int64_t>(1, static_cast<int64_t>(std::floor(static_cast<double>(units) * speeds[r] / total)));
  auto given = std::accumulate(u.begin(), u.end(), int64_t{0});
  // The floor of one quantum can overshoot (1000, 1, 1 over 16 units: 15 + 1 + 1); then one by one.
  if (given > units) {
    std::fill(u.begin(), u.end(), int64_t{1});
    given = static_cast<int64_t>(u.size());
  }
  for (auto k = given; k < units; ++k) {
    size_t best = 0;
    for (size_t r = 1; r < u.size(); ++r)
      if (static_cast<double>(u[r] + 1) / speeds[r] < static_cast<double>(u[best] + 1) / speeds[best]) best = r;
    ++u[best];
  }
  return u;
}

void SpeedMeter::add(int64_t samples, double seconds) {
  if (samples <= 0 || !(seconds > 0)) return;
  if (steps_.size() == window) steps_.erase(steps_.begin());
  steps_.push_back(static_cast<double>(samples) / seconds);
}

double SpeedMeter::speed() const { return median(steps_); }

std::vector<int64_t> equal_shares(int64_t global, int64_t world) {
  TEPDIST_CHECK(world > 0);
  std::vector<int64_t> out(static_cast<size_t>(world), global / world);
  for (int64_t r = 0; r < global % world; ++r) ++out[static_cast<size_t>(r)];
  return out;
}

std::vector<int64_t> sync_shares(std::span<const int64_t> shares, std::span<const double> speeds, int64_t global,
                                 int64_t quantum) {
  const auto world = static_cast<int64_t>(shares.size());
  TEPDIST_CHECK(world > 0 && speeds.size() == shares.size() && quantum > 0);
  std::vector<int64_t> current(shares.begin(), shares.end());
  if (std::accumulate(current.begin(), current.end(), int64_t{0}) != global) current = equal_shares(global, world);
  const int64_t units = global / quantum;
  if (world == 1 || units < world) return current;
  double total = 0;
  for (const double s : speeds) {
    if (!(s > 0) || !std::isfinite(s)) return current;  // someone not measured yet
    total += s;
  }
  // Half-way from the current shares to the proportional ones, in quanta.
  std::vector<double> want(current.size());
  for (size_t r = 0; r < want.size(); ++r) {
    const double target = static_cast<double>(global) * speeds[r] / total;
    want[r] = (static_cast<double>(current[r]) + 0.5 * (target - static_cast<double>(current[r]))) /
              static_cast<double>(quantum);
  }
  // Largest remainder: every rank its whole quanta (at least one), the units left to the largest
  // fractions (ties to the lower rank, so every member picks alike); too many (the floor of one
  // quantum) are taken back from the largest shares.
  std::vector<int64_t> u(want.size());
  for (size_t r = 0; r < u.size(); ++r) u[r] = std::max<int64_t>(1, static_cast<int64_t>(std::floor(want[r])));
  int64_t left = units - std::accumulate(u.begin(), u.end(), int64_t{0});
  std::vector<size_t> order(u.size());
  std::iota(order.begin(), order.end(), size_t{0});
  auto fraction = [&](size_t r) { return want[r] - static_cast<double>(u[r]); };
  while (left > 0) {
    const size_t r = *std::max_element(order.begin(), order.end(),
                                       [&](size_t a, size_t b) { return fraction(a) < fraction(b); });
    ++u[r];
    --left;
  }
  while (left < 0) {
    size_t r = order.size();
    for (const size_t k : order)
      if (u[k] > 1 && (r == order.size() || fraction(k) < fraction(r))) r = k;
    TEPDIST_CHECK(r < order.size());  // units >= world, so some rank has more than one quantum
    --u[r];
    ++left;
  }
  // In quanta, then what does not fill a quantum goes to the largest share.
  auto to_shares = [&](const std::vector<int64_t>& in_units) {
    std::vector<int64_t> out(in_units.size());
    for (size_t r = 0; r < in_units.size(); ++r) out[r] = in_units[r] * quantum;
    const auto largest = static_cast<size_t>(std::max_element(out.begin(), out.end()) - out.begin());
    out[largest] += global - units * quantum;
    return out;
  };
  // A dead band: shares move only for a step at least min_gain shorter, so that the noise of equal
  // nodes does not shuffle their shares (and plans).
  const double now = step_time(current, speeds);
  const auto gains = [&](const std::vector<int64_t>& s) { return step_time(s, speeds) <= (1 - min_gain) * now; };
  if (auto halfway = to_shares(u); halfway != current && gains(halfway)) return halfway;
  // Near the target half-way rounds back to where the shares are (or gains too little), and could
  // hold them a quantum off for good: 88/40 where the speeds say 92.9/35.1 and 96/32 makes the step
  // 9% shorter. There the step goes straight to the fastest split, at most a quantum or two away.
  if (auto fastest = to_shares(fastest_quanta(speeds, units)); gains(fastest)) return fastest;
  return current;
}

int straggler(std::span<const double> speeds, double factor) {
  if (speeds.size() < 2) return -1;
  const auto slowest = std::min_element(speeds.begin(), speeds.end());
  std::vector<double> others;
  for (auto it = speeds.begin(); it != speeds.end(); ++it)
    if (it != slowest) others.push_back(*it);
  return *slowest > 0 && *slowest < factor * median(std::move(others)) ? static_cast<int>(slowest - speeds.begin()) : -1;
}

}  // namespace tepdist::elastic

#include "sims/load.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

namespace tepdist::sims {

SimulatedCpu::SimulatedCpu(const LoadKnobs& knobs, double from_ms, double until_ms, std::mt19937_64& rng)
    : knobs_(knobs), from_ms_(from_ms), until_ms_(until_ms) {
  stall_end_ms_ = from_ms_;  // as if a stall had just ended: the first gap starts at the window's
  next_stall(rng);
}

void SimulatedCpu::next_stall(std::mt19937_64& rng) {
  const double gap_ms = std::exponential_distribution<double>(1.0 / knobs_.stall_every_ms)(rng);
  const double length_ms = std::uniform_real_distribution<double>(knobs_.stall_min_ms, knobs_.stall_max_ms)(rng);
  stall_start_ms_ = stall_end_ms_ + gap_ms;
  stall_end_ms_ = stall_start_ms_ + length_ms;
  // No stall starts once the load is off; one under way when it goes off still runs its course.
  if (stall_start_ms_ >= until_ms_) stall_start_ms_ = stall_end_ms_ = std::numeric_limits<double>::infinity();
}

void SimulatedCpu::advance(double t_ms, std::mt19937_64& rng) {
  while (stall_end_ms_ <= t_ms) next_stall(rng);
}

bool SimulatedCpu::slows(double t_ms, std::mt19937_64& rng) {
  advance(t_ms, rng);
  return active(t_ms) || t_ms >= stall_start_ms_;
}

Work SimulatedCpu::work(double start_ms, std::mt19937_64& rng) {
  if (!slows(start_ms, rng)) return {start_ms, start_ms};
  double t = start_ms;
  double left_ms = active(start_ms) ? knobs_.service_ms : 0;
  std::optional<double> began_ms;
  // Each pass either finishes or moves past one stall: the loop ends, as a stall has positive
  // length unless stall_max_ms is 0, and then no time is lost to it either.
  for (;;) {
    advance(t, rng);
    if (t >= stall_start_ms_) {  // descheduled: nothing runs until the stall ends
      t = stall_end_ms_;
      continue;
    }
    if (!began_ms) began_ms = t;
    if (t + left_ms <= stall_start_ms_) return {*began_ms, t + left_ms};
    left_ms -= stall_start_ms_ - t;  // the part done before the stall
    t = stall_end_ms_;
  }
}

}  // namespace tepdist::sims

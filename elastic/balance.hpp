#pragma once
// Load balancing: each worker's share of the work follows what it is measured to do, never a
// setting ([compute] slowdown, the emulated slow node, is invisible here by design).
//
//   speed    every worker measures its own samples per second of compute (forward, backward and
//            whatever else holds its thread in the step) with SpeedMeter: the median of its last
//            few steps, so one slow step (a page fault, a neighbour's burst) moves nothing.
//   sync     each step's ring sum carries every worker's speed (one slot per rank, zero elsewhere,
//            so the sum is exact and alike on every member); every member then computes the next
//            step's shares of the global batch with sync_shares from the same inputs and gets the
//            same answer. The global batch is unchanged (the shares sum to it), so the update is
//            still one process's at that batch and the learning rate does not move.
//   shares   proportional to speed, moved half-way from the current shares each step (a smooth
//            change), in multiples of a quantum (the oneDNN plans of a few batch sizes are reused),
//            never below one quantum, and only when the step gets at least 5% shorter by the
//            speeds measured (equal nodes' noise does not shuffle their shares). Where half-way
//            rounds back to the current shares, the step goes to the split in quanta with the
//            shortest step instead, if that gains the 5%: rounding alone never holds the shares a
//            quantum off. A global batch too small for one quantum a worker, or a worker not
//            measured yet, keeps the shares.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tepdist::elastic {

/// A worker's own speed: samples per second over its recent steps, robust to one slow step.
class SpeedMeter {
 public:
  static constexpr size_t window = 5;
  /// A step of `samples` took `seconds` of this worker's time.
  void add(int64_t samples, double seconds);
  /// Samples per second (median of the window's steps); 0 before the first step.
  double speed() const;
  void clear() { steps_.clear(); }

 private:
  std::vector<double> steps_;  // samples per second, oldest first
};

/// The next step's shares of `global` positions, from the current `shares` (one per rank, summing
/// to global) and each rank's measured `speeds` (samples/s; 0: not measured yet): half-way to the
/// proportional shares, or else the fastest split in quanta. The current shares stay unless the
/// new ones make the step (the slowest rank's share over its speed) at least min_gain shorter.
inline constexpr double min_gain = 0.05;
std::vector<int64_t> sync_shares(std::span<const int64_t> shares, std::span<const double> speeds, int64_t global,
                                 int64_t quantum);

/// The split of `units` quanta over ranks of `speeds` (all > 0) with the shortest step (the largest
/// units / speed), at least one each; ties to the lower rank. What sync_shares moves to where
/// half-way rounds back to the current shares.
std::vector<int64_t> fastest_quanta(std::span<const double> speeds, int64_t units);

/// Equal shares of `global` over `world` ranks (the first `global % world` one larger): a
/// generation's first step, and what an unbalanced job keeps.
std::vector<int64_t> equal_shares(int64_t global, int64_t world);

/// The slowest rank when its speed is below `factor` times the median of the others' (a straggler), else -1.
int straggler(std::span<const double> speeds, double factor = 0.5);

}  // namespace tepdist::elastic

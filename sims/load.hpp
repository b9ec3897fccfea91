#pragma once
// Simulated load on one node: the CPU a node's membership loop gets when it shares a small machine
// with busy neighbours (training, compilers, two cores for many processes). A simulated load, not a
// measured one: nothing here runs on a real CPU.
//
// A loaded node handles its inputs (messages and its own ticks) one at a time. Each takes
// service_ms of CPU, and at random moments (gaps of stall_every_ms on average) the node is
// descheduled for a stall drawn uniformly from [stall_min_ms, stall_max_ms], as a process is when
// CPU hogs hold the cores. The clock goes on meanwhile: an input that comes during a stall waits
// for its end, and one being handled when a stall begins finishes that much later. Every draw comes
// from the run's one seeded source, in the order the simulation asks, so a seed replays it.

#include <limits>
#include <random>

namespace tepdist::sims {

/// What a loaded node's CPU is like; each knob's unit is in its name.
struct LoadKnobs {
  /// CPU time to handle one input (a message or a tick); ms. With the inputs a SWIM node gets
  /// (about twenty a second in a LAN of 100), 1 ms is light; the stalls are what make it late.
  double service_ms = 1;
  /// Mean gap from the end of one stall to the start of the next (exponentially distributed); ms.
  double stall_every_ms = 2000;
  /// Shortest and longest stall, drawn uniformly between them; ms. Stalls longer than a probe
  /// timeout make the node miss acks; longer than a probe interval, it misses whole probes.
  double stall_min_ms = 20, stall_max_ms = 200;
  /// When the node gets the CPU back from a stall, a tick that fell due meanwhile is handled before
  /// the messages that came meanwhile, rather than in arrival order. Real drivers do either: libuv
  /// runs due timers before it polls sockets, and in the CAF driver the clock's thread and the I/O
  /// thread race to the actor's mailbox. Then a probe's ack can sit unread while the tick gives up
  /// on it.
  bool timers_first = false;
};

/// When a loaded node's CPU works on one input: it begins once no stall holds it (when the node can
/// choose what to handle) and is done after its service time and any stall that began meanwhile.
struct Work {
  double began_ms, done_ms;
};

/// One loaded node's CPU over a window of simulated time.
class SimulatedCpu {
 public:
  /// Load from from_ms until until_ms (infinity: to the end of the run); the first stall is drawn
  /// now, from `rng`.
  SimulatedCpu(const LoadKnobs& knobs, double from_ms, double until_ms, std::mt19937_64& rng);

  /// The work on an input the node takes up at start_ms: it waits for a stall under way, takes its
  /// service time and is stretched by any stall that begins meanwhile. Calls must come in
  /// non-decreasing start_ms (a node handles one input at a time). Outside the load: no time.
  Work work(double start_ms, std::mt19937_64& rng);

  const LoadKnobs& knobs() const { return knobs_; }

  /// Whether an input that comes at t_ms must queue for the CPU: the load is on, or a stall that
  /// began while it was on still runs. Non-decreasing t_ms, as for work().
  bool slows(double t_ms, std::mt19937_64& rng);

  /// The stall under way or next, [stall_start_ms(), stall_end_ms()): for traces.
  double stall_start_ms() const { return stall_start_ms_; }
  double stall_end_ms() const { return stall_end_ms_; }

 private:
  bool active(double t_ms) const { return t_ms >= from_ms_ && t_ms < until_ms_; }
  /// Draws stalls until the one under way at t_ms or the next.
  void advance(double t_ms, std::mt19937_64& rng);
  /// Draws the stall after the current one.
  void next_stall(std::mt19937_64& rng);

  LoadKnobs knobs_;
  double from_ms_, until_ms_;
  double stall_start_ms_ = std::numeric_limits<double>::infinity();
  double stall_end_ms_ = std::numeric_limits<double>::infinity();
};

}  // namespace tepdist::sims

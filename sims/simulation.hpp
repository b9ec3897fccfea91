#pragma once
// The deterministic discrete-event simulator: N nodes running the real SWIM core on a virtual
// clock over a simulated network, with faults injected on schedule and invariants checked after.
// Everything random comes from one seeded source, so a seed replays a run exactly.
//
// The network is simulated (no sockets): each message takes the latency of its link plus jitter,
// and is lost with the link's probability or while a partition separates the two nodes. A killed
// node stops; a restarted one starts afresh with the same id and a higher incarnation; a paused
// node neither runs nor reads, and finds its messages waiting when it resumes. A loaded node
// (sims/load.hpp) handles its messages and ticks one at a time, each taking CPU time, and stalls at
// random moments: its inputs wait in arrival order, its ticks come late, and the core is handed
// the time each input is actually handled.

#include <cstdint>
#include <expected>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gossip/swim/config.hpp"
#include "sims/job.hpp"
#include "sims/load.hpp"

namespace tepdist::sims {

struct Fault {
  enum class Kind { kill, restart, pause, partition, join, leave, load };
  Kind kind;
  double at_s = 0;
  double duration_s = 0;        ///< pause, partition; load: 0 is until the end of the run
  std::vector<int> nodes;       ///< kill, restart, pause, leave, load: these; partition: one side
  int count = 0;                ///< join: this many new nodes
  double fraction = 0;          ///< load: also this share of all nodes, drawn from the seed
  LoadKnobs load;               ///< load: what the loaded nodes' CPU is like
};

/// One simulated link between two regions (both ways).
struct SimLink {
  double latency_ms = 1, jitter_ms = 0, loss = 0;
};

struct Scenario {
  std::string name;
  int nodes = 10;
  double duration_s = 60;
  gossip::swim::Config swim = gossip::swim::Config::lan();
  double latency_ms = 1, jitter_ms = 0, loss = 0;  ///< links not listed below
  std::vector<std::string> regions;  ///< node i is in regions[i mod size]; empty: one region
  std::map<std::pair<std::string, std::string>, SimLink> links;  ///< key: the pair, sorted
  std::vector<Fault> faults;
  // Invariants to check at the end.
  bool converge = true;            ///< live nodes agree on who is live
  bool killed_detected = true;     ///< every node killed and not restarted is dead to all
  bool no_false_positives = true;  ///< no node that was never killed is declared dead
  bool one_coordinator = true;     ///< live nodes agree on the coordinator (lowest live id)
  bool join_rounds = false;        ///< the last join is known to all within 3 log2(N) probe rounds
  /// [job]: an elastic sync job on every node (sims/job.hpp), with its invariants.
  JobScenario job;
};

/// Reads a scenario file; errors name the file, line and key.
std::expected<Scenario, std::string> load_scenario(const std::filesystem::path& file);

struct Report {
  std::string scenario;
  uint64_t seed = 0;
  int nodes = 0;
  double simulated_s = 0;
  std::vector<double> detection_s;  ///< per kill: until every live node knew
  double join_convergence_s = -1;   ///< the last join until every live node knew the joiners
  double join_convergence_rounds = -1;
  double join_rounds_bound = -1;    ///< 3 log2(N), N the nodes running after the last join
  double heal_to_one_coordinator_s = -1;  ///< from the last partition's heal until all name one coordinator
  double heal_bound_s = -1;               ///< what the one_coordinator invariant allows for that
  int false_positives = 0;          ///< dead declarations about nodes never killed nor paused
  std::vector<std::string> false_deaths;  ///< each of those: who declared whom dead, when
  // Simulated load: how late loaded nodes handled their inputs (after they arrived or fell due).
  int loaded_nodes = 0;
  uint64_t loaded_inputs = 0;       ///< messages and ticks handled by nodes while loaded or queued
  uint64_t late_inputs = 0;         ///< of those, handled more than a probe timeout late
  uint64_t late_ticks = 0;          ///< of those, ticks
  double max_lateness_ms = 0;       ///< the latest any input was handled
  double messages_per_node_s = 0, bytes_per_node_s = 0;
  uint64_t events = 0;
  uint64_t event_log_hash = 0;      ///< FNV-1a of every event in order: equal runs, equal hashes
  double wall_s = 0;
  double peak_rss_mb = 0;
  std::vector<std::string> broken;  ///< invariants that failed, with why
  std::optional<JobReport> job;     ///< with [job]: the simulated job's generations and steps
};

Report simulate(const Scenario& scenario, uint64_t seed);

/// The report as text (human) or JSON.
std::string format_report(const Report& r, bool json);

}  // namespace tepdist::sims

#pragma once
// A simulated elastic sync job on the simulator's nodes: the real job-control core
// (elastic/job_control.hpp) on every node, driven by the real SWIM views, over the simulated
// network. Training itself is simulated (no tensors): a generation takes a step when every one
// of its workers is running, has installed it, holds the state and reaches every other; the step
// moves their shared progress by W·b positions (elastic/progress.hpp), as a ring would.
// Members behind pull the state from a donor they reach, at once.
//
// Invariants checked as it runs and at the end:
//   one_generation   one set of workers per installed generation number, everywhere
//   one_side         no generation steps after a newer one has stepped (two sides never train)
//   every_sample     within an epoch every position is trained on exactly once
//   settled          at the end every running node is a worker of the newest generation, not
//                    paused (the scenario leaves settle time after its last fault); not checked
//                    after a true loss (below), which the report shows
//   no_false_loss    a duty holder says the job's state is lost (JobControl::Output::lost) only
//                    when no running node holds it
// and, with [job] shards, the shard protocol's (sims/shards.hpp).

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "elastic/job_control.hpp"
#include "sims/shards.hpp"

namespace tepdist::sims {

struct JobScenario {
  bool enabled = false;
  int64_t samples = 4096;  ///< positions in an epoch
  int64_t batch = 32;      ///< per worker
  double step_ms = 50;     ///< a step's time when it can be taken
  elastic::Quorum quorum = elastic::Quorum::majority;
  uint32_t shards = 0;   ///< > 0: an async job's shard protocol runs beside (sims/shards.hpp)
  int replication = 2;   ///< its holders per shard
  /// With shards: for the last drain_s seconds workers start no new batch (a refused one is still
  /// computed again), and at the end every update must be durable (sims/shards.hpp: all_durable).
  double drain_s = 0;
};

struct JobReport {
  uint64_t generations = 0;  ///< installed, counting the first
  uint64_t steps = 0, epochs = 0;
  uint64_t pulls = 0;        ///< state transfers to members behind or joining
  std::string lost;          ///< the job's state was lost (more faults than it survives): why
  std::optional<ShardReport> shards;  ///< with [job] shards
};

class SimJob {
 public:
  struct Send {
    std::string to;  ///< node id
    gossip::Body body;
  };
  using Sends = std::vector<Send>;

  explicit SimJob(JobScenario scenario);

  /// Node `id` starts (again) holding nothing; founders hold generation 1 with every founder.
  void start(const std::string& id, uint64_t boot, bool founder, const std::vector<std::string>& founders,
             const std::vector<uint64_t>& founder_boots);
  void stop(const std::string& id);
  void on_view(const std::string& id, double now, const std::vector<gossip::Member>& view, Sends& out);
  void on_message(const std::string& id, double now, const std::string& from, const gossip::Body& body, Sends& out);
  void on_tick(const std::string& id, double now, Sends& out);
  /// Every generation that can step takes one step. `ready(id)`: running and not paused;
  /// `reach(a, b)`: no partition between them.
  void step(const std::function<bool(const std::string&)>& ready,
            const std::function<bool(const std::string&, const std::string&)>& reach);
  /// With shards: workers start no new batch from here on (JobScenario::drain_s).
  void drain();
  /// The end-of-run invariant over the nodes still running.
  void check_settled(double now, const std::vector<std::string>& running);

  /// What the job did (with shards, the shard protocol's report in it).
  const JobReport& report();
  /// Broken invariants, the shard protocol's included.
  const std::vector<std::string>& broken();
  /// With shards: what the shard protocol sends, from each node, since the last call.
  SimShards::Outbox take_shard_sends() { return shards_ ? shards_->take_outbox() : SimShards::Outbox{}; }

 private:
  struct Worker {
    std::unique_ptr<elastic::JobControl> control;
    uint64_t boot = 0;
    bool running = false;
    bool has_state = false;
    gossip::JobProgress progress;
  };
  elastic::JobControl::Local local(const std::string& id, const Worker& w) const;
  std::unique_ptr<elastic::JobControl> fresh(const std::string& id, uint64_t boot) const;
  void apply(const std::string& id, elastic::JobControl::Output& out, Sends& sends);
  void fail(std::string why);

  JobScenario s_;
  std::map<std::string, Worker> workers_;
  std::map<uint64_t, std::vector<std::string>> installed_;  // number -> workers, as first installed
  uint64_t newest_stepped_ = 0;
  uint64_t epoch_ = 0;
  std::vector<uint8_t> used_;  // per position of the current epoch
  std::unique_ptr<SimShards> shards_;
  JobReport report_;
  std::vector<std::string> broken_;
  double now_ = 0;
  bool trace_ = std::getenv("TEPDIST_SIM_TRACE") != nullptr;  // job control's decisions on stderr
};

}  // namespace tepdist::sims

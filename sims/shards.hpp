#pragma once
// The async shard protocol of a simulated job (sims/job.hpp, [job] shards > 0): the real shard
// cores (elastic/async_shards.hpp: ShardServer on every holder, AsyncWorker on every worker) and
// the real placement (elastic::plan_shards, each generation's shard sources from job control's
// acks), over the simulated network. What the sim does itself stands in for the shard host
// (actors/roles/shard_host.cpp): it routes pushes, replications, acks and answers, and a new
// holder takes its source's snapshot at once (the transfer is not simulated) as soon as the
// source runs, holds the shard and is reachable. Gradients are simulated: each push carries -1 on
// every element.
//
// Beside each holder's state the sim keeps the set of updates (worker, boot, sequence) that state
// holds, carried with snapshots, so it can check, as it runs and at the end:
//   no_double_apply   no update is applied twice to one line of a shard's state
//   no_ack_lost       every update a primary declared durable (every holder has it, the worker
//                     is told) is in the state every later holder of the newest generation takes
//                     over, unless the shard was lost (more holders died at once than replication
//                     survives), which the report shows. (A node that installs a generation the
//                     others have passed, as a proposer woken from a pause installs the one it
//                     proposed, may carry on from its old copy there: nobody else pushes to it in
//                     that generation, so it is not checked; it takes the shard afresh when it
//                     installs the newest.)
//   durable_grows     a state taken over is at least at the highest durable version declared
//   holders_back      at the end every shard has min(replication, workers) holders holding its
//                     state in the newest generation
//   all_durable       after a drain ([job] drain_s: no new batches for the scenario's last
//                     seconds), every update is durable: each shard's primary has every holder's
//                     ack for all it applied, and every worker of the newest generation knows each
//                     of its updates durable, with none left to apply or compute again. (An
//                     update sent again to a primary restored from a source that stays a replica
//                     once never became durable: the source fetches nothing, so it never acked;
//                     ShardServer::Options::source_replica.) The sim does not tick its primaries,
//                     which would send a replication lost to a partition again: a drained
//                     scenario's partitions must be long enough to change the placement.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "elastic/async_shards.hpp"
#include "elastic/placement.hpp"
#include "gossip/wire/messages.hpp"

namespace tepdist::sims {

struct ShardReport {
  uint64_t applied = 0;     ///< pushes applied by primaries
  uint64_t durable = 0;     ///< updates declared durable
  uint64_t duplicates = 0;  ///< resends a primary already held
  uint64_t takeovers = 0;   ///< states a new holder took from its source
  std::string lost;         ///< a shard no holder survived: which, and when
};

class SimShards {
 public:
  using Outbox = std::vector<std::tuple<std::string, std::string, gossip::Body>>;  // from, to, body

  SimShards(uint32_t shards, int replication)
      : shards_(shards), replication_(replication), durable_(shards), durable_top_(shards, 0), lost_(shards, 0) {}

  /// A node starts (again): it holds nothing.
  void start(const std::string& id, uint64_t boot);
  void stop(const std::string& id);
  /// `id` installed `record` (a worker of it, or left out).
  void install(const std::string& id, const gossip::JobStart& record);
  /// What `id` reports in its acks: the shards it holds in `generation`, with versions.
  std::vector<std::pair<uint32_t, uint64_t>> held(const std::string& id, uint64_t generation) const;
  /// A step of `id`'s generation: it pushes, if its window allows.
  void push(const std::string& id);
  void on_message(const std::string& id, const std::string& from, const gossip::Body& body);
  /// Holders still fetching take their source's state if they can now.
  void take_over(const std::function<bool(const std::string&)>& running,
                 const std::function<bool(const std::string&, const std::string&)>& reach);
  /// Workers start no new batch from here on (a refused one is still computed again); check_end
  /// then checks all_durable.
  void drain() { draining_ = true; }
  /// The end-of-run invariants for the newest generation's record.
  void check_end(const gossip::JobStart& newest);

  Outbox take_outbox() { return std::exchange(outbox_, {}); }
  const ShardReport& report() const { return report_; }
  const std::vector<std::string>& broken() const { return broken_; }
  void set_now(double now) { now_ = now; }

 private:
  using UpdateId = std::tuple<std::string, uint64_t, uint64_t>;  // worker, boot, seq
  struct Holder {
    std::unique_ptr<elastic::ShardServer> server;  // null while it waits for its source
    bool holder = false;                           // of this generation (else a copy kept for others)
    std::set<UpdateId> applied;                    // the updates this state holds
    std::map<uint64_t, UpdateId> by_version;       // which update made each version (primary and replicas)
    std::map<uint64_t, UpdateId> pending;          // replica: replications from ahead, by version
  };
  struct Node {
    bool running = false;
    uint64_t boot = 0, runs = 0, generation = 0;
    gossip::JobStart record;
    elastic::ShardPlan plan;
    std::map<uint32_t, Holder> shards;
    std::optional<elastic::AsyncWorker> worker;
    std::vector<float> params;
    uint64_t batch = 0;
    // Updates it cannot take yet (a newer generation's, or for a shard still being taken over),
    // as the host holds them: taken again at each install and take-over.
    std::vector<std::pair<std::string, gossip::ShardUpdate>> waiting;
  };
  static constexpr size_t waiting_limit = 100000;
  bool draining_ = false;

  elastic::ShardServer::Options options(const Node& n, const std::string& id, uint32_t s) const;
  void send(const std::string& from, const std::string& to, gossip::Body body);
  void fail(std::string why);
  void applied(const std::string& where, uint32_t s, Holder& h, uint64_t version, const UpdateId& u);
  void check_taken(const std::string& id, uint32_t s, const Holder& h, uint64_t generation);
  void on_update(const std::string& id, Node& n, const std::string& from, const gossip::ShardUpdate& u);
  void retry_waiting(const std::string& id, Node& n);

  uint32_t shards_;
  int replication_;
  std::map<std::string, Node> nodes_;
  std::vector<std::set<UpdateId>> durable_;  // per shard: the updates declared durable
  std::vector<uint64_t> durable_top_;        // per shard: the highest durable version declared
  std::vector<uint8_t> lost_;                // per shard: no holder survived (not checked from then)
  uint64_t newest_ = 0;                      // the newest generation any node installed
  Outbox outbox_;
  ShardReport report_;
  std::vector<std::string> broken_;
  double now_ = 0;
};

}  // namespace tepdist::sims

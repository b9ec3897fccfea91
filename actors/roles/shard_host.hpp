#pragma once
// The shard host: the async mode's parameter-shard actor. For one job it holds every shard this
// node is primary or replica for (elastic/async_shards.hpp does the protocol), answers workers'
// pushes and pulls, forwards applied updates to the replicas, acks replications and sends the
// durable notices. It runs detached, on its own thread, so a push is answered while this node's
// trainer is busy with a forward pass; the router sends it every ShardUpdate and ShardTransfer
// frame while it is registered (shards_atom).
//
// Generations. The trainer sends it each installed generation's plan (place_atom): which shards
// this node holds, as primary or replica, and where each shard's state comes from
// (elastic::plan_shards). A holder that is its shard's source carries on from its own state;
// every other holder fetches the source's snapshot (ShardUpdate fetch, answered by a
// ShardTransfer) and holds what comes for that shard until it arrives. A shard larger than one
// piece that others held with the same state is fetched striped: the source answers with a
// manifest (version, digest, marks, the holders of that state), the new holder pulls the values
// and optimiser buffers from all of them at once with part 1's state-transfer component
// (elastic::StatePuller; StatePull/StatePiece marked of_shard), checks the digest, and else
// fetches it whole. Each holder serves those pieces from a copy frozen as it placed the
// generation, since the copy in use moves on as updates come. Every message carries the
// sender's generation: one from an older generation is dropped (its sender sends again in the new
// one), one from a newer is kept (bounded) until this node installs it.
//
// Handing over. A plan that leaves this node out (its worker leaves gracefully) keeps the shards
// it is the source of until each of their new holders has fetched them; then the host says so
// (handover_atom), and the node may go.
//
// Checkpoints. Rank 0's host gathers every shard on its trainer's behalf (gather_atom): what it
// holds as it is, the rest fetched from the primaries as a new holder would, asked again every 2 s
// and given up after 20 s or at the next generation; the trainer writes the file.
//
// It obeys the job's membership: pushes and pulls only from the generation's workers,
// replications only from the shard's primary, acks only from its replicas; anything else, and
// anything the core refuses, is logged and dropped.

#include <caf/actor.hpp>
#include <caf/local_actor.hpp>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "elastic/async_shards.hpp"
#include "elastic/placement.hpp"
#include "gossip/transport/transport.hpp"

namespace tepdist::actors {

/// What the trainer reads (written on the host's thread).
struct ShardHostCounters {
  std::atomic<uint64_t> applied{0};        ///< updates applied by the shards this node is primary for
  std::atomic<uint64_t> staleness_sum{0};  ///< over the applied updates
  std::atomic<uint64_t> duplicates{0};     ///< updates sent again that were applied before
  /// Per worker, the highest cursor its pushes applied here carried in `generation`: its
  /// positions counted as consumed should it die (job control's cursors). Nothing while the host
  /// has not installed that generation yet.
  std::vector<std::pair<std::string, uint64_t>> cursors(uint64_t generation) const {
    std::lock_guard lock(mutex);
    if (generation != generation_) return {};
    return {cursors_.begin(), cursors_.end()};
  }
  void note_cursor(const std::string& worker, uint64_t consumed) {
    std::lock_guard lock(mutex);
    auto& c = cursors_[worker];
    c = std::max(c, consumed);
  }
  /// The shards this node holds the state of in `generation` (as a holder, not a copy kept only
  /// for others to fetch), each with its version: job control's acks, from which the holders of
  /// the next generation take each shard from the acker with its highest version. Nothing while
  /// the host has not installed that generation yet.
  std::vector<std::pair<uint32_t, uint64_t>> held(uint64_t generation) const {
    std::lock_guard lock(mutex);
    if (generation != generation_) return {};
    return {held_.begin(), held_.end()};
  }
  /// The last generation the host has placed (what held() reports is known from then on).
  uint64_t placed() const {
    std::lock_guard lock(mutex);
    return generation_;
  }
  /// The host installed `generation`: what it holds in it, and no cursors yet.
  void installed(uint64_t generation, std::map<uint32_t, uint64_t> held) {
    std::lock_guard lock(mutex);
    generation_ = generation;
    held_ = std::move(held);
    cursors_.clear();
  }
  /// The generation, leaving this node out (a graceful leave), in which every shard this node is
  /// the source of has been fetched by each of its new holders (the host then tells the trainer).
  std::atomic<uint64_t> handed_over_in{0};
  /// The last generation in which every shard this node holds has its state (placed, and each
  /// one fetched that had to be): what held() reports is whole from then on. Behind the trainer's
  /// generation for a while after each install (the host places the plan on its own thread, and
  /// fetches take a round trip); the host tells the trainer when it moves (handover_atom).
  std::atomic<uint64_t> ready_in{0};
  void note_version(uint32_t shard, uint64_t version) {
    std::lock_guard lock(mutex);
    held_[shard] = version;
  }

 private:
  mutable std::mutex mutex;
  std::map<std::string, uint64_t> cursors_;
  std::map<uint32_t, uint64_t> held_;
  uint64_t generation_ = 0;
};

/// Makes the optimiser a shard of `size` values is stepped with on its holders.
using ShardOptimizerFactory = std::function<std::expected<std::unique_ptr<compute::Optimizer>, std::string>(size_t)>;

struct ShardHostInit {
  gossip::Transport* transport = nullptr;
  std::string cluster_id, self_id, self_address;
  caf::actor trainer;  ///< answers to this node's own worker go there, not over the network
  uint64_t incarnation = 0;
  uint64_t job_id = 0;
  size_t elements = 0;  ///< of the whole parameter buffer
  uint32_t shards = 0;
  uint64_t max_staleness = 16;
  float max_lr = 0;  ///< ShardServer::Options::max_lr
  /// Elements per piece of a striped fetch (job.ring_chunk_kb): a shard's state larger than one
  /// piece, held with the same state by two or more, is fetched striped over them.
  size_t piece = size_t{1} << 16;
  ShardOptimizerFactory optimizer;
  std::shared_ptr<ShardHostCounters> counters;
};

/// One generation's plan for the host (place_atom).
struct ShardHostPlan {
  uint64_t generation = 0;
  std::vector<std::string> workers, addresses;  ///< the generation's, in rank order
  elastic::ShardPlan plan;
  /// Per shard, the address of its source (plan.sources): a worker of this generation, or one
  /// left out of it that hands its shards over before it goes.
  std::vector<std::string> source_addresses;
  /// The first generation: the job's initial parameters, every holder's starting values.
  std::shared_ptr<const std::vector<float>> initial;
  /// ... and, for a job resumed from a checkpoint in gradients mode, its optimiser's buffers
  /// (whole, as the parameters) and step count.
  std::shared_ptr<const std::vector<std::vector<float>>> initial_optimizer;
  int64_t initial_optimizer_steps = 0;
  /// A release with parameters the program set between epochs: every holder's copy of a shard
  /// takes its slice of them as it gets the shard's state in this generation (the version and
  /// marks stay: every worker took them too, and none had an update in flight at the hold).
  std::shared_ptr<const std::vector<float>> reset;
  /// A release that changed the optimiser the shards step (gradients mode): theirs from this
  /// generation on. Their state carries over where the layout is the same (compute::same_layout);
  /// a copy of the layout before starts afresh.
  ShardOptimizerFactory optimizer;
};

/// Every shard's state, gathered by rank 0's host for a checkpoint (gather_atom): the shards this
/// node holds as they are, the others fetched from their primaries, each at whatever version it
/// had when asked. Assembled whole: the job's parameters and each optimiser buffer.
struct ShardGather {
  uint64_t id = 0;
  std::string error;  ///< not empty: no checkpoint this time, and why
  std::vector<float> values;
  std::vector<std::vector<float>> optimizer;
  int64_t optimizer_steps = 0;  ///< the fewest steps any shard's optimiser took
  /// Per worker, how far its positions are in these values: the least over the shards of the
  /// cursor its latest push applied there carried (a worker missing from any shard: 0).
  std::map<std::string, uint64_t> cursors;
};

/// Spawns the host for one job. It holds nothing until its first plan.
caf::actor spawn_shard_host(caf::local_actor& parent, std::shared_ptr<ShardHostInit> init);

}  // namespace tepdist::actors

#include <caf/allowed_unsafe_message_type.hpp>
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const tepdist::actors::ShardHostPlan>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const tepdist::actors::ShardGather>)

#pragma once
// The async mode's shard protocol, sans-IO: parameter servers without a server (Li et al., "Scaling
// Distributed Machine Learning with the Parameter Server", 2014; Downpour SGD), with bounded
// staleness and staleness-damped learning rates (Zhang et al., "Staleness-aware Async-SGD", 2016).
//
// The flat parameter buffer is cut into S contiguous shards (shard_range). Rendezvous hashing
// (placement.hpp) puts each on r workers: the primary holds it with its optimiser state and applies
// updates; the r - 1 replicas apply the same updates in the same order, so they hold bit-identical
// copies.
//
//   worker --ShardUpdate push (gradient, version it was computed on, lr, worker/boot/seq)--> primary
//   primary --ShardState (values at the new version, or rejected)--> worker
//   primary --ShardUpdate replicate (gradient, version it makes, lr applied, worker/boot/seq)--> each replica
//   replica --ShardUpdate ack (applied through version)--> primary
//   primary --ShardState durable (every holder has the updates through version)--> worker
//
// Durability. The primary answers a push with values at once, so a worker never waits for the
// replicas; the update is durable once every holder has applied it, and the primary then sends
// a separate durable notice to each worker whose update it was. Replication is a star, not a
// chain: the primary sends each replica every update in version order and each replica acks the
// version it has applied through (holding updates that come ahead of a gap), so the durable
// version is the lowest acked. The primary keeps each update until it is durable: a replication
// lost on the way (a send that timed out, a replica's buffer full) shows as a replica whose ack
// stands still behind the primary, and each tick (on_tick) sends such a replica again everything
// after its ack; a replica takes an update it already has as a duplicate, acked, not applied. A star gives the guarantee a chain gives (an update is
// acknowledged only once it is on all r holders; each holder holds a prefix of the primary's
// updates) in one round trip instead of r - 1 hops, which matters across regions. A worker keeps
// each update until it is durable, and after a change of primary (a re-placement, the primary's
// death) sends every update it still keeps to the new primary (retarget). Each update carries
// (worker id, boot id, sequence number); every holder keeps, per worker, the highest sequence
// applied (the marks, part of the shard's state and of its snapshot), so an update sent again
// that the new primary already holds is answered as a duplicate and not applied twice. So no
// acknowledged update is lost while at least one holder of the shard survives. One case is
// weaker: a push the old primary refused as too stale, whose refusal never arrived, is taken on
// resend for applied when a later update of the same worker is (the marks are high-water marks);
// it was never acknowledged, and its batches are lost to the shard.
//
// Staleness = the shard's version when the push arrives - the version the gradient was computed
// on. A push staler than max_staleness is not applied: it is counted and answered with the current
// values (rejected), and the worker recomputes those batches on them. An accepted push is applied
// with lr / (1 + staleness).
//
// Two ways to use it (AsyncWorker::Options::local_steps):
//   - gradients (0): each step's gradient is pushed, and the primary's optimiser applies it. Every
//     gradient is computed on values some versions old, and with W workers that is at least W - 1
//     versions: at a high learning rate with momentum, the delay costs accuracy (measured: 4 local
//     workers at staleness about 6 reach 64% after one epoch of Fashion-MNIST where one process at
//     the same damped rate reaches 81%; updates mode reaches 79%).
//   - updates (H >= 1; async local SGD, as in FedAsync, Xie et al. 2019): each worker's own
//     optimiser steps on its copy, and the change it made to each shard over H steps goes out as
//     a pseudo-gradient (minus the change) for the primary to apply with plain SGD at
//     min(1, outer_lr / (1 + staleness)) (max_lr 1: a change never counts more than once). A worker's own steps are never delayed; only the mixing of the
//     workers' progress is, and the damping turns it into a weighted average. On an answer the
//     worker takes the primary's values plus whatever of its own change the primary has not seen
//     yet. A refused update is not lost: it goes out again, based on the answer's version.
//     outer_lr 0 (auto) sends (1 + s) / W, s the staleness this worker's answers have reported
//     lately: each worker's progress then counts about 1/W on average whatever its usual staleness
//     (a far worker's as much as a near one's), and its staler pushes less than its fresher ones.
//
// A worker never waits for all shards at once: each shard has at most `window` pushes in flight
// from it, and gradients for a shard whose window is full are summed until a slot frees. So a far
// or paused primary slows only the pushes to it; the worker waits only when a shard has left
// max_lag_steps of its steps unanswered.
//
// Neither class owns a socket, thread or clock: they take messages in and append the messages to
// send. Anything that does not fit (another job, another shard, a wrong size, a non-finite value,
// a version from the future, an answer with nothing in flight) is refused with a reason, and
// changes nothing.

#include <cstdint>
#include <deque>
#include <expected>
#include <limits>
#include <map>
#include <optional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "compute/optimizer.hpp"
#include "gossip/wire/messages.hpp"

namespace tepdist::elastic {

struct ShardRange {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};

/// Shard s of a buffer of `elements` cut into `shards` contiguous ranges whose sizes differ by at
/// most one.
ShardRange shard_range(size_t elements, uint32_t shards, uint32_t s);

/// A message and the address it goes to.
template <class M>
using Outgoing = std::vector<std::pair<std::string, M>>;

/// How far one worker's updates to a shard have been applied: the worker's boot id and the highest
/// sequence number applied.
struct UpdateMark {
  uint64_t boot = 0;
  uint64_t seq = 0;
  friend bool operator==(const UpdateMark&, const UpdateMark&) = default;
};
using UpdateMarks = std::map<std::string, UpdateMark>;

/// A shard's whole state, for a new holder: values, version, optimiser state (each buffer, and
/// its step count) and marks.
struct ShardSnapshot {
  uint64_t version = 0;
  std::vector<float> values;
  std::vector<std::vector<float>> optimizer;
  int64_t optimizer_steps = 0;
  UpdateMarks marks;
};

/// A 64-bit digest (FNV-1a) of everything a snapshot holds: version, values and optimiser state
/// bit for bit, steps and marks. Two holders at one version of a shard hold the same state (each
/// applies its updates in version order), so equal digests let a holder keep its own copy rather
/// than fetch the source's; a copy that went another way at the same version (a side of a
/// partition that applied updates the other did not) differs, and is replaced. Never 0.
uint64_t state_digest(const ShardSnapshot& s);

/// One shard as its primary or a replica holds it.
class ShardServer {
 public:
  struct Options {
    uint64_t job_id = 0;
    uint32_t shard = 0;
    uint64_t max_staleness = 16;
    std::vector<std::string> replicas;  ///< addresses the primary forwards updates to
    /// The most lr / (1 + staleness) may be; updates mode: 1, never more than a worker's own change.
    float max_lr = std::numeric_limits<float>::infinity();
    /// Restored primary: the replica (one of `replicas`) that holds the very snapshot it starts
    /// from, the generation's source carrying on; it fetches nothing, so it acks nothing, and it
    /// counts as acked at the snapshot's version from the start.
    std::string source_replica;
  };

  /// `values`: the shard's initial values; `optimizer`: sized for them.
  ShardServer(Options options, std::vector<float> values, std::unique_ptr<compute::Optimizer> optimizer);
  /// A holder of a shard others held: from their snapshot (`optimizer` sized for its values, its
  /// state taken from the snapshot). A primary's replicas count as holding nothing until they
  /// ack (after fetching the snapshot), but for the source_replica: its durable version starts at
  /// 0 (without replicas, or with the source its only one: at the snapshot's).
  static std::expected<ShardServer, std::string> restore(Options options, ShardSnapshot snapshot,
                                                         std::unique_ptr<compute::Optimizer> optimizer);

  /// Primary: a worker's push, to be answered at `reply_to`. Returns the answer for the worker;
  /// appends the replicas' updates, and the durable notices that became due (none here unless the
  /// shard has no replica, when the answer itself says the update is durable).
  std::expected<gossip::ShardState, std::string> on_push(const gossip::ShardUpdate& push, const std::string& reply_to,
                                                          Outgoing<gossip::ShardUpdate>& to_replicas);

  /// Replica: the primary's update. Applied in version order: one from ahead waits (up to
  /// max_held_updates; past that it is dropped, and comes again) until those before it have come;
  /// one this replica already has or holds is not applied again. Returns the version applied
  /// through, for the ack to the primary.
  std::expected<uint64_t, std::string> on_replicate(const gossip::ShardUpdate& update);

  /// Primary: a replica at `replica` has applied every update through `version`. Appends a
  /// durable notice for each worker whose updates became durable.
  std::expected<void, std::string> on_ack(const std::string& replica, uint64_t version,
                                          Outgoing<gossip::ShardState>& notices);

  /// Primary, every resend interval (the shard host's: a second): for each replica that has acked
  /// before and whose ack has not moved since the last tick while this primary is ahead of it,
  /// appends every kept update after its ack, to send again.
  void on_tick(Outgoing<gossip::ShardUpdate>& resend);

  /// The values now (a pull's answer, also the shard's part of the final model).
  gossip::ShardState state() const;
  /// Everything a new holder needs.
  ShardSnapshot snapshot() const;

  uint64_t version() const { return version_; }
  /// Every update through this version is on every holder.
  uint64_t durable() const { return durable_; }
  uint64_t applied() const { return applied_; }
  uint64_t rejected() const { return rejected_; }
  uint64_t duplicates() const { return duplicates_; }
  /// Replications sent again (primary) / taken again and not applied (replica).
  uint64_t resent() const { return resent_; }
  uint64_t replicas_again() const { return replicas_again_; }
  std::span<const float> values() const { return values_; }
  const UpdateMarks& marks() const { return marks_; }

  static constexpr size_t max_held_updates = 256;
  /// Accepted updates not yet durable, kept for their notices: past this, pushes are refused
  /// until the replicas catch up (a replica that never acks is a change of placement's to mend).
  static constexpr size_t max_undurable = 4096;

 private:
  std::expected<void, std::string> check(const gossip::ShardUpdate& u) const;
  void apply(const gossip::ShardUpdate& u, float lr);
  void advance_durable(Outgoing<gossip::ShardState>& notices);

  Options o_;
  std::vector<float> values_;
  std::unique_ptr<compute::Optimizer> optimizer_;
  uint64_t version_ = 0, applied_ = 0, rejected_ = 0, duplicates_ = 0;
  uint64_t durable_ = 0;
  UpdateMarks marks_;
  std::map<uint64_t, gossip::ShardUpdate> held_;  // replica: updates from ahead, by version
  struct Replica {
    uint64_t acked = 0;          // applied through
    bool heard = false;          // has acked since this holder took the shard (its fetch is done)
    uint64_t acked_at_tick = 0;  // `acked` at the last tick
  };
  std::map<std::string, Replica> replicas_;       // primary: by address
  std::map<uint64_t, gossip::ShardUpdate> kept_;  // primary: each update after durable_, to send again
  uint64_t version_at_tick_ = 0;                  // primary: version_ at the last tick
  uint64_t resent_ = 0, replicas_again_ = 0;
  std::deque<std::pair<uint64_t, std::string>> undurable_;  // primary: (version, worker's address), oldest first
};

/// A worker's side: which batches to compute, what to push where, and the answers installed.
class AsyncWorker {
 public:
  struct Options {
    uint64_t job_id = 0;
    size_t elements = 0;
    uint32_t shards = 1;
    std::vector<std::string> primaries;  ///< address of each shard's primary
    uint32_t window = 2;                 ///< pushes in flight per shard
    uint64_t max_lag_steps = 16;         ///< steps a shard may leave unanswered before the worker waits
    uint32_t local_steps = 0;            ///< 0: push gradients; H: push the worker's own change every H steps
    uint32_t workers = 1;                ///< updates mode with outer_lr 0: W in (1 + s) / W
    std::string origin = {};             ///< this worker's id, and its boot id, on every push
    uint64_t boot = 0;
    /// Answered updates a shard may keep waiting for durability before the worker waits.
    uint64_t max_undurable = 64;
  };

  /// What to compute: a batch, for every shard, or (a rejected push recomputed) for one.
  struct Work {
    uint64_t batch = 0;
    int64_t only_shard = -1;
  };

  explicit AsyncWorker(Options options);

  /// Whether the worker may compute another step now (no shard lags max_lag_steps behind).
  bool may_step() const;
  /// A rejected batch to recompute, before any fresh one.
  std::optional<Work> take_redo();
  /// The gradient of `work`, computed on the parameters as they are now: summed into each shard's
  /// pending push, and pushed where the window allows.
  void on_gradient(const Work& work, std::span<const float> gradient, float lr, Outgoing<gossip::ShardUpdate>& out);
  /// Updates mode: the change one local optimiser step made to the parameters. Summed per shard,
  /// and pushed (as minus the change, with outer_lr; 0: auto) every local_steps steps where the
  /// window allows.
  void on_update(std::span<const float> change, float outer_lr, Outgoing<gossip::ShardUpdate>& out);
  /// Updates mode, after the last step: pushes what is left, however few steps it covers.
  void flush(Outgoing<gossip::ShardUpdate>& out);
  /// A primary's answer (the caller checks it came from that primary): its values go into
  /// params (in updates mode, plus this worker's change the primary has not applied yet); a push
  /// waiting for the window goes out.
  std::expected<void, std::string> on_state(const gossip::ShardState& state, std::span<float> params,
                                            Outgoing<gossip::ShardUpdate>& out);
  /// A shard's primary changed (a re-placement, a promotion): every update of this worker it
  /// still keeps (in flight, or answered but not durable) goes to the new primary, with its
  /// sequence number, so the new primary applies those it does not hold and no other.
  void retarget(uint32_t shard, const std::string& primary, Outgoing<gossip::ShardUpdate>& out);
  /// The job's generation this worker is in: every push (a resend too) is tagged with it.
  void set_generation(uint64_t generation) { generation_ = generation; }
  /// This worker's cursor in its positions, carried by the next pushes (the positions their
  /// steps consumed, counted as consumed should this worker die).
  void set_cursor(uint64_t consumed) { cursor_ = consumed; }

  /// Every gradient applied or refused and recomputed: nothing pending, in flight or to redo.
  bool idle() const;
  /// Every update this worker sent is durable.
  bool durable() const;
  /// Updates kept for shard s: in flight, or answered and not durable.
  size_t kept(uint32_t shard) const { return shards_[shard].sent.size(); }
  const std::string& primary(uint32_t shard) const { return o_.primaries[shard]; }

  uint64_t pushes() const { return pushes_; }
  uint64_t rejected() const { return rejected_; }
  uint64_t version(uint32_t shard) const { return shards_[shard].version; }
  /// The recent staleness of this worker's applied pushes (a moving average over answers).
  double recent_staleness() const { return recent_staleness_; }

 private:
  /// An update this worker sent and keeps until it is durable.
  struct Sent {
    uint64_t seq = 0, base = 0;
    float lr = 0;
    std::shared_ptr<const std::vector<float>> sum;  // what it carries
    std::vector<uint64_t> batches;                  // the batches (or local steps) it covers
    bool answered = false;
    uint64_t version = 0;  // answered: a version of the shard that holds it
    uint64_t consumed = 0;  // the worker's cursor when it was sent
  };
  struct Shard {
    ShardRange range;
    uint64_t version = 0;                         // of the values this worker holds
    uint64_t seq = 0;                             // of the last update sent
    std::deque<Sent> sent;                        // by seq: answered ones first, then those in flight
    bool retargeted = false;                      // a new primary has not answered yet: its version is unknown
    std::vector<float> pending;                   // summed gradients (or minus changes) not yet pushed
    std::vector<uint64_t> pending_batches;
    uint64_t pending_base = 0;                    // version the oldest of them was computed on
    float pending_lr = 0;
    uint64_t unanswered_steps = 0;                // steps since the last answer, while pushes are in flight
  };
  void try_push(uint32_t s, Outgoing<gossip::ShardUpdate>& out);
  gossip::ShardUpdate push_of(uint32_t s, const Sent& u) const;
  size_t in_flight(const Shard& sh) const;
  static void drop_durable(Shard& sh, uint64_t durable);

  bool updates() const { return o_.local_steps > 0; }

  Options o_;
  std::vector<Shard> shards_;
  std::deque<Work> redo_;
  uint64_t pushes_ = 0, rejected_ = 0;
  uint64_t local_step_ = 0;
  bool flushing_ = false;
  double recent_staleness_ = 0;
  uint64_t generation_ = 0, cursor_ = 0;
};

}  // namespace tepdist::elastic

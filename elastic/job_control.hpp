#pragma once
// Job control: how a job outlives its members. A sans-IO core: input is (now, view, message),
// output is messages to send and what changed; no sockets, clocks or actors, so the trainer actor
// drives it in production and tests and sims/ drive it under faults.
//
//   record      the job as every worker holds it: gossip::JobStart (config without the secret,
//               submitter, ring order with boot ids) plus the generation it installs, where the
//               generation resumes and who holds the state there (donors).
//   duty        the coordinator duty of a running job: the lowest id among the installed
//               generation's workers that this node's view holds live in the same run (boot id).
//               Only a node that holds the record can hold it (job_duty_holder below, the one rule).
//   propose     when the duty holder's view disagrees with the generation (a worker dead, left or
//               restarted; a live worker not in it), it proposes the next number above any it has
//               seen, with the live workers in id order, to each of them.
//   ack         a worker acknowledges a proposal numbered above anything it promised or
//               installed, unless the proposal builds on a generation older than its own. Acking
//               is a promise: no new step until an install (it pauses), and it reports where it
//               stands (progress) and whether it holds the job's state (a joiner does not).
//   install     once every proposed worker has acked and a quorum of the previous generation's
//               workers has (a majority, or any one for a cluster that cannot be partitioned;
//               workers that left gracefully no longer count; an ack counts only from the same
//               run, by boot id), the proposer installs: the record with the new workers, resume
//               = the furthest progress among the acks with state, donors = the ackers there. It
//               goes to every worker and the submitter. Nothing is rolled back: members behind
//               pull the state from the donors. A record with spans (gossip) gets new ones: the
//               rest of every old worker's list after its cursor (its own ack's, or for one gone
//               the furthest any acker saw it mix at), re-split among the new workers.
//   refuse      an older number, or one built on an older generation, is refused with the
//               refuser's highest number; the proposer proposes again above it.
//   lost        a proposal every worker acked, where none of the installed generation's workers
//               can hold the state any more (each left, runs again in another run, acked without
//               it, or, on a cluster that cannot be partitioned, is dead): the job cannot go on
//               without a checkpoint, and the duty holder says so (Output::lost) instead of
//               proposing again and again. A worker only unheard, or dead where a partition is
//               possible, may hold it: the proposer waits. Likewise for an async shard no acker
//               holds: the install waits while one of its holders (or the source they were
//               fetching it from) may still hold it, and says the job lost once none can.
//   evict       a worker that has waited step_timeout_s for a ring neighbour that membership still
//               holds live asks the duty holder to leave it out; it stays out, in the duty
//               holder's proposals, until it runs again with another boot id.
//   hand over   an async worker leaving gracefully asks to be left out itself (an evict naming
//               itself), listing the shards it holds with their versions, and stays until the
//               next generation's holders have fetched them: a shard no acker holds (its only
//               holder is the leaver, or its replicas were still fetching) takes the leaver as
//               its source in that install, instead of being lost.
//   placed      an async worker whose shard host has not yet placed the installed generation (it
//               places on its own thread, just after the worker enters it) does not know what it
//               holds: it promises a proposal but holds its ack back until the host has placed
//               (on_local), since an ack is what says which shards a holder has. Placing needs no
//               peer, so the wait is short and cannot wait on the proposal it holds up.
//   resend      the workers of a proposal that have not acked it are sent it again every
//               resend_ms (a proposal or an ack lost, a worker whose view did not yet hold the
//               proposer); a worker acks a proposal it has promised again, to its proposer only.
//   rebalance   (gossip and async, Options::rebalance) the duty holder follows how fast each
//               worker's cursor moves (its own, and the others' as mixings or pushes applied here
//               tell it) over the installed generation; its own without the time its evaluations
//               were under way (Local::evaluations). Once every worker's rate is measured over
//               rebalance_window_ms and their predicted ends (positions left / rate; its own plus
//               what its evaluations still to come cost) differ by more than rebalance_gap, it
//               proposes a generation of the same workers; every proposal then re-splits the rests
//               in proportion to the rates it knows (its own over what it has left, evaluations
//               included; a worker not measured gets the mean), so all end each epoch's part
//               together. Not while its own evaluation is under way (its cost is known only
//               after it, and the first comes as the first epoch part ends, often as the first
//               window does), for up to half a window. No sooner than
//               rebalance_window_ms after an install, and not for the last rebalance_window_ms of work.
//   decay       rank 0 decides a plateau decay of the rate (set_rate_factor); as duty holder it
//               proposes a generation of the same workers whose record carries the factor, so
//               every worker applies it from the same install (sync: the same step). Not once no
//               list has a position left: nothing it would change is left to train (a later
//               generation, should one come, carries it).
//   retry       a proposal not installed after retry_ms is proposed again, numbered higher; a
//               view change while proposing does it at once. A worker paused for retry_ms acks
//               its promise again to the proposer, which answers a repeated ack of a generation
//               it has installed with the record (an install lost on the way is not waited for
//               forever).
//
// Safety: a worker acks at most one proposal per number, and an install needs a majority of the
// previous generation, so two sides of a partition cannot both install a successor of one
// generation (with Quorum::any they could: only for clusters on one machine). Numbers only grow;
// a record with a number at or below the installed one changes nothing.

#include <cstdint>
#include <expected>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "elastic/progress.hpp"
#include "gossip/wire/messages.hpp"

namespace tepdist::elastic {

enum class Quorum { majority, any };

/// The coordinator rule of a running job, written once: the lowest id among `record`'s workers
/// that `view` holds live in the run the record names (a worker the view does not know yet counts
/// as live), passing over workers `excluded` (evicted) in the run the record names. Empty if none is.
std::string job_duty_holder(const gossip::JobStart& record, const std::vector<gossip::Member>& view,
                            const std::map<std::string, uint64_t>& excluded = {});

/// Where `record` says worker `id` listens; nullptr if it names no such worker.
const std::string* worker_address(const gossip::JobStart& record, const std::string& id);
/// The boot id `record` names for worker `id` (0 when it names none); ~0, a value no run has,
/// when `id` is not one of its workers.
uint64_t worker_boot(const gossip::JobStart& record, const std::string& id);
/// Whether two records have the same run of the same node as rank 0: a worker that reported done
/// keeps its done through a generation that does not change rank 0, and ends the job again under
/// one that does (the trainer, the submitter).
bool same_rank0(const gossip::JobStart& a, const gossip::JobStart& b);

/// Who should train according to `view`: every live member with the worker role, and the
/// record's workers the view does not know yet, in id order, with addresses, boot ids and regions.
struct Roster {
  std::vector<std::string> ids, addresses;
  std::vector<uint64_t> boot_ids;
  std::vector<std::string> regions;  ///< Member::region ("" where not known)
  friend bool operator==(const Roster&, const Roster&) = default;
};
/// `excluded`: workers evicted, by id with the boot id of the run that was evicted.
Roster desired_roster(const gossip::JobStart& record, const std::vector<gossip::Member>& view,
                      const std::map<std::string, uint64_t>& excluded = {});

class JobControl {
 public:
  struct Options {
    std::string self;
    uint64_t boot_id = 0;
    Quorum quorum = Quorum::majority;
    size_t min_workers = 1;   ///< no generation with fewer workers is proposed
    double retry_ms = 3000;   ///< a proposal not installed by then is made again, numbered higher
    double resend_ms = 500;   ///< until then, its workers that have not acked are sent it again this often
    int replication = 1;      ///< async: holders of each shard ([elastic] replication), to know who may hold one
    bool rebalance = false;   ///< gossip and async: re-split the positions by the workers' measured rates
    double rebalance_window_ms = 5000;  ///< rates are measured over at least this long
    double rebalance_gap = 0.08;        ///< predicted ends further apart than this fraction: rebalance
  };
  /// What this node holds, for its acks.
  struct Local {
    gossip::JobProgress progress;  ///< gossip: position is the cursor in this worker's list of spans
    bool has_state = false;
    std::vector<std::pair<std::string, uint64_t>> cursors = {};  ///< gossip: others', from mixings
    std::vector<std::pair<uint32_t, uint64_t>> held_shards = {};  ///< async: (shard, version) held here
    /// Async: this node's shard host has not placed the installed generation yet, so what it
    /// holds is not known and held_shards says nothing. Its ack waits until it is (on_local):
    /// taken for "holds none", a shard's only copy was lost (a node acking as it started the job).
    bool shards_unplaced = false;
    /// Rebalance: this worker's evaluations (rank 0's evaluator may share its core), so that its
    /// own rate is measured without them and its predicted end counts those still to come.
    struct Evaluations {
      double busy_ms = 0;           ///< time an evaluation was under way, in all (one under way counted)
      uint64_t busy_positions = 0;  ///< positions this worker trained in that time
      double cost_ms = 0;           ///< training time the last one took away (0: none measured)
      double under_way_ms = 0;      ///< how long the one under way has been (0: none is)
      bool at_epoch_ends = false;   ///< one at the end of each of its epoch parts but its list's last
      uint64_t every = 0;           ///< and one each this many positions (0: none)
    };
    Evaluations evaluations = {};
  };
  struct Output {
    std::vector<std::pair<std::string, gossip::Body>> sends;  ///< (address, body)
    bool installed = false;   ///< record() is a newer generation
    bool paused = false;      ///< this node acked a proposal: no new step until an install
    std::string dropped;      ///< this node is not a worker of the installed generation: why
    /// The job cannot go on: every worker of the installed generation is gone in the run it names
    /// (left, restarted, acked without the state, or dead on a cluster that cannot be
    /// partitioned), so no node holds the state. Why, naming each. Only the duty holder says it.
    std::string lost;
    std::vector<std::string> log;  ///< decisions worth a log line (proposed, refused, waiting)
  };

  explicit JobControl(Options options);

  /// This node is a worker of `record`'s generation from the start (the first assignment).
  void adopt(const gossip::JobStart& record);

  /// The view changed: the duty holder proposes if it disagrees with the generation.
  void on_view(double now, const std::vector<gossip::Member>& view, const Local& mine, Output& out);
  /// What this node holds became known (its shard host placed the generation): an ack it held
  /// back for that goes now.
  void on_local(double now, const Local& mine, Output& out);
  /// Time passed: a proposal that did not install is made again.
  void on_tick(double now, const Local& mine, Output& out);
  /// A vote from `from` (a member id; the transport authenticated it).
  void on_vote(double now, const std::string& from, const gossip::GenerationVote& vote, const Local& mine, Output& out);
  /// This worker waited too long for `id`, which membership holds live: the duty holder leaves it
  /// out of the next generation (this node, or the one it asks unless `forward` is false). This
  /// node passes `id`'s run over from then on, for the duty too (the accused may hold it).
  void evict(double now, const std::string& id, const Local& mine, Output& out, bool forward = true);
  /// The rate's plateau factor this node decided (rank 0): the next generation this node installs
  /// carries it; as duty holder it proposes one for it at the next tick.
  void set_rate_factor(double factor) { rate_factor_ = factor; }
  /// The submitter of a job that pauses between epochs released `epochs` of them: the next
  /// generation carries the count; the duty holder proposes one for it now (or, with a proposal
  /// under way, at a tick after it), a generation of the same workers at the same progress.
  void release(double now, uint32_t epochs, const Local& mine, Output& out);
  /// With parameters (a file the submitter has, which a worker that cannot read it fetches) and an
  /// optimiser the program set: the release's record carries them (JobStart::reset_*, optimizer).
  void release(double now, gossip::Release release, const Local& mine, Output& out);
  /// A record of a generation (from its proposer, or forwarded by a member that has it).
  std::expected<void, std::string> on_install(const gossip::JobStart& record, Output& out);

  bool has_record() const { return record_.generation > 0; }
  const gossip::JobStart& record() const { return record_; }
  /// Acked a proposal that has not installed: take no new step.
  bool paused() const { return promised_ > record_.generation; }
  uint64_t promised() const { return promised_; }
  /// The number of the proposal this node is collecting acks for (0: none).
  uint64_t proposing() const { return proposal_ ? proposal_->number : 0; }
  /// The duty holder's proposal, every ack in, waits (for a quorum, a worker holding the state, or
  /// a shard's holders, which may be across a partition: with a majority quorum, without a time
  /// limit): why, for the operator (the status). Empty: it does not.
  const std::string& stalled() const { return stalled_; }

 private:
  struct Proposal {
    uint64_t number = 0;
    double at = 0;
    double sent_at = 0;  // when it was last sent to the workers that had not acked
    gossip::GenerationVote vote;
    std::set<std::string> refused;  // workers that refused it: not sent it again
    Roster roster;
    std::map<std::string, gossip::GenerationVote> acks;  // by worker id
    std::vector<double> weights;  // rebalance: per roster worker, its rate (positions/s); empty: equal
  };
  /// A worker's cursor as the duty holder saw it move in the installed generation.
  /// (This node's own also leaves out the time its evaluations were under way, and what it
  /// trained meanwhile.)
  struct Rate {
    double first_at = -1, last_at = -1;
    uint64_t first = 0, last = 0;
    double first_busy_ms = 0, last_busy_ms = 0;
    uint64_t first_busy = 0, last_busy = 0;
    double per_ms() const;
  };
  /// Notes the cursors `mine` holds (every member's, each tick: the duty may move to it).
  void note_rates(double now, const Local& mine);
  /// `id`'s rate in positions per ms, once seen over half a rebalance window; else 0.
  double measured_rate(const std::string& id) const;
  /// What `id` has left of its list in the installed generation, as far as its cursor was seen.
  Spans rest_of(const std::string& id) const;
  /// Whether the installed generation gives any worker a position to train (always in sync,
  /// which has no lists).
  bool positions_left() const;
  /// Milliseconds of training this node's evaluations take from it over a list of `epoch_parts`
  /// parts of `positions` in all.
  double evaluations_ms(uint64_t epoch_parts, uint64_t positions) const;
  /// Why the installed generation's positions should be re-split now (empty: they should not).
  std::string imbalance(double now) const;
  /// Per worker of `roster`, its measured rate (the mean where not measured); empty when none is.
  std::vector<double> weights_for(const Roster& roster) const;
  /// The duty holder as this node sees it: the rule, passing over workers this node evicted.
  std::string duty_holder() const;
  bool holds_duty() const;
  void propose(double now, const Local& mine, Output& out);
  /// Acks the proposal `vote` from `from`, which this node has promised (to its address, if the
  /// view holds it).
  void ack_promise(double now, const std::string& from, const gossip::GenerationVote& vote, const Local& mine,
                   Output& out);
  void on_ack(const std::string& from, const gossip::GenerationVote& vote, Output& out);
  void try_install(Output& out);
  /// Why `id` (a worker of the installed generation, or a source outside it) cannot hold what
  /// `holds` asks of its ack any more: "left", "restarted", "holds none" (it acked without it) or
  /// "dead" (on a cluster that cannot be partitioned). Empty: it may hold it (it acked with it, or
  /// is not heard from, suspect, or dead across a partition).
  std::string gone_why(const Proposal& p, const std::string& id,
                       const std::function<bool(const gossip::GenerationVote&)>& holds) const;
  /// Why no worker of the installed generation can hold the state any more, naming each (empty:
  /// one may).
  std::string state_gone(const Proposal& p) const;
  /// Async: the shards `sources` names no source for. `lost`: those every holder of is gone, each
  /// with its holders and why; `waiting`: the first one a holder of may still hold (not heard
  /// from, suspect, or dead across a partition).
  struct ShardsUnheld {
    std::string lost, waiting;
  };
  ShardsUnheld shards_unheld(const Proposal& p, const std::vector<std::string>& sources) const;
  void install(const gossip::JobStart& record, Output& out);
  gossip::GenerationVote ack_of(uint64_t number, const Local& mine) const;
  /// Left out of the installed generation while running: tells the duty holder it runs (back).
  void say_back(Output& out) const;

  Options o_;
  gossip::JobStart record_;           // generation 0: none held
  std::vector<gossip::Member> view_;
  uint64_t promised_ = 0;             // the highest number acked or installed
  uint64_t highest_seen_ = 0;         // the highest number proposed, promised or installed anywhere we heard of
  std::optional<Proposal> proposal_;  // the duty holder's, while it collects acks
  std::string waiting_;               // why the duty holder does not propose (logged once)
  std::string stalled_;               // why its proposal, every ack in, is not installed (stalled())
  double quiet_until_ = 0;            // acked another node's proposal: no own proposal before this
  std::string promised_to_;           // the address of the proposer of promised_ (not this node's own)
  std::string promised_from_;         // the proposer of promised_ (this node, for its own)
  uint64_t job_id_ = 0;               // a joiner's: the job of the proposals it heard
  std::map<std::string, uint64_t> excluded_;  // evicted workers: id -> boot id of the evicted run
  static constexpr int max_strikes = 2;       // evictions of one run before its `back` is not taken
  struct Strikes {
    uint64_t boot = 0;  // the run they count for: another run starts afresh
    int count = 0;
    bool told = false;  // the log said once that it stays out
    bool asked = false;  // it asked to be left out itself (a leave, a failed setup), not evicted
  };
  std::map<std::string, Strikes> strikes_;    // by worker id
  // Async workers handing over before a graceful leave: the shards each holds, with versions;
  // sources for the next install only.
  std::map<std::string, std::vector<std::pair<uint32_t, uint64_t>>> handover_;
  double promised_at_ = 0;            // when the promise was made or last repeated
  bool ack_withheld_ = false;         // the ack of promised_ waits for Local::shards_unplaced to clear
  bool left_out_ = false;             // not a worker of the installed generation, though running
  double back_said_at_ = -1;          // when `back` was last said (-1: at the install; timed from the next tick)
  double rate_factor_ = 0;             // set_rate_factor's, until a record carries it (0: none)
  gossip::Release release_;            // the latest release, until a record carries it
  std::map<std::string, Rate> rates_;  // rebalance: by worker, in the installed generation
  double installed_at_ = -1;           // when this node installed it (-1: at the next tick)
  Local::Evaluations evaluations_;     // this node's, as the last tick said
};

}  // namespace tepdist::elastic

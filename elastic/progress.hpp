#pragma once
// Progress as a position in the epoch's permutation, and the learning rate as a function of the
// samples consumed: both keep their meaning when the number of workers changes.
//
//   sync step   covers the next W·b positions of the epoch's permutation (the last step of an
//               epoch may be short); rank r trains on the r-th run of b of them. With W fixed this
//               is exactly the split of elastic/coordination.hpp, so a job that never changes
//               trains as before, bit for bit. Within an epoch no position is used twice or
//               skipped, whatever W does from step to step.
//   rate        the schedule (warm-up, step, cosine) is read at the schedule step of the samples
//               consumed, counted in reference batches: epoch·⌈n/ref⌉ + ⌊position/ref⌋. The rate
//               is scaled with the global batch B by a rule: linear (B/ref), square root
//               (√(B/ref), Adam's usual), or none; ref is [optimizer] reference_batch, by default
//               the job's initial global batch, so a job that never changes keeps its rates. After
//               a change the scale ramps from the old batch's to the new one's over ramp_batches
//               global batches (the warm-up after a change). A cap bounds the scale (gossip's is
//               gossip_max_scale: its rule is sync's, up to rates measured to train).
//   gossip      each worker owns a list of spans (epoch, [begin, end)) and trains through it in
//               order, b positions a local step, never two epochs in one step. The first
//               generation gives worker r of W the r-th of W equal parts of every epoch. On a
//               change the rest of every old worker's list after its cursor (positions consumed;
//               for a worker gone, the cursor its last mixing carried: steps never mixed did not
//               count) is re-split, epoch by epoch, into equal contiguous shares of the new workers.
//               Within an epoch no position is used twice or skipped, whatever the changes.

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "compute/optimizer.hpp"
#include "gossip/wire/messages.hpp"

namespace tepdist::elastic {

/// Sync: positions [begin, end) of the epoch that `rank` of `world` trains on in the step at p.
std::pair<int64_t, int64_t> sync_slice(const gossip::JobProgress& p, int64_t n, int64_t batch, int64_t rank);
/// The same with each rank's share of the step's positions (elastic/balance.hpp): rank r trains
/// on the r-th run, of shares[r] positions; equal shares of batch are the slices above.
std::pair<int64_t, int64_t> sync_slice(const gossip::JobProgress& p, int64_t n, std::span<const int64_t> shares,
                                       int64_t rank);

/// Sync: where the job stands after the step at p (samples counts the whole global batch).
gossip::JobProgress after_sync_step(gossip::JobProgress p, int64_t n, int64_t world, int64_t batch);

/// Whether a job of `epochs` epochs (and at most max_steps steps, 0: no limit) is over at p.
bool job_finished(const gossip::JobProgress& p, int64_t epochs, int64_t max_steps);

/// A run of positions of one epoch's permutation.
struct Span {
  uint64_t epoch = 0, begin = 0, end = 0;
  friend bool operator==(const Span&, const Span&) = default;
};
using Spans = std::vector<Span>;

/// Spans to and from the wire's (epoch, begin, end) triples (gossip::JobStart::spans).
Spans spans_of(const std::vector<uint64_t>& triples);
std::vector<uint64_t> triples_of(const Spans& spans);

/// The first generation's lists: worker r of `workers` gets the r-th equal part of every epoch.
std::vector<Spans> initial_spans(int64_t n, int64_t epochs, int64_t workers);
/// Positions in a list.
uint64_t span_total(const Spans& spans);
/// What of `spans` is left after its first `consumed` positions.
Spans rest_after(const Spans& spans, uint64_t consumed);
/// How often the epoch changes along `spans`: the ends of epoch parts before the list's last.
uint64_t epoch_changes(const Spans& spans);
/// The rests of the old workers' lists re-split among `workers` new ones: epoch by epoch, the
/// epoch's rest in position order cut into `workers` contiguous shares of sizes differing by at
/// most one, or, with `weights` (one per new worker, > 0: their measured speeds), proportional to
/// them, so that all end each epoch's part together; each new list has the earlier epochs first.
std::vector<Spans> resplit(const std::vector<Spans>& rests, size_t workers, std::span<const double> weights = {});
/// The next local step after `consumed` positions of `spans`: up to `batch` positions, all of one
/// epoch, as [begin, end) pieces. count 0: the list is done.
struct StepSlice {
  uint64_t epoch = 0;
  std::vector<std::pair<uint64_t, uint64_t>> pieces;
  uint64_t count = 0;
};
StepSlice next_slice(const Spans& spans, uint64_t consumed, uint64_t batch);

/// Async and gossip: how far the whole job is, read from one worker's cursor, for the rate (the
/// schedule is read at the samples the job consumed, whatever the number of workers). The
/// generation's lists hold every position left (`left` in all); the job had consumed the rest of
/// its epochs x n before them. The lists are sized to the workers' speeds, so all move through
/// theirs alike, and a worker `consumed` positions into its own list of `own` puts the job at
/// done + consumed x left / own. (Counting a local step as a reference batch, as local steps do,
/// holds only while the world is the first generation's: more workers each step less often, and
/// a job that grew ended with its schedule short of the end.)
class JobPace {
 public:
  JobPace() = default;
  /// `lists`: the generation's (JobStart::spans), `rank`'s its own; `resume`: the record's, whose
  /// samples the ramp after a change counts from (RatePolicy::set_generation).
  JobPace(const std::vector<std::vector<uint64_t>>& lists, size_t rank, int64_t n, int64_t epochs,
          uint64_t reference, const gossip::JobProgress& resume);
  /// The job's progress with this worker `consumed` positions into its list: step in reference
  /// batches, epoch and position of the job's positions consumed, samples the record's plus the
  /// job's since.
  gossip::JobProgress at(uint64_t consumed) const;

 private:
  uint64_t n_ = 1, reference_ = 1, done_ = 0, left_ = 0, own_ = 0, resume_samples_ = 0;
};

/// Gossip's cap on the rate's scale against the reference batch (RatePolicy::for_mode).
inline constexpr double gossip_max_scale = 4.0;

class RatePolicy {
 public:
  struct Options {
    int64_t samples_per_epoch = 0;  ///< n
    int64_t reference_batch = 1;    ///< the global batch `lr` is meant for
    int64_t ramp_batches = 8;       ///< global batches over which a change's new scale is reached
    enum class Rule { linear, sqrt, none } rule = Rule::linear;
    double max_scale = 0;  ///< the scale never exceeds it; 0: no cap
  };
  /// "linear", "sqrt" or "none" ([optimizer] scaling_rule()).
  static Options::Rule rule_named(const std::string& name);
  /// The options for a job of `mode` ("sync", "async", "gossip") whose [optimizer] scaling rule is
  /// `rule`:
  /// - sync: the rule, uncapped;
  /// - async: none, whatever the rule. Every update is one worker's batch whatever the number of
  ///   workers (more workers make more updates and more staleness, which lr / (1 + staleness)
  ///   damps). Scaled up as sync's is, a fourth worker joining three at lr 0.05 ended the elastic
  ///   join test's job at 0.75-0.85 (10 runs), four from the start at 0.83-0.85;
  /// - gossip: the rule, its scale capped at gossip_max_scale. More replicas each take fewer steps
  ///   of the same data: held at the file's rate, 8 workers ended 2.5 points below 4 (bench/chaos.sh's
  ///   job fault-free, cosine; at twice the rate 0.65 below). 8 workers at 4 times the rate meant for
  ///   4 ended as 4 did; beyond that was not tried.
  static Options for_mode(const std::string& mode, const std::string& rule, int64_t samples_per_epoch,
                          int64_t reference_batch, int64_t ramp_batches);
  RatePolicy(compute::LrSchedule schedule, Options options);
  /// A generation starts at `resume` with global batch `global`; the one before had `previous`
  /// (0: none). Until then the scale is 1.
  void set_generation(const gossip::JobProgress& resume, int64_t previous, int64_t global);
  /// The rate of the step taken at p.
  float at(const gossip::JobProgress& p) const;
  /// The schedule step p counts as (reference batches consumed).
  int64_t schedule_step(const gossip::JobProgress& p) const;
  /// The factor on the schedule's rate for a global batch of `global` (the rule, then the cap).
  double scale_for(int64_t global) const;
  /// The plateau decays so far (JobStart::lr_factor; 0 or 1: none), on top of everything else.
  void set_factor(double factor) { factor_ = factor > 0 ? factor : 1.0; }
  double factor() const { return factor_; }

 private:
  compute::LrSchedule schedule_;
  Options o_;
  gossip::JobProgress since_;
  double from_scale_ = 1, to_scale_ = 1;
  int64_t ramp_global_ = 1;
  double factor_ = 1;
};

/// [optimizer] plateau_patience / plateau_factor: the rate decays by `factor` once the evaluated
/// loss has not improved on its best (by more than `threshold`, relative) for `patience`
/// evaluations in a row; the count starts again after each decay. Rank 0 runs it.
class PlateauPolicy {
 public:
  struct Options {
    int64_t patience = 0;  ///< 0: never decays
    double factor = 0.5;
    double threshold = 1e-3;
  };
  explicit PlateauPolicy(Options o) : o_(o) {}
  /// An evaluation's loss; the new total factor (current x factor) when it decays now.
  std::optional<double> on_evaluation(double loss, double current);

 private:
  Options o_;
  double best_ = std::numeric_limits<double>::infinity();
  int64_t bad_ = 0;
};

}  // namespace tepdist::elastic

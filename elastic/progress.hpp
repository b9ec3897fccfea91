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
//               is scaled linearly with the global batch (ref: the job's initial global batch, so
//               a job that never changes keeps its rates), and after a change the scale ramps from
//               the old batch's to the new one's over ramp_batches global batches.

#include <cstdint>
#include <utility>

#include "compute/optimizer.hpp"
#include "gossip/wire/messages.hpp"

namespace tepdist::elastic {

/// Sync: positions [begin, end) of the epoch that `rank` of `world` trains on in the step at p.
std::pair<int64_t, int64_t> sync_slice(const gossip::JobProgress& p, int64_t n, int64_t world, int64_t batch,
                                       int64_t rank);

/// Sync: where the job stands after the step at p (samples counts the whole global batch).
gossip::JobProgress after_sync_step(gossip::JobProgress p, int64_t n, int64_t world, int64_t batch);

/// Whether a job of `epochs` epochs (and at most max_steps steps, 0: no limit) is over at p.
bool job_finished(const gossip::JobProgress& p, int64_t epochs, int64_t max_steps);

class RatePolicy {
 public:
  struct Options {
    int64_t samples_per_epoch = 0;  ///< n
    int64_t reference_batch = 1;    ///< the global batch `lr` is meant for
    int64_t ramp_batches = 8;       ///< global batches over which a change's new scale is reached
  };
  RatePolicy(compute::LrSchedule schedule, Options options);
  /// A generation starts at `resume` with global batch `global`; the one before had `previous`
  /// (0: none). Until then the scale is 1.
  void set_generation(const gossip::JobProgress& resume, int64_t previous, int64_t global);
  /// The rate of the step taken at p.
  float at(const gossip::JobProgress& p) const;
  /// The schedule step p counts as (reference batches consumed).
  int64_t schedule_step(const gossip::JobProgress& p) const;

 private:
  compute::LrSchedule schedule_;
  Options o_;
  gossip::JobProgress since_;
  double from_scale_ = 1, to_scale_ = 1;
  int64_t ramp_global_ = 1;
};

}  // namespace tepdist::elastic

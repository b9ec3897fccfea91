#pragma once
// The coordinator's decisions and the sync mode's data split, as plain functions of the view:
// no actors, sockets or clocks, so they are tested directly and every node computes the same
// answer from the same inputs.
//
//   coordinator  the lowest live id among members with the coordinator role; a node obeys a job
//                only from that id in the run (boot id) its view knows
//   ring order   the live members with the worker role, sorted by id; rank k is the k-th
//   data         every epoch all workers draw the same permutation of the training samples (seeded
//                by job seed and epoch); global step i covers its samples [i·W·b, (i+1)·W·b), and
//                rank k trains on the k-th run of b of them. The partitions are disjoint, and N
//                workers at batch b see exactly what one process at batch N·b would.

#include <cstdint>
#include <expected>
#include <string>
#include <utility>
#include <vector>

#include "gossip/wire/messages.hpp"

namespace tepdist::elastic {

bool has_role(const gossip::Member& m, const std::string& role);
bool is_live(const gossip::Member& m);

/// The one rule for who holds a duty (assigning jobs, proposing generations, rank 0's evaluation):
/// the lowest id among the live candidates, as each node's own view sees them. Every place that
/// picks a duty holder (coordinator_in here, job_duty_holder in job_control.hpp, the simulator's
/// check in sims/) offers its candidates to one of these, so the rule is written once.
class LowestLiveId {
 public:
  /// Offers a candidate; ignored unless live. The id must outlive this object.
  void offer(const std::string& id, bool live) {
    if (live && (!best_ || id < *best_)) best_ = &id;
  }
  /// The holder, or nullptr when no live candidate was offered.
  const std::string* holder() const { return best_; }

 private:
  const std::string* best_ = nullptr;
};

/// The lowest live id with the coordinator role, or nullptr if there is none.
const gossip::Member* coordinator_in(const std::vector<gossip::Member>& view);

/// The coordinator's answer to a submitted job: the ring order and addresses filled in, signed by
/// `self` with the boot id its view holds for it. Fails, saying why, when this node is not the
/// coordinator of its view or no live member has the worker role.
std::expected<gossip::JobStart, std::string> assign_job(gossip::JobStart request, const std::vector<gossip::Member>& view,
                                                        const std::string& self);

/// Whether a node whose view is `view` obeys this assignment: it comes from the coordinator of the
/// view, in the run of it (boot id) the view knows; any incarnation of that run will do.
std::expected<void, std::string> check_assignment(const gossip::JobStart& job, const std::vector<gossip::Member>& view);

/// The ring members `view` knows to be dead or left or to have restarted (another boot id), and
/// live workers that are not in the ring (joined since): each as "id (state)" for an error message. A ring member the view does not know
/// yet is no change. Empty: the ring is intact.
std::vector<std::string> ring_changes(const gossip::JobStart& job, const std::vector<gossip::Member>& view);

/// Global steps in one epoch of n samples, W workers, batch b each (the last may be short).
int64_t sync_steps_per_epoch(int64_t n, int64_t workers, int64_t batch);

/// Positions [begin, end) in the epoch's permutation that rank trains on at step_in_epoch.
std::pair<int64_t, int64_t> sync_batch_slice(int64_t n, int64_t workers, int64_t batch, int64_t step_in_epoch,
                                             int64_t rank);

}  // namespace tepdist::elastic

#pragma once
// The trainer: a worker node's training engine for the sync, async and gossip modes, and the
// coordinator's control plane when this node is the coordinator. One detached actor (its own
// thread: a step's forward and backward pass blocks it, and frames wait in its mailbox meanwhile).
// What follows describes sync; async (with a shard host, actors/roles/shard_host.hpp) and gossip
// differ in what a step does, as docs/architecture.md says ("Async and gossip training"). Each
// mode is one driver behind one interface (trainer/job.hpp, Driver).
//
//   submitter --JobStart--> coordinator   (assign_job: ring order = live workers by id)
//   coordinator --JobStart--> every worker (check_assignment: obeyed only from the coordinator)
//   worker r --RingChunk--> worker r+1     (gossip/collective/ring_allreduce.hpp, every step)
//   rank 0 --JobReport progress / evaluation, ParamPush final model--> submitter
//   every worker --JobReport done (checksum, bytes sent) or failed (why, naming the node)--> submitter
//
// Each step a worker computes the gradient of its slice of the global batch (elastic/coordination.hpp),
// and the ring sums [gradient x samples, loss x samples, samples] over the workers; every worker then
// divides by the samples and applies the same optimiser step, so the replicas stay bit-identical.
// Rank 0, which is the coordinator when every node has both roles, evaluates a snapshot of the
// parameters every [job] eval_every_steps steps and at epoch ends in a second actor, so
// evaluation never holds up the ring.
//
// Sync and gossip jobs are elastic (elastic/job_control.hpp, docs/architecture.md "Elastic job
// control"): a worker that dies, leaves, restarts or joins makes the duty holder propose the next
// generation; members ack (and pause), the install rebuilds the ring, and members behind or
// joining pull the state from the donors (elastic/state_transfer.hpp). A worker left out of a
// generation keeps the job's record and waits to be proposed again. A ring neighbour that
// membership holds live but that does not move for step_timeout_s is left out (evicted). Async
// jobs still end on a change, saying so. A node without the job that is proposed as a worker acks
// as a joiner and starts the job from the record it is sent. The router hands the trainer frames
// as (wire_atom, peer, address, Message) and the membership as (view_atom, members) on every change.

#include <caf/actor.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "actors/atoms.hpp"
#include "actors/router.hpp"
#include "actors/supervisor.hpp"
#include "gossip/metrics/registry.hpp"
#include "gossip/transport/transport.hpp"

namespace tepdist::actors {

struct TrainerOptions {
  gossip::Transport* transport = nullptr;
  std::string cluster_id;
  std::string self_id, self_address;
  uint64_t incarnation = 0;
  /// Kernel threads on this node (the launcher gives each local node its share of the cores);
  /// 0: the job's [compute] threads.
  int64_t threads = 0;
  int64_t max_frame_kb = 64 << 10;  ///< the largest frame this node accepts: ring chunks must fit
  uint64_t boot_id = 0;             ///< this run of the node's process (job control tells restarts by it)
  /// Where rank 0 saves a job whose submitter is gone: RESULTS_DIR/JOB_ID/ ([cluster] results_dir).
  std::string results_dir = "tepdist-results";
  /// Emulation of a slower node ([compute] slowdown, read from the node's own file): after a
  /// step's compute the trainer sleeps (slowdown - 1) times what it took. Nothing else reads it.
  double slowdown = 1;
  /// The node's registry: the trainer records its training figures there (tepdist_train_*,
  /// tepdist_worker_*, tepdist_learning_rate) for /metrics. Null: not recorded.
  gossip::MetricsRegistry* metrics = nullptr;
  /// The CUDA device of this node ([nodes.NAME] device in the node's own file), over the job's
  /// [compute] device; -1: the job's.
  int64_t device = -1;
};

/// The role "trainer" under the supervisor. Its snapshot is only the boot id it runs under: a
/// restarted trainer has lost its job, so it takes a new boot id and has the router announce it
/// (Swim::new_boot); members then see the node as restarted, and job control takes it back into
/// the running job as a joiner that pulls the state, as after a process restart.
/// It registers with the router (job_atom) each time it starts.
RoleSpec trainer_role(TrainerOptions options, caf::actor router);

}  // namespace tepdist::actors

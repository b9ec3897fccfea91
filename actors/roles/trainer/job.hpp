#pragma once
// The trainer role's insides, shared by its files (actors/roles/trainer.hpp is the role's public
// face). One job at a time: the Job struct below, driven by the actor in trainer.cpp; each mode a
// Driver (below) in sync.cpp, async.cpp and gossip.cpp, holding the mode's own state; generations
// and state transfer (job control) in generations.cpp; rank 0's evaluation in evaluation.cpp; what
// every mode shares in job.cpp.

#include "actors/roles/trainer.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/local_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <fmt/format.h>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <deque>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include "actors/atoms.hpp"
#include "actors/router.hpp"
#include "compute/backends.hpp"
#include "compute/io/checkpoint.hpp"
#include "compute/io/files.hpp"
#include "compute/optimizer.hpp"
#include "compute/resident.hpp"
#include "compute/train.hpp"
#include "elastic/balance.hpp"
#include "elastic/checkpoints.hpp"
#include "elastic/coordination.hpp"
#include "elastic/job.hpp"
#include "elastic/job_control.hpp"
#include "elastic/job_files.hpp"
#include "elastic/progress.hpp"
#include "elastic/state_transfer.hpp"
#include "actors/roles/shard_host.hpp"
#include "elastic/async_shards.hpp"
#include "elastic/placement.hpp"
#include "gossip/collective/gossip_average.hpp"
#include "gossip/collective/ring_allreduce.hpp"

namespace tepdist::actors::trainer_detail {

using Clock = std::chrono::steady_clock;
using step_atom = caf::atom_constant<caf::atom("step")>;
using eval_atom = caf::atom_constant<caf::atom("eval")>;
using retire_atom = caf::atom_constant<caf::atom("retire")>;  ///< frees the jobs dropped by the last message
using gossip::JobReport;

inline double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
/// The calling thread's CPU time, seconds (CLOCK_THREAD_CPUTIME_ID).
inline double thread_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

struct Job;
struct TrainerState;
using Trainer = caf::stateful_actor<TrainerState>;

/// One mode's part of a job, behind one interface: the actor (trainer.cpp), job control
/// (generations.cpp) and evaluation call every mode the same way, and each mode's state lives in
/// its driver, not in the Job. Drivers: sync.cpp (a ring all-reduce every step), gossip.cpp
/// (pairwise averaging, one final average), async.cpp (sharded parameters). Methods take the job
/// they belong to; a job that fails inside one is retired, not destroyed, until the message
/// handler returns (drop_job), so `j` and the driver stay valid to the end of the call.
class Driver {
 public:
  virtual ~Driver() = default;
  virtual const char* name() const = 0;
  /// The mode's own set-up, after the job's model, data, optimiser and rate are made.
  virtual std::expected<void, std::string> setup(Trainer* self, Job& j) = 0;
  /// Whether job control drives the job through membership changes (async: part 2 of elastic
  /// training; until then a change ends it, saying so).
  virtual bool elastic() const { return true; }
  /// The next step, if this worker may take one now (else it waits for what unblocks it).
  virtual void step(Trainer* self, Job& j) = 0;
  /// A step is under way that a drain waits for (sync: sent its part, waits for the sum).
  virtual bool mid_step(const Job&) const { return false; }
  /// Where this worker is, in reference steps (sync: the job's progress, alike on every member).
  virtual gossip::JobProgress progress(const Job& j) const = 0;
  /// Where the rate is read (RatePolicy::at): the job's samples consumed. Sync's progress is the
  /// job's; async and gossip estimate it from this worker's cursor (elastic::JobPace).
  virtual gossip::JobProgress rate_progress(const Job& j) const { return progress(j); }
  /// What job control is told of this worker's progress and state.
  virtual elastic::JobControl::Local local(const Job& j) const = 0;
  /// The status answer's progress and per-worker positions.
  virtual void add_status(const Job& j, const std::string& self_id, gossip::JobStatus& st) const = 0;
  /// The mode's own wire messages (ShardState, GossipAverage): false if not the mode's.
  virtual bool on_message(Trainer*, Job&, const std::string& /*peer*/, const gossip::Body&) { return false; }
  /// The mode's own control commands: false if not the mode's.
  virtual bool on_control(Trainer*, Job&, const std::string& /*peer*/, const gossip::Control&) { return false; }
  /// A chunk of this generation moved the ring (sync's step, gossip's final average).
  virtual void ring_moved(Trainer*, Job&) {}
  /// What waits on the previous worker in the ring now ("step", "the final average after step"),
  /// for the step timeout and its ring check; null: nothing does.
  virtual const char* ring_wait(const Job&) const { return nullptr; }
  /// Past the step timeout and not waiting on the ring: why the job is stuck (async: shard
  /// answers), or empty.
  virtual std::string stalled(const Job&) const { return {}; }
  /// Ends without a barrier (async, gossip's final average): rank 0 tells the submitter it is alive.
  virtual bool ending(const Job&) const { return false; }
  /// Each tick while a job ends: what the mode repeats, should a message be lost.
  virtual void keep_ending(Trainer*, Job&) {}
  /// Rank 0's evaluation reached the target (stop_at_target). Called once.
  virtual void on_target(Trainer*, Job&) {}
  /// The epochs done at a hold this worker has reached but not entered yet (gossip: the replicas'
  /// average for it still under way); a release installed meanwhile ends that hold too.
  virtual std::optional<uint64_t> hold_reached(const Job&) const { return std::nullopt; }
  /// The installed generation's part for the mode (rings, pairs, positions); an error fails the job.
  virtual std::expected<void, std::string> enter(Trainer* self, Job& j) = 0;
  /// Behind the generation's resume point although it holds state: it pulls.
  virtual bool behind(const Job&) const { return false; }
  /// The step the state is pulled at (a donor holds that state), and served at for a pull of `asked`.
  virtual uint64_t pull_step(const Job&) const { return 0; }
  virtual uint64_t serve_step(const Job&, uint64_t asked) const { return asked; }
  /// The state is pulled: the mode takes the generation's resume point.
  virtual void pulled(Job&) {}
  /// Left out of the installed generation: what pointed into it goes.
  virtual void left(Job&) {}
  virtual void add_counters(const Job&, gossip::JobReport&) const {}
  /// Samples the job trained on, for the final rate (sync: the cluster's; others: this worker's).
  virtual uint64_t samples_trained(const Job& j) const;
  /// The job's samples as rank 0's reports count them (sync: exact; others: its own times the world).
  virtual uint64_t job_samples(const Job& j) const;
  /// The first generation of a job resumed from a checkpoint (elastic.resume_from): the model
  /// and optimiser hold its state; the mode takes where the job stood (sync: its progress and
  /// the generation's resume point; gossip and async: the positions left, re-split), or says
  /// why it cannot.
  virtual std::expected<void, std::string> resume(Job& j, const compute::TrainingState& state) = 0;
  /// Draining (a graceful leave), after the step under way: whether the node must stay until what
  /// only it holds is handed over (async: its shards, to the next generation's holders). Asked
  /// again at every tick and event until false; the node's drain is bounded (30 s) all the same.
  virtual bool hand_over(Trainer*, Job&) { return false; }
  /// Async: rank 0's shard host gathered every shard for a checkpoint (or says why not).
  virtual void on_gathered(Trainer*, Job&, const ShardGather&) {}
  /// The job ends here: actors the mode started go.
  virtual void drop(Trainer*) {}
  /// The actor serving this node's shards, if the mode has one (its updates skip the wire).
  virtual caf::actor local_shards() const { return {}; }
};

/// Rank 0's cluster checkpoints, every mode alike ([elastic] checkpoint_every_steps / _s,
/// checkpoint_dir; elastic/checkpoints.hpp writes them): when one is due, and where it goes.
class Checkpoints {
 public:
  void setup(const std::string& results_dir, const Job& j);
  bool enabled() const { return policy_ && policy_->enabled(); }
  /// Whether one is due after step `step` (or at the job's end, `over`); if so it counts as taken.
  bool take(int64_t step, bool over);
  /// A resumed job: the next one falls where it would have without the stop.
  void resumed(int64_t step);
  /// Writes `state` of `model` and `optimizer`, `began` when the cut was made; logged, and a
  /// failure does not end the job.
  void write(const Job& j, compute::Model& model, compute::Optimizer& optimizer, const compute::TrainingState& state,
             Clock::time_point began) const;

 private:
  std::optional<elastic::CheckpointPolicy> policy_;
  std::filesystem::path dir_;
};

std::unique_ptr<Driver> make_sync_driver();
std::unique_ptr<Driver> make_gossip_driver();
std::unique_ptr<Driver> make_async_driver();

/// A pull of the state for a generation not installed here yet: who asked (id, address) and what.
struct EarlyPull {
  std::string peer, from;
  gossip::StatePull pull;
};

struct Job {
  gossip::JobStart start;  // the record of the generation this worker trains in
  elastic::JobConfig config;
  std::unique_ptr<Driver> driver;
  uint32_t rank = 0, world = 1;
  std::string prev_id, next_address;
  // Job control (sync and gossip): generations, and the state this worker holds.
  std::unique_ptr<elastic::JobControl> control;
  uint64_t generation = 1;
  bool has_state = true;         // false: a joiner, or a member behind, until it has pulled the state
  bool member = true;            // a worker of the installed generation (false: left out of it; waits)
  bool stepped_in_generation = false;  // the first step of each generation is logged (bench/chaos.sh times it)
  std::optional<elastic::StatePuller> pulling;
  // Pulls from workers of the generation this worker acked but has not installed yet (the
  // install reached the puller first): served once it is installed (bounded).
  std::vector<EarlyPull> early_pulls;
  std::optional<elastic::RatePolicy> rate;
  Checkpoints checkpoints;  // rank 0 writes them
  // The ring (sync: every step; gossip: the final average), and its chunks of a generation this
  // worker has not installed yet (a faster member started it).
  std::optional<gossip::collective::RingAllReduce> ring;
  std::vector<std::pair<std::string, gossip::RingChunk>> ahead;
  size_t ahead_bytes = 0;
  std::vector<float> buffer;  // sync: [gradient x samples, loss x samples, samples, stop votes]; gossip: parameters, vote to end;
                              // async updates: the parameters before a step, then the step's change
  elastic::JobData data;
  std::unique_ptr<compute::Model> model;
  std::unique_ptr<compute::Backend> backend;
  std::unique_ptr<compute::Optimizer> optimizer;  // null while `resident` holds the state
  // Sync and gossip on a backend that keeps the training state itself (cuda; [compute]
  // emulate_device): the parameters, gradient and optimiser state live there, and the model's
  // buffers and resident->optimizer()'s are the host's copy, the state only after state_to_host().
  // Null: the host's buffers are the state (async always: its shards are the parameters, pulled
  // and pushed over the wire every step).
  std::unique_ptr<compute::ResidentState> resident;
  // With `resident`: the host's copy of the parameters, and of the optimiser's buffers, is the
  // state as it is now; and the resident parameters have every write made to the host's copy
  // (false after host_parameters_to_write, until parameters_to_device). Never both stale.
  bool host_parameters = true, host_optimizer = true, resident_parameters = true;
  compute::Optimizer& opt() { return resident ? resident->optimizer() : *optimizer; }
  std::optional<compute::LrSchedule> schedule;
  std::string optimizer_applied;  // JobStart::optimizer as applied here (empty: the config's own)
  std::string compute_path;       // the backend's path for the job's batch, where the host's buffers are the state
  std::vector<int64_t> order;  // the shuffled sample indices of epoch order_epoch
  int64_t order_epoch = -1;
  uint64_t tensor_bytes = 0;   // async and gossip: payload bytes sent outside the ring
  uint64_t ring_bytes_early = 0;  // sync: ring bytes sent during the backward pass (ring_early())
  int64_t step = 0, epoch = 0, steps_per_epoch = 0, total_steps = 0;
  uint64_t own_samples = 0, window_samples = 0;
  double loss = 0;
  compute::LossScratch scratch;
  compute::Tensor x;
  std::vector<int32_t> y;
  std::optional<Clock::time_point> first_step;
  Clock::time_point last_step_end, window_start;
  Clock::time_point waiting_since;  // when this worker last began waiting for others
  Clock::time_point progress_at;    // when others last moved it on: the step timeout's mark
  // Past the step timeout, before evicting the previous worker: whether its trainer still takes
  // messages. One that answers waits on a worker before it (which its own next worker evicts);
  // one that does not is the one that blocks the ring.
  struct RingCheck {
    Clock::time_point mark;  // the progress_at it was asked at: a stale one is asked again
    Clock::time_point sent;
    uint64_t nonce = 0;
    bool answered = false;
  };
  std::optional<RingCheck> ring_check;
  double compute_seconds = 0, ring_seconds = 0;  // where the steps' time went
  // Load: this worker's measured speed (every step's compute, the emulated slowdown included), and
  // the generation's workers' speeds and shares as the last step knew them (sync; rank order).
  double slowdown = 1;  // TrainerOptions::slowdown
  elastic::SpeedMeter speed;
  std::vector<double> speeds;
  std::vector<int64_t> shares;
  // The figures /metrics shows (TrainerOptions::metrics), looked up once per job; null: none kept.
  struct Figures {
    gossip::Counter* steps = nullptr;
    gossip::Counter* samples = nullptr;
    gossip::Gauge* loss = nullptr;
    gossip::Gauge* lr = nullptr;
    gossip::Gauge* speed = nullptr;
    gossip::Gauge* share = nullptr;
    gossip::Gauge* generation = nullptr;
    gossip::Histogram* step_seconds = nullptr;
    /// Async: the staleness of each of this worker's pushes a primary applied, and the recent mean.
    gossip::Histogram* staleness = nullptr;
    gossip::Gauge* recent_staleness = nullptr;
    gossip::MetricsRegistry* metrics = nullptr;
  } figures;
  Clock::time_point figures_at;  // the end of the step the figures last counted
  uint64_t figures_samples = 0;  // own_samples as they last counted it
  Clock::time_point status_at;   // the step end the router last heard the status at
  // What the status shows of the job's course (bounded): this worker's training, about a point a
  // second; rank 0's evaluations; the generations this worker installed.
  std::deque<gossip::ProgressPoint> history;
  Clock::time_point history_at;
  uint64_t history_samples = 0;
  std::deque<gossip::EvaluationPoint> evaluations;
  std::deque<gossip::GenerationMark> marks;
  static constexpr size_t history_points = 240, evaluation_points = 256, generation_marks = 64;
  // [optimizer] plateau_patience (only rank 0 evaluates, so only its policy sees losses), and the
  // factor last decided or installed (the record carries it).
  std::optional<elastic::PlateauPolicy> plateau;
  double decided_factor = 1;
  double resumed_factor = 1;  // the checkpoint's, for a job resumed from one (until a record carries it)
  /// The plateau factor in effect: the record's, or the checkpoint's this job resumed from.
  double lr_factor() const { return std::min(start.lr_factor > 0 ? start.lr_factor : 1.0, resumed_factor); }
  // Rank 0.
  caf::actor evaluator;
  int pending_evals = 0;
  int64_t last_eval_step = -1;
  double last_accuracy = 0, last_test_loss = 0, eval_seconds = 0;
  // What evaluations cost this worker's training (its evaluator may share its core), for job
  // control's rates (gossip, async): the time an evaluation was under way in all, the samples
  // trained meanwhile, and the training time the last one took away (its time less what was
  // trained in it at the speed measured just before; 0 until one is measured).
  struct EvalLoad {
    double busy_s = 0;
    uint64_t busy_samples = 0;
    double cost_s = 0;
    Clock::time_point began{};
    uint64_t began_samples = 0;
    double began_speed = 0;
  } eval_load;
  bool target_reached = false;  // stop_at_target: rank 0 votes to stop in the next ring (sync), or tells
                                // the workers to stop after the step under way (async, gossip)
  bool finishing = false;
  // Not rank 0, finishing: when this worker reported done. It keeps the job (its job control, the
  // async shards) until rank 0 says the job is complete, so that a rank 0 that dies before its
  // own done is replaced by a generation of the rest, which ends the job again; at most
  // step_timeout_s, should that word be lost.
  Clock::time_point done_at{};
  // When rank 0's job_complete came before this worker's own done (its last ring chunk still on
  // the way, or a joiner of the job's last moments that will never end it): it goes at its done,
  // or a few seconds on (TrainerState::complete_grace_s).
  Clock::time_point completed_at{};
  // [job] pause_between_epochs: this worker waits at the end of the epochs released so far
  // (j.start.released_epochs) until a generation releases more; rank 0 has sent the model.
  bool held = false;
  bool held_reported = false;  // rank 0: the model and the held report went out for this hold
  uint64_t held_epochs = 0;    // the epochs done at this hold
  uint64_t reset_in = 0;       // the generation whose install took parameters the program set (async: the shards take them too)
  uint64_t held_ticks = 0;     // rank 0: ticks held (the model goes again now and then)
  bool detached = false;  // the submitter is gone: the job goes on, and rank 0 saves the model here

  double train_seconds() const { return first_step ? seconds_between(*first_step, last_step_end) : 0.0; }
  size_t elements() const { return model->parameters().size(); }
  uint64_t bytes_sent() const { return (ring ? ring->bytes_sent() : 0) + tensor_bytes; }
  /// The fraction of the ring's bytes (this generation's) that left while the backward pass of
  /// their step went on (job.ring_overlap, sync); 0 without a ring.
  double ring_early() const {
    return ring && ring->bytes_sent() ? static_cast<double>(ring_bytes_early) / static_cast<double>(ring->bytes_sent()) : 0.0;
  }
};

inline uint64_t Driver::samples_trained(const Job& j) const { return j.own_samples; }
inline uint64_t Driver::job_samples(const Job& j) const { return j.own_samples * j.world; }

struct TrainerState {
  TrainerOptions o;
  caf::actor router;
  std::vector<gossip::Member> view;
  std::unique_ptr<Job> job;
  // Jobs dropped during the message being handled: kept until it returns (retire_atom), so that
  // whatever that handler still holds of them stays valid.
  std::vector<std::unique_ptr<Job>> retired;
  // Chunks of a job not started here yet (a faster neighbour was told first), with their senders;
  // bounded in bytes, and only for jobs newer than any this node has run.
  std::vector<std::pair<std::string, gossip::RingChunk>> stash;
  size_t stash_bytes = 0;
  uint64_t last_job = 0;
  std::optional<gossip::JobStart> pending;  // submitted, waiting for this view to hold its workers
  std::string pending_from;
  Clock::time_point pending_since;
  // An assignment from a coordinator this view does not know as such yet (gossip of its arrival,
  // or of an older coordinator's end, has not come): held until the view catches up or the
  // deadline passes, then obeyed or refused with the reason.
  std::optional<gossip::JobStart> held;
  Clock::time_point held_since;
  // A node without the job that was proposed as a worker of a running one (a joiner, a restarted
  // node, a worker that was dropped): its votes, until the install makes it a worker.
  std::unique_ptr<elastic::JobControl> joining;
  Clock::time_point joining_since;
  static constexpr double joining_limit_s = 60;  // a proposal whose install never comes is forgotten
  std::set<uint64_t> ended_jobs;  // finished, failed or abandoned here: never joined again
  std::set<uint64_t> declined_jobs;  // of those, the ones this node could not set up as a joiner
  Clock::time_point started = Clock::now();
  static constexpr double held_limit_s = 10;
  static constexpr double pending_limit_s = 30;  // how long a submission waits for this view
  // A job this node lacks files of (it cannot read them where its config says): fetched from the
  // submitter before the job starts here (files.cpp). Then, for the job's set-up, where this node
  // has each of the record's files (same order; the config's path where it reads them there).
  struct Fetching {
    gossip::JobStart start;
    bool has_state = false;
    bool for_reset = false;  // the parameters a release carries: the generation is entered once here
    std::optional<elastic::FileFetcher> fetcher = {};  // over the files missing here (fetch order)
    std::vector<size_t> index = {};                    // per fetched file: its index in start.files
    std::vector<int> fds = {};                         // per fetched file: its part file, open
    std::vector<std::string> fetched = {};             // per fetched file: where it is, once whole
    Clock::time_point since = {};
  };
  std::optional<Fetching> fetching;
  uint64_t local_files_job = 0;
  std::vector<std::string> local_files;
  bool ticking = false;
  // Fault injection (SIGRTMIN+3 to the node): as rank 0, this process dies (SIGKILL) just before it
  // reports its job done, after the others reported theirs.
  bool die_before_complete = false;
  static constexpr double complete_grace_s = 5;
  // Draining (the node leaves: SIGTERM, `tepdist leave`): the step under way ends, no other starts.
  std::optional<caf::typed_response_promise<std::string>> drain;
  bool drained = false;
  static inline const char* name = "tepdist.trainer";
};

// -- What every mode shares (job.cpp) --

using compute::checksum;

/// Sends, waiting for room while the peer's send queue is full (back-pressure: the peer has not
/// taken what it was sent), at most send_wait(); false if it stayed full that long.
bool send_to(Trainer* self, const std::string& address, gossip::Body body);

/// How long send_to waits for room: a quarter of the job's step timeout, 0.1 to 10 s (2 s without a
/// job), so a blocked send never outlasts the ring checks that tell a hung worker from a slow one.
std::chrono::milliseconds send_wait(const TrainerState& s);

/// Gossip and async checkpoints: the positions not consumed into `state` (its job's `remaining`,
/// and its epoch: that of the first of them): the rest of each worker's list of the installed
/// generation after its cursor (`cursors`, worker id to positions consumed; a worker not named
/// counts as at 0, its whole list remaining).
void set_unconsumed(const Job& j, const std::map<std::string, uint64_t>& cursors, compute::TrainingState& state);

/// Gossip and async, the first generation of a resumed job: the checkpoint's remaining positions
/// re-split over this generation's workers, and the step and epoch it stood at. An error says
/// what of the checkpoint does not fit this job.
std::expected<void, std::string> resume_positions(Job& j, const compute::TrainingState& state);

/// Whether the view holds the submitter live (one it does not know is not).
bool submitter_live(const TrainerState& s, const std::string& submitter_id);

/// To the job's submitter, unless it is gone: a detached job reports to nobody.
void to_submitter(Trainer* self, const Job& j, gossip::Body body);

JobReport report_of(const Job& j, JobReport::Kind kind);

/// What this worker knows of its job, for status answers (elastic/status.hpp renders it).
gossip::JobStatus job_status(const Job& j, const std::string& self_id);

/// Tells the router what to answer status queries with (called each tick and at each generation).
void report_status(Trainer* self);

/// Ends the current job here: its evaluator and the mode's actors go with it, and the job is
/// retired (freed once the message being handled returns). `over`: the job is over for this node
/// (done, failed, abandoned), not merely left by it (a worker dropped from a generation may be
/// proposed again).
void drop_job(Trainer* self, bool over = true);

/// The job fails on this worker (a report to the submitter; the others go on, job control taking
/// this worker for gone, when the failure is this node's own).
void fail(Trainer* self, const std::string& why);
/// The job cannot go on anywhere (its data or model is at fault: a refused batch, a divergence):
/// every other worker of the generation is told to stop with the reason, then it fails here.
void fail_everywhere(Trainer* self, const std::string& why);

/// Sends ring chunks to the next worker; false (the job failed) if its send queue is full.
bool send_ring(Trainer* self, std::vector<gossip::RingChunk>& out);
/// The same, for a caller that cannot let the job go now (in the middle of computing a step): why
/// the chunks did not all go, or nothing when they did.
std::optional<std::string> try_send_ring(Trainer* self, std::vector<gossip::RingChunk>& out);

/// A ring chunk: fed to the job's ring (or kept for a job or generation not started here yet).
void on_chunk(Trainer* self, const std::string& peer, const gossip::RingChunk& c);

void fail_start(Trainer* self, const gossip::JobStart& start, const std::string& why);

/// Rank 0 at the end of a detached job: the model and the result go to this node's
/// results_dir/JOB_ID/ instead (model.safetensors, result.json). Where, or why not, for the log.
std::string save_detached(const TrainerState& s, const Job& j, const JobReport& r);

/// Rank 0 at the end: the final model to the submitter, then its done report (a detached job:
/// both to this node's disk).
void complete_rank0(Trainer* self);

/// The parameters to the submitter from rank 0 (at the end, or held between epochs), in pieces
/// tagged with the step; false (the job failed) if they do not fit the send queue.
bool send_model(Trainer* self);

/// A job that pauses between epochs: whether this worker waits now, with `epochs_done` epochs
/// behind it (the released ones are done, and the job is not over). Rank 0, on reaching a hold:
/// the model and a held report to the submitter (report_held), once the epoch's evaluation is in.
bool hold_between_epochs(Trainer* self, Job& j, uint64_t epochs_done);
void report_held(Trainer* self);
/// What rank 0 says while held: where the job stands, and its last evaluation.
JobReport held_report(const Job& j);

/// The job's end on this worker: rank 0 evaluates the final model, then completes (its result to
/// the submitter, job_complete to the others); the others report done and wait for that word.
void finish_job(Trainer* self);
/// Not rank 0: the job reported done here, or that rank 0 completed, is let go (rank 0's
/// job_complete, too long without it, another job assigned).
void release_done_job(Trainer* self, const char* why);

/// The first step a worker completes in a generation: when training resumed after a change.
void note_first_step(Job& j);

/// The gradient of positions [begin, end) of epoch `epoch`'s permutation into the model's
/// gradients; returns the samples (0: none) and sets their loss. An error, naming `step` (the step
/// this gradient is for), fails the job: the batch refused (compute::try_compute_gradients: a
/// label or a sample the model does not take), or a loss or gradient that is not finite (the
/// model diverged; the rule of every mode, job.cpp). `ready`, when set, hears of each layer's
/// gradients as the backward pass finishes them (compute::GradientsReady; only when the loss is
/// finite), after the emulated slowdown has held the thread for the computing so far.
std::expected<int64_t, std::string> compute_positions(Job& j, int64_t epoch, int64_t begin, int64_t end, int64_t step,
                                                      float& loss, const compute::GradientsReady& ready = {});

/// Gossip and async: each worker trains through its own list of positions. The first
/// generation's lists (each worker the r-th equal part of every epoch), set up once; the job runs
/// until its lists are done (or max_steps).
void init_position_lists(Job& j);

/// Gossip and async: this worker's list in the installed generation, checked against the job's
/// samples and epochs.
std::expected<elastic::Spans, std::string> worker_positions(const Job& j);

/// Gossip and async: this worker's local steps as a progress, in reference batches (what job
/// control compares and status shows; the rate reads job_pace's instead).
gossip::JobProgress local_progress(const Job& j);

/// Gossip and async: the job's progress as this worker's cursor in the installed generation's
/// lists tells it, for the rate.
elastic::JobPace job_pace(const Job& j);
/// Gossip and async: where the rate is read with this worker `consumed` positions into its list
/// (the pace's estimate; a job bounded by max_steps, which ends at a count of local steps: those).
gossip::JobProgress rate_progress_at(const Job& j, const elastic::JobPace& pace, uint64_t consumed);

/// Gossip and async: the gradient of one local step's pieces of positions (one epoch) into the
/// model's gradients; returns the samples (0: none) and sets their loss. Errors as compute_positions'.
std::expected<int64_t, std::string> compute_slice(Job& j, const elastic::StepSlice& slice, int64_t step, float& loss);

/// Whether this worker may take a step now: not while it has promised a generation that is not
/// installed yet, nor while it pulls the state.
bool may_step(const Job& j);

/// Async and gossip, after each fresh local step: epoch count, and rank 0's progress reports and
/// evaluations. A global step here is one step of every worker (world x batch samples, as in
/// sync); rank 0's own steps stand for them, and its rate times the workers for the cluster's.
/// `last`: this worker's last local step.
void after_local_step(Trainer* self, Job& j, int64_t samples, float loss, bool epoch_end, bool last);

/// Async and gossip: rank 0's evaluations for job control (its rate without them, what one costs
/// it, and when it evaluates: at each epoch part's end, and each job.eval_every_steps); nothing
/// on other ranks, which do not evaluate.
elastic::JobControl::Local::Evaluations evaluations_for_control(const Job& j);

/// The step just ended (j.last_step_end) into the node's figures for /metrics, if it keeps them,
/// and, a few times a second, the job's status to the router.
void count_step(Trainer* self, Job& j);
/// Gossip and async: this worker trained the last of its positions of epoch j.epoch (logged:
/// bench/balance.sh compares when the workers get there).
void note_epoch_part(const Job& j);

std::expected<void, std::string> setup(Trainer* self, Job& j);

double now_ms(const TrainerState& s);

size_t chunk_elements(const Job& j);

// -- Rank 0's evaluation and the target (evaluation.cpp) --

/// Async and gossip with stop_at_target: no fresh step after the one under way. What follows is
/// the usual end (async: pushes flushed and answered, the shards pulled; gossip: the final average).
void stop_training(Trainer* self, Job& j);

/// Rank 0, async and gossip: the target is reached; every other worker is told to stop (again on
/// each tick until the job ends, should a message be lost).
void tell_target_reached(Trainer* self, Job& j);

/// Async and gossip, a worker other than rank 0 told by rank 0 that the target is reached: it
/// stops after the step under way. False: not that command, or not from rank 0.
bool take_target_reached(Trainer* self, Job& j, const std::string& peer, const gossip::Control& c);

/// Rank 0: evaluates a snapshot of the parameters in the evaluator, reports it when done.
void evaluate_snapshot(Trainer* self);

/// Rank 0's evaluator, made when this worker first has rank 0.
std::expected<void, std::string> ensure_evaluator(Trainer* self, Job& j);

// -- Job control: generations and state transfer (generations.cpp) --

/// The job's state as one vector: the parameters, then each optimiser state buffer.
elastic::StateView state_view(Job& j);
/// The sync points of a resident state (Job::resident; nothing to do without one), each where the
/// host's copy is read or was written: the wire (state transfer, the model to the submitter),
/// files (checkpoints, a program's parameters), the evaluation's snapshot and the checksums.
/// state_to_host: the parameters and the optimiser's buffers to the host, once after each change;
/// parameters_to_host: the parameters only (evaluation, the model sent, checksums).
void state_to_host(Job& j);
void parameters_to_host(Job& j);
/// The host's copy, written (a pulled state, a program's parameters), to the resident state.
void state_from_host(Job& j);
/// The host's parameters, current, for a write of a part of them (gossip's mixings, its average):
/// the resident state takes them before it next computes or steps (parameters_to_device), once
/// however many writes came between.
std::span<float> host_parameters_to_write(Job& j);
/// Host writes of the parameters (host_parameters_to_write) to the resident state; nothing if none.
void parameters_to_device(Job& j);
/// The optimiser's step with the gradient in place, where the state lives.
void optimizer_step(Job& j, float lr);

std::unique_ptr<elastic::JobControl> make_control(const TrainerState& s, const elastic::JobConfig* config);

/// Carries out what job control asked for: its messages, its log lines, and what changed.
void apply_control(Trainer* self, uint64_t job_id, elastic::JobControl::Output& out);

/// Ring chunks of the generation just installed that came before it, then the next step.
void resume_training(Trainer* self);

/// A worker behind the generation's resume point (a joiner, a restarted node, a member whose last
/// step did not complete) pulls the state, striped over the donors.
void start_pull(Trainer* self);

/// A pull of the job's state from `peer` (its id), at address `from`: served, kept until the
/// generation it names is installed, or refused with a piece of nothing (elastic::refusal_of).
void on_state_pull(Trainer* self, const std::string& peer, const std::string& from, const gossip::StatePull& p);

/// A piece of the state this worker pulls, or a donor's refusal (its stripe goes to the next donor).
void on_state_piece(Trainer* self, const std::string& peer, const std::string& from, const gossip::StatePiece& p);

/// The installed generation: ring order, this worker's rank, the mode's part (rings, pairs,
/// positions), the rate rescaled; then training resumes, or the state is pulled first.
void enter_generation(Trainer* self);

/// The optimiser a release set (JobStart::optimizer, from the installed record): the optimiser
/// made anew with its options, keeping the state buffers and step count where it keeps the same
/// buffers (compute::carry_state), and the rate's schedule made anew. An error names what is
/// wrong. (Async: this is the worker's own optimiser; in gradients mode the shards' follows it,
/// AsyncDriver::enter.)
std::expected<void, std::string> change_optimizer(Job& j);

/// Whether this worker takes the parameters record `r` carries as it enters it: held at the hold
/// its release ends (or on its way into it: Driver::hold_reached), with the job's state (a worker
/// that trained on, or a restarted one, does not).
bool takes_reset(const Job& j, const gossip::JobStart& r);

/// A release that came with parameters the program set (JobStart::reset_file), read from `path`
/// (where this node has the file): into the model, checked against their checksum; an error (an
/// unreadable file, other values) leaves it as it was.
std::expected<void, std::string> take_reset(Job& j, const std::string& path);

/// The submitter is a client, not a part of the job: once the view holds it dead or left, the job
/// goes on detached, and rank 0 saves the result on its own node. (Not in the view is not gone:
/// gossip of its join may not have come yet.)
void check_submitter(Trainer* self);

/// Sets up `record`'s job on this node and enters its generation: the first assignment
/// (has_state: every worker starts from the same initial parameters), or a joiner's install
/// (it pulls the state).
void start_job(Trainer* self, const gossip::JobStart& record, bool has_state);

// -- A job's files (files.cpp) --

/// start_job once this node has the job's files (JobStart::files): at once when it reads each
/// where the config says, or has fetched it before; else after fetching the rest from the
/// submitter. A fetch that fails refuses the job (a joiner declines it), naming the file.
void prepare_job(Trainer* self, const gossip::JobStart& record, bool has_state);
/// A piece of a file being fetched: only from the job's submitter.
void on_file_piece(Trainer* self, const std::string& peer, const gossip::FilePiece& piece);
/// Where this node has the reset file record `r` names: at its path, or fetched before; empty
/// while it fetches it from the submitter (enter_generation is called again once it is here).
std::string reset_file_here(Trainer* self, const gossip::JobStart& r);
/// Each tick while fetching: what is overdue is asked for again; a fetch that stalled fails.
void tick_files(Trainer* self);

/// A joiner whose setup of the job failed: it says why in its own log, asks the duty holder to
/// leave it out, and never joins the job again; the job is not failed for it.
void decline_join(Trainer* self, const gossip::JobStart& record, const std::string& why);

/// What a node that declined a job answers: an evict vote naming itself, with its boot id.
gossip::GenerationVote decline_vote(const TrainerState& s, uint64_t job_id, uint64_t generation);

/// A later generation's record (generation 2 on): from its proposer, or forwarded by a member.
void on_install(Trainer* self, const std::string& peer, const gossip::JobStart& record);

void on_vote(Trainer* self, const std::string& peer, const gossip::GenerationVote& vote);

// -- The actor: messages, ticks, the coordinator's part, drains (trainer.cpp) --

/// Ends a drain: this worker takes no further step; what it says is where it stopped.
void end_drain(Trainer* self);

/// Asked to drain: at once when no step is under way (between steps, paused, pulling, not a
/// member, async), else when the step under way ends (do_step).
void on_drain(Trainer* self);

void do_step(Trainer* self);

void on_assigned(Trainer* self, const std::string& peer, const gossip::JobStart& start);

/// The coordinator's part: a job from a submitter gets its ring order and goes to every worker,
/// once this node's view holds every worker the submitter saw (gossip may not have brought them
/// all here yet).
/// Why this node cannot assign `request` yet, from its view: the submitter saw a worker or a
/// coordinator this view has not caught up with. Empty: it can.
std::string not_ready_to_assign(const TrainerState& s, const gossip::JobStart& request);

void on_submitted(Trainer* self, const std::string& submitter_peer, const gossip::JobStart& request);

void on_view(Trainer* self, std::vector<gossip::Member> view);

/// Every tick while a job ends without a barrier: rank 0 tells the submitter it is alive (its
/// last step may come long before the slowest worker's); the mode repeats what it must (async: a
/// finished worker says so again, rank 0 its pulls; rank 0 of async and gossip that the target is
/// reached).
void keep_ending(Trainer* self);

/// Past the step timeout: what the worker waits on decides (a pull, a pause, the ring, the shards).
void check_step_timeout(Trainer* self);

void on_tick(Trainer* self);

/// Keeps one timer chain running while a job or a pending submission needs watching.
void start_ticking(Trainer* self);

void on_control(Trainer* self, const std::string& peer, const gossip::Control& c);

caf::behavior trainer(Trainer* self, TrainerOptions options, caf::actor router);

}  // namespace tepdist::actors::trainer_detail

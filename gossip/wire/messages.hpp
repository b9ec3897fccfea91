#pragma once
// The messages nodes exchange, as plain C++ values. The protocol cores (membership, the ring, the
// shard protocol) speak these and know nothing of Cap'n Proto; gossip/wire/codec.hpp converts
// them to and from the one wire (wire.capnp), where all checking of untrusted bytes happens.

#include <cstdint>
#include <memory>
#include <span>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace tepdist::gossip {

struct Member {
  enum class State : uint8_t { alive, suspect, dead, left };
  std::string id;
  std::string address;  ///< host:port
  uint64_t incarnation = 0;
  State state = State::alive;
  std::string region;
  std::vector<std::string> roles;
  /// For a suspect record: the member whose probe failed. Relays keep it, so Lifeguard counts
  /// independent accusers, not the gossip that carries one accusation.
  std::string accuser = {};
  /// Drawn anew each time the node's process starts and never changed while it runs: a record
  /// with another boot id is a restart (its state is gone), while a higher incarnation alone is a
  /// refutation or a leave of the same run. 0: unknown (a record from before boot ids).
  uint64_t boot_id = 0;
  friend bool operator==(const Member&, const Member&) = default;
};

struct Ping {
  uint64_t seq_no = 0;
  std::vector<Member> updates;
  friend bool operator==(const Ping&, const Ping&) = default;
};

struct Ack {
  uint64_t seq_no = 0;
  std::vector<Member> updates;
  friend bool operator==(const Ack&, const Ack&) = default;
};

struct PingReq {
  uint64_t seq_no = 0;
  Member target;
  std::vector<Member> updates;
  friend bool operator==(const PingReq&, const PingReq&) = default;
};

struct Join {
  Member member;
  friend bool operator==(const Join&, const Join&) = default;
};

struct Leave {
  Member member;
  friend bool operator==(const Leave&, const Leave&) = default;
};

/// Where one parameter shard of an async job lives: member ids, primary first.
struct ShardHolders {
  uint32_t shard = 0;
  std::vector<std::string> holders;
  friend bool operator==(const ShardHolders&, const ShardHolders&) = default;
};

/// Where a job stands. In sync every member of a generation holds the same; in gossip each worker
/// holds its own.
struct JobProgress {
  uint64_t step = 0;      ///< updates applied (sync: global steps; gossip: the worker's own local steps)
  uint64_t epoch = 0;     ///< epochs completed
  uint64_t position = 0;  ///< samples of the current epoch's permutation consumed
  uint64_t samples = 0;   ///< samples consumed since the job began
  friend bool operator==(const JobProgress&, const JobProgress&) = default;
  friend auto operator<=>(const JobProgress& a, const JobProgress& b) { return a.samples <=> b.samples; }
};

/// What one worker knows of the job it runs, for status answers (elastic/status.hpp renders it).
/// A worker's measured speed and, in sync, its share of the global batch (elastic/balance.hpp).
struct WorkerLoad {
  std::string worker;
  double samples_per_second = 0;
  uint64_t share = 0;
  friend bool operator==(const WorkerLoad&, const WorkerLoad&) = default;
};

struct EvaluationPoint {
  uint64_t step = 0;
  uint32_t epoch = 0;
  double train_seconds = 0, accuracy = 0, loss = 0;
  friend bool operator==(const EvaluationPoint&, const EvaluationPoint&) = default;
};

struct ProgressPoint {
  uint64_t step = 0;
  double train_seconds = 0, loss = 0;
  double samples_per_second = 0;  ///< sync: the job's; gossip and async: the worker's own
  double lr = 0;
  friend bool operator==(const ProgressPoint&, const ProgressPoint&) = default;
};

struct GenerationMark {
  uint64_t generation = 0, step = 0;  ///< step: where it resumed
  uint32_t workers = 0;
  uint64_t unix_ms = 0;  ///< when the node installed it
  friend bool operator==(const GenerationMark&, const GenerationMark&) = default;
};

struct JobStatus {
  uint64_t job_id = 0;
  std::string mode;
  uint64_t generation = 0;
  std::string phase;  ///< training, voting (the duty holder's: "voting, stalled: WHY"), pulling, waiting, held, finished
  JobProgress progress;  ///< sync: the job's; gossip and async: the answering worker's own
  /// The generation's workers in ring order, each with its position (samples of the current
  /// epoch's permutation consumed) as the answering node knows it: sync, the job's; gossip, the
  /// cursor it last heard from that worker.
  std::vector<std::pair<std::string, uint64_t>> workers = {};
  /// Async: the shards the answering node holds in the generation, each with its version.
  std::vector<std::pair<uint32_t, uint64_t>> held_shards = {};
  std::vector<WorkerLoad> loads = {};  ///< the generation's workers' speeds and shares
  double lr = 0;                       ///< the rate in effect at the answering worker's last step
  double loss = 0;                     ///< the training loss of its last step (sync: the job's)
  std::vector<EvaluationPoint> evaluations = {};  ///< rank 0: the job's, the latest 256
  std::vector<ProgressPoint> history = {};        ///< its recent training, about a point a second
  std::vector<GenerationMark> generations = {};   ///< the generations it installed, the latest 64
  friend bool operator==(const JobStatus&, const JobStatus&) = default;
};

struct MetricsSnapshot {
  struct Metric {
    std::string name;
    std::vector<std::pair<std::string, std::string>> labels;
    double value = 0.0;
    friend bool operator==(const Metric&, const Metric&) = default;
  };
  std::vector<Metric> entries;
  friend bool operator==(const MetricsSnapshot&, const MetricsSnapshot&) = default;
};

struct MemberEvent {
  uint64_t unix_ms = 0;
  std::string kind;  ///< swim::event_name: joined, suspected, refuted, dead, left, ...
  std::string member;
  friend bool operator==(const MemberEvent&, const MemberEvent&) = default;
};

struct StateSync {
  std::vector<Member> members;
  bool reply = false;
  uint64_t epoch_unix_ms = 0;
  std::vector<ShardHolders> shards = {};  ///< status answers: the running async job's placement
  std::optional<JobStatus> job = {};      ///< status answers: the answering node's job
  /// Status answers: the nodes' figures the monitor role's gossip brought to the answering node
  /// (entries labelled node=ID; actors/roles/monitor.hpp).
  MetricsSnapshot figures = {};
  std::vector<MemberEvent> events = {};  ///< status answers: the answering node's latest membership events
  friend bool operator==(const StateSync&, const StateSync&) = default;
};

/// A slice of a float tensor. On the sending side `data` views an immutable snapshot that `owner`
/// keeps alive until the frame is written; on the receiving side it views the received frame,
/// which `owner` keeps alive. Either way no copy is made.
struct TensorChunk {
  uint64_t step = 0;
  uint32_t shard = 0;
  uint64_t offset = 0;  ///< elements
  uint64_t total = 0;   ///< elements in the whole tensor
  std::span<const float> data;
  std::shared_ptr<const void> owner;
  friend bool operator==(const TensorChunk& a, const TensorChunk& b) {
    return a.step == b.step && a.shard == b.shard && a.offset == b.offset && a.total == b.total &&
           std::equal(a.data.begin(), a.data.end(), b.data.begin(), b.data.end());
  }
};

struct ParamPull {
  uint32_t shard = 0;
  uint64_t have_version = 0;
  friend bool operator==(const ParamPull&, const ParamPull&) = default;
};

struct ParamPush {
  uint32_t shard = 0;
  uint64_t version = 0;
  TensorChunk chunk;
  friend bool operator==(const ParamPush&, const ParamPush&) = default;
};

struct Control {
  enum class Command : uint8_t {
    start_job,
    stop_job,
    epoch_boundary,
    evaluate,
    worker_finished,
    job_finished,
    target_reached,
    ring_check,        ///< the next worker in the ring asks whether this one's trainer takes messages
    ring_check_answer,  ///< it does (the question's argument back)
    release_epochs,     ///< the submitter releases epochs of a job that pauses between them (argument: a
                        ///< Release, encoded)
    job_complete        ///< rank 0 reported the job done: the others, which kept it in case rank 0 died
                        ///< before that, let it go
  };
  std::string coordinator;
  uint64_t coordinator_incarnation = 0;
  Command command = Command::start_job;
  uint64_t job_id = 0;
  /// ring_check and its answer: a nonce. stop_job: empty from the submitter; from a worker, why
  /// (text, at most max_reason bytes are read).
  std::vector<uint8_t> argument;
  static constexpr size_t max_reason = 512;
  static constexpr size_t max_argument = 4096;  ///< longer arguments are refused on decode
  friend bool operator==(const Control&, const Control&) = default;
};



/// A file a job reads (its data sets, the parameters it starts from), as the submitter has it: a
/// worker that cannot read the same bytes at `path` fetches them from the submitter (FileFetch).
struct JobFile {
  std::string path;
  uint64_t size = 0;
  uint64_t checksum = 0;  ///< FNV-1a (64-bit) of the bytes
  friend bool operator==(const JobFile&, const JobFile&) = default;
};

/// A training job, from the submitter to the coordinator, then from the coordinator to every
/// worker with the ring order filled in. Later generations of the job travel as the same record
/// (elastic/job_control.hpp): generation, where it resumes, and who holds the state there.
struct JobStart {
  uint64_t job_id = 0;
  std::string config;  ///< TOML text
  std::string submitter;
  std::vector<std::string> workers, addresses;
  std::string coordinator;
  uint64_t coordinator_boot_id = 0;  ///< the coordinator's boot id: obeyed only from that run of it
  std::string submitter_id;  ///< set by the coordinator from the authenticated sender
  std::vector<uint64_t> worker_boot_ids = {};  ///< from the coordinator: each worker's boot id, as workers
  uint64_t generation = 0;                      ///< 1: the first; 0 in a submission
  JobProgress resume = {};                      ///< where this generation starts
  std::vector<std::string> donors = {};         ///< members holding the state at resume
  uint32_t previous_world = 0;                  ///< workers in the generation before (0: none)
  uint64_t reference_batch = 0;                 ///< the global batch optimizer.lr is meant for
  /// Gossip and async: each worker's positions as (epoch, begin, end) triples, aligned with workers.
  std::vector<std::vector<uint64_t>> spans = {};
  uint32_t shards = 0;  ///< async: the job's shard count, fixed in its first generation
  /// The generation before's workers and their boot ids (async: where its shards were).
  std::vector<std::string> previous_workers = {};
  std::vector<uint64_t> previous_boot_ids = {};
  /// Async, from generation 2: per shard, the worker whose state its holders take (the acker that
  /// reported the highest version of it); empty where none did.
  std::vector<std::string> shard_sources = {};
  /// Each worker's region (Member::region), aligned with workers; empty where not known. Async
  /// places each shard's holders in as many regions as it can (elastic/placement.hpp).
  std::vector<std::string> worker_regions = {};
  std::vector<std::string> previous_regions = {};  ///< the same for previous_workers
  /// [optimizer] plateau_patience: the decays decided so far, as one factor on the rate (rank 0
  /// decides, the next generation carries it, every worker applies it from its install); 0: 1.
  double lr_factor = 0;
  /// [job] pause_between_epochs: the epochs the submitter released so far; the workers wait after
  /// the last of them until it releases more (a generation carries the new count).
  uint32_t released_epochs = 0;
  /// With a release: parameters the program set between epochs, in a file every worker reads,
  /// taken by the workers held when the release (reset_epochs) is installed; checksum 0: none.
  std::string reset_file = {};
  uint64_t reset_checksum = 0;
  uint32_t reset_epochs = 0;
  /// The files the job's config names (data.train_file, data.test_file, model.init_file), which
  /// the submitter serves to a worker that does not have them (elastic/job_files.hpp).
  std::vector<JobFile> files = {};
  static constexpr size_t max_files = 16;
  /// The reset file's bytes (size and FNV-1a), for a worker that fetches it from the submitter.
  uint64_t reset_file_size = 0;
  uint64_t reset_file_checksum = 0;
  /// From a release on: `optimizer.KEY=VALUE` lines over the job's config (the program changed its
  /// optimiser between epochs); every later record carries the latest.
  std::string optimizer = {};
  friend bool operator==(const JobStart&, const JobStart&) = default;
};

/// What a release_epochs Control carries: the epochs released (counted from the job's start), and
/// optionally parameters the program set (their file, its bytes' size and checksum, and the
/// values' checksum, compute::checksum; 0: none) and the optimiser it set (`optimizer.KEY=VALUE`
/// lines; empty: as it was). Encoded as a u32, and with either of them: three u64s (values'
/// checksum, size, bytes' checksum), a u32 path length, the path, the optimiser's lines; all
/// little-endian.
struct Release {
  uint32_t epochs = 0;
  JobFile reset_file = {};
  uint64_t reset_checksum = 0;
  std::string optimizer = {};
  std::vector<uint8_t> encode() const;
  /// Nothing if `argument` is not one (a wrong length, a path past its end).
  static std::optional<Release> decode(const std::vector<uint8_t>& argument);
  friend bool operator==(const Release&, const Release&) = default;
};

/// Job control's votes (elastic/job_control.hpp).
struct GenerationVote {
  enum class Kind : uint8_t { propose, ack, refuse, evict, back };
  uint64_t job_id = 0;
  Kind kind = Kind::propose;
  uint64_t number = 0;  ///< proposed; refuse: the highest the refuser has promised or installed
  uint64_t base = 0;    ///< the generation it succeeds; ack: the acker's installed one
  std::vector<std::string> workers = {};  ///< propose: in ring order; evict: the worker to leave out
  JobProgress progress = {};              ///< ack
  bool has_state = false;                 ///< ack: holds the job's parameters
  uint64_t boot_id = 0;                   ///< ack
  std::string reason = {};                ///< refuse
  /// ack, gossip: other workers' cursors as the acker learned them from mixings (async: as far
  /// as their pushes applied on the acker's primaries reached).
  std::vector<std::pair<std::string, uint64_t>> cursors = {};
  /// ack, async: the shards the acker holds the state of, each with its version.
  std::vector<std::pair<uint32_t, uint64_t>> held_shards = {};
  friend bool operator==(const GenerationVote&, const GenerationVote&) = default;
};

/// State transfer: [offset, offset + count) of a job's state (parameters, then optimiser state) at step.
struct StatePull {
  uint64_t job_id = 0, step = 0, offset = 0, count = 0;
  /// Async, a striped shard fetch: of shard `shard`'s state (values, then each optimiser buffer)
  /// at version `step`, whose digest (elastic::state_digest) is `digest`; else the job's state.
  bool of_shard = false;
  uint32_t shard = 0;
  uint64_t digest = 0;
  /// The job's state: the generation the puller installed (a donor serves only the state of that
  /// one: at a between-epochs hold a program may set the parameters anew at the same step). 0 for
  /// a shard's state, which its version and digest name.
  uint64_t generation = 0;
  friend bool operator==(const StatePull&, const StatePull&) = default;
};

struct StatePiece {
  uint64_t job_id = 0;
  TensorChunk chunk;  ///< step: the state's step
  /// A piece of shard chunk.shard's state (StatePull::of_shard); with chunk.total 0 and no values,
  /// the donor's refusal: it does not hold that state.
  bool of_shard = false;
  uint64_t generation = 0;  ///< the generation of the state it is a piece of (StatePull::generation)
  friend bool operator==(const StatePiece&, const StatePiece&) = default;
};

/// A worker asks the job's submitter for [offset, offset + length) of one of the job's files (by
/// its checksum: the submitter serves only the files its job lists).
struct FileFetch {
  uint64_t job_id = 0, checksum = 0, offset = 0, length = 0;
  friend bool operator==(const FileFetch&, const FileFetch&) = default;
};

/// The submitter's answer: the bytes at offset (at most FileFetch::length), or why not.
struct FilePiece {
  uint64_t job_id = 0, checksum = 0, offset = 0;
  std::vector<uint8_t> data = {};
  std::string refused = {};
  static constexpr size_t max_bytes = 1u << 20;
  friend bool operator==(const FilePiece&, const FilePiece&) = default;
};

/// `tepdist leave NODE` and the node's answers: accepted (draining), then done (leaving now), or
/// refused with the reason.
struct LeaveRequest {
  enum class Kind : uint8_t { request, accepted, refused, done };
  std::string node;
  Kind kind = Kind::request;
  std::string detail = {};
  friend bool operator==(const LeaveRequest&, const LeaveRequest&) = default;
};

/// One piece of a ring all-reduce (gossip/collective/ring_allreduce.hpp).
struct RingChunk {
  uint64_t job_id = 0;
  uint8_t phase = 0;  ///< 0 reduce-scatter, 1 all-gather
  uint32_t round = 0;
  TensorChunk chunk;
  uint64_t generation = 0;  ///< the job generation whose ring this is
  friend bool operator==(const RingChunk&, const RingChunk&) = default;
};

/// A worker's news about a job, to the submitter.
struct JobReport {
  /// held: rank 0 of a job that pauses between epochs is at the end of a released epoch (`epoch`
  /// of them done) and has sent the model; repeated while it waits.
  enum class Kind : uint8_t { progress, evaluation, done, failed, held };
  uint64_t job_id = 0;
  Kind kind = Kind::progress;
  uint32_t rank = 0, epoch = 0;
  uint64_t step = 0;
  double loss = 0, samples_per_second = 0;
  uint32_t members = 0;
  double test_accuracy = 0, test_loss = 0, train_seconds = 0;
  uint64_t samples = 0, bytes_sent = 0, checksum = 0;
  std::string error;
  double eval_seconds = 0;
  double compute_seconds = 0;
  uint64_t stale_rejected = 0, updates_applied = 0, exchanges = 0, staleness_sum = 0;
  double lr = 0;                       ///< progress: the rate in effect at the last step
  std::vector<WorkerLoad> loads = {};  ///< progress: the workers' speeds and shares
  /// done: how this worker computed: the backend's path (compute_path) or, with a resident state,
  /// where the state lived ("cuda:0 (NVIDIA H200)")
  std::string compute = {};
  /// The sender's generation of the job when it reported (0: not said). A report can overtake the
  /// record of its generation: the submitter holds it until that record comes.
  uint64_t generation = 0;
  friend bool operator==(const JobReport&, const JobReport&) = default;
};

/// Async mode: a gradient for one parameter shard, its replication, or a request for its values
/// (elastic/async_shards.hpp).
struct ShardUpdate {
  enum class Kind : uint8_t { push, replicate, pull, ack, fetch };
  uint64_t job_id = 0;
  uint32_t shard = 0;
  Kind kind = Kind::push;
  uint64_t version = 0;  ///< push: computed on; replicate: the version it makes; ack: applied through
  float lr = 0;
  TensorChunk chunk;
  /// Push and replicate: the pushing worker, its boot id, and the update's number among its
  /// updates to this shard (deduplication marks).
  std::string origin = {};
  uint64_t boot = 0;
  uint64_t seq = 0;
  bool resend = false;  ///< push: sent again to the shard's new primary after a change
  uint64_t generation = 0;  ///< the sender's generation of the job: a holder takes only its own
  uint64_t consumed = 0;    ///< push: the worker's cursor in its positions after the steps it covers
  /// fetch: the digest (elastic::state_digest) of the copy the asker holds, at `version`; 0: none.
  uint64_t digest = 0;
  friend bool operator==(const ShardUpdate&, const ShardUpdate&) = default;
};

/// Async mode: a shard's values at a version, answering a push or a pull; or (kind durable) the
/// notice that updates through a version are on every holder.
struct ShardState {
  enum class Kind : uint8_t { values, durable };
  uint64_t job_id = 0;
  uint32_t shard = 0;
  uint64_t version = 0;
  bool rejected = false;
  uint64_t staleness = 0;
  TensorChunk chunk;
  uint64_t seq = 0;        ///< of the push answered
  uint64_t durable = 0;    ///< updates through this version are on every holder
  bool duplicate = false;  ///< the push was applied before (a resend): not applied again
  Kind kind = Kind::values;
  uint64_t generation = 0;  ///< the answering primary's generation of the job
  friend bool operator==(const ShardState&, const ShardState&) = default;
};

/// Async mode: a shard's whole state, from the holder a generation names as its source to a new
/// holder (elastic/async_shards.hpp, ShardSnapshot).
struct ShardTransfer {
  struct Mark {
    std::string worker;
    uint64_t boot = 0, seq = 0;
    friend bool operator==(const Mark&, const Mark&) = default;
  };
  uint64_t job_id = 0;
  uint32_t shard = 0;
  uint64_t generation = 0;
  uint64_t version = 0;
  int64_t optimizer_steps = 0;
  TensorChunk chunk;  ///< the values, then each optimiser buffer of the same length
  std::vector<Mark> marks = {};
  std::string refused = {};  ///< not empty: the source does not hold the shard, and why
  /// Per worker, the cursor its latest push applied to the shard in `generation` carried: the
  /// positions this shard's state holds (rank 0's checkpoint cut takes the least over shards).
  std::vector<std::pair<std::string, uint64_t>> cursors = {};
  /// The asker's copy is the source's state (same version and digest): no values, it keeps its own.
  bool current = false;
  /// Not empty: no values here either; the asker pulls the chunk.total elements striped over these
  /// holders of the same state (StatePull::of_shard at `version`), and checks them against `digest`.
  std::vector<std::string> donors = {};
  uint64_t digest = 0;
  /// The state has what this generation's release set (the program's parameters, its optimiser):
  /// a new holder applies the release only to a state without it.
  bool released = false;
  static constexpr size_t max_marks = 65536;  ///< one per worker that ever pushed to the shard (and so for cursors)
  static constexpr size_t max_donors = 64;
  friend bool operator==(const ShardTransfer&, const ShardTransfer&) = default;
};

/// Gossip mode: one piece of a pairwise averaging (gossip/collective/gossip_average.hpp).
struct GossipAverage {
  uint64_t job_id = 0;
  uint64_t exchange = 0;
  bool reply = false;
  TensorChunk chunk;
  uint64_t generation = 0;  ///< the sender's generation
  uint64_t consumed = 0;    ///< the sender's cursor in its list of positions
  friend bool operator==(const GossipAverage&, const GossipAverage&) = default;
};

using Body = std::variant<Ping, Ack, PingReq, Join, Leave, StateSync, TensorChunk, ParamPull, ParamPush, Control,
                          MetricsSnapshot, JobStart, RingChunk, JobReport, ShardUpdate, ShardState, GossipAverage,
                          GenerationVote, StatePull, StatePiece, LeaveRequest, ShardTransfer, FileFetch, FilePiece>;

/// Everything after the handshake: who sent it and what.
struct Message {
  std::string sender;
  uint64_t incarnation = 0;
  std::string cluster_id;
  Body body;
  /// A received message's frame, held while any copy of the message lives: the transport counts
  /// it against the sender's receive budget until then (back-pressure). Empty for messages built
  /// here; not part of the value (==).
  std::shared_ptr<const void> frame = {};
  friend bool operator==(const Message& a, const Message& b) {
    return a.sender == b.sender && a.incarnation == b.incarnation && a.cluster_id == b.cluster_id && a.body == b.body;
  }
};

/// The kind's name for logs and metrics ("ping", "tensor_chunk", ...).
const char* kind_name(const Body& body);

/// Whether it is membership's (SWIM's): ping, ack, ping-req, join, leave, state sync. The router
/// hands these to the SWIM core, and the transport sends them on a lane of their own.
bool is_membership(const Body& body);

}  // namespace tepdist::gossip

@0x84bd63c774384f63;
# The one wire between tepdist nodes. Every frame after the handshake is an Envelope; the
# handshake (Hello, Challenge, Proof) runs first on every connection and nothing else is accepted
# until it succeeds. Frames are a 4-byte little-endian length followed by a Cap'n Proto message
# (segment table, then segments); tensors ride in their own segment, referenced, not copied.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("tepdist::wire");

# ---- Handshake: mutual HMAC-SHA256 challenge-response over fresh nonces ---------------------

struct Hello {
  # Initiator -> responder: who I am and my challenge to you.
  version @0 :UInt32;
  clusterId @1 :Text;
  nodeId @2 :Text;
  nonce @3 :Data;          # 32 random bytes, fresh per connection
  region @4 :Text;         # for the link emulator, before membership has told anyone
  listenAddress @5 :Text;  # host:port where the initiator accepts connections: the responder
                           # reuses this connection for what it sends to that address
  lane @6 :UInt8;          # 0 bulk (jobs, tensors), 1 membership: each pair of nodes keeps one
                           # connection per lane, so probes never queue behind tensors
  ephemeral @7 :Data;      # 32 bytes: a fresh X25519 public key; the frames' keys come from it
  protection @8 :UInt8;    # how frames after the handshake are sealed: 0 plain, 1 authenticated,
                           # 2 encrypted; both ends must agree
}

struct Challenge {
  # Responder -> initiator: my proof (over both nonces) and my challenge to you.
  nodeId @0 :Text;
  nonce @1 :Data;          # 32 random bytes, fresh per connection
  proof @2 :Data;          # HMAC(secret, transcript, "responder")
  region @3 :Text;
  ephemeral @4 :Data;      # 32 bytes: the responder's fresh X25519 public key
}

struct Proof {
  # Initiator -> responder: my proof over both nonces.
  proof @0 :Data;          # HMAC(secret, transcript, "initiator")
}

# ---- After the handshake ------------------------------------------------------------------

struct Envelope {
  sender @0 :Text;         # node id
  incarnation @1 :UInt64;  # the sender's, above any it used before (start time in ms will do)
  clusterId @2 :Text;
  union {
    ping @3 :Ping;
    ack @4 :Ack;
    pingReq @5 :PingReq;
    join @6 :Join;
    leave @7 :Leave;
    stateSync @8 :StateSync;
    tensorChunk @9 :TensorChunk;
    paramPull @10 :ParamPull;
    paramPush @11 :ParamPush;
    control @12 :Control;
    metrics @13 :MetricsSnapshot;
    jobStart @14 :JobStart;
    ringChunk @15 :RingChunk;
    jobReport @16 :JobReport;
    shardUpdate @17 :ShardUpdate;
    shardState @18 :ShardState;
    gossipAverage @19 :GossipAverage;
    generationVote @20 :GenerationVote;
    statePull @21 :StatePull;
    statePiece @22 :StatePiece;
    leaveRequest @23 :LeaveRequest;
    shardTransfer @24 :ShardTransfer;
    fileFetch @25 :FileFetch;
    filePiece @26 :FilePiece;
  }
}

# -- membership (SWIM) --

struct Member {
  id @0 :Text;
  address @1 :Text;        # host:port
  incarnation @2 :UInt64;
  state @3 :State;
  region @4 :Text;
  roles @5 :List(Text);
  accuser @6 :Text;        # suspect records: who suspected first (Lifeguard counts accusers)
  bootId @7 :UInt64;       # new at each process start: a restart, where a higher incarnation
                           # alone is a refutation or a leave
  enum State {
    alive @0;
    suspect @1;
    dead @2;
    left @3;
  }
}

struct Ping {
  seqNo @0 :UInt64;
  updates @1 :List(Member);  # piggybacked dissemination
}

struct Ack {
  seqNo @0 :UInt64;
  updates @1 :List(Member);
}

struct PingReq {
  seqNo @0 :UInt64;
  target @1 :Member;         # probe this member on my behalf
  updates @2 :List(Member);
}

struct Join {
  member @0 :Member;
}

struct Leave {
  member @0 :Member;         # state left, incarnation of the leaver
}

struct StateSync {
  members @0 :List(Member);  # push-pull anti-entropy and the joiner's first view
  reply @1 :Bool;
  epochUnixMs @2 :UInt64;    # the cluster epoch: link-emulator times count from it
  shards @3 :List(ShardHolders);  # status answers only: where the running async job's shards live
  job @4 :JobStatus;         # status answers only: the answering node's job, when hasJob
  hasJob @5 :Bool;
  figures @6 :MetricsSnapshot;  # status answers only: every node's figures the monitor gossip brought here
  events @7 :List(MemberEvent);  # status answers only: the answering node's latest membership events
}

struct MemberEvent {
  unixMs @0 :UInt64;
  kind @1 :Text;             # joined, suspected, refuted, dead, left, ... (swim::event_name)
  member @2 :Text;
}

struct JobStatus {
  # What one worker knows of its job (elastic/status.hpp): `tepdist status` and, later, /status.
  jobId @0 :UInt64;
  mode @1 :Text;
  generation @2 :UInt64;
  phase @3 :Text;            # training, voting, pulling, waiting, finished
  progress @4 :JobProgress;  # sync: the job's; gossip and async: the answering worker's own
  workers @5 :List(Cursor);  # the generation's workers, each with its position as this node knows it
  heldShards @6 :List(HeldShard);  # async: the shards this node holds in the generation, with versions
  loads @7 :List(WorkerLoad);      # the generation's workers' speeds and shares, as this node knows them
  lr @8 :Float64;                  # the learning rate in effect at this node's last step
  loss @9 :Float64;                # the training loss of this node's last step (sync: the job's)
  evaluations @10 :List(EvaluationPoint);  # rank 0: the job's evaluations, the latest 256
  history @11 :List(ProgressPoint);        # this node's recent training, about a point a second, the latest 240
  generations @12 :List(GenerationMark);   # the generations this node installed, the latest 64
}

struct EvaluationPoint {
  step @0 :UInt64;
  epoch @1 :UInt32;
  trainSeconds @2 :Float64;
  accuracy @3 :Float64;
  loss @4 :Float64;
}

struct ProgressPoint {
  step @0 :UInt64;
  trainSeconds @1 :Float64;
  loss @2 :Float64;
  samplesPerSecond @3 :Float64;    # sync: the job's; gossip and async: this worker's
  lr @4 :Float64;
}

struct GenerationMark {
  generation @0 :UInt64;
  step @1 :UInt64;           # the step it resumed at
  workers @2 :UInt32;
  unixMs @3 :UInt64;         # when this node installed it
}

struct ShardHolders {
  shard @0 :UInt32;
  holders @1 :List(Text);    # member ids, primary first
}

# -- tensors and parameters --

struct TensorChunk {
  step @0 :UInt64;           # the step or version the tensor belongs to
  shard @1 :UInt32;
  offset @2 :UInt64;         # in elements, within the whole tensor
  total @3 :UInt64;          # elements in the whole tensor
  data @4 :Data;             # little-endian float32, (size / 4) elements from offset
}

struct ParamPull {
  shard @0 :UInt32;
  haveVersion @1 :UInt64;
}

struct ParamPush {
  shard @0 :UInt32;
  version @1 :UInt64;        # version the gradient was computed on (push) or is (reply)
  chunk @2 :TensorChunk;
}

# -- control plane and monitoring --

struct Control {
  coordinator @0 :Text;      # the id the command comes from; obeyed only from the lowest live id
  coordinatorIncarnation @1 :UInt64;
  command @2 :Command;
  jobId @3 :UInt64;
  argument @4 :Data;
  enum Command {
    startJob @0;
    stopJob @1;
    epochBoundary @2;
    evaluate @3;
    workerFinished @4;     # async: a worker has applied all its updates (to rank 0)
    jobFinished @5;        # async: rank 0 has the final model; shards may go
    targetReached @6;      # async, gossip with stop_at_target: rank 0's evaluation reached the target
    ringCheck @7;          # sync, gossip's final average: the next worker, waiting past step_timeout_s, asks
                           # whether this worker's trainer still takes messages (argument: a nonce)
    ringCheckAnswer @8;    # it does: the nonce back; one that is hung never answers and is evicted
    releaseEpochs @9;      # the submitter of a job that pauses between epochs releases more: argument
                           # the epochs released so far (UInt32, little-endian)
    jobComplete @10;       # rank 0 has reported the job done to its submitter: the other workers, which
                           # kept the job since their own done should rank 0 die first, let it go
  }
}

struct MetricsSnapshot {
  entries @0 :List(Metric);
  struct Metric {
    name @0 :Text;
    labels @1 :List(Label);
    value @2 :Float64;
  }
  struct Label {
    key @0 :Text;
    value @1 :Text;
  }
}

# -- training jobs --

struct JobStart {
  jobId @0 :UInt64;
  config @1 :Text;           # the job's TOML, as the submitter validated it
  submitter @2 :Text;        # host:port where reports go
  workers @3 :List(Text);    # from the submitter: the workers it saw; from the coordinator: the ring order
  addresses @4 :List(Text);  # where each of workers listens, same order (empty in a submission)
  coordinator @5 :Text;      # who assigned it (obeyed only from the lowest live coordinator id); empty: a submission
  coordinatorBootId @6 :UInt64;  # the coordinator's boot id: obeyed only from that run of it
  submitterId @7 :Text;      # from the coordinator: the submitter's node id, as its connection proved it
  workerBootIds @8 :List(UInt64);  # from the coordinator: each worker's boot id, as workers (a
                           # worker that restarts during the job is a change of the ring)
  generation @9 :UInt64;     # the generation this record installs (1: the first; elastic/job_control.hpp)
  resume @10 :JobProgress;   # where the generation starts (sync: what every member holds alike)
  donors @11 :List(Text);    # members that hold the state at resume: the others pull it from them
  previousWorld @12 :UInt32; # workers in the generation before (the rate policy's ramp starts there)
  referenceBatch @13 :UInt64; # the global batch optimizer.lr is meant for: the first generation's
  spans @14 :List(WorkerSpans);  # gossip and async: each worker's positions, same order as workers (elastic/progress.hpp)
  shards @15 :UInt32;        # async: the job's shard count, fixed in its first generation
  previousWorkers @16 :List(Text);    # the generation before's workers (async: where its shards were)
  previousBootIds @17 :List(UInt64);  # and their boot ids, same order
  shardSources @18 :List(Text);  # async: per shard, the worker whose state its holders take (the
                             # acker that reported the highest version of it); empty: none did
  workerRegions @19 :List(Text);    # each worker's region, same order as workers (async: each shard's
                             # holders are spread over regions); empty: not known
  previousRegions @20 :List(Text);  # the generation before's workers' regions, same order
  lrFactor @21 :Float64;     # the plateau decays so far, as one factor on the rate; 0: 1 (none)
  releasedEpochs @22 :UInt32; # job.pause_between_epochs: the epochs its submitter released; workers wait at the end of the last
  resetFile @23 :Text;       # with a release: parameters the program set between epochs (safetensors, a path every
                             # worker reads); the workers held at the release take them
  resetChecksum @24 :UInt64; # their checksum (FNV-1a of the floats); 0: no reset
  resetEpochs @25 :UInt32;   # the release they came with
  files @26 :List(JobFile);  # the files the config names, served by the submitter to a worker without them
  resetFileSize @27 :UInt64;     # the reset file's bytes, for a worker that fetches it from the submitter
  resetFileChecksum @28 :UInt64; # (FNV-1a of the bytes)
  optimizer @29 :Text;       # from a release on: `optimizer.KEY=VALUE` lines over the job's config
}

struct JobFile {
  path @0 :Text;             # as the submitter has it (the config names it so)
  size @1 :UInt64;
  checksum @2 :UInt64;       # FNV-1a (64-bit) of the bytes
}

struct FileFetch {
  # A worker asks the submitter for [offset, offset + length) of a job's file, named by checksum.
  jobId @0 :UInt64;
  checksum @1 :UInt64;
  offset @2 :UInt64;
  length @3 :UInt64;
}

struct FilePiece {
  jobId @0 :UInt64;
  checksum @1 :UInt64;
  offset @2 :UInt64;
  data @3 :Data;             # at most 1 MiB
  refused @4 :Text;          # not served: why
}

struct WorkerSpans {
  spans @0 :List(UInt64);    # (epoch, begin, end) triples, in the order the worker trains them
}

struct HeldShard {
  shard @0 :UInt32;
  version @1 :UInt64;
}

struct WorkerLoad {
  worker @0 :Text;
  samplesPerSecond @1 :Float64;  # its own measured speed (elastic/balance.hpp)
  share @2 :UInt64;              # sync: positions of each global batch it trains on
}

struct Cursor {
  worker @0 :Text;
  consumed @1 :UInt64;       # positions of its list it had trained on when it last mixed with the sender
}

struct JobProgress {
  step @0 :UInt64;           # updates applied (sync: global steps; gossip: the worker's own)
  epoch @1 :UInt64;          # epochs completed
  position @2 :UInt64;       # samples of the current epoch's permutation consumed
  samples @3 :UInt64;        # samples consumed since the job began
}

struct GenerationVote {
  # Job control (elastic/job_control.hpp): the coordinator proposes, members acknowledge or refuse.
  jobId @0 :UInt64;
  kind @1 :Kind;
  number @2 :UInt64;         # the generation proposed (refuse: the highest this member has promised or installed)
  base @3 :UInt64;           # the generation it succeeds (ack: the acker's installed one)
  workers @4 :List(Text);    # propose: who would train, in ring order
  progress @5 :JobProgress;  # ack: where the acker stands
  hasState @6 :Bool;         # ack: the acker holds the job's parameters (a joiner does not)
  bootId @7 :UInt64;         # ack: the acker's boot id (a restarted member's state is gone)
  reason @8 :Text;           # refuse: why
  cursors @9 :List(Cursor);  # ack, gossip: the cursors of other workers the acker knows from mixings
                             # (async: as far as their pushes applied on the acker's primaries reached)
  heldShards @10 :List(HeldShard);  # ack, async: the shards the acker holds the state of
  enum Kind {
    propose @0;
    ack @1;
    refuse @2;
    evict @3;                # to the duty holder: workers[0] blocks the ring though membership holds it live
    back @4;                 # to the duty holder: the sender, left out while alive, runs again (no longer passed over)
  }
}

struct StatePull {
  # A member behind (or a joiner) asks a donor for [offset, offset + count) of the job's state at step.
  jobId @0 :UInt64;
  step @1 :UInt64;
  offset @2 :UInt64;
  count @3 :UInt64;
  ofShard @4 :Bool;          # async: of shard `shard`'s state (values, then each optimiser buffer)
  shard @5 :UInt32;          # at version `step`, whose digest is `digest` (a striped shard fetch)
  digest @6 :UInt64;
  generation @7 :UInt64;     # the job's state: of the generation the puller installed (0: a shard's)
}

struct StatePiece {
  jobId @0 :UInt64;
  chunk @1 :TensorChunk;     # step: the state's step; offset and total place it in the state vector
  ofShard @2 :Bool;          # a piece of shard chunk.shard's state (StatePull.ofShard); with
                             # chunk.total 0 and no values: the donor does not hold that state
  generation @3 :UInt64;     # the generation of the state (StatePull.generation)
}

struct LeaveRequest {
  # `tepdist leave NODE`: the client asks the node to drain and leave; the node answers twice.
  node @0 :Text;             # the node asked to leave
  kind @1 :Kind;
  detail @2 :Text;           # refused: why; done: where it stopped
  enum Kind {
    request @0;
    accepted @1;             # the node is draining (finishing the step under way)
    refused @2;
    done @3;                 # drained; the graceful leave follows at once
  }
}

struct RingChunk {
  jobId @0 :UInt64;
  phase @1 :UInt8;           # 0 reduce-scatter, 1 all-gather
  round @2 :UInt32;          # 0 .. workers - 2 within the phase
  chunk @3 :TensorChunk;     # step = training step; offset and total place it in the buffer
  generation @4 :UInt64;     # the job's generation: chunks of another ring are not this one's
}

struct JobReport {
  jobId @0 :UInt64;
  kind @1 :Kind;
  rank @2 :UInt32;
  epoch @3 :UInt32;
  step @4 :UInt64;
  loss @5 :Float64;             # mean training loss of the global batch
  samplesPerSecond @6 :Float64; # the whole cluster's, over the last window
  members @7 :UInt32;           # workers in the job
  testAccuracy @8 :Float64;     # evaluation reports
  testLoss @9 :Float64;
  trainSeconds @10 :Float64;    # training time (evaluation excluded) when the evaluated parameters were made
  samples @11 :UInt64;          # samples this worker trained on (done) or the cluster (progress)
  bytesSent @12 :UInt64;        # payload bytes this worker sent in the ring (done)
  checksum @13 :UInt64;         # FNV-1a of this worker's parameters (done): replicas compare equal
  error @14 :Text;              # failed: what went wrong, naming the node
  evalSeconds @15 :Float64;
  computeSeconds @16 :Float64;  # done: this worker's time in forward and backward passes
  staleRejected @17 :UInt64;    # done, async: this worker's pushes refused as too stale
  updatesApplied @18 :UInt64;   # done, async: updates the shards this node is primary for applied
  exchanges @19 :UInt64;        # done, gossip: parameter averagings this worker took part in
  stalenessSum @20 :UInt64;     # done, async: the staleness of every update those shards applied, summed
  lr @21 :Float64;              # progress: the learning rate in effect at the last step
  loads @22 :List(WorkerLoad);  # progress: the workers' speeds and shares, as the reporter knows them
  compute @23 :Text;            # done: how this worker computed: its backend's path, or where its training state lived
  generation @24 :UInt64;       # the sender's generation of the job when it reported (0: not said)
  enum Kind {
    progress @0;
    evaluation @1;
    done @2;
    failed @3;
    held @4;                    # rank 0 of a job that pauses between epochs: epoch is over, the model was sent
  }
}

# -- async: sharded parameters (elastic/async_shards.hpp) --

struct ShardUpdate {
  jobId @0 :UInt64;
  shard @1 :UInt32;
  kind @2 :Kind;
  version @3 :UInt64;        # push: the shard version the gradient was computed on; replicate: the version it makes
  lr @4 :Float32;            # push: the worker's learning rate; replicate: the rate the primary applied
  chunk @5 :TensorChunk;     # push and replicate: the gradient of the whole shard; pull, ack: empty
  # Push and replicate: whose update it is (the pushing worker's id and boot id) and its number
  # among that worker's updates to this shard; the shard keeps the highest per worker, so an
  # update sent again after a change is never applied twice.
  origin @6 :Text;
  boot @7 :UInt64;
  seq @8 :UInt64;
  resend @9 :Bool;           # push: sent again to the shard's new primary after a change
  generation @10 :UInt64;    # the job's generation the sender is in: a holder takes only its own
  consumed @11 :UInt64;      # push: the worker's cursor in its positions after the steps it covers
  digest @12 :UInt64;        # fetch: the digest of the copy the asker holds (version: its version); 0: none
  enum Kind {
    push @0;                 # worker -> primary
    replicate @1;            # primary -> each replica, in version order
    pull @2;                 # anyone in the job -> primary: answered with a ShardState
    ack @3;                  # replica -> primary: every update through version is applied here
    fetch @4;                # a new holder -> the shard's source: answered with a ShardTransfer
  }
}

struct ShardState {
  # The primary's answer to a push or a pull: the shard's values at version.
  jobId @0 :UInt64;
  shard @1 :UInt32;
  version @2 :UInt64;
  rejected @3 :Bool;         # the push was too stale and not applied
  staleness @4 :UInt64;      # of the push answered
  chunk @5 :TensorChunk;     # kind durable: empty
  seq @6 :UInt64;            # of the push answered
  durable @7 :UInt64;        # every update through this version is on every holder of the shard
  duplicate @8 :Bool;        # the push was applied before (a resend): not applied again
  kind @9 :Kind;
  generation @10 :UInt64;    # the job's generation of the answering primary
  enum Kind {
    values @0;               # an answer to a push or a pull
    durable @1;              # no values: updates through durable are on every holder
  }
}

struct ShardTransfer {
  # A shard's whole state, from the holder a generation names as its source to a new holder.
  jobId @0 :UInt64;
  shard @1 :UInt32;
  generation @2 :UInt64;
  version @3 :UInt64;
  optimizerSteps @4 :Int64;
  chunk @5 :TensorChunk;     # the values, then each optimiser buffer of the same length
  marks @6 :List(UpdateMark);
  refused @7 :Text;          # not empty: the source does not hold the shard, and why
  cursors @8 :List(Cursor);  # per worker, the cursor its latest push applied to the shard in this
                             # generation carried (a checkpoint's cut)
  current @9 :Bool;          # the asker's copy is the source's state (same version and digest):
                             # no values sent, the asker keeps its own
  donors @10 :List(Text);    # not empty: no values here either; the asker pulls the chunk.total
                             # elements striped over these holders of the same state (StatePull ofShard)
  digest @11 :UInt64;        # with donors: the state's digest, which the pulled copy must have
  released @12 :Bool;        # the state has what this generation's release set (parameters, optimiser)
}

struct UpdateMark {
  worker @0 :Text;
  boot @1 :UInt64;
  seq @2 :UInt64;            # the highest of the worker's updates applied to the shard
}

# -- gossip: pairwise parameter averaging (gossip/collective/gossip_average.hpp) --

struct GossipAverage {
  jobId @0 :UInt64;
  exchange @1 :UInt64;       # chosen by the active side; the reply repeats it
  reply @2 :Bool;            # false: an active worker's parameters; true: the passive one's, before it averaged
  chunk @3 :TensorChunk;     # offset and total place it in the parameter buffer
  generation @4 :UInt64;     # the sender's generation of the job
  consumed @5 :UInt64;       # the sender's cursor in its list of positions when it sent this
}

#include "gossip/wire/codec.hpp"

#include <capnp/serialize.h>
#include <fmt/format.h>
#include <kj/exception.h>

#include <cstring>

#include "gossip/wire/wire.capnp.h"

namespace tepdist::gossip {
namespace {

// ---- C++ values -> Cap'n Proto builders ----

void put_member(wire::Member::Builder b, const Member& m) {
  b.setId(m.id);
  b.setAddress(m.address);
  b.setIncarnation(m.incarnation);
  b.setState(static_cast<wire::Member::State>(m.state));
  b.setRegion(m.region);
  auto roles = b.initRoles(static_cast<unsigned>(m.roles.size()));
  for (unsigned i = 0; i < m.roles.size(); ++i) roles.set(i, m.roles[i]);
  b.setAccuser(m.accuser);
  b.setBootId(m.boot_id);
}

void put_members(capnp::List<wire::Member>::Builder list, const std::vector<Member>& members) {
  for (unsigned i = 0; i < members.size(); ++i) put_member(list[i], members[i]);
}

void put_texts(capnp::List<capnp::Text>::Builder list, const std::vector<std::string>& texts) {
  for (unsigned i = 0; i < texts.size(); ++i) list.set(i, texts[i]);
}

void put_loads(capnp::List<wire::WorkerLoad>::Builder b, const std::vector<WorkerLoad>& loads) {
  for (unsigned i = 0; i < loads.size(); ++i) {
    b[i].setWorker(loads[i].worker);
    b[i].setSamplesPerSecond(loads[i].samples_per_second);
    b[i].setShare(loads[i].share);
  }
}

void put_metrics(wire::MetricsSnapshot::Builder b, const MetricsSnapshot& m) {
  auto list = b.initEntries(static_cast<unsigned>(m.entries.size()));
  for (unsigned i = 0; i < m.entries.size(); ++i) {
    const auto& metric = m.entries[i];
    list[i].setName(metric.name);
    list[i].setValue(metric.value);
    auto labels = list[i].initLabels(static_cast<unsigned>(metric.labels.size()));
    for (unsigned j = 0; j < metric.labels.size(); ++j) {
      labels[j].setKey(metric.labels[j].first);
      labels[j].setValue(metric.labels[j].second);
    }
  }
}

void put_progress(wire::JobProgress::Builder b, const JobProgress& p) {
  b.setStep(p.step);
  b.setEpoch(p.epoch);
  b.setPosition(p.position);
  b.setSamples(p.samples);
}

struct Encoder {
  capnp::MallocMessageBuilder& mb;
  std::vector<std::shared_ptr<const void>>& keep_alive;

  void put_chunk(wire::TensorChunk::Builder b, const TensorChunk& c) {
    b.setStep(c.step);
    b.setShard(c.shard);
    b.setOffset(c.offset);
    b.setTotal(c.total);
    const auto bytes = kj::arrayPtr(reinterpret_cast<const kj::byte*>(c.data.data()), c.data.size_bytes());
    // Cap'n Proto sends external data in whole words: only a buffer that starts and ends on a word
    // boundary can be referenced without sending bytes past its end.
    if (reinterpret_cast<uintptr_t>(bytes.begin()) % sizeof(capnp::word) == 0 && bytes.size() % sizeof(capnp::word) == 0 &&
        !c.data.empty()) {
      b.adoptData(mb.getOrphanage().referenceExternalData(bytes));
      if (c.owner) keep_alive.push_back(c.owner);
    } else {
      b.setData(bytes);
    }
  }

  void operator()(wire::Envelope::Builder e, const Body& body) {
    std::visit(
        [&](const auto& m) {
          using T = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<T, Ping>) {
            auto b = e.initPing();
            b.setSeqNo(m.seq_no);
            put_members(b.initUpdates(static_cast<unsigned>(m.updates.size())), m.updates);
          } else if constexpr (std::is_same_v<T, Ack>) {
            auto b = e.initAck();
            b.setSeqNo(m.seq_no);
            put_members(b.initUpdates(static_cast<unsigned>(m.updates.size())), m.updates);
          } else if constexpr (std::is_same_v<T, PingReq>) {
            auto b = e.initPingReq();
            b.setSeqNo(m.seq_no);
            put_member(b.initTarget(), m.target);
            put_members(b.initUpdates(static_cast<unsigned>(m.updates.size())), m.updates);
          } else if constexpr (std::is_same_v<T, Join>) {
            put_member(e.initJoin().initMember(), m.member);
          } else if constexpr (std::is_same_v<T, Leave>) {
            put_member(e.initLeave().initMember(), m.member);
          } else if constexpr (std::is_same_v<T, StateSync>) {
            auto b = e.initStateSync();
            put_members(b.initMembers(static_cast<unsigned>(m.members.size())), m.members);
            b.setReply(m.reply);
            b.setEpochUnixMs(m.epoch_unix_ms);
            auto shards = b.initShards(static_cast<unsigned>(m.shards.size()));
            for (unsigned i = 0; i < m.shards.size(); ++i) {
              shards[i].setShard(m.shards[i].shard);
              put_texts(shards[i].initHolders(static_cast<unsigned>(m.shards[i].holders.size())), m.shards[i].holders);
            }
            if (!m.figures.entries.empty()) put_metrics(b.initFigures(), m.figures);
            auto events = b.initEvents(static_cast<unsigned>(m.events.size()));
            for (unsigned i = 0; i < m.events.size(); ++i) {
              events[i].setUnixMs(m.events[i].unix_ms);
              events[i].setKind(m.events[i].kind);
              events[i].setMember(m.events[i].member);
            }
            if (m.job) {
              b.setHasJob(true);
              auto j = b.initJob();
              j.setJobId(m.job->job_id);
              j.setMode(m.job->mode);
              j.setGeneration(m.job->generation);
              j.setPhase(m.job->phase);
              put_progress(j.initProgress(), m.job->progress);
              auto workers = j.initWorkers(static_cast<unsigned>(m.job->workers.size()));
              for (unsigned i = 0; i < m.job->workers.size(); ++i) {
                workers[i].setWorker(m.job->workers[i].first);
                workers[i].setConsumed(m.job->workers[i].second);
              }
              auto held = j.initHeldShards(static_cast<unsigned>(m.job->held_shards.size()));
              for (unsigned i = 0; i < m.job->held_shards.size(); ++i) {
                held[i].setShard(m.job->held_shards[i].first);
                held[i].setVersion(m.job->held_shards[i].second);
              }
              put_loads(j.initLoads(static_cast<unsigned>(m.job->loads.size())), m.job->loads);
              j.setLr(m.job->lr);
              j.setLoss(m.job->loss);
              auto evals = j.initEvaluations(static_cast<unsigned>(m.job->evaluations.size()));
              for (unsigned i = 0; i < m.job->evaluations.size(); ++i) {
                const auto& p = m.job->evaluations[i];
                evals[i].setStep(p.step);
                evals[i].setEpoch(p.epoch);
                evals[i].setTrainSeconds(p.train_seconds);
                evals[i].setAccuracy(p.accuracy);
                evals[i].setLoss(p.loss);
              }
              auto history = j.initHistory(static_cast<unsigned>(m.job->history.size()));
              for (unsigned i = 0; i < m.job->history.size(); ++i) {
                const auto& p = m.job->history[i];
                history[i].setStep(p.step);
                history[i].setTrainSeconds(p.train_seconds);
                history[i].setLoss(p.loss);
                history[i].setSamplesPerSecond(p.samples_per_second);
                history[i].setLr(p.lr);
              }
              auto marks = j.initGenerations(static_cast<unsigned>(m.job->generations.size()));
              for (unsigned i = 0; i < m.job->generations.size(); ++i) {
                const auto& g = m.job->generations[i];
                marks[i].setGeneration(g.generation);
                marks[i].setStep(g.step);
                marks[i].setWorkers(g.workers);
                marks[i].setUnixMs(g.unix_ms);
              }
            }
          } else if constexpr (std::is_same_v<T, TensorChunk>) {
            put_chunk(e.initTensorChunk(), m);
          } else if constexpr (std::is_same_v<T, ParamPull>) {
            auto b = e.initParamPull();
            b.setShard(m.shard);
            b.setHaveVersion(m.have_version);
          } else if constexpr (std::is_same_v<T, ParamPush>) {
            auto b = e.initParamPush();
            b.setShard(m.shard);
            b.setVersion(m.version);
            put_chunk(b.initChunk(), m.chunk);
          } else if constexpr (std::is_same_v<T, Control>) {
            auto b = e.initControl();
            b.setCoordinator(m.coordinator);
            b.setCoordinatorIncarnation(m.coordinator_incarnation);
            b.setCommand(static_cast<wire::Control::Command>(m.command));
            b.setJobId(m.job_id);
            b.setArgument(kj::arrayPtr(m.argument.data(), m.argument.size()));
          } else if constexpr (std::is_same_v<T, JobStart>) {
            auto b = e.initJobStart();
            b.setJobId(m.job_id);
            b.setConfig(m.config);
            b.setSubmitter(m.submitter);
            put_texts(b.initWorkers(static_cast<unsigned>(m.workers.size())), m.workers);
            put_texts(b.initAddresses(static_cast<unsigned>(m.addresses.size())), m.addresses);
            b.setCoordinator(m.coordinator);
            b.setCoordinatorBootId(m.coordinator_boot_id);
            b.setSubmitterId(m.submitter_id);
            auto boots = b.initWorkerBootIds(static_cast<unsigned>(m.worker_boot_ids.size()));
            for (unsigned i = 0; i < m.worker_boot_ids.size(); ++i) boots.set(i, m.worker_boot_ids[i]);
            b.setGeneration(m.generation);
            put_progress(b.initResume(), m.resume);
            put_texts(b.initDonors(static_cast<unsigned>(m.donors.size())), m.donors);
            b.setPreviousWorld(m.previous_world);
            b.setReferenceBatch(m.reference_batch);
            auto spans = b.initSpans(static_cast<unsigned>(m.spans.size()));
            for (unsigned i = 0; i < m.spans.size(); ++i) {
              auto list = spans[i].initSpans(static_cast<unsigned>(m.spans[i].size()));
              for (unsigned k = 0; k < m.spans[i].size(); ++k) list.set(k, m.spans[i][k]);
            }
            b.setShards(m.shards);
            put_texts(b.initPreviousWorkers(static_cast<unsigned>(m.previous_workers.size())), m.previous_workers);
            auto previous_boots = b.initPreviousBootIds(static_cast<unsigned>(m.previous_boot_ids.size()));
            for (unsigned i = 0; i < m.previous_boot_ids.size(); ++i) previous_boots.set(i, m.previous_boot_ids[i]);
            put_texts(b.initShardSources(static_cast<unsigned>(m.shard_sources.size())), m.shard_sources);
            put_texts(b.initWorkerRegions(static_cast<unsigned>(m.worker_regions.size())), m.worker_regions);
            put_texts(b.initPreviousRegions(static_cast<unsigned>(m.previous_regions.size())), m.previous_regions);
            b.setLrFactor(m.lr_factor);
            b.setReleasedEpochs(m.released_epochs);
            b.setResetFile(m.reset_file);
            b.setResetChecksum(m.reset_checksum);
            b.setResetEpochs(m.reset_epochs);
            b.setOptimizer(m.optimizer);
            b.setResetFileSize(m.reset_file_size);
            b.setResetFileChecksum(m.reset_file_checksum);
            auto files = b.initFiles(static_cast<unsigned>(m.files.size()));
            for (unsigned i = 0; i < m.files.size(); ++i) {
              files[i].setPath(m.files[i].path);
              files[i].setSize(m.files[i].size);
              files[i].setChecksum(m.files[i].checksum);
            }
          } else if constexpr (std::is_same_v<T, FileFetch>) {
            auto b = e.initFileFetch();
            b.setJobId(m.job_id);
            b.setChecksum(m.checksum);
            b.setOffset(m.offset);
            b.setLength(m.length);
          } else if constexpr (std::is_same_v<T, FilePiece>) {
            auto b = e.initFilePiece();
            b.setJobId(m.job_id);
            b.setChecksum(m.checksum);
            b.setOffset(m.offset);
            b.setData(kj::arrayPtr(m.data.data(), m.data.size()));
            b.setRefused(m.refused);
          } else if constexpr (std::is_same_v<T, GenerationVote>) {
            auto b = e.initGenerationVote();
            b.setJobId(m.job_id);
            b.setKind(static_cast<wire::GenerationVote::Kind>(m.kind));
            b.setNumber(m.number);
            b.setBase(m.base);
            put_texts(b.initWorkers(static_cast<unsigned>(m.workers.size())), m.workers);
            put_progress(b.initProgress(), m.progress);
            b.setHasState(m.has_state);
            b.setBootId(m.boot_id);
            b.setReason(m.reason);
            auto cursors = b.initCursors(static_cast<unsigned>(m.cursors.size()));
            for (unsigned i = 0; i < m.cursors.size(); ++i) {
              cursors[i].setWorker(m.cursors[i].first);
              cursors[i].setConsumed(m.cursors[i].second);
            }
            auto held = b.initHeldShards(static_cast<unsigned>(m.held_shards.size()));
            for (unsigned i = 0; i < m.held_shards.size(); ++i) {
              held[i].setShard(m.held_shards[i].first);
              held[i].setVersion(m.held_shards[i].second);
            }
          } else if constexpr (std::is_same_v<T, StatePull>) {
            auto b = e.initStatePull();
            b.setJobId(m.job_id);
            b.setStep(m.step);
            b.setOffset(m.offset);
            b.setCount(m.count);
            b.setOfShard(m.of_shard);
            b.setShard(m.shard);
            b.setDigest(m.digest);
            b.setGeneration(m.generation);
          } else if constexpr (std::is_same_v<T, StatePiece>) {
            auto b = e.initStatePiece();
            b.setJobId(m.job_id);
            put_chunk(b.initChunk(), m.chunk);
            b.setOfShard(m.of_shard);
            b.setGeneration(m.generation);
          } else if constexpr (std::is_same_v<T, ShardTransfer>) {
            auto b = e.initShardTransfer();
            b.setJobId(m.job_id);
            b.setShard(m.shard);
            b.setGeneration(m.generation);
            b.setVersion(m.version);
            b.setOptimizerSteps(m.optimizer_steps);
            put_chunk(b.initChunk(), m.chunk);
            auto marks = b.initMarks(static_cast<unsigned>(m.marks.size()));
            for (unsigned i = 0; i < m.marks.size(); ++i) {
              marks[i].setWorker(m.marks[i].worker);
              marks[i].setBoot(m.marks[i].boot);
              marks[i].setSeq(m.marks[i].seq);
            }
            b.setRefused(m.refused);
            auto cursors = b.initCursors(static_cast<unsigned>(m.cursors.size()));
            for (unsigned i = 0; i < m.cursors.size(); ++i) {
              cursors[i].setWorker(m.cursors[i].first);
              cursors[i].setConsumed(m.cursors[i].second);
            }
            b.setCurrent(m.current);
            put_texts(b.initDonors(static_cast<unsigned>(m.donors.size())), m.donors);
            b.setDigest(m.digest);
            b.setReleased(m.released);
          } else if constexpr (std::is_same_v<T, LeaveRequest>) {
            auto b = e.initLeaveRequest();
            b.setNode(m.node);
            b.setKind(static_cast<wire::LeaveRequest::Kind>(m.kind));
            b.setDetail(m.detail);
          } else if constexpr (std::is_same_v<T, RingChunk>) {
            auto b = e.initRingChunk();
            b.setJobId(m.job_id);
            b.setPhase(m.phase);
            b.setRound(m.round);
            put_chunk(b.initChunk(), m.chunk);
            b.setGeneration(m.generation);
          } else if constexpr (std::is_same_v<T, JobReport>) {
            auto b = e.initJobReport();
            b.setJobId(m.job_id);
            b.setKind(static_cast<wire::JobReport::Kind>(m.kind));
            b.setRank(m.rank);
            b.setEpoch(m.epoch);
            b.setStep(m.step);
            b.setLoss(m.loss);
            b.setSamplesPerSecond(m.samples_per_second);
            b.setMembers(m.members);
            b.setTestAccuracy(m.test_accuracy);
            b.setTestLoss(m.test_loss);
            b.setTrainSeconds(m.train_seconds);
            b.setSamples(m.samples);
            b.setBytesSent(m.bytes_sent);
            b.setChecksum(m.checksum);
            b.setError(m.error);
            b.setEvalSeconds(m.eval_seconds);
            b.setComputeSeconds(m.compute_seconds);
            b.setStaleRejected(m.stale_rejected);
            b.setUpdatesApplied(m.updates_applied);
            b.setLr(m.lr);
            put_loads(b.initLoads(static_cast<unsigned>(m.loads.size())), m.loads);
            b.setExchanges(m.exchanges);
            b.setStalenessSum(m.staleness_sum);
            b.setCompute(m.compute);
            b.setGeneration(m.generation);
          } else if constexpr (std::is_same_v<T, ShardUpdate>) {
            auto b = e.initShardUpdate();
            b.setJobId(m.job_id);
            b.setShard(m.shard);
            b.setKind(static_cast<wire::ShardUpdate::Kind>(m.kind));
            b.setVersion(m.version);
            b.setLr(m.lr);
            put_chunk(b.initChunk(), m.chunk);
            b.setOrigin(m.origin);
            b.setBoot(m.boot);
            b.setSeq(m.seq);
            b.setResend(m.resend);
            b.setGeneration(m.generation);
            b.setConsumed(m.consumed);
            b.setDigest(m.digest);
          } else if constexpr (std::is_same_v<T, ShardState>) {
            auto b = e.initShardState();
            b.setJobId(m.job_id);
            b.setShard(m.shard);
            b.setVersion(m.version);
            b.setRejected(m.rejected);
            b.setStaleness(m.staleness);
            put_chunk(b.initChunk(), m.chunk);
            b.setSeq(m.seq);
            b.setDurable(m.durable);
            b.setDuplicate(m.duplicate);
            b.setKind(static_cast<wire::ShardState::Kind>(m.kind));
            b.setGeneration(m.generation);
          } else if constexpr (std::is_same_v<T, GossipAverage>) {
            auto b = e.initGossipAverage();
            b.setJobId(m.job_id);
            b.setExchange(m.exchange);
            b.setReply(m.reply);
            put_chunk(b.initChunk(), m.chunk);
            b.setGeneration(m.generation);
            b.setConsumed(m.consumed);
          } else if constexpr (std::is_same_v<T, MetricsSnapshot>) {
            put_metrics(e.initMetrics(), m);
          }
        },
        body);
  }
};

/// By Body index, which is also the Envelope union's order.
constexpr const char* kind_names[] = {"ping",         "ack",          "ping_req",    "join",           "leave",
                                      "state_sync",   "tensor_chunk", "param_pull",  "param_push",     "control",
                                      "metrics",      "job_start",    "ring_chunk",  "job_report",     "shard_update",
                                      "shard_state",  "gossip_average", "generation_vote", "state_pull", "state_piece",
                                      "leave_request", "shard_transfer", "file_fetch", "file_piece"};

const char* union_name(wire::Envelope::Which kind) {
  const auto i = static_cast<size_t>(kind);
  return i < std::size(kind_names) ? kind_names[i] : "unknown";
}

// ---- Cap'n Proto readers -> C++ values (inside one try block: readers throw on bad data) ----

/// What one frame may decode into. Cap'n Proto bounds the words a reader touches, but a list of
/// zero-sized structs costs one word of that budget per element and decodes into a whole record
/// each: a 63 MiB frame became 16.5 million members (2.9 GB). So every list and text is counted
/// here before anything is allocated for it: against its own cap (what the protocol can need),
/// and against the frame's decode budget (decode_budget_bytes: a few times the frame's own size).
class Reading {
 public:
  explicit Reading(size_t budget_bytes) : left_(budget_bytes) {}

  /// A list of at most `cap` elements, each decoded into a T: checked and paid for up front.
  template <class T, class List>
  List list(List l, size_t cap, std::string_view what) {
    if (l.size() > cap)
      throw WireError{WireErrc::over_limit, fmt::format("{} lists {} entries (at most {})", what, l.size(), cap)};
    charge(size_t{l.size()} * sizeof(T), what);
    return l;
  }

  std::string text(capnp::Text::Reader t, size_t cap, std::string_view what) {
    if (t.size() > cap)
      throw WireError{WireErrc::over_limit, fmt::format("{} is {} bytes (at most {})", what, t.size(), cap)};
    charge(t.size(), what);
    return std::string(t.cStr(), t.size());
  }
  std::string name(capnp::Text::Reader t, std::string_view what) { return text(t, wire_caps::name_bytes, what); }

  std::vector<std::string> names(capnp::List<capnp::Text>::Reader l, size_t cap, std::string_view what) {
    std::vector<std::string> out;
    out.reserve(list<std::string>(l, cap, what).size());
    for (auto t : l) out.push_back(name(t, what));
    return out;
  }

  template <class T, class List>
  std::vector<T> numbers(List l, size_t cap, std::string_view what) {
    std::vector<T> out;
    out.reserve(list<T>(l, cap, what).size());
    for (auto v : l) out.push_back(v);
    return out;
  }

  Member member(wire::Member::Reader r) {
    Member m;
    m.id = name(r.getId(), "a member's id");
    m.address = name(r.getAddress(), "a member's address");
    m.incarnation = r.getIncarnation();
    const auto state = r.getState();
    if (state > wire::Member::State::LEFT)
      throw WireError{WireErrc::unknown_kind, fmt::format("member {} has unknown state {}", m.id, static_cast<int>(state))};
    m.state = static_cast<Member::State>(state);
    m.region = name(r.getRegion(), "a member's region");
    m.roles = names(r.getRoles(), wire_caps::roles, "a member's roles");
    m.accuser = name(r.getAccuser(), "a member's accuser");
    m.boot_id = r.getBootId();
    return m;
  }

  std::vector<Member> members(capnp::List<wire::Member>::Reader l, std::string_view what) {
    std::vector<Member> out;
    out.reserve(list<Member>(l, wire_caps::members, what).size());
    for (auto m : l) out.push_back(member(m));
    return out;
  }

  template <class List>
  std::vector<std::pair<std::string, uint64_t>> cursors(List l, size_t cap, std::string_view what) {
    std::vector<std::pair<std::string, uint64_t>> out;
    out.reserve(list<std::pair<std::string, uint64_t>>(l, cap, what).size());
    for (auto c : l) out.emplace_back(name(c.getWorker(), what), c.getConsumed());
    return out;
  }

  MetricsSnapshot metrics(wire::MetricsSnapshot::Reader r) {
    MetricsSnapshot s;
    const auto entries = list<MetricsSnapshot::Metric>(r.getEntries(), wire_caps::metrics, "a metrics snapshot's entries");
    s.entries.reserve(entries.size());
    for (auto m : entries) {
      MetricsSnapshot::Metric metric{name(m.getName(), "a metric's name"), {}, m.getValue()};
      const auto labels = list<std::pair<std::string, std::string>>(m.getLabels(), wire_caps::labels, "a metric's labels");
      metric.labels.reserve(labels.size());
      for (auto l : labels) metric.labels.emplace_back(name(l.getKey(), "a label"), name(l.getValue(), "a label"));
      s.entries.push_back(std::move(metric));
    }
    return s;
  }

  std::vector<WorkerLoad> loads(capnp::List<wire::WorkerLoad>::Reader l, std::string_view what) {
    std::vector<WorkerLoad> out;
    out.reserve(list<WorkerLoad>(l, wire_caps::members, what).size());
    for (auto w : l) out.push_back({name(w.getWorker(), what), w.getSamplesPerSecond(), w.getShare()});
    return out;
  }

  template <class List>
  std::vector<std::pair<uint32_t, uint64_t>> held(List l, std::string_view what) {
    std::vector<std::pair<uint32_t, uint64_t>> out;
    out.reserve(list<std::pair<uint32_t, uint64_t>>(l, wire_caps::shards, what).size());
    for (auto h : l) out.emplace_back(h.getShard(), h.getVersion());
    return out;
  }

 private:
  void charge(size_t bytes, std::string_view what) {
    if (bytes > left_)
      throw WireError{WireErrc::over_limit,
                      fmt::format("{} would decode into more than the frame's budget allows ({} bytes left)", what, left_)};
    left_ -= bytes;
  }

  size_t left_;

 public:
  size_t left() const { return left_; }
};

JobProgress get_progress(wire::JobProgress::Reader r) {
  return JobProgress{r.getStep(), r.getEpoch(), r.getPosition(), r.getSamples()};
}

TensorChunk get_chunk(wire::TensorChunk::Reader r, const std::shared_ptr<const void>& owner) {
  TensorChunk c;
  c.step = r.getStep();
  c.shard = r.getShard();
  c.offset = r.getOffset();
  c.total = r.getTotal();
  const auto data = r.getData();
  if (data.size() % sizeof(float) != 0)
    throw WireError{WireErrc::malformed, fmt::format("tensor data of {} bytes is not whole floats", data.size())};
  // Data blobs start on a word boundary inside the (word-aligned) frame, so floats can be viewed
  // in place (no copy: nothing to charge against the decode budget).
  c.data = {reinterpret_cast<const float*>(data.begin()), data.size() / sizeof(float)};
  if (c.offset > c.total || c.data.size() > c.total - c.offset)
    throw WireError{WireErrc::malformed, fmt::format("tensor chunk [{}, +{}) outside a tensor of {}", c.offset,
                                                     c.data.size(), c.total)};
  c.owner = owner;
  return c;
}

Body get_body(wire::Envelope::Reader e, const std::shared_ptr<const void>& owner, Reading& in) {
  switch (e.which()) {
    case wire::Envelope::PING: {
      auto r = e.getPing();
      return Ping{r.getSeqNo(), in.members(r.getUpdates(), "a ping's updates")};
    }
    case wire::Envelope::ACK: {
      auto r = e.getAck();
      return Ack{r.getSeqNo(), in.members(r.getUpdates(), "an ack's updates")};
    }
    case wire::Envelope::PING_REQ: {
      auto r = e.getPingReq();
      return PingReq{r.getSeqNo(), in.member(r.getTarget()), in.members(r.getUpdates(), "a ping-req's updates")};
    }
    case wire::Envelope::JOIN: return Join{in.member(e.getJoin().getMember())};
    case wire::Envelope::LEAVE: return Leave{in.member(e.getLeave().getMember())};
    case wire::Envelope::STATE_SYNC: {
      auto r = e.getStateSync();
      StateSync s{in.members(r.getMembers(), "a state sync's members"), r.getReply(), r.getEpochUnixMs()};
      const auto shards = in.list<ShardHolders>(r.getShards(), wire_caps::shards, "a state sync's shards");
      s.shards.reserve(shards.size());
      for (auto h : shards)
        s.shards.push_back({h.getShard(), in.names(h.getHolders(), wire_caps::holders, "a shard's holders")});
      if (r.hasFigures()) s.figures = in.metrics(r.getFigures());
      for (auto e : in.list<MemberEvent>(r.getEvents(), wire_caps::status_points, "a status's events"))
        s.events.push_back({e.getUnixMs(), in.name(e.getKind(), "an event's kind"), in.name(e.getMember(), "an event's member")});
      if (r.getHasJob()) {
        auto j = r.getJob();
        JobStatus job{j.getJobId(), in.name(j.getMode(), "a status's mode"), j.getGeneration(),
                      in.name(j.getPhase(), "a status's phase"), get_progress(j.getProgress())};
        job.workers = in.cursors(j.getWorkers(), wire_caps::members, "a status's workers");
        job.held_shards = in.held(j.getHeldShards(), "a status's held shards");
        job.loads = in.loads(j.getLoads(), "a status's loads");
        job.lr = j.getLr();
        job.loss = j.getLoss();
        for (auto p : in.list<EvaluationPoint>(j.getEvaluations(), wire_caps::status_points, "a status's evaluations"))
          job.evaluations.push_back({p.getStep(), p.getEpoch(), p.getTrainSeconds(), p.getAccuracy(), p.getLoss()});
        for (auto p : in.list<ProgressPoint>(j.getHistory(), wire_caps::status_points, "a status's history"))
          job.history.push_back({p.getStep(), p.getTrainSeconds(), p.getLoss(), p.getSamplesPerSecond(), p.getLr()});
        for (auto g : in.list<GenerationMark>(j.getGenerations(), wire_caps::status_points, "a status's generations"))
          job.generations.push_back({g.getGeneration(), g.getStep(), g.getWorkers(), g.getUnixMs()});
        s.job = std::move(job);
      }
      return s;
    }
    case wire::Envelope::TENSOR_CHUNK: return get_chunk(e.getTensorChunk(), owner);
    case wire::Envelope::PARAM_PULL: {
      auto r = e.getParamPull();
      return ParamPull{r.getShard(), r.getHaveVersion()};
    }
    case wire::Envelope::PARAM_PUSH: {
      auto r = e.getParamPush();
      return ParamPush{r.getShard(), r.getVersion(), get_chunk(r.getChunk(), owner)};
    }
    case wire::Envelope::CONTROL: {
      auto r = e.getControl();
      const auto command = r.getCommand();
      if (command > wire::Control::Command::JOB_COMPLETE)
        throw WireError{WireErrc::unknown_kind, fmt::format("unknown control command {}", static_cast<int>(command))};
      const auto arg = r.getArgument();
      if (arg.size() > Control::max_argument)
        throw WireError{WireErrc::over_limit, fmt::format("a control argument of {} bytes (at most {})", arg.size(),
                                                          Control::max_argument)};
      return Control{in.name(r.getCoordinator(), "a control's coordinator"), r.getCoordinatorIncarnation(),
                     static_cast<Control::Command>(command), r.getJobId(), std::vector<uint8_t>(arg.begin(), arg.end())};
    }
    case wire::Envelope::JOB_START: {
      auto r = e.getJobStart();
      JobStart j{r.getJobId(),
                 in.text(r.getConfig(), wire_caps::config_bytes, "a job's config"),
                 in.name(r.getSubmitter(), "a job's submitter"),
                 in.names(r.getWorkers(), wire_caps::members, "a job's workers"),
                 in.names(r.getAddresses(), wire_caps::members, "a job's addresses"),
                 in.name(r.getCoordinator(), "a job's coordinator"),
                 r.getCoordinatorBootId(),
                 in.name(r.getSubmitterId(), "a job's submitter id")};
      j.worker_boot_ids = in.numbers<uint64_t>(r.getWorkerBootIds(), wire_caps::members, "a job's boot ids");
      if (!j.addresses.empty() && j.workers.size() != j.addresses.size())
        throw WireError{WireErrc::malformed, fmt::format("job start names {} workers but {} addresses", j.workers.size(),
                                                         j.addresses.size())};
      if (!j.worker_boot_ids.empty() && j.workers.size() != j.worker_boot_ids.size())
        throw WireError{WireErrc::malformed, fmt::format("job start names {} workers but {} boot ids", j.workers.size(),
                                                         j.worker_boot_ids.size())};
      j.generation = r.getGeneration();
      j.resume = get_progress(r.getResume());
      j.donors = in.names(r.getDonors(), wire_caps::members, "a job's donors");
      j.previous_world = r.getPreviousWorld();
      j.reference_batch = r.getReferenceBatch();
      const auto span_lists = in.list<std::vector<uint64_t>>(r.getSpans(), wire_caps::members, "a job's span lists");
      j.spans.reserve(span_lists.size());
      for (auto list : span_lists) {
        auto& spans = j.spans.emplace_back(in.numbers<uint64_t>(list.getSpans(), wire_caps::span_values, "a worker's spans"));
        if (spans.size() % 3 != 0)
          throw WireError{WireErrc::malformed, "job start spans are not (epoch, begin, end) triples"};
        for (size_t k = 0; k < spans.size(); k += 3)
          if (spans[k + 1] > spans[k + 2])
            throw WireError{WireErrc::malformed, fmt::format("job start span [{}, {}) ends before it begins",
                                                             spans[k + 1], spans[k + 2])};
      }
      if (!j.spans.empty() && j.spans.size() != j.workers.size())
        throw WireError{WireErrc::malformed, fmt::format("job start names {} workers but {} span lists",
                                                         j.workers.size(), j.spans.size())};
      j.shards = r.getShards();
      j.previous_workers = in.names(r.getPreviousWorkers(), wire_caps::members, "a job's previous workers");
      j.previous_boot_ids = in.numbers<uint64_t>(r.getPreviousBootIds(), wire_caps::members, "a job's previous boot ids");
      j.shard_sources = in.names(r.getShardSources(), wire_caps::shards, "a job's shard sources");
      if (!j.shard_sources.empty() && j.shard_sources.size() != j.shards)
        throw WireError{WireErrc::malformed, fmt::format("job start names sources of {} shards; the job has {}",
                                                         j.shard_sources.size(), j.shards)};
      if (!j.previous_boot_ids.empty() && j.previous_workers.size() != j.previous_boot_ids.size())
        throw WireError{WireErrc::malformed, fmt::format("job start names {} previous workers but {} boot ids",
                                                         j.previous_workers.size(), j.previous_boot_ids.size())};
      j.worker_regions = in.names(r.getWorkerRegions(), wire_caps::members, "a job's worker regions");
      j.previous_regions = in.names(r.getPreviousRegions(), wire_caps::members, "a job's previous regions");
      if (!j.worker_regions.empty() && j.workers.size() != j.worker_regions.size())
        throw WireError{WireErrc::malformed, fmt::format("job start names {} workers but {} regions", j.workers.size(),
                                                         j.worker_regions.size())};
      if (!j.previous_regions.empty() && j.previous_workers.size() != j.previous_regions.size())
        throw WireError{WireErrc::malformed, fmt::format("job start names {} previous workers but {} regions",
                                                         j.previous_workers.size(), j.previous_regions.size())};
      j.lr_factor = r.getLrFactor();
      if (!(j.lr_factor >= 0 && j.lr_factor <= 1))
        throw WireError{WireErrc::malformed, fmt::format("job start's rate factor {} is not in [0, 1]", j.lr_factor)};
      j.released_epochs = r.getReleasedEpochs();
      j.reset_file = in.text(r.getResetFile(), Control::max_argument, "a job's reset file");
      j.reset_checksum = r.getResetChecksum();
      j.reset_epochs = r.getResetEpochs();
      j.optimizer = in.text(r.getOptimizer(), Control::max_argument, "a job's optimiser");
      j.reset_file_size = r.getResetFileSize();
      j.reset_file_checksum = r.getResetFileChecksum();
      const auto files = in.list<JobFile>(r.getFiles(), JobStart::max_files, "a job's files");
      for (auto f : files)
        j.files.push_back({in.text(f.getPath(), Control::max_argument, "a job file's path"), f.getSize(), f.getChecksum()});
      return j;
    }
    case wire::Envelope::FILE_FETCH: {
      auto r = e.getFileFetch();
      return FileFetch{r.getJobId(), r.getChecksum(), r.getOffset(), r.getLength()};
    }
    case wire::Envelope::FILE_PIECE: {
      auto r = e.getFilePiece();
      const auto data = r.getData();
      if (data.size() > FilePiece::max_bytes)
        throw WireError{WireErrc::over_limit, fmt::format("a file piece of {} bytes (at most {})", data.size(),
                                                          FilePiece::max_bytes)};
      FilePiece piece{r.getJobId(), r.getChecksum(), r.getOffset(), {data.begin(), data.end()}};
      piece.refused = in.text(r.getRefused(), wire_caps::reason_bytes, "a file piece's refusal");
      return piece;
    }
    case wire::Envelope::GENERATION_VOTE: {
      auto r = e.getGenerationVote();
      const auto kind = r.getKind();
      if (kind > wire::GenerationVote::Kind::BACK)
        throw WireError{WireErrc::unknown_kind, fmt::format("unknown generation vote kind {}", static_cast<int>(kind))};
      GenerationVote v{r.getJobId(), static_cast<GenerationVote::Kind>(kind), r.getNumber(), r.getBase()};
      v.workers = in.names(r.getWorkers(), wire_caps::members, "a vote's workers");
      v.progress = get_progress(r.getProgress());
      v.has_state = r.getHasState();
      v.boot_id = r.getBootId();
      v.reason = in.text(r.getReason(), wire_caps::reason_bytes, "a vote's reason");
      v.cursors = in.cursors(r.getCursors(), wire_caps::members, "a vote's cursors");
      v.held_shards = in.held(r.getHeldShards(), "a vote's held shards");
      return v;
    }
    case wire::Envelope::STATE_PULL: {
      auto r = e.getStatePull();
      return StatePull{r.getJobId(), r.getStep(),  r.getOffset(), r.getCount(),
                       r.getOfShard(), r.getShard(), r.getDigest(), r.getGeneration()};
    }
    case wire::Envelope::STATE_PIECE: {
      auto r = e.getStatePiece();
      return StatePiece{r.getJobId(), get_chunk(r.getChunk(), owner), r.getOfShard(), r.getGeneration()};
    }
    case wire::Envelope::SHARD_TRANSFER: {
      auto r = e.getShardTransfer();
      const auto marks = in.list<ShardTransfer::Mark>(r.getMarks(), ShardTransfer::max_marks, "a shard transfer's marks");
      ShardTransfer t{r.getJobId(), r.getShard(), r.getGeneration(), r.getVersion(), r.getOptimizerSteps(),
                      get_chunk(r.getChunk(), owner)};
      t.marks.reserve(marks.size());
      for (auto m : marks) t.marks.push_back({in.name(m.getWorker(), "a mark's worker"), m.getBoot(), m.getSeq()});
      t.refused = in.text(r.getRefused(), wire_caps::reason_bytes, "a shard transfer's refusal");
      t.cursors = in.cursors(r.getCursors(), ShardTransfer::max_marks, "a shard transfer's cursors");
      t.current = r.getCurrent();
      t.donors = in.names(r.getDonors(), ShardTransfer::max_donors, "a shard transfer's donors");
      t.digest = r.getDigest();
      t.released = r.getReleased();
      return t;
    }
    case wire::Envelope::LEAVE_REQUEST: {
      auto r = e.getLeaveRequest();
      const auto kind = r.getKind();
      if (kind > wire::LeaveRequest::Kind::DONE)
        throw WireError{WireErrc::unknown_kind, fmt::format("unknown leave request kind {}", static_cast<int>(kind))};
      return LeaveRequest{in.name(r.getNode(), "a leave request's node"), static_cast<LeaveRequest::Kind>(kind),
                          in.text(r.getDetail(), wire_caps::reason_bytes, "a leave request's detail")};
    }
    case wire::Envelope::RING_CHUNK: {
      auto r = e.getRingChunk();
      return RingChunk{r.getJobId(), r.getPhase(), r.getRound(), get_chunk(r.getChunk(), owner), r.getGeneration()};
    }
    case wire::Envelope::JOB_REPORT: {
      auto r = e.getJobReport();
      const auto kind = r.getKind();
      if (kind > wire::JobReport::Kind::HELD)
        throw WireError{WireErrc::unknown_kind, fmt::format("unknown job report kind {}", static_cast<int>(kind))};
      JobReport report{r.getJobId(),        static_cast<JobReport::Kind>(kind),
                       r.getRank(),         r.getEpoch(),
                       r.getStep(),         r.getLoss(),
                       r.getSamplesPerSecond(), r.getMembers(),
                       r.getTestAccuracy(), r.getTestLoss(),
                       r.getTrainSeconds(), r.getSamples(),
                       r.getBytesSent(),    r.getChecksum(),
                       in.text(r.getError(), wire_caps::reason_bytes, "a job report's error"), r.getEvalSeconds(),
                       r.getComputeSeconds(), r.getStaleRejected(),
                       r.getUpdatesApplied(), r.getExchanges(),
                       r.getStalenessSum()};
      report.lr = r.getLr();
      report.loads = in.loads(r.getLoads(), "a job report's loads");
      report.compute = in.text(r.getCompute(), wire_caps::reason_bytes, "a job report's compute");
      report.generation = r.getGeneration();
      return report;
    }
    case wire::Envelope::SHARD_UPDATE: {
      auto r = e.getShardUpdate();
      const auto kind = r.getKind();
      if (kind > wire::ShardUpdate::Kind::FETCH)
        throw WireError{WireErrc::unknown_kind, fmt::format("unknown shard update kind {}", static_cast<int>(kind))};
      return ShardUpdate{r.getJobId(),  r.getShard(), static_cast<ShardUpdate::Kind>(kind), r.getVersion(),
                         r.getLr(),     get_chunk(r.getChunk(), owner), in.name(r.getOrigin(), "a shard update's origin"),
                         r.getBoot(),   r.getSeq(),   r.getResend(),
                         r.getGeneration(), r.getConsumed(), r.getDigest()};
    }
    case wire::Envelope::SHARD_STATE: {
      auto r = e.getShardState();
      const auto kind = r.getKind();
      if (kind > wire::ShardState::Kind::DURABLE)
        throw WireError{WireErrc::unknown_kind, fmt::format("unknown shard state kind {}", static_cast<int>(kind))};
      return ShardState{r.getJobId(),     r.getShard(),     r.getVersion(),  r.getRejected(),
                        r.getStaleness(), get_chunk(r.getChunk(), owner),    r.getSeq(),
                        r.getDurable(),   r.getDuplicate(), static_cast<ShardState::Kind>(kind),
                        r.getGeneration()};
    }
    case wire::Envelope::GOSSIP_AVERAGE: {
      auto r = e.getGossipAverage();
      return GossipAverage{r.getJobId(), r.getExchange(), r.getReply(), get_chunk(r.getChunk(), owner),
                           r.getGeneration(), r.getConsumed()};
    }
    case wire::Envelope::METRICS: return in.metrics(e.getMetrics());
  }
  throw WireError{WireErrc::unknown_kind, fmt::format("unknown message kind {}", static_cast<int>(e.which()))};
}

/// The largest frame body a message of this kind may come in. Membership and control messages are
/// small by nature (a state sync grows with the view: 65,536 members fit in 16 MiB); only the kinds
/// that carry a tensor may use the whole configured frame.
uint32_t kind_limit(wire::Envelope::Which kind, uint32_t configured) {
  switch (kind) {
    case wire::Envelope::PING:
    case wire::Envelope::ACK:
    case wire::Envelope::PING_REQ:
    case wire::Envelope::JOIN:
    case wire::Envelope::LEAVE: return wire_caps::probe_frame_bytes;
    case wire::Envelope::STATE_SYNC: return max_membership_frame_bytes;
    case wire::Envelope::PARAM_PULL:
    case wire::Envelope::CONTROL:
    case wire::Envelope::STATE_PULL:
    case wire::Envelope::FILE_FETCH:
    case wire::Envelope::LEAVE_REQUEST:
    case wire::Envelope::JOB_REPORT: return wire_caps::control_frame_bytes;
    case wire::Envelope::JOB_START:
    case wire::Envelope::GENERATION_VOTE:
    case wire::Envelope::METRICS: return wire_caps::record_frame_bytes;
    case wire::Envelope::TENSOR_CHUNK:
    case wire::Envelope::PARAM_PUSH:
    case wire::Envelope::RING_CHUNK:
    case wire::Envelope::SHARD_UPDATE:
    case wire::Envelope::SHARD_STATE:
    case wire::Envelope::GOSSIP_AVERAGE:
    case wire::Envelope::STATE_PIECE:
    case wire::Envelope::SHARD_TRANSFER: return configured;
    case wire::Envelope::FILE_PIECE: return std::min<uint32_t>(configured, FilePiece::max_bytes + (64u << 10));
  }
  return 0;  // a kind this build does not know: get_body refuses it
}

/// The received words; tensor chunks and the message share ownership of them. The last owner to
/// let go releases the frame's charge with its account (on whatever thread that is).
struct Received {
  FrameWords words;
  std::shared_ptr<FrameAccount> account;
  size_t charged = 0;  // what the transport charged for the words, plus what decoding allocated
  ~Received() {
    if (account) account->release(charged);
  }
  kj::ArrayPtr<const capnp::word> view() const {
    return {reinterpret_cast<const capnp::word*>(words.data()), words.size()};
  }
};

}  // namespace

OutFrame::OutFrame(std::unique_ptr<capnp::MallocMessageBuilder> builder,
                   std::vector<std::shared_ptr<const void>> keep_alive)
    : builder_(std::move(builder)), keep_alive_(std::move(keep_alive)) {
  const auto segments = builder_->getSegmentsForOutput();
  // Cap'n Proto's stream framing: segment count - 1, each segment's size in words, padded to 8 bytes.
  const size_t table_words = (segments.size() + 2) & ~size_t{1};
  header_.assign(1 + table_words, 0);
  header_[1] = static_cast<uint32_t>(segments.size() - 1);
  size_t body = table_words * sizeof(uint32_t);
  for (size_t i = 0; i < segments.size(); ++i) {
    header_[2 + i] = static_cast<uint32_t>(segments[i].size());
    body += segments[i].size() * sizeof(capnp::word);
  }
  header_[0] = static_cast<uint32_t>(body);  // little-endian hosts only, like the rest of the wire
  pieces_.push_back({header_.data(), header_.size() * sizeof(uint32_t)});
  for (const auto& s : segments) pieces_.push_back({s.begin(), s.size() * sizeof(capnp::word)});
  bytes_ = frame_header_bytes + body;
}

std::vector<uint8_t> OutFrame::flatten() const {
  std::vector<uint8_t> out;
  out.reserve(bytes_);
  for (const auto& p : pieces_) out.insert(out.end(), static_cast<const uint8_t*>(p.data), static_cast<const uint8_t*>(p.data) + p.size);
  return out;
}

OutFrame encode(const Message& message) {
  auto mb = std::make_unique<capnp::MallocMessageBuilder>();
  std::vector<std::shared_ptr<const void>> keep_alive;
  auto e = mb->initRoot<wire::Envelope>();
  e.setSender(message.sender);
  e.setIncarnation(message.incarnation);
  e.setClusterId(message.cluster_id);
  Encoder{*mb, keep_alive}(e, message.body);
  return OutFrame(std::move(mb), std::move(keep_alive));
}

WireResult<uint32_t> frame_length(const uint8_t header[frame_header_bytes], const WireLimits& limits) {
  uint32_t n;
  std::memcpy(&n, header, sizeof n);
  if (n > limits.max_frame_bytes)
    return std::unexpected(WireError{WireErrc::too_large, fmt::format("frame of {} bytes exceeds the limit of {}", n,
                                                                      limits.max_frame_bytes)});
  if (n < 8 || n % 8 != 0)
    return std::unexpected(WireError{WireErrc::truncated, fmt::format("a frame of {} bytes is not whole 8-byte words", n)});
  return n;
}

WireResult<Message> decode_bytes(std::span<const uint8_t> body, const WireLimits& limits) {
  if (body.size() % sizeof(uint64_t) != 0)
    return std::unexpected(WireError{WireErrc::truncated, fmt::format("{} bytes is not whole words", body.size())});
  FrameWords words(body.size() / sizeof(uint64_t));
  std::memcpy(words.data(), body.data(), body.size());
  return decode(std::move(words), limits);
}

WireResult<Message> decode(FrameWords body, const WireLimits& limits, std::shared_ptr<FrameAccount> account,
                           size_t charged) {
  auto received = std::make_shared<Received>();
  received->words = std::move(body);
  received->account = std::move(account);
  received->charged = charged;
  capnp::ReaderOptions options;
  // Reading the message may touch each word at most a few times over: a bound on the work a hostile
  // frame can cause (Cap'n Proto counts list and struct pointers against it).
  options.traversalLimitInWords = received->words.size() * 4 + 64;
  const auto words = received->view();
  options.nestingLimit = limits.nesting_limit;
  try {
    capnp::FlatArrayMessageReader reader(words, options);
    if (reader.getEnd() != words.end())
      return std::unexpected(WireError{WireErrc::malformed, "bytes after the end of the message"});
    const auto e = reader.getRoot<wire::Envelope>();
    const size_t frame_bytes = received->words.size() * sizeof(uint64_t);
    if (const uint32_t limit = std::min(kind_limit(e.which(), limits.max_frame_bytes), limits.max_frame_bytes);
        limit != 0 && frame_bytes > limit)
      return std::unexpected(WireError{WireErrc::too_large, fmt::format("a {} frame of {} bytes (at most {} for its kind)",
                                                                         union_name(e.which()), frame_bytes, limit)});
    const size_t budget = decode_budget_bytes(frame_bytes);
    Reading in(budget);
    Message m;
    m.sender = in.name(e.getSender(), "the sender");
    m.incarnation = e.getIncarnation();
    m.cluster_id = in.name(e.getClusterId(), "the cluster id");
    m.body = get_body(e, received, in);
    if (received->account) {
      const size_t decoded = budget - in.left();
      received->account->charge(decoded);
      received->charged += decoded;
    }
    m.frame = std::move(received);
    return m;
  } catch (const WireError& error) {
    return std::unexpected(error);
  } catch (const kj::Exception& e) {
    const std::string what = e.getDescription().cStr();
    const bool limit = what.find("limit") != std::string::npos;
    return std::unexpected(WireError{limit ? WireErrc::over_limit : WireErrc::malformed, what});
  }
}

std::vector<uint8_t> Release::encode() const {
  std::vector<uint8_t> out;
  const auto put = [&](uint64_t v, size_t bytes) {
    for (size_t b = 0; b < bytes; ++b) out.push_back(static_cast<uint8_t>(v >> (8 * b)));
  };
  put(epochs, 4);
  if (!reset_checksum && optimizer.empty()) return out;
  const std::string& path = reset_checksum ? reset_file.path : std::string();
  for (const uint64_t v : {reset_checksum, reset_file.size, reset_file.checksum}) put(v, 8);
  put(path.size(), 4);
  out.insert(out.end(), path.begin(), path.end());
  out.insert(out.end(), optimizer.begin(), optimizer.end());
  return out;
}

std::optional<Release> Release::decode(const std::vector<uint8_t>& a) {
  constexpr size_t head = 4 + 3 * 8 + 4;
  if (a.size() != 4 && a.size() < head) return std::nullopt;
  size_t at = 0;
  const auto get = [&](size_t bytes) {
    uint64_t v = 0;
    for (size_t b = 0; b < bytes; ++b) v |= uint64_t{a[at + b]} << (8 * b);
    at += bytes;
    return v;
  };
  Release r;
  r.epochs = static_cast<uint32_t>(get(4));
  if (a.size() == 4) return r;
  r.reset_checksum = get(8);
  r.reset_file.size = get(8);
  r.reset_file.checksum = get(8);
  const auto path_size = get(4);
  if (path_size > a.size() - head) return std::nullopt;
  r.reset_file.path.assign(a.begin() + head, a.begin() + static_cast<ptrdiff_t>(head + path_size));
  r.optimizer.assign(a.begin() + static_cast<ptrdiff_t>(head + path_size), a.end());
  return r;
}

const char* kind_name(const Body& body) {
  static_assert(std::size(kind_names) == std::variant_size_v<Body>);
  return kind_names[body.index()];
}

bool is_membership(const Body& b) {
  return std::holds_alternative<Ping>(b) || std::holds_alternative<Ack>(b) || std::holds_alternative<PingReq>(b) ||
         std::holds_alternative<Join>(b) || std::holds_alternative<Leave>(b) || std::holds_alternative<StateSync>(b);
}

}  // namespace tepdist::gossip

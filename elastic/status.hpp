#pragma once
// The status document: what one member answers a status query with (its membership view, the
// async job's shard placement, and its job's generation and positions), as one model with two
// renderings. `tepdist status` prints the table or, with --json, the JSON; the monitoring issue's
// HTTP /status serves the same JSON. Add a field here and both show it.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gossip/wire/messages.hpp"

namespace tepdist::elastic {

/// A node's latest summary, as the monitor role's gossip spreads it (actors/roles/monitor.hpp):
/// when it was taken, and its figures by name.
struct NodeFigures {
  uint64_t unix_ms = 0;
  std::map<std::string, double> values;
  friend bool operator==(const NodeFigures&, const NodeFigures&) = default;
};
/// Every node's latest summary as one node knows it, by id.
using FigureTable = std::map<std::string, NodeFigures>;

/// The table as a MetricsSnapshot (per node an entry "unix_ms" and one per figure, each labelled
/// node=ID), and back (entries without a node label, and nodes without unix_ms, are left out).
gossip::MetricsSnapshot snapshot_of(const FigureTable& table);
FigureTable table_of(const gossip::MetricsSnapshot& snapshot);

/// Merges `in` into `table` node by node, the newer summary winning; only ids in `known` (empty:
/// any). Whether anything changed.
bool merge_figures(FigureTable& table, const FigureTable& in, const std::vector<std::string>& known);

struct StatusDocument {
  std::string source;  ///< the member that answered (host:port)
  uint64_t epoch_unix_ms = 0;
  std::vector<gossip::Member> members;
  std::vector<gossip::ShardHolders> shards;
  std::optional<gossip::JobStatus> job;  ///< the answering member's job, if it runs one
  /// Async: each shard's version as its primary reported it (add_versions); absent: not heard.
  std::map<uint32_t, uint64_t> versions;
  /// Every node's figures as the answering member holds them (its monitor's gossip).
  FigureTable figures;
  /// The answering member's latest membership events (joined, suspected, dead, left, ...), oldest first.
  std::vector<gossip::MemberEvent> events;
};

/// The document of a member's answer to a status query.
StatusDocument status_document(std::string source, const gossip::StateSync& answer);

/// Async: the versions `member` reported (its answer to a status query) of the shards it is the
/// primary of in `doc`'s placement. `tepdist status` asks every primary.
void add_versions(StatusDocument& doc, const std::string& member, const gossip::StateSync& answer);

/// The members that are some shard's primary in `doc`'s placement.
std::vector<gossip::Member> shard_primaries(const StatusDocument& doc);

/// JSON, indented: {source, epoch_unix_ms, nodes: [{id, state, stale, age_s, figures: {name:
/// value}}] (every member's summary the answering node holds; stale: taken over 3 x `every` ago
/// or from a member not alive), events: [{unix_ms, kind, member}] (its latest membership events),
/// members: [{id, state, incarnation, address, region,
/// roles, shards: [{shard, primary}]}], shards: [{shard, primary, replicas, version (null: not
/// heard)}], job: null | {job_id, mode, generation, phase, step, epoch, position, samples, lr, loss,
/// workers: [{id, position, step, lag_steps, samples_per_second, share, staleness}] (step, lag_steps:
/// the steps behind the furthest worker, and async staleness from each worker's own figures; null
/// where they are not fresh), evaluations: [{step, epoch, train_seconds,
/// test_accuracy, test_loss}] (rank 0's), history: [{step, train_seconds, loss, samples_per_second,
/// lr}], generations: [{generation, resume_step, workers, installed_unix_ms}]}}.
std::string status_json(const StatusDocument& doc);

/// A member's state as the status and error messages write it: "alive", "suspect", "dead", "left".
const char* state_name(gossip::Member::State s);

/// The table `tepdist status` prints: one row per member, then the job's generation and each
/// worker's position.
std::string status_table(const StatusDocument& doc);

}  // namespace tepdist::elastic

#pragma once
// The router: the actor between a node's transport and its roles. It drives the SWIM core
// (membership messages in, timers, messages out), answers status queries, logs each new view with
// the coordinator it names, and hands job frames and views to the trainer (or submitter).

#include <caf/actor.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/stateful_actor.hpp>
#include <spdlog/spdlog.h>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gossip/swim/swim.hpp"
#include "gossip/transport/transport.hpp"

namespace tepdist::actors {

/// Everything the router needs once the transport has bound its address.
struct RouterInit {
  gossip::Member self;
  std::vector<std::string> seeds;
  gossip::swim::Config swim;
  uint64_t epoch_unix_ms = 0;
  caf::actor supervisor;
  /// `tepdist leave` named this node: starts the drain and leave; from the router's thread, with
  /// the asker's address for the final answer. Empty (a submitter): such requests are refused.
  std::function<void(const std::string& asker)> on_leave_request;
};

struct RouterState {
  gossip::Transport* transport = nullptr;
  std::string cluster_id;
  caf::actor supervisor;
  std::function<void(const std::string& asker)> on_leave_request;
  bool leave_requested = false;
  caf::actor job;     ///< the trainer or submitter: job frames and views go there
  caf::actor shards;  ///< the async job's shard host: ShardUpdate and ShardTransfer frames go there
  std::vector<gossip::ShardHolders> placement;  ///< that job's shards, for status answers
  std::optional<gossip::JobStatus> job_status;  ///< the trainer's job as it last told, for status answers
  caf::actor monitor;                 ///< the monitor role: figure gossip (MetricsSnapshot frames) goes there
  gossip::MetricsSnapshot figures;    ///< every node's figures as the monitor last told, for status answers
  std::deque<gossip::MemberEvent> events;  ///< the latest membership events, for status answers
  static constexpr size_t event_limit = 64;
  /// ShardUpdate frames that came while no host was registered, for the next one.
  struct Early {
    std::string peer, address;
    gossip::Message message;
  };
  std::vector<Early> early_shards;
  std::vector<Early> early_jobs;  ///< job frames that came before the trainer (or submitter) registered
  /// The last connection trouble before it registered (a seed that refused the first connection):
  /// said to it when it does, so a join that fails at once is not reported as "no problem".
  std::optional<std::pair<std::string, std::string>> early_trouble;
  static constexpr size_t early_job_limit = 64;
  size_t early_shard_bytes = 0;
  static constexpr size_t early_shard_limit = 256u << 20;
  std::unique_ptr<gossip::swim::Swim> swim;
  std::mt19937_64 random;
  std::chrono::steady_clock::time_point start;
  uint64_t epoch_unix_ms = 0;
  bool tick_pending = false;
  double tick_at_ms = 0;  ///< when the earliest tick on its way comes (now_ms's clock)
  static inline const char* name = "tepdist.router";
};

/// Takes (init_atom, RouterInit) first (frames arriving before it wait), then frames
/// (wire_atom, peer id, peer address, Message), peer news (peer_atom, up, id, detail), its own
/// timer (tick_atom), (job_atom, actor) from the trainer or submitter that takes job frames and
/// membership views, (shards_atom, actor, placement) from the trainer: the shard host of its async
/// job and where that job's shards live (an empty actor when the job ends), (status_atom,
/// optional JobStatus) from the trainer: its job for status answers, (boot_atom, boot id) from a
/// restarted trainer: the node announces a new run of itself, (monitor_atom, actor) and
/// (monitor_atom, MetricsSnapshot) from the monitor role: where figure gossip goes, and every node's
/// figures for status answers, (get_atom, status_atom) -> StateSync:
/// what a status query over the wire is answered with (the node's HTTP /status), and (leave_atom)
/// -> true once the leave is announced.
caf::behavior router(caf::stateful_actor<RouterState>* self, gossip::Transport* transport, std::string cluster_id);

/// The node's event stream on stdout: one line per event, key=value fields.
spdlog::logger& node_events();

/// Wall-clock milliseconds since the Unix epoch (incarnations, the times status shows).
uint64_t unix_ms();

/// Sends the event stream to a file instead (`tepdist run` keeps its terminal for progress). Call
/// before any node thread starts; false if the file cannot be opened.
bool node_events_to_file(const std::string& path);

}  // namespace tepdist::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tepdist::gossip::Message)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tepdist::actors::RouterInit)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::vector<tepdist::gossip::Member>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::vector<tepdist::gossip::ShardHolders>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::optional<tepdist::gossip::JobStatus>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tepdist::gossip::StateSync)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tepdist::gossip::MetricsSnapshot)

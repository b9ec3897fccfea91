#pragma once
// The job file: one schema for every subcommand. Each subcommand loads and validates the whole
// file (unknown sections or keys, wrong types and out-of-range values are errors that name the
// file, line and key) and then uses the sections it needs.
//
// Sections so far: [job] [model] [data] [optimizer] [compute] [cluster] [network] [elastic] [membership]. docs/config.md lists every key; a
// test keeps it in step with schema().

#include <cstdint>
#include <expected>
#include <filesystem>
#include <optional>
#include <span>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "compute/optimizer.hpp"
#include "compute/presets.hpp"
#include "gossip/transport/frame_seal.hpp"
#include "gossip/swim/config.hpp"
#include "gossip/transport/link_emulator.hpp"

namespace tepdist::elastic {

struct JobConfig {
  struct Job {
    std::string mode = "single";
    int64_t epochs = 3;
    int64_t max_steps = 0;  ///< 0: no cap
    uint64_t seed = 0;
    int64_t eval_every_steps = 0;  ///< 0: only at epoch ends
    double target_accuracy = 0.85;
    bool stop_at_target = false;
    /// The workers wait after each epoch until the submitter releases the next (tepdist::Trainer's
    /// train() calls).
    bool pause_between_epochs = false;
    int64_t log_every_steps = 50;
    int64_t ring_chunk_kb = 256;
    bool ring_overlap = true;
    double step_timeout_s = 60;
    int64_t max_staleness = 16;
    int64_t gossip_every = 4;
    friend bool operator==(const Job&, const Job&) = default;
  } job;
  struct Model {
    std::string preset = "lenet";
    std::vector<compute::LayerSpec> layers;  ///< non-empty: used instead of the preset
    std::string init_file;                   ///< non-empty: parameters to start from
    friend bool operator==(const Model&, const Model&) = default;
  } model;
  struct Data {
    std::string dataset = "fashion-mnist";
    std::string dir = "/usr/share/datasets/fashion-mnist";
    std::string train_file, test_file;  ///< dataset = "files"
    int64_t batch_size = 64;
    int64_t train_samples = 0;  ///< 0: all (synthetic: 10,000)
    int64_t test_samples = 0;   ///< 0: all (synthetic: 2,000)
    bool shuffle = true;
    friend bool operator==(const Data&, const Data&) = default;
  } data;
  struct Optimizer {
    compute::OptimizerOptions options;
    compute::ScheduleOptions schedule;  ///< total_steps is filled in by the training loop
    /// Cluster jobs: the global batch `lr` is meant for (0: the job's first global batch), and how
    /// the rate follows the actual global batch: "linear", "sqrt", "none", or "auto" (sqrt for
    /// Adam and AdamW, linear for SGD).
    int64_t reference_batch = 0;
    std::string scaling = "auto";
    int64_t plateau_patience = 0;  ///< cluster jobs: evaluations without a better loss before a decay; 0: none
    double plateau_factor = 0.5;   ///< what a decay multiplies the rate by
    /// The scaling rule `scaling` names for this optimiser: "linear", "sqrt" or "none".
    std::string scaling_rule() const {
      if (scaling != "auto") return scaling;
      return options.name == "sgd" ? "linear" : "sqrt";
    }
    friend bool operator==(const Optimizer&, const Optimizer&) = default;
  } optimizer;
  struct Compute {
    std::string backend = "onednn";
    int64_t threads = 0;  ///< 0: every core
    int64_t device = 0;   ///< backend cuda: the CUDA device
    bool deterministic = true;  ///< backend cuda: reproducible convolution algorithms
    /// Emulation (tests): a host backend keeps the training state apart from the model's buffers,
    /// as the cuda backend keeps it on its device (compute/resident.hpp).
    bool emulate_device = false;
    /// Emulation of a slower node: each step takes this many times its compute time. A node
    /// setting ([nodes.NAME] slowdown overrides it); the load balancer never reads it.
    double slowdown = 1;
    friend bool operator==(const Compute&, const Compute&) = default;
  } compute;

  struct Cluster {
    std::string cluster_id = "tepdist";
    std::string secret;       ///< the cluster secret itself (prefer secret_file)
    std::string secret_file;  ///< a file holding the secret; must not be readable by group or others
    bool encrypt = true;      ///< frames after the handshake: encrypted (AES-256-GCM), else authenticated only
    int64_t max_frame_mb = 64;
    int64_t send_queue_mb = 64;
    int64_t receive_queue_mb = 128;   ///< per connection: received frames held before reading waits
    int64_t receive_total_mb = 1024;  ///< all connections together
    int64_t reconnect_max_ms = 2000;
    int64_t local_nodes = 0;         ///< tepdist run: node processes to start on loopback
    double join_timeout_s = 30;      ///< tepdist run: how long the submitter waits to see the cluster
    std::vector<std::string> seeds;  ///< tepdist run without local nodes: where to join
    std::string results_dir = "tepdist-results";  ///< a node's: where rank 0 saves jobs whose submitter is gone
    /// How this cluster's frames are sealed after the handshake.
    gossip::FrameProtection frames() const {
      return encrypt ? gossip::FrameProtection::encrypted : gossip::FrameProtection::authenticated;
    }
    friend bool operator==(const Cluster&, const Cluster&) = default;
  } cluster;
  /// Settings of one node, from its [nodes.NAME] table (later issues add keys here).
  struct Node {
    std::string region = "local";  ///< the link emulator's region
    double slowdown = 0;           ///< [compute] slowdown for this node alone; 0: [compute]'s
    int64_t device = -1;           ///< backend "cuda": this node's CUDA device; -1: the job's [compute] device
    friend bool operator==(const Node&, const Node&) = default;
  };
  /// [nodes.NAME]: by node name. `tepdist run`'s local nodes are local_node_name(i); a node started
  /// by hand looks up its --name. A node not listed has the defaults.
  std::map<std::string, Node> nodes;
  /// The settings of the node named `name` (the defaults when the file has no table for it).
  Node node(const std::string& name) const {
    const auto it = nodes.find(name);
    return it == nodes.end() ? Node{} : it->second;
  }
  struct Network {
    gossip::NetworkModel model;        ///< [[network.link]] and [[network.partition]]
    friend bool operator==(const Network&, const Network&) = default;
  } network;

  struct Elastic {
    int64_t shards = 0;  ///< 0: twice the workers
    int64_t replication = 2;
    int64_t push_window = 2;
    int64_t local_steps = 4;        ///< 0: push gradients; H: push each worker's own change every H steps
    double outer_lr = 0;            ///< updates mode: changes count outer_lr / (1 + staleness); 0: (1 + recent staleness) / W
    std::string quorum = "majority";  ///< job control: "majority" of the previous generation, or "any" one survivor
    int64_t min_workers = 1;        ///< no generation with fewer workers
    int64_t rescale_batches = 8;    ///< global batches over which the rate moves to a new world's scale
    bool balance = true;            ///< sync: each worker's share of the global batch follows its measured speed
    int64_t balance_quantum = 8;    ///< sync: shares are multiples of this many samples
    std::string restart = "on-failure";  ///< `tepdist run`: restart crashed local nodes ("on-failure") or not ("never")
    int64_t restart_budget = 3;     ///< restarts per local node
    int64_t checkpoint_every_steps = 0;  ///< sync: rank 0 writes the state every this many steps (0: not by steps)
    double checkpoint_every_s = 0;       ///< and/or every this many seconds (0: not by time)
    std::string checkpoint_dir;          ///< "": OUT/checkpoints (tepdist run, local nodes), else results_dir/JOB/checkpoints
    int64_t checkpoint_keep = 3;         ///< the newest this many are kept
    std::string resume_from;             ///< a checkpoint part the first generation starts from ("": none)
    friend bool operator==(const Elastic&, const Elastic&) = default;
  } elastic;

  struct Membership {
    std::string profile = "lan";
    double probe_interval_ms = 0;  ///< 0: the profile's
    double probe_timeout_ms = 0;   ///< 0: the profile's
    double suspicion_mult = 0;     ///< 0: the profile's
    double dead_retention_ms = 0;  ///< 0: the profile's
    friend bool operator==(const Membership&, const Membership&) = default;
    /// The profile's knobs with every key set here in place of the profile's value.
    gossip::swim::Config swim() const;
  } membership;

  struct Monitor {
    /// The node's read-only HTTP endpoint (/metrics, /status, the dashboard), host:port; port 0:
    /// any free one (the bound address is in the ready file and the log); "": none.
    std::string http = "127.0.0.1:0";
    friend bool operator==(const Monitor&, const Monitor&) = default;
  } monitor;

  /// Where the configuration came from, for messages: a path or "(built-in defaults)".
  std::string source;
  /// The document with every override applied, as TOML: what `tepdist run` sends the nodes, so
  /// they train with exactly the settings the launcher validated.
  std::string text;

  /// Equal settings, wherever they came from (source is not compared).
  bool same_settings(const JobConfig& o) const {
    return job == o.job && model == o.model && data == o.data && optimizer == o.optimizer && compute == o.compute &&
           cluster == o.cluster && nodes == o.nodes && network == o.network && elastic == o.elastic &&
           membership == o.membership;
  }
};

/// An error that names the file, line and key at fault; message is fit to print as it is.
struct ConfigError {
  std::string message;
};

template <class T>
using ConfigResult = std::expected<T, ConfigError>;

/// Loads file (nullopt: the built-in defaults) and applies overrides ("section.key=value", value
/// in TOML syntax, bare words taken as strings), validating everything.
ConfigResult<JobConfig> load_config(const std::optional<std::filesystem::path>& file,
                                    std::span<const std::string> overrides = {});

/// Parses and validates TOML text (name is used in messages).
ConfigResult<JobConfig> parse_config(std::string_view text, const std::string& name,
                                     std::span<const std::string> overrides = {});

enum class KeyType { integer, number, boolean, string, layers, strings, tables, table };

/// One key of the schema, as documented in docs/config.md.
struct KeyInfo {
  std::string_view section, key;
  KeyType type;
  std::string_view default_text;  ///< as it would be written in TOML
  std::string_view doc;           ///< unit, range and meaning
};

/// The document as a job carries it to the nodes (and they to each other): `text` with an inline
/// [cluster] secret removed. Every node proves its own secret; none is shipped.
ConfigResult<std::string> text_for_nodes(const JobConfig& config);

/// `value` as a TOML basic string (quoted, with `"`, `\` and control characters escaped), for an
/// override's value: `--set data.train_file=` + toml_string(path).
std::string toml_string(std::string_view value);

/// The name `tepdist run` gives its local node i: node-00, node-01, ...
std::string local_node_name(int64_t i);

/// Every key every subcommand accepts, section by section.
std::vector<KeyInfo> schema();

/// The schema as Markdown: a "## [section]" heading and a table of keys per section. docs/config.md
/// holds exactly this between its schema markers (a test checks; tests/tools/config_doc rewrites it).
std::string schema_markdown();

}  // namespace tepdist::elastic

namespace tepdist::elastic {

/// The shortest cluster secret accepted.
constexpr size_t min_secret_bytes = 16;

/// The cluster secret: [cluster] secret, or the contents of secret_file (trailing newline
/// dropped), which must exist and be readable by its owner only, and hold at least
/// min_secret_bytes. Errors name the file.
ConfigResult<std::string> load_secret(const JobConfig::Cluster& cluster);

}  // namespace tepdist::elastic

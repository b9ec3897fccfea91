#include "elastic/config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <optional>
#include <sys/stat.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <fstream>
#include <iterator>
#include <sstream>
#include <toml.hpp>

namespace tepdist::elastic {
namespace {

constexpr double inf = std::numeric_limits<double>::infinity();

/// A key of the schema with everything needed to check and apply it.
struct Key {
  KeyInfo info;
  double min = -inf, max = inf;          // inclusive bounds for integers and numbers
  bool min_exclusive = false;            // (min, ...] instead of [min, ...]
  bool max_exclusive = false;            // [..., max) instead of [..., max]
  std::vector<std::string_view> choices;  // allowed strings; empty: any
  std::function<void(JobConfig&, const toml::value&)> apply;
};

/// Assigns a TOML value to the field at the end of a member-pointer path, converting to its type.
template <auto... Path>
void assign(JobConfig& c, const toml::value& v) {
  auto& field = (c.*....*Path);
  using T = std::remove_reference_t<decltype(field)>;
  if constexpr (std::is_same_v<T, bool>)
    field = v.as_boolean();
  else if constexpr (std::is_integral_v<T>)
    field = static_cast<T>(v.as_integer());
  else if constexpr (std::is_floating_point_v<T>)
    field = static_cast<T>(v.is_integer() ? static_cast<double>(v.as_integer()) : v.as_floating());
  else
    field = v.as_string().str;
}

std::string where(const toml::value& v) {
  const auto loc = v.location();
  return fmt::format("{}:{}", loc.file_name(), loc.line());
}

ConfigError error_at(const toml::value& v, std::string_view what) {
  return ConfigError{fmt::format("{}: {}", where(v), what)};
}

void apply_layers(JobConfig& c, const toml::value& v);
void apply_node(JobConfig& c, const std::string& name, const toml::value& v);
void apply_seeds(JobConfig& c, const toml::value& v);
void apply_links(JobConfig& c, const toml::value& v);
void apply_partitions(JobConfig& c, const toml::value& v);

const std::vector<Key>& keys() {
  using J = JobConfig;
  static const std::vector<Key> k = {
      // [job]
      {{"job", "mode", KeyType::string, "\"single\"",
        "How the job trains: \"single\" (`tepdist train`, one process); with `tepdist run`, \"sync\" (every "
        "step the workers sum gradients by a ring all-reduce and apply the same update), \"async\" (workers push "
        "gradients to sharded parameters and pull them back, no barrier; see [elastic]) or \"gossip\" (every "
        "worker keeps a replica and averages it with a random peer every gossip_every steps)."},
       -inf, inf, false, false, {"single", "sync", "async", "gossip"}, assign<&J::job, &J::Job::mode>},
      {{"job", "epochs", KeyType::integer, "3", "Passes over the training data; 1 to 10000."},
       1, 10000, false, false, {}, assign<&J::job, &J::Job::epochs>},
      {{"job", "max_steps", KeyType::integer, "0", "Stop after this many optimiser steps; 0 means no cap."},
       0, 1e12, false, false, {}, assign<&J::job, &J::Job::max_steps>},
      {{"job", "seed", KeyType::integer, "0",
        "Seeds initialisation, shuffling and dropout; the same seed gives the same run."},
       0, 9.2e18, false, false, {}, assign<&J::job, &J::Job::seed>},
      {{"job", "eval_every_steps", KeyType::integer, "0",
        "Evaluate on the test set every this many steps (besides every epoch end); 0: epoch ends only."},
       0, 1e12, false, false, {}, assign<&J::job, &J::Job::eval_every_steps>},
      {{"job", "target_accuracy", KeyType::number, "0.85",
        "Test accuracy whose first crossing is reported as time_to_target_seconds; 0 to 1."},
       0, 1, false, false, {}, assign<&J::job, &J::Job::target_accuracy>},
      {{"job", "stop_at_target", KeyType::boolean, "false",
        "tepdist run: end the job at the first evaluation that reaches target_accuracy instead of running all "
        "epochs (sync: every worker stops after the same step; async and gossip: rank 0 tells the others, and "
        "each stops after the step it is on, then the usual end: shards pulled, or the final average). For "
        "time-to-accuracy benchmarks."},
       -inf, inf, false, false, {}, assign<&J::job, &J::Job::stop_at_target>},
      {{"job", "pause_between_epochs", KeyType::boolean, "false",
        "Cluster jobs: the workers wait at the end of each epoch, with the model sent to the submitter (gossip: "
        "the average of the replicas; async: assembled from the shards once every update is applied), until "
        "it releases the next one; the job stays one job (optimiser state, schedule, generations). Set by "
        "tepdist::Trainer, whose train() calls release one epoch each; `tepdist run` releases every epoch at "
        "once."},
       -inf, inf, false, false, {}, assign<&J::job, &J::Job::pause_between_epochs>},
      {{"job", "log_every_steps", KeyType::integer, "50", "Steps between progress-line updates; 1 or more."},
       1, 1e9, false, false, {}, assign<&J::job, &J::Job::log_every_steps>},
      {{"job", "ring_chunk_kb", KeyType::integer, "256",
        "sync: largest piece of a gradient one ring message carries, KiB. Smaller pipelines the rounds more "
        "finely, at more messages per step. Also the piece of every state transfer: a joiner's pull of the job's "
        "state, and an async shard larger than one piece, which a new holder pulls striped over the shard's "
        "holders. 1 to 65536."},
       1, 65536, false, false, {}, assign<&J::job, &J::Job::ring_chunk_kb>},
      {{"job", "ring_overlap", KeyType::boolean, "true",
        "sync: each chunk of the gradient starts on its way round the ring as soon as the backward pass has "
        "finished the layers it holds, while the layers before them are still being differentiated (with "
        "three or more workers, only this worker's own segment of the ring; the sums are the same, bit for "
        "bit); false sends everything once the step's whole gradient is computed."},
       -inf, inf, false, false, {}, assign<&J::job, &J::Job::ring_overlap>},
      {{"job", "step_timeout_s", KeyType::number, "60",
        "A step that waits this long for what it needs: in sync (and in gossip's final average, once the "
        "previous worker has started it) the previous worker in the ring, which membership still holds live, "
        "is asked whether its trainer takes messages; if it does not answer within half this time, it is left "
        "out of the next generation (evicted), and taken back once it runs again; in async the job fails, naming the shard primaries "
        "whose answers it waited for (once max_staleness steps are unanswered, or at the end). A worker that "
        "dies is membership's, and sooner. Seconds, (0, 86400]."},
       0, 86400, true, false, {}, assign<&J::job, &J::Job::step_timeout_s>},
      {{"job", "max_staleness", KeyType::integer, "16",
        "async: a push computed on a shard version more than this many updates old is refused (counted as "
        "stale_rejected) and its batch recomputed; accepted pushes use lr / (1 + staleness). Also the steps a "
        "worker goes on without an answer from a shard before it waits. 0 to 1000000."},
       0, 1e6, false, false, {}, assign<&J::job, &J::Job::max_staleness>},
      {{"job", "gossip_every", KeyType::integer, "4",
        "gossip: local steps between an active worker's parameter averagings with a random passive peer. "
        "Fewer averages more often (more traffic, replicas closer together). 1 to 1000000."},
       1, 1e6, false, false, {}, assign<&J::job, &J::Job::gossip_every>},
      // [model]
      {{"model", "preset", KeyType::string, "\"lenet\"",
        "A built-in model: \"lenet\" (conv 1->20 5x5, pool 2, relu, conv 20->50 5x5, pool 2, relu, "
        "linear 800->500, relu, linear 500->10), \"widecnn\" (conv 1->64 3x3 padding 1, pool 2, relu, conv "
        "64->128 3x3 padding 1, pool 2, relu, linear 6272->512, relu, linear 512->10), \"mlp\" (flatten, "
        "linear ->256, relu, linear ->10), or \"program\": the model class the running program registered "
        "(tepdist::Trainer does; elsewhere an error)."},
       -inf, inf, false, false, {"lenet", "widecnn", "mlp", "program"}, assign<&J::model, &J::Model::preset>},
      {{"model", "init_file", KeyType::string, "\"\"",
        "A .safetensors file the model starts from instead of its seeded initialisation (every tensor by "
        "name and shape); empty: the seed's parameters. tepdist::Trainer hands each job its model this way."},
       -inf, inf, false, false, {}, assign<&J::model, &J::Model::init_file>},
      {{"model", "layers", KeyType::layers, "[]",
        "A model of your own instead of the preset: a list of inline tables, each with type "
        "(conv2d, max_pool2d, relu, flatten, linear, dropout), an optional name and its arguments: "
        "conv2d out_channels, kernel, stride=1, padding=0, in_channels=0 (0: inferred); max_pool2d "
        "kernel, stride=kernel; linear out_features, in_features=0 (0: inferred); dropout p."},
       -inf, inf, false, false, {}, apply_layers},
      // [data]
      {{"data", "dataset", KeyType::string, "\"fashion-mnist\"",
        "\"fashion-mnist\": the four MNIST-format IDX files in dir (gzip or not); \"synthetic\": "
        "generated class patterns plus noise, for tests and demos; \"files\": train_file and test_file, "
        "data set files of any sample shape, bytes or floats (compute/data/dataset_file.hpp; "
        "tepdist::Trainer writes them)."},
       -inf, inf, false, false, {"fashion-mnist", "synthetic", "files"}, assign<&J::data, &J::Data::dataset>},
      {{"data", "train_file", KeyType::string, "\"\"",
        "dataset = \"files\": the training set, a tepdist data set file (safetensors: x [n, ...sample] U8 or F32, "
        "y [n] I32) at a path every node can read."},
       -inf, inf, false, false, {}, assign<&J::data, &J::Data::train_file>},
      {{"data", "test_file", KeyType::string, "\"\"",
        "dataset = \"files\": the test set the job's evaluations use, in the same format; \"\": the first "
        "1,000 training samples."},
       -inf, inf, false, false, {}, assign<&J::data, &J::Data::test_file>},
      {{"data", "dir", KeyType::string, "\"/usr/share/datasets/fashion-mnist\"",
        "Directory holding train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz "
        "and t10k-labels-idx1-ubyte.gz (Debian package dataset-fashion-mnist)."},
       -inf, inf, false, false, {}, assign<&J::data, &J::Data::dir>},
      {{"data", "batch_size", KeyType::integer, "64", "Samples per step and worker; 1 to 65536."},
       1, 65536, false, false, {}, assign<&J::data, &J::Data::batch_size>},
      {{"data", "train_samples", KeyType::integer, "0",
        "Use only the first this many training samples; 0: all (synthetic: 10000)."},
       0, 1e9, false, false, {}, assign<&J::data, &J::Data::train_samples>},
      {{"data", "test_samples", KeyType::integer, "0",
        "Evaluate on only the first this many test samples; 0: all (synthetic: 2000)."},
       0, 1e9, false, false, {}, assign<&J::data, &J::Data::test_samples>},
      {{"data", "shuffle", KeyType::boolean, "true", "Reshuffle the training samples every epoch (seeded)."},
       -inf, inf, false, false, {}, assign<&J::data, &J::Data::shuffle>},
      // [optimizer]
      {{"optimizer", "name", KeyType::string, "\"sgd\"", "\"sgd\", \"adam\" or \"adamw\" (PyTorch semantics)."},
       -inf, inf, false, false, {"sgd", "adam", "adamw"},
       assign<&J::optimizer, &J::Optimizer::options, &compute::OptimizerOptions::name>},
      {{"optimizer", "lr", KeyType::number, "0.01", "Base learning rate; (0, 10]."},
       0, 10, true, false, {}, assign<&J::optimizer, &J::Optimizer::schedule, &compute::ScheduleOptions::base_lr>},
      {{"optimizer", "momentum", KeyType::number, "0.9", "SGD momentum; [0, 1)."},
       0, 1, false, true, {}, assign<&J::optimizer, &J::Optimizer::options, &compute::OptimizerOptions::momentum>},
      {{"optimizer", "nesterov", KeyType::boolean, "false", "SGD with Nesterov momentum (needs momentum > 0)."},
       -inf, inf, false, false, {}, assign<&J::optimizer, &J::Optimizer::options, &compute::OptimizerOptions::nesterov>},
      {{"optimizer", "weight_decay", KeyType::number, "0.0",
        "L2 penalty added to the gradient (sgd, adam) or decoupled decay (adamw); [0, 1]."},
       0, 1, false, false, {},
       assign<&J::optimizer, &J::Optimizer::options, &compute::OptimizerOptions::weight_decay>},
      {{"optimizer", "beta1", KeyType::number, "0.9", "Adam first-moment decay; [0, 1)."},
       0, 1, false, true, {}, assign<&J::optimizer, &J::Optimizer::options, &compute::OptimizerOptions::beta1>},
      {{"optimizer", "beta2", KeyType::number, "0.999", "Adam second-moment decay; [0, 1)."},
       0, 1, false, true, {}, assign<&J::optimizer, &J::Optimizer::options, &compute::OptimizerOptions::beta2>},
      {{"optimizer", "eps", KeyType::number, "1e-8", "Adam denominator guard; (0, 1]."},
       0, 1, true, false, {}, assign<&J::optimizer, &J::Optimizer::options, &compute::OptimizerOptions::eps>},
      {{"optimizer", "schedule", KeyType::string, "\"constant\"",
        "Learning-rate schedule after warm-up: \"constant\", \"step\" (times gamma every step_size steps) or "
        "\"cosine\" (down to min_lr at the last step)."},
       -inf, inf, false, false, {"constant", "step", "cosine"},
       assign<&J::optimizer, &J::Optimizer::schedule, &compute::ScheduleOptions::kind>},
      {{"optimizer", "warmup_steps", KeyType::integer, "0", "Linear warm-up from lr/warmup_steps to lr; steps."},
       0, 1e9, false, false, {},
       assign<&J::optimizer, &J::Optimizer::schedule, &compute::ScheduleOptions::warmup_steps>},
      {{"optimizer", "step_size", KeyType::integer, "1000", "Step schedule period; steps, 1 or more."},
       1, 1e9, false, false, {}, assign<&J::optimizer, &J::Optimizer::schedule, &compute::ScheduleOptions::step_size>},
      {{"optimizer", "gamma", KeyType::number, "0.1", "Step schedule factor; (0, 1]."},
       0, 1, true, false, {}, assign<&J::optimizer, &J::Optimizer::schedule, &compute::ScheduleOptions::gamma>},
      {{"optimizer", "min_lr", KeyType::number, "0.0", "Cosine schedule floor; [0, lr]."},
       0, 10, false, false, {}, assign<&J::optimizer, &J::Optimizer::schedule, &compute::ScheduleOptions::min_lr>},
      {{"optimizer", "reference_batch", KeyType::integer, "0",
        "Cluster jobs: the global batch lr is meant for; the rate in effect follows the actual global batch by "
        "`scaling`. 0: the job's first global batch (workers x batch_size), so lr is the rate the job starts "
        "with. Epochs and the schedule's steps are counted in batches of this size."},
       0, 1e9, false, false, {}, assign<&J::optimizer, &J::Optimizer::reference_batch>},
      {{"optimizer", "scaling", KeyType::string, "\"auto\"",
        "Cluster jobs: how the rate follows the global batch B: \"linear\" (lr x B / reference_batch), \"sqrt\" "
        "(lr x sqrt(B / reference_batch)), \"none\", or \"auto\" (sqrt for adam and adamw, linear for sgd). A "
        "change of B ramps over [elastic] rescale_batches. Gossip follows the same rule, its scale capped at 4; "
        "async does not scale (each update is one worker's batch, damped by its staleness)."},
       -inf, inf, false, false, {"auto", "linear", "sqrt", "none"}, assign<&J::optimizer, &J::Optimizer::scaling>},
      {{"optimizer", "plateau_patience", KeyType::integer, "0",
        "Cluster jobs: once this many evaluations in a row ([job] eval_every_steps, epoch ends) bring no test "
        "loss 0.1% below the best so far, the rate is multiplied by plateau_factor (and the count starts "
        "again). Rank 0 decides; the next generation's record carries the factor, so every worker applies it "
        "from the same point. 0: never. 0 to 1000000."},
       0, 1e6, false, false, {}, assign<&J::optimizer, &J::Optimizer::plateau_patience>},
      {{"optimizer", "plateau_factor", KeyType::number, "0.5", "What each plateau decay multiplies the rate by; (0, 1)."},
       0, 1, true, true, {}, assign<&J::optimizer, &J::Optimizer::plateau_factor>},
      // [cluster]
      {{"cluster", "cluster_id", KeyType::string, "\"tepdist\"",
        "Name of the cluster; a node refuses peers that name another one."},
       -inf, inf, false, false, {}, assign<&J::cluster, &J::Cluster::cluster_id>},
      {{"cluster", "secret", KeyType::string, "\"\"",
        "The cluster secret every node proves it holds (HMAC-SHA256 challenge-response; it never crosses the "
        "wire, and jobs travel without it), at least 16 bytes. Prefer secret_file."},
       -inf, inf, false, false, {}, assign<&J::cluster, &J::Cluster::secret>},
      {{"cluster", "secret_file", KeyType::string, "\"\"",
        "A file holding the cluster secret (at least 16 bytes); refused unless its mode is 0600 or stricter."},
       -inf, inf, false, false, {}, assign<&J::cluster, &J::Cluster::secret_file>},
      {{"cluster", "encrypt", KeyType::boolean, "true",
        "Every frame after the handshake carries a tag under keys of that connection alone (ephemeral "
        "X25519, so a recorded session stays closed to a later holder of the secret); true: the frames are "
        "also encrypted (AES-256-GCM), false: authenticated only (ChaCha20-Poly1305's tag: integrity and "
        "order, readable on the path). "
        "Every node of a cluster must say the same; a node that differs is refused in the handshake."},
       -inf, inf, false, false, {}, assign<&J::cluster, &J::Cluster::encrypt>},
      {{"cluster", "max_frame_mb", KeyType::integer, "64",
        "Largest frame a node accepts, MiB; a longer length prefix closes the connection. 1 to 1024."},
       1, 1024, false, false, {}, assign<&J::cluster, &J::Cluster::max_frame_mb>},
      {{"cluster", "send_queue_mb", KeyType::integer, "64",
        "Bytes queued for one peer before senders are told to back off, MiB; bounds memory when a peer is "
        "slow. 1 to 4096."},
       1, 4096, false, false, {}, assign<&J::cluster, &J::Cluster::send_queue_mb>},
      {{"cluster", "receive_queue_mb", KeyType::integer, "128",
        "Received frames from one connection still held anywhere in the node (messages not yet handled, "
        "tensors still in use) before it is read from no more until they are released, MiB: the sender's "
        "queue fills and it waits (back-pressure). At least max_frame_mb. 1 to 65536."},
       1, 65536, false, false, {}, assign<&J::cluster, &J::Cluster::receive_queue_mb>},
      {{"cluster", "receive_total_mb", KeyType::integer, "1024",
        "The same for all connections together, MiB: over it, the connections holding more than an even "
        "share wait, and frames being read are admitted only within it. With receive_queue_mb, what the "
        "wire can make a node hold (docs/architecture.md). At least max_frame_mb. 1 to 65536."},
       1, 65536, false, false, {}, assign<&J::cluster, &J::Cluster::receive_total_mb>},
      {{"cluster", "reconnect_max_ms", KeyType::integer, "2000",
        "Cap of the exponential back-off between reconnection attempts (from 50 ms, doubling), ms."},
       50, 600000, false, false, {}, assign<&J::cluster, &J::Cluster::reconnect_max_ms>},
      {{"cluster", "local_nodes", KeyType::integer, "0",
        "`tepdist run`: start this many node processes on loopback, train on them, then stop them (the "
        "one-command cluster). 0: join the cluster at [cluster] seeds instead. 0 to 64."},
       0, 64, false, false, {}, assign<&J::cluster, &J::Cluster::local_nodes>},
      {{"cluster", "join_timeout_s", KeyType::number, "30",
        "`tepdist run`: give up, saying why (the last connection problem), when the cluster has not shown its "
        "coordinator and workers within this many seconds. (0, 3600]."},
       0, 3600, true, false, {}, assign<&J::cluster, &J::Cluster::join_timeout_s>},
      {{"cluster", "seeds", KeyType::strings, "[]",
        "`tepdist run` without local_nodes: HOST:PORT of members of a running cluster to join through; the "
        "job goes to its coordinator."},
       -inf, inf, false, false, {}, apply_seeds},
      {{"cluster", "results_dir", KeyType::string, "\"tepdist-results\"",
        "A node's own setting (its file or --set, not the submitter's): where it saves, as rank 0, the final "
        "model and result.json of a job whose submitter is gone (`tepdist run --detach`, or a lost submitter): "
        "RESULTS_DIR/JOB_ID/, relative to the node's working directory."},
       -inf, inf, false, false, {}, assign<&J::cluster, &J::Cluster::results_dir>},
      // [network]
      {{"network", "link", KeyType::tables, "[]",
        "Emulated links, one [[network.link]] per region pair: between = [A, B] (A = B: within a region), "
        "latency_ms (one-way), jitter_ms, bandwidth_mbit (0: unlimited), loss (datagrams only, 0 to 1). "
        "Pairs not listed are not emulated. The link emulator is a simulation: real traffic on loopback, "
        "delayed as the model says."},
       -inf, inf, false, false, {}, apply_links},
      {{"network", "partition", KeyType::tables, "[]",
        "Scheduled partitions, one [[network.partition]] each: at_s and duration_s (seconds since the cluster "
        "epoch), between = [A, B]. Streams wait for the partition to heal; datagrams are lost."},
       -inf, inf, false, false, {}, apply_partitions},
      // [nodes.NAME]: validate() reads these tables itself (apply_node), keyed by node name.
      {{"nodes", "NAME", KeyType::table, "{}",
        "Settings of one node, by its name: `[nodes.node-02]`. `tepdist run` names its local nodes node-00, "
        "node-01, ...; a node started by hand (`tepdist node`) looks up its --name. Keys: region (the link "
        "emulator's region, default \"local\"; `tepdist node --region` wins over it), slowdown ([compute] "
        "slowdown for this node alone) and device (backend \"cuda\": this node's CUDA device, 0 to 63, over the "
        "job's [compute] device: local nodes of a machine with several GPUs each take their own). Overridden with "
        "--set nodes.NAME.KEY=VALUE. A node without a table has the defaults."},
       -inf, inf, false, false, {}, nullptr},
      // [membership]
      // [elastic]
      {{"elastic", "shards", KeyType::integer, "0",
        "async: parameter shards, placed on the workers by rendezvous hashing; 0: twice the workers. More "
        "shards spread the load more evenly, at more messages per step. 0 to 65536."},
       0, 65536, false, false, {}, assign<&J::elastic, &J::Elastic::shards>},
      {{"elastic", "replication", KeyType::integer, "2",
        "async: workers holding each shard, the primary included; the primary forwards every applied update "
        "to the others in version order. A job survives replication - 1 holders of a shard lost at once; the "
        "holders are spread over as many of the workers' regions as they can be. 1 to 16 (at most the workers)."},
       1, 16, false, false, {}, assign<&J::elastic, &J::Elastic::replication>},
      {{"elastic", "push_window", KeyType::integer, "2",
        "async: pushes a worker keeps in flight to one shard; gradients for a shard whose window is full are "
        "summed and sent when an answer frees a slot. 1 to 64."},
       1, 64, false, false, {}, assign<&J::elastic, &J::Elastic::push_window>},
      {{"elastic", "local_steps", KeyType::integer, "4",
        "async: H >= 1 runs the optimiser on each worker and pushes the change it made to each shard every H "
        "steps, which the shard primaries add times outer_lr / (1 + staleness) (async local SGD): a worker's own "
        "steps are never delayed, only the mixing of the workers' progress. 0 pushes every step's gradient for "
        "the primaries' optimisers to apply (async SGD), which loses accuracy to staleness at high learning "
        "rates. 0 to 10000."},
       0, 10000, false, false, {}, assign<&J::elastic, &J::Elastic::local_steps>},
      {{"elastic", "outer_lr", KeyType::number, "0",
        "async with local_steps >= 1: the factor on each worker's change before the staleness damping, so a "
        "change counts min(1, outer_lr / (1 + staleness)). 0 (auto): (1 + s) / W, s the staleness the worker's "
        "own answers reported lately, so that each worker's progress counts about 1/W on average (an average "
        "of W workers) whatever its usual staleness, and its staler pushes less. A fixed value averages only "
        "at one staleness (1: at W - 1). 0 to 10."},
       0, 10, false, false, {}, assign<&J::elastic, &J::Elastic::outer_lr>},
      {{"elastic", "quorum", KeyType::string, "\"majority\"",
        "Job control: a new generation of workers needs acks from a majority of the previous generation's "
        "workers (\"majority\": the side of a partition without one waits, so one model is never trained by "
        "two sides), or from any one of them (\"any\": only where no partition can happen, as among the local "
        "nodes of one `tepdist run`, which sets it unless the file does). Workers that left gracefully or "
        "restarted no longer count; a worker that has not pulled the state yet does."},
       -inf, inf, false, false, {"majority", "any"}, assign<&J::elastic, &J::Elastic::quorum>},
      {{"elastic", "min_workers", KeyType::integer, "1",
        "Job control: no generation with fewer live workers is proposed; the job waits for joins. 1 to 4096."},
       1, 4096, false, false, {}, assign<&J::elastic, &J::Elastic::min_workers>},
      {{"elastic", "rescale_batches", KeyType::integer, "8",
        "After the number of workers changes, the learning rate moves linearly from the old global batch's "
        "scale to the new one's over this many global batches (the warm-up after a change; the scale is "
        "[optimizer] scaling's). 0: at once. 0 to 100000."},
       0, 100000, false, false, {}, assign<&J::elastic, &J::Elastic::rescale_batches>},
      {{"elastic", "balance", KeyType::boolean, "true",
        "sync: each worker's share of the global batch follows its measured speed (samples per second of its "
        "own steps, the median of the last 5), so a slower node takes fewer samples and every worker ends the "
        "step together. The global batch, and so the update and the rate, stay as they are. false: equal "
        "shares."},
       -inf, inf, false, false, {}, assign<&J::elastic, &J::Elastic::balance>},
      {{"elastic", "balance_quantum", KeyType::integer, "8",
        "sync: shares are multiples of this many samples (a worker's batch sizes stay few, so its compute "
        "plans are reused), at least one each; a global batch under one quantum a worker is split evenly. 1 "
        "to 4096."},
       1, 4096, false, false, {}, assign<&J::elastic, &J::Elastic::balance_quantum>},
      {{"elastic", "restart", KeyType::string, "\"on-failure\"",
        "`tepdist run`: a local node that dies of anything but a clean exit (a crash, SIGKILL) is started again "
        "under its name and rejoins the job (\"on-failure\"), or not (\"never\"). A node stopped by SIGTERM "
        "left gracefully and is not restarted."},
       -inf, inf, false, false, {"on-failure", "never"}, assign<&J::elastic, &J::Elastic::restart>},
      {{"elastic", "restart_budget", KeyType::integer, "3",
        "`tepdist run`: restarts per local node under restart = \"on-failure\". 0 to 1000."},
       0, 1000, false, false, {}, assign<&J::elastic, &J::Elastic::restart_budget>},
      {{"elastic", "checkpoint_every_steps", KeyType::integer, "0",
        "Cluster checkpoints: the worker with rank-0 duties writes the job's state every this many of its "
        "steps (sync and gossip also at the end; async gathers every shard from its primary first). 0: not by "
        "steps. 0 to 1000000000."},
       0, 1e9, false, false, {}, assign<&J::elastic, &J::Elastic::checkpoint_every_steps>},
      {{"elastic", "checkpoint_every_s", KeyType::number, "0",
        "Cluster checkpoints: also (or only) every this many seconds of training, at the next step boundary. "
        "0: not by time. 0 to 1000000."},
       0, 1e6, false, false, {}, assign<&J::elastic, &J::Elastic::checkpoint_every_s>},
      {{"elastic", "checkpoint_dir", KeyType::string, "\"\"",
        "Where checkpoints go: a folder the worker with rank-0 duties can write (any worker may hold them, so "
        "across machines a shared file system). \"\": `tepdist run` with local nodes uses OUT/checkpoints; "
        "a node otherwise its results_dir/JOB_ID/checkpoints."},
       -inf, inf, false, false, {}, assign<&J::elastic, &J::Elastic::checkpoint_dir>},
      {{"elastic", "resume_from", KeyType::string, "\"\"",
        "A checkpoint part (.ckpt) every worker of the job's first generation reads at the start: the job "
        "continues from the state and position in it (gossip and async: the positions left, re-split), on any "
        "number of workers. `tepdist run --resume` sets it to the newest checkpoint that checks out."},
       -inf, inf, false, false, {}, assign<&J::elastic, &J::Elastic::resume_from>},
      {{"elastic", "checkpoint_keep", KeyType::integer, "3",
        "How many of the newest checkpoints are kept; older ones are removed. 1 to 1000."},
       1, 1000, false, false, {}, assign<&J::elastic, &J::Elastic::checkpoint_keep>},
      {{"membership", "profile", KeyType::string, "\"lan\"",
        "SWIM defaults: \"lan\" (probe every 200 ms, ack timeout 100 ms, suspicion at least 3 x log10(N) "
        "intervals) or \"wan\" (1 s, 500 ms, 4 x log10(N): round trips up to about 250 ms); the keys below "
        "override single knobs."},
       -inf, inf, false, false, {"lan", "wan"}, assign<&J::membership, &J::Membership::profile>},
      {{"membership", "probe_interval_ms", KeyType::number, "0",
        "Time between probes of one member, ms; 0: the profile's. Lower detects failures sooner, at one "
        "ping and ack per node per interval."},
       0, 600000, false, false, {}, assign<&J::membership, &J::Membership::probe_interval_ms>},
      {{"membership", "probe_timeout_ms", KeyType::number, "0",
        "Wait for a direct ack before asking k others to probe, ms; 0: the profile's. Must exceed the round "
        "trip with margin."},
       0, 600000, false, false, {}, assign<&J::membership, &J::Membership::probe_timeout_ms>},
      {{"membership", "suspicion_mult", KeyType::number, "0",
        "Suspicion lasts at least this x log10(N + 1) probe intervals before death; 0: the profile's. Higher: "
        "fewer false deaths, slower detection."},
       0, 100, false, false, {}, assign<&J::membership, &J::Membership::suspicion_mult>},
      {{"membership", "dead_retention_ms", KeyType::number, "0",
        "How long dead and left members are remembered so stale gossip cannot revive them, ms; 0: the "
        "profile's."},
       0, 1e8, false, false, {}, assign<&J::membership, &J::Membership::dead_retention_ms>},
      // [compute]
      {{"compute", "backend", KeyType::string, "\"onednn\"",
        "Kernels: \"onednn\" (oneDNN primitives, the fast path on CPUs), \"ref\" (the readable reference: "
        "plain loops, OpenMP over the batch; every other backend is tested against it) or \"cuda\" (an NVIDIA "
        "GPU: cuDNN, cuBLAS and own kernels in float32, parameters and optimiser state kept on the device; "
        "built where CMake found CUDA, cuDNN and NCCL; runs conv2d, max_pool2d, relu, flatten and linear, and "
        "refuses a model with other layers)."},
       -inf, inf, false, false, {"onednn", "ref", "cuda"}, assign<&J::compute, &J::Compute::backend>},
      {{"compute", "device", KeyType::integer, "0",
        "backend \"cuda\": which CUDA device, 0 to 63, as CUDA numbers them (CUDA_VISIBLE_DEVICES applies). "
        "A job setting: every node of the job uses this index on its own machine, so local nodes of one "
        "machine share the device, unless a node's own file gives it another ([nodes.NAME] device) or it was "
        "started with `tepdist node --set compute.device=N` (its node_ready event says which it took)."},
       0, 63, false, false, {}, assign<&J::compute, &J::Compute::device>},
      {{"compute", "deterministic", KeyType::boolean, "true",
        "backend \"cuda\": true takes the convolution algorithms cuDNN's heuristics rank first among the "
        "deterministic ones, so a rerun of a job computes the same bits; false times every algorithm once and "
        "runs the fastest, atomics included (1.47 times the samples/s for the widecnn preset at batch 512 on an "
        "H200), and reruns differ in the last bits. Every other backend is deterministic."},
       -inf, inf, false, false, {}, assign<&J::compute, &J::Compute::deterministic>},
      {{"compute", "emulate_device", KeyType::boolean, "false",
        "Emulation, for tests on machines without a GPU: backends \"onednn\" and \"ref\" keep the training "
        "state (parameters, gradient, optimiser buffers) in memory of their own, as \"cuda\" keeps it on its "
        "device, and the host's copy reads as NaN whenever it is out of date, so a code path that reads or "
        "writes the state without its sync point fails visibly (a host write never pushed fails an invariant "
        "check). Sync and gossip jobs and `tepdist train` use it (as they use a device's; async does not); "
        "costs two copies of the model a step. Refused with backend \"cuda\"."},
       -inf, inf, false, false, {}, assign<&J::compute, &J::Compute::emulate_device>},
      {{"compute", "threads", KeyType::integer, "0", "Threads for the kernels; 0: every core (`tepdist run`'s local nodes: each its share of the cores). "
        "--threads overrides."},
       0, 1024, false, false, {}, assign<&J::compute, &J::Compute::threads>},
      {{"compute", "slowdown", KeyType::number, "1.0",
        "Emulation (for trying load balancing on one machine): every training step of a node takes this many "
        "times its compute time (it sleeps for the rest); the compute time is the training thread's CPU time "
        "when compute.threads = 1 on a host backend (time waiting for a core is not stretched), else wall time. "
        "A node's own setting, read from the file the node was started with: [nodes.NAME] slowdown for one local node, or `tepdist node --set "
        "compute.slowdown=2`. The load balancer never reads it: it measures. 1 to 100."},
       1, 100, false, false, {}, assign<&J::compute, &J::Compute::slowdown>},
      // [monitor]
      {{"monitor", "http", KeyType::string, "\"127.0.0.1:0\"",
        "The node's HTTP endpoint, read-only: GET /metrics (Prometheus text), /status (the status document "
        "as JSON, as `tepdist status --json`), / (the dashboard). HOST:PORT with HOST an IP address; port 0: "
        "any free one (the node logs the bound address and `tepdist run` prints node-00's; its local node i "
        "takes PORT + i of a fixed one). Loopback unless "
        "the operator names another address: it needs no secret, and anyone who can reach it sees the "
        "cluster's members and training figures. \"\": no endpoint."},
       -inf, inf, false, false, {}, assign<&J::monitor, &J::Monitor::http>},
  };
  return k;
}

const char* type_name(KeyType t) {
  switch (t) {
    case KeyType::integer: return "an integer";
    case KeyType::number: return "a number";
    case KeyType::boolean: return "true or false";
    case KeyType::string: return "a string";
    case KeyType::layers: return "a list of layer tables";
    case KeyType::strings: return "a list of strings";
    case KeyType::tables: return "a list of tables ([[section.key]])";
    case KeyType::table: return "a table ([section.key])";
  }
  return "?";
}

bool has_type(const toml::value& v, KeyType t) {
  switch (t) {
    case KeyType::integer: return v.is_integer();
    case KeyType::number: return v.is_integer() || v.is_floating();
    case KeyType::boolean: return v.is_boolean();
    case KeyType::string: return v.is_string();
    case KeyType::layers:
    case KeyType::strings:
    case KeyType::tables: return v.is_array();
    case KeyType::table: return v.is_table();
  }
  return false;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string suggestion(std::string_view word, const std::vector<std::string_view>& candidates) {
  std::string known;
  for (auto c : candidates) {
    if (edit_distance(word, c) <= 2) return fmt::format(" (did you mean '{}'?)", c);
    known += known.empty() ? std::string(c) : ", " + std::string(c);
  }
  return fmt::format(" (known: {})", known);
}

std::string bound_text(const Key& k) {
  return fmt::format("{}{}, {}{}", k.min_exclusive ? "(" : "[", k.min, k.max, k.max_exclusive ? ")" : "]");
}

std::expected<void, ConfigError> check_value(const Key& k, const toml::value& v) {
  const std::string name = fmt::format("{}.{}", k.info.section, k.info.key);
  if (!has_type(v, k.info.type))
    return std::unexpected(error_at(v, fmt::format("{} must be {}", name, type_name(k.info.type))));
  if (k.info.type == KeyType::integer || k.info.type == KeyType::number) {
    const double x = v.is_integer() ? static_cast<double>(v.as_integer()) : v.as_floating();
    const bool low = k.min_exclusive ? x <= k.min : x < k.min;
    const bool high = k.max_exclusive ? x >= k.max : x > k.max;
    if (low || high || x != x)
      return std::unexpected(error_at(v, fmt::format("{} = {} is out of range {}", name, x, bound_text(k))));
  }
  if (!k.choices.empty()) {
    const std::string& s = v.as_string().str;
    if (std::find(k.choices.begin(), k.choices.end(), s) == k.choices.end())
      return std::unexpected(error_at(v, fmt::format("{} = \"{}\" is not allowed{}", name, s, suggestion(s, k.choices))));
  }
  return {};
}

/// A table's entries sorted by line, then key, so errors come in the order a reader meets them.
std::vector<std::pair<std::string, const toml::value*>> entries_in_file_order(const toml::value& table) {
  std::vector<std::pair<std::string, const toml::value*>> entries;
  for (const auto& [key, value] : table.as_table()) entries.emplace_back(key, &value);
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return std::pair{a.second->location().line(), a.first} < std::pair{b.second->location().line(), b.first};
  });
  return entries;
}

// Structured values (layers, links, partitions, regions) are checked as they are applied, and
// refused with this, so their errors carry a line.
struct ValueError {
  ConfigError error;
};

void apply_layers(JobConfig& c, const toml::value& v) {
  c.model.layers.clear();
  const auto& array = v.as_array();
  for (size_t i = 0; i < array.size(); ++i) {
    const toml::value& t = array[i];
    const std::string here = fmt::format("model.layers[{}]", i + 1);
    if (!t.is_table()) throw ValueError{error_at(t, here + " must be a table such as { type = \"relu\" }")};
    compute::LayerSpec spec;
    for (const auto& [key, value] : entries_in_file_order(t)) {
      if (key == "type" || key == "name") {
        if (!value->is_string()) throw ValueError{error_at(*value, fmt::format("{}.{} must be a string", here, key))};
        (key == "type" ? spec.type : spec.name) = value->as_string().str;
      } else if (value->is_integer() || value->is_floating()) {
        spec.args.emplace_back(key, value->is_integer() ? static_cast<double>(value->as_integer()) : value->as_floating());
      } else {
        throw ValueError{error_at(*value, fmt::format("{}.{} must be a number", here, key))};
      }
    }
    if (spec.type.empty()) throw ValueError{error_at(t, here + " needs a type")};
    if (auto layer = compute::make_layer(spec); !layer)
      throw ValueError{error_at(t, fmt::format("{}: {}", here, layer.error().message))};
    c.model.layers.push_back(std::move(spec));
  }
  if (c.model.layers.empty()) throw ValueError{error_at(v, "model.layers is empty")};
}

void apply_seeds(JobConfig& c, const toml::value& v) {
  c.cluster.seeds.clear();
  for (const auto& r : v.as_array()) {
    if (!r.is_string() || r.as_string().str.find(':') == std::string::npos)
      throw ValueError{error_at(r, "cluster.seeds must list HOST:PORT addresses")};
    c.cluster.seeds.push_back(r.as_string().str);
  }
}

/// One [nodes.NAME] table.
void apply_node(JobConfig& c, const std::string& name, const toml::value& v) {
  const std::string here = "nodes." + name;
  if (!v.is_table()) throw ValueError{error_at(v, fmt::format("{} must be a table ([{}])", here, here))};
  JobConfig::Node node;
  for (const auto& [key, value] : entries_in_file_order(v)) {
    if (key == "region") {
      if (!value->is_string() || value->as_string().str.empty())
        throw ValueError{error_at(*value, here + ".region must be a non-empty region name")};
      node.region = value->as_string().str;
    } else if (key == "slowdown") {
      if (!(value->is_integer() || value->is_floating()))
        throw ValueError{error_at(*value, here + ".slowdown must be a number from 1 to 100")};
      const double d = value->is_integer() ? static_cast<double>(value->as_integer()) : value->as_floating();
      if (!(d >= 1 && d <= 100)) throw ValueError{error_at(*value, here + ".slowdown must be a number from 1 to 100")};
      node.slowdown = d;
    } else if (key == "device") {
      if (!value->is_integer() || value->as_integer() < 0 || value->as_integer() > 63)
        throw ValueError{error_at(*value, here + ".device must be an integer from 0 to 63")};
      node.device = value->as_integer();
    } else {
      throw ValueError{error_at(*value, fmt::format("unknown key {}.{} (known: region, slowdown, device)", here, key))};
    }
  }
  c.nodes[name] = std::move(node);
}

/// Reads a number field of a [[network.*]] table, checking its range; required unless fallback.
double table_number(const toml::value& t, const std::string& where, const std::string& key, double lo, double hi,
                    std::optional<double> fallback) {
  const auto& table = t.as_table();
  const auto it = table.find(key);
  if (it == table.end()) {
    if (fallback) return *fallback;
    throw ValueError{error_at(t, fmt::format("{} needs {}", where, key))};
  }
  const toml::value& v = it->second;
  if (!v.is_integer() && !v.is_floating()) throw ValueError{error_at(v, fmt::format("{}.{} must be a number", where, key))};
  const double x = v.is_integer() ? static_cast<double>(v.as_integer()) : v.as_floating();
  if (!(x >= lo && x <= hi))
    throw ValueError{error_at(v, fmt::format("{}.{} = {} is out of range [{}, {}]", where, key, x, lo, hi))};
  return x;
}

std::pair<std::string, std::string> table_pair(const toml::value& t, const std::string& where) {
  const auto& table = t.as_table();
  const auto it = table.find("between");
  if (it == table.end()) throw ValueError{error_at(t, where + " needs between = [region, region]")};
  const toml::value& v = it->second;
  if (!v.is_array() || v.as_array().size() != 2 || !v.as_array()[0].is_string() || !v.as_array()[1].is_string())
    throw ValueError{error_at(v, where + ".between must be two region names")};
  return {v.as_array()[0].as_string().str, v.as_array()[1].as_string().str};
}

void check_keys(const toml::value& t, const std::string& where, std::initializer_list<std::string_view> known) {
  if (!t.is_table()) throw ValueError{error_at(t, where + " must be a table")};
  for (const auto& [key, value] : entries_in_file_order(t))
    if (std::find(known.begin(), known.end(), key) == known.end())
      throw ValueError{error_at(*value, fmt::format("unknown key {}.{}{}", where, key,
                                                    suggestion(key, std::vector<std::string_view>(known))))};
}

void apply_links(JobConfig& c, const toml::value& v) {
  c.network.model.links.clear();
  const auto& array = v.as_array();
  for (size_t i = 0; i < array.size(); ++i) {
    const std::string where = fmt::format("network.link[{}]", i + 1);
    check_keys(array[i], where, {"between", "latency_ms", "jitter_ms", "bandwidth_mbit", "loss"});
    const auto [a, b] = table_pair(array[i], where);
    if (c.network.model.link(a, b)) throw ValueError{error_at(array[i], fmt::format("{}: {} - {} is listed twice", where, a, b))};
    gossip::LinkProfile p;
    p.latency_ms = table_number(array[i], where, "latency_ms", 0, 60000, 0.0);
    p.jitter_ms = table_number(array[i], where, "jitter_ms", 0, 60000, 0.0);
    p.bandwidth_mbit = table_number(array[i], where, "bandwidth_mbit", 0, 1e6, 0.0);
    p.loss = table_number(array[i], where, "loss", 0, 1, 0.0);
    if (p.jitter_ms > p.latency_ms)
      throw ValueError{error_at(array[i], fmt::format("{}: jitter_ms ({}) above latency_ms ({})", where, p.jitter_ms, p.latency_ms))};
    c.network.model.set_link(a, b, p);
  }
}

void apply_partitions(JobConfig& c, const toml::value& v) {
  c.network.model.partitions.clear();
  const auto& array = v.as_array();
  for (size_t i = 0; i < array.size(); ++i) {
    const std::string where = fmt::format("network.partition[{}]", i + 1);
    check_keys(array[i], where, {"between", "at_s", "duration_s"});
    const auto [a, b] = table_pair(array[i], where);
    c.network.model.partitions.push_back({table_number(array[i], where, "at_s", 0, 1e7, std::nullopt),
                                          table_number(array[i], where, "duration_s", 0, 1e7, std::nullopt), a, b});
  }
}

std::vector<std::string_view> section_names() {
  std::vector<std::string_view> names;
  for (const auto& k : keys())
    if (std::find(names.begin(), names.end(), k.info.section) == names.end()) names.push_back(k.info.section);
  return names;
}

/// Parses one "section.key=value" into root, the value as TOML or else as a bare string.
std::expected<void, ConfigError> apply_override(toml::value& root, const std::string& text) {
  const auto eq = text.find('=');
  const std::string lhs = text.substr(0, eq);
  const auto dot = lhs.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot == 0 || dot + 1 == lhs.size())
    return std::unexpected(ConfigError{fmt::format("--set {}: expected section.key=value", text)});
  const std::string section = lhs.substr(0, dot), key = lhs.substr(dot + 1), value = text.substr(eq + 1);
  const std::string origin = "--set " + lhs;
  toml::value parsed;
  try {
    std::istringstream in("v = " + value);
    parsed = toml::parse(in, origin);
  } catch (const std::exception&) {
    std::string quoted;
    for (char ch : value) quoted += (ch == '"' || ch == '\\') ? std::string{'\\', ch} : std::string{ch};
    try {
      std::istringstream in("v = \"" + quoted + "\"");
      parsed = toml::parse(in, origin);
    } catch (const std::exception& e) {
      return std::unexpected(ConfigError{fmt::format("{}: cannot read the value: {}", origin, e.what())});
    }
  }
  auto& table = root.as_table();
  auto [it, inserted] = table.try_emplace(section, toml::table{});
  if (!it->second.is_table())
    return std::unexpected(error_at(it->second, fmt::format("{} must be a table", section)));
  if (section == "nodes") {  // nodes.NAME.KEY: one level deeper; NAME may hold dots (host:port ids), KEY not
    const auto last = key.rfind('.');
    if (last == std::string::npos || last == 0 || last + 1 == key.size())
      return std::unexpected(ConfigError{fmt::format("--set {}: expected nodes.NAME.KEY=value", text)});
    auto [node, fresh] = it->second.as_table().try_emplace(key.substr(0, last), toml::table{});
    if (!node->second.is_table())
      return std::unexpected(error_at(node->second, fmt::format("nodes.{} must be a table", key.substr(0, last))));
    node->second.as_table()[key.substr(last + 1)] = parsed.as_table().at("v");
    return {};
  }
  it->second.as_table()[key] = parsed.as_table().at("v");
  return {};
}

/// HOST:PORT with HOST an IPv4 address or a bracketed IPv6 one, PORT 0 to 65535.
bool valid_listen_address(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 == text.size() || text.size() - colon - 1 > 5) return false;
  const std::string port = text.substr(colon + 1);
  if (!std::all_of(port.begin(), port.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) || std::stoi(port) > 65535)
    return false;
  std::string host = text.substr(0, colon);
  unsigned char buf[sizeof(in6_addr)];
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    return inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), buf) == 1;
  return inet_pton(AF_INET, host.c_str(), buf) == 1;
}

std::expected<JobConfig, ConfigError> validate(const toml::value& root, const std::string& name) {
  JobConfig c;
  c.source = name;
  const auto sections = section_names();
  // Report problems in file order, whatever order the hash tables iterate in.
  for (const auto& [section, table] : entries_in_file_order(root)) {
    if (std::find(sections.begin(), sections.end(), section) == sections.end())
      return std::unexpected(error_at(*table, fmt::format("unknown section [{}]{}", section, suggestion(section, sections))));
    if (!table->is_table())
      return std::unexpected(error_at(*table, fmt::format("{} must be a section ([{}])", section, section)));
    if (section == "nodes") {  // keyed by node name, not by a fixed key
      try {
        for (const auto& [name, value] : entries_in_file_order(*table)) apply_node(c, name, *value);
      } catch (const ValueError& e) {
        return std::unexpected(e.error);
      }
      continue;
    }
    for (const auto& [key, value] : entries_in_file_order(*table)) {
      if (section == "network" && key == "regions")
        return std::unexpected(error_at(*value, "network.regions (regions by index) is replaced by a table per node: "
                                                "[nodes.node-00] region = \"us-east\", and so on"));
      const auto spec = std::find_if(keys().begin(), keys().end(),
                                     [&](const Key& k) { return k.info.section == section && k.info.key == key; });
      if (spec == keys().end()) {
        std::vector<std::string_view> known;
        for (const auto& k : keys())
          if (k.info.section == section) known.push_back(k.info.key);
        return std::unexpected(
            error_at(*value, fmt::format("unknown key {}.{}{}", section, key, suggestion(key, known))));
      }
      if (auto ok = check_value(*spec, *value); !ok) return std::unexpected(ok.error());
      try {
        spec->apply(c, *value);
      } catch (const ValueError& e) {
        return std::unexpected(e.error);
      }
    }
  }
  const auto& top = root.as_table();
  if (auto m = top.find("model"); m != top.end() && m->second.is_table()) {
    const auto& model = m->second.as_table();
    if (model.count("preset") && model.count("layers"))
      return std::unexpected(error_at(model.at("layers"), "set either model.preset or model.layers, not both"));
  }
  if (c.optimizer.schedule.min_lr > c.optimizer.schedule.base_lr)
    return std::unexpected(ConfigError{fmt::format("{}: optimizer.min_lr ({}) is above optimizer.lr ({})", name,
                                                   c.optimizer.schedule.min_lr, c.optimizer.schedule.base_lr)});
  for (const auto& [key, mb] : {std::pair{"receive_queue_mb", c.cluster.receive_queue_mb},
                                 std::pair{"receive_total_mb", c.cluster.receive_total_mb}})
    if (mb < c.cluster.max_frame_mb)
      return std::unexpected(ConfigError{fmt::format("{}: cluster.{} ({}) is below cluster.max_frame_mb ({}): a frame "
                                                     "that large could never be received",
                                                     name, key, mb, c.cluster.max_frame_mb)});
  if (!c.monitor.http.empty() && !valid_listen_address(c.monitor.http))
    return std::unexpected(ConfigError{fmt::format("{}: monitor.http \"{}\" is not HOST:PORT with HOST an IP address "
                                                   "(\"127.0.0.1:9090\", \"[::1]:0\") and PORT 0 to 65535; \"\" "
                                                   "turns the endpoint off",
                                                   name, c.monitor.http)});
  if (c.optimizer.options.nesterov && c.optimizer.options.momentum <= 0)
    return std::unexpected(ConfigError{fmt::format("{}: optimizer.nesterov needs optimizer.momentum > 0", name)});
  if (c.data.dataset == "files" && c.data.train_file.empty())
    return std::unexpected(ConfigError{fmt::format("{}: data.dataset = \"files\" needs data.train_file", name)});
  if (c.job.pause_between_epochs && c.job.mode == "single")
    return std::unexpected(ConfigError{fmt::format("{}: job.pause_between_epochs is for cluster jobs (job.mode "
                                                   "\"sync\", \"async\" or \"gossip\"), not \"single\"",
                                                   name)});
  return c;
}

ConfigResult<JobConfig> finish(toml::value root, const std::string& name, std::span<const std::string> overrides) {
  for (const auto& o : overrides)
    if (auto ok = apply_override(root, o); !ok) return std::unexpected(ok.error());
  auto c = validate(root, name);
  if (c) c->text = toml::format(root);
  return c;
}

}  // namespace

ConfigResult<JobConfig> parse_config(std::string_view text, const std::string& name,
                                     std::span<const std::string> overrides) {
  toml::value root;
  try {
    std::istringstream in{std::string(text)};
    root = toml::parse(in, name);
  } catch (const std::exception& e) {
    return std::unexpected(ConfigError{fmt::format("{}: not valid TOML:\n{}", name, e.what())});
  }
  return finish(std::move(root), name, overrides);
}

ConfigResult<JobConfig> load_config(const std::optional<std::filesystem::path>& file,
                                    std::span<const std::string> overrides) {
  if (!file) return finish(toml::value(toml::table{}), "(built-in defaults)", overrides);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(*file, ec))
    return std::unexpected(ConfigError{fmt::format("{}: no such config file", file->string())});
  toml::value root;
  try {
    root = toml::parse(file->string());
  } catch (const std::exception& e) {
    return std::unexpected(ConfigError{fmt::format("{}: not valid TOML:\n{}", file->string(), e.what())});
  }
  return finish(std::move(root), file->string(), overrides);
}

std::string schema_markdown() {
  static constexpr const char* type_words[] = {"integer",          "number",           "boolean",
                                                "string",           "array of tables",  "array of strings",
                                                "array of tables", "table"};
  std::string md;
  std::string_view section;
  for (const auto& k : keys()) {
    if (k.info.section != section) {
      section = k.info.section;
      md += fmt::format("{}## [{}]\n\n| key | type | default | meaning |\n|---|---|---|---|\n", md.empty() ? "" : "\n",
                        section);
    }
    md += fmt::format("| `{}` | {} | `{}` | {} |\n", k.info.key, type_words[static_cast<int>(k.info.type)],
                      k.info.default_text, k.info.doc);
  }
  return md;
}

gossip::swim::Config JobConfig::Membership::swim() const {
  gossip::swim::Config c = profile == "wan" ? gossip::swim::Config::wan() : gossip::swim::Config::lan();
  if (probe_interval_ms > 0) c.probe_interval_ms = probe_interval_ms;
  if (probe_timeout_ms > 0) c.probe_timeout_ms = probe_timeout_ms;
  if (suspicion_mult > 0) c.suspicion_mult = suspicion_mult;
  if (dead_retention_ms > 0) c.dead_retention_ms = dead_retention_ms;
  return c;
}

namespace {

/// A secret an attacker could guess offline from one recorded handshake is no secret.
ConfigResult<std::string> long_enough(std::string secret, const std::string& where) {
  if (secret.size() < min_secret_bytes)
    return std::unexpected(ConfigError{fmt::format(
        "{}: the cluster secret is {} bytes; at least {} are needed (for example: head -c 32 /dev/urandom | "
        "base64 > secret && chmod 600 secret)",
        where, secret.size(), min_secret_bytes)});
  return secret;
}

}  // namespace

ConfigResult<std::string> load_secret(const JobConfig::Cluster& cluster) {
  if (cluster.secret_file.empty()) {
    if (cluster.secret.empty())
      return std::unexpected(ConfigError{"no cluster secret: set [cluster] secret_file (mode 0600) or secret"});
    return long_enough(cluster.secret, "[cluster] secret");
  }
  struct stat st{};
  if (::stat(cluster.secret_file.c_str(), &st) != 0)
    return std::unexpected(ConfigError{fmt::format("{}: cannot read the cluster secret file", cluster.secret_file)});
  if ((st.st_mode & 077) != 0)
    return std::unexpected(ConfigError{fmt::format("{}: the cluster secret file has mode {:o}; it must be 0600 "
                                                   "(chmod 600 {})",
                                                   cluster.secret_file, st.st_mode & 0777, cluster.secret_file)});
  std::ifstream in(cluster.secret_file, std::ios::binary);
  std::string secret((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.empty()) return std::unexpected(ConfigError{fmt::format("{}: the cluster secret file is empty", cluster.secret_file)});
  return long_enough(std::move(secret), cluster.secret_file);
}

std::string toml_string(std::string_view value) {
  std::string quoted = "\"";
  for (const char ch : value) {
    if (ch == '"' || ch == '\\') quoted += '\\';
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) quoted += fmt::format("\\u{:04x}", static_cast<unsigned>(ch));
    else quoted += ch;
  }
  return quoted + "\"";
}

ConfigResult<std::string> text_for_nodes(const JobConfig& config) {
  const std::vector<std::string> no_secret = {"cluster.secret=\"\""};
  auto shipped = parse_config(config.text, config.source, no_secret);
  if (!shipped) return std::unexpected(shipped.error());
  return std::move(shipped->text);
}

std::string local_node_name(int64_t i) { return fmt::format("node-{:02d}", i); }

std::vector<KeyInfo> schema() {
  std::vector<KeyInfo> out;
  for (const auto& k : keys()) out.push_back(k.info);
  return out;
}

}  // namespace tepdist::elastic

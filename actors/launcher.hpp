#pragma once
// The launcher: a cluster of local node processes on loopback, as `tepdist run` (local_nodes = N)
// and tepdist::Trainer start it. Each node is a relaunch of the running program as
// `PROGRAM node cluster.toml ...` (the tepdist binary, or a program built on the C++ API whose
// Trainer::serve turns the relaunch into a node). The nodes get a fresh cluster secret in a private
// file, report their addresses in ready files, and are stopped (SIGTERM, then SIGKILL after a
// grace period) and reaped when the LocalCluster goes, however the launcher ends; if the launcher
// itself is killed, each node gets SIGTERM from the kernel (PR_SET_PDEATHSIG) and leaves.

#include <sys/types.h>

#include <cstdint>
#include <expected>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "elastic/config.hpp"

namespace tepdist::actors {

/// The node processes a launcher started; stopped and reaped on every way out.
class LocalNodes {
 public:
  LocalNodes() = default;
  LocalNodes(const LocalNodes&) = delete;
  LocalNodes& operator=(const LocalNodes&) = delete;
  ~LocalNodes() { stop(); }

  /// Starts `PROGRAM node` with args, its output appended to log. The child leaves when this
  /// process dies, however it dies (PR_SET_PDEATHSIG), and sits in its own process group, so a
  /// Ctrl-C reaches only the launcher, which then stops it in order.
  std::expected<pid_t, std::string> start(const std::vector<std::string>& args, const std::filesystem::path& log);

  /// From here on a node that dies of anything but a clean exit (a crash, SIGKILL) is started
  /// again under its name and on its address (`seeds[i]` is node i's: cluster.toml and the
  /// hints printed stay true, and peers that held it dead find it there), joining through the
  /// other seeds, at most `budget` times per node; `report` hears of each restart (on the
  /// keeper's thread). A node stopped by SIGTERM or SIGINT left gracefully and stays gone.
  void keep(int64_t budget, std::vector<std::string> seeds, std::function<void(const std::string&)> report);

  /// The first node that exited, with its status, if any did (before keep()).
  std::optional<std::pair<size_t, int>> exited();

  /// The process ids of the nodes running now (a restarted node's new one; exited ones left out).
  std::vector<pid_t> pids();

  void stop();

 private:
  std::expected<pid_t, std::string> spawn(const std::vector<std::string>& args, const std::filesystem::path& log);

  struct Spec {
    std::vector<std::string> args;
    std::filesystem::path log;
    int64_t restarts;
  };
  std::mutex mutex_;  // pids_ and specs_: the keeper's thread and the launcher's
  std::vector<pid_t> pids_;
  std::vector<Spec> specs_;
  std::thread keeper_;
  int wake_ = -1;
};

/// A random cluster secret, hex.
std::string generate_secret();

/// A file only this user may read (the secret, the cluster file that names it), exactly mode 0600
/// whatever was there before, never written through a link.
std::expected<void, std::string> write_private_file(const std::filesystem::path& path, const std::string& text);

/// The monitor endpoint a ready file names (its "http=" line); empty: the node has none.
std::string ready_http(const std::filesystem::path& path);

/// A job file and the cluster secret it names, as the cluster subcommands (node, status, leave)
/// load them first.
struct ClusterConfig {
  elastic::JobConfig config;
  std::string secret;
};

/// Loads and validates the job file (none: the defaults) with its overrides, then the secret.
/// On failure, prints "tepdist COMMAND: why" to stderr and returns nothing (exit status 2).
std::optional<ClusterConfig> load_cluster_config(const std::string& command, const std::optional<std::string>& file,
                                                 const std::vector<std::string>& overrides);

/// What `PROGRAM node` takes: the tepdist binary's `node` subcommand, and a program on the C++ API
/// relaunched by its Trainer.
struct NodeProcessArgs {
  std::optional<std::string> config;  ///< the job file; none: the defaults
  std::vector<std::string> overrides;
  std::string listen = "127.0.0.1:0";
  std::vector<std::string> join;  ///< none: [cluster] seeds
  std::string name;
  std::string region;  ///< none: the node's [nodes.NAME] table's
  std::string ready_file;
};

/// Runs one node in this process until SIGTERM or SIGINT (its exit status). A bad job file or
/// secret is said on stderr as "tepdist node: why", status 2.
int run_node_process(const NodeProcessArgs& args);

/// The arguments LocalNodes gives a relaunched node (argv[1] is "node").
NodeProcessArgs parse_relaunch_args(int argc, char** argv);

/// A running local cluster: `config.cluster.local_nodes` nodes of this machine.
struct LocalCluster {
  LocalNodes nodes;
  std::vector<std::string> seeds;     ///< each node's address, node i's at i
  std::string secret;                 ///< the cluster's, for members this process adds (the submitter)
  std::filesystem::path cluster_file; ///< out/cluster.toml: the job without local_nodes, with the seeds
  elastic::JobConfig cluster;         ///< its contents
  std::string http;                   ///< node 0's monitor endpoint; empty: none
  int64_t threads = 1;                ///< compute threads each node got
  std::vector<std::filesystem::path> logs;
};

/// Starts `c.cluster.local_nodes` nodes under `out` (out/logs/node-I.log, out/run/node-I.ready,
/// out/secret, out/cluster.toml) and waits until all are listening. Each node takes its share of
/// the cores unless [compute] threads names a count; with a fixed [monitor] http port, node i
/// takes that port + i. With [elastic] restart = "on-failure" a node that dies is started again
/// (`report` hears of it). Errors name the node that failed and end with its log's last lines.
std::expected<std::unique_ptr<LocalCluster>, std::string> start_local_cluster(
    const elastic::JobConfig& c, const std::filesystem::path& out, std::function<void(const std::string&)> report);

}  // namespace tepdist::actors

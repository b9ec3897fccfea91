#pragma once
// A node: one CAF actor system with the supervisor at its root, one transport, and the router
// that joins them. run_node() builds them, runs until SIGTERM / SIGINT (or until the supervisor
// gives up), and takes them down in order: transport first (no more frames in), then the actors.
//
// Membership is SWIM, driven by the router (actors/router.hpp): --join starts with a state sync
// with the seeds, SIGTERM / SIGINT first announce a graceful leave.

#include <cstdint>
#include <string>
#include <vector>

#include "actors/submitter.hpp"
#include "elastic/config.hpp"

namespace tepdist::actors {

struct NodeOptions {
  elastic::JobConfig config;
  std::string secret;
  std::string name;                 ///< node id; empty: the bound host:port
  std::string region = "local";
  std::string listen = "127.0.0.1:0";
  std::vector<std::string> join;    ///< seed addresses
  std::string ready_file;           ///< written with the bound address once listening
  int64_t threads = 0;              ///< kernel threads for the jobs this node trains; 0: the job's
  double slowdown = 1;              ///< emulation: this node's steps take this many times their compute time
  int64_t device = -1;              ///< backend "cuda": this node's device ([nodes.NAME] device, else
                                    ///< `tepdist node --set compute.device`); -1: the job's
  /// Set: this node is `tepdist run`'s submitter (no worker roles); run_node returns when the job
  /// ends, with its status.
  std::shared_ptr<Submission> submission;
};

/// A fresh boot id for a run of this node (a process start, or a trainer role's restart): random,
/// never 0 (unknown) and never `other_than` (the run it replaces).
uint64_t new_boot_id(uint64_t other_than = 0);

/// Runs the node until it is told to stop (or, as a submitter, until its job ends); returns the
/// process exit status (0 clean stop, 1 failure, 2 bad options, 130 interrupted submitter).
int run_node(const NodeOptions& options);

}  // namespace tepdist::actors

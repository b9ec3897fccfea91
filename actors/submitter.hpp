#pragma once
// The submitter: the member `tepdist run` adds to a cluster to hand it one job and follow it. It
// holds no worker role, so it never trains and is never in a ring. Once its view has the workers
// it waits for, it sends the job to the coordinator (the lowest live coordinator id it knows);
// then it passes every report and the final model to the launcher's hooks and ends the node when
// every worker of the job's latest generation is done (a done stands while its worker is the same
// run in the job; 2 s after rank 0's, the job ends without any still missing), or when one reports
// a failure. Workers
// that die, leave or join are the job's business (elastic/job_control.hpp): the submitter follows
// the generations it is sent, and counts the membership changes it sees.

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "actors/supervisor.hpp"
#include "gossip/transport/transport.hpp"

namespace tepdist::actors {

struct Submission {
  gossip::JobStart job;           ///< job_id and config; the submitter address is filled in
  size_t expected_workers = 0;    ///< live workers to wait for before submitting; 0: at least one
  double join_timeout_s = 30;     ///< give up when they are not seen by then
  double report_timeout_s = 120;  ///< and when the job goes this long without a report
  /// End (status 0, "detached") once the job trains (rank 0's first progress report): it goes on
  /// without the submitter, whose graceful leave tells the workers so.
  bool detach = false;
  /// Called on the submitter's thread, with the id of the worker that sent it.
  std::function<void(const gossip::JobReport&, const std::string& worker)> on_report;
  std::function<void(const gossip::TensorChunk&)> on_params;
  /// Each generation of the job after the first, as installed (and the membership event that
  /// this node saw, as "id joined|died|left|restarted", for each).
  std::function<void(const gossip::JobStart&)> on_generation = [](const gossip::JobStart&) {};
  std::function<void(const std::string&)> on_membership_event = [](const std::string&) {};
  /// Called once: 0 when every worker reported done, else 1 and why.
  std::function<void(int status, const std::string& why)> on_end;

  /// A job that pauses between epochs (job.released_epochs set, config job.pause_between_epochs):
  /// releases epochs up to `epochs` (counted from the job's start), optionally with parameters
  /// the workers held now take first (a safetensors file every worker reads, and the checksum of
  /// its values, compute::checksum). From any thread; the submitter tells the workers of the
  /// latest generation, and again until a generation carries the count. False while the
  /// submitter has not started (or has ended).
  /// `optimizer`: `optimizer.KEY=VALUE` lines the workers apply from the release on (JobStart::optimizer).
  bool release(uint32_t epochs, std::string reset_file = {}, uint64_t reset_checksum = 0, std::string optimizer = {});

  /// Asks the workers to stop the job (as Ctrl-C on `tepdist run` does), from any thread; the job
  /// ends when they report it (on_end). False while the submitter has not started (or has ended).
  bool stop();

  /// The submitter's actor sets these while it runs (release and stop go through it).
  using Release = std::function<void(uint32_t, std::string, uint64_t, std::string)>;
  void set_controls(Release release, std::function<void()> stop);

 private:
  // Shared by copies (the node wraps a copy of the caller's Submission): release() on the caller's
  // reaches the submitter that runs.
  struct Controls {
    std::mutex mutex;
    Release release;
    std::function<void()> stop;
  };
  std::shared_ptr<Controls> controls_ = std::make_shared<Controls>();
};

struct SubmitterOptions {
  gossip::Transport* transport = nullptr;
  std::string cluster_id, self_id, self_address;
  uint64_t incarnation = 0;
};

/// The role "submitter". (stop_atom) asks the coordinator to stop the job (Ctrl-C).
RoleSpec submitter_role(SubmitterOptions options, std::shared_ptr<Submission> submission, caf::actor router);

}  // namespace tepdist::actors

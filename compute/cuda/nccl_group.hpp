#pragma once
// An NCCL communicator for the sync mode's GPU workers, built for elastic membership: created
// non-blocking, polled for asynchronous errors, and aborted (never destroyed collectively) when a
// wait runs out or the generation changes, so a dead peer never hangs the survivors. The unique id
// that names a communicator is 128 opaque bytes that travel on the project's own wire with each
// generation (NCCL's own bootstrap then connects the ranks). Calls leave the calling thread's
// current CUDA device set to the group's.

#include <array>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "compute/error.hpp"

namespace tepdist::compute::cuda {

class NcclGroup {
 public:
  using UniqueId = std::array<std::byte, 128>;
  enum class State { pending, ready, failed, aborted };

  /// A fresh id for a new communicator (the generation's rank 0 makes it).
  static Result<UniqueId> new_id();
  /// Starts joining the communicator `id` of `ranks` ranks as `rank` on CUDA device `device`;
  /// returns at once. wait() until it is ready.
  static Result<std::unique_ptr<NcclGroup>> join(const UniqueId& id, int ranks, int rank, int device);

  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  /// Aborts the communicator unless it was aborted already: never waits for peers.
  ~NcclGroup();

  /// The communicator's state now (polls NCCL's asynchronous error); error() says why it failed.
  State poll();
  const std::string& error() const { return error_; }
  /// Polls until the queued work (the join, then any all-reduce) is done, it fails, or timeout
  /// passes; a failure or a timeout aborts the communicator and is returned as an error.
  Result<void> wait(std::chrono::milliseconds timeout);
  /// Queues an in-place sum of n floats of device memory over every rank, on the group's own
  /// stream: whatever wrote the data on another stream must have finished (the backend's
  /// compute_gradients returns after its stream is idle). wait() for the sum.
  Result<void> all_reduce_sum(float* device_data, size_t n);
  /// Ends the communicator now, whatever its peers do (a generation change, a dead peer).
  void abort();
  int ranks() const { return ranks_; }
  int rank() const { return rank_; }

 private:
  NcclGroup() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  State state_ = State::pending;
  std::string error_;
  int ranks_ = 0, rank_ = 0;
};

}  // namespace tepdist::compute::cuda

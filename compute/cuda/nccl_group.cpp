#include "compute/cuda/nccl_group.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <cstring>
#include <thread>

namespace tepdist::compute::cuda {

struct NcclGroup::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;  // recorded after the last queued all-reduce
  int device = 0;
  bool queued = false;          // an all-reduce was asked for and `done` is (or will be) after it
  bool record_pending = false;  // NCCL had not yet queued it on the stream: record `done` later
};

static_assert(sizeof(ncclUniqueId) == sizeof(NcclGroup::UniqueId));

Result<NcclGroup::UniqueId> NcclGroup::new_id() {
  ncclUniqueId id;
  if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
    return fail(Errc::invalid_argument, fmt::format("nccl: no unique id: {}", ncclGetErrorString(r)));
  UniqueId out;
  std::memcpy(out.data(), &id, sizeof id);
  return out;
}

Result<std::unique_ptr<NcclGroup>> NcclGroup::join(const UniqueId& id, int ranks, int rank, int device) {
  if (ranks < 1 || rank < 0 || rank >= ranks)
    return fail(Errc::invalid_argument, fmt::format("nccl: rank {} of {} ranks", rank, ranks));
  std::unique_ptr<NcclGroup> g(new NcclGroup);
  g->impl_ = std::make_unique<Impl>();
  g->ranks_ = ranks;
  g->rank_ = rank;
  g->impl_->device = device;
  if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess)
    return fail(Errc::invalid_argument, fmt::format("nccl: CUDA device {}: {}", device, cudaGetErrorString(e)));
  if (cudaStreamCreateWithFlags(&g->impl_->stream, cudaStreamNonBlocking) != cudaSuccess ||
      cudaEventCreateWithFlags(&g->impl_->done, cudaEventDisableTiming) != cudaSuccess)
    return fail(Errc::invalid_argument, "nccl: cannot create a CUDA stream and event");
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof nid);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; ncclCommGetAsyncError says how it went
  const ncclResult_t r = ncclCommInitRankConfig(&g->impl_->comm, ranks, nid, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    g->state_ = State::failed;
    g->error_ = fmt::format("nccl: joining as rank {} of {}: {}", rank, ranks, ncclGetErrorString(r));
    return fail(Errc::invalid_argument, g->error_);
  }
  return g;
}

NcclGroup::~NcclGroup() {
  abort();
  if (impl_) {
    if (impl_->done) cudaEventDestroy(impl_->done);
    if (impl_->stream) cudaStreamDestroy(impl_->stream);
  }
}

NcclGroup::State NcclGroup::poll() {
  if (state_ == State::failed || state_ == State::aborted || !impl_->comm) return state_;
  ncclResult_t async = ncclSuccess;
  if (const ncclResult_t r = ncclCommGetAsyncError(impl_->comm, &async); r != ncclSuccess) async = r;
  if (async == ncclInProgress) return state_ = State::pending;
  if (async != ncclSuccess) {
    error_ = fmt::format("nccl rank {} of {}: {} ({})", rank_, ranks_, ncclGetErrorString(async),
                         ncclGetLastError(impl_->comm));
    return state_ = State::failed;
  }
  if (impl_->record_pending) {
    // A non-blocking call that returned ncclInProgress has queued its kernel only now that the
    // communicator's state left ncclInProgress: `done` goes after it on the stream from here.
    if (const cudaError_t e = cudaEventRecord(impl_->done, impl_->stream); e != cudaSuccess) {
      error_ = fmt::format("nccl rank {} of {}: cannot record the all-reduce's completion: {}", rank_, ranks_,
                           cudaGetErrorString(e));
      return state_ = State::failed;
    }
    impl_->record_pending = false;
  }
  if (impl_->queued) {
    const cudaError_t e = cudaEventQuery(impl_->done);
    if (e == cudaErrorNotReady) return state_ = State::pending;
    impl_->queued = false;
    if (e != cudaSuccess) {
      error_ = fmt::format("nccl rank {} of {}: the all-reduce's stream failed: {}", rank_, ranks_, cudaGetErrorString(e));
      return state_ = State::failed;
    }
  }
  return state_ = State::ready;
}

Result<void> NcclGroup::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    switch (poll()) {
      case State::ready: return {};
      case State::failed: {
        std::string why = error_;
        abort();
        return fail(Errc::invalid_argument, why);
      }
      case State::aborted: return fail(Errc::invalid_argument, "nccl: the communicator was aborted");
      case State::pending: break;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      abort();
      error_ = fmt::format("nccl rank {} of {}: no progress in {} ms (a peer is gone or never came); aborted", rank_,
                           ranks_, timeout.count());
      return fail(Errc::invalid_argument, error_);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));  // polling NCCL's state: no event to wait on
  }
}

Result<void> NcclGroup::all_reduce_sum(float* data, size_t n) {
  if (poll() != State::ready) return fail(Errc::invalid_argument, "nccl: all-reduce on a communicator that is not ready");
  cudaSetDevice(impl_->device);
  const ncclResult_t r = ncclAllReduce(data, data, n, ncclFloat, ncclSum, impl_->comm, impl_->stream);
  if (r != ncclSuccess && r != ncclInProgress) {
    error_ = fmt::format("nccl rank {} of {}: all-reduce: {}", rank_, ranks_, ncclGetErrorString(r));
    state_ = State::failed;
    return fail(Errc::invalid_argument, error_);
  }
  impl_->queued = true;
  if (r == ncclInProgress) {
    impl_->record_pending = true;  // poll() records `done` once NCCL has queued the kernel
  } else if (cudaEventRecord(impl_->done, impl_->stream) != cudaSuccess) {
    return fail(Errc::invalid_argument, "nccl: cannot record the all-reduce's completion");
  }
  state_ = State::pending;
  return {};
}

void NcclGroup::abort() {
  if (!impl_ || !impl_->comm) return;
  cudaSetDevice(impl_->device);
  // Frees the communicator without waiting for peers. Its result can only say the communicator
  // was already broken, which abort is for.
  (void)ncclCommAbort(impl_->comm);
  impl_->comm = nullptr;
  impl_->queued = impl_->record_pending = false;
  if (state_ != State::failed) state_ = State::aborted;
}

}  // namespace tepdist::compute::cuda

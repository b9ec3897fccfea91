// Signals while oneDNN computes: Debian's oneDNN 2.6 GEMM kernels point rsp at a heap workspace
// (oneDNN #4845), so a signal handled on a thread that runs one writes its frame into the heap.
// compute/onednn/signals.hpp holds signals back while oneDNN runs. The probe sends a stream of
// signals at every thread that trains a model and counts the ones handled off their thread's own
// stack; it runs in a child process, since without the guard the heap it corrupts crashes the
// process or deadlocks it in malloc (4 runs of 4 did one or the other on the AVX-512 machine).

#include <omp.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "compute/backends.hpp"
#include "compute/presets.hpp"
#include "compute/rng.hpp"
#include "compute/train.hpp"
#include "tests/support/process.hpp"

#if defined(__x86_64__)  // the probe reads the interrupted rsp from the signal's context

using namespace tepdist::compute;

namespace {

struct ThreadStack {
  pid_t tid = 0;
  uintptr_t low = 0, high = 0;
};

// Written before the handler is installed, read by it.
std::array<ThreadStack, 64> stacks;
std::atomic<int> stack_count{0};
std::atomic<int> handled{0}, off_stack{0}, unknown_thread{0};

pid_t this_tid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

/// False if it could not (called inside a parallel region too, where nothing may throw).
bool record_this_thread() {
  pthread_attr_t a;
  if (pthread_getattr_np(pthread_self(), &a) != 0) return false;
  void* addr = nullptr;
  size_t size = 0;
  pthread_attr_getstack(&a, &addr, &size);
  pthread_attr_destroy(&a);
  const int i = stack_count.fetch_add(1);
  if (i >= static_cast<int>(stacks.size())) return false;
  stacks[static_cast<size_t>(i)] = {this_tid(), reinterpret_cast<uintptr_t>(addr),
                                    reinterpret_cast<uintptr_t>(addr) + size};
  return true;
}

/// Where was the interrupted thread's stack pointer?
void on_probe(int, siginfo_t*, void* context) {
  const auto* uc = static_cast<const ucontext_t*>(context);
  const auto rsp = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RSP]);
  const pid_t tid = this_tid();
  handled.fetch_add(1);
  for (int i = 0; i < stack_count.load(); ++i) {
    const ThreadStack& s = stacks[static_cast<size_t>(i)];
    if (s.tid != tid) continue;
    if (rsp < s.low || rsp >= s.high) off_stack.fetch_add(1);
    return;
  }
  unknown_thread.fetch_add(1);
}

}  // namespace

// Hidden: run by the test below, in a child process of its own.
TEST_CASE("signals probe: train while every training thread takes a stream of signals", "[.signals-probe]") {
  auto backend = std::move(*make_backend("onednn"));
  backend->set_threads(2);  // a team of two, on one core too: its second thread runs GEMM as well
  auto model = make_mlp();  // almost all its time is in inner products, on the GEMM kernels
  REQUIRE(model->build({1, 28, 28}, 0).has_value());
  const int64_t batch = 64;
  Tensor x({batch, 1, 28, 28});
  Rng r(3);
  for (float& v : x.span()) v = r.uniform();
  std::vector<int32_t> y(static_cast<size_t>(batch));
  for (auto& l : y) l = static_cast<int32_t>(r.below(10));
  LossScratch scratch;
  REQUIRE(try_compute_gradients(*model, *backend, x, y, scratch).has_value());  // the team now exists

  stack_count = 0;
  handled = off_stack = unknown_thread = 0;
  std::atomic<bool> recorded{record_this_thread()};
#pragma omp parallel num_threads(2)
  {
    if (omp_get_thread_num() != 0 && !record_this_thread()) recorded = false;
  }
  REQUIRE(recorded.load());
  REQUIRE(stack_count.load() == 2);

  struct sigaction probe {}, previous{};
  probe.sa_sigaction = on_probe;
  probe.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&probe.sa_mask);
  REQUIRE(sigaction(SIGUSR2, &probe, &previous) == 0);
  std::atomic<bool> done{false};
  std::thread sender([&] {
    const pid_t pid = getpid();
    while (!done.load()) {
      for (int i = 0; i < stack_count.load(); ++i)
        syscall(SYS_tgkill, pid, stacks[static_cast<size_t>(i)].tid, SIGUSR2);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  bool all_steps = true;
  for (int step = 0; step < 300 && all_steps; ++step)
    all_steps = try_compute_gradients(*model, *backend, x, y, scratch).has_value();
  done = true;
  sender.join();
  // The ones this thread held were taken as each oneDNN call returned; the OpenMP thread holds its
  // own pending for good. Ignoring the signal discards those before the default action returns.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGUSR2, &ignore, nullptr);
  sigaction(SIGUSR2, &previous, nullptr);
  std::printf("signals probe: steps_ok=%d handled=%d off_stack=%d unknown_thread=%d\n", all_steps ? 1 : 0,
              handled.load(), off_stack.load(), unknown_thread.load());
  std::fflush(stdout);
}

TEST_CASE("a signal sent while oneDNN trains is handled on its thread's own stack, never on a kernel's heap workspace",
          "[compute][onednn][signals]") {
  tepdist::test::Child probe({"/proc/self/exe", "[signals-probe]"});
  // About 1 s when it passes; a corrupted heap leaves it deadlocked in malloc.
  const auto line = probe.wait_for("signals probe:", std::chrono::seconds(60));
  // And one that wrote it may still hang on its way out (a heap corrupted late).
  if (!line || !probe.seen("test case", std::chrono::seconds(30))) probe.signal(SIGKILL);
  const int status = probe.wait();
  INFO("the probe wrote: " << probe.all());
  REQUIRE(line.has_value());
  CHECK(status == 0);
  using tepdist::test::field;
  CHECK(field(*line, "steps_ok") == "1");
  CHECK(std::stoi(field(*line, "handled")) > 0);  // held back, not lost: the training thread took signals
  CHECK(field(*line, "off_stack") == "0");
  CHECK(field(*line, "unknown_thread") == "0");
}

#endif  // __x86_64__

#pragma once
// No signal handler runs on a thread while it executes oneDNN's kernels.
//
// Debian 12's oneDNN (2.6) has JIT GEMM kernels, the f32 ones behind inner products among them, that
// point rsp at a heap workspace while they run (oneDNN issue #4845, fixed in 3.11 by #4855). A
// signal handled on such a thread gets its frame written there: into the heap. That is how
// `tepdist train` died with SIGSEGV in free() after about one Ctrl-C in 16 on the AVX-512 machine
// (92 of 1,500), and one in 150 with oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2) there. Any
// caught signal does it (a profiler's SIGPROF, a
// program's SIGINT handler), and the library cannot know which ones the program catches, so every
// catchable asynchronous signal is held back:
// - on the thread that calls into oneDNN, for the length of the call (SignalsHeld): a signal sent
//   meanwhile is delivered the moment the call returns, on the thread's own stack;
// - on the OpenMP threads that call's team runs on, for good: they run nothing but parallel regions,
//   and a signal meant for the process goes to a thread that takes it.
// Synchronous signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS) stay unblocked: a fault is
// reported as a fault. glibc does not let SIGCANCEL and SIGSETXID be blocked; nothing here cancels
// threads or changes user ids while training.
//
// Not airtight for a program that catches signals: libgomp ends the pool threads a smaller team
// does not use (oneDNN's GEMM often asks for fewer threads) and a later region makes new ones,
// with the mask of the thread that starts it; made by a region outside oneDNN (the optimiser's,
// say) while the signals are not held, they take signals, and the high-water mark here does not
// see them. So the processes of this project take no signal through a handler at all: nodes and
// `tepdist train` block theirs before any thread starts and take them with sigwait or
// sigtimedwait. This guard covers the rest: a program of the C++ API with handlers of its own.

#include <csignal>

namespace tepdist::compute::onednn {

/// The signals held back: every catchable one but the synchronous ones.
const sigset_t& held_signals();

/// Blocks held_signals() on this thread for its lifetime and restores the previous mask after.
/// The first time a thread's OpenMP team grows past the size it had blocked, also blocks them on
/// the team's other threads, for good. Costs two rt_sigprocmask calls: 0.43 us the pair on the
/// AVX-512 machine, against 6 ms for a LeNet step at batch 64.
class SignalsHeld {
 public:
  SignalsHeld();
  ~SignalsHeld();
  SignalsHeld(const SignalsHeld&) = delete;
  SignalsHeld& operator=(const SignalsHeld&) = delete;

 private:
  sigset_t previous_;
};

}  // namespace tepdist::compute::onednn

#include "compute/onednn/signals.hpp"

#include <omp.h>
#include <pthread.h>

#include <initializer_list>

#include "base/check.hpp"

namespace tepdist::compute::onednn {
namespace {

sigset_t make_held_signals() {
  sigset_t s;
  sigfillset(&s);
  for (int sync : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS}) sigdelset(&s, sync);
  return s;
}

/// The largest team this thread's OpenMP pool has had its workers' signals blocked for. libgomp
/// keeps a pool per thread that starts parallel regions, so the count is per thread too.
thread_local int team_blocked = 1;

}  // namespace

const sigset_t& held_signals() {
  static const sigset_t s = make_held_signals();
  return s;
}

SignalsHeld::SignalsHeld() {
  TEPDIST_CHECK(pthread_sigmask(SIG_BLOCK, &held_signals(), &previous_) == 0);
  // A team larger than the one blocked so far may have threads that started with another mask
  // (an earlier parallel region outside oneDNN, on the optimiser say): each blocks for itself.
  // Threads created from now on, while this thread holds the signals, inherit the blocked mask.
  if (const int team = omp_get_max_threads(); team > team_blocked && !omp_in_parallel()) {
    int got = 1;
#pragma omp parallel num_threads(team)
    {
      if (omp_get_thread_num() != 0) pthread_sigmask(SIG_BLOCK, &held_signals(), nullptr);
#pragma omp master
      got = omp_get_num_threads();
    }
    team_blocked = got;  // what the runtime gave (OMP_THREAD_LIMIT, OMP_DYNAMIC), not what was asked
  }
}

SignalsHeld::~SignalsHeld() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }

}  // namespace tepdist::compute::onednn

#pragma once
// TEPDIST_CHECK: an invariant check that stays on in every build, Release included (the standard
// assert is compiled out under NDEBUG, which CMake's Release flags define, and third-party headers
// such as fmt tie their own checks to it). For this program's own bugs only: a failed check says
// where and what, then aborts. Bad input is an error value, never a failed check.

#include <cstdio>
#include <cstdlib>

namespace tepdist::base {

[[noreturn]] inline void check_failed(const char* condition, const char* file, int line) {
  std::fprintf(stderr, "tepdist: invariant violated at %s:%d: %s\n", file, line, condition);
  std::abort();
}

}  // namespace tepdist::base

#define TEPDIST_CHECK(condition) \
  ((condition) ? static_cast<void>(0) : ::tepdist::base::check_failed(#condition, __FILE__, __LINE__))

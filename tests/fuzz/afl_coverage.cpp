// Edge coverage for AFL++ from GCC's own instrumentation. Debian's AFL++ GCC plugin refuses the
// GCC Debian ships now ("incompatible versions": the plugin was built against an earlier 12.2.0),
// and clang 14 cannot compile this project's C++23. So the fuzz targets' own code is compiled
// with g++ -fsanitize-coverage=trace-pc, which calls this at every basic block, and this does what
// AFL's instrumentation does: counts the edge (previous block, this block) in AFL's shared map,
// set up by afl-compiler-rt.o (forkserver, persistent mode). Libraries are not instrumented.

#include <cstdint>

extern "C" {
extern uint8_t* __afl_area_ptr;
extern uint32_t __afl_map_size;

/// The block's return address identifies it; the same process image runs every input (forkserver).
__attribute__((no_sanitize_coverage)) void __sanitizer_cov_trace_pc() {
  static thread_local uintptr_t previous = 0;
  const auto pc = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  const uintptr_t here = (pc >> 4) ^ (pc << 8);
  __afl_area_ptr[(here ^ previous) % __afl_map_size]++;
  previous = here >> 1;  // (a, b) and (b, a) are different edges
}

// trace-cmp also reports float comparisons, for which AFL++'s runtime has no hook.
__attribute__((no_sanitize_coverage)) void __sanitizer_cov_trace_cmpf(float, float) {}
__attribute__((no_sanitize_coverage)) void __sanitizer_cov_trace_cmpd(double, double) {}
}

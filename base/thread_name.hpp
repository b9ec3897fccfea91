#pragma once
// Names the calling thread, as `top -H`, `ps -L`, gdb and /proc/PID/task/*/comm show it, so that a
// profile of a node says which role's thread took the time ("trainer", "uv-loop", ...). Linux keeps
// 15 characters; longer names are cut.

#include <pthread.h>

#include <string>
#include <string_view>

namespace tepdist::base {

inline void name_this_thread(std::string_view name) {
  const std::string cut(name.substr(0, 15));
  pthread_setname_np(pthread_self(), cut.c_str());
}

}  // namespace tepdist::base

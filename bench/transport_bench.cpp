// Transport throughput between two processes on loopback, against a plain TCP socket pair moving
// the same bytes in the same run, for each frame protection: plain (no tag: measured here only;
// no node runs it), authenticated (Poly1305) and encrypted (AES-256-GCM, the default). Prints each
// figure and the ratios (goals: plain >= 0.8 of TCP, authenticated >= 0.8 of plain), then the rate
// of small messages, encrypted.
//
//   build/bench/tepdist_transport_bench [MESSAGES [ROUNDS]]   (default 200 tensors of 1.7 MB, 5 rounds)

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "gossip/transport/transport.hpp"

using namespace tepdist::gossip;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t tensor_floats = 431080;  // a LeNet gradient: 1.72 MB
constexpr size_t tensor_bytes = tensor_floats * sizeof(float);

FrameProtection protection = FrameProtection::encrypted;  // of the run under way (both processes)

TransportOptions options(const std::string& id) {
  TransportOptions o;
  o.identity = {"bench", id, "local", "bench-secret-of-32-bytes........", "", protection};
  o.send_queue_bytes = 64u << 20;
  return o;
}

/// Receives `expected` messages and returns (the process then exits, which the sender awaits);
/// runs in the child process.
int transport_receiver(int ready_fd, size_t expected) {
  std::mutex m;
  std::condition_variable cv;
  size_t received = 0;
  TransportEvents ev;
  ev.on_message = [&](const std::string&, const std::string&, Message) {
    std::lock_guard lock(m);
    if (++received == expected) cv.notify_all();
  };
  Transport t(options("receiver"), ev);
  const auto addr = t.start();
  if (!addr) return 1;
  const std::string line = *addr + "\n";
  if (::write(ready_fd, line.data(), line.size()) < 0) return 1;
  std::unique_lock lock(m);
  cv.wait(lock, [&] { return received == expected; });
  return 0;
}

std::string read_line(int fd) {
  std::string s;
  char c;
  while (::read(fd, &c, 1) == 1 && c != '\n') s += c;
  return s;
}

/// Sends `count` messages made by make() as fast as back-pressure allows; returns seconds until
/// the receiver process has them all (it exits then).
template <class Make>
double transport_run(size_t count, Make make) {
  int fds[2];
  if (::pipe(fds) != 0) std::exit(1);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    std::_Exit(transport_receiver(fds[1], count));
  }
  ::close(fds[1]);
  const std::string address = read_line(fds[0]);
  Transport t(options("sender"), {});
  if (!t.start()) std::exit(1);
  const auto t0 = Clock::now();
  for (size_t i = 0; i < count; ++i) {
    const Message m = make(i);
    while (!t.send(address, m, std::chrono::seconds(1))) {  // back-pressure: waits for room
    }
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  ::close(fds[0]);
  return seconds;
}

/// The same bytes over a plain TCP socket pair between two processes.
double tcp_run(size_t count, size_t bytes_each) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(listener, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  socklen_t len = sizeof sa;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&sa), &len);
  ::listen(listener, 1);
  const pid_t child = ::fork();
  if (child == 0) {
    const int c = ::accept(listener, nullptr, nullptr);
    std::vector<char> buf(1 << 20);
    size_t total = 0;
    while (total < count * bytes_each) {
      const ssize_t n = ::read(c, buf.data(), buf.size());
      if (n <= 0) std::_Exit(1);
      total += static_cast<size_t>(n);
    }
    std::_Exit(0);
  }
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::connect(s, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  std::vector<char> payload(bytes_each, 1);
  const auto t0 = Clock::now();
  for (size_t i = 0; i < count; ++i) {
    size_t sent = 0;
    while (sent < payload.size()) {
      const ssize_t n = ::write(s, payload.data() + sent, payload.size() - sent);
      if (n <= 0) std::exit(1);
      sent += static_cast<size_t>(n);
    }
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  ::close(s);
  ::close(listener);
  return seconds;
}

/// The machine and the crypto path the figures come from: the CPU, its cores, the instructions
/// OpenSSL's AES-GCM can use on it, and OpenSSL's version.
void print_machine() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, model, flags;
  auto value = [](std::string_view l) {  // what follows "key: ", or "" on a line without one
    const size_t colon = l.find(':');
    if (colon == std::string_view::npos) return std::string();
    l.remove_prefix(colon + 1);
    while (!l.empty() && l.front() == ' ') l.remove_prefix(1);
    return std::string(l);
  };
  while (std::getline(cpuinfo, line)) {
    if (model.empty() && line.rfind("model name", 0) == 0) model = value(line);
    if (flags.empty() && line.rfind("flags", 0) == 0) flags.append(" ").append(value(line)).append(" ");
  }
  if (model.empty()) model = "an unnamed CPU";
  auto has = [&](const char* f) { return flags.find(std::string(" ") + f + " ") != std::string::npos ? "yes" : "no"; };
  std::printf("machine: %s, %u cores; AES-NI %s, PCLMULQDQ %s, VAES %s, VPCLMULQDQ %s, AVX-512F %s; %s\n",
              model.c_str(), std::thread::hardware_concurrency(), has("aes"), has("pclmulqdq"), has("vaes"),
              has("vpclmulqdq"), has("avx512f"), OpenSSL_version(OPENSSL_VERSION));
}

}  // namespace

int main(int argc, char** argv) {
  print_machine();
  const size_t messages = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 200;
  const size_t rounds = argc > 2 ? std::max<size_t>(1, std::strtoul(argv[2], nullptr, 10)) : 5;
  auto tensor = std::make_shared<const std::vector<float>>(tensor_floats, 0.5f);
  const double mb = static_cast<double>(messages * tensor_bytes) / 1e6;
  std::printf("tensor messages: %zu x %.2f MB, %zu rounds of TCP, plain, authenticated, encrypted in turn (medians)\n",
              messages, static_cast<double>(tensor_bytes) / 1e6, rounds);
  // Interleaved, so a machine that speeds up or slows down during the run moves every figure alike.
  std::vector<double> seconds[4];
  constexpr FrameProtection modes[] = {FrameProtection::plain, FrameProtection::authenticated, FrameProtection::encrypted};
  for (size_t r = 0; r < rounds; ++r) {
    seconds[0].push_back(tcp_run(messages, tensor_bytes));
    for (const auto p : modes) {
      protection = p;
      seconds[1 + static_cast<int>(p)].push_back(transport_run(messages, [&](size_t i) {
        return Message{"sender", 1, "bench", TensorChunk{i, 0, 0, tensor_floats, *tensor, tensor}};
      }));
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double tcp = median(seconds[0]), plain = median(seconds[1]), authenticated = median(seconds[2]),
               encrypted = median(seconds[3]);
  std::printf("plain TCP socket pair:           %5.0f MB/s\n", mb / tcp);
  for (const auto p : modes)
    std::printf("tepdist transport, %-13s %5.0f MB/s\n", protection_name(p), mb / median(seconds[1 + static_cast<int>(p)]));
  std::printf("ratio plain / TCP:            %.2f (goal >= 0.8)\n", tcp / plain);
  std::printf("ratio authenticated / plain:  %.2f (goal >= 0.8)\n", plain / authenticated);
  std::printf("ratio encrypted / plain:      %.2f\n", plain / encrypted);
  protection = FrameProtection::encrypted;
  const size_t small = 100000;
  const double pings = transport_run(small, [](size_t i) { return Message{"sender", 1, "bench", Ping{i, {}}}; });
  std::printf("small messages (ping, %zu, encrypted): %.0f per second\n", small, static_cast<double>(small) / pings);
  return 0;
}

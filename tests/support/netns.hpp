#pragma once
// A host of its own for multi-process tests: a network namespace whose one link, a veth pair, is a
// port of a bridge in the root namespace. Taking that port down is a pulled cable: frames are
// dropped silently both ways, with no RST and no ICMP, so a peer learns of it only by timing out.
// Needs root and iproute2; everything is removed again when the object goes, and what a killed
// test run left behind is removed by the next one.

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <expected>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/process.hpp"

namespace tepdist::test {

/// The exit status and output of a short command run to its end.
struct CommandResult {
  int status = -1;
  std::string output;
};

/// Runs argv (argv[0] a full path) to its end. Only for commands that end by themselves.
inline CommandResult run_command(std::vector<std::string> argv) {
  Child c(std::move(argv));
  CommandResult r;
  r.status = c.wait();
  r.output = c.all();
  return r;
}

/// The iproute2 `ip` binary, or "" where there is none.
inline std::string ip_binary() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
    if (::access(p, X_OK) == 0) return p;
  return "";
}

class NetnsHost {
 public:
  /// Creates the namespace, the bridge and the veth pair, with addresses in 10.213.N.0/24 for an N
  /// no other interface of the root namespace uses. The error says why it cannot be done here (not
  /// root, no `ip`, no namespaces), and nothing is left behind then.
  static std::expected<std::unique_ptr<NetnsHost>, std::string> create() {
    if (::geteuid() != 0) return std::unexpected("not root");
    const std::string ip = ip_binary();
    if (ip.empty()) return std::unexpected("no iproute2 `ip` binary");
    remove_stale(ip);
    static int counter = 0;
    const std::string tag = std::to_string(::getpid()) + "-" + std::to_string(counter++);
    std::unique_ptr<NetnsHost> h(new NetnsHost);
    h->ip_ = ip;
    h->namespace_ = "tepdist-test-" + tag;
    h->bridge_ = "tdbr" + tag;  // interface names: 15 characters at most
    h->root_end_ = "tdva" + tag;
    h->host_end_ = "tdvb" + tag;
    const std::string used = run_command({ip, "-4", "-o", "addr", "show"}).output;
    int subnet = ::getpid() % 250;
    const auto taken = [&](int n) { return used.find("10.213." + std::to_string(n) + ".") != std::string::npos; };
    for (int tries = 0; tries < 250 && taken(subnet); ++tries) subnet = (subnet + 1) % 250;
    const std::string prefix = "10.213." + std::to_string(subnet) + ".";
    h->root_address_ = prefix + "1";
    h->host_address_ = prefix + "2";
    // From here on the destructor removes whatever was made, if a step fails.
    const std::vector<std::vector<std::string>> steps{
        {"netns", "add", h->namespace_},
        {"link", "add", h->bridge_, "type", "bridge"},
        {"link", "add", h->root_end_, "type", "veth", "peer", "name", h->host_end_},
        {"link", "set", h->host_end_, "netns", h->namespace_},
        {"link", "set", h->root_end_, "master", h->bridge_},
        {"addr", "add", h->root_address_ + "/24", "dev", h->bridge_},
        {"link", "set", h->bridge_, "up"},
        {"link", "set", h->root_end_, "up"},
        {"-n", h->namespace_, "addr", "add", h->host_address_ + "/24", "dev", h->host_end_},
        {"-n", h->namespace_, "link", "set", h->host_end_, "up"},
        {"-n", h->namespace_, "link", "set", "lo", "up"},
    };
    for (const auto& step : steps) {
      if (auto r = h->ip(step); r.status != 0) {
        std::string command = "ip";
        for (const auto& a : step) command += " " + a;
        return std::unexpected(command + ": " + r.output);
      }
    }
    return h;
  }

  NetnsHost(const NetnsHost&) = delete;
  NetnsHost& operator=(const NetnsHost&) = delete;
  /// Removes it all. Processes still running in the namespace keep it (and its veth end) alive
  /// until they end: kill them first.
  ~NetnsHost() {
    ip({"link", "del", root_end_});  // takes its peer in the namespace with it
    ip({"link", "del", bridge_});
    ip({"netns", "del", namespace_});
  }

  const std::string& name() const { return namespace_; }
  /// The bridge's address in the root namespace, where the namespace reaches the other nodes.
  const std::string& root_address() const { return root_address_; }
  /// The namespace's own address.
  const std::string& host_address() const { return host_address_; }
  /// argv prefixed with `ip netns exec NAME`, which execs it (same pid) inside the namespace.
  std::vector<std::string> inside(const std::vector<std::string>& argv) const {
    std::vector<std::string> all{ip_, "netns", "exec", namespace_};
    all.insert(all.end(), argv.begin(), argv.end());
    return all;
  }
  /// Takes the bridge port, the root end of the namespace's only link, down or up again.
  CommandResult set_link(bool up) { return ip({"link", "set", root_end_, up ? "up" : "down"}); }

 private:
  NetnsHost() = default;

  CommandResult ip(std::vector<std::string> args) const {
    args.insert(args.begin(), ip_);
    return run_command(std::move(args));
  }

  /// Namespaces, bridges and veths of test processes that are gone (killed at a ctest timeout, say,
  /// before their destructors ran).
  static void remove_stale(const std::string& ip) {
    std::istringstream list(run_command({ip, "netns", "list"}).output);
    for (std::string line; std::getline(list, line);) {
      const std::string ns = line.substr(0, line.find(' '));
      if (ns.rfind("tepdist-test-", 0) != 0) continue;
      const std::string tag = ns.substr(13);
      const pid_t owner = static_cast<pid_t>(std::atol(tag.c_str()));
      if (owner <= 0 || (::kill(owner, 0) != 0 && errno == ESRCH)) {
        run_command({ip, "link", "del", "tdva" + tag});
        run_command({ip, "link", "del", "tdbr" + tag});
        run_command({ip, "netns", "del", ns});
      }
    }
  }

  std::string ip_;
  std::string namespace_;
  std::string bridge_;
  std::string root_end_;
  std::string host_end_;
  std::string root_address_;
  std::string host_address_;
};

}  // namespace tepdist::test

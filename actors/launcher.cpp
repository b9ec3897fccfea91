#include "actors/launcher.hpp"

#include <fcntl.h>
#include <fmt/core.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <random>

#include "actors/node.hpp"
#include "compute/io/files.hpp"

namespace tepdist::actors {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::expected<pid_t, std::string> LocalNodes::start(const std::vector<std::string>& args, const fs::path& log) {
  auto pid = spawn(args, log);
  if (!pid) return pid;
  std::lock_guard lock(mutex_);
  pids_.push_back(*pid);
  specs_.push_back({args, log, 0});
  return pid;
}

void LocalNodes::keep(int64_t budget, std::vector<std::string> seeds, std::function<void(const std::string&)> report) {
  wake_ = ::eventfd(0, EFD_CLOEXEC);
  if (wake_ < 0) return;
  keeper_ = std::thread([this, budget, seeds = std::move(seeds), report = std::move(report)] {
    for (;;) {
      std::vector<pollfd> fds{{wake_, POLLIN, 0}};
      std::vector<size_t> which;
      {
        std::lock_guard lock(mutex_);
        for (size_t i = 0; i < pids_.size(); ++i) {
          if (pids_[i] <= 0) continue;
          const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pids_[i], 0));
          if (fd < 0) continue;
          fds.push_back({fd, POLLIN, 0});
          which.push_back(i);
        }
      }
      ::poll(fds.data(), fds.size(), -1);
      for (size_t k = 1; k < fds.size(); ++k) ::close(fds[k].fd);
      if (fds[0].revents & POLLIN) return;  // stopping
      for (size_t k = 1; k < fds.size(); ++k) {
        if (!(fds[k].revents & POLLIN)) continue;
        std::lock_guard lock(mutex_);
        const size_t i = which[k - 1];
        int status = 0;
        if (::waitpid(pids_[i], &status, WNOHANG) != pids_[i]) continue;
        pids_[i] = -1;
        auto& spec = specs_[i];
        const std::string name = spec.args.size() > 2 ? spec.args[2] : std::to_string(i);
        const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        const std::string how = WIFSIGNALED(status) ? fmt::format("signal {}", WTERMSIG(status))
                                                   : fmt::format("status {}", WEXITSTATUS(status));
        if (clean) {
          report(fmt::format("{} left (exited cleanly); not restarted", name));
          continue;
        }
        if (spec.restarts >= budget) {
          report(fmt::format("{} died ({}); restart budget of {} spent ([elastic] restart_budget)", name, how, budget));
          continue;
        }
        ++spec.restarts;
        std::vector<std::string> args;
        for (size_t a = 0; a < spec.args.size(); ++a) {
          if (spec.args[a] == "--join") {
            ++a;
            continue;
          }
          args.push_back(spec.args[a]);
        }
        if (i < seeds.size()) args.insert(args.end(), {"--listen", seeds[i]});
        for (size_t k = 0; k < seeds.size(); ++k)
          if (k != i) args.insert(args.end(), {"--join", seeds[k]});
        if (auto pid = spawn(args, spec.log)) {
          pids_[i] = *pid;
          report(fmt::format("{} died ({}); restarted it (restart {} of {})", name, how, spec.restarts, budget));
        } else {
          report(fmt::format("{} died ({}); cannot restart it: {}", name, how, pid.error()));
        }
      }
    }
  });
}

std::expected<pid_t, std::string> LocalNodes::spawn(const std::vector<std::string>& args, const fs::path& log) {
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return std::unexpected(fmt::format("cannot open {}", log.string()));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fd);
    return std::unexpected(std::string("fork failed"));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);  // the launcher died before prctl took hold
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    std::vector<std::string> argv = {"/proc/self/exe", "node"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> c;
    for (auto& a : argv) c.push_back(a.data());
    c.push_back(nullptr);
    ::execv("/proc/self/exe", c.data());
    ::_exit(127);
  }
  ::close(fd);
  return pid;
}

std::optional<std::pair<size_t, int>> LocalNodes::exited() {
  std::lock_guard lock(mutex_);
  for (size_t i = 0; i < pids_.size(); ++i) {
    int status = 0;
    if (pids_[i] > 0 && ::waitpid(pids_[i], &status, WNOHANG) == pids_[i]) {
      pids_[i] = -1;
      return std::pair{i, status};
    }
  }
  return std::nullopt;
}


void LocalNodes::stop() {
  if (keeper_.joinable()) {
    const uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(wake_, &one, sizeof one);
    keeper_.join();
  }
  if (wake_ >= 0) ::close(wake_), wake_ = -1;
  std::lock_guard lock(mutex_);
  for (pid_t p : pids_)
    if (p > 0) ::kill(p, SIGTERM);
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  for (pid_t& p : pids_) {
    while (p > 0) {
      if (::waitpid(p, nullptr, WNOHANG) == p) p = -1;
      else if (Clock::now() > deadline) ::kill(p, SIGKILL), ::waitpid(p, nullptr, 0), p = -1;
      else std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling a child's exit
    }
  }
  pids_.clear();
}

std::vector<pid_t> LocalNodes::pids() {
  std::lock_guard lock(mutex_);
  std::vector<pid_t> out;
  for (pid_t p : pids_)
    if (p > 0) out.push_back(p);
  return out;
}

std::string generate_secret() {
  std::random_device device;
  std::string s;
  for (int i = 0; i < 32; ++i) s += fmt::format("{:02x}", device() & 0xff);
  return s;
}

std::expected<void, std::string> write_private_file(const fs::path& path, const std::string& text) {
  if (auto ok = compute::write_file_atomically(path, text, 0600); !ok) return std::unexpected(ok.error().message);
  return {};
}

std::string ready_http(const fs::path& path) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("http=")) return line.substr(5);
  return {};
}

namespace {

std::string read_ready_file(const fs::path& path) {
  std::ifstream in(path);
  std::string address;
  std::getline(in, address);
  return address;
}

std::string tail_of(const fs::path& log, size_t lines = 5) {
  std::ifstream in(log);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += "  " + all[i] + "\n";
  return out;
}

/// Waits until every ready file exists (the node is listening); fails naming a node that exited.
std::expected<std::vector<std::string>, std::string> wait_ready(LocalNodes& nodes, const std::vector<fs::path>& ready,
                                                                const std::vector<fs::path>& logs) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  std::vector<std::string> addresses(ready.size());
  for (;;) {
    size_t have = 0;
    for (size_t i = 0; i < ready.size(); ++i) {
      if (addresses[i].empty() && fs::exists(ready[i])) addresses[i] = read_ready_file(ready[i]);
      have += !addresses[i].empty();
    }
    if (have == ready.size()) return addresses;
    if (auto e = nodes.exited())
      return std::unexpected(fmt::format("node {} exited before it was ready (status {}); the end of {}:\n{}", e->first,
                                         e->second, logs[e->first].string(), tail_of(logs[e->first])));
    if (Clock::now() > deadline) return std::unexpected(std::string("nodes not ready within 60 s"));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // ready files have no event to wait on
  }
}

}  // namespace

std::optional<ClusterConfig> load_cluster_config(const std::string& command, const std::optional<std::string>& file,
                                                 const std::vector<std::string>& overrides) {
  std::optional<fs::path> path;
  if (file) path = *file;
  auto config = elastic::load_config(path, overrides);
  if (!config) {
    fmt::print(stderr, "tepdist {}: {}\n", command, config.error().message);
    return std::nullopt;
  }
  auto secret = elastic::load_secret(config->cluster);
  if (!secret) {
    fmt::print(stderr, "tepdist {}: {}: {}\n", command, config->source, secret.error().message);
    return std::nullopt;
  }
  return ClusterConfig{std::move(*config), std::move(*secret)};
}

int run_node_process(const NodeProcessArgs& args) {
  auto loaded = load_cluster_config("node", args.config, args.overrides);
  if (!loaded) return 2;
  NodeOptions o;
  o.config = std::move(loaded->config);
  o.secret = std::move(loaded->secret);
  o.name = args.name;
  // --region, else the node's [nodes.NAME] table (a node named by its address has none).
  o.region = !args.region.empty() ? args.region : o.config.node(args.name).region;
  o.listen = args.listen;
  o.join = args.join.empty() ? o.config.cluster.seeds : args.join;
  o.threads = o.config.compute.threads;
  // Emulation of a slower node: its [nodes.NAME] table, else [compute].
  const double own = o.config.node(args.name).slowdown;
  o.slowdown = own > 0 ? own : o.config.compute.slowdown;
  // Its CUDA device: its [nodes.NAME] table, else `--set compute.device=N` on its own command line.
  // The file's [compute] device alone is not the node's: it is the job's (the default, 0, included),
  // which the job's own file sets for every node without one of its own.
  o.device = o.config.node(args.name).device;
  const auto device_set = [](const std::string& kv) { return kv.starts_with("compute.device="); };
  if (o.device < 0 && std::ranges::any_of(args.overrides, device_set)) o.device = o.config.compute.device;
  o.ready_file = args.ready_file;
  return run_node(o);
}

NodeProcessArgs parse_relaunch_args(int argc, char** argv) {
  NodeProcessArgs a;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : std::string(); };
    if (arg == "--name") a.name = value();
    else if (arg == "--ready-file") a.ready_file = value();
    else if (arg == "--set") a.overrides.push_back(value());
    else if (arg == "--region") a.region = value();
    else if (arg == "--join") a.join.push_back(value());
    else if (arg == "--listen") a.listen = value();
    else if (!a.config) a.config = arg;
  }
  return a;
}

std::expected<std::unique_ptr<LocalCluster>, std::string> start_local_cluster(
    const elastic::JobConfig& c, const fs::path& out, std::function<void(const std::string&)> report) {
  auto cluster = std::make_unique<LocalCluster>();
  const int64_t local = c.cluster.local_nodes;
  std::error_code ec;
  fs::create_directories(out / "logs", ec);
  fs::create_directories(out / "run", ec);
  if (ec) return std::unexpected(fmt::format("{}: cannot create the output directory: {}", out.string(), ec.message()));
  cluster->secret = generate_secret();
  const fs::path secret_file = fs::absolute(out / "secret");
  if (auto ok = write_private_file(secret_file, cluster->secret + "\n"); !ok) return std::unexpected(ok.error());
  const std::vector<std::string> cluster_keys = {"cluster.secret_file=" + elastic::toml_string(secret_file.string()),
                                                 "cluster.secret=\"\"", "cluster.local_nodes=0"};
  auto node_config = elastic::parse_config(c.text, (out / "cluster.toml").string(), cluster_keys);
  if (!node_config) return std::unexpected(node_config.error().message);
  cluster->cluster_file = out / "cluster.toml";
  if (auto ok = write_private_file(cluster->cluster_file, node_config->text); !ok) return std::unexpected(ok.error());
  const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  // Each local node its share of the cores, unless the job names a count ([compute] threads).
  cluster->threads = c.compute.threads > 0 ? c.compute.threads : std::max<int64_t>(1, cores / local);
  // A fixed monitor port: local node i takes the i-th port from it (they share one machine).
  const auto& http = c.monitor.http;
  const std::string http_host = http.substr(0, http.rfind(':'));
  const int http_port = http.empty() ? 0 : std::stoi(http.substr(http.rfind(':') + 1));  // validated
  if (http_port > 0 && http_port + local - 1 > 65535)
    return std::unexpected(fmt::format("{}: monitor.http {}: {} local nodes would need ports up to {}", c.source, http,
                                       local, http_port + local - 1));
  std::vector<fs::path> ready;
  auto& logs = cluster->logs;
  std::string first;
  for (int64_t i = 0; i < local; ++i) {
    ready.push_back(out / "run" / fmt::format("node-{}.ready", i));
    logs.push_back(out / "logs" / fmt::format("node-{}.log", i));
    fs::remove(ready.back(), ec);
    std::vector<std::string> node_args = {cluster->cluster_file.string(),
                                          "--name", elastic::local_node_name(i),
                                          "--ready-file", ready.back().string(),
                                          "--set", fmt::format("compute.threads={}", cluster->threads)};
    if (i > 0) node_args.insert(node_args.end(), {"--join", first});
    if (i > 0 && http_port > 0)
      node_args.insert(node_args.end(), {"--set", fmt::format("monitor.http=\"{}:{}\"", http_host, http_port + i)});
    if (auto started = cluster->nodes.start(node_args, logs.back()); !started) return std::unexpected(started.error());
    if (i == 0) {  // the others join through the first
      auto addresses = wait_ready(cluster->nodes, ready, logs);
      if (!addresses) return std::unexpected(addresses.error());
      first = (*addresses)[0];
    }
  }
  auto addresses = wait_ready(cluster->nodes, ready, logs);
  if (!addresses) return std::unexpected(addresses.error());
  cluster->seeds = *addresses;
  // cluster.toml, now with the seeds, is what reaches this cluster from another shell.
  std::string seed_list;
  for (const auto& a : cluster->seeds) seed_list += fmt::format("{}\"{}\"", seed_list.empty() ? "" : ", ", a);
  auto with_seeds = elastic::parse_config(node_config->text, cluster->cluster_file.string(),
                                          {{fmt::format("cluster.seeds=[{}]", seed_list)}});
  if (!with_seeds) return std::unexpected(with_seeds.error().message);
  if (auto ok = write_private_file(cluster->cluster_file, with_seeds->text); !ok) return std::unexpected(ok.error());
  cluster->cluster = *with_seeds;
  if (c.elastic.restart == "on-failure") cluster->nodes.keep(c.elastic.restart_budget, cluster->seeds, std::move(report));
  cluster->http = ready_http(ready[0]);
  return cluster;
}

}  // namespace tepdist::actors

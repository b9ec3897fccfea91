// The C++ API as a program uses it: examples/mlp_sync and examples/lenet_async, built against
// tepdist::Trainer, run as a user runs them. Each test checks that no process it started is left.

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "tests/support/process.hpp"
#include "tests/support/processes.hpp"
#include "tests/support/temp_dir.hpp"

namespace fs = std::filesystem;
using tepdist::test::Child;
using tepdist::test::TempDir;
using tepdist::test::all_gone;
using tepdist::test::read_bytes;
using tepdist::test::tensor_data;

namespace {

/// One epoch line of examples/mlp_sync.
struct Epoch {
  int epoch = 0, members = 0;
  std::string job, generation, steps, samples, nodes;
  double job_accuracy = 0, test_accuracy = 0;
};

std::vector<Epoch> epochs_of(const std::string& output) {
  static const std::regex line(R"(epoch (\d+): members (\d+), job (\d+) generation (\d+), (\d+) steps, (\d+) samples, )"
                               R"(job accuracy ([-0-9.]+), test accuracy ([0-9.]+), nodes ([0-9,-]+))");
  std::vector<Epoch> out;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line); it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    out.push_back({std::stoi(m[1]), std::stoi(m[2]), m[3], m[4], m[5], m[6], m[9], std::stod(m[7]), std::stod(m[8])});
  }
  return out;
}

/// A tepdist_trainer_probe under `out` (default dir/out) that waits between epochs at dir/gate
/// (open_gate); `extra`: its optional arguments.
std::unique_ptr<Child> start_probe(const TempDir& dir, const std::string& mode, int epochs,
                                   const std::vector<std::string>& extra = {}, fs::path out = {}) {
  const auto gate = dir.path / "gate";
  REQUIRE(::mkfifo(gate.c_str(), 0600) == 0);
  if (out.empty()) out = dir.path / "out";
  std::vector<std::string> argv = {TEPDIST_TRAINER_PROBE, out.string(), mode, std::to_string(epochs), gate.string()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return std::make_unique<Child>(argv);
}

/// Lets a probe waiting between epochs go on.
void open_gate(const TempDir& dir) { std::ofstream(dir.path / "gate") << "go\n"; }

/// The first line of `output` that starts with `prefix` (empty: none).
std::string probe_line(const std::string& output, const std::string& prefix) {
  for (size_t at = 0; at < output.size();) {
    const size_t end = std::min(output.find('\n', at), output.size());
    if (output.compare(at, prefix.size(), prefix) == 0) return output.substr(at, end - at);
    at = end + 1;
  }
  return {};
}

/// The parameters' checksum a probe printed after epoch `epoch` (empty: none).
std::string params_line(const std::string& output, int epoch) {
  const auto line = probe_line(output, "probe params " + std::to_string(epoch) + " ");
  return line.empty() ? line : line.substr(line.rfind(' ') + 1);
}

/// A probe of two epochs with `actions` (trainer_probe.cpp), let on after the first; it must end
/// well. Returns what it printed.
std::string run_probe_twice(const TempDir& dir, const std::string& mode, const std::string& actions) {
  const auto started = start_probe(dir, mode, 2, {actions});
  auto& probe = *started;
  REQUIRE(probe.wait_for("probe epoch 1 ", std::chrono::seconds(120)));
  open_gate(dir);
  const int status = probe.wait();
  INFO(probe.all());
  REQUIRE(status == 0);
  REQUIRE(probe.seen("probe done"));
  return probe.all();
}

/// The node process ids a probe line names ("... nodes PID,PID").
std::vector<pid_t> pids_of(const std::string& line) {
  std::vector<pid_t> out;
  std::string list = line.substr(line.rfind(' ') + 1);
  for (size_t at = 0; at < list.size();) {
    const size_t comma = list.find(',', at);
    out.push_back(std::stoi(list.substr(at, comma - at)));
    at = comma == std::string::npos ? list.size() : comma + 1;
  }
  return out;
}

/// The job id a probe line names ("... job J generation ...").
std::string job_of(const std::string& line) {
  const size_t at = line.find(" job ") + 5;
  return line.substr(at, line.find(' ', at) - at);
}

/// Writes a secret file readable by its owner only; returns its path.
fs::path secret_file(const TempDir& dir) {
  const auto path = dir.path / "secret";
  std::ofstream(path) << "a secret for this test, long enough\n";
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
  return path;
}

}  // namespace

TEST_CASE("Trainer, sync: three train() calls are one job on the same node processes, and end bit for bit where one "
          "3-epoch tepdist run of that job ends",
          "[integration][api]") {
  TempDir dir;
  const auto out = dir.path / "trainer";
  // Equal shares: with the balancer, shares follow measured speeds, so even two runs of one job
  // would sum their gradients in different pieces.
  Child program({TEPDIST_EXAMPLE_MLP, "--epochs", "3", "--out", out.string(), "--set", "elastic.balance=false"});
  const int status = program.wait();
  INFO(program.all());
  REQUIRE(status == 0);
  const auto epochs = epochs_of(program.all());
  REQUIRE(epochs.size() == 3);
  for (size_t e = 0; e < epochs.size(); ++e) {
    CHECK(epochs[e].members == 2);
    CHECK(epochs[e].job == epochs[0].job);        // one job
    CHECK(epochs[e].nodes == epochs[0].nodes);    // on the node processes the first call started
    CHECK(epochs[e].generation == std::to_string(e + 1));  // each release is a generation
    CHECK(epochs[e].steps == std::to_string(64 * (e + 1)));  // 4,096 samples at 2 x 32 a step
    CHECK(epochs[e].samples == "4096");
    // The job evaluated the epoch's model on the test set the program gave, as the program does.
    CHECK(epochs[e].job_accuracy == Approx(epochs[e].test_accuracy).margin(1e-4));
  }
  CHECK(epochs[0].nodes.find(',') != std::string::npos);  // two of them
  // Float features, trained end to end: four overlapping classes, chance is 0.25.
  CHECK(epochs.back().test_accuracy > 0.7);
  CHECK(epochs.back().test_accuracy >= epochs.front().test_accuracy - 0.02);

  // The job as the Trainer submitted it (its data, model, initial parameters and optimiser), run
  // by `tepdist run` in one go: the same parameters, bit for bit.
  const auto job = out / "job-1" / "job.toml";
  REQUIRE(fs::exists(job));
  Child run({TEPDIST_BINARY, "run", job.string(), "--set", "job.pause_between_epochs=false", "--out",
             (dir.path / "run").string()});
  const int run_status = run.wait();
  INFO(run.all());
  REQUIRE(run_status == 0);
  const auto trained = tensor_data(out / "mlp_sync.safetensors");
  const auto reference = tensor_data(dir.path / "run" / "model.safetensors");
  REQUIRE(trained.size() == reference.size());
  CHECK(trained.size() == (20 * 64 + 64) + (64 * 4 + 4));
  CHECK(std::memcmp(trained.data(), reference.data(), trained.size() * sizeof(float)) == 0);
  // And not because nothing moved: training changed the initial parameters.
  CHECK(tensor_data(out / "job-1" / "init.safetensors") != trained);
  CHECK(all_gone(dir.path.string(), std::chrono::seconds(10)));
}

TEST_CASE("Trainer: a program that throws between epochs ends its job and stops its node processes",
          "[integration][api]") {
  TempDir dir;
  const auto out = dir.path / "trainer";
  Child program({TEPDIST_EXAMPLE_MLP, "--epochs", "3", "--stop-after", "1", "--out", out.string()});
  const int status = program.wait();
  INFO(program.all());
  CHECK(status == 3);
  CHECK(program.seen("mlp_sync: stopped early"));
  const auto epochs = epochs_of(program.all());
  REQUIRE(epochs.size() == 1);
  // Its nodes were told to stop the job, then left (SIGTERM from the Trainer, not the kernel's
  // on the program's death: the program was still alive when they went).
  for (const auto* log : {"node-0.log", "node-1.log"}) {
    const std::string text = read_bytes(out / "logs" / log);
    INFO(log << ":\n" << text);
    CHECK(text.find("stopped by") != std::string::npos);
    CHECK(text.find("node_stopping") != std::string::npos);
  }
  CHECK(all_gone(dir.path.string(), std::chrono::seconds(10)));
}

TEST_CASE("Trainer on a running cluster of plain tepdist nodes: a layer list trains, a model class is refused, saying "
          "what the nodes need",
          "[integration][api]") {
  TempDir dir;
  const std::string secret = "cluster.secret_file=\"" + secret_file(dir).string() + "\"";
  Child a({TEPDIST_BINARY, "node", "--name", "a", "--set", secret});
  const auto ready = a.wait_for("node_ready");
  REQUIRE(ready);
  const std::string seed = tepdist::test::field(*ready, "address");
  Child b({TEPDIST_BINARY, "node", "--name", "b", "--set", secret, "--join", seed});
  REQUIRE(b.wait_for("member_joined id=a"));
  REQUIRE(a.wait_for("member_joined id=b"));

  Child mlp({TEPDIST_EXAMPLE_MLP, "--epochs", "2", "--seeds", seed, "--secret-file", (dir.path / "secret").string(),
             "--out", (dir.path / "mlp").string()});
  const int mlp_status = mlp.wait();
  INFO(mlp.all());
  REQUIRE(mlp_status == 0);
  const auto epochs = epochs_of(mlp.all());
  REQUIRE(epochs.size() == 2);
  CHECK(epochs[1].members == 2);
  CHECK(epochs[1].job == epochs[0].job);
  CHECK(epochs[1].nodes == "-");  // none of its own
  CHECK(epochs[1].test_accuracy > 0.7);

  // The LeNet example's model is a class of its own: nodes that do not run that program cannot
  // build it, and the error says what to do.
  Child lenet({TEPDIST_EXAMPLE_LENET, "--epochs", "1", "--train-samples", "512", "--test-samples", "100", "--seeds", seed,
               "--secret-file", (dir.path / "secret").string(), "--out", (dir.path / "lenet").string()});
  const int lenet_status = lenet.wait();
  INFO(lenet.all());
  CHECK(lenet_status == 1);
  CHECK(lenet.seen("model.preset = \"program\""));
  CHECK(lenet.seen("start the nodes as that program"));
  CHECK(lenet.seen("TrainerOptions::layers"));
  // The cluster is the operator's: still there, and it stops cleanly.
  a.signal(SIGTERM);
  b.signal(SIGTERM);
  CHECK(a.wait() == 0);
  CHECK(b.wait() == 0);
  CHECK(all_gone(dir.path.string(), std::chrono::seconds(10)));
}

TEST_CASE("Trainer: an optimiser the program changes between epochs is the next epoch's, in every mode",
          "[integration][api]") {
  // A rate of 1e-30 after the first epoch: every step's change falls below the parameters'
  // precision, so the second epoch ends where the first did, bit for bit (gossip: its replicas
  // were averaged at the hold, so they agree). With the old rate it would move them. Async in
  // gradients mode changes to Adam: the shards step it, and its state is of another layout. Sync
  // and gossip with their state kept apart (emulate-device) make that state anew for the new
  // optimiser.
  for (const auto& [mode, actions] :
       {std::pair{"sync", "slow-after-first"}, {"gossip", "slow-after-first"}, {"async", "slow-after-first"},
        {"async", "gradients,adam-after-first"}, {"sync", "emulate-device,adam-after-first"},
        {"gossip", "emulate-device,adam-after-first"}}) {
    DYNAMIC_SECTION(mode << " " << actions) {
      TempDir dir;
      const auto output = run_probe_twice(dir, mode, actions);
      const auto first = params_line(output, 1), second = params_line(output, 2);
      REQUIRE_FALSE(first.empty());
      CHECK(first == second);
      for (const auto* log : {"node-0.log", "node-1.log"}) {
        const std::string text = read_bytes(dir.path / "out" / "logs" / log);
        INFO(log << ":\n" << text);
        CHECK(text.find("optimizer_changed") != std::string::npos);
        if (std::string(actions).starts_with("gradients")) {  // Adam's moments: another layout, started afresh
          const auto line = probe_line(text.substr(std::min(text.find("shard_optimizer_changed"), text.size())), "shard");
          CHECK(line.ends_with(" generation=2 carried=false"));
        }
      }
      CHECK(all_gone(dir.path.string(), std::chrono::seconds(10)));
    }
  }
}

TEST_CASE("Trainer on a running cluster whose nodes cannot read its files: the data and the parameters go over the wire",
          "[integration][api]") {
  // Another machine, as far as files go: each node runs in a mount namespace of its own where the
  // program's output folder (the data set and the starting parameters it writes) is an empty
  // tmpfs. The nodes fetch what the job lists from the program, check it, and train on it.
  if (::geteuid() != 0) {
    WARN("skipped: a mount namespace per node needs root");
    return;
  }
  TempDir dir;
  const auto hidden = dir.path / "mlp";
  fs::create_directories(hidden);
  const std::string secret = "cluster.secret_file=\"" + secret_file(dir).string() + "\"";
  // Each node's own results folder (its cache of fetched files) stays visible: it is not under mlp.
  const auto node = [&](const std::string& name, const std::string& join) {
    std::string command = "mount -t tmpfs tmpfs '" + hidden.string() + "' && exec '" + TEPDIST_BINARY + "' node --name " +
                          name + " --set '" + secret + "' --set 'cluster.results_dir=\"" + (dir.path / name).string() +
                          "\"'";
    if (!join.empty()) command += " --join " + join;
    return std::make_unique<Child>(std::vector<std::string>{"/usr/bin/unshare", "--mount", "--propagation", "private",
                                                            "/bin/sh", "-c", command});
  };
  auto a = node("a", "");
  const auto ready = a->wait_for("node_ready");
  INFO(a->all());
  REQUIRE(ready);
  const std::string seed = tepdist::test::field(*ready, "address");
  auto b = node("b", seed);
  REQUIRE(b->wait_for("member_joined id=a"));
  REQUIRE(a->wait_for("member_joined id=b"));

  Child mlp({TEPDIST_EXAMPLE_MLP, "--epochs", "2", "--seeds", seed, "--secret-file", (dir.path / "secret").string(),
             "--out", hidden.string()});
  const int mlp_status = mlp.wait();
  INFO(mlp.all());
  INFO(b->all());
  REQUIRE(mlp_status == 0);
  const auto epochs = epochs_of(mlp.all());
  REQUIRE(epochs.size() == 2);
  CHECK(epochs[1].members == 2);
  CHECK(epochs[1].test_accuracy > 0.7);
  // Both nodes fetched the files (the training set, the test set, the initial parameters), and
  // keep them where they fetched them to, by checksum.
  for (auto* n : {a.get(), b.get()}) {
    CHECK(n->seen("job_files_fetching"));
    CHECK(n->seen("job_files_fetched"));
  }
  size_t cached = 0;
  for (const auto& e : fs::directory_iterator(dir.path / "a" / "files")) cached += e.path().extension() != ".part";
  CHECK(cached == 3);

  // Parameters the program sets between epochs (every one 0 after the first) reach them the same
  // way: each held worker fetches the file the release names before it enters the release's
  // generation, and takes it.
  const auto started = start_probe(dir, "sync", 2, {"zero-after-first", seed, (dir.path / "secret").string()}, hidden);
  auto& probe = *started;
  REQUIRE(probe.wait_for("probe epoch 1 ", std::chrono::seconds(120)));
  open_gate(dir);
  const int probe_status = probe.wait();
  INFO(probe.all());
  REQUIRE(probe_status == 0);
  CHECK(probe.seen("probe nonzero 3"));  // as on local nodes: the three classes' biases, nothing else
  for (auto* n : {a.get(), b.get()}) CHECK(n->seen("parameters_taken"));
  cached = 0;
  for (const auto& e : fs::directory_iterator(dir.path / "b" / "files")) cached += e.path().extension() != ".part";
  CHECK(cached == 3 + 2 + 1);  // the probe's data set (no test set) and initial parameters, and those it set
  a->signal(SIGTERM);
  b->signal(SIGTERM);
  CHECK(a->wait() == 0);
  CHECK(b->wait() == 0);
  CHECK(all_gone(dir.path.string(), std::chrono::seconds(10)));
}

TEST_CASE("Trainer, gossip: one job whose replicas are averaged at each epoch's end, the average handed over",
          "[integration][api]") {
  TempDir dir;
  const auto out = dir.path / "gossip";
  Child program({TEPDIST_EXAMPLE_LENET, "--mode", "gossip", "--epochs", "2", "--train-samples", "2048",
                 "--test-samples", "500", "--out", out.string()});
  const int status = program.wait();
  INFO(program.all());
  REQUIRE(status == 0);
  CHECK(program.seen("epoch 2: members 2"));
  CHECK(fs::exists(out / "job-1" / "job.toml"));
  CHECK_FALSE(fs::exists(out / "job-2"));  // one job for both calls
  // Each node held once, after the first epoch, with its replica averaged; the release was the
  // second generation; the job ended after the second epoch with one final average.
  for (const auto* log : {"node-0.log", "node-1.log"}) {
    const std::string text = read_bytes(out / "logs" / log);
    INFO(log << ":\n" << text);
    CHECK(text.find("epoch_hold job=") != std::string::npos);
    CHECK(text.find("epochs_done=1 released=1") != std::string::npos);
    CHECK(text.find("epochs_done=2") == std::string::npos);
    CHECK(text.find("generation=2") != std::string::npos);
    CHECK(text.find("job_done") != std::string::npos);
  }
  CHECK(all_gone(dir.path.string(), std::chrono::seconds(10)));
}

TEST_CASE("Trainer: a node killed between epochs is restarted, the job goes on, and the next epoch's report says so",
          "[integration][api]") {
  TempDir dir;
  const auto started = start_probe(dir, "sync", 3);
  auto& probe = *started;
  const auto first = probe.wait_for("probe epoch 1 ", std::chrono::seconds(120));
  INFO(probe.all());
  REQUIRE(first);
  const auto pids = pids_of(*first);
  REQUIRE(pids.size() == 2);
  // kill -9 of node-01 while the job waits for the program; the launcher restarts it.
  REQUIRE(::kill(pids[1], SIGKILL) == 0);
  open_gate(dir);
  const auto second = probe.wait_for("probe epoch 2 ", std::chrono::seconds(120));
  REQUIRE(second);
  open_gate(dir);
  REQUIRE(probe.wait_for("probe done", std::chrono::seconds(120)));
  REQUIRE(probe.wait() == 0);
  // One job throughout, on node-00's first process and node-01's second.
  const auto third = probe.seen("probe epoch 3 ");
  REQUIRE(third);
  CHECK(job_of(*second) == job_of(*first));
  CHECK(job_of(*third) == job_of(*first));
  const auto later = pids_of(*third);
  REQUIRE(later.size() == 2);
  CHECK(later[0] == pids[0]);
  CHECK(later[1] != pids[1]);
  // The reports after the kill list it: the death, the restart, and the generations they made.
  CHECK(probe.seen("probe event: local node node-01 died (signal 9); restarted it"));
  CHECK(probe.seen("probe event: generation"));
  CHECK(all_gone(dir.path.string(), std::chrono::seconds(10)));
}

TEST_CASE("Trainer: a program killed with SIGKILL between epochs takes its node processes with it",
          "[integration][api]") {
  for (const auto* mode : {"sync", "async"}) {
    DYNAMIC_SECTION(mode) {
      TempDir dir;
      const auto started = start_probe(dir, mode, 3);
      auto& probe = *started;
      const auto first = probe.wait_for("probe epoch 1 ", std::chrono::seconds(120));
      INFO(probe.all());
      REQUIRE(first);
      CHECK(pids_of(*first).size() == 2);
      probe.signal(SIGKILL);
      probe.wait();
      // The kernel tells each node (PR_SET_PDEATHSIG); they leave on their own. Async: each asks
      // the other to take its shards, and neither may wait for that (a drain gives up after 30 s).
      CHECK(all_gone(dir.path.string(), std::chrono::seconds(15)));
    }
  }
}

TEST_CASE("Trainer: parameters the program sets between epochs are where the next epoch starts, in every mode",
          "[integration][api]") {
  // Every parameter 0 after the first epoch: plain SGD from there moves only the last layer's
  // bias (each other gradient has a zero weight or a zero activation in it). Async: the shards
  // hold the parameters; in updates mode (the default) the workers step and the shards add their
  // changes, in gradients mode the shards step. Sync and gossip with their state kept apart
  // (emulate-device): the program's parameters are pushed to it.
  for (const auto& [mode, actions] :
       {std::pair{"sync", "zero-after-first"}, {"gossip", "zero-after-first"}, {"async", "zero-after-first"},
        {"async", "gradients,zero-after-first"}, {"sync", "emulate-device,zero-after-first"},
        {"gossip", "emulate-device,zero-after-first"}}) {
    DYNAMIC_SECTION(mode << " " << actions) {
      TempDir dir;
      const auto output = run_probe_twice(dir, mode, actions);
      CHECK(job_of(probe_line(output, "probe epoch 2 ")) == job_of(probe_line(output, "probe epoch 1 ")));
      CHECK(output.find("probe nonzero 3\n") != std::string::npos);  // the three classes' biases, and nothing else
      for (const auto* log : {"node-0.log", "node-1.log"}) {
        const std::string text = read_bytes(dir.path / "out" / "logs" / log);
        INFO(log << ":\n" << text);
        CHECK(text.find("parameters_taken") != std::string::npos);
      }
      CHECK(all_gone(dir.path.string(), std::chrono::seconds(10)));
    }
  }
}

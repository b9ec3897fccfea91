#include "tepdist/trainer.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <algorithm>

#include <cstdlib>
#include <cstring>
#include <fstream>

#include "cli/node_command.hpp"
#include "cli/run_command.hpp"
#include "compute/backends.hpp"
#include "compute/io/checkpoint.hpp"
#include "elastic/job.hpp"

namespace tepdist {
namespace fs = std::filesystem;
using compute::Errc;

namespace {

/// Writes a gzip-compressed IDX file (the MNIST format: zero, zero, type 0x08 for bytes, rank;
/// big-endian sizes), as the Fashion-MNIST loader reads it.
bool write_idx(const fs::path& path, const std::vector<int64_t>& dims, const uint8_t* bytes, size_t size) {
  gzFile out = gzopen(path.c_str(), "wb1");
  if (!out) return false;
  std::vector<unsigned char> header = {0, 0, 0x08, static_cast<unsigned char>(dims.size())};
  for (int64_t d : dims) {
    const auto v = static_cast<uint32_t>(d);
    header.insert(header.end(), {static_cast<unsigned char>(v >> 24), static_cast<unsigned char>(v >> 16),
                                 static_cast<unsigned char>(v >> 8), static_cast<unsigned char>(v)});
  }
  bool ok = gzwrite(out, header.data(), static_cast<unsigned>(header.size())) == static_cast<int>(header.size());
  for (size_t off = 0; ok && off < size;) {
    const auto n = static_cast<unsigned>(std::min<size_t>(size - off, 1u << 30));
    ok = gzwrite(out, bytes + off, n) == static_cast<int>(n);
    off += n;
  }
  return gzclose(out) == Z_OK && ok;
}

/// The data set as the Fashion-MNIST file pair `stem`-images/labels in dir.
compute::Result<void> write_split(const fs::path& dir, const std::string& stem, const compute::Dataset& d) {
  const auto& s = d.sample_shape();
  if (s.rank() != 3 || s[0] != 1)
    return compute::fail(Errc::invalid_argument, fmt::format("tepdist::Trainer sends one-channel image data ([1, h, w] "
                                                             "samples); this data set's samples are {}",
                                                             s.to_string()));
  const std::vector<uint8_t> labels(d.labels.begin(), d.labels.end());
  if (!write_idx(dir / (stem + "-images-idx3-ubyte.gz"), {d.size(), s[1], s[2]}, d.pixels.data(), d.pixels.size()) ||
      !write_idx(dir / (stem + "-labels-idx1-ubyte.gz"), {d.size()}, labels.data(), labels.size()))
    return compute::fail(Errc::io, fmt::format("cannot write the data set under {}", dir.string()));
  return {};
}

/// `--set` values for the optimiser the caller chose.
std::vector<std::string> optimizer_overrides(const OptimizerSpec& o) {
  const auto& a = o.options;
  const auto& s = o.schedule;
  return {fmt::format("optimizer.name=\"{}\"", a.name),   fmt::format("optimizer.lr={}", s.base_lr),
          fmt::format("optimizer.momentum={}", a.momentum), fmt::format("optimizer.nesterov={}", a.nesterov),
          fmt::format("optimizer.weight_decay={}", a.weight_decay), fmt::format("optimizer.beta1={}", a.beta1),
          fmt::format("optimizer.beta2={}", a.beta2),       fmt::format("optimizer.eps={}", a.eps),
          fmt::format("optimizer.schedule=\"{}\"", s.kind), fmt::format("optimizer.warmup_steps={}", s.warmup_steps),
          fmt::format("optimizer.step_size={}", s.step_size), fmt::format("optimizer.gamma={}", s.gamma),
          fmt::format("optimizer.min_lr={}", s.min_lr)};
}

/// Value of `--flag VALUE` style arguments of a relaunched node.
cli::NodeArgs parse_node_args(int argc, char** argv) {
  cli::NodeArgs a;
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

}  // namespace

void Trainer::serve(int argc, char** argv, ModelFactory factory) {
  elastic::set_program_model(std::move(factory));
  // Only a node the launcher started (it marks the environment), never the user's own run.
  const char* mark = std::getenv("TEPDIST_RELAUNCHED_NODE");
  if (!mark || std::strcmp(mark, "1") != 0 || argc < 2 || std::strcmp(argv[1], "node") != 0) return;
  ::unsetenv("TEPDIST_RELAUNCHED_NODE");
  std::exit(cli::run_node_command(parse_node_args(argc, argv)));
}

Trainer::Trainer(TrainerOptions options) : o_(std::move(options)) {}

compute::Result<EpochReport> Trainer::train(compute::Model& model, const compute::Dataset& train_data,
                                            const OptimizerSpec& optimizer, int64_t epoch) {
  if (!model.built()) return compute::fail(Errc::invalid_argument, "tepdist::Trainer::train: build the model first");
  std::error_code ec;
  const fs::path out = fs::absolute(o_.out), data = out / "data", run = out / fmt::format("epoch-{}", epoch);
  fs::create_directories(data, ec);
  fs::create_directories(run, ec);
  if (ec) return compute::fail(Errc::io, fmt::format("cannot create {}: {}", run.string(), ec.message()));
  if (!data_written_ || written_ != &train_data || written_size_ != train_data.size()) {
    if (auto ok = write_split(data, "train", train_data); !ok) return std::unexpected(ok.error());
    if (auto ok = write_split(data, "t10k", train_data.head(1000)); !ok) return std::unexpected(ok.error());
    data_written_ = true;
    written_ = &train_data;
    written_size_ = train_data.size();
  }
  const fs::path init = run / "init.safetensors";
  if (auto ok = compute::export_safetensors(init, model); !ok) return std::unexpected(ok.error());

  cli::RunArgs args;
  if (o_.config) args.config = o_.config->string();
  args.nodes = o_.nodes;
  args.mode = o_.mode;
  args.epochs = 1;
  args.out = run.string();
  args.overrides = {
      "model.preset=\"program\"",
      fmt::format("model.init_file=\"{}\"", init.string()),
      "data.dataset=\"fashion-mnist\"",
      fmt::format("data.dir=\"{}\"", data.string()),
      "data.train_samples=0",
      "data.test_samples=0",
      fmt::format("data.batch_size={}", o_.batch_size),
      fmt::format("job.seed={}", o_.seed + static_cast<uint64_t>(epoch)),
      "job.max_steps=0",
      "job.eval_every_steps=0",
  };
  for (auto& s : optimizer_overrides(optimizer)) args.overrides.push_back(std::move(s));
  for (const auto& s : o_.overrides) args.overrides.push_back(s);
  fs::remove(run / "model.safetensors", ec);  // a file from an earlier run must not pass for this one's
  if (const int status = cli::run_run_command(args); status != 0)
    return compute::fail(Errc::invalid_argument,
                         fmt::format("tepdist::Trainer: the {} job of epoch {} failed (status {}); see {}", o_.mode, epoch,
                                     status, (run / "logs").string()));
  if (auto ok = compute::import_safetensors(run / "model.safetensors", model); !ok) return std::unexpected(ok.error());
  std::ifstream in(run / "result.json");
  const auto r = nlohmann::json::parse(in, nullptr, false);
  if (r.is_discarded()) return compute::fail(Errc::io, fmt::format("cannot read {}", (run / "result.json").string()));
  EpochReport report;
  report.members = r.value("nodes", 0u);
  report.steps = r.value("steps", uint64_t{0});
  report.samples = r.value("samples", uint64_t{0});
  report.train_seconds = r.value("wall_seconds", 0.0);
  report.samples_per_second = r.value("samples_per_second", 0.0);
  report.result = run / "result.json";
  return report;
}

compute::Result<compute::Evaluation> Trainer::test(compute::Model& model, const compute::Dataset& data) {
  if (!model.built()) return compute::fail(Errc::invalid_argument, "tepdist::Trainer::test: build the model first");
  if (!backend_) {  // one for the Trainer's life: the model's kernels for it are made once
    auto made = compute::make_backend("onednn");
    if (!made) made = compute::make_backend("ref");
    if (!made) return std::unexpected(made.error());
    backend_ = std::move(*made);
  }
  return compute::try_evaluate(model, *backend_, data);
}

}  // namespace tepdist

#include "elastic/job.hpp"

#include <fmt/format.h>

#include <numeric>

#include "compute/data/dataset_file.hpp"
#include "compute/io/checkpoint.hpp"
#include "compute/presets.hpp"

namespace tepdist::elastic {
namespace {

ModelFactory& program_model() {
  static ModelFactory factory;
  return factory;
}

/// Both sets as the job needs them, checked at its start rather than at rank 0's first
/// evaluation: each whole (Dataset::check: shapes, labels in its classes, finite values), and
/// every test label one of the training set's classes, which the model is built for. An error
/// names the set's file.
compute::Result<JobData> checked(JobData out, const std::string& train_name, const std::string& test_name) {
  auto refuse = [](const std::string& name, const std::string& why) {
    return std::unexpected(compute::Error{compute::Errc::invalid_argument, fmt::format("{}: {}", name, why)});
  };
  if (auto ok = out.train.check(); !ok) return refuse(train_name, ok.error().message);
  if (auto ok = out.test.check(); !ok) return refuse(test_name, ok.error().message);
  for (size_t i = 0; i < out.test.labels.size(); ++i)
    if (out.test.labels[i] >= out.train.classes)
      return refuse(test_name, fmt::format("sample {}'s label {} is outside the training set's {} classes [0, {}), "
                                           "which the model is built for",
                                           i, out.test.labels[i], out.train.classes, out.train.classes));
  return out;
}

}  // namespace

void set_program_model(ModelFactory factory) { program_model() = std::move(factory); }

compute::Result<JobData> load_job_data(const JobConfig::Data& d, uint64_t seed) {
  if (d.dataset == "synthetic") {
    const int64_t train_n = d.train_samples ? d.train_samples : 10000;
    const int64_t test_n = d.test_samples ? d.test_samples : 2000;
    compute::Dataset all = compute::make_synthetic(train_n + test_n, seed);
    JobData out;
    out.train = all.head(train_n);
    std::vector<int64_t> tail(static_cast<size_t>(test_n));
    std::iota(tail.begin(), tail.end(), train_n);
    out.test = compute::subset(all, tail);
    return out;
  }
  if (d.dataset == "files") {
    auto train = compute::load_dataset(d.train_file);
    if (!train) return std::unexpected(train.error());
    JobData out;
    out.train = train->head(d.train_samples);
    if (d.test_file.empty()) {
      out.test = out.train.head(d.test_samples ? d.test_samples : 1000);
    } else {
      auto test = compute::load_dataset(d.test_file);
      if (!test) return std::unexpected(test.error());
      if (!(test->sample == out.train.sample) || test->kind != out.train.kind)
        return std::unexpected(compute::Error{
            compute::Errc::mismatch,
            fmt::format("{} holds {} samples of {}; the training set {} holds {} samples of {}", d.test_file,
                        test->floats() ? "float" : "byte", test->sample.to_string(), d.train_file,
                        out.train.floats() ? "float" : "byte", out.train.sample.to_string())});
      out.test = test->head(d.test_samples);
    }
    return checked(std::move(out), d.train_file, d.test_file.empty() ? d.train_file : d.test_file);
  }
  auto train = compute::load_fashion_mnist(d.dir, "train", d.train_samples);
  if (!train) return std::unexpected(train.error());
  auto test = compute::load_fashion_mnist(d.dir, "test", d.test_samples);
  if (!test) return std::unexpected(test.error());
  const std::filesystem::path dir = d.dir;
  return checked(JobData{std::move(*train), std::move(*test)}, (dir / "train-labels-idx1-ubyte.gz").string(),
                 (dir / "t10k-labels-idx1-ubyte.gz").string());
}

compute::Result<std::unique_ptr<compute::Model>> build_job_model(const JobConfig& c, const compute::Dataset& train) {
  auto fail = [&](const std::string& why) {
    return std::unexpected(compute::Error{compute::Errc::invalid_argument, fmt::format("{}: {}", c.source, why)});
  };
  compute::Result<std::unique_ptr<compute::Model>> model = std::unique_ptr<compute::Model>();
  if (c.model.preset == "program") {
    if (!program_model())
      return fail("model.preset = \"program\" names the model class of a program built with tepdist::Trainer, and "
                  "this node does not run such a program (a plain `tepdist node`?): start the nodes as that program "
                  "(PROGRAM node FILE ...), or give the model as a layer list (TrainerOptions::layers, [model] layers)");
    model = program_model()();
    if (!*model) return fail("the program's model factory returned no model");
  } else if (!c.model.layers.empty()) {
    model = compute::make_model(c.model.layers);
  } else {
    model = compute::make_preset(c.model.preset);
  }
  if (!model) return fail(model.error().message);
  if (auto ok = (*model)->build(train.sample_shape(), c.job.seed); !ok) return fail(ok.error().message);
  if ((*model)->classes() < train.classes)
    return fail(fmt::format("the model outputs {} classes but the data has {}", (*model)->classes(), train.classes));
  if (!c.model.init_file.empty())
    if (auto ok = compute::import_safetensors(c.model.init_file, **model); !ok)
      return fail(fmt::format("model.init_file: {}", ok.error().message));
  return std::move(*model);
}

compute::BackendOptions backend_options(const JobConfig& config) {
  return {.device = static_cast<int>(config.compute.device),
          .deterministic = config.compute.deterministic,
          .emulate_device = config.compute.emulate_device};
}

}  // namespace tepdist::elastic

#include "elastic/job.hpp"

#include <fmt/format.h>

#include <numeric>

#include "compute/io/checkpoint.hpp"
#include "compute/presets.hpp"

namespace tepdist::elastic {
namespace {

ModelFactory& program_model() {
  static ModelFactory factory;
  return factory;
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
  auto train = compute::load_fashion_mnist(d.dir, "train", d.train_samples);
  if (!train) return std::unexpected(train.error());
  auto test = compute::load_fashion_mnist(d.dir, "test", d.test_samples);
  if (!test) return std::unexpected(test.error());
  return JobData{std::move(*train), std::move(*test)};
}

compute::Result<std::unique_ptr<compute::Model>> build_job_model(const JobConfig& c, const compute::Dataset& train) {
  auto fail = [&](const std::string& why) {
    return std::unexpected(compute::Error{compute::Errc::invalid_argument, fmt::format("{}: {}", c.source, why)});
  };
  compute::Result<std::unique_ptr<compute::Model>> model = std::unique_ptr<compute::Model>();
  if (c.model.preset == "program") {
    if (!program_model())
      return fail("model.preset = \"program\" names the model class of a program built with tepdist::Trainer; this "
                  "program registered none");
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

}  // namespace tepdist::elastic

#include "elastic/job.hpp"

#include <fmt/format.h>

#include <numeric>

#include "compute/presets.hpp"

namespace tepdist::elastic {

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
  auto model = c.model.layers.empty() ? compute::make_preset(c.model.preset) : compute::make_model(c.model.layers);
  auto fail = [&](const std::string& why) {
    return std::unexpected(compute::Error{compute::Errc::invalid_argument, fmt::format("{}: {}", c.source, why)});
  };
  if (!model) return fail(model.error().message);
  if (auto ok = (*model)->build(train.sample_shape(), c.job.seed); !ok) return fail(ok.error().message);
  if ((*model)->classes() < train.classes)
    return fail(fmt::format("the model outputs {} classes but the data has {}", (*model)->classes(), train.classes));
  return std::move(*model);
}

}  // namespace tepdist::elastic

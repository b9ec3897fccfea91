#include "compute/resident.hpp"

#include <algorithm>
#include <cmath>

#include "compute/train.hpp"

namespace tepdist::compute {
namespace {

/// The host backends' state: the model's own buffers and a host optimiser; nothing to sync.
class HostResident final : public ResidentState {
 public:
  HostResident(Model& model, Backend& backend, std::unique_ptr<Optimizer> optimizer)
      : model_(model), backend_(backend), optimizer_(std::move(optimizer)) {}

  Result<float> compute_gradients(ConstTensorView x, std::span<const int32_t> labels) override {
    return try_compute_gradients(model_, backend_, x, labels, scratch_);
  }
  bool gradient_finite() override {
    const auto g = model_.gradients();
    return std::all_of(g.begin(), g.end(), [](float v) { return std::isfinite(v); });
  }
  void step(float lr) override { optimizer_->step(model_.parameters(), model_.gradients(), lr); }
  Optimizer& optimizer() override { return *optimizer_; }
  std::string where() const override { return "host memory"; }

  void pull_parameters() override {}
  void push_parameters() override {}
  void pull_gradients() override {}
  void push_gradients() override {}
  void pull_optimizer() override {}
  void push_optimizer() override {}

 private:
  Model& model_;
  Backend& backend_;
  std::unique_ptr<Optimizer> optimizer_;
  LossScratch scratch_;
};

}  // namespace

Result<std::unique_ptr<ResidentState>> Backend::make_resident(Model& model, const OptimizerOptions& options) {
  (void)model;
  (void)options;
  return nullptr;
}

Result<std::unique_ptr<ResidentState>> make_resident(Model& model, Backend& backend, const OptimizerOptions& options) {
  TEPDIST_CHECK(model.built());
  auto own = backend.make_resident(model, options);
  if (!own || *own) return own;
  auto optimizer = make_optimizer(options, model.parameters().size());
  if (!optimizer) return std::unexpected(optimizer.error());
  return std::make_unique<HostResident>(model, backend, std::move(*optimizer));
}

}  // namespace tepdist::compute

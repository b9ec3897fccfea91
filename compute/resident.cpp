#include "compute/resident.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/check.hpp"

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

/// [compute] emulate_device: a host backend's state kept apart from the model's buffers, as a
/// device keeps it, and the host's copy made NaN whenever it is out of date (the parameters and the
/// optimiser's buffers after a step, the gradient after a compute), so a read that misses its pull
/// sees NaN. A write to the host's parameters that misses its push, which on a device would be
/// lost at the next step, fails an invariant check at the next compute or pull (the host's copy,
/// current, must then be the state's bit for bit). Emulation, for tests on a machine without a
/// device; the backend computes on the model's buffers, so each compute copies the parameters in
/// and the gradient out.
class EmulatedDevice final : public ResidentState {
 public:
  EmulatedDevice(Model& model, Backend& backend, std::unique_ptr<Optimizer> host, std::unique_ptr<Optimizer> device)
      : model_(model),
        backend_(backend),
        host_(std::move(host)),
        device_(std::move(device)),
        params_(model.parameters().begin(), model.parameters().end()),
        grads_(params_.size(), 0.0f) {}

  Result<float> compute_gradients(ConstTensorView x, std::span<const int32_t> labels) override {
    const auto host = model_.parameters();
    TEPDIST_CHECK(!unpushed_write());  // the host's parameters were written without push_parameters
    std::copy(params_.begin(), params_.end(), host.begin());
    auto loss = try_compute_gradients(model_, backend_, x, labels, scratch_);
    if (!params_current_) poison(host);
    if (!loss) return loss;  // refused before the gradient was touched
    const auto g = model_.gradients();
    std::copy(g.begin(), g.end(), grads_.begin());
    poison(g);
    return loss;
  }
  bool gradient_finite() override {
    return std::all_of(grads_.begin(), grads_.end(), [](float v) { return std::isfinite(v); });
  }
  void step(float lr) override {
    device_->set_steps(host_->steps());  // as a device's step reads the host's count
    device_->step(params_, grads_, lr);
    host_->set_steps(device_->steps());
    params_current_ = false;
    poison(model_.parameters());
    for (auto& [name, buffer] : host_->state()) poison(buffer);
  }
  Optimizer& optimizer() override { return *host_; }
  std::string where() const override { return "host memory kept apart from the model's (compute.emulate_device)"; }

  void pull_parameters() override {
    TEPDIST_CHECK(!unpushed_write());  // the pull would overwrite host writes never pushed
    std::copy(params_.begin(), params_.end(), model_.parameters().begin());
    params_current_ = true;
  }
  void push_parameters() override {
    const auto host = model_.parameters();
    std::copy(host.begin(), host.end(), params_.begin());
    params_current_ = true;
  }
  void pull_gradients() override { std::copy(grads_.begin(), grads_.end(), model_.gradients().begin()); }
  void push_gradients() override {
    const auto host = model_.gradients();
    std::copy(host.begin(), host.end(), grads_.begin());
  }
  // Both made from the same options: the same layout, so the buffers (and the count) always carry.
  void pull_optimizer() override {
    const bool carried = carry_state(*device_, *host_);
    TEPDIST_CHECK(carried);
  }
  void push_optimizer() override {
    const bool carried = carry_state(*host_, *device_);
    TEPDIST_CHECK(carried);
  }

 private:
  static void poison(std::span<float> host) { std::fill(host.begin(), host.end(), std::numeric_limits<float>::quiet_NaN()); }
  /// Whether the host's parameters, current since the last pull or push, were written since.
  bool unpushed_write() const {
    const auto host = model_.parameters();
    return params_current_ && std::memcmp(host.data(), params_.data(), host.size_bytes()) != 0;
  }

  Model& model_;
  Backend& backend_;
  std::unique_ptr<Optimizer> host_, device_;  // the host's copy (name, steps, buffers after a pull), the state
  std::vector<float> params_, grads_;
  bool params_current_ = true;  // the model's parameters are the state's (not NaN)
  LossScratch scratch_;
};

}  // namespace

Result<std::unique_ptr<ResidentState>> Backend::make_resident(Model& model, const OptimizerOptions& options) {
  if (!emulates_device()) return nullptr;
  auto host = make_optimizer(options, model.parameters().size());
  if (!host) return std::unexpected(host.error());
  auto device = make_optimizer(options, model.parameters().size());
  if (!device) return std::unexpected(device.error());
  return std::make_unique<EmulatedDevice>(model, *this, std::move(*host), std::move(*device));
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

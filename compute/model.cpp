#include "compute/model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include "base/check.hpp"

namespace tepdist::compute {

Layer& Model::add(std::unique_ptr<Layer> layer, std::string name) {
  TEPDIST_CHECK(!built_ && "layers are added before build()");
  if (name.empty()) {
    int same_stem = 0;
    for (const auto& e : layers_)
      if (e.layer->name_stem() == layer->name_stem()) ++same_stem;
    name = fmt::format("{}{}", layer->name_stem(), same_stem + 1);
  }
  layers_.push_back({std::move(name), std::move(layer), {}});
  return *layers_.back().layer;
}

Result<void> Model::build(const Shape& sample_shape, uint64_t seed) {
  if (built_) return fail(Errc::invalid_argument, "model: build() called twice");
  if (layers_.empty()) return fail(Errc::invalid_argument, "model: no layers");
  std::map<std::string, int, std::less<>> seen;
  for (const auto& e : layers_)
    if (seen[e.name]++)
      return fail(Errc::invalid_argument, fmt::format("model: two layers are named '{}'", e.name));

  if (sample_shape.rank() < 1 || sample_shape.rank() >= Shape::max_rank)
    return fail(Errc::invalid_argument, "model: a sample must have rank 1 to 3");
  Shape shape = sample_shape.prepend(1);  // layer by layer, for a batch of one
  int64_t total = 0;
  std::vector<std::vector<ParamSpec>> specs;
  for (auto& e : layers_) {
    auto out = e.layer->configure(shape);
    if (!out)
      return fail(Errc::invalid_argument, fmt::format("model: layer {} ({}): {}", e.name, e.layer->kind(),
                                                      out.error().message));
    e.output = shape = *out;
    specs.push_back(e.layer->parameter_specs());
    e.params_begin = total;
    for (const auto& p : specs.back()) {
      named_.push_back({e.name + "." + p.name, p.shape, total});
      total += p.shape.elements();
    }
    e.params_end = total;
  }
  if (shape.rank() != 2)
    return fail(Errc::invalid_argument,
                fmt::format("model: the last layer must output [n, classes], got {}", shape.to_string()));

  params_.assign(static_cast<size_t>(total), 0.0f);
  grads_.assign(static_cast<size_t>(total), 0.0f);
  Rng init(seed);
  size_t k = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    std::vector<TensorView> p, g;
    for (const auto& spec : specs[i]) {
      const NamedParameter& np = named_[k++];
      p.push_back({params_.data() + np.offset, np.shape});
      g.push_back({grads_.data() + np.offset, np.shape});
      for (float& v : p.back().span()) v = init.uniform(-spec.init_bound, spec.init_bound);
    }
    layers_[i].layer->bind(p, g);
  }
  rng_.reseed(seed ^ 0x6a09e667f3bcc908ull);  // a stream of its own, apart from initialisation's
  sample_shape_ = sample_shape;
  activations_.resize(layers_.size());
  built_ = true;
  return {};
}

int64_t Model::classes() const {
  TEPDIST_CHECK(built_);
  return layers_.back().output[1];
}

NetworkPlan* Model::plan_for(Backend& backend, int64_t batch) {
  if (backend.id() != plans_backend_) {
    plans_.clear();
    plans_backend_ = backend.id();
  }
  // Least recently used last out: the training batch, the evaluation batch, an epoch's short last
  // batch, and a sync worker's few balanced shares (elastic/balance.hpp moves them in quanta).
  for (auto it = plans_.begin(); it != plans_.end(); ++it)
    if (it->batch == batch) {
      std::rotate(it, it + 1, plans_.end());
      return plans_.back().plan.get();
    }
  constexpr size_t max_plans = 8;
  if (plans_.size() == max_plans) plans_.erase(plans_.begin());
  plans_.push_back({batch, backend.plan_network(planned_layers(batch))});
  return plans_.back().plan.get();
}

std::string Model::compute_path(Backend& backend, int64_t batch) {
  const NetworkPlan* plan = plan_for(backend, batch);
  return fmt::format("{}, batch {}: {}", backend.describe(), batch, plan ? plan->path() : "layer by layer");
}

std::vector<PlannedLayer> Model::planned_layers(int64_t batch) const {
  TEPDIST_CHECK(built_);
  std::vector<PlannedLayer> layers;
  size_t next_param = 0;
  for (const auto& e : layers_) {
    PlannedLayer p = e.layer->plan(batch);
    const size_t count = e.layer->parameter_specs().size();
    if (count == 2) {  // weight, then bias
      p.weight_offset = named_[next_param].offset;
      p.bias_offset = named_[next_param + 1].offset;
    }
    next_param += count;
    p.params_begin = e.params_begin;
    p.params_end = e.params_end;
    p.name = e.name;
    layers.push_back(p);
  }
  return layers;
}

Result<ConstTensorView> Model::forward(Backend& backend, ConstTensorView x, bool training) {
  TEPDIST_CHECK(built_);
  if (x.shape.rank() != sample_shape_.rank() + 1 || x.shape.sample() != sample_shape_ || x.shape[0] < 1) {
    forwarded_ = false;  // nothing for a backward to differentiate
    return fail(Errc::invalid_argument, fmt::format("model input: expected a batch [n, {}] with n >= 1, got {}",
                                                    sample_shape_.to_string().substr(1), x.shape.to_string()));
  }
  TEPDIST_CHECK(x.data != nullptr);
  const int64_t n = x.shape[0];
  forwarded_ = true;
  input_ = x;
  last_plan_ = plan_for(backend, n);
  if (last_plan_) return last_plan_->forward(x, params_);
  PassContext ctx{backend, training, rng_};
  ConstTensorView in = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    activations_[i].resize(layers_[i].output.with_batch(n));
    layers_[i].layer->forward(ctx, in, activations_[i]);
    in = activations_[i];
  }
  return in;
}

void Model::backward(Backend& backend, ConstTensorView dlogits, const GradientsReady& ready) {
  TEPDIST_CHECK(built_ && forwarded_);
  if (last_plan_) {
    last_plan_->backward(dlogits, params_, grads_, ready);
    return;
  }
  TEPDIST_CHECK(dlogits.shape == activations_.back().shape());
  PassContext ctx{backend, true, rng_};
  ConstTensorView dy = dlogits;
  Tensor* dx_buffer = &grad_ping_;
  for (size_t i = layers_.size(); i-- > 0;) {
    const ConstTensorView x = i == 0 ? input_ : ConstTensorView(activations_[i - 1]);
    TensorView dx{};  // the first layer's input gradient is never needed
    if (i > 0) {
      dx_buffer->resize(x.shape);
      dx = *dx_buffer;
    }
    layers_[i].layer->backward(ctx, x, activations_[i], dy, dx);
    if (ready && layers_[i].params_end > layers_[i].params_begin)
      ready(static_cast<size_t>(layers_[i].params_begin), static_cast<size_t>(layers_[i].params_end));
    dy = dx;
    dx_buffer = dx_buffer == &grad_ping_ ? &grad_pong_ : &grad_ping_;
  }
}

std::string Model::summary() const {
  std::string s;
  for (const auto& e : layers_)
    s += fmt::format("  {:<10} {:<40} -> {}\n", e.name, e.layer->describe(), e.output.sample().to_string());
  s += fmt::format("  {} parameters\n", params_.size());
  return s;
}

}  // namespace tepdist::compute

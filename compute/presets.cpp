#include "compute/presets.hpp"

#include <fmt/format.h>

#include <cmath>
#include <optional>

namespace tepdist::compute {

std::unique_ptr<Model> make_lenet() {
  auto m = std::make_unique<Model>();
  m->add<Conv2d>(1, 20, 5);
  m->add<MaxPool2d>(2);
  m->add<Relu>();
  m->add<Conv2d>(20, 50, 5);
  m->add<MaxPool2d>(2);
  m->add<Relu>();
  m->add<Flatten>();
  m->add<Linear>(800, 500);
  m->add<Relu>();
  m->add<Linear>(500, 10);
  return m;
}

std::unique_ptr<Model> make_widecnn() {
  auto m = std::make_unique<Model>();
  m->add<Conv2d>(1, 64, 3, 1, 1);
  m->add<MaxPool2d>(2);
  m->add<Relu>();
  m->add<Conv2d>(64, 128, 3, 1, 1);
  m->add<MaxPool2d>(2);
  m->add<Relu>();
  m->add<Flatten>();
  m->add<Linear>(6272, 512);
  m->add<Relu>();
  m->add<Linear>(512, 10);
  return m;
}

std::unique_ptr<Model> make_mlp(int64_t hidden, int64_t classes) {
  auto m = std::make_unique<Model>();
  m->add<Flatten>();
  m->add<Linear>(0, hidden);
  m->add<Relu>();
  m->add<Linear>(hidden, classes);
  return m;
}

Result<std::unique_ptr<Model>> make_preset(const std::string& name) {
  if (name == "lenet") return make_lenet();
  if (name == "mlp") return make_mlp();
  if (name == "widecnn") return make_widecnn();
  return fail(Errc::invalid_argument, fmt::format("unknown model preset '{}' (known: lenet, widecnn, mlp)", name));
}

namespace {

/// Reads a spec's arguments, remembering which were used so leftovers can be reported.
class Args {
 public:
  explicit Args(const LayerSpec& spec) : spec_(spec), used_(spec.args.size(), false) {}

  /// A positive integer argument; fallback when absent (nullopt: required).
  Result<int64_t> size(const std::string& key, std::optional<int64_t> fallback) {
    auto v = find(key);
    if (!v) {
      if (fallback) return *fallback;
      return fail(Errc::invalid_argument, fmt::format("{}: missing '{}'", spec_.type, key));
    }
    if (*v < 0 || std::floor(*v) != *v || *v > 1e9)
      return fail(Errc::invalid_argument,
                  fmt::format("{}: '{}' must be a non-negative whole number, got {}", spec_.type, key, *v));
    return static_cast<int64_t>(*v);
  }

  Result<double> number(const std::string& key) {
    auto v = find(key);
    if (!v) return fail(Errc::invalid_argument, fmt::format("{}: missing '{}'", spec_.type, key));
    return *v;
  }

  Result<void> no_leftovers() const {
    for (size_t i = 0; i < used_.size(); ++i)
      if (!used_[i])
        return fail(Errc::invalid_argument,
                    fmt::format("{}: unknown argument '{}'", spec_.type, spec_.args[i].first));
    return {};
  }

 private:
  std::optional<double> find(const std::string& key) {
    for (size_t i = 0; i < spec_.args.size(); ++i)
      if (spec_.args[i].first == key) {
        used_[i] = true;
        return spec_.args[i].second;
      }
    return std::nullopt;
  }
  const LayerSpec& spec_;
  std::vector<bool> used_;
};

Result<std::unique_ptr<Layer>> build_layer(const LayerSpec& spec, Args& a) {
  if (spec.type == "conv2d") {
    auto out = a.size("out_channels", std::nullopt);
    auto kernel = a.size("kernel", std::nullopt);
    auto stride = a.size("stride", 1);
    auto padding = a.size("padding", 0);
    auto in = a.size("in_channels", 0);
    for (auto* r : {&out, &kernel, &stride, &padding, &in})
      if (!*r) return std::unexpected(r->error());
    return std::make_unique<Conv2d>(*in, *out, *kernel, *stride, *padding);
  }
  if (spec.type == "max_pool2d") {
    auto kernel = a.size("kernel", std::nullopt);
    if (!kernel) return std::unexpected(kernel.error());
    auto stride = a.size("stride", *kernel);
    if (!stride) return std::unexpected(stride.error());
    return std::make_unique<MaxPool2d>(*kernel, *stride);
  }
  if (spec.type == "linear") {
    auto out = a.size("out_features", std::nullopt);
    auto in = a.size("in_features", 0);
    if (!out) return std::unexpected(out.error());
    if (!in) return std::unexpected(in.error());
    return std::make_unique<Linear>(*in, *out);
  }
  if (spec.type == "dropout") {
    auto p = a.number("p");
    if (!p) return std::unexpected(p.error());
    return std::make_unique<Dropout>(static_cast<float>(*p));
  }
  if (spec.type == "relu") return std::make_unique<Relu>();
  if (spec.type == "flatten") return std::make_unique<Flatten>();
  return fail(Errc::invalid_argument,
              fmt::format("unknown layer type '{}' (known: conv2d, max_pool2d, relu, flatten, linear, dropout)",
                          spec.type));
}

}  // namespace

Result<std::unique_ptr<Layer>> make_layer(const LayerSpec& spec) {
  Args args(spec);
  auto layer = build_layer(spec, args);
  if (!layer) return layer;
  if (auto ok = args.no_leftovers(); !ok) return std::unexpected(ok.error());
  return layer;
}

Result<std::unique_ptr<Model>> make_model(const std::vector<LayerSpec>& layers) {
  if (layers.empty()) return fail(Errc::invalid_argument, "a model needs at least one layer");
  auto m = std::make_unique<Model>();
  for (size_t i = 0; i < layers.size(); ++i) {
    auto layer = make_layer(layers[i]);
    if (!layer)
      return fail(Errc::invalid_argument, fmt::format("layer {}: {}", i + 1, layer.error().message));
    m->add(std::move(*layer), layers[i].name);
  }
  return m;
}

}  // namespace tepdist::compute

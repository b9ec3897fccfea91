#include "compute/optimizer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include "base/check.hpp"

namespace tepdist::compute {
namespace {

// The update loops run once per step over every parameter (431,080 for LeNet). Built for plain
// x86-64 (SSE2), they would use a quarter of an AVX2 core's width; target_clones compiles them
// twice and picks the AVX2 copy at load time where the CPU has it.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TEPDIST_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TEPDIST_VECTOR_CLONES
#endif

// Below this many parameters one thread is faster than waking a team (and an async shard host
// updating its small shards must not leave a team spinning). Each element is updated on its own,
// so the results do not depend on the thread count.
constexpr size_t parallel_min = size_t{1} << 18;

TEPDIST_VECTOR_CLONES
void sgd_update(float* p, const float* grad, float* buf, size_t n, float lr, float wd, float mu, bool nesterov) {
  if (mu == 0.0f) {
#pragma omp parallel for simd schedule(static) if (n >= parallel_min)
    for (size_t i = 0; i < n; ++i) p[i] -= lr * (grad[i] + wd * p[i]);
  } else if (!nesterov) {
#pragma omp parallel for simd schedule(static) if (n >= parallel_min)
    for (size_t i = 0; i < n; ++i) {
      buf[i] = mu * buf[i] + grad[i] + wd * p[i];
      p[i] -= lr * buf[i];
    }
  } else {
#pragma omp parallel for simd schedule(static) if (n >= parallel_min)
    for (size_t i = 0; i < n; ++i) {
      const float g = grad[i] + wd * p[i];
      buf[i] = mu * buf[i] + g;
      p[i] -= lr * (g + mu * buf[i]);
    }
  }
}

TEPDIST_VECTOR_CLONES
void adam_update(float* p, const float* grad, float* m, float* v, size_t n, float lr, float b1, float b2, float eps,
                 float c1, float c2, float wd, bool decoupled) {
  const float decay = decoupled ? 1.0f - lr * wd : 1.0f;
  const float l2 = decoupled ? 0.0f : wd;
  const float inv_c1 = 1.0f / c1, inv_c2 = 1.0f / c2;
#pragma omp parallel for simd schedule(static) if (n >= parallel_min)
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i] + l2 * p[i];
    m[i] = b1 * m[i] + (1.0f - b1) * g;
    v[i] = b2 * v[i] + (1.0f - b2) * g * g;
    p[i] = p[i] * decay - lr * (m[i] * inv_c1) / (std::sqrt(v[i] * inv_c2) + eps);
  }
}

/// SGD with momentum and optional Nesterov look-ahead:
///   g = grad + weight_decay * p;  buf = momentum * buf + g;
///   p -= lr * (nesterov ? g + momentum * buf : buf)
class Sgd final : public Optimizer {
 public:
  Sgd(const OptimizerOptions& o, size_t n) : o_(o), momentum_(o.momentum > 0 ? n : 0, 0.0f) {}
  std::string_view name() const override { return "sgd"; }

  void step(std::span<float> p, std::span<const float> grad, float lr) override {
    TEPDIST_CHECK(p.size() == grad.size());
    sgd_update(p.data(), grad.data(), momentum_.data(), p.size(), lr, o_.weight_decay, o_.momentum, o_.nesterov);
    ++steps_;
  }

  std::vector<std::pair<std::string, std::span<float>>> state() override {
    if (momentum_.empty()) return {};
    return {{"momentum", momentum_}};
  }

 private:
  OptimizerOptions o_;
  std::vector<float> momentum_;
};

/// Adam (decoupled = false: L2 in the gradient) and AdamW (decoupled = true: p *= 1 - lr * wd):
///   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
///   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
class Adam final : public Optimizer {
 public:
  Adam(const OptimizerOptions& o, size_t n, bool decoupled)
      : o_(o), decoupled_(decoupled), m_(n, 0.0f), v_(n, 0.0f) {}
  std::string_view name() const override { return decoupled_ ? "adamw" : "adam"; }

  void step(std::span<float> p, std::span<const float> grad, float lr) override {
    TEPDIST_CHECK(p.size() == grad.size());
    ++steps_;
    const float c1 = 1.0f - std::pow(o_.beta1, static_cast<float>(steps_));
    const float c2 = 1.0f - std::pow(o_.beta2, static_cast<float>(steps_));
    adam_update(p.data(), grad.data(), m_.data(), v_.data(), p.size(), lr, o_.beta1, o_.beta2, o_.eps, c1, c2,
                o_.weight_decay, decoupled_);
  }

  std::vector<std::pair<std::string, std::span<float>>> state() override { return {{"m", m_}, {"v", v_}}; }

 private:
  OptimizerOptions o_;
  bool decoupled_;
  std::vector<float> m_, v_;
};

Result<void> check(bool ok, std::string_view what) {
  if (ok) return {};
  return fail(Errc::invalid_argument, std::string(what));
}

}  // namespace

Result<std::unique_ptr<Optimizer>> make_optimizer(const OptimizerOptions& o, size_t n) {
  for (auto r : {check(o.weight_decay >= 0, "optimizer: weight_decay must not be negative"),
                 check(o.momentum >= 0 && o.momentum < 1, "optimizer: momentum must be in [0, 1)"),
                 check(!o.nesterov || o.momentum > 0, "optimizer: nesterov needs momentum > 0"),
                 check(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1,
                       "optimizer: beta1 and beta2 must be in [0, 1)"),
                 check(o.eps > 0, "optimizer: eps must be positive")})
    if (!r) return std::unexpected(r.error());
  if (o.name == "sgd") return std::make_unique<Sgd>(o, n);
  if (o.name == "adam") return std::make_unique<Adam>(o, n, false);
  if (o.name == "adamw") return std::make_unique<Adam>(o, n, true);
  return fail(Errc::invalid_argument, fmt::format("unknown optimizer '{}' (known: sgd, adam, adamw)", o.name));
}

bool same_layout(Optimizer& a, Optimizer& b) {
  const auto x = a.state(), y = b.state();
  return std::equal(x.begin(), x.end(), y.begin(), y.end(),
                    [](const auto& p, const auto& q) { return p.first == q.first && p.second.size() == q.second.size(); });
}

bool carry_state(Optimizer& from, Optimizer& to) {
  if (!same_layout(from, to)) return false;
  const auto before = from.state(), after = to.state();
  for (size_t k = 0; k < before.size(); ++k) std::copy(before[k].second.begin(), before[k].second.end(), after[k].second.begin());
  to.set_steps(from.steps());
  return true;
}

Result<LrSchedule> LrSchedule::make(const ScheduleOptions& o) {
  for (auto r : {check(o.base_lr > 0, "optimizer: lr must be positive"),
                 check(o.warmup_steps >= 0, "optimizer: warmup_steps must not be negative"),
                 check(o.kind != "step" || (o.step_size > 0 && o.gamma > 0),
                       "optimizer: the step schedule needs step_size > 0 and gamma > 0"),
                 check(o.kind != "cosine" || o.total_steps > o.warmup_steps,
                       "optimizer: the cosine schedule needs total steps beyond the warm-up"),
                 check(o.min_lr >= 0 && o.min_lr <= o.base_lr, "optimizer: min_lr must be in [0, lr]")})
    if (!r) return std::unexpected(r.error());
  if (o.kind != "constant" && o.kind != "step" && o.kind != "cosine")
    return fail(Errc::invalid_argument,
                fmt::format("unknown schedule '{}' (known: constant, step, cosine)", o.kind));
  return LrSchedule(o);
}

float LrSchedule::at(int64_t step) const {
  if (step < o_.warmup_steps) return o_.base_lr * static_cast<float>(step + 1) / static_cast<float>(o_.warmup_steps);
  const int64_t t = step - o_.warmup_steps;
  if (o_.kind == "step") return o_.base_lr * std::pow(o_.gamma, static_cast<float>(t / o_.step_size));
  if (o_.kind == "cosine") {
    const double span = static_cast<double>(o_.total_steps - o_.warmup_steps);
    const double progress = std::min(1.0, static_cast<double>(t) / span);
    const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
    return o_.min_lr + static_cast<float>((o_.base_lr - o_.min_lr) * cosine);
  }
  return o_.base_lr;
}

}  // namespace tepdist::compute

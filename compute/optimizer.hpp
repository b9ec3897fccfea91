#pragma once
// Optimisers over the model's flat parameter buffer, and learning-rate schedules. Semantics follow
// PyTorch's (torch.optim.SGD, Adam, AdamW) so runs compare one to one with the baseline.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "compute/error.hpp"

namespace tepdist::compute {

struct OptimizerOptions {
  std::string name = "sgd";   ///< "sgd", "adam" or "adamw"
  float momentum = 0.9f;      ///< sgd
  bool nesterov = false;      ///< sgd; needs momentum > 0
  float weight_decay = 0.0f;  ///< sgd/adam: L2 added to the gradient; adamw: decoupled decay
  float beta1 = 0.9f;         ///< adam(w)
  float beta2 = 0.999f;       ///< adam(w)
  float eps = 1e-8f;          ///< adam(w)
  friend bool operator==(const OptimizerOptions&, const OptimizerOptions&) = default;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string_view name() const = 0;
  /// Updates params in place from grads (same length as at construction) with learning rate lr.
  virtual void step(std::span<float> params, std::span<const float> grads, float lr) = 0;
  /// The optimiser's state buffers by name (for checkpoints); each as long as the parameters.
  virtual std::vector<std::pair<std::string, std::span<float>>> state() = 0;
  /// Updates applied so far (Adam's bias correction depends on it).
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }

 protected:
  int64_t steps_ = 0;
};

/// An optimiser for parameter_count parameters; bad options are errors naming the option.
Result<std::unique_ptr<Optimizer>> make_optimizer(const OptimizerOptions& options, size_t parameter_count);

/// Whether two optimisers keep the same state: the same buffers (names and sizes), so one's
/// state means the same to the other (SGD at another momentum; Adam and AdamW).
bool same_layout(Optimizer& a, Optimizer& b);

/// A change of optimiser: `to` takes `from`'s buffers and step count when their layouts are the
/// same (the momentum, Adam's moments and bias correction carry on), else starts afresh. Returns
/// whether it took them.
bool carry_state(Optimizer& from, Optimizer& to);

struct ScheduleOptions {
  std::string kind = "constant";  ///< "constant", "step" or "cosine"
  float base_lr = 0.01f;
  int64_t warmup_steps = 0;       ///< linear ramp from base_lr/warmup_steps up to base_lr
  int64_t step_size = 1000;       ///< step: multiply by gamma every step_size steps
  float gamma = 0.1f;             ///< step
  int64_t total_steps = 0;        ///< cosine: steps over which to decay to min_lr
  float min_lr = 0.0f;            ///< cosine
  friend bool operator==(const ScheduleOptions&, const ScheduleOptions&) = default;
};

/// The learning rate as a function of the number of updates applied so far.
class LrSchedule {
 public:
  static Result<LrSchedule> make(const ScheduleOptions& options);
  float at(int64_t step) const;

 private:
  explicit LrSchedule(const ScheduleOptions& options) : o_(options) {}
  ScheduleOptions o_;
};

}  // namespace tepdist::compute

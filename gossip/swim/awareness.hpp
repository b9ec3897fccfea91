#pragma once
// Lifeguard's local health awareness: a score in [0, max - 1] that rises when this node misses
// acks or learns it is suspected, and falls when probes succeed. Timeouts are multiplied by
// score + 1, so a node starved of CPU (by training, say) slows its own verdicts rather than
// declaring healthy peers dead.

#include <algorithm>

namespace tepdist::gossip::swim {

class Awareness {
 public:
  explicit Awareness(int max_multiplier) : max_(std::max(1, max_multiplier)) {}
  void apply(int delta) { score_ = std::clamp(score_ + delta, 0, max_ - 1); }
  int score() const { return score_; }
  double scale(double timeout_ms) const { return timeout_ms * (score_ + 1); }

 private:
  int max_;
  int score_ = 0;
};

}  // namespace tepdist::gossip::swim

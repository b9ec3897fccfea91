#pragma once
// Lifeguard's suspicion timer: a suspect is declared dead after a timeout that starts at max_ms
// and shrinks towards min_ms as independent members confirm the suspicion:
//   timeout = max(min, max - (max - min) * log(c + 1) / log(k + 1))
// for c confirmations of the k expected. Confirmations from one member count once.

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

namespace tepdist::gossip::swim {

class Suspicion {
 public:
  Suspicion(double start_ms, double min_ms, double max_ms, int expected_confirmations, const std::string& first_accuser)
      : start_(start_ms), min_(min_ms), max_(max_ms), k_(std::max(1, expected_confirmations)) {
    accusers_.insert(first_accuser);
  }

  /// Counts an accusation; returns whether it was a new, independent one.
  bool confirm(const std::string& accuser) {
    if (static_cast<int>(accusers_.size()) > k_ || !accusers_.insert(accuser).second) return false;
    return true;
  }

  double deadline_ms() const {
    const double c = static_cast<double>(accusers_.size() - 1);  // the first accuser starts it
    const double frac = std::log(c + 1.0) / std::log(static_cast<double>(k_) + 1.0);
    return std::max(not_before_, start_ + std::max(min_, max_ - (max_ - min_) * frac));
  }

  /// Holds the verdict until at least until_ms: this node was not running when it came due, so a
  /// refutation may be waiting, unread, in its queue.
  void defer(double until_ms) { not_before_ = std::max(not_before_, until_ms); }

 private:
  double start_, min_, max_;
  double not_before_ = 0;
  int k_;
  std::set<std::string> accusers_;
};

}  // namespace tepdist::gossip::swim

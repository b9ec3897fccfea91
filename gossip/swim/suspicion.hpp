#pragma once
// Lifeguard's suspicion timer: a suspect is declared dead after a timeout that starts at max_ms
// and shrinks towards min_ms as independent members confirm the suspicion:
//   timeout = max(min, max - (max - min) * log(c + 1) / log(k + 1))
// for c confirmations of the k expected. Confirmations from one member count once. The verdict
// may also be held later (defer: this node was not running when it came due), and Swim gives a
// suspect a last call before a verdict on hearsay; both are marked here.

#include <algorithm>
#include <cmath>
#include <limits>
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

  double deadline_ms() const { return std::max(not_before_, natural_deadline_ms()); }

  /// Whether the suspect should be told of its suspicion now, given that it was last told at most
  /// every gap_ms; marks it told if so. (Lifeguard's buddy system, bounded per suspect.)
  bool tell(double now_ms, double gap_ms) {
    if (now_ms < told_ms_ + gap_ms) return false;
    told_ms_ = now_ms;
    return true;
  }

  /// Whether the suspect was last told before `ms` (or never).
  bool told_before(double ms) const { return told_ms_ < ms; }
  /// Whether the suspect had its last word before the verdict; marks it so.
  bool last_call() const { return last_call_; }
  void mark_last_call() { last_call_ = true; }

  /// Whether `id` is among the members whose accusations this suspicion counts.
  bool accused_by(const std::string& id) const { return accusers_.contains(id); }

  /// Whether this node has probed the suspect itself since the suspicion began (its own failed
  /// probe is evidence; a rumour is not); marks it so.
  bool probed() const { return probed_; }
  void mark_probed() { probed_ = true; }

  /// Holds the verdict until at least until_ms (this node was not running when it came due, so a
  /// refutation may be waiting, unread, in its queue), but never past the natural deadline plus the
  /// shortest course: a node that is always late still reaches its verdicts.
  void defer(double until_ms) {
    not_before_ = std::max(not_before_, std::min(until_ms, natural_deadline_ms() + min_));
  }

 private:
  double natural_deadline_ms() const {
    const double c = static_cast<double>(accusers_.size() - 1);  // the first accuser starts it
    const double frac = std::log(c + 1.0) / std::log(static_cast<double>(k_) + 1.0);
    return start_ + std::max(min_, max_ - (max_ - min_) * frac);
  }

  double start_, min_, max_;
  double not_before_ = 0;
  double told_ms_ = -std::numeric_limits<double>::infinity();
  bool probed_ = false;
  bool last_call_ = false;
  int k_;
  std::set<std::string> accusers_;
};

}  // namespace tepdist::gossip::swim

#pragma once
// The per-node metrics registry: counters, gauges and histograms with names and labels, recorded
// into from any thread (the transport's loop, actors) and rendered in the Prometheus text format.
// Looking a metric up takes a lock; recording into the handle it returns is a relaxed atomic, so
// hot paths look up once and keep the handle.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace tepdist::gossip {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void add(double d) {
    double old = value_.load(std::memory_order_relaxed);
    while (!value_.compare_exchange_weak(old, old + d, std::memory_order_relaxed)) {
    }
  }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

/// Cumulative buckets with fixed upper bounds, plus count and sum, as Prometheus expects.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  /// Observations <= bounds()[i] (the last entry: all of them).
  std::vector<uint64_t> cumulative() const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return sum_.value(); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // one per bound, plus +Inf
  std::atomic<uint64_t> count_{0};
  Gauge sum_;
};

class MetricsRegistry {
 public:
  /// The metric called name with these labels, made on first use. Handles stay valid as long as
  /// the registry. help is recorded the first time a name is seen.
  Counter& counter(const std::string& name, const Labels& labels = {}, const std::string& help = "");
  Gauge& gauge(const std::string& name, const Labels& labels = {}, const std::string& help = "");
  Histogram& histogram(const std::string& name, const Labels& labels = {}, const std::string& help = "",
                       std::vector<double> bounds = default_latency_bounds_seconds());

  /// The sum of the counters called name, over all their label sets (0: none).
  uint64_t counter_total(const std::string& name) const;
  /// The gauge called name with these labels, if it was made.
  std::optional<double> gauge_value(const std::string& name, const Labels& labels = {}) const;
  /// The sum of the gauges called name, over all their label sets (0: none).
  double gauge_total(const std::string& name) const;
  /// The sum and count of the histograms called name, over all their label sets.
  std::pair<double, uint64_t> histogram_total(const std::string& name) const;

  /// Every metric in the Prometheus text exposition format, names and label sets sorted.
  std::string render_prometheus() const;

  /// 0.1 ms to 10 s (in seconds), roughly x2.5 apart: send latencies from loopback to cross-region.
  static std::vector<double> default_latency_bounds_seconds();

  /// Labels every rendered series carries ahead of its own (a node's: node=ID), as a scrape of one
  /// node among many needs. Thread-safe; may be set after metrics were recorded.
  void set_common_labels(Labels labels);

 private:
  enum class Kind { counter, gauge, histogram };
  struct Family {
    Kind kind;
    std::string help;
    std::map<Labels, std::unique_ptr<Counter>> counters;
    std::map<Labels, std::unique_ptr<Gauge>> gauges;
    std::map<Labels, std::unique_ptr<Histogram>> histograms;
  };
  Family& family(const std::string& name, Kind kind, const std::string& help);

  mutable std::mutex mutex_;
  std::map<std::string, Family> families_;
  Labels common_;
};

}  // namespace tepdist::gossip

#include "gossip/metrics/registry.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include "base/check.hpp"

namespace tepdist::gossip {
namespace {

std::string escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string label_text(const Labels& labels, const std::string& extra = "") {
  std::string s;
  for (const auto& [k, v] : labels) s += fmt::format("{}{}=\"{}\"", s.empty() ? "" : ",", k, escape(v));
  if (!extra.empty()) s += (s.empty() ? "" : ",") + extra;
  return s.empty() ? "" : "{" + s + "}";
}

Labels sorted(Labels l) {
  std::sort(l.begin(), l.end());
  return l;
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  TEPDIST_CHECK(std::is_sorted(bounds_.begin(), bounds_.end()));
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i] = 0;
}

void Histogram::observe(double v) {
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.add(v);
}

std::vector<uint64_t> Histogram::cumulative() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) out[i] = running += buckets_[i].load(std::memory_order_relaxed);
  return out;
}

std::vector<double> MetricsRegistry::default_latency_bounds_seconds() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};
}

void MetricsRegistry::set_common_labels(Labels labels) {
  std::lock_guard lock(mutex_);
  common_ = std::move(labels);
}

MetricsRegistry::Family& MetricsRegistry::family(const std::string& name, Kind kind, const std::string& help) {
  auto [it, inserted] = families_.try_emplace(name);
  if (inserted) {
    it->second.kind = kind;
    it->second.help = help;
  } else if (it->second.kind != kind) {
    throw std::logic_error("metric " + name + " registered with two kinds");  // our bug, not input
  }
  return it->second;
}

Counter& MetricsRegistry::counter(const std::string& name, const Labels& labels, const std::string& help) {
  std::lock_guard lock(mutex_);
  auto& slot = family(name, Kind::counter, help).counters[sorted(labels)];
  if (!slot) slot = std::make_unique<Counter>();
  return *slot;
}

uint64_t MetricsRegistry::counter_total(const std::string& name) const {
  std::lock_guard lock(mutex_);
  const auto it = families_.find(name);
  if (it == families_.end()) return 0;
  uint64_t total = 0;
  for (const auto& [labels, c] : it->second.counters) total += c->value();
  return total;
}

std::optional<double> MetricsRegistry::gauge_value(const std::string& name, const Labels& labels) const {
  std::lock_guard lock(mutex_);
  const auto it = families_.find(name);
  if (it == families_.end()) return std::nullopt;
  const auto g = it->second.gauges.find(sorted(labels));
  if (g == it->second.gauges.end()) return std::nullopt;
  return g->second->value();
}

double MetricsRegistry::gauge_total(const std::string& name) const {
  std::lock_guard lock(mutex_);
  const auto it = families_.find(name);
  if (it == families_.end()) return 0;
  double total = 0;
  for (const auto& [labels, g] : it->second.gauges) total += g->value();
  return total;
}

std::pair<double, uint64_t> MetricsRegistry::histogram_total(const std::string& name) const {
  std::lock_guard lock(mutex_);
  const auto it = families_.find(name);
  if (it == families_.end()) return {0, 0};
  std::pair<double, uint64_t> total{0, 0};
  for (const auto& [labels, h] : it->second.histograms) {
    total.first += h->sum();
    total.second += h->count();
  }
  return total;
}

Gauge& MetricsRegistry::gauge(const std::string& name, const Labels& labels, const std::string& help) {
  std::lock_guard lock(mutex_);
  auto& slot = family(name, Kind::gauge, help).gauges[sorted(labels)];
  if (!slot) slot = std::make_unique<Gauge>();
  return *slot;
}

Histogram& MetricsRegistry::histogram(const std::string& name, const Labels& labels, const std::string& help,
                                      std::vector<double> bounds) {
  std::lock_guard lock(mutex_);
  auto& slot = family(name, Kind::histogram, help).histograms[sorted(labels)];
  if (!slot) slot = std::make_unique<Histogram>(std::move(bounds));
  return *slot;
}

std::string MetricsRegistry::render_prometheus() const {
  std::lock_guard lock(mutex_);
  std::string out;
  for (const auto& [name, f] : families_) {
    static constexpr const char* types[] = {"counter", "gauge", "histogram"};
    if (!f.help.empty()) out += fmt::format("# HELP {} {}\n", name, f.help);
    out += fmt::format("# TYPE {} {}\n", name, types[static_cast<int>(f.kind)]);
    // The common labels first, then the series' own (which win a clash: a series knows better).
    const auto with_common = [&](const Labels& own) {
      Labels all;
      for (const auto& c : common_)
        if (std::none_of(own.begin(), own.end(), [&](const auto& l) { return l.first == c.first; })) all.push_back(c);
      all.insert(all.end(), own.begin(), own.end());
      return all;
    };
    for (const auto& [labels, c] : f.counters)
      out += fmt::format("{}{} {}\n", name, label_text(with_common(labels)), c->value());
    for (const auto& [labels, g] : f.gauges)
      out += fmt::format("{}{} {}\n", name, label_text(with_common(labels)), g->value());
    for (const auto& [own, h] : f.histograms) {
      const auto labels = with_common(own);
      const auto cum = h->cumulative();
      for (size_t i = 0; i < h->bounds().size(); ++i)
        out += fmt::format("{}_bucket{} {}\n", name, label_text(labels, fmt::format("le=\"{}\"", h->bounds()[i])), cum[i]);
      out += fmt::format("{}_bucket{} {}\n", name, label_text(labels, "le=\"+Inf\""), cum.back());
      out += fmt::format("{}_sum{} {}\n", name, label_text(labels), h->sum());
      out += fmt::format("{}_count{} {}\n", name, label_text(labels), h->count());
    }
  }
  return out;
}

}  // namespace tepdist::gossip

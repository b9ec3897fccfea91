#include "elastic/progress.hpp"

#include <algorithm>
#include <cmath>

namespace tepdist::elastic {

std::pair<int64_t, int64_t> sync_slice(const gossip::JobProgress& p, int64_t n, int64_t batch, int64_t rank) {
  const int64_t begin = std::min(n, static_cast<int64_t>(p.position) + rank * batch);
  return {begin, std::min(n, begin + batch)};
}

std::pair<int64_t, int64_t> sync_slice(const gossip::JobProgress& p, int64_t n, std::span<const int64_t> shares,
                                       int64_t rank) {
  int64_t begin = static_cast<int64_t>(p.position);
  for (int64_t r = 0; r < rank; ++r) begin += shares[static_cast<size_t>(r)];
  begin = std::min(n, begin);
  return {begin, std::min(n, begin + shares[static_cast<size_t>(rank)])};
}

gossip::JobProgress after_sync_step(gossip::JobProgress p, int64_t n, int64_t world, int64_t batch) {
  const int64_t end = std::min(n, static_cast<int64_t>(p.position) + world * batch);
  p.samples += static_cast<uint64_t>(end - static_cast<int64_t>(p.position));
  p.position = static_cast<uint64_t>(end);
  ++p.step;
  if (end >= n) {
    ++p.epoch;
    p.position = 0;
  }
  return p;
}

bool job_finished(const gossip::JobProgress& p, int64_t epochs, int64_t max_steps) {
  return static_cast<int64_t>(p.epoch) >= epochs || (max_steps > 0 && static_cast<int64_t>(p.step) >= max_steps);
}

Spans spans_of(const std::vector<uint64_t>& triples) {
  Spans out;
  for (size_t k = 0; k + 2 < triples.size(); k += 3) out.push_back({triples[k], triples[k + 1], triples[k + 2]});
  return out;
}

std::vector<uint64_t> triples_of(const Spans& spans) {
  std::vector<uint64_t> out;
  for (const auto& s : spans) out.insert(out.end(), {s.epoch, s.begin, s.end});
  return out;
}

std::vector<Spans> initial_spans(int64_t n, int64_t epochs, int64_t workers) {
  std::vector<Spans> out(static_cast<size_t>(std::max<int64_t>(1, workers)));
  const auto w = static_cast<uint64_t>(out.size()), total = static_cast<uint64_t>(n);
  for (uint64_t e = 0; e < static_cast<uint64_t>(epochs); ++e)
    for (uint64_t r = 0; r < w; ++r) {
      const uint64_t begin = total * r / w, end = total * (r + 1) / w;
      if (end > begin) out[r].push_back({e, begin, end});
    }
  return out;
}

uint64_t span_total(const Spans& spans) {
  uint64_t n = 0;
  for (const auto& s : spans) n += s.end - s.begin;
  return n;
}

uint64_t epoch_changes(const Spans& spans) {
  uint64_t n = 0;
  for (size_t i = 1; i < spans.size(); ++i) n += spans[i].epoch != spans[i - 1].epoch;
  return n;
}

Spans rest_after(const Spans& spans, uint64_t consumed) {
  Spans out;
  for (const auto& s : spans) {
    const uint64_t size = s.end - s.begin;
    if (consumed >= size) {
      consumed -= size;
      continue;
    }
    out.push_back({s.epoch, s.begin + consumed, s.end});
    consumed = 0;
  }
  return out;
}

std::vector<Spans> resplit(const std::vector<Spans>& rests, size_t workers, std::span<const double> weights) {
  std::vector<Spans> out(std::max<size_t>(1, workers));
  // Weights that do not fit (another count, one not positive) are not used: equal shares.
  bool weighted = weights.size() == out.size();
  long double weight_total = 0;
  for (const double w : weights) {
    weighted = weighted && w > 0 && std::isfinite(w);
    weight_total += w;
  }
  std::vector<long double> cumulative(out.size() + 1, 0);
  if (weighted)
    for (size_t k = 0; k < out.size(); ++k) cumulative[k + 1] = cumulative[k] + weights[k] / weight_total;
  std::vector<Span> all;
  for (const auto& r : rests) all.insert(all.end(), r.begin(), r.end());
  std::sort(all.begin(), all.end(), [](const Span& a, const Span& b) {
    return a.epoch != b.epoch ? a.epoch < b.epoch : a.begin < b.begin;
  });
  for (size_t i = 0; i < all.size();) {
    // One epoch's rest: total, then contiguous shares.
    size_t j = i;
    uint64_t total = 0;
    for (; j < all.size() && all[j].epoch == all[i].epoch; ++j) total += all[j].end - all[j].begin;
    const auto w = static_cast<uint64_t>(out.size());
    size_t k = i;
    uint64_t offset = 0;  // into all[k]
    // Where share s begins in the epoch's rest.
    auto boundary = [&](uint64_t s) -> uint64_t {
      if (s >= w) return total;
      if (!weighted) return total * s / w;
      return std::min<uint64_t>(total, static_cast<uint64_t>(static_cast<long double>(total) * cumulative[s]));
    };
    for (uint64_t share = 0; share < w; ++share) {
      uint64_t want = boundary(share + 1) - boundary(share);
      while (want > 0 && k < j) {
        const uint64_t begin = all[k].begin + offset;
        const uint64_t take = std::min(want, all[k].end - begin);
        out[share].push_back({all[k].epoch, begin, begin + take});
        want -= take;
        offset += take;
        if (all[k].begin + offset == all[k].end) ++k, offset = 0;
      }
    }
    i = j;
  }
  return out;
}

StepSlice next_slice(const Spans& spans, uint64_t consumed, uint64_t batch) {
  StepSlice out;
  for (const auto& s : rest_after(spans, consumed)) {
    if (out.count == batch) break;
    if (out.count > 0 && s.epoch != out.epoch) break;  // a step never spans two epochs
    out.epoch = s.epoch;
    const uint64_t take = std::min(batch - out.count, s.end - s.begin);
    out.pieces.emplace_back(s.begin, s.begin + take);
    out.count += take;
  }
  return out;
}

JobPace::JobPace(const std::vector<std::vector<uint64_t>>& lists, size_t rank, int64_t n, int64_t epochs,
                 uint64_t reference, const gossip::JobProgress& resume)
    : n_(static_cast<uint64_t>(std::max<int64_t>(1, n))),
      reference_(std::max<uint64_t>(1, reference)),
      resume_samples_(resume.samples) {
  for (const auto& list : lists) left_ += span_total(spans_of(list));
  const uint64_t whole = n_ * static_cast<uint64_t>(std::max<int64_t>(0, epochs));
  done_ = whole - std::min(whole, left_);
  own_ = rank < lists.size() ? span_total(spans_of(lists[rank])) : 0;
}

gossip::JobProgress JobPace::at(uint64_t consumed) const {
  // In floating point: consumed x left overflows nothing there, and the estimate needs no more.
  const uint64_t since = own_ == 0 ? 0
                                   : static_cast<uint64_t>(static_cast<double>(std::min(consumed, own_)) /
                                                           static_cast<double>(own_) * static_cast<double>(left_));
  const uint64_t done = done_ + since;
  return {done / reference_, done / n_, done % n_, resume_samples_ + since};
}

RatePolicy::RatePolicy(compute::LrSchedule schedule, Options options) : schedule_(schedule), o_(options) {
  o_.reference_batch = std::max<int64_t>(1, o_.reference_batch);
}

void RatePolicy::set_generation(const gossip::JobProgress& resume, int64_t previous, int64_t global) {
  // From the record alone (previous and this generation's batch), so that every member, a joiner
  // too, computes the same rates: a ramp cut short by another change is not continued.
  to_scale_ = scale_for(global);
  from_scale_ = previous > 0 ? scale_for(previous) : to_scale_;
  since_ = resume;
  ramp_global_ = std::max<int64_t>(1, global);
}

RatePolicy::Options::Rule RatePolicy::rule_named(const std::string& name) {
  if (name == "sqrt") return Options::Rule::sqrt;
  if (name == "none") return Options::Rule::none;
  return Options::Rule::linear;
}

RatePolicy::Options RatePolicy::for_mode(const std::string& mode, const std::string& rule, int64_t samples_per_epoch,
                                         int64_t reference_batch, int64_t ramp_batches) {
  Options o{samples_per_epoch, reference_batch, ramp_batches, mode == "async" ? Options::Rule::none : rule_named(rule)};
  if (mode == "gossip") o.max_scale = gossip_max_scale;
  return o;
}

double RatePolicy::scale_for(int64_t global) const {
  const double ratio = static_cast<double>(std::max<int64_t>(1, global)) / static_cast<double>(o_.reference_batch);
  double scale = 1;
  switch (o_.rule) {
    case Options::Rule::linear: scale = ratio; break;
    case Options::Rule::sqrt: scale = std::sqrt(ratio); break;
    case Options::Rule::none: scale = 1; break;
  }
  return o_.max_scale > 0 ? std::min(scale, o_.max_scale) : scale;
}

int64_t RatePolicy::schedule_step(const gossip::JobProgress& p) const {
  const int64_t ref = o_.reference_batch;
  const int64_t per_epoch = (o_.samples_per_epoch + ref - 1) / ref;
  return static_cast<int64_t>(p.epoch) * per_epoch + static_cast<int64_t>(p.position) / ref;
}

std::optional<double> PlateauPolicy::on_evaluation(double loss, double current) {
  if (o_.patience <= 0 || !std::isfinite(loss)) return std::nullopt;
  if (loss < best_ * (1 - o_.threshold)) {
    best_ = loss;
    bad_ = 0;
    return std::nullopt;
  }
  if (++bad_ < o_.patience) return std::nullopt;
  bad_ = 0;
  return (current > 0 ? current : 1.0) * o_.factor;
}

float RatePolicy::at(const gossip::JobProgress& p) const {
  double scale = to_scale_;
  if (from_scale_ != to_scale_ && o_.ramp_batches > 0) {
    const double span = static_cast<double>(o_.ramp_batches * ramp_global_);
    const double done = std::clamp(static_cast<double>(p.samples - std::min(p.samples, since_.samples)) / span, 0.0, 1.0);
    scale = from_scale_ + (to_scale_ - from_scale_) * done;
  }
  scale *= factor_;
  const float base = schedule_.at(schedule_step(p));
  return scale == 1.0 ? base : static_cast<float>(base * scale);
}

}  // namespace tepdist::elastic

#include "elastic/progress.hpp"

#include <algorithm>

namespace tepdist::elastic {

std::pair<int64_t, int64_t> sync_slice(const gossip::JobProgress& p, int64_t n, int64_t world, int64_t batch,
                                       int64_t rank) {
  (void)world;
  const int64_t begin = std::min(n, static_cast<int64_t>(p.position) + rank * batch);
  return {begin, std::min(n, begin + batch)};
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

RatePolicy::RatePolicy(compute::LrSchedule schedule, Options options) : schedule_(schedule), o_(options) {
  o_.reference_batch = std::max<int64_t>(1, o_.reference_batch);
}

void RatePolicy::set_generation(const gossip::JobProgress& resume, int64_t previous, int64_t global) {
  // From the record alone (previous and this generation's batch), so that every member, a joiner
  // too, computes the same rates: a ramp cut short by another change is not continued.
  const double ref = static_cast<double>(o_.reference_batch);
  to_scale_ = static_cast<double>(global) / ref;
  from_scale_ = previous > 0 ? static_cast<double>(previous) / ref : to_scale_;
  since_ = resume;
  ramp_global_ = std::max<int64_t>(1, global);
}

int64_t RatePolicy::schedule_step(const gossip::JobProgress& p) const {
  const int64_t ref = o_.reference_batch;
  const int64_t per_epoch = (o_.samples_per_epoch + ref - 1) / ref;
  return static_cast<int64_t>(p.epoch) * per_epoch + static_cast<int64_t>(p.position) / ref;
}

float RatePolicy::at(const gossip::JobProgress& p) const {
  double scale = to_scale_;
  if (from_scale_ != to_scale_ && o_.ramp_batches > 0) {
    const double span = static_cast<double>(o_.ramp_batches * ramp_global_);
    const double done = std::clamp(static_cast<double>(p.samples - std::min(p.samples, since_.samples)) / span, 0.0, 1.0);
    scale = from_scale_ + (to_scale_ - from_scale_) * done;
  }
  const float base = schedule_.at(schedule_step(p));
  return scale == 1.0 ? base : static_cast<float>(base * scale);
}

}  // namespace tepdist::elastic

#include "elastic/async_shards.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace tepdist::elastic {
namespace {

bool all_finite(std::span<const float> values) {
  return std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); });
}

/// A snapshot of `values` as a chunk that keeps itself alive until sent.
gossip::TensorChunk snapshot(uint64_t version, uint32_t shard, std::span<const float> values) {
  auto copy = std::make_shared<const std::vector<float>>(values.begin(), values.end());
  return gossip::TensorChunk{version, shard, 0, copy->size(), std::span<const float>(*copy), copy};
}

}  // namespace

ShardRange shard_range(size_t elements, uint32_t shards, uint32_t s) {
  const size_t base = elements / shards, extra = elements % shards;
  const size_t begin = s * base + std::min<size_t>(s, extra);
  return {begin, begin + base + (s < extra ? 1 : 0)};
}

// ---- ShardServer ----

ShardServer::ShardServer(Options options, std::vector<float> values, std::unique_ptr<compute::Optimizer> optimizer)
    : o_(std::move(options)), values_(std::move(values)), optimizer_(std::move(optimizer)) {}

std::expected<void, std::string> ShardServer::check(const gossip::ShardUpdate& u) const {
  if (u.job_id != o_.job_id) return std::unexpected(fmt::format("job {}, not {}", u.job_id, o_.job_id));
  if (u.shard != o_.shard) return std::unexpected(fmt::format("shard {}, not {}", u.shard, o_.shard));
  if (u.chunk.offset != 0 || u.chunk.total != values_.size() || u.chunk.data.size() != values_.size())
    return std::unexpected(fmt::format("a gradient of {} values at offset {} (total {}); shard {} has {}",
                                       u.chunk.data.size(), u.chunk.offset, u.chunk.total, o_.shard, values_.size()));
  if (!std::isfinite(u.lr) || u.lr < 0) return std::unexpected(fmt::format("learning rate {}", u.lr));
  if (!all_finite(u.chunk.data)) return std::unexpected(std::string("a gradient with non-finite values"));
  return {};
}

void ShardServer::apply(std::span<const float> gradient, float lr) {
  optimizer_->step(values_, gradient, lr);
  ++version_;
  ++applied_;
}

std::expected<gossip::ShardState, std::string> ShardServer::on_push(const gossip::ShardUpdate& push,
                                                                     Outgoing<gossip::ShardUpdate>& to_replicas) {
  if (push.kind != gossip::ShardUpdate::Kind::push) return std::unexpected(std::string("not a push"));
  if (auto ok = check(push); !ok) return std::unexpected(ok.error());
  if (push.version > version_)
    return std::unexpected(fmt::format("computed on version {} of shard {}, which is at {}", push.version, o_.shard,
                                       version_));
  const uint64_t staleness = version_ - push.version;
  if (staleness > o_.max_staleness) {
    ++rejected_;
    auto answer = state();
    answer.rejected = true;
    answer.staleness = staleness;
    return answer;
  }
  const float lr = std::min(o_.max_lr, push.lr / static_cast<float>(1 + staleness));
  apply(push.chunk.data, lr);
  for (const auto& replica : o_.replicas)
    to_replicas.emplace_back(replica, gossip::ShardUpdate{o_.job_id, o_.shard, gossip::ShardUpdate::Kind::replicate,
                                                          version_, lr, push.chunk});
  auto answer = state();
  answer.staleness = staleness;
  return answer;
}

std::expected<void, std::string> ShardServer::on_replicate(const gossip::ShardUpdate& update) {
  if (update.kind != gossip::ShardUpdate::Kind::replicate) return std::unexpected(std::string("not a replication"));
  if (auto ok = check(update); !ok) return std::unexpected(ok.error());
  if (update.version <= version_ || held_.contains(update.version))
    return std::unexpected(fmt::format("version {} of shard {} again (this replica is at {})", update.version, o_.shard,
                                       version_));
  if (update.version > version_ + 1) {
    if (held_.size() >= max_held_updates)
      return std::unexpected(fmt::format("version {} of shard {} is {} ahead of this replica; {} already wait",
                                         update.version, o_.shard, update.version - version_, held_.size()));
    held_.emplace(update.version, update);
    return {};
  }
  apply(update.chunk.data, update.lr);
  for (auto it = held_.begin(); it != held_.end() && it->first == version_ + 1; it = held_.erase(it))
    apply(it->second.chunk.data, it->second.lr);
  return {};
}

gossip::ShardState ShardServer::state() const {
  return gossip::ShardState{o_.job_id, o_.shard, version_, false, 0, snapshot(version_, o_.shard, values_)};
}

// ---- AsyncWorker ----

AsyncWorker::AsyncWorker(Options options) : o_(std::move(options)) {
  recent_staleness_ = std::max(1u, o_.workers) - 1.0;  // each of the others pushing once, until measured
  shards_.resize(o_.shards);
  for (uint32_t s = 0; s < o_.shards; ++s) {
    shards_[s].range = shard_range(o_.elements, o_.shards, s);
    shards_[s].pending.assign(shards_[s].range.size(), 0.0f);
  }
}

bool AsyncWorker::may_step() const {
  return std::none_of(shards_.begin(), shards_.end(), [&](const Shard& s) {
    return !s.in_flight.empty() && s.unanswered_steps >= o_.max_lag_steps;
  });
}

std::optional<AsyncWorker::Work> AsyncWorker::take_redo() {
  if (redo_.empty()) return std::nullopt;
  const Work w = redo_.front();
  redo_.pop_front();
  return w;
}

void AsyncWorker::on_gradient(const Work& work, std::span<const float> gradient, float lr,
                              Outgoing<gossip::ShardUpdate>& out) {
  for (uint32_t s = 0; s < o_.shards; ++s) {
    auto& sh = shards_[s];
    if (!sh.in_flight.empty()) ++sh.unanswered_steps;
    if (work.only_shard >= 0 && static_cast<uint32_t>(work.only_shard) != s) continue;
    const auto g = gradient.subspan(sh.range.begin, sh.range.size());
    if (sh.pending_batches.empty()) {
      sh.pending_base = sh.version;
      std::copy(g.begin(), g.end(), sh.pending.begin());
    } else {
      for (size_t i = 0; i < g.size(); ++i) sh.pending[i] += g[i];
    }
    sh.pending_batches.push_back(work.batch);
    sh.pending_lr = lr;
    try_push(s, out);
  }
}

void AsyncWorker::on_update(std::span<const float> change, float outer_lr, Outgoing<gossip::ShardUpdate>& out) {
  const uint64_t step = local_step_++;
  for (uint32_t s = 0; s < o_.shards; ++s) {
    auto& sh = shards_[s];
    if (!sh.in_flight.empty()) ++sh.unanswered_steps;
    const auto c = change.subspan(sh.range.begin, sh.range.size());
    if (sh.pending_batches.empty()) {
      sh.pending_base = sh.version;
      std::transform(c.begin(), c.end(), sh.pending.begin(), [](float v) { return -v; });
    } else {
      for (size_t i = 0; i < c.size(); ++i) sh.pending[i] -= c[i];
    }
    sh.pending_batches.push_back(step);
    sh.pending_lr = outer_lr;
    try_push(s, out);
  }
}

void AsyncWorker::flush(Outgoing<gossip::ShardUpdate>& out) {
  flushing_ = true;
  for (uint32_t s = 0; s < o_.shards; ++s) try_push(s, out);
}

void AsyncWorker::try_push(uint32_t s, Outgoing<gossip::ShardUpdate>& out) {
  auto& sh = shards_[s];
  if (sh.pending_batches.empty() || sh.in_flight.size() >= o_.window) return;
  if (updates() && sh.pending_batches.size() < o_.local_steps && !flushing_) return;
  const float lr = updates() && sh.pending_lr <= 0
                       ? static_cast<float>((1 + recent_staleness_) / std::max(1u, o_.workers))
                       : sh.pending_lr;
  auto carried = std::make_shared<const std::vector<float>>(sh.pending);
  if (updates()) sh.in_flight_sums.push_back(carried);  // kept until answered: the buffer the message sends
  gossip::TensorChunk chunk{sh.pending_base, s, 0, carried->size(), std::span<const float>(*carried), carried};
  out.emplace_back(o_.primaries[s], gossip::ShardUpdate{o_.job_id, s, gossip::ShardUpdate::Kind::push, sh.pending_base,
                                                        lr, std::move(chunk)});
  sh.in_flight.push_back(std::move(sh.pending_batches));
  sh.pending_batches.clear();
  ++pushes_;
}

std::expected<void, std::string> AsyncWorker::on_state(const gossip::ShardState& st, std::span<float> params,
                                                       Outgoing<gossip::ShardUpdate>& out) {
  if (st.job_id != o_.job_id) return std::unexpected(fmt::format("job {}, not {}", st.job_id, o_.job_id));
  if (st.shard >= o_.shards) return std::unexpected(fmt::format("shard {} of {}", st.shard, o_.shards));
  auto& sh = shards_[st.shard];
  if (sh.in_flight.empty()) return std::unexpected(fmt::format("an answer from shard {} with no push in flight", st.shard));
  if (st.chunk.offset != 0 || st.chunk.total != sh.range.size() || st.chunk.data.size() != sh.range.size())
    return std::unexpected(fmt::format("{} values for shard {}, which has {}", st.chunk.data.size(), st.shard,
                                       sh.range.size()));
  if (st.version < sh.version)
    return std::unexpected(fmt::format("version {} of shard {}, older than the {} held", st.version, st.shard, sh.version));
  if (!all_finite(st.chunk.data)) return std::unexpected(std::string("values that are not finite"));
  std::copy(st.chunk.data.begin(), st.chunk.data.end(), params.begin() + static_cast<ptrdiff_t>(sh.range.begin));
  sh.version = st.version;
  const auto batches = std::move(sh.in_flight.front());
  sh.in_flight.pop_front();
  sh.unanswered_steps = 0;
  if (!st.rejected) recent_staleness_ = 0.9 * recent_staleness_ + 0.1 * static_cast<double>(st.staleness);
  if (updates()) {
    const auto answered = std::move(sh.in_flight_sums.front());
    sh.in_flight_sums.pop_front();
    if (st.rejected) {
      // Not applied: it goes out again with what is pending, rebased on these values (the
      // worker's copy is rebuilt on them below), so it is not refused again for the same age.
      ++rejected_;
      if (sh.pending_batches.empty()) {
        sh.pending = *answered;
      } else {
        for (size_t i = 0; i < answered->size(); ++i) sh.pending[i] += (*answered)[i];
      }
      sh.pending_batches.insert(sh.pending_batches.end(), batches.begin(), batches.end());
      sh.pending_base = st.version;
    }
    // The primary's values, plus this worker's change it has not applied: pushes still in flight,
    // and what waits to be pushed (each held as minus the change).
    const auto mine = params.subspan(sh.range.begin, sh.range.size());
    for (const auto& sum : sh.in_flight_sums)
      for (size_t i = 0; i < sum->size(); ++i) mine[i] -= (*sum)[i];
    if (!sh.pending_batches.empty())
      for (size_t i = 0; i < sh.pending.size(); ++i) mine[i] -= sh.pending[i];
    try_push(st.shard, out);
    return {};
  }
  if (st.rejected) {
    ++rejected_;
    for (auto b : batches) redo_.push_back(Work{b, static_cast<int64_t>(st.shard)});
  }
  try_push(st.shard, out);
  return {};
}

bool AsyncWorker::idle() const {
  return redo_.empty() && std::all_of(shards_.begin(), shards_.end(), [](const Shard& s) {
           return s.in_flight.empty() && s.pending_batches.empty();
         });
}

}  // namespace tepdist::elastic

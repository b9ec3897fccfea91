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
gossip::TensorChunk snapshot_chunk(uint64_t version, uint32_t shard, std::span<const float> values) {
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
    : o_(std::move(options)), values_(std::move(values)), optimizer_(std::move(optimizer)) {
  // The first holders all start from the job's initial values: each replica holds version 0.
  for (const auto& r : o_.replicas) replicas_[r] = {0, true, 0};
}

std::expected<ShardServer, std::string> ShardServer::restore(Options options, ShardSnapshot snapshot,
                                                             std::unique_ptr<compute::Optimizer> optimizer) {
  auto buffers = optimizer->state();
  if (buffers.size() != snapshot.optimizer.size())
    return std::unexpected(fmt::format("a snapshot of shard {} with {} optimiser buffers; this optimiser ({}) keeps {}",
                                       options.shard, snapshot.optimizer.size(), optimizer->name(), buffers.size()));
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].second.size() != snapshot.optimizer[i].size())
      return std::unexpected(fmt::format("a snapshot of shard {} whose optimiser buffer {} has {} values, not {}",
                                         options.shard, buffers[i].first, snapshot.optimizer[i].size(),
                                         buffers[i].second.size()));
    std::copy(snapshot.optimizer[i].begin(), snapshot.optimizer[i].end(), buffers[i].second.begin());
  }
  optimizer->set_steps(snapshot.optimizer_steps);
  ShardServer server(std::move(options), std::move(snapshot.values), std::move(optimizer));
  server.version_ = snapshot.version;
  // A primary's new replicas hold nothing until they have fetched the snapshot and acked it:
  // until then nothing is durable that was not before. The source holds it already, and says
  // nothing: were it waited for, an update sent again to this primary after every worker's last
  // one (a generation at the job's end) would never be durable.
  server.durable_ = snapshot.version;
  for (auto& [address, r] : server.replicas_) {
    const bool source = address == server.o_.source_replica;
    r = {source ? snapshot.version : 0, source, source ? snapshot.version : 0};
    if (!source) server.durable_ = 0;
  }
  server.marks_ = std::move(snapshot.marks);
  return server;
}

std::expected<void, std::string> ShardServer::check(const gossip::ShardUpdate& u) const {
  if (u.job_id != o_.job_id) return std::unexpected(fmt::format("job {}, not {}", u.job_id, o_.job_id));
  if (u.shard != o_.shard) return std::unexpected(fmt::format("shard {}, not {}", u.shard, o_.shard));
  if (u.chunk.offset != 0 || u.chunk.total != values_.size() || u.chunk.data.size() != values_.size())
    return std::unexpected(fmt::format("a gradient of {} values at offset {} (total {}); shard {} has {}",
                                       u.chunk.data.size(), u.chunk.offset, u.chunk.total, o_.shard, values_.size()));
  if (!std::isfinite(u.lr) || u.lr < 0) return std::unexpected(fmt::format("learning rate {}", u.lr));
  if (!all_finite(u.chunk.data)) return std::unexpected(std::string("a gradient with non-finite values"));
  if (u.origin.empty() || u.seq == 0)
    return std::unexpected(std::string("an update without its worker and sequence number"));
  return {};
}

void ShardServer::apply(const gossip::ShardUpdate& u, float lr) {
  optimizer_->step(values_, u.chunk.data, lr);
  ++version_;
  ++applied_;
  marks_[u.origin] = UpdateMark{u.boot, u.seq};
}

uint64_t state_digest(const ShardSnapshot& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto bytes = [&h](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 0x100000001b3ull;
  };
  bytes(&s.version, sizeof s.version);
  bytes(s.values.data(), s.values.size() * sizeof(float));
  for (const auto& b : s.optimizer) bytes(b.data(), b.size() * sizeof(float));
  bytes(&s.optimizer_steps, sizeof s.optimizer_steps);
  for (const auto& [worker, mark] : s.marks) {
    bytes(worker.data(), worker.size());
    bytes(&mark.boot, sizeof mark.boot);
    bytes(&mark.seq, sizeof mark.seq);
  }
  return h ? h : 1;
}

std::expected<gossip::ShardState, std::string> ShardServer::on_push(const gossip::ShardUpdate& push,
                                                                     const std::string& reply_to,
                                                                     Outgoing<gossip::ShardUpdate>& to_replicas) {
  if (push.kind != gossip::ShardUpdate::Kind::push) return std::unexpected(std::string("not a push"));
  if (auto ok = check(push); !ok) return std::unexpected(ok.error());
  // A resend was computed on the old primary's values, which may be ahead of what this holder
  // took over: its base counts as now.
  if (push.version > version_ && !push.resend)
    return std::unexpected(fmt::format("computed on version {} of shard {}, which is at {}", push.version, o_.shard,
                                       version_));
  auto answer = state();
  answer.seq = push.seq;
  if (const auto it = marks_.find(push.origin);
      it != marks_.end() && it->second.boot == push.boot && push.seq <= it->second.seq) {
    // Applied before (the old primary's, or this one's): not again. Durable once what holds it is.
    ++duplicates_;
    answer.duplicate = true;
    if (version_ > durable_) undurable_.emplace_back(version_, reply_to);
    return answer;
  }
  const uint64_t staleness = version_ - std::min(push.version, version_);
  answer.staleness = staleness;
  if (staleness > o_.max_staleness) {
    ++rejected_;
    answer.rejected = true;
    return answer;
  }
  if (undurable_.size() >= max_undurable)
    return std::unexpected(fmt::format("{} updates of shard {} wait for the replicas' acks", undurable_.size(), o_.shard));
  const float lr = std::min(o_.max_lr, push.lr / static_cast<float>(1 + staleness));
  apply(push, lr);
  if (o_.replicas.empty()) {
    durable_ = version_;
  } else {
    // Kept until durable, on memory of its own (the push's may be a received frame's, charged to
    // its sender's receive budget).
    auto copy = std::make_shared<const std::vector<float>>(push.chunk.data.begin(), push.chunk.data.end());
    gossip::TensorChunk chunk{push.chunk.step, push.chunk.shard, 0, copy->size(), std::span<const float>(*copy), copy};
    const gossip::ShardUpdate& update =
        kept_.insert_or_assign(version_, gossip::ShardUpdate{o_.job_id, o_.shard, gossip::ShardUpdate::Kind::replicate,
                                                             version_, lr, std::move(chunk), push.origin, push.boot,
                                                             push.seq})
            .first->second;
    for (const auto& replica : o_.replicas) to_replicas.emplace_back(replica, update);
    undurable_.emplace_back(version_, reply_to);
  }
  auto values = state();
  answer.version = values.version;
  answer.chunk = std::move(values.chunk);
  answer.durable = durable_;
  return answer;
}

std::expected<uint64_t, std::string> ShardServer::on_replicate(const gossip::ShardUpdate& update) {
  if (update.kind != gossip::ShardUpdate::Kind::replicate) return std::unexpected(std::string("not a replication"));
  if (auto ok = check(update); !ok) return std::unexpected(ok.error());
  if (update.version <= version_ || held_.contains(update.version)) {  // sent again: acked, not applied
    ++replicas_again_;
    return version_;
  }
  if (update.version > version_ + 1) {
    // Past max_held_updates it is dropped: the ack stands still, and the primary sends it again.
    if (held_.size() < max_held_updates) held_.emplace(update.version, update);
    return version_;
  }
  apply(update, update.lr);
  for (auto it = held_.begin(); it != held_.end() && it->first == version_ + 1; it = held_.erase(it))
    apply(it->second, it->second.lr);
  return version_;
}

std::expected<void, std::string> ShardServer::on_ack(const std::string& replica, uint64_t version,
                                                     Outgoing<gossip::ShardState>& notices) {
  const auto it = replicas_.find(replica);
  if (it == replicas_.end()) return std::unexpected(fmt::format("{} is not a replica of shard {}", replica, o_.shard));
  if (version > version_)
    return std::unexpected(fmt::format("an ack of version {} of shard {}, which is at {}", version, o_.shard, version_));
  it->second.acked = std::max(it->second.acked, version);
  it->second.heard = true;
  advance_durable(notices);
  return {};
}

void ShardServer::on_tick(Outgoing<gossip::ShardUpdate>& resend) {
  // Stuck: behind an update this primary already had at the last tick, and not moved since.
  for (auto& [address, r] : replicas_) {
    const bool stuck = r.heard && r.acked < version_at_tick_ && r.acked == r.acked_at_tick;
    r.acked_at_tick = r.acked;
    if (!stuck) continue;
    for (auto it = kept_.upper_bound(r.acked); it != kept_.end(); ++it) {
      resend.emplace_back(address, it->second);
      ++resent_;
    }
  }
  version_at_tick_ = version_;
}

void ShardServer::advance_durable(Outgoing<gossip::ShardState>& notices) {
  uint64_t lowest = version_;
  for (const auto& [replica, r] : replicas_) lowest = std::min(lowest, r.acked);
  if (lowest <= durable_) return;
  durable_ = lowest;
  kept_.erase(kept_.begin(), kept_.upper_bound(durable_));
  std::vector<std::string> workers;  // each told once, in the order their updates came
  for (; !undurable_.empty() && undurable_.front().first <= durable_; undurable_.pop_front())
    if (std::find(workers.begin(), workers.end(), undurable_.front().second) == workers.end())
      workers.push_back(undurable_.front().second);
  for (auto& w : workers) {
    gossip::ShardState notice{o_.job_id, o_.shard, durable_, false, 0, {}, 0, durable_, false,
                              gossip::ShardState::Kind::durable};
    notices.emplace_back(std::move(w), std::move(notice));
  }
}

gossip::ShardState ShardServer::state() const {
  gossip::ShardState st{o_.job_id, o_.shard, version_, false, 0, snapshot_chunk(version_, o_.shard, values_)};
  st.durable = durable_;
  return st;
}

ShardSnapshot ShardServer::snapshot() const {
  ShardSnapshot s{version_, values_, {}, optimizer_->steps(), marks_};
  for (const auto& [name, buffer] : optimizer_->state()) s.optimizer.emplace_back(buffer.begin(), buffer.end());
  return s;
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

size_t AsyncWorker::in_flight(const Shard& sh) const {
  return static_cast<size_t>(std::count_if(sh.sent.begin(), sh.sent.end(), [](const Sent& u) { return !u.answered; }));
}

bool AsyncWorker::may_step() const {
  return std::none_of(shards_.begin(), shards_.end(), [&](const Shard& s) {
    const size_t flying = in_flight(s);
    return (flying > 0 && s.unanswered_steps >= o_.max_lag_steps) || s.sent.size() - flying >= o_.max_undurable;
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
    if (in_flight(sh) > 0) ++sh.unanswered_steps;
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
    if (in_flight(sh) > 0) ++sh.unanswered_steps;
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

gossip::ShardUpdate AsyncWorker::push_of(uint32_t s, const Sent& u) const {
  gossip::TensorChunk chunk{u.base, s, 0, u.sum->size(), std::span<const float>(*u.sum), u.sum};
  return gossip::ShardUpdate{o_.job_id, s,        gossip::ShardUpdate::Kind::push, u.base,      u.lr, std::move(chunk),
                             o_.origin, o_.boot, u.seq,                           shards_[s].retargeted, generation_,
                             u.consumed};
}

void AsyncWorker::try_push(uint32_t s, Outgoing<gossip::ShardUpdate>& out) {
  auto& sh = shards_[s];
  if (sh.pending_batches.empty() || in_flight(sh) >= o_.window) return;
  if (updates() && sh.pending_batches.size() < o_.local_steps && !flushing_) return;
  const float lr = updates() && sh.pending_lr <= 0
                       ? static_cast<float>((1 + recent_staleness_) / std::max(1u, o_.workers))
                       : sh.pending_lr;
  // Kept until durable: the buffer the message sends, and what a resend sends again.
  Sent u{++sh.seq, sh.pending_base, lr, std::make_shared<const std::vector<float>>(sh.pending),
         std::move(sh.pending_batches)};
  u.consumed = cursor_;
  sh.pending_batches.clear();
  out.emplace_back(o_.primaries[s], push_of(s, u));
  sh.sent.push_back(std::move(u));
  ++pushes_;
}

void AsyncWorker::drop_durable(Shard& sh, uint64_t durable) {
  while (!sh.sent.empty() && sh.sent.front().answered && sh.sent.front().version <= durable) sh.sent.pop_front();
}

std::expected<void, std::string> AsyncWorker::on_state(const gossip::ShardState& st, std::span<float> params,
                                                       Outgoing<gossip::ShardUpdate>& out) {
  if (st.job_id != o_.job_id) return std::unexpected(fmt::format("job {}, not {}", st.job_id, o_.job_id));
  if (st.shard >= o_.shards) return std::unexpected(fmt::format("shard {} of {}", st.shard, o_.shards));
  auto& sh = shards_[st.shard];
  if (st.kind == gossip::ShardState::Kind::durable) {
    drop_durable(sh, st.durable);
    return {};
  }
  const auto it = std::find_if(sh.sent.begin(), sh.sent.end(), [](const Sent& u) { return !u.answered; });
  if (it == sh.sent.end()) return std::unexpected(fmt::format("an answer from shard {} with no push in flight", st.shard));
  if (st.seq != it->seq)
    return std::unexpected(fmt::format("an answer to update {} of shard {}, whose oldest in flight is {}", st.seq,
                                       st.shard, it->seq));
  if (st.chunk.offset != 0 || st.chunk.total != sh.range.size() || st.chunk.data.size() != sh.range.size())
    return std::unexpected(fmt::format("{} values for shard {}, which has {}", st.chunk.data.size(), st.shard,
                                       sh.range.size()));
  // A new primary numbers on from the holder it took over, which may be behind the old primary.
  if (st.version < sh.version && !sh.retargeted)
    return std::unexpected(fmt::format("version {} of shard {}, older than the {} held", st.version, st.shard, sh.version));
  if (!all_finite(st.chunk.data)) return std::unexpected(std::string("values that are not finite"));
  std::copy(st.chunk.data.begin(), st.chunk.data.end(), params.begin() + static_cast<ptrdiff_t>(sh.range.begin));
  sh.version = st.version;
  // The first answer of a new primary: its versions go on from the holder it took over, which
  // may be behind the old primary; what waits to be pushed counts as computed on them at most.
  if (sh.retargeted) sh.pending_base = std::min(sh.pending_base, st.version);
  sh.retargeted = false;
  sh.unanswered_steps = 0;
  if (!st.rejected && !st.duplicate) recent_staleness_ = 0.9 * recent_staleness_ + 0.1 * static_cast<double>(st.staleness);
  if (st.rejected) {
    ++rejected_;
    Sent refused = std::move(*it);
    sh.sent.erase(it);
    if (updates()) {
      // Not applied: it goes out again with what is pending, rebased on these values (the
      // worker's copy is rebuilt on them below), so it is not refused again for the same age.
      if (sh.pending_batches.empty()) {
        sh.pending = *refused.sum;
      } else {
        for (size_t i = 0; i < refused.sum->size(); ++i) sh.pending[i] += (*refused.sum)[i];
      }
      sh.pending_batches.insert(sh.pending_batches.end(), refused.batches.begin(), refused.batches.end());
      sh.pending_base = st.version;
    } else {
      for (auto b : refused.batches) redo_.push_back(Work{b, static_cast<int64_t>(st.shard)});
    }
  } else {
    it->answered = true;
    it->version = st.version;
  }
  drop_durable(sh, st.durable);
  if (updates()) {
    // The primary's values, plus this worker's change it has not applied: pushes still in flight,
    // and what waits to be pushed (each held as minus the change).
    const auto mine = params.subspan(sh.range.begin, sh.range.size());
    for (const auto& u : sh.sent)
      if (!u.answered)
        for (size_t i = 0; i < u.sum->size(); ++i) mine[i] -= (*u.sum)[i];
    if (!sh.pending_batches.empty())
      for (size_t i = 0; i < sh.pending.size(); ++i) mine[i] -= sh.pending[i];
  }
  try_push(st.shard, out);
  return {};
}

void AsyncWorker::retarget(uint32_t shard, const std::string& primary, Outgoing<gossip::ShardUpdate>& out) {
  auto& sh = shards_[shard];
  o_.primaries[shard] = primary;
  sh.retargeted = true;
  sh.unanswered_steps = 0;
  for (auto& u : sh.sent) {
    u.answered = false;
    u.consumed = 0;  // a cursor in the old generation's list means nothing in the new one's
    out.emplace_back(primary, push_of(shard, u));
  }
}

bool AsyncWorker::idle() const {
  return redo_.empty() && std::all_of(shards_.begin(), shards_.end(), [&](const Shard& s) {
           return in_flight(s) == 0 && s.pending_batches.empty();
         });
}

bool AsyncWorker::durable() const {
  return std::all_of(shards_.begin(), shards_.end(), [](const Shard& s) { return s.sent.empty(); });
}

}  // namespace tepdist::elastic

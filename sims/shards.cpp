#include "sims/shards.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

#include "compute/optimizer.hpp"

namespace tepdist::sims {
namespace {

constexpr uint64_t job_id = 1;
constexpr size_t per_shard = 2;  // elements of each shard

std::unique_ptr<compute::Optimizer> sgd(size_t n) { return std::move(*compute::make_optimizer({}, n)); }

bool contains(const std::vector<std::string>& ids, const std::string& id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

void SimShards::fail(std::string why) {
  if (broken_.size() < 20) broken_.push_back(fmt::format("{:.3f} s: {}", now_ / 1000, why));
}

void SimShards::send(const std::string& from, const std::string& to, gossip::Body body) {
  if (!to.empty()) outbox_.emplace_back(from, to, std::move(body));
}

void SimShards::start(const std::string& id, uint64_t boot) {
  auto& n = nodes_[id];
  const uint64_t runs = n.runs;
  n = Node{};
  n.running = true;
  n.boot = boot;
  n.runs = runs;
}

void SimShards::stop(const std::string& id) {
  if (auto it = nodes_.find(id); it != nodes_.end()) {
    it->second.running = false;
    it->second.shards.clear();
    it->second.worker.reset();
  }
}

elastic::ShardServer::Options SimShards::options(const Node& n, const std::string& id, uint32_t s) const {
  elastic::ShardServer::Options o{job_id, s, 16, {}, std::numeric_limits<float>::infinity()};
  const auto& holders = n.plan.placement[s];
  if (holders.empty() || holders.front() != id) return o;
  o.replicas.assign(holders.begin() + 1, holders.end());
  // As the shard host: a replica that is the generation's source carries on from the snapshot.
  if (std::find(o.replicas.begin(), o.replicas.end(), n.plan.sources[s]) != o.replicas.end())
    o.source_replica = n.plan.sources[s];
  return o;
}

void SimShards::applied(const std::string& where, uint32_t s, Holder& h, uint64_t version, const UpdateId& u) {
  if (!h.applied.insert(u).second)
    fail(fmt::format("no_double_apply: {} applied update {} of {} (boot {}) to shard {} again, as version {}", where,
                     std::get<2>(u), std::get<0>(u), std::get<1>(u), s, version));
  h.by_version[version] = u;
}

void SimShards::check_taken(const std::string& id, uint32_t s, const Holder& h, uint64_t generation) {
  if (lost_[s] || generation < newest_) return;
  size_t missing = 0;
  for (const auto& u : durable_[s]) missing += !h.applied.contains(u);
  if (missing > 0)
    fail(fmt::format("no_ack_lost: {} took over shard {} without {} of its {} durable updates", id, s, missing,
                     durable_[s].size()));
  if (h.server->version() < durable_top_[s])
    fail(fmt::format("durable_grows: {} took over shard {} at version {}, below the durable {}", id, s,
                     h.server->version(), durable_top_[s]));
}

void SimShards::install(const std::string& id, const gossip::JobStart& record) {
  auto& n = nodes_[id];
  if (!n.running || record.generation <= n.generation) return;
  n.record = record;
  n.generation = record.generation;
  newest_ = std::max(newest_, record.generation);
  n.plan = elastic::plan_shards(record, shards_, replication_);
  const bool first = record.previous_workers.empty();
  std::map<uint32_t, Holder> kept;
  for (uint32_t s = 0; s < shards_; ++s) {
    const auto& holders = n.plan.placement[s];
    const bool holder = contains(holders, id);
    const std::string& source = n.plan.sources[s];
    auto old = n.shards.find(s);
    if (!first && source.empty() && !lost_[s]) {
      lost_[s] = 1;
      if (std::getenv("TEPDIST_SIM_TRACE")) {
        const auto before = elastic::place_shards(shards_, record.previous_workers, replication_, record.previous_regions);
        for (const auto& w : before[s]) {
          const auto it = nodes_.find(w);
          const bool holds = it != nodes_.end() && it->second.shards.contains(s) && it->second.shards.at(s).server;
          fmt::print(stderr, "{:.3f}:{}:shards:lost shard {}: held in generation {} by {} (running {}, at generation {}, holds {})\n",
                     now_, id, s, record.generation, w, it != nodes_.end() && it->second.running,
                     it != nodes_.end() ? it->second.generation : 0, holds);
        }
      }
      if (report_.lost.empty())
        report_.lost = fmt::format("shard {} at {:.3f} s (generation {}): no acker held it", s, now_ / 1000,
                                   record.generation);
    }
    Holder h;
    h.holder = holder;
    if (first || source.empty()) {
      if (!holder) continue;
      h.server = std::make_unique<elastic::ShardServer>(options(n, id, s), std::vector<float>(per_shard, 0.0f),
                                                        sgd(per_shard));
    } else if (source == id) {
      if (old == n.shards.end() || !old->second.server) {
        fail(fmt::format("source_holds: generation {} names {} the source of shard {}, which it does not hold",
                         record.generation, id, s));
        continue;
      }
      if (holder) {
        auto server = elastic::ShardServer::restore(options(n, id, s), old->second.server->snapshot(), sgd(per_shard));
        if (!server) {
          fail(fmt::format("restore: {}", server.error()));
          continue;
        }
        h.server = std::make_unique<elastic::ShardServer>(std::move(*server));
        h.applied = std::move(old->second.applied);
        h.by_version = std::move(old->second.by_version);
        check_taken(id, s, h, n.generation);
      } else {
        h = std::move(old->second);  // kept for the holders that take it from here
        h.holder = false;
      }
    } else if (!holder) {
      continue;
    }  // else: a holder that takes the source's state once it can (take_over)
    kept.emplace(s, std::move(h));
  }
  n.shards = std::move(kept);
  retry_waiting(id, n);

  if (!contains(record.workers, id)) {
    n.worker.reset();
    return;
  }
  std::vector<std::string> primaries;
  for (const auto& h : n.plan.placement) primaries.push_back(h.front());
  if (!n.worker) {
    elastic::AsyncWorker::Options o{job_id, per_shard * shards_, shards_, primaries, 2, 16, 0,
                                    static_cast<uint32_t>(record.workers.size()), id, n.boot * 1000 + n.runs++};
    n.worker.emplace(std::move(o));
    n.params.assign(per_shard * shards_, 0.0f);
    n.worker->set_generation(record.generation);
    return;
  }
  n.worker->set_generation(record.generation);
  elastic::Outgoing<gossip::ShardUpdate> resend;
  for (uint32_t s = 0; s < shards_; ++s) n.worker->retarget(s, primaries[s], resend);
  for (auto& [to, u] : resend) send(id, to, std::move(u));
}

std::vector<std::pair<uint32_t, uint64_t>> SimShards::held(const std::string& id, uint64_t generation) const {
  std::vector<std::pair<uint32_t, uint64_t>> out;
  const auto it = nodes_.find(id);
  if (it == nodes_.end() || it->second.generation != generation) return out;
  for (const auto& [s, h] : it->second.shards)
    if (h.holder && h.server) out.emplace_back(s, h.server->version());
  return out;
}

void SimShards::take_over(const std::function<bool(const std::string&)>& running,
                          const std::function<bool(const std::string&, const std::string&)>& reach) {
  for (auto& [id, n] : nodes_) {
    if (!n.running || !running(id)) continue;
    bool took = false;
    for (auto& [s, h] : n.shards) {
      if (h.server) continue;
      const std::string& source = n.plan.sources[s];
      const auto src = nodes_.find(source);
      // As the host's fetch: the source answers once it has installed this generation.
      if (src == nodes_.end() || !src->second.running || !running(source) || !reach(id, source) ||
          src->second.generation < n.generation)
        continue;
      const auto held = src->second.shards.find(s);
      if (held == src->second.shards.end() || !held->second.server) continue;
      auto server = elastic::ShardServer::restore(options(n, id, s), held->second.server->snapshot(), sgd(per_shard));
      if (!server) {
        fail(fmt::format("restore: {}", server.error()));
        continue;
      }
      h.server = std::make_unique<elastic::ShardServer>(std::move(*server));
      h.applied = held->second.applied;
      h.by_version = held->second.by_version;
      ++report_.takeovers;
      check_taken(id, s, h, n.generation);
      // A replica holds it from here: the primary counts it durable once acked.
      const auto& holders = n.plan.placement[s];
      if (holders.front() != id)
        send(id, holders.front(),
             gossip::ShardUpdate{job_id, s, gossip::ShardUpdate::Kind::ack, h.server->version(), 0, {}, {}, 0, 0, false,
                                 n.generation});
      took = true;
    }
    if (took) retry_waiting(id, n);
  }
}

void SimShards::push(const std::string& id) {
  auto& n = nodes_.at(id);
  if (!n.running || !n.worker || !n.worker->may_step()) return;
  auto work = n.worker->take_redo();
  if (!work && draining_) return;
  if (!work) work = elastic::AsyncWorker::Work{n.batch++};
  const std::vector<float> gradient(n.params.size(), -1.0f);
  elastic::Outgoing<gossip::ShardUpdate> out;
  n.worker->on_gradient(*work, gradient, 0.1f, out);
  for (auto& [to, u] : out) send(id, to, std::move(u));
}

void SimShards::on_message(const std::string& id, const std::string& from, const gossip::Body& body) {
  auto& n = nodes_[id];
  if (!n.running) return;
  if (const auto* st = std::get_if<gossip::ShardState>(&body)) {
    if (!n.worker || st->generation != n.generation || st->shard >= shards_ || from != n.plan.placement[st->shard].front())
      return;  // an older generation's (what it answered goes again), or not the primary's
    elastic::Outgoing<gossip::ShardUpdate> out;
    if (auto ok = n.worker->on_state(*st, n.params, out); !ok) fail(fmt::format("worker {}: {}", id, ok.error()));
    for (auto& [to, u] : out) send(id, to, std::move(u));
    return;
  }
  if (const auto* u = std::get_if<gossip::ShardUpdate>(&body)) on_update(id, n, from, *u);
}

void SimShards::on_update(const std::string& id, Node& n, const std::string& from, const gossip::ShardUpdate& u) {
  // An older generation's: dropped (its sender sends it again in the newer one). A newer one's,
  // or one for a shard still being taken over: held until it can be taken.
  if (u.generation < n.generation || u.shard >= shards_) return;
  const auto it = n.shards.find(u.shard);
  if (u.generation > n.generation || (it != n.shards.end() && it->second.holder && !it->second.server)) {
    if (n.waiting.size() < waiting_limit) n.waiting.emplace_back(from, u);
    return;
  }
  if (it == n.shards.end() || !it->second.holder) return;
  auto& h = it->second;
  auto& server = *h.server;
  const uint32_t s = u.shard;
  const bool primary = n.plan.placement[s].front() == id;
  const uint64_t durable_before = server.durable();
  switch (u.kind) {
    case gossip::ShardUpdate::Kind::push: {
      if (!primary) return;
      elastic::Outgoing<gossip::ShardUpdate> replicas;
      auto answer = server.on_push(u, from, replicas);
      if (!answer) return;
      if (answer->duplicate) ++report_.duplicates;
      if (!answer->rejected && !answer->duplicate) {
        ++report_.applied;
        applied(id, s, h, answer->version, {u.origin, u.boot, u.seq});
      }
      answer->generation = n.generation;
      send(id, from, std::move(*answer));
      for (auto& [to, r] : replicas) {
        r.generation = n.generation;
        send(id, to, std::move(r));
      }
      break;
    }
    case gossip::ShardUpdate::Kind::replicate: {
      if (primary || from != n.plan.placement[s].front()) return;
      if (u.version > server.version()) h.pending[u.version] = {u.origin, u.boot, u.seq};
      auto through = u.version <= server.version() ? std::expected<uint64_t, std::string>(server.version())
                                                   : server.on_replicate(u);
      if (!through) return;
      for (auto p = h.pending.begin(); p != h.pending.end() && p->first <= *through; p = h.pending.erase(p))
        applied(id, s, h, p->first, p->second);
      send(id, from,
           gossip::ShardUpdate{job_id, s, gossip::ShardUpdate::Kind::ack, *through, 0, {}, {}, 0, 0, false, n.generation});
      break;
    }
    case gossip::ShardUpdate::Kind::ack: {
      if (!primary) return;
      elastic::Outgoing<gossip::ShardState> notices;
      if (!server.on_ack(from, u.version, notices)) return;
      for (auto& [to, notice] : notices) {
        notice.generation = n.generation;
        send(id, to, std::move(notice));
      }
      break;
    }
    default: return;
  }
  // What became durable on this primary: every holder has it, and its workers are told so.
  if (primary && server.durable() > durable_before) {
    for (auto v = h.by_version.upper_bound(durable_before); v != h.by_version.end() && v->first <= server.durable(); ++v)
      if (durable_[s].insert(v->second).second) ++report_.durable;
    durable_top_[s] = std::max(durable_top_[s], server.durable());
  }
}

void SimShards::retry_waiting(const std::string& id, Node& n) {
  auto again = std::exchange(n.waiting, {});
  for (auto& [from, u] : again) on_update(id, n, from, u);
}

void SimShards::check_end(const gossip::JobStart& newest) {
  const auto plan = elastic::plan_shards(newest, shards_, replication_);
  const size_t want = std::min<size_t>(static_cast<size_t>(std::max(1, replication_)), newest.workers.size());
  for (uint32_t s = 0; s < shards_; ++s) {
    if (lost_[s]) continue;
    size_t holding = 0;
    for (const auto& id : plan.placement[s]) {
      const auto it = nodes_.find(id);
      if (it == nodes_.end() || !it->second.running || it->second.generation != newest.generation) continue;
      const auto h = it->second.shards.find(s);
      if (h != it->second.shards.end() && h->second.server) ++holding;
    }
    if (holding != want)
      fail(fmt::format("holders_back: shard {} has {} holders with its state in generation {}, not {}", s, holding,
                       newest.generation, want));
    if (const auto p = nodes_.find(plan.placement[s].front()); p != nodes_.end() && p->second.running)
      if (const auto h = p->second.shards.find(s); h != p->second.shards.end() && h->second.server) {
        check_taken(p->first, s, h->second, p->second.generation);
        const auto& server = *h->second.server;
        if (draining_ && p->second.generation == newest.generation && h->second.holder &&
            server.durable() < server.version())
          fail(fmt::format("all_durable: shard {}'s primary {} applied through version {}, durable only through {}",
                           s, p->first, server.version(), server.durable()));
      }
  }
  if (!draining_) return;
  for (const auto& id : newest.workers) {
    const auto it = nodes_.find(id);
    if (it == nodes_.end() || !it->second.running || it->second.generation != newest.generation || !it->second.worker)
      continue;
    const auto& worker = *it->second.worker;
    if (!worker.idle()) fail(fmt::format("all_durable: worker {} still has gradients to apply or compute again", id));
    for (uint32_t s = 0; s < shards_; ++s)
      if (const size_t kept = worker.kept(s); kept > 0 && !lost_[s])
        fail(fmt::format("all_durable: worker {} holds {} update(s) to shard {} not yet durable", id, kept, s));
  }
}

}  // namespace tepdist::sims

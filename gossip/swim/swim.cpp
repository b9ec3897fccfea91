#include "gossip/swim/swim.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tepdist::gossip::swim {
namespace {

using State = Member::State;

bool live(State s) { return s == State::alive || s == State::suspect; }

}  // namespace

const char* event_name(Event::Kind k) {
  switch (k) {
    case Event::Kind::joined: return "joined";
    case Event::Kind::suspected: return "suspected";
    case Event::Kind::alive_again: return "alive_again";
    case Event::Kind::dead: return "dead";
    case Event::Kind::left: return "left";
    case Event::Kind::updated: return "updated";
  }
  return "?";
}

Swim::Swim(Member self, Config config, std::function<uint64_t(uint64_t)> below)
    : self_(std::move(self)), config_(config), below_(std::move(below)), awareness_(config.awareness_max_multiplier) {
  self_.state = State::alive;
}

// ---- membership bookkeeping ----------------------------------------------------------------

size_t Swim::live_count() const {
  size_t n = left_ ? 0 : 1;
  n += live_members_;  // kept as states change: this is asked on every message
  return n;
}

std::vector<Member> Swim::members() const {
  std::vector<Member> out{self_};
  for (const auto& [id, k] : members_) out.push_back(k.member);
  return out;
}

std::vector<Member> Swim::full_state() const { return members(); }

int Swim::retransmit_limit() const {
  return static_cast<int>(config_.retransmit_mult * std::ceil(std::log10(static_cast<double>(live_count()) + 1.0)));
}

double Swim::suspicion_min_ms() const {
  const double n = static_cast<double>(std::max<size_t>(1, live_count()));
  return config_.suspicion_mult * std::max(1.0, std::log10(n)) * config_.probe_interval_ms;
}

std::vector<Member> Swim::piggyback() { return broadcasts_.pick(config_.gossip_budget_bytes, retransmit_limit()); }

void Swim::send(Output& out, const std::string& address, Body body) { out.sends.push_back({address, std::move(body)}); }

void Swim::refute(const Member& claim, Output& out) {
  // Someone thinks this node is suspect or dead (or knows a newer incarnation of it): outbid them.
  self_.incarnation = std::max(self_.incarnation, claim.incarnation) + 1;
  broadcasts_.enqueue(self_);
  awareness_.apply(1);  // being suspected hints that this node is the slow one
  (void)out;
}

void Swim::suspect(double now_ms, Known& k, const std::string& accuser, Output& out) {
  k.member.state = State::suspect;
  k.member.accuser = accuser;
  k.changed_ms = now_ms;
  const double min = suspicion_min_ms();
  const int expected = std::max(0, std::min(static_cast<int>(config_.suspicion_mult) - 2,
                                            static_cast<int>(live_count()) - 2));
  suspicions_.insert_or_assign(
      k.member.id, Suspicion(now_ms, min, expected == 0 ? min : min * config_.suspicion_max_timeout_mult,
                             std::max(1, expected), accuser));
  broadcasts_.enqueue(k.member);
  out.events.push_back({Event::Kind::suspected, k.member});
}

void Swim::declare(double now_ms, Known& k, State state, Output& out) {
  if (state == State::dead)
    unreachable_[k.member.id] = {k.member.address, now_ms + config_.reconnect_timeout_ms};
  if (live(k.member.state)) --live_members_;
  k.member.state = state;
  k.changed_ms = now_ms;
  forget_at_.emplace(now_ms + config_.dead_retention_ms, k.member.id);
  suspicions_.erase(k.member.id);
  broadcasts_.enqueue(k.member);
  out.events.push_back({state == State::dead ? Event::Kind::dead : Event::Kind::left, k.member});
}

void Swim::merge(double now_ms, const Member& u, const std::string& from, Output& out) {
  if (u.id == self_.id) {
    if (left_) return;
    const bool accusation = u.state == State::suspect || u.state == State::dead;
    const bool accused = accusation && u.incarnation >= self_.incarnation;
    const bool outdated = u.state == State::alive && u.incarnation > self_.incarnation;
    if (accused || outdated) {
      refute(u, out);
    } else if (accusation && !broadcasts_.contains(self_.id)) {
      // An accusation of an incarnation already refuted is still going round: whoever still
      // believes it missed the refutation, which has stopped being gossiped. Gossip it again, or
      // that member's suspicion runs out and it declares this live node dead.
      broadcasts_.enqueue(self_);
    }
    return;
  }
  auto it = members_.find(u.id);
  if (it == members_.end()) {
    // Only news that a member is there introduces it; rumours about strangers are dropped.
    if (u.state != State::alive) return;
    Known& k = members_[u.id] = {u, now_ms};
    ++live_members_;
    broadcasts_.enqueue(k.member);
    out.events.push_back({Event::Kind::joined, k.member});
    return;
  }
  Known& k = it->second;
  const uint64_t inc = k.member.incarnation;
  switch (u.state) {
    case State::alive: {
      // A dead or departed member comes back only with a newer incarnation (a restart); a live one
      // takes any newer incarnation (a refutation, or new details).
      if (u.incarnation <= inc) return;
      const State was = k.member.state;
      if (!live(was)) ++live_members_;
      k.member = u;
      k.member.accuser.clear();
      k.changed_ms = now_ms;
      suspicions_.erase(u.id);
      unreachable_.erase(u.id);
      broadcasts_.enqueue(k.member);
      out.events.push_back({was == State::alive     ? Event::Kind::updated
                            : was == State::suspect ? Event::Kind::alive_again
                                                    : Event::Kind::joined,
                            k.member});
      return;
    }
    case State::suspect: {
      if (u.incarnation < inc || !live(k.member.state)) return;
      const std::string& accuser = u.accuser.empty() ? from : u.accuser;
      if (k.member.state == State::suspect) {
        // Another accuser shortens the suspicion (Lifeguard); the same accusation relayed again
        // does not.
        auto s = suspicions_.find(u.id);
        if (s != suspicions_.end() && s->second.confirm(accuser)) {
          Member news = k.member;
          news.accuser = accuser;
          broadcasts_.enqueue(news);
        }
        return;
      }
      k.member.incarnation = u.incarnation;
      suspect(now_ms, k, accuser, out);
      return;
    }
    case State::dead:
    case State::left:
      if (u.incarnation < inc || !live(k.member.state)) return;
      k.member.incarnation = u.incarnation;
      declare(now_ms, k, u.state, out);
      return;
  }
}

// ---- inputs --------------------------------------------------------------------------------

void Swim::join(double now_ms, const std::vector<std::string>& seeds, Output& out) {
  next_probe_ms_ = now_ms + config_.probe_interval_ms;
  next_push_pull_ms_ = now_ms + config_.push_pull_interval_ms;
  next_reconnect_ms_ = now_ms + config_.reconnect_interval_ms;
  seeds_ = seeds;
  if (!seeds_.empty()) next_join_ms_ = now_ms + config_.probe_interval_ms;
  // Its own arrival rides on its first pings too, not only on the seed's gossip: a member the
  // seed's rumour missed learns of the joiner when the joiner probes it.
  if (!seeds_.empty()) broadcasts_.enqueue(self_);
  for (const auto& address : seeds) send(out, address, StateSync{{self_}, false, 0});
}

void Swim::adopt(double now_ms, const std::vector<Member>& view) {
  for (const auto& m : view)
    if (m.id != self_.id && m.state == State::alive)
      live_members_ += members_.insert_or_assign(m.id, Known{m, now_ms}).second ? 1 : 0;
}

void Swim::leave(double now_ms, Output& out) {
  (void)now_ms;
  self_.incarnation += 1;
  self_.state = State::left;
  broadcasts_.enqueue(self_);
  for (const Known* k : random_live(static_cast<size_t>(config_.indirect_checks), ""))
    send(out, k->member.address, Leave{self_});
  left_ = true;
}

void Swim::on_message(double now_ms, const std::string& from, const std::string& from_address, const Body& body,
                      Output& out) {
  auto address_of = [&](const std::string& id) -> std::optional<std::string> {
    if (id == from && !from_address.empty()) return from_address;
    auto it = members_.find(id);
    if (it == members_.end()) return std::nullopt;
    return it->second.member.address;
  };
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, Ping>) {
          for (const auto& u : m.updates) merge(now_ms, u, from, out);
          if (auto a = address_of(from); a && !left_) {
            send(out, *a, Ack{m.seq_no, piggyback()});
            // A member that probes this node but is not live in its view: the rumour of its
            // arrival (or of its refutation) missed this node, and gossip about it may have died
            // out. Push-pull with it at once instead of waiting for the periodic one.
            auto it = members_.find(from);
            if (from != self_.id && (it == members_.end() || !live(it->second.member.state)))
              send(out, *a, StateSync{full_state(), false, 0});
          }
        } else if constexpr (std::is_same_v<T, Ack>) {
          for (const auto& u : m.updates) merge(now_ms, u, from, out);
          if (probe_ && m.seq_no == probe_->seq) {
            probe_.reset();
            awareness_.apply(-1);
          } else if (auto r = relays_.find(m.seq_no); r != relays_.end()) {
            send(out, r->second.requester_address, Ack{r->second.requester_seq, piggyback()});
            relays_.erase(r);
          }
        } else if constexpr (std::is_same_v<T, PingReq>) {
          for (const auto& u : m.updates) merge(now_ms, u, from, out);
          auto requester = address_of(from);
          if (!requester || left_) return;
          const uint64_t seq = ++seq_;
          relays_[seq] = {*requester, m.seq_no, now_ms + awareness_.scale(config_.probe_interval_ms)};
          send(out, m.target.address, Ping{seq, piggyback()});
        } else if constexpr (std::is_same_v<T, Join>) {
          merge(now_ms, m.member, from, out);
          send(out, m.member.address, StateSync{full_state(), true, 0});
        } else if constexpr (std::is_same_v<T, StateSync>) {
          for (const auto& u : m.members) merge(now_ms, u, from, out);
          if (m.reply) next_join_ms_ = std::numeric_limits<double>::infinity();  // the join was answered
          if (!m.reply)
            if (auto a = address_of(from)) send(out, *a, StateSync{full_state(), true, 0});
        } else if constexpr (std::is_same_v<T, Leave>) {
          merge(now_ms, m.member, from, out);
        }
        // Tensors, parameters, control and metrics are not membership's business.
      },
      body);
}

// ---- timers --------------------------------------------------------------------------------

std::vector<const Swim::Known*> Swim::random_live(size_t count, const std::string& except) {
  std::vector<const Known*> pool;
  for (const auto& [id, k] : members_)
    if (k.member.state == State::alive && id != except) pool.push_back(&k);
  for (size_t i = 0; i < pool.size() && i < count; ++i)  // partial Fisher-Yates
    std::swap(pool[i], pool[i + below_(pool.size() - i)]);
  pool.resize(std::min(pool.size(), count));
  return pool;
}

std::optional<std::string> Swim::next_probe_target() {
  for (int pass = 0; pass < 2; ++pass) {
    while (probe_index_ < probe_order_.size()) {
      const std::string& id = probe_order_[probe_index_++];
      auto it = members_.find(id);
      if (it != members_.end() && live(it->second.member.state)) return id;
    }
    // A new round: every live member once, in a fresh random order.
    probe_order_.clear();
    for (const auto& [id, k] : members_)
      if (live(k.member.state)) probe_order_.push_back(id);
    for (size_t i = probe_order_.size(); i > 1; --i) std::swap(probe_order_[i - 1], probe_order_[below_(i)]);
    probe_index_ = 0;
  }
  return std::nullopt;
}

void Swim::tick(double now_ms, Output& out) {
  if (left_) return;
  // A join whose state sync (or its answer) was lost: ask again, each probe interval, until a
  // state sync answers. Knowing somebody is not enough: another joiner that picked this node as its
  // seed would otherwise leave the two of them an island.
  if (now_ms >= next_join_ms_) {
    for (const auto& address : seeds_) send(out, address, StateSync{{self_}, false, 0});
    next_join_ms_ = now_ms + config_.probe_interval_ms;
  }
  // Suspicions that ran out: this node's verdict is death.
  for (auto it = suspicions_.begin(); it != suspicions_.end();) {
    if (it->second.deadline_ms() > now_ms) {
      ++it;
      continue;
    }
    auto k = members_.find(it->first);
    it = suspicions_.erase(it);
    if (k != members_.end() && k->second.member.state == State::suspect) declare(now_ms, k->second, State::dead, out);
  }
  // The probe in flight.
  if (probe_) {
    auto target = members_.find(probe_->target);
    if (target == members_.end() || !live(target->second.member.state)) {
      probe_.reset();
    } else if (!probe_->indirect_sent && now_ms >= probe_->timeout_ms) {
      probe_->indirect_sent = true;
      for (const Known* k : random_live(static_cast<size_t>(config_.indirect_checks), probe_->target))
        send(out, k->member.address, PingReq{probe_->seq, target->second.member, piggyback()});
    } else if (now_ms >= probe_->interval_end_ms) {
      probe_.reset();
      awareness_.apply(1);
      if (target->second.member.state == State::alive) {
        suspect(now_ms, target->second, self_.id, out);
        // Lifeguard's buddy system: tell the accused at once (the suspicion is the newest news, so
        // it rides first), so a live member can refute before its suspicion runs out.
        send(out, target->second.member.address, Ping{++seq_, piggyback()});
      }
    }
  }
  // The next probe.
  if (!probe_ && now_ms >= next_probe_ms_) {
    next_probe_ms_ = now_ms + awareness_.scale(config_.probe_interval_ms);
    if (auto id = next_probe_target()) {
      const Known& k = members_.at(*id);
      probe_ = Probe{++seq_, *id, now_ms + awareness_.scale(config_.probe_timeout_ms), next_probe_ms_};
      auto updates = piggyback();
      // Lifeguard's buddy system: probing a suspect always tells it so, whatever the gossip
      // budget has left, so a live member learns of its suspicion from everyone who probes it.
      if (k.member.state == State::suspect) updates.insert(updates.begin(), k.member);
      send(out, k.member.address, Ping{probe_->seq, std::move(updates)});
    }
  }
  // Lifeguard's buddy system, kept up: each probe interval, one member this node suspects is told
  // so again. A live one refutes, or, if it refuted already, gossips its refutation anew (see
  // merge), and the answer rides back on the ack: a suspicion that missed the refutation while it
  // was being gossiped cannot run out on a live member.
  if (!suspicions_.empty() && now_ms >= next_reminder_ms_) {
    next_reminder_ms_ = now_ms + awareness_.scale(config_.probe_interval_ms);
    auto s = std::next(suspicions_.begin(), static_cast<ptrdiff_t>(below_(suspicions_.size())));
    auto k = members_.find(s->first);
    if (k != members_.end() && k->second.member.state == State::suspect) {
      auto updates = piggyback();
      updates.insert(updates.begin(), k->second.member);
      send(out, k->second.member.address, Ping{++seq_, std::move(updates)});
    }
  }
  for (auto it = relays_.begin(); it != relays_.end();) it = it->second.expires_ms <= now_ms ? relays_.erase(it) : ++it;
  // Push-pull with one random member; the interval grows with log2(N / 32) past 32 members.
  if (now_ms >= next_push_pull_ms_) {
    const double n = static_cast<double>(live_count());
    const double scale = n > 32 ? std::ceil(std::log2(n / 32.0)) + 1.0 : 1.0;
    next_push_pull_ms_ = now_ms + config_.push_pull_interval_ms * scale;
    for (const Known* k : random_live(1, "")) send(out, k->member.address, StateSync{full_state(), false, 0});
  }
  // Reconnect: one push-pull with a member held dead, in case it is alive on the far side of a
  // partition that has healed.
  if (now_ms >= next_reconnect_ms_) {
    next_reconnect_ms_ = now_ms + config_.reconnect_interval_ms;
    std::erase_if(unreachable_, [&](const auto& kv) { return kv.second.second <= now_ms; });
    if (!unreachable_.empty()) {
      auto it = std::next(unreachable_.begin(), static_cast<ptrdiff_t>(below_(unreachable_.size())));
      // Only this node's own record, like a join: a live member that held this node dead takes
      // its answer's "you are dead" as the cue to refute, and accepts this node once the next
      // reconnect carries the higher incarnation. (A full state to every dead member every few
      // seconds would cost O(N) per message in a large cluster.)
      send(out, it->second.first, StateSync{{self_}, false, 0});
    }
  }
  // Forget the dead once stale gossip about them has had time to die out: in deadline order, so
  // a tick costs nothing per member. (An entry whose member came back meanwhile is skipped.)
  while (!forget_at_.empty() && forget_at_.begin()->first <= now_ms) {
    auto k = members_.find(forget_at_.begin()->second);
    if (k != members_.end() && !live(k->second.member.state) &&
        k->second.changed_ms + config_.dead_retention_ms <= now_ms)
      members_.erase(k);
    forget_at_.erase(forget_at_.begin());
  }
}

double Swim::next_deadline_ms() const {
  double next = std::min({next_probe_ms_, next_push_pull_ms_, next_join_ms_});
  if (!unreachable_.empty()) next = std::min(next, next_reconnect_ms_);
  if (!suspicions_.empty()) next = std::min(next, next_reminder_ms_);
  if (probe_) next = std::min(next, probe_->indirect_sent ? probe_->interval_end_ms : probe_->timeout_ms);
  for (const auto& [id, s] : suspicions_) next = std::min(next, s.deadline_ms());
  for (const auto& [seq, r] : relays_) next = std::min(next, r.expires_ms);
  if (!forget_at_.empty()) next = std::min(next, forget_at_.begin()->first);
  return next;
}

}  // namespace tepdist::gossip::swim

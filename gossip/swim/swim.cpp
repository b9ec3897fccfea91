#include "gossip/swim/swim.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include "base/check.hpp"

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
    case Event::Kind::restarted: return "restarted";
    case Event::Kind::refuted: return "refuted";
  }
  return "?";
}

Swim::Swim(Member self, Config config, std::function<uint64_t(uint64_t)> below, std::shared_ptr<Directory> directory)
    : self_(std::move(self)),
      config_(config),
      below_(std::move(below)),
      directory_(directory ? std::move(directory) : std::make_shared<Directory>()),
      awareness_(config.awareness_max_multiplier) {
  self_.state = State::alive;
}

Swim::Known* Swim::find(uint32_t id) {
  return id < table_.size() && table_[id].present ? &table_[id] : nullptr;
}

const Swim::Known* Swim::find(uint32_t id) const {
  return id < table_.size() && table_[id].present ? &table_[id] : nullptr;
}

Swim::Known* Swim::find(const std::string& id) {
  return const_cast<Known*>(std::as_const(*this).find(id));
}

const Swim::Known* Swim::find(const std::string& id) const {
  const uint32_t n = directory_->find_id(id);
  return n == Directory::none ? nullptr : find(n);
}

Swim::Known& Swim::add(uint32_t id) {
  if (id >= table_.size()) {
    // Room for the ids the directory has and a few more, not double: with thousands of cores
    // sharing a directory, doubling each table as members join would double the memory.
    const size_t size = std::max<size_t>(id + 1, directory_->ids());
    if (size > table_.capacity()) table_.reserve(size + size / 64 + 16);
    table_.resize(size);
  }
  Known& k = table_[id];
  k = Known{};
  k.present = true;
  return k;
}

Member Swim::record(uint32_t id) const {
  const Known& k = table_[id];
  return directory_->member(id, k.details, k.incarnation, k.state, k.accuser);
}

// ---- membership bookkeeping ----------------------------------------------------------------

size_t Swim::live_count() const {
  size_t n = left_ ? 0 : 1;
  n += live_members_;  // kept as states change: this is asked on every message
  return n;
}

std::vector<Member> Swim::members() const {
  std::vector<Member> out = full_state();
  std::sort(out.begin() + 1, out.end(), [](const Member& a, const Member& b) { return a.id < b.id; });
  return out;
}

std::vector<Member> Swim::full_state() const {
  std::vector<Member> out{self_};
  for (uint32_t n = 0; n < table_.size(); ++n)
    if (table_[n].present) out.push_back(record(n));
  return out;
}

void Swim::for_each_member(const std::function<void(const std::string& id, Member::State state)>& f) const {
  f(self_.id, self_.state);
  for (uint32_t n = 0; n < table_.size(); ++n)
    if (table_[n].present) f(directory_->id(n), table_[n].state);
}

std::optional<Member::State> Swim::state_of(const std::string& id) const {
  if (id == self_.id) return self_.state;
  const Known* k = find(id);
  if (!k) return std::nullopt;
  return k->state;
}

int Swim::retransmit_limit() const {
  return static_cast<int>(config_.retransmit_mult * std::ceil(std::log10(static_cast<double>(live_count()) + 1.0)));
}

double Swim::push_pull_delay_ms() {
  // The interval grows with log2(N / 32) past 32 members, so a member's state syncs (each O(N))
  // cost O(N log N) cluster-wide per interval rather than O(N^2). Each delay is drawn from half to
  // one and a half intervals: members that started together (a formed cluster) do not all sync at
  // the same moment, with N full states in flight at once.
  const double n = static_cast<double>(live_count());
  const double scale = n > 32 ? std::ceil(std::log2(n / 32.0)) + 1.0 : 1.0;
  return config_.push_pull_interval_ms * scale * (0.5 + static_cast<double>(below_(1024)) / 1024.0);
}

double Swim::suspicion_min_ms() const {
  const double n = static_cast<double>(std::max<size_t>(1, live_count()));
  return config_.suspicion_mult * std::max(1.0, std::log10(n)) * config_.probe_interval_ms;
}

std::vector<Member> Swim::piggyback() { return broadcasts_.pick(config_.gossip_budget_bytes, retransmit_limit()); }

void Swim::send(Output& out, const std::string& address, Body body) { out.sends.push_back({address, std::move(body)}); }

void Swim::spread(const Member& news) {
  if (!quiet_) broadcasts_.enqueue(news);
}

void Swim::refute(const Member& claim, Output& out) {
  // Someone thinks this node is suspect or dead (or knows a newer incarnation of it): outbid them.
  // Saturating: a hostile claim at the counter's top must not wrap this node to incarnation 0.
  constexpr uint64_t top = std::numeric_limits<uint64_t>::max() - 1;
  self_.incarnation = std::min(std::max(self_.incarnation, claim.incarnation), top) + 1;
  broadcasts_.enqueue(self_, true);
  awareness_.apply(1);  // being suspected hints that this node is the slow one
  Member news = self_;
  news.accuser = claim.state == State::left ? std::string("left") : claim.accuser;  // for the log: who said it
  out.events.push_back({Event::Kind::refuted, std::move(news)});
}

void Swim::correct(const Known& k) {
  // A rumour older than what this node holds (a suspicion or death the member has refuted) is
  // still going round: whoever sent it missed the refutation, which may have stopped being
  // gossiped. Gossip the newer record again, to that sender among others (not while merging a
  // state sync: the answer to one carries this node's whole view anyway).
  const uint32_t n = number_of(k);
  if (!broadcasts_.contains(directory_->id(n))) spread(record(n));
}

void Swim::suspect(double now_ms, Known& k, const std::string& accuser, Output& out) {
  const uint32_t n = number_of(k);
  k.state = State::suspect;
  k.accuser = directory_->intern_id(accuser);
  // The first suspicion heard from others after a quiet spell is a sign of trouble somewhere,
  // quite often load (the suspect's, or the accuser's): this node takes it as it takes its own
  // lateness (defer_verdicts: verdicts due now wait a probe timeout, and its probing and later
  // verdicts slow a step until its probes succeed again); this suspicion keeps its course.
  // Measured: without it, the loaded-nodes scenario declares live members dead in a quarter of
  // its seeds; with it, in none of 100, and a kill in kill_one_of_100 is known as soon as before.
  const bool first_heard = accuser != self_.id && suspicions_.empty();
  // A node that is itself slow (high awareness) hears less in the same time: it gives a suspect
  // proportionally longer to be heard refuting, as it gives its probes longer to be answered.
  const double min = awareness_.scale(suspicion_min_ms());
  const int expected = std::max(0, std::min(static_cast<int>(config_.suspicion_mult) - 2,
                                            static_cast<int>(live_count()) - 2));
  auto [it, added] = suspicions_.insert_or_assign(
      n, Suspicion(now_ms, min, expected == 0 ? min : min * config_.suspicion_max_timeout_mult, std::max(1, expected),
                   accuser));
  if (accuser == self_.id) it->second.mark_probed();  // its own probe failed: no need to check
  if (first_heard) defer_verdicts(now_ms);
  const Member m = record(n);
  spread(m);
  out.events.push_back({Event::Kind::suspected, m});
}

void Swim::declare(double now_ms, Known& k, State state, Output& out) {
  const uint32_t n = number_of(k);
  if (state == State::dead) unreachable_[n] = {directory_->address(k.details), now_ms + config_.reconnect_timeout_ms};
  if (live(k.state)) --live_members_;
  k.state = state;
  forget_at_.emplace(now_ms + config_.dead_retention_ms, std::pair(n, k.incarnation));
  suspicions_.erase(n);
  const Member m = record(n);
  spread(m);
  urgent_ = urgent_ || !quiet_;
  out.events.push_back({state == State::dead ? Event::Kind::dead : Event::Kind::left, m});
}

void Swim::merge(double now_ms, const Member& u, const std::string& from, Output& out) {
  if (u.id == self_.id) {
    if (left_) return;
    // A rumour that this live node left (a forged or misrouted one: only the leaver says it) is
    // refuted like a death, or it would spread and stay.
    const bool accusation = u.state != State::alive;
    const bool accused = accusation && u.incarnation >= self_.incarnation;
    const bool outdated = u.state == State::alive && u.incarnation > self_.incarnation;
    if (accused || outdated) {
      refute(u, out);
    } else if (accusation && !broadcasts_.contains(self_.id)) {
      // An accusation of an incarnation already refuted is still going round: whoever still
      // believes it missed the refutation, which has stopped being gossiped. Gossip it again, or
      // that member's suspicion runs out and it declares this live node dead.
      broadcasts_.enqueue(self_, true);
    }
    return;
  }
  Known* found = find(u.id);
  if (!found) {
    // Only news that a member is there introduces it; rumours about strangers are dropped.
    if (u.state != State::alive) return;
    const uint32_t n = directory_->intern_id(u.id);
    Known& k = add(n);
    k.incarnation = u.incarnation;
    k.details = directory_->intern_details(u);
    ++live_members_;
    const Member m = record(n);
    spread(m);
    out.events.push_back({Event::Kind::joined, m});
    return;
  }
  Known& k = *found;
  const uint32_t n = number_of(k);
  const uint64_t inc = k.incarnation;
  switch (u.state) {
    case State::alive: {
      // A dead or departed member comes back only with a newer incarnation (a restart); a live one
      // takes any newer incarnation (a refutation, or new details).
      if (u.incarnation <= inc) return;
      const State was = k.state;
      const uint64_t boot_was = directory_->boot_id(k.details);
      if (!live(was)) ++live_members_;
      k.incarnation = u.incarnation;
      k.details = directory_->intern_details(u);
      k.state = State::alive;
      k.accuser = Directory::none;
      suspicions_.erase(n);
      unreachable_.erase(n);
      const Member m = record(n);
      spread(m);
      // A live member with another boot id restarted between two probes: no death was seen, but
      // whatever it held is gone, which those who work with it must know.
      const bool restarted = live(was) && boot_was != 0 && u.boot_id != 0 && u.boot_id != boot_was;
      out.events.push_back({restarted               ? Event::Kind::restarted
                            : was == State::alive   ? Event::Kind::updated
                            : was == State::suspect ? Event::Kind::alive_again
                                                    : Event::Kind::joined,
                            m});
      return;
    }
    case State::suspect: {
      if (!live(k.state)) return;
      if (u.incarnation < inc) return correct(k);
      const std::string& accuser = u.accuser.empty() ? from : u.accuser;
      if (k.state == State::suspect && u.incarnation > inc) {
        // The member refuted the suspicion this node holds (a refutation it missed) and was
        // suspected anew: a new suspicion with its own full course, not a confirmation that
        // shortens the refuted one.
        k.incarnation = u.incarnation;
        suspect(now_ms, k, accuser, out);
        return;
      }
      if (k.state == State::suspect) {
        // Another accuser shortens the suspicion (Lifeguard); the same accusation relayed again
        // does not.
        auto s = suspicions_.find(n);
        if (s != suspicions_.end() && s->second.confirm(accuser)) {
          Member news = record(n);
          news.accuser = accuser;
          spread(news);
        }
        return;
      }
      k.incarnation = u.incarnation;
      suspect(now_ms, k, accuser, out);
      return;
    }
    case State::dead:
    case State::left:
      if (!live(k.state)) return;
      if (u.incarnation < inc) return correct(k);
      if (u.state == State::left && from != u.id) {
        // Only a member itself says it leaves (its Leave to every member, its acks while it
        // lingers): a leave heard from another is an accusation like a death, settled when this
        // node's probe reaches the member or its Leave arrives.
        if (k.state == State::alive) {
          k.incarnation = u.incarnation;
          suspect(now_ms, k, from, out);
        } else if (auto s = suspicions_.find(n); s != suspicions_.end()) {
          s->second.confirm(from);
        }
        return;
      }
      if (u.state == State::dead) {
        // A death heard of a member this node held alive is an accusation, not a verdict (as
        // memberlist takes one in a state sync): the member becomes a suspect, is told on the next
        // probe and refutes if it lives. A death of a suspect is taken at once when its sender is
        // not among this suspicion's accusers: independent word that the suspicion ran out (the
        // accuser it names is usually the first one, whose suspicion others timed out on). From
        // an accuser itself it only confirms. Taken at once every time, a node cut off from the
        // rest, which holds them all dead, made the others declare each other dead the moment
        // the link came back. (A minority of two or more cut off together can still pass each
        // other's verdicts on as independent: a known limit.)
        const std::string& accuser = u.accuser.empty() ? from : u.accuser;
        if (k.state == State::alive) {
          k.incarnation = u.incarnation;
          suspect(now_ms, k, accuser, out);
          return;
        }
        auto s = suspicions_.find(n);
        if (s != suspicions_.end() && s->second.accused_by(from)) {
          s->second.confirm(accuser);
          return;
        }
      }
      k.incarnation = u.incarnation;
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
  if (!seeds_.empty()) broadcasts_.enqueue(self_, true);
  for (const auto& address : seeds) send(out, address, StateSync{{self_}, false, 0});
  due_ms_ = next_deadline_ms();
}

std::vector<Swim::Interned> Swim::intern(Directory& directory, const std::vector<Member>& view) {
  std::vector<Interned> out;
  out.reserve(view.size());
  for (const auto& m : view)
    if (m.state == State::alive) out.push_back({directory.intern_id(m.id), directory.intern_details(m), m.incarnation});
  return out;
}

void Swim::adopt(double now_ms, std::span<const Interned> view) {
  const uint32_t me = directory_->intern_id(self_.id);
  for (const auto& m : view) {
    if (m.id == me) continue;
    if (const Known* was = find(m.id); !was || !live(was->state)) ++live_members_;
    Known& k = add(m.id);
    k.incarnation = m.incarnation;
    k.details = m.details;
    suspicions_.erase(m.id);
  }
  next_push_pull_ms_ = now_ms + push_pull_delay_ms();  // sized for the cluster just adopted
  due_ms_ = std::max(now_ms, next_deadline_ms());
}

void Swim::leave(double now_ms, Output& out) {
  (void)now_ms;
  self_.incarnation += 1;
  self_.state = State::left;
  broadcasts_.enqueue(self_, true);
  // Every live member hears it first-hand, once: O(N) messages, once per node's life. Told to a
  // few, a member the rumour reached late would probe a silent node meanwhile and suspect it.
  // The leaver also goes on answering probes with its record until its process ends (on_message).
  for (uint32_t n = 0; n < table_.size(); ++n)
    if (table_[n].present && live(table_[n].state)) send(out, directory_->address(table_[n].details), Leave{self_});
  left_ = true;
}

void Swim::new_boot(double now_ms, uint64_t boot_id, Output& out) {
  (void)now_ms;
  TEPDIST_CHECK(boot_id != 0 && boot_id != self_.boot_id);
  self_.incarnation += 1;
  self_.boot_id = boot_id;
  broadcasts_.enqueue(self_, true);
  // First-hand to every live member, as a leave is: a member that kept working with the old run
  // (a ring waiting for its chunks) learns of the restart in one message, not by gossip rounds.
  for (uint32_t n = 0; n < table_.size(); ++n)
    if (table_[n].present && live(table_[n].state))
      send(out, directory_->address(table_[n].details), Ping{++seq_, {self_}});
}

void Swim::on_message(double now_ms, const std::string& from, const std::string& from_address, const Body& body,
                      Output& out) {
  if (left_) {
    // Gone but still running: probes are answered with the left record, so the prober marks
    // this node left instead of suspecting a node that stopped acking; nothing else is taken in.
    if (const auto* ping = std::get_if<Ping>(&body); ping && !from_address.empty())
      send(out, from_address, Ack{ping->seq_no, {self_}});
    return;
  }
  auto address_of = [&](const std::string& id) -> std::optional<std::string> {
    if (id == from && !from_address.empty()) return from_address;
    const Known* k = find(id);
    if (!k) return std::nullopt;
    return directory_->address(k->details);
  };
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, Ping>) {
          for (const auto& u : m.updates) merge(now_ms, u, from, out);
          if (auto a = address_of(from)) {
            send(out, *a, Ack{m.seq_no, piggyback()});
            // A member that probes this node but is not live in its view: the rumour of its
            // arrival (or of its refutation) missed this node, and gossip about it may have died
            // out. Push-pull with it at once instead of waiting for the periodic one.
            const Known* k = find(from);
            if (from != self_.id && (!k || !live(k->state)))
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
          // A state sync repairs this node's view; what it brings was gossiped by whoever made the
          // news, and a joiner re-gossiping the thousands of members it just learned would flood
          // every message it sends. Only the sender's own record is first-hand news (a join, or
          // a reconnect across a healed partition), and spreads.
          for (const auto& u : m.members) {
            quiet_ = u.id != from;
            merge(now_ms, u, from, out);
          }
          quiet_ = false;
          if (m.reply && std::isfinite(next_join_ms_)) {
            // The join was answered. Members joining at the same time as this one, whose arrival
            // the seed had not heard of yet, are known from gossip that may have died out before
            // anyone knew to tell this node: one more state sync, once that gossip has spread
            // (about retransmit_limit probe intervals), catches up on them.
            next_join_ms_ = std::numeric_limits<double>::infinity();
            next_push_pull_ms_ = std::min(next_push_pull_ms_, now_ms + retransmit_limit() * config_.probe_interval_ms);
          }
          if (!m.reply)
            if (auto a = address_of(from)) send(out, *a, StateSync{full_state(), true, 0});
        } else if constexpr (std::is_same_v<T, Leave>) {
          // Only a member itself can say it leaves: one node's Leave naming another is refused
          // (the envelope's sender is the authenticated peer).
          if (m.member.id == from && m.member.state == State::left) merge(now_ms, m.member, from, out);
        }
        // Tensors, parameters, control and metrics are not membership's business.
      },
      body);
  // Whatever the message, its sender is running: if this node still holds it suspect, tell it now
  // (at most once a probe interval), so it refutes while the suspicion runs here.
  if (!suspicions_.empty())
    if (const Known* k = find(from); k && k->state == State::suspect) tell_suspect(now_ms, number_of(*k), out, false);
  rush(out, from);
  due_ms_ = std::max(now_ms, next_deadline_ms());
}

// ---- timers --------------------------------------------------------------------------------

void Swim::tell_suspect(double now_ms, uint32_t n, Output& out, bool reminder) {
  auto s = suspicions_.find(n);
  const Known* k = find(n);
  if (s == suspicions_.end() || !k || k->state != State::suspect) return;
  // A message from the suspect prompts one no more often than a probe interval, so a chatty
  // suspect is not answered with a ping per message.
  if (!s->second.tell(now_ms, reminder ? 0 : awareness_.scale(config_.probe_interval_ms))) return;
  auto updates = piggyback();
  updates.insert(updates.begin(), record(n));
  send(out, directory_->address(k->details), Ping{++seq_, std::move(updates)});
}

void Swim::rush(Output& out, const std::string& except) {
  if (!urgent_) return;
  urgent_ = false;
  if (config_.urgent_fanout <= 0 || left_) return;
  const Known* sender = find(except);
  const uint32_t skip = sender ? number_of(*sender) : Directory::none;
  // A ping, not a bare message: the ack brings the receiver's own news back, and a member that
  // missed this one's arrival answers with a state sync (see on_message). Its sequence number
  // matches no probe, so the ack is merged and otherwise ignored.
  for (uint32_t n : random_live(static_cast<size_t>(config_.urgent_fanout), skip))
    send(out, directory_->address(table_[n].details), Ping{++seq_, piggyback()});
}

std::vector<uint32_t> Swim::random_live(size_t count, uint32_t except) {
  std::vector<uint32_t> pool;
  for (uint32_t n = 0; n < table_.size(); ++n)
    if (table_[n].present && table_[n].state == State::alive && n != except) pool.push_back(n);
  for (size_t i = 0; i < pool.size() && i < count; ++i)  // partial Fisher-Yates
    std::swap(pool[i], pool[i + below_(pool.size() - i)]);
  pool.resize(std::min(pool.size(), count));
  return pool;
}

std::optional<uint32_t> Swim::next_probe_target() {
  // A suspicion learned from gossip, nearest its verdict, is checked first: this node's own probe
  // either reaches the suspect (which hears of its suspicion on the ping and refutes on the ack)
  // or confirms it, which brings the verdict nearer (Lifeguard). Waiting for the round-robin to
  // come round, a slow node could hold a rumour through its whole course on nothing but hearsay,
  // and let it run out on a live member or linger on a dead one whose death it never heard of.
  Suspicion* first = nullptr;
  uint32_t target = 0;
  for (auto& [n, s] : suspicions_)
    if (!s.probed() && (!first || s.deadline_ms() < first->deadline_ms())) first = &s, target = n;
  if (first) {
    first->mark_probed();
    return target;
  }
  for (int pass = 0; pass < 2; ++pass) {
    while (probe_index_ < probe_order_.size()) {
      const uint32_t n = probe_order_[probe_index_++];
      if (const Known* k = find(n); k && live(k->state)) return n;
    }
    // A new round: every live member once, in a fresh random order.
    probe_order_.clear();
    for (uint32_t n = 0; n < table_.size(); ++n)
      if (table_[n].present && live(table_[n].state)) probe_order_.push_back(n);
    for (size_t i = probe_order_.size(); i > 1; --i) std::swap(probe_order_[i - 1], probe_order_[below_(i)]);
    probe_index_ = 0;
  }
  return std::nullopt;
}

void Swim::defer_verdicts(double now_ms) {
  awareness_.apply(1);
  // As long as a reply is given to arrive: what came while this node was not running is read
  // within that, and an ack or a refutation among it counts before any verdict.
  const double until = now_ms + awareness_.scale(config_.probe_timeout_ms);
  // Each verdict is deferred by a bounded amount in all (a suspicion by its shortest course, a probe
  // by one interval): a node that is always a little late still reaches it.
  for (auto& [n, s] : suspicions_)
    if (s.deadline_ms() <= now_ms) s.defer(until);
  if (!probe_ || now_ms > probe_->defer_limit_ms) return;
  if (!probe_->indirect_sent && probe_->timeout_ms <= now_ms) {
    // The direct ack gets until then; the indirect probes, if still needed, their whole time after.
    probe_->timeout_ms = until;
    probe_->interval_end_ms = std::max(
        probe_->interval_end_ms, until + awareness_.scale(config_.probe_interval_ms - config_.probe_timeout_ms));
  } else if (probe_->indirect_sent && probe_->interval_end_ms <= now_ms) {
    probe_->interval_end_ms = until;
  }
}

void Swim::tick(double now_ms, Output& out) {
  if (left_) return;
  // How late the driver woke this core, against the deadline it was last given. A healthy driver
  // wakes it within a few ms; a quarter of a (scaled) probe timeout later, this node itself was
  // not running.
  if (now_ms - due_ms_ > awareness_.scale(config_.probe_timeout_ms) / 4) defer_verdicts(now_ms);
  // A join whose state sync (or its answer) was lost: ask again, each probe interval, until a
  // state sync answers. Knowing somebody is not enough: another joiner that picked this node as its
  // seed would otherwise leave the two of them an island.
  if (now_ms >= next_join_ms_) {
    for (const auto& address : seeds_) send(out, address, StateSync{{self_}, false, 0});
    next_join_ms_ = now_ms + config_.probe_interval_ms;
  }
  // Suspicions that ran out: this node's verdict is death, after a last word with the suspect.
  for (auto it = suspicions_.begin(); it != suspicions_.end();) {
    if (it->second.deadline_ms() > now_ms) {
      ++it;
      continue;
    }
    if (!it->second.last_call() && !it->second.accused_by(self_.id)) {
      // A verdict on hearsay alone (this node's own probe never failed to reach the suspect) waits
      // for a last word: the suspect is told once more and given a probe timeout to answer; a live
      // one refutes on the ack, or its refutation, which this node missed, rides back on it. One
      // ping per suspicion per node, where reminding every suspect each interval would flood a
      // slow node that everyone suspects with pings it cannot keep up with.
      it->second.mark_last_call();
      it->second.defer(now_ms + awareness_.scale(config_.probe_timeout_ms));
      tell_suspect(now_ms, it->first, out, true);
      ++it;
      continue;
    }
    Known* k = find(it->first);
    it = suspicions_.erase(it);
    if (k && k->state == State::suspect) declare(now_ms, *k, State::dead, out);
  }
  // The probe in flight.
  if (probe_) {
    const uint32_t n = probe_->target;
    Known* target = find(n);
    if (!target || !live(target->state)) {
      probe_.reset();
    } else if (!probe_->indirect_sent && now_ms >= probe_->timeout_ms) {
      probe_->indirect_sent = true;
      // The indirect probes get their whole time from when they go out, however late this is:
      // this node's lateness is never held against the member it probes.
      probe_->interval_end_ms =
          std::max(probe_->interval_end_ms, now_ms + awareness_.scale(config_.probe_interval_ms - config_.probe_timeout_ms));
      const Member about = record(n);
      for (uint32_t via : random_live(static_cast<size_t>(config_.indirect_checks), n))
        send(out, directory_->address(table_[via].details), PingReq{probe_->seq, about, piggyback()});
    } else if (now_ms >= probe_->interval_end_ms) {
      const uint64_t probe_incarnation = probe_->incarnation;
      probe_.reset();
      // A missed ack hints that this node is the slow one, unless others already suspect the
      // target: checking a suspicion that is true says nothing of this node's health, and if it
      // did, every node checking a dead one would slow its own probes and gossip of the death.
      if (target->state == State::alive && target->incarnation > probe_incarnation) {
        // The target refuted a suspicion while this probe was out: that is word from it newer than
        // the probe, not a new silence to accuse it of (memberlist suspects the incarnation its
        // probe saw, and a newer one makes that suspicion stale). Suspecting the new incarnation
        // here started a fresh full course against a member that had just shown it lives, and
        // once refutations spread fast, one came in nearly every probe of a loaded node.
      } else if (target->state == State::alive) {
        awareness_.apply(1);
        suspect(now_ms, *target, self_.id, out);
        // Lifeguard's buddy system: tell the accused at once (the suspicion is the newest news, so
        // it rides first), so a live member can refute before its suspicion runs out.
        send(out, directory_->address(table_[n].details), Ping{++seq_, piggyback()});
      } else if (auto s = suspicions_.find(n); s != suspicions_.end() && s->second.confirm(self_.id)) {
        // A suspect this node's own probe could not reach either: an independent confirmation,
        // which shortens the suspicion here and, gossiped, everywhere (Lifeguard). Without it a
        // suspicion that only one member raised runs its longest course on every node.
        Member news = record(n);
        news.accuser = self_.id;
        spread(news);
      }
    }
  }
  // The next probe.
  if (!probe_ && now_ms >= next_probe_ms_) {
    next_probe_ms_ = now_ms + awareness_.scale(config_.probe_interval_ms);
    if (auto n = next_probe_target()) {
      probe_ = Probe{++seq_, *n, now_ms + awareness_.scale(config_.probe_timeout_ms), next_probe_ms_};
      probe_->defer_limit_ms = next_probe_ms_ + awareness_.scale(config_.probe_interval_ms);
      probe_->incarnation = table_[*n].incarnation;
      auto updates = piggyback();
      // Lifeguard's buddy system: probing a suspect always tells it so, whatever the gossip
      // budget has left, so a live member learns of its suspicion from everyone who probes it.
      if (table_[*n].state == State::suspect) updates.insert(updates.begin(), record(*n));
      send(out, directory_->address(table_[*n].details), Ping{probe_->seq, std::move(updates)});
    }
  }
  // Lifeguard's buddy system, kept up: each probe interval, one member this node suspects is told
  // so again. A live one refutes, or, if it refuted already, gossips its refutation anew (see
  // merge), and the answer rides back on the ack: a suspicion that missed the refutation while it
  // was being gossiped cannot run out on a live member.
  if (!suspicions_.empty() && now_ms >= next_reminder_ms_) {
    next_reminder_ms_ = now_ms + awareness_.scale(config_.probe_interval_ms);
    // One suspect an interval: the one nearest its verdict that was not told within the interval
    // (a random one could leave a live suspect untold through its whole suspicion while the
    // draws went to the dead).
    const Suspicion* nearest = nullptr;
    uint32_t target = 0;
    for (const auto& [n, s] : suspicions_)
      if (s.told_before(now_ms - awareness_.scale(config_.probe_interval_ms)) &&
          (!nearest || s.deadline_ms() < nearest->deadline_ms()))
        nearest = &s, target = n;
    if (nearest) tell_suspect(now_ms, target, out, true);
  }
  for (auto it = relays_.begin(); it != relays_.end();) it = it->second.expires_ms <= now_ms ? relays_.erase(it) : ++it;
  // Push-pull with one random member.
  if (now_ms >= next_push_pull_ms_) {
    next_push_pull_ms_ = now_ms + push_pull_delay_ms();
    for (uint32_t n : random_live(1, Directory::none))
      send(out, directory_->address(table_[n].details), StateSync{full_state(), false, 0});
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
    // Only if it is still dead at the incarnation it was declared at: one that came back since
    // (which takes a higher incarnation) and died again has a later entry of its own.
    const auto [n, incarnation] = forget_at_.begin()->second;
    Known* k = find(n);
    if (k && !live(k->state) && k->incarnation == incarnation) *k = Known{};
    forget_at_.erase(forget_at_.begin());
  }
  rush(out, self_.id);
  due_ms_ = std::max(now_ms, next_deadline_ms());  // the deadline the driver is now given
}

double Swim::next_deadline_ms() const {
  if (left_) return std::numeric_limits<double>::infinity();
  // The next probe waits for the one in flight, whose end may lie past next_probe_ms_ (the
  // indirect probes get their whole time).
  double next = std::min(next_push_pull_ms_, next_join_ms_);
  next = std::min(next, !probe_ ? next_probe_ms_ : probe_->indirect_sent ? probe_->interval_end_ms : probe_->timeout_ms);
  if (!unreachable_.empty()) next = std::min(next, next_reconnect_ms_);
  if (!suspicions_.empty()) next = std::min(next, next_reminder_ms_);
  for (const auto& [id, s] : suspicions_) next = std::min(next, s.deadline_ms());
  for (const auto& [seq, r] : relays_) next = std::min(next, r.expires_ms);
  if (!forget_at_.empty()) next = std::min(next, forget_at_.begin()->first);
  return next;
}

}  // namespace tepdist::gossip::swim

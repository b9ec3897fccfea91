#include "elastic/job_control.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>

#include "elastic/coordination.hpp"
#include "elastic/placement.hpp"
#include "elastic/progress.hpp"

namespace tepdist::elastic {

using gossip::GenerationVote;
using gossip::JobStart;
using gossip::Member;

namespace {

const Member* find(const std::vector<Member>& view, const std::string& id) {
  const auto it = std::find_if(view.begin(), view.end(), [&](const Member& m) { return m.id == id; });
  return it == view.end() ? nullptr : &*it;
}

/// Whether the record's worker i is live in the run the record names, as `view` sees it.
bool live_in_run(const JobStart& record, size_t i, const std::vector<Member>& view) {
  const Member* m = find(view, record.workers[i]);
  if (!m) return true;  // not known here yet: gossip has not brought it
  if (!is_live(*m)) return false;
  const uint64_t boot = i < record.worker_boot_ids.size() ? record.worker_boot_ids[i] : 0;
  return !boot || !m->boot_id || boot == m->boot_id;
}

}  // namespace

const std::string* worker_address(const JobStart& record, const std::string& id) {
  const auto it = std::find(record.workers.begin(), record.workers.end(), id);
  if (it == record.workers.end()) return nullptr;
  const auto i = static_cast<size_t>(it - record.workers.begin());
  return i < record.addresses.size() ? &record.addresses[i] : nullptr;
}

uint64_t worker_boot(const JobStart& record, const std::string& id) {
  const auto it = std::find(record.workers.begin(), record.workers.end(), id);
  if (it == record.workers.end()) return ~uint64_t{0};
  const auto i = static_cast<size_t>(it - record.workers.begin());
  return i < record.worker_boot_ids.size() ? record.worker_boot_ids[i] : 0;
}

bool same_rank0(const JobStart& a, const JobStart& b) {
  return !a.workers.empty() && !b.workers.empty() && a.workers[0] == b.workers[0] &&
         worker_boot(a, a.workers[0]) == worker_boot(b, b.workers[0]);
}

std::string job_duty_holder(const JobStart& record, const std::vector<Member>& view,
                            const std::map<std::string, uint64_t>& excluded) {
  LowestLiveId rule;
  for (size_t i = 0; i < record.workers.size(); ++i) {
    const auto out = excluded.find(record.workers[i]);
    const uint64_t boot = i < record.worker_boot_ids.size() ? record.worker_boot_ids[i] : 0;
    const bool evicted = out != excluded.end() && (out->second == boot || !out->second || !boot);
    rule.offer(record.workers[i], !evicted && live_in_run(record, i, view));
  }
  return rule.holder() ? *rule.holder() : std::string();
}

Roster desired_roster(const JobStart& record, const std::vector<Member>& view,
                      const std::map<std::string, uint64_t>& excluded) {
  std::vector<std::tuple<std::string, std::string, uint64_t, std::string>> rows;
  for (const auto& m : view) {
    const auto out = excluded.find(m.id);
    if (out != excluded.end() && (out->second == m.boot_id || !out->second || !m.boot_id)) continue;
    if (is_live(m) && has_role(m, "worker")) rows.emplace_back(m.id, m.address, m.boot_id, m.region);
  }
  for (size_t i = 0; i < record.workers.size(); ++i)
    if (!find(view, record.workers[i]) && !excluded.contains(record.workers[i]))
      rows.emplace_back(record.workers[i], record.addresses[i],
                        i < record.worker_boot_ids.size() ? record.worker_boot_ids[i] : 0,
                        i < record.worker_regions.size() ? record.worker_regions[i] : std::string());
  std::sort(rows.begin(), rows.end());
  Roster r;
  for (auto& [id, address, boot, region] : rows) {
    r.ids.push_back(id);
    r.addresses.push_back(address);
    r.boot_ids.push_back(boot);
    r.regions.push_back(region);
  }
  return r;
}

JobControl::JobControl(Options options) : o_(std::move(options)) {}

void JobControl::adopt(const JobStart& record) {
  record_ = record;
  if (record_.generation == 0) record_.generation = 1;
  promised_ = std::max(promised_, record_.generation);
  highest_seen_ = std::max(highest_seen_, record_.generation);
}

std::string JobControl::duty_holder() const { return job_duty_holder(record_, view_, excluded_); }

bool JobControl::holds_duty() const { return has_record() && duty_holder() == o_.self; }

GenerationVote JobControl::ack_of(uint64_t number, const Local& mine) const {
  GenerationVote v{record_.job_id, GenerationVote::Kind::ack, number, record_.generation};
  v.progress = mine.progress;
  v.has_state = mine.has_state;
  v.boot_id = o_.boot_id;
  v.cursors = mine.cursors;
  v.held_shards = mine.held_shards;
  return v;
}

void JobControl::on_view(double now, const std::vector<Member>& view, const Local& mine, Output& out) {
  view_ = view;
  if (!holds_duty() || now < quiet_until_) return;
  const Roster want = desired_roster(record_, view_, excluded_);
  const bool differs = want.ids != record_.workers || want.boot_ids != record_.worker_boot_ids;
  // A proposal under way for another roster is superseded at once: waiting for the acks of a
  // worker that is gone would only run into the retry.
  if (proposal_ ? proposal_->roster != want : differs) propose(now, mine, out);
}

void JobControl::on_tick(double now, const Local& mine, Output& out) {
  if (left_out_) {
    // Said again while left out (the duty holder may have changed, or the vote been lost).
    if (back_said_at_ < 0) {
      back_said_at_ = now;
    } else if (now - back_said_at_ >= o_.retry_ms) {
      say_back(out);
      back_said_at_ = now;
    }
  }
  on_local(now, mine, out);
  if (paused() && !promised_to_.empty() && !mine.shards_unplaced && now - promised_at_ >= o_.retry_ms) {
    // The install may have been lost: the proposer answers a repeated ack with its record. The
    // duty holder hears it too: should the proposer have lost the duty, it proposes anew.
    GenerationVote a = ack_of(promised_, mine);
    a.job_id = record_.job_id ? record_.job_id : job_id_;
    out.sends.emplace_back(promised_to_, a);
    if (has_record()) {
      const std::string holder = duty_holder();
      if (const auto* address = worker_address(record_, holder); address && holder != o_.self && *address != promised_to_)
        out.sends.emplace_back(*address, a);
    }
    promised_at_ = now;
  }
  if (o_.rebalance && has_record() && !left_out_ && !paused()) note_rates(now, mine);
  if (!holds_duty() || now < quiet_until_) return;
  // This node's own promise with no proposal behind it (its proposal was given up below
  // min_workers, or overtaken): it proposes again rather than leave the others waiting.
  if (paused() && !proposal_ && promised_to_.empty()) return propose(now, mine, out);
  if (proposal_ && now - proposal_->at >= o_.retry_ms) {
    out.log.push_back(fmt::format("generation {} was not installed within {:.0f} ms; proposing again",
                                  proposal_->number, o_.retry_ms));
    return propose(now, mine, out);
  }
  if (proposal_ && now - proposal_->sent_at >= o_.resend_ms) {
    // One silent worker holds the install back (every worker of the roster acks it), so those
    // that have not acked are sent it again rather than waiting out the retry: the same proposal,
    // which they ack again if they promised it already.
    auto& p = *proposal_;
    for (size_t i = 0; i < p.roster.ids.size(); ++i)
      if (p.roster.ids[i] != o_.self && !p.acks.contains(p.roster.ids[i]) && !p.refused.contains(p.roster.ids[i]))
        out.sends.emplace_back(p.roster.addresses[i], p.vote);
    p.sent_at = now;
  }
  // A change the last install did not cover (it came while the proposal was out), or a roster
  // that was too small before.
  if (!proposal_) on_view(now, view_, mine, out);
  // A generation of the same workers: for a decay of the rate this node decided, or for workers
  // that would end far apart. Neither while a roster below min_workers keeps every proposal back
  // (said once, in propose). No generation for a decay once no list has a position left: it
  // would change no step (rank 0's lagging evaluations decided several at an async job's end,
  // each placing every shard again); a later generation, should one come, carries it.
  const bool decay = rate_factor_ > 0 && rate_factor_ != record_.lr_factor && positions_left();
  const bool release = release_.epochs > record_.released_epochs;
  if ((!decay && !release && !o_.rebalance) || proposal_ || paused() ||
      desired_roster(record_, view_, excluded_).ids.size() < std::max<size_t>(1, o_.min_workers))
    return;
  if (decay) {
    out.log.push_back(fmt::format("the rate decays to {:.4g} of its schedule's (a plateau)", rate_factor_));
    return propose(now, mine, out);
  }
  if (release) {
    out.log.push_back(fmt::format("the submitter released epoch {}", release_.epochs));
    return propose(now, mine, out);
  }
  if (const auto why = imbalance(now); !why.empty()) {
    out.log.push_back(why);
    propose(now, mine, out);
  }
}

void JobControl::release(double now, uint32_t epochs, const Local& mine, Output& out) {
  release(now, gossip::Release{epochs}, mine, out);
}

void JobControl::release(double now, gossip::Release release, const Local& mine, Output& out) {
  // A repeat, or one a record carries.
  if (release.epochs <= std::max(release_.epochs, record_.released_epochs)) return;
  release_ = std::move(release);
  on_tick(now, mine, out);
}

double JobControl::Rate::per_ms() const {
  if (!(last_at > first_at)) return 0;
  const double ms = last_at - first_at, busy_ms = last_busy_ms - first_busy_ms;
  const uint64_t moved = last - first, busy = std::min(moved, last_busy - first_busy);
  // Without the time evaluations were under way, where enough is left to measure: an evaluation
  // sharing this worker's core slows it for a while, and the rate is for what follows.
  if (busy_ms > 0 && ms - busy_ms >= ms / 4) return static_cast<double>(moved - busy) / (ms - busy_ms);
  return static_cast<double>(moved) / ms;
}

double JobControl::measured_rate(const std::string& id) const {
  const auto it = rates_.find(id);
  if (it == rates_.end() || it->second.last_at - it->second.first_at < o_.rebalance_window_ms / 2) return 0;
  return it->second.per_ms();
}

double JobControl::evaluations_ms(uint64_t epoch_parts, uint64_t positions) const {
  const auto& e = evaluations_;
  const uint64_t count = (e.at_epoch_ends && epoch_parts > 0 ? epoch_parts - 1 : 0) + (e.every ? positions / e.every : 0);
  return static_cast<double>(count) * e.cost_ms;
}

void JobControl::note_rates(double now, const Local& mine) {
  if (installed_at_ < 0) installed_at_ = now;
  evaluations_ = mine.evaluations;
  auto note = [&](const std::string& id, uint64_t cursor, double busy_ms, uint64_t busy) {
    auto& r = rates_[id];
    if (r.first_at < 0) r.first_at = now, r.first = cursor, r.first_busy_ms = busy_ms, r.first_busy = busy;
    if (cursor > r.last || r.last_at < 0)
      r.last_at = now, r.last = std::max(r.last, cursor), r.last_busy_ms = busy_ms, r.last_busy = busy;
  };
  note(o_.self, mine.progress.position, mine.evaluations.busy_ms, mine.evaluations.busy_positions);
  for (const auto& [id, cursor] : mine.cursors) note(id, cursor, 0, 0);
}

std::string JobControl::imbalance(double now) const {
  if (record_.spans.empty() || installed_at_ < 0 || now - installed_at_ < o_.rebalance_window_ms) return {};
  // This node's evaluation under way: what it costs is known once it is over (not for long).
  const double evaluating_ms = evaluations_.under_way_ms;
  if (evaluating_ms > 0 && evaluating_ms < o_.rebalance_window_ms / 2) return {};
  double longest = 0, shortest = std::numeric_limits<double>::infinity();
  std::string ends;
  for (size_t i = 0; i < record_.workers.size() && i < record_.spans.size(); ++i) {
    // Every worker's rate, or nothing is decided.
    const double rate = measured_rate(record_.workers[i]);
    if (!(rate > 0)) return {};
    const auto& id = record_.workers[i];
    const Spans rest = rest_of(id);
    const double evaluating =
        id == o_.self && !rest.empty() ? evaluations_ms(epoch_changes(rest) + 1, span_total(rest)) : 0;
    const double end_ms = static_cast<double>(span_total(rest)) / rate + evaluating - (now - rates_.at(id).last_at);
    longest = std::max(longest, end_ms);
    shortest = std::min(shortest, std::max(0.0, end_ms));
    ends += fmt::format("{}{} {:.1f} s at {:.0f}/s", ends.empty() ? "" : ", ", id, end_ms / 1000, rate * 1000);
    if (evaluating > 0) ends += fmt::format(" with {:.1f} s of evaluations", evaluating / 1000);
  }
  if (ends.empty() || longest < o_.rebalance_window_ms || longest - shortest <= o_.rebalance_gap * longest) return {};
  return fmt::format("rebalancing generation {}: its workers would end {:.1f} s apart ({})", record_.generation,
                     (longest - shortest) / 1000, ends);
}

bool JobControl::positions_left() const {
  if (record_.spans.empty()) return true;  // sync: no lists, its steps go on to the job's end
  return std::any_of(record_.spans.begin(), record_.spans.end(),
                     [](const auto& list) { return span_total(spans_of(list)) > 0; });
}

Spans JobControl::rest_of(const std::string& id) const {
  const auto i = static_cast<size_t>(std::find(record_.workers.begin(), record_.workers.end(), id) - record_.workers.begin());
  if (i >= record_.spans.size()) return {};
  const auto it = rates_.find(id);
  return rest_after(spans_of(record_.spans[i]), it == rates_.end() ? 0 : it->second.last);
}

std::vector<double> JobControl::weights_for(const Roster& roster) const {
  std::vector<double> out;
  double sum = 0;
  size_t known = 0;
  for (const auto& id : roster.ids) {
    out.push_back(measured_rate(id));
    // This node's evaluations still to come take from its training: its weight is its rate over
    // what it has left with them. Its list will hold a part of every epoch the rests hold.
    if (id == o_.self && out.back() > 0 && evaluations_.cost_ms > 0) {
      std::set<uint64_t> epochs;
      for (const auto& w : record_.workers)
        for (const auto& s : rest_of(w)) epochs.insert(s.epoch);
      const uint64_t left = span_total(rest_of(id));
      const double ms = static_cast<double>(left) / out.back();
      if (left > 0) out.back() = static_cast<double>(left) / (ms + evaluations_ms(epochs.size(), left));
    }
    if (out.back() > 0) sum += out.back(), ++known;
  }
  if (known == 0) return {};
  for (auto& w : out)
    if (!(w > 0)) w = sum / static_cast<double>(known);
  return out;
}

void JobControl::propose(double now, const Local& mine, Output& out) {
  Roster want = desired_roster(record_, view_, excluded_);
  if (want.ids.size() < std::max<size_t>(1, o_.min_workers)) {
    const auto why = fmt::format("{} live workers, fewer than elastic.min_workers = {}", want.ids.size(), o_.min_workers);
    if (why != waiting_) out.log.push_back("not proposing a generation: " + why);
    waiting_ = why;
    proposal_.reset();
    return;
  }
  waiting_.clear();
  stalled_.clear();
  Proposal p;
  p.number = std::max(highest_seen_, promised_) + 1;
  p.at = p.sent_at = now;
  p.roster = std::move(want);
  if (o_.rebalance) p.weights = weights_for(p.roster);
  highest_seen_ = p.number;
  out.log.push_back(fmt::format("proposing generation {} after {}: {} workers", p.number, record_.generation,
                                p.roster.ids.size()));
  p.vote = GenerationVote{record_.job_id, GenerationVote::Kind::propose, p.number, record_.generation, p.roster.ids};
  for (size_t i = 0; i < p.roster.ids.size(); ++i)
    if (p.roster.ids[i] != o_.self) out.sends.emplace_back(p.roster.addresses[i], p.vote);
  proposal_ = std::move(p);
  // The proposer is a worker of its own proposal (it holds the duty, so it is live in the roster).
  if (std::find(proposal_->roster.ids.begin(), proposal_->roster.ids.end(), o_.self) != proposal_->roster.ids.end()) {
    promised_ = proposal_->number;
    promised_from_ = o_.self;
    promised_to_.clear();  // a promise to itself
    out.paused = true;
    ack_withheld_ = mine.shards_unplaced;  // on_local acks it
    if (!ack_withheld_) on_ack(o_.self, ack_of(proposal_->number, mine), out);
  }
}

void JobControl::ack_promise(double now, const std::string& from, const GenerationVote& vote, const Local& mine,
                             Output& out) {
  promised_at_ = now;
  promised_to_.clear();
  const Member* m = find(view_, from);
  if (!m) return out.log.push_back(fmt::format("cannot ack generation {}: {} is not in this view", vote.number, from));
  promised_to_ = m->address;
  if (mine.shards_unplaced) {
    if (!std::exchange(ack_withheld_, true))
      out.log.push_back(fmt::format("acking generation {} once this node's shard host has placed generation {}",
                                    vote.number, record_.generation));
    return;
  }
  ack_withheld_ = false;
  GenerationVote a = ack_of(vote.number, mine);
  a.job_id = vote.job_id;
  out.sends.emplace_back(m->address, std::move(a));
}

void JobControl::on_local(double now, const Local& mine, Output& out) {
  if (!ack_withheld_ || mine.shards_unplaced) return;
  ack_withheld_ = false;
  if (!paused()) return;
  if (promised_from_ == o_.self) {
    if (proposal_ && proposal_->number == promised_) on_ack(o_.self, ack_of(promised_, mine), out);
    return;
  }
  if (promised_to_.empty()) return;
  GenerationVote a = ack_of(promised_, mine);
  a.job_id = record_.job_id ? record_.job_id : job_id_;
  out.sends.emplace_back(promised_to_, std::move(a));
  promised_at_ = now;
}

void JobControl::on_vote(double now, const std::string& from, const GenerationVote& vote, const Local& mine,
                         Output& out) {
  if (has_record() && vote.job_id != record_.job_id) return;
  // Numbers grow by one per proposal: one near the top of the range is garbage, not a generation.
  if (vote.number > (uint64_t{1} << 62)) return;
  if (!has_record()) job_id_ = vote.job_id;
  highest_seen_ = std::max(highest_seen_, vote.number);
  switch (vote.kind) {
    case GenerationVote::Kind::propose: {
      auto refuse = [&](std::string why) {
        out.log.push_back(fmt::format("refused generation {} from {}: {}", vote.number, from, why));
        GenerationVote r{vote.job_id, GenerationVote::Kind::refuse, std::max(promised_, record_.generation),
                         record_.generation};
        r.reason = std::move(why);
        const Member* m = find(view_, from);
        if (m) out.sends.emplace_back(m->address, std::move(r));
      };
      if (has_record() && vote.base < record_.generation) {
        // The proposer missed an install: it learns it here (and, if not a worker of it, drops out).
        if (const Member* m = find(view_, from)) out.sends.emplace_back(m->address, record_);
        return refuse(fmt::format("it builds on generation {}, and {} is installed here", vote.base, record_.generation));
      }
      if (vote.number == promised_ && vote.number > record_.generation && from == promised_from_ && from != o_.self) {
        // The proposal this node promised, sent again: its ack was lost, or could not be sent
        // (the proposer was not in this view yet). A proposer makes one proposal per number, so
        // this acks nothing new.
        return ack_promise(now, from, vote, mine, out);
      }
      if (vote.number <= promised_)
        return refuse(fmt::format("generation {} is promised or installed here", promised_));
      if (std::find(vote.workers.begin(), vote.workers.end(), o_.self) == vote.workers.end())
        return refuse(fmt::format("{} is not among its workers", o_.self));
      promised_ = vote.number;
      promised_from_ = from;
      out.paused = true;
      // Another node's proposal won here: this node's own, if any, is over, and it stays quiet for
      // a retry period (two nodes whose views disagree for a moment must not outbid each other).
      if (from != o_.self) {
        proposal_.reset();
        quiet_until_ = now + o_.retry_ms;
      }
      return ack_promise(now, from, vote, mine, out);
    }
    case GenerationVote::Kind::ack:
      // A worker still waiting on a promise made to a proposer that lost the duty (or whose
      // proposal died with it): the duty holder takes it up with a proposal above it.
      if (!proposal_ && holds_duty() && vote.number > record_.generation && now >= quiet_until_) {
        out.log.push_back(fmt::format("{} waits on generation {}, which nobody is proposing; proposing above it", from,
                                      vote.number));
        return propose(now, mine, out);
      }
      return on_ack(from, vote, out);
    case GenerationVote::Kind::evict:
      if (vote.workers.size() != 1) return;
      if (vote.workers[0] == from) {
        // A member asks to be left out itself: it cannot run the job (a joiner whose setup
        // failed), and says so to every proposal that names it. Its run is passed over from now.
        if (!has_record()) return;
        excluded_[from] = vote.boot_id;
        strikes_[from] = {vote.boot_id, max_strikes, false, true};  // never taken back by `back`: only a new run comes back
        if (!vote.held_shards.empty() && std::ranges::count(record_.workers, from) &&
            vote.held_shards.size() <= record_.shards) {
          // A graceful async leaver: it stays until the next generation has its shards.
          handover_[from] = vote.held_shards;
          out.log.push_back(fmt::format("{} leaves: left out, handing over {} shard(s)", from, vote.held_shards.size()));
        } else {
          out.log.push_back(fmt::format("{} cannot run the job: left out", from));
        }
        if (holds_duty() && ((proposal_ && std::ranges::count(proposal_->roster.ids, from)) ||
                             std::ranges::count(record_.workers, from))) {
          quiet_until_ = 0;
          propose(now, mine, out);
        }
        return;
      }
      if (vote.number != record_.generation) return;
      if (std::find(record_.workers.begin(), record_.workers.end(), from) == record_.workers.end()) return;
      // Sent to the duty holder as the sender sees it, which may be this node only once the
      // accused (the holder until now) is passed over: judged after the exclusion, never sent on.
      out.log.push_back(fmt::format("{} asks to leave {} out: it blocks the ring", from, vote.workers[0]));
      return evict(now, vote.workers[0], mine, out, false);
    case GenerationVote::Kind::back: {
      // A worker this node evicted takes messages again: it is passed over no longer, and the
      // duty holder proposes it as a joiner (it pulls the state). Only from the run evicted.
      const auto it = excluded_.find(from);
      if (it == excluded_.end() || (it->second && vote.boot_id && it->second != vote.boot_id)) return;
      if (auto& strikes = strikes_[from]; strikes.count >= max_strikes) {
        // Evicted that often in this run: whatever blocks it is not passing (or it cannot run the
        // job at all). It stays out until it runs with another boot id.
        if (!std::exchange(strikes.told, true))
          out.log.push_back(strikes.asked ? fmt::format("{} takes messages again, but asked to be left out: left out "
                                                        "until it restarts",
                                                        from)
                                          : fmt::format("{} runs again, but was evicted {} times: left out until it "
                                                        "restarts",
                                                        from, max_strikes));
        return;
      }
      excluded_.erase(it);
      out.log.push_back(fmt::format("{} runs again: no longer left out", from));
      if (holds_duty() && !proposal_ && now >= quiet_until_) on_view(now, view_, mine, out);
      return;
    }
    case GenerationVote::Kind::refuse:
      if (!proposal_ || !holds_duty()) return;
      out.log.push_back(fmt::format("{} refused generation {}: {}", from, proposal_->number, vote.reason));
      // Someone promised or installed a higher number: propose above it at once. The same number is
      // a rival proposal: the retry will do (a member that installed a newer generation also sends
      // it here, and that install ends this proposal).
      if (vote.number > proposal_->number) return propose(now, mine, out);
      proposal_->refused.insert(from);
      return;
  }
}

void JobControl::on_ack(const std::string& from, const GenerationVote& vote, Output& out) {
  if (has_record() && vote.number <= record_.generation && from != o_.self) {
    // An ack repeated by a worker that missed the install (or of a proposal overtaken since):
    // the record tells it where the job stands.
    if (const auto* address = worker_address(record_, from)) out.sends.emplace_back(*address, record_);
    else if (const Member* m = find(view_, from)) out.sends.emplace_back(m->address, record_);
    return;
  }
  if (!proposal_ || vote.number != proposal_->number) return;
  const auto& ids = proposal_->roster.ids;
  if (std::find(ids.begin(), ids.end(), from) == ids.end()) return;
  proposal_->acks[from] = vote;
  try_install(out);
}

std::string JobControl::gone_why(const Proposal& p, const std::string& id,
                                 const std::function<bool(const gossip::GenerationVote&)>& holds) const {
  const auto at = std::find(record_.workers.begin(), record_.workers.end(), id);
  const size_t i = static_cast<size_t>(at - record_.workers.begin());
  const uint64_t boot = at != record_.workers.end() && i < record_.worker_boot_ids.size() ? record_.worker_boot_ids[i] : 0;
  const Member* m = find(view_, id);
  const auto ack = p.acks.find(id);
  const auto other_run = [&](uint64_t b) { return boot && b && b != boot; };
  if (m && m->state == Member::State::left) return "left";
  if ((m && is_live(*m) && other_run(m->boot_id)) || (ack != p.acks.end() && other_run(ack->second.boot_id)))
    return "restarted";
  // It asked this duty holder to leave it out (a joiner that declined the job, a drain): live, but
  // in no roster, so it acks nothing, and it holds nothing it has not handed over. Waiting for it
  // would be for ever. (A worker evicted for blocking the ring may hold its state and come back.)
  if (const auto out = excluded_.find(id); out != excluded_.end() && (!m || !out->second || out->second == m->boot_id))
    if (const auto st = strikes_.find(id); st != strikes_.end() && st->second.asked) return "left out";
  if (ack != p.acks.end() && !holds(ack->second)) return "holds none";
  // Dead on a cluster that cannot be partitioned is gone; with a majority quorum it may be the
  // other side of a partition, holding the state.
  if (m && m->state == Member::State::dead && o_.quorum == Quorum::any) return "dead";
  return {};  // it may hold it: not heard from, suspect, or dead across a partition
}

std::string JobControl::state_gone(const Proposal& p) const {
  std::string gone;
  for (const auto& id : record_.workers) {
    const auto what = gone_why(p, id, [](const gossip::GenerationVote& v) { return v.has_state; });
    if (what.empty()) return {};
    gone += fmt::format("{}{} {}", gone.empty() ? "" : ", ", id, what);
  }
  return gone;
}

JobControl::ShardsUnheld JobControl::shards_unheld(const Proposal& p, const std::vector<std::string>& sources) const {
  ShardsUnheld out;
  const auto holders = place_shards(record_.shards, record_.workers, o_.replication, record_.worker_regions);
  for (uint32_t s = 0; s < record_.shards; ++s) {
    if (s < sources.size() && !sources[s].empty()) continue;
    // Who may hold it: its holders in the installed generation, and the source they were to
    // fetch it from (should they still be fetching, that one still holds it).
    std::vector<std::string> may = holders[s];
    if (s < record_.shard_sources.size() && !record_.shard_sources[s].empty() &&
        !std::ranges::count(may, record_.shard_sources[s]))
      may.push_back(record_.shard_sources[s]);
    std::string gone, unheard;
    for (const auto& id : may) {
      const auto what = gone_why(p, id, [s](const gossip::GenerationVote& v) {
        return std::ranges::any_of(v.held_shards, [s](const auto& h) { return h.first == s; });
      });
      auto& list = what.empty() ? unheard : gone;
      list += fmt::format("{}{}{}", list.empty() ? "" : ", ", id, what.empty() ? "" : ": " + what);
    }
    if (!unheard.empty()) {
      if (out.waiting.empty()) out.waiting = fmt::format("shard {} (held by {})", s, unheard);
    } else if (out.lost.size() < 512) {
      out.lost += fmt::format("{}shard {} (held by {})", out.lost.empty() ? "" : "; ", s, gone);
    }
  }
  return out;
}

void JobControl::try_install(Output& out) {
  auto& p = *proposal_;
  if (p.acks.size() < p.roster.ids.size()) return;
  // The quorum: acks from the previous generation's workers, in the run it names. Workers that
  // left gracefully are no longer counted, nor those seen back in another run (a restart): their
  // old run is over, so no other side of a partition can count on it either. A worker of that run
  // counts whether or not it holds the state: the quorum is there so that two sides cannot both
  // go on, and any two majorities of one roster share a voter. Holding state decides where the
  // next generation resumes and who its donors are, not whether it may be installed. (Counting
  // only holders stalled elastic_churn seed 279 for good: 4 holders of 9 workers were never 5.)
  size_t base = 0, acked = 0;
  gossip::JobProgress resume;
  bool any_state = false;
  std::vector<std::string> counted;
  for (size_t i = 0; i < record_.workers.size(); ++i) {
    const auto& id = record_.workers[i];
    const Member* m = find(view_, id);
    const uint64_t boot = i < record_.worker_boot_ids.size() ? record_.worker_boot_ids[i] : 0;
    if (m && (m->state == Member::State::left || (is_live(*m) && boot && m->boot_id && m->boot_id != boot))) continue;
    if (handover_.contains(id)) continue;  // leaving, as gracefully: it takes part in no other side
    ++base;
    const auto it = p.acks.find(id);
    if (it == p.acks.end()) continue;
    if (boot && it->second.boot_id && boot != it->second.boot_id) continue;  // restarted: its state is gone
    ++acked;
    if (!it->second.has_state) continue;
    counted.push_back(id);
    if (!any_state || it->second.progress.step > resume.step) resume = it->second.progress;
    any_state = true;
  }
  if (!any_state)
    if (auto gone = state_gone(p); !gone.empty()) {
      out.lost = fmt::format("no worker holds the job's state any more ({}); without a checkpoint it cannot resume",
                             gone);
      out.log.push_back(fmt::format("generation {}: {}", p.number, out.lost));
      proposal_.reset();
      return;
    }
  const size_t need = o_.quorum == Quorum::majority ? base / 2 + 1 : std::min<size_t>(1, base);
  if (acked < need) {
    stalled_ = fmt::format("generation {} has {} of the {} acks it needs from generation {}'s {} workers (the "
                           "other side of a partition, or a quorum lost)",
                           p.number, acked, need, record_.generation, base);
    out.log.push_back(fmt::format("{}; waiting", stalled_));
    return;
  }
  if (!any_state) {
    stalled_ = fmt::format("generation {}: no acking worker holds the job's state; waiting for one that may", p.number);
    out.log.push_back(stalled_);
    return;
  }
  // The workers without state count so that a generation whose joiners have not pulled yet can be
  // followed, not so that it can be undone: a quorum that only they complete must resume where the
  // installed generation did, or further. (Holders behind that point missed its install; the one
  // ahead may be across a partition.) A quorum of holders goes on as before.
  if (counted.size() < need && resume.step < record_.resume.step) {
    out.log.push_back(fmt::format("generation {}: its quorum's holders are at step {}, behind generation {}'s start "
                                  "at {}; waiting for a holder from there",
                                  p.number, resume.step, record_.generation, record_.resume.step));
    return;
  }
  JobStart next = record_;
  next.workers = p.roster.ids;
  next.addresses = p.roster.addresses;
  next.worker_boot_ids = p.roster.boot_ids;
  next.worker_regions = p.roster.regions;
  next.generation = p.number;
  next.coordinator = o_.self;
  next.coordinator_boot_id = o_.boot_id;
  next.resume = resume;
  next.previous_world = static_cast<uint32_t>(record_.workers.size());
  next.previous_workers = record_.workers;
  next.previous_boot_ids = record_.worker_boot_ids;
  next.previous_regions = record_.worker_regions;
  // A decay never undoes another: the smaller factor (one decided here before another node's
  // later decay was installed is not taken back up).
  if (rate_factor_ > 0) next.lr_factor = record_.lr_factor > 0 ? std::min(rate_factor_, record_.lr_factor) : rate_factor_;
  if (const auto& r = release_; r.epochs > record_.released_epochs) {
    next.released_epochs = r.epochs;
    next.reset_file = r.reset_file.path;
    next.reset_file_size = r.reset_file.size;
    next.reset_file_checksum = r.reset_file.checksum;
    next.reset_checksum = r.reset_checksum;
    if (!r.optimizer.empty()) next.optimizer = r.optimizer;
    next.reset_epochs = r.reset_checksum ? r.epochs : 0;
  }
  next.donors.clear();
  for (const auto& id : counted)
    if (p.acks.at(id).progress == resume) next.donors.push_back(id);
  if (!record_.spans.empty()) {
    // Gossip: every old worker's list from its cursor on, re-split among the new workers. A
    // cursor counts only from an ack of a worker in this generation (its own), or as seen in
    // mixings by ackers in it; a worker gone keeps only what it mixed.
    std::vector<Spans> rests;
    for (size_t i = 0; i < record_.workers.size(); ++i) {
      const auto& id = record_.workers[i];
      uint64_t consumed = 0;
      for (const auto& [acker, ack] : p.acks) {
        if (ack.base != record_.generation) continue;
        if (acker == id && ack.has_state) consumed = std::max(consumed, ack.progress.position);
        for (const auto& [worker, cursor] : ack.cursors)
          if (worker == id) consumed = std::max(consumed, cursor);
      }
      rests.push_back(rest_after(i < record_.spans.size() ? spans_of(record_.spans[i]) : Spans{}, consumed));
    }
    next.spans.clear();
    // Rebalance: in proportion to each worker's measured rate (the proposal's weights).
    // (Gossip and async lists; the plateau factor below is every mode's.)
    for (const auto& list : resplit(rests, next.workers.size(), p.weights)) next.spans.push_back(triples_of(list));
  }
  if (record_.shards > 0) {
    // Async: each shard's holders take the state of the acker holding its highest version (a
    // holder still fetching it reports nothing); none: the shard is lost, and the driver says so.
    // Ackers of the generation this one succeeds first; for a shard none of them holds, an acker
    // still in an older one (it missed the install of this base: nothing was made durable in a
    // generation whose holders had not all installed it), which would otherwise be lost.
    next.shard_sources.assign(record_.shards, std::string());
    std::vector<uint64_t> best(record_.shards, 0);
    for (const bool current : {true, false}) {
      std::vector<std::string> found(record_.shards);
      for (const auto& [acker, ack] : p.acks) {
        if ((ack.base == record_.generation) != current || ack.base > record_.generation) continue;
        for (const auto& [shard, version] : ack.held_shards)
          if (shard < record_.shards && next.shard_sources[shard].empty() && (found[shard].empty() || version > best[shard])) {
            found[shard] = acker;
            best[shard] = version;
          }
      }
      for (uint32_t s = 0; s < record_.shards; ++s)
        if (next.shard_sources[s].empty()) next.shard_sources[s] = found[s];
    }
    // A shard no acker holds: from a worker handing it over before it leaves, if one does.
    for (const auto& [leaver, held] : handover_) {
      if (!std::ranges::count(record_.workers, leaver)) continue;
      for (const auto& [shard, version] : held)
        if (shard < record_.shards && next.shard_sources[shard].empty()) next.shard_sources[shard] = leaver;
    }
    // A shard still without a source: while one of its holders may still hold it (unheard, or dead
    // where a partition is possible), the install waits for it, as it waits for the sync state;
    // once every holder is gone (left, restarted, acked without it, or dead on a cluster that
    // cannot be partitioned), the shard is lost and the job cannot go on without a checkpoint.
    if (const auto unheld = shards_unheld(p, next.shard_sources); !unheld.lost.empty()) {
      out.lost = fmt::format("no surviving holder of {}. [elastic] replication = {} survives {} holder(s) of a shard "
                             "lost at once; without a checkpoint the job cannot resume",
                             unheld.lost, o_.replication, std::max(0, o_.replication - 1));
      out.log.push_back(fmt::format("generation {}: {}", p.number, out.lost));
      proposal_.reset();
      return;
    } else if (!unheld.waiting.empty()) {
      stalled_ = fmt::format("generation {}: no acker holds {}; waiting for its holders (the other side of a "
                             "partition)",
                             p.number, unheld.waiting);
      out.log.push_back(stalled_);
      return;
    }
  }
  handover_.clear();  // for this install only: the leaver goes once its shards are fetched
  proposal_.reset();
  for (size_t i = 0; i < next.workers.size(); ++i)
    if (next.workers[i] != o_.self) out.sends.emplace_back(next.addresses[i], next);
  // Workers left out that are still live (evicted, or taken for gone by a view they will refute)
  // learn it at once, rather than wait on a ring that has moved on.
  for (size_t i = 0; i < record_.workers.size(); ++i)
    if (std::find(next.workers.begin(), next.workers.end(), record_.workers[i]) == next.workers.end())
      if (const Member* m = find(view_, record_.workers[i]); m && is_live(*m)) out.sends.emplace_back(m->address, next);
  if (!next.submitter.empty()) out.sends.emplace_back(next.submitter, next);
  out.log.push_back(fmt::format("installed generation {}: {} workers, resume at step {}, {} donors", next.generation,
                                next.workers.size(), next.resume.step, next.donors.size()));
  install(next, out);
}

void JobControl::evict(double now, const std::string& id, const Local& mine, Output& out, bool forward) {
  if (!has_record()) return;
  const auto it = std::find(record_.workers.begin(), record_.workers.end(), id);
  if (it == record_.workers.end() || id == o_.self) return;
  // Every node that evicts a worker passes it over from then on, for the duty too: when the
  // worker that blocks the ring holds the duty itself (a hung trainer answers no vote), the next
  // in line takes it up, and the others follow its proposal as they follow any.
  const auto i = static_cast<size_t>(it - record_.workers.begin());
  const uint64_t boot = i < record_.worker_boot_ids.size() ? record_.worker_boot_ids[i] : 0;
  if (auto known = excluded_.find(id); known == excluded_.end() || known->second != boot) {
    excluded_[id] = boot;
    auto& strikes = strikes_[id];
    if (strikes.boot != boot) strikes = {boot};
    ++strikes.count;  // once per eviction of this run, however many ask for it
  }
  if (!holds_duty()) {
    if (!forward) return;
    if (const auto* holder = worker_address(record_, duty_holder()))
      out.sends.emplace_back(*holder, GenerationVote{record_.job_id, GenerationVote::Kind::evict, record_.generation,
                                                     record_.generation, {id}});
    return;
  }
  out.log.push_back(fmt::format("leaving {} out of the next generation: alive, but it blocks the ring", id));
  quiet_until_ = 0;
  propose(now, mine, out);
}

std::expected<void, std::string> JobControl::on_install(const JobStart& record, Output& out) {
  if (record.generation <= record_.generation) return {};  // known already, or older
  if (has_record() && record.job_id != record_.job_id)
    return std::unexpected(fmt::format("generation {} of job {}, but this node runs job {}", record.generation,
                                       record.job_id, record_.job_id));
  if (record.workers.empty() || record.workers.size() != record.addresses.size() ||
      record.workers.size() != record.worker_boot_ids.size())
    return std::unexpected(fmt::format("generation {} of job {} has no consistent ring order", record.generation,
                                       record.job_id));
  install(record, out);
  return {};
}

void JobControl::install(const JobStart& record, Output& out) {
  record_ = record;
  ack_withheld_ = false;
  stalled_.clear();
  // A decay this node decided is done once a record carries it, or a smaller one.
  if (rate_factor_ > 0 && record.lr_factor > 0 && record.lr_factor <= rate_factor_) rate_factor_ = 0;
  rates_.clear();  // cursors count in the list of the generation they move in
  installed_at_ = -1;
  promised_ = std::max(promised_, record.generation);
  highest_seen_ = std::max(highest_seen_, record.generation);
  if (proposal_ && proposal_->number <= record.generation) proposal_.reset();
  out.installed = true;
  // Someone took these workers back (or their new runs): no longer passed over here, whether
  // this node evicted them itself or heard the vote. Left, an exclusion on a node that never hears
  // `back` would make it take the duty from the worker it still passes over.
  for (size_t i = 0; i < record.workers.size(); ++i)
    if (auto x = excluded_.find(record.workers[i]);
        x != excluded_.end() && (!x->second || i >= record.worker_boot_ids.size() || x->second == record.worker_boot_ids[i]))
      excluded_.erase(x);
  left_out_ = std::find(record.workers.begin(), record.workers.end(), o_.self) == record.workers.end();
  if (left_out_) {
    out.dropped = fmt::format("not a worker of generation {}", record.generation);
    // Left out while running: evicted (its trainer blocked the ring a while), or taken for gone
    // by a view it has refuted since. Either way it takes messages now, which is what the duty
    // holder waits to hear before it stops passing an evicted run over.
    say_back(out);
    back_said_at_ = -1;  // said now; again a retry period after the next tick
  }
}

void JobControl::say_back(Output& out) const {
  const std::string holder = duty_holder();
  if (holder.empty() || holder == o_.self) return;
  if (const auto* address = worker_address(record_, holder))
    out.sends.emplace_back(*address, GenerationVote{record_.job_id, GenerationVote::Kind::back, record_.generation,
                                                    record_.generation, {}, {}, false, o_.boot_id});
}

}  // namespace tepdist::elastic

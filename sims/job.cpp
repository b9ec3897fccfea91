#include "sims/job.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "elastic/progress.hpp"

namespace tepdist::sims {

SimJob::SimJob(JobScenario scenario) : s_(scenario), used_(static_cast<size_t>(scenario.samples), 0) {
  if (s_.shards > 0) shards_ = std::make_unique<SimShards>(s_.shards, s_.replication);
}

elastic::JobControl::Local SimJob::local(const std::string& id, const Worker& w) const {
  elastic::JobControl::Local l{w.progress, w.has_state};
  if (shards_ && w.control->has_record()) l.held_shards = shards_->held(id, w.control->record().generation);
  return l;
}

const JobReport& SimJob::report() {
  if (shards_) {
    report_.shards = shards_->report();
    if (report_.lost.empty() && !shards_->report().lost.empty()) report_.lost = "async " + shards_->report().lost;
  }
  return report_;
}

const std::vector<std::string>& SimJob::broken() {
  if (shards_)
    for (const auto& b : shards_->broken())
      if (std::find(broken_.begin(), broken_.end(), b) == broken_.end() && broken_.size() < 40) broken_.push_back(b);
  return broken_;
}

std::unique_ptr<elastic::JobControl> SimJob::fresh(const std::string& id, uint64_t boot) const {
  elastic::JobControl::Options o{id, boot, s_.quorum, 1, 3000};
  o.replication = s_.replication;
  return std::make_unique<elastic::JobControl>(o);
}

void SimJob::fail(std::string why) {
  if (broken_.size() < 20) broken_.push_back(std::move(why));
}

void SimJob::start(const std::string& id, uint64_t boot, bool founder, const std::vector<std::string>& founders,
                   const std::vector<uint64_t>& founder_boots) {
  auto& w = workers_[id];
  w.control = fresh(id, boot);
  w.boot = boot;
  w.running = true;
  w.has_state = false;
  w.progress = {};
  if (shards_) shards_->start(id, boot);
  if (!founder) return;
  gossip::JobStart record;
  record.job_id = 1;
  record.generation = 1;
  record.workers = founders;
  record.addresses = founders;  // ids double as addresses in the simulator
  record.worker_boot_ids = founder_boots;
  record.shards = s_.shards;
  w.control->adopt(record);
  if (shards_) shards_->install(id, record);
  w.has_state = true;
  installed_.emplace(1, founders);
  report_.generations = std::max<uint64_t>(report_.generations, 1);
}

void SimJob::stop(const std::string& id) {
  if (auto it = workers_.find(id); it != workers_.end()) it->second.running = false;
  if (shards_) shards_->stop(id);
}

void SimJob::apply(const std::string& id, elastic::JobControl::Output& out, Sends& sends) {
  if (trace_)
    for (const auto& line : out.log) fmt::print(stderr, "{:.3f}:{}:job:{}\n", now_, id, line);
  for (auto& [address, body] : out.sends) sends.push_back({address, std::move(body)});
  auto& w = workers_.at(id);
  if (!out.lost.empty()) {
    for (const auto& [other, o] : workers_)
      if (o.running && o.has_state)
        fail(fmt::format("no_false_loss: {} says the state is lost ({}) while {} holds it at step {}", id, out.lost,
                         other, o.progress.step));
    if (report_.lost.empty()) report_.lost = fmt::format("{} at {:.3f} s: {}", id, now_ / 1000, out.lost);
  }
  if (trace_ && out.installed)
    fmt::print(stderr, "{:.3f}:{}:job:installed {}{}\n", now_, id, w.control->record().generation,
               out.dropped.empty() ? "" : " (dropped: " + out.dropped + ")");
  if (!out.installed) return;
  const auto& r = w.control->record();
  const auto [it, fresh_number] = installed_.emplace(r.generation, r.workers);
  if (fresh_number) ++report_.generations;
  if (it->second != r.workers)
    fail(fmt::format("one_generation: generation {} installed on {} with {} workers, elsewhere with {}", r.generation,
                     id, r.workers.size(), it->second.size()));
  if (!out.dropped.empty()) {
    // Not a worker of it: the trainer lets its state go and waits to be proposed again, keeping
    // the record and what it promised.
    w.has_state = false;
    w.progress = {};
  }
  if (shards_) {
    shards_->set_now(now_);
    shards_->install(id, r);
  }
}

void SimJob::on_view(const std::string& id, double now, const std::vector<gossip::Member>& view, Sends& out) {
  now_ = now;
  auto& w = workers_.at(id);
  elastic::JobControl::Output o;
  w.control->on_view(now, view, local(id, w), o);
  apply(id, o, out);
}

void SimJob::on_message(const std::string& id, double now, const std::string& from, const gossip::Body& body,
                        Sends& out) {
  now_ = now;
  auto& w = workers_.at(id);
  elastic::JobControl::Output o;
  if (trace_) {
    if (const auto* v = std::get_if<gossip::GenerationVote>(&body))
      fmt::print(stderr, "{:.3f}:{}:job:vote kind {} number {} base {} from {}{} {}\n", now, id,
                 static_cast<int>(v->kind), v->number, v->base, from,
                 v->kind == gossip::GenerationVote::Kind::ack ? fmt::format(" state {} step {}", v->has_state, v->progress.step)
                                                              : "",
                 v->reason);
    else if (const auto* r = std::get_if<gossip::JobStart>(&body))
      fmt::print(stderr, "{:.3f}:{}:job:record {} from {}\n", now, id, r->generation, from);
  }
  if (std::holds_alternative<gossip::ShardUpdate>(body) || std::holds_alternative<gossip::ShardState>(body)) {
    if (shards_) {
      shards_->set_now(now);
      shards_->on_message(id, from, body);
    }
    return;
  }
  if (const auto* v = std::get_if<gossip::GenerationVote>(&body)) {
    w.control->on_vote(now, from, *v, local(id, w), o);
  } else if (const auto* r = std::get_if<gossip::JobStart>(&body)) {
    // A joiner takes a record only for a generation it promised (as the trainer does).
    if (!w.control->has_record() && w.control->promised() > r->generation) return;
    if (!w.control->has_record() && w.control->promised() == 0) return;
    if (auto ok = w.control->on_install(*r, o); !ok) return;
  }
  apply(id, o, out);
}

void SimJob::on_tick(const std::string& id, double now, Sends& out) {
  now_ = now;
  auto& w = workers_.at(id);
  elastic::JobControl::Output o;
  w.control->on_tick(now, local(id, w), o);
  apply(id, o, out);
}

void SimJob::step(const std::function<bool(const std::string&)>& ready,
                  const std::function<bool(const std::string&, const std::string&)>& reach) {
  // Members behind pull the state from a donor they reach.
  for (auto& [id, w] : workers_) {
    if (!w.running || !ready(id) || !w.control->has_record() || w.control->paused()) continue;
    const auto& r = w.control->record();
    if (std::find(r.workers.begin(), r.workers.end(), id) == r.workers.end()) continue;
    if (w.has_state && w.progress.step >= r.resume.step) continue;
    for (const auto& d : r.donors) {
      const auto it = workers_.find(d);
      if (d == id || it == workers_.end() || !it->second.running || !ready(d) || !reach(id, d) || !it->second.has_state ||
          it->second.progress != r.resume)
        continue;
      w.progress = r.resume;
      w.has_state = true;
      ++report_.pulls;
      break;
    }
  }
  if (shards_) {
    // Holders of a shard take their source's state once they can; async workers push without
    // waiting for one another, each in the generation it has installed, unless paused by a vote.
    shards_->take_over([&](const std::string& id) { return ready(id); }, reach);
    for (const auto& [id, w] : workers_)
      if (w.running && ready(id) && w.control->has_record() && !w.control->paused() && w.has_state) shards_->push(id);
  }
  // Each generation held by a running node steps if all its workers are in it, ready and connected.
  std::map<uint64_t, const gossip::JobStart*> held;
  for (const auto& [id, w] : workers_)
    if (w.running && w.control->has_record()) held.emplace(w.control->record().generation, &w.control->record());
  for (const auto& [number, record] : held) {
    const auto& ids = record->workers;
    bool can = true;
    const Worker* first = nullptr;
    for (const auto& id : ids) {
      const auto it = workers_.find(id);
      if (it == workers_.end() || !it->second.running || !ready(id)) { can = false; break; }
      const auto& w = it->second;
      if (!w.control->has_record() || w.control->record().generation != number || w.control->paused() || !w.has_state) {
        can = false;
        break;
      }
      if (!first) first = &w;
      else if (w.progress != first->progress) {
        fail(fmt::format("replicas: generation {} has workers at steps {} and {}", number, first->progress.step,
                         w.progress.step));
        can = false;
        break;
      }
      for (const auto& other : ids)
        if (!reach(id, other)) can = false;
    }
    if (!can) continue;
    if (number < newest_stepped_)
      fail(fmt::format("one_side: generation {} stepped after generation {} had", number, newest_stepped_));
    newest_stepped_ = std::max(newest_stepped_, number);
    const auto p = first->progress;
    const auto world = static_cast<int64_t>(ids.size());
    if (p.epoch != epoch_) {
      fail(fmt::format("every_sample: generation {} steps in epoch {} while epoch {} is open", number, p.epoch, epoch_));
      continue;
    }
    const int64_t end = std::min(s_.samples, static_cast<int64_t>(p.position) + world * s_.batch);
    for (int64_t k = static_cast<int64_t>(p.position); k < end; ++k)
      if (++used_[static_cast<size_t>(k)] > 1)
        fail(fmt::format("every_sample: position {} of epoch {} trained on twice (generation {})", k, p.epoch, number));
    const auto next = elastic::after_sync_step(p, s_.samples, world, s_.batch);
    for (const auto& id : ids) workers_.at(id).progress = next;
    ++report_.steps;
    if (next.epoch != epoch_) {
      const auto missed = std::count(used_.begin(), used_.end(), 0);
      if (missed > 0) fail(fmt::format("every_sample: epoch {} ended with {} positions never trained on", epoch_, missed));
      std::fill(used_.begin(), used_.end(), 0);
      epoch_ = next.epoch;
      ++report_.epochs;
    }
  }
}

void SimJob::drain() {
  if (shards_) shards_->drain();
}

void SimJob::check_settled(double now, const std::vector<std::string>& running) {
  if (installed_.empty() || !report_.lost.empty()) return;
  if (shards_) {
    shards_->set_now(now);
    for (const auto& id : running)
      if (const auto& w = workers_.at(id); w.control->has_record() && w.control->record().generation == installed_.rbegin()->first) {
        shards_->check_end(w.control->record());
        break;
      }
  }
  const auto& [newest, workers] = *installed_.rbegin();
  std::vector<std::string> want = running;
  std::sort(want.begin(), want.end());
  if (workers != want)
    fail(fmt::format("settled: generation {} has {} workers, {} nodes are running", newest, workers.size(), want.size()));
  for (const auto& id : running) {
    const auto& w = workers_.at(id);
    if (!w.control->has_record() || w.control->record().generation != newest || w.control->paused() || !w.has_state)
      fail(fmt::format("settled: {} is not training in generation {} at the end (holds {}{})", id, newest,
                       w.control->has_record() ? w.control->record().generation : 0,
                       w.control->paused() ? ", paused" : ""));
  }
}

}  // namespace tepdist::sims

#include "elastic/coordination.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace tepdist::elastic {

using gossip::Member;

bool has_role(const Member& m, const std::string& role) {
  return std::find(m.roles.begin(), m.roles.end(), role) != m.roles.end();
}

bool is_live(const Member& m) { return m.state == Member::State::alive || m.state == Member::State::suspect; }

const Member* coordinator_in(const std::vector<Member>& view) {
  const Member* best = nullptr;
  for (const auto& m : view)
    if (is_live(m) && has_role(m, "coordinator") && (!best || m.id < best->id)) best = &m;
  return best;
}

std::expected<gossip::JobStart, std::string> assign_job(gossip::JobStart job, const std::vector<Member>& view,
                                                        const std::string& self, uint64_t incarnation) {
  const Member* c = coordinator_in(view);
  if (!c || c->id != self)
    return std::unexpected(fmt::format("{} is not the coordinator; {} is", self, c ? c->id : std::string("nobody")));
  std::vector<const Member*> workers;
  for (const auto& m : view)
    if (is_live(m) && has_role(m, "worker")) workers.push_back(&m);
  if (workers.empty()) return std::unexpected(std::string("no live member has the worker role"));
  std::sort(workers.begin(), workers.end(), [](const Member* a, const Member* b) { return a->id < b->id; });
  job.workers.clear();
  job.addresses.clear();
  for (const Member* w : workers) {
    job.workers.push_back(w->id);
    job.addresses.push_back(w->address);
  }
  job.coordinator = self;
  job.coordinator_incarnation = incarnation;
  return job;
}

std::expected<void, std::string> check_assignment(const gossip::JobStart& job, const std::vector<Member>& view) {
  const Member* c = coordinator_in(view);
  if (!c) return std::unexpected(fmt::format("job {} from {}: this node knows no live coordinator", job.job_id, job.coordinator));
  if (c->id != job.coordinator || c->incarnation != job.coordinator_incarnation)
    return std::unexpected(fmt::format("job {} from {} (incarnation {}), but the coordinator is {} (incarnation {})",
                                       job.job_id, job.coordinator, job.coordinator_incarnation, c->id, c->incarnation));
  if (job.workers.empty() || job.workers.size() != job.addresses.size())
    return std::unexpected(fmt::format("job {}: no ring order", job.job_id));
  return {};
}

std::vector<std::string> ring_changes(const gossip::JobStart& job, const std::vector<Member>& view) {
  std::vector<std::string> out;
  for (const auto& id : job.workers) {
    auto it = std::find_if(view.begin(), view.end(), [&](const Member& m) { return m.id == id; });
    // Not known yet is not a change: gossip has not reached this node yet (the assignment names it).
    if (it != view.end() && !is_live(*it)) out.push_back(fmt::format("{} ({})", id, it->state == Member::State::dead ? "dead" : "left"));
  }
  for (const auto& m : view)
    if (is_live(m) && has_role(m, "worker") && std::find(job.workers.begin(), job.workers.end(), m.id) == job.workers.end())
      out.push_back(fmt::format("{} (joined)", m.id));
  return out;
}

int64_t sync_steps_per_epoch(int64_t n, int64_t workers, int64_t batch) {
  const int64_t global = workers * batch;
  return (n + global - 1) / global;
}

std::pair<int64_t, int64_t> sync_batch_slice(int64_t n, int64_t workers, int64_t batch, int64_t step_in_epoch,
                                             int64_t rank) {
  const int64_t begin = std::min(n, step_in_epoch * workers * batch + rank * batch);
  return {begin, std::min(n, begin + batch)};
}

}  // namespace tepdist::elastic

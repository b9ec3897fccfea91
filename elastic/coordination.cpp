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
  LowestLiveId rule;
  for (const auto& m : view) rule.offer(m.id, is_live(m) && has_role(m, "coordinator"));
  if (!rule.holder()) return nullptr;
  return &*std::find_if(view.begin(), view.end(), [&](const Member& m) { return &m.id == rule.holder(); });
}

std::expected<gossip::JobStart, std::string> assign_job(gossip::JobStart job, const std::vector<Member>& view,
                                                        const std::string& self) {
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
  job.worker_boot_ids.clear();
  job.worker_regions.clear();
  for (const Member* w : workers) {
    job.workers.push_back(w->id);
    job.addresses.push_back(w->address);
    job.worker_boot_ids.push_back(w->boot_id);
    job.worker_regions.push_back(w->region);
  }
  job.coordinator = self;
  job.coordinator_boot_id = c->boot_id;
  return job;
}

std::expected<void, std::string> check_assignment(const gossip::JobStart& job, const std::vector<Member>& view) {
  const Member* c = coordinator_in(view);
  if (!c) return std::unexpected(fmt::format("job {} from {}: this node knows no live coordinator", job.job_id, job.coordinator));
  // By boot id, not incarnation: a coordinator that refuted a suspicion since it signed the job is
  // the same run of it; one that restarted is not.
  if (c->id != job.coordinator || c->boot_id != job.coordinator_boot_id)
    return std::unexpected(fmt::format("job {} from {} (boot {}), but the coordinator is {} (boot {})", job.job_id,
                                       job.coordinator, job.coordinator_boot_id, c->id, c->boot_id));
  if (job.workers.empty() || job.workers.size() != job.addresses.size())
    return std::unexpected(fmt::format("job {}: no ring order", job.job_id));
  return {};
}

std::vector<std::string> ring_changes(const gossip::JobStart& job, const std::vector<Member>& view) {
  std::vector<std::string> out;
  for (size_t i = 0; i < job.workers.size(); ++i) {
    const auto& id = job.workers[i];
    auto it = std::find_if(view.begin(), view.end(), [&](const Member& m) { return m.id == id; });
    // Not known yet is not a change: gossip has not reached this node yet (the assignment names it).
    if (it == view.end()) continue;
    if (!is_live(*it)) out.push_back(fmt::format("{} ({})", id, it->state == Member::State::dead ? "dead" : "left"));
    // Alive in another run of its process: what it held of the job is gone.
    else if (i < job.worker_boot_ids.size() && job.worker_boot_ids[i] && it->boot_id && it->boot_id != job.worker_boot_ids[i])
      out.push_back(fmt::format("{} (restarted)", id));
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

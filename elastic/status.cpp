#include "elastic/status.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace tepdist::elastic {
namespace {

using gossip::Member;

const char* state_name(Member::State s) {
  switch (s) {
    case Member::State::alive: return "alive";
    case Member::State::suspect: return "suspect";
    case Member::State::dead: return "dead";
    case Member::State::left: return "left";
  }
  return "?";
}

/// The shards `id` holds: (shard, primary?), primary first in each shard's holder list.
std::vector<std::pair<uint32_t, bool>> shards_of(const StatusDocument& doc, const std::string& id) {
  std::vector<std::pair<uint32_t, bool>> held;
  for (const auto& s : doc.shards)
    for (size_t k = 0; k < s.holders.size(); ++k)
      if (s.holders[k] == id) held.emplace_back(s.shard, k == 0);
  return held;
}

}  // namespace

StatusDocument status_document(std::string source, const gossip::StateSync& answer) {
  return {std::move(source), answer.epoch_unix_ms, answer.members, answer.shards, answer.job};
}

std::string status_json(const StatusDocument& doc) {
  nlohmann::json out = {{"source", doc.source}, {"epoch_unix_ms", doc.epoch_unix_ms}, {"members", nlohmann::json::array()}};
  for (const auto& m : doc.members) {
    nlohmann::json shards = nlohmann::json::array();
    for (const auto& [shard, primary] : shards_of(doc, m.id)) shards.push_back({{"shard", shard}, {"primary", primary}});
    out["members"].push_back({{"id", m.id},
                              {"state", state_name(m.state)},
                              {"incarnation", m.incarnation},
                              {"address", m.address},
                              {"region", m.region},
                              {"roles", m.roles},
                              {"shards", shards}});
  }
  out["job"] = nullptr;
  if (const auto& j = doc.job) {
    nlohmann::json workers = nlohmann::json::array();
    for (const auto& [id, position] : j->workers) workers.push_back({{"id", id}, {"position", position}});
    out["job"] = {{"job_id", j->job_id},          {"mode", j->mode},
                  {"generation", j->generation},  {"phase", j->phase},
                  {"step", j->progress.step},     {"epoch", j->progress.epoch},
                  {"position", j->progress.position}, {"samples", j->progress.samples},
                  {"workers", workers}};
  }
  // Ids and names come from peers: invalid UTF-8 is replaced, never thrown on.
  return out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string status_table(const StatusDocument& doc) {
  std::string out = fmt::format("{:<16} {:<8} {:>15} {:<22} {:<10} {:<40} {}\n", "ID", "STATE", "INCARNATION",
                                "ADDRESS", "REGION", "ROLES", "SHARDS");
  for (const auto& m : doc.members) {
    std::string shards, roles;
    for (const auto& [shard, primary] : shards_of(doc, m.id))
      shards += fmt::format("{}{}{}", shards.empty() ? "" : " ", shard, primary ? "p" : "r");
    for (const auto& r : m.roles) roles += (roles.empty() ? "" : ",") + r;
    out += fmt::format("{:<16} {:<8} {:>15} {:<22} {:<10} {:<40} {}\n", m.id, state_name(m.state), m.incarnation,
                       m.address, m.region, roles, shards.empty() ? "-" : shards);
  }
  out += fmt::format("{} members as {} sees them\n", doc.members.size(), doc.source);
  if (const auto& j = doc.job) {
    // Sync: every worker is at the job's position. Gossip and async: each at its own, in samples of
    // its own ranges, as the answering worker last heard.
    out += fmt::format("job {} ({}): generation {}, {}, epoch {}, step {}, {} samples\n", j->job_id, j->mode,
                       j->generation, j->phase, j->progress.epoch + 1, j->progress.step, j->progress.samples);
    out += fmt::format("{:<16} {}\n", "WORKER", "POSITION");
    for (const auto& [id, position] : j->workers) out += fmt::format("{:<16} {}\n", id, position);
  } else {
    out += "no job on this member\n";
  }
  return out;
}

}  // namespace tepdist::elastic

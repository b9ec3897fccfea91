#include "elastic/status.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

namespace tepdist::elastic {

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

namespace {

/// The shards `id` holds: (shard, primary?), primary first in each shard's holder list.
std::vector<std::pair<uint32_t, bool>> shards_of(const StatusDocument& doc, const std::string& id) {
  std::vector<std::pair<uint32_t, bool>> held;
  for (const auto& s : doc.shards)
    for (size_t k = 0; k < s.holders.size(); ++k)
      if (s.holders[k] == id) held.emplace_back(s.shard, k == 0);
  return held;
}

/// What the answering worker knows of `id`'s speed and share (null: nothing).
const gossip::WorkerLoad* load_of(const gossip::JobStatus& j, const std::string& id) {
  const auto it = std::ranges::find(j.loads, id, &gossip::WorkerLoad::worker);
  return it == j.loads.end() ? nullptr : &*it;
}

/// A summary taken this long before the freshest one the table holds is stale (3 monitor rounds).
constexpr uint64_t stale_after_ms = 6000;

/// Each node's summary with its member state and whether it is stale, in id order.
struct NodeRow {
  std::string id;
  const Member* member = nullptr;  // null: not in the view
  const NodeFigures* figures = nullptr;
  bool stale = false;
  double age_s = 0;
};

std::vector<NodeRow> node_rows(const StatusDocument& doc) {
  uint64_t newest = 0;
  for (const auto& [id, f] : doc.figures) newest = std::max(newest, f.unix_ms);
  std::vector<NodeRow> rows;
  for (const auto& [id, f] : doc.figures) {
    NodeRow r{id};
    const auto m = std::ranges::find(doc.members, id, &Member::id);
    if (m != doc.members.end()) r.member = &*m;
    r.figures = &f;
    r.age_s = static_cast<double>(newest - f.unix_ms) / 1000.0;
    r.stale = newest - f.unix_ms > stale_after_ms || !r.member || r.member->state == Member::State::dead ||
              r.member->state == Member::State::left;
    rows.push_back(r);
  }
  return rows;
}

double figure(const NodeFigures& f, const std::string& name) {
  const auto it = f.values.find(name);
  return it == f.values.end() ? std::nan("") : it->second;
}

/// A worker of the job as the document knows it: its position and load as the answering worker
/// holds them, and its own figures as the monitor gossip brought them (NaN: not known). Lag: the
/// steps it is behind the furthest worker of the job, among the workers whose figures are fresh.
struct WorkerRow {
  std::string id;
  uint64_t position = 0;
  double step = std::nan(""), lag = std::nan(""), samples_per_second = std::nan(""), share = std::nan(""),
         staleness = std::nan("");
};

std::vector<WorkerRow> worker_rows(const StatusDocument& doc) {
  std::vector<WorkerRow> out;
  if (!doc.job) return out;
  const auto& j = *doc.job;
  std::map<std::string, const NodeFigures*> fresh;
  for (const auto& r : node_rows(doc))
    if (!r.stale && figure(*r.figures, "job_id") == static_cast<double>(j.job_id)) fresh[r.id] = r.figures;
  double furthest = std::nan("");
  for (const auto& [id, position] : j.workers)
    if (const auto f = fresh.find(id); f != fresh.end() && !(figure(*f->second, "step") <= furthest))
      furthest = figure(*f->second, "step");
  for (const auto& [id, position] : j.workers) {
    WorkerRow w{id, position};
    const auto f = fresh.find(id);
    const NodeFigures* figures = f == fresh.end() ? nullptr : f->second;
    if (figures) {
      w.step = figure(*figures, "step");
      w.lag = furthest - w.step;
      w.samples_per_second = figure(*figures, "samples_per_second");
      w.staleness = figure(*figures, "staleness");
    }
    if (const auto* load = load_of(j, id)) {
      if (load->samples_per_second > 0) w.samples_per_second = load->samples_per_second;
      if (load->share > 0) w.share = static_cast<double>(load->share);
    }
    out.push_back(std::move(w));
  }
  return out;
}

nlohmann::json number_or_null(double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); }

}  // namespace

gossip::MetricsSnapshot snapshot_of(const FigureTable& table) {
  gossip::MetricsSnapshot out;
  for (const auto& [id, f] : table) {
    const std::vector<std::pair<std::string, std::string>> labels{{"node", id}};
    out.entries.push_back({"unix_ms", labels, static_cast<double>(f.unix_ms)});
    for (const auto& [name, value] : f.values) out.entries.push_back({name, labels, value});
  }
  return out;
}

FigureTable table_of(const gossip::MetricsSnapshot& snapshot) {
  FigureTable table;
  for (const auto& e : snapshot.entries) {
    const auto label = std::ranges::find(e.labels, std::string("node"), &std::pair<std::string, std::string>::first);
    if (label == e.labels.end() || !std::isfinite(e.value)) continue;
    auto& f = table[label->second];
    if (e.name == "unix_ms") f.unix_ms = e.value > 0 ? static_cast<uint64_t>(e.value) : 0;
    else f.values[e.name] = e.value;
  }
  std::erase_if(table, [](const auto& entry) { return entry.second.unix_ms == 0; });
  return table;
}

bool merge_figures(FigureTable& table, const FigureTable& in, const std::vector<std::string>& known) {
  bool changed = false;
  for (const auto& [id, f] : in) {
    if (!known.empty() && std::ranges::find(known, id) == known.end()) continue;
    auto& mine = table[id];
    if (f.unix_ms > mine.unix_ms) {
      mine = f;
      changed = true;
    }
  }
  std::erase_if(table, [](const auto& entry) { return entry.second.unix_ms == 0; });  // ids only looked at
  return changed;
}

StatusDocument status_document(std::string source, const gossip::StateSync& answer) {
  return {std::move(source), answer.epoch_unix_ms, answer.members, answer.shards, answer.job, {},
          table_of(answer.figures), answer.events};
}

void add_versions(StatusDocument& doc, const std::string& member, const gossip::StateSync& answer) {
  if (!answer.job) return;
  for (const auto& [shard, version] : answer.job->held_shards)
    for (const auto& s : doc.shards)
      if (s.shard == shard && !s.holders.empty() && s.holders.front() == member) doc.versions[shard] = version;
}

std::vector<gossip::Member> shard_primaries(const StatusDocument& doc) {
  std::vector<gossip::Member> out;
  for (const auto& m : doc.members)
    if (std::ranges::any_of(doc.shards, [&](const auto& s) { return !s.holders.empty() && s.holders.front() == m.id; }))
      out.push_back(m);
  return out;
}

std::string status_json(const StatusDocument& doc) {
  nlohmann::json out = {{"source", doc.source}, {"epoch_unix_ms", doc.epoch_unix_ms}, {"members", nlohmann::json::array()}};
  out["events"] = nlohmann::json::array();
  for (const auto& e : doc.events)
    out["events"].push_back({{"unix_ms", e.unix_ms}, {"kind", e.kind}, {"member", e.member}});
  out["nodes"] = nlohmann::json::array();
  for (const auto& r : node_rows(doc)) {
    nlohmann::json figures = nlohmann::json::object();
    for (const auto& [name, value] : r.figures->values) figures[name] = value;
    out["nodes"].push_back({{"id", r.id},
                            {"state", r.member ? state_name(r.member->state) : "unknown"},
                            {"stale", r.stale},
                            {"age_s", r.age_s},
                            {"unix_ms", r.figures->unix_ms},
                            {"figures", figures}});
  }
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
  out["shards"] = nlohmann::json::array();
  for (const auto& s : doc.shards) {
    const auto v = doc.versions.find(s.shard);
    out["shards"].push_back(
        {{"shard", s.shard},
         {"primary", s.holders.empty() ? nlohmann::json(nullptr) : nlohmann::json(s.holders.front())},
         {"replicas", s.holders.size() > 1 ? std::vector<std::string>(s.holders.begin() + 1, s.holders.end())
                                           : std::vector<std::string>()},
         {"version", v == doc.versions.end() ? nlohmann::json(nullptr) : nlohmann::json(v->second)}});
  }
  out["job"] = nullptr;
  if (const auto& j = doc.job) {
    nlohmann::json workers = nlohmann::json::array();
    for (const auto& w : worker_rows(doc))
      workers.push_back({{"id", w.id},
                         {"position", w.position},
                         {"step", number_or_null(w.step)},
                         {"lag_steps", number_or_null(w.lag)},
                         {"samples_per_second", number_or_null(w.samples_per_second)},
                         {"share", number_or_null(w.share)},
                         {"staleness", number_or_null(w.staleness)}});
    out["job"] = {{"job_id", j->job_id},          {"mode", j->mode},
                  {"generation", j->generation},  {"phase", j->phase},
                  {"step", j->progress.step},     {"epoch", j->progress.epoch},
                  {"position", j->progress.position}, {"samples", j->progress.samples},
                  {"lr", j->lr},                  {"loss", j->loss},
                  {"workers", workers}};
    auto& evaluations = out["job"]["evaluations"] = nlohmann::json::array();
    for (const auto& e : j->evaluations)
      evaluations.push_back({{"step", e.step}, {"epoch", e.epoch}, {"train_seconds", e.train_seconds},
                             {"test_accuracy", e.accuracy}, {"test_loss", e.loss}});
    auto& history = out["job"]["history"] = nlohmann::json::array();
    for (const auto& p : j->history)
      history.push_back({{"step", p.step}, {"train_seconds", p.train_seconds}, {"loss", p.loss},
                         {"samples_per_second", p.samples_per_second}, {"lr", p.lr}});
    auto& generations = out["job"]["generations"] = nlohmann::json::array();
    for (const auto& g : j->generations)
      generations.push_back({{"generation", g.generation}, {"resume_step", g.step}, {"workers", g.workers},
                             {"installed_unix_ms", g.unix_ms}});
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
  if (!doc.shards.empty()) {
    // Async: where each shard lives, and its version as its primary reported it.
    out += fmt::format("{:<6} {:<16} {:>10} {}\n", "SHARD", "PRIMARY", "VERSION", "REPLICAS");
    for (const auto& s : doc.shards) {
      const auto v = doc.versions.find(s.shard);
      std::string replicas;
      for (size_t k = 1; k < s.holders.size(); ++k) replicas += (replicas.empty() ? "" : " ") + s.holders[k];
      out += fmt::format("{:<6} {:<16} {:>10} {}\n", s.shard, s.holders.empty() ? "-" : s.holders.front(),
                         v == doc.versions.end() ? std::string("?") : std::to_string(v->second),
                         replicas.empty() ? "-" : replicas);
    }
  }
  if (const auto& j = doc.job) {
    // Sync: every worker is at the job's position. Gossip and async: each at its own, in samples of
    // its own ranges, as the answering worker last heard.
    out += fmt::format("job {} ({}): generation {}, {}, epoch {}, step {}, {} samples\n", j->job_id, j->mode,
                       j->generation, j->phase, j->progress.epoch + 1, j->progress.step, j->progress.samples);
    out += fmt::format("learning rate in effect {:.4g}, training loss {:.4f}\n", j->lr, j->loss);
    if (!j->evaluations.empty()) {
      const auto& e = j->evaluations.back();
      out += fmt::format("test accuracy {:.4f}, test loss {:.4f} (step {}, {} evaluations)\n", e.accuracy, e.loss,
                         e.step, j->evaluations.size());
    }
    // Step, lag and staleness from each worker's own figures (the monitor gossip); "-": not known.
    const auto num = [](double v, const char* spec) { return std::isnan(v) ? std::string("-") : fmt::format(fmt::runtime(spec), v); };
    out += fmt::format("{:<16} {:>10} {:>8} {:>6} {:>12} {:>6} {:>10}\n", "WORKER", "POSITION", "STEP", "LAG",
                       "SAMPLES/S", "SHARE", "STALENESS");
    for (const auto& w : worker_rows(doc))
      out += fmt::format("{:<16} {:>10} {:>8} {:>6} {:>12} {:>6} {:>10}\n", w.id, w.position, num(w.step, "{:.0f}"),
                         num(w.lag, "{:.0f}"), num(w.samples_per_second, "{:.0f}"), num(w.share, "{:.0f}"),
                         num(w.staleness, "{:.1f}"));
  } else {
    out += "no job on this member\n";
  }
  if (const auto rows = node_rows(doc); !rows.empty()) {
    // Every node's own figures, as the monitor gossip brought them here.
    out += fmt::format("{:<16} {:<8} {:>5} {:>10} {:>8} {:>10} {:>8} {:>9} {:>12} {:>12}\n", "NODE", "STATE", "AGE",
                       "GENERATION", "STEP", "SAMPLES/S", "LOSS", "ACCURACY", "BYTES IN", "BYTES OUT");
    const auto num = [](double v, const char* spec) { return std::isnan(v) ? std::string("-") : fmt::format(fmt::runtime(spec), v); };
    for (const auto& r : rows) {
      const auto& f = *r.figures;
      out += fmt::format("{:<16} {:<8} {:>5} {:>10} {:>8} {:>10} {:>8} {:>9} {:>12} {:>12}\n", r.id,
                         r.stale ? "stale" : (r.member ? state_name(r.member->state) : "?"),
                         fmt::format("{:.0f}s", r.age_s), num(figure(f, "generation"), "{:.0f}"),
                         num(figure(f, "step"), "{:.0f}"), num(figure(f, "samples_per_second"), "{:.0f}"),
                         num(figure(f, "loss"), "{:.4f}"), num(figure(f, "test_accuracy"), "{:.4f}"),
                         num(figure(f, "bytes_in"), "{:.0f}"), num(figure(f, "bytes_out"), "{:.0f}"));
    }
  }
  return out;
}

}  // namespace tepdist::elastic

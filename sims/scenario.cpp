// Scenario files: [scenario], [network], [[fault]] and [invariants], every key checked. The keys
// and their meaning are in sims/README.md.

#include <fmt/format.h>

#include <map>
#include <set>
#include <toml.hpp>

#include "sims/simulation.hpp"

namespace tepdist::sims {
namespace {

struct Bad {
  std::string message;
};

std::string where(const toml::value& v) { return fmt::format("{}:{}", v.location().file_name(), v.location().line()); }

void only(const toml::value& table, const std::string& name, std::initializer_list<std::string_view> keys) {
  if (!table.is_table()) throw Bad{fmt::format("{}: {} must be a table", where(table), name)};
  for (const auto& [k, v] : table.as_table())
    if (std::find(keys.begin(), keys.end(), k) == keys.end())
      throw Bad{fmt::format("{}: unknown key {}.{}", where(v), name, k)};
}

double number(const toml::value& table, const std::string& name, const std::string& key, double fallback, double lo,
              double hi) {
  if (!table.contains(key)) return fallback;
  const auto& v = table.at(key);
  if (!v.is_integer() && !v.is_floating()) throw Bad{fmt::format("{}: {}.{} must be a number", where(v), name, key)};
  const double x = v.is_integer() ? static_cast<double>(v.as_integer()) : v.as_floating();
  if (!(x >= lo && x <= hi)) throw Bad{fmt::format("{}: {}.{} = {} is out of range [{}, {}]", where(v), name, key, x, lo, hi)};
  return x;
}

bool boolean(const toml::value& table, const std::string& name, const std::string& key, bool fallback) {
  if (!table.contains(key)) return fallback;
  const auto& v = table.at(key);
  if (!v.is_boolean()) throw Bad{fmt::format("{}: {}.{} must be true or false", where(v), name, key)};
  return v.as_boolean();
}

std::vector<int> node_list(const toml::value& f, const std::string& name, int nodes) {
  std::vector<int> out;
  if (f.contains("nodes")) {
    const auto& v = f.at("nodes");
    if (!v.is_array()) throw Bad{fmt::format("{}: {}.nodes must be a list of node numbers", where(v), name)};
    for (const auto& n : v.as_array()) {
      if (!n.is_integer() || n.as_integer() < 0 || n.as_integer() >= nodes)
        throw Bad{fmt::format("{}: {}.nodes: each must be a node number in [0, {})", where(n), name, nodes)};
      out.push_back(static_cast<int>(n.as_integer()));
    }
  }
  if (f.contains("first") || f.contains("last")) {  // a range, for big partitions
    const int first = static_cast<int>(number(f, name, "first", 0, 0, nodes - 1));
    const int last = static_cast<int>(number(f, name, "last", nodes - 1, first, nodes - 1));
    for (int i = first; i <= last; ++i) out.push_back(i);
  }
  return out;
}

/// A simulated load's share of nodes and CPU knobs (sims/load.hpp), with their ranges.
void load_knobs(const toml::value& f, const std::string& name, Fault& fault) {
  fault.fraction = number(f, name, "fraction", 0, 0, 1);
  if (fault.nodes.empty() && fault.fraction == 0)
    throw Bad{fmt::format("{}: {} (kind = \"load\") needs nodes = [...], first/last or fraction = 0..1", where(f),
                          name)};
  LoadKnobs& l = fault.load;
  // Service above 20 ms would queue without end at the few dozen inputs a second a node gets.
  l.service_ms = number(f, name, "service_ms", l.service_ms, 0, 20);
  l.stall_every_ms = number(f, name, "stall_every_ms", l.stall_every_ms, 1, 3600000);
  l.stall_min_ms = number(f, name, "stall_min_ms", l.stall_min_ms, 0, 600000);
  l.stall_max_ms = number(f, name, "stall_max_ms", std::max(l.stall_max_ms, l.stall_min_ms), l.stall_min_ms, 600000);
  l.timers_first = boolean(f, name, "timers_first", l.timers_first);
}

Scenario parse(const toml::value& root) {
  Scenario s;
  only(root, "file", {"scenario", "network", "fault", "invariants", "job"});
  if (root.contains("job")) {
    const auto& t = root.at("job");
    only(t, "job", {"samples", "batch", "step_ms", "quorum", "shards", "replication", "drain_s"});
    s.job.enabled = true;
    s.job.samples = static_cast<int64_t>(number(t, "job", "samples", 4096, 1, 1e9));
    s.job.batch = static_cast<int64_t>(number(t, "job", "batch", 32, 1, 1e6));
    s.job.step_ms = number(t, "job", "step_ms", 50, 1, 60000);
    s.job.shards = static_cast<uint32_t>(number(t, "job", "shards", 0, 0, 4096));
    s.job.replication = static_cast<int>(number(t, "job", "replication", 2, 1, 16));
    s.job.drain_s = number(t, "job", "drain_s", 0, 0, 3600);
    if (s.job.drain_s > 0 && s.job.shards == 0)
      throw Bad{fmt::format("{}: job.drain_s stops an async job's batches; it needs job.shards > 0",
                            where(t.at("drain_s")))};
    const std::string quorum = t.contains("quorum") ? toml::find<std::string>(t, "quorum") : "majority";
    if (quorum != "majority" && quorum != "any")
      throw Bad{fmt::format("{}: job.quorum must be \"majority\" or \"any\"", where(t.at("quorum")))};
    s.job.quorum = quorum == "any" ? elastic::Quorum::any : elastic::Quorum::majority;
  }
  if (root.contains("scenario")) {
    const auto& t = root.at("scenario");
    only(t, "scenario", {"name", "nodes", "duration_s", "profile", "probe_interval_ms", "probe_timeout_ms",
                         "suspicion_mult"});
    if (t.contains("name")) s.name = toml::find<std::string>(t, "name");
    s.nodes = static_cast<int>(number(t, "scenario", "nodes", 10, 1, 20000));
    s.duration_s = number(t, "scenario", "duration_s", 60, 1, 86400);
    if (s.job.drain_s >= s.duration_s)
      throw Bad{fmt::format("{}: job.drain_s must be shorter than scenario.duration_s ({} s)",
                            where(root.at("job").at("drain_s")), s.duration_s)};
    const std::string profile = t.contains("profile") ? toml::find<std::string>(t, "profile") : "lan";
    if (profile != "lan" && profile != "wan")
      throw Bad{fmt::format("{}: scenario.profile must be \"lan\" or \"wan\"", where(t.at("profile")))};
    s.swim = profile == "wan" ? gossip::swim::Config::wan() : gossip::swim::Config::lan();
    s.swim.probe_interval_ms = number(t, "scenario", "probe_interval_ms", s.swim.probe_interval_ms, 1, 600000);
    s.swim.probe_timeout_ms = number(t, "scenario", "probe_timeout_ms", s.swim.probe_timeout_ms, 1, 600000);
    s.swim.suspicion_mult = number(t, "scenario", "suspicion_mult", s.swim.suspicion_mult, 1, 100);
  }
  if (root.contains("network")) {
    const auto& t = root.at("network");
    only(t, "network", {"latency_ms", "jitter_ms", "loss", "regions", "link"});
    s.latency_ms = number(t, "network", "latency_ms", 1, 0, 60000);
    s.jitter_ms = number(t, "network", "jitter_ms", 0, 0, 60000);
    s.loss = number(t, "network", "loss", 0, 0, 1);
    if (t.contains("regions")) {
      const auto& r = t.at("regions");
      if (!r.is_array()) throw Bad{fmt::format("{}: network.regions must list region names", where(r))};
      for (const auto& name : r.as_array()) {
        if (!name.is_string()) throw Bad{fmt::format("{}: network.regions must list region names", where(name))};
        s.regions.push_back(name.as_string().str);
      }
    }
    if (t.contains("link")) {
      const auto& links = t.at("link");
      if (!links.is_array()) throw Bad{fmt::format("{}: network.link must be [[network.link]] tables", where(links))};
      int i = 0;
      for (const auto& l : links.as_array()) {
        const std::string name = fmt::format("network.link[{}]", ++i);
        only(l, name, {"between", "latency_ms", "jitter_ms", "loss"});
        if (!l.contains("between") || !l.at("between").is_array() || l.at("between").as_array().size() != 2)
          throw Bad{fmt::format("{}: {}.between must name two regions", where(l), name)};
        const auto& pair = l.at("between").as_array();
        if (!pair[0].is_string() || !pair[1].is_string())
          throw Bad{fmt::format("{}: {}.between must name two regions", where(l), name)};
        std::string a = pair[0].as_string().str, b = pair[1].as_string().str;
        for (const auto& region : {a, b})
          if (std::find(s.regions.begin(), s.regions.end(), region) == s.regions.end())
            throw Bad{fmt::format("{}: {}.between names \"{}\", which is not in network.regions", where(l), name,
                                  region)};
        if (b < a) std::swap(a, b);
        s.links[{a, b}] = {number(l, name, "latency_ms", s.latency_ms, 0, 60000),
                           number(l, name, "jitter_ms", s.jitter_ms, 0, 60000), number(l, name, "loss", s.loss, 0, 1)};
      }
    }
  }
  if (root.contains("fault")) {
    const auto& faults = root.at("fault");
    if (!faults.is_array()) throw Bad{fmt::format("{}: fault must be [[fault]] tables", where(faults))};
    int i = 0;
    for (const auto& f : faults.as_array()) {
      const std::string name = fmt::format("fault[{}]", ++i);
      only(f, name, {"kind", "at_s", "duration_s", "nodes", "first", "last", "count", "fraction", "service_ms",
                     "stall_every_ms", "stall_min_ms", "stall_max_ms", "timers_first"});
      if (!f.contains("kind")) throw Bad{fmt::format("{}: {} needs a kind", where(f), name)};
      const std::string kind = toml::find<std::string>(f, "kind");
      static const std::map<std::string, Fault::Kind> kinds{
          {"kill", Fault::Kind::kill},           {"restart", Fault::Kind::restart}, {"pause", Fault::Kind::pause},
          {"partition", Fault::Kind::partition}, {"join", Fault::Kind::join},       {"leave", Fault::Kind::leave},
          {"load", Fault::Kind::load}};
      auto k = kinds.find(kind);
      if (k == kinds.end())
        throw Bad{fmt::format("{}: {}.kind \"{}\" is not one of kill, restart, pause, partition, join, leave, load",
                              where(f.at("kind")), name, kind)};
      Fault fault{k->second, number(f, name, "at_s", 0, 0, s.duration_s), number(f, name, "duration_s", 0, 0, 86400),
                  node_list(f, name, s.nodes), static_cast<int>(number(f, name, "count", 0, 0, 20000)), 0, {}};
      if (fault.kind == Fault::Kind::load) load_knobs(f, name, fault);
      else
        for (const char* key :
             {"fraction", "service_ms", "stall_every_ms", "stall_min_ms", "stall_max_ms", "timers_first"})
          if (f.contains(key))
            throw Bad{fmt::format("{}: {}.{} applies only to kind = \"load\"", where(f.at(key)), name, key)};
      s.faults.push_back(std::move(fault));
    }
  }
  if (root.contains("invariants")) {
    const auto& t = root.at("invariants");
    only(t, "invariants", {"converge", "killed_detected", "no_false_positives", "one_coordinator", "join_rounds"});
    s.converge = boolean(t, "invariants", "converge", true);
    s.killed_detected = boolean(t, "invariants", "killed_detected", true);
    s.no_false_positives = boolean(t, "invariants", "no_false_positives", true);
    s.one_coordinator = boolean(t, "invariants", "one_coordinator", true);
    s.join_rounds = boolean(t, "invariants", "join_rounds", false);
  }
  return s;
}

}  // namespace

std::expected<Scenario, std::string> load_scenario(const std::filesystem::path& file) {
  try {
    auto s = parse(toml::parse(file.string()));
    if (s.name.empty()) s.name = file.stem().string();
    return s;
  } catch (const Bad& b) {
    return std::unexpected(b.message);
  } catch (const std::exception& e) {
    return std::unexpected(fmt::format("{}: {}", file.string(), e.what()));
  }
}

}  // namespace tepdist::sims

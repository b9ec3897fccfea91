#include "actors/roles/monitor.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/local_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include <algorithm>
#include <random>

#include "actors/router.hpp"

namespace tepdist::actors {
namespace {

struct MonitorState {
  MonitorOptions o;
  caf::actor router;
  elastic::FigureTable table;
  std::vector<std::string> known;  // the ids of the view at the last round
  std::mt19937_64 random;
  std::pair<double, uint64_t> steps{0, 0};  // the step-time histogram's sum and count at the last round
  static inline const char* name = "tepdist.monitor";
};
using Monitor = caf::stateful_actor<MonitorState>;

/// This node's summary from its router's status answer and its registry. `steps`: the step-time
/// histogram's sum and count at the last round (the mean step time is of the steps since).
elastic::NodeFigures own_figures(const MonitorOptions& o, const gossip::StateSync& sync, std::pair<double, uint64_t>& steps) {
  elastic::NodeFigures f;
  f.unix_ms = unix_ms();
  if (o.metrics) {
    f.values["bytes_in"] = static_cast<double>(o.metrics->counter_total("tepdist_transport_received_bytes_total"));
    f.values["bytes_out"] = static_cast<double>(o.metrics->counter_total("tepdist_transport_sent_bytes_total"));
    f.values["send_queue_bytes"] = o.metrics->gauge_total("tepdist_transport_send_queue_bytes");
    const auto now = o.metrics->histogram_total("tepdist_train_step_seconds");
    if (now.second > steps.second) f.values["step_seconds"] = (now.first - steps.first) / static_cast<double>(now.second - steps.second);
    steps = now;
  }
  if (const auto& j = sync.job) {
    f.values["job_id"] = static_cast<double>(j->job_id);
    f.values["generation"] = static_cast<double>(j->generation);
    f.values["step"] = static_cast<double>(j->progress.step);
    f.values["position"] = static_cast<double>(j->progress.position);
    f.values["loss"] = j->loss;
    f.values["lr"] = j->lr;
    const auto load = std::ranges::find(j->loads, o.self_id, &gossip::WorkerLoad::worker);
    if (load != j->loads.end() && load->samples_per_second > 0) f.values["samples_per_second"] = load->samples_per_second;
    if (!j->evaluations.empty()) f.values["test_accuracy"] = j->evaluations.back().accuracy;
    // Async: the recent staleness of this worker's applied pushes (none before its first answer).
    if (j->mode == "async" && o.metrics)
      if (const auto v = o.metrics->gauge_value("tepdist_worker_staleness", {{"mode", "async"}})) f.values["staleness"] = *v;
  }
  return f;
}

/// One round: this node's summary into the table, the table to a few live members, and to the router.
void round(Monitor* self) {
  self->request(self->state.router, std::chrono::seconds(2), get_atom::value, status_atom::value)
      .then(
          [self](const gossip::StateSync& sync) {
            auto& s = self->state;
            s.known.clear();
            std::vector<const gossip::Member*> peers;
            for (const auto& m : sync.members) {
              s.known.push_back(m.id);
              if (m.id != s.o.self_id && m.state == gossip::Member::State::alive &&
                  std::ranges::find(m.roles, std::string("monitor")) != m.roles.end())
                peers.push_back(&m);
            }
            s.table[s.o.self_id] = own_figures(s.o, sync, s.steps);
            // Membership forgot them: so does the table (and no made-up id stays).
            std::erase_if(s.table, [&](const auto& e) {
              return e.first != s.o.self_id && std::ranges::find(s.known, e.first) == s.known.end();
            });
            const auto snapshot = elastic::snapshot_of(s.table);
            std::shuffle(peers.begin(), peers.end(), s.random);
            if (s.o.transport)
              for (size_t i = 0; i < std::min(s.o.fanout, peers.size()); ++i)
                s.o.transport->send(peers[i]->address, {s.o.self_id, s.o.incarnation, s.o.cluster_id, snapshot});
            caf::anon_send(s.router, monitor_atom::value, snapshot);
          },
          [](const caf::error&) {});  // a router busy for 2 s: the next round asks again
}

caf::behavior monitor(Monitor* self, MonitorOptions o, caf::actor router) {
  self->state.o = std::move(o);
  self->state.router = std::move(router);
  self->state.random.seed(self->state.o.incarnation);
  caf::anon_send(self->state.router, monitor_atom::value, caf::actor_cast<caf::actor>(self));
  self->send(self, tick_atom::value);
  return {
      [self](get_atom) { return self->state.o.metrics ? self->state.o.metrics->render_prometheus() : std::string(); },
      [self](tick_atom) {
        round(self);
        self->delayed_send(self, self->state.o.every, tick_atom::value);
      },
      [self](wire_atom, const std::string&, const std::string&, const gossip::Message& m) {
        const auto* snapshot = std::get_if<gossip::MetricsSnapshot>(&m.body);
        if (!snapshot) return;
        auto& s = self->state;
        // Its own figures only this node takes; the others' as long as membership knows them.
        auto in = elastic::table_of(*snapshot);
        in.erase(s.o.self_id);
        if (elastic::merge_figures(s.table, in, s.known))
          caf::anon_send(s.router, monitor_atom::value, elastic::snapshot_of(s.table));
      },
  };
}

}  // namespace

RoleSpec monitor_role(MonitorOptions options, caf::actor router) {
  return {"monitor", [options, router](caf::local_actor& parent, const caf::actor&, const caf::message&) {
            return caf::actor(parent.spawn(monitor, options, router));
          }};
}

}  // namespace tepdist::actors

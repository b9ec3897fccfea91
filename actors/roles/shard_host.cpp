#include "actors/roles/shard_host.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <fmt/format.h>

#include <algorithm>

#include "actors/atoms.hpp"
#include "actors/router.hpp"

namespace tepdist::actors {
namespace {

using gossip::ShardUpdate;

struct Host {
  std::shared_ptr<ShardHostInit> init;

  void send(const std::string& address, gossip::Body body) const {
    gossip::Message m{init->self_id, init->incarnation, init->cluster_id, std::move(body)};
    if (address == init->self_address) {
      caf::anon_send(init->trainer, wire_atom::value, init->self_id, init->self_address, std::move(m));
      return;
    }
    if (!init->transport->send(address, m))
      node_events().warn("send_refused peer={} reason=\"send queue full\"", address);
  }

  /// The address of a worker of the job, or empty when the peer is not one.
  std::string worker_address(const std::string& peer) const {
    const auto it = std::find(init->workers.begin(), init->workers.end(), peer);
    return it == init->workers.end() ? std::string() : init->addresses[static_cast<size_t>(it - init->workers.begin())];
  }

  void refuse(const std::string& peer, const ShardUpdate& u, const std::string& why) const {
    node_events().warn("shard_update_refused job={} from={} shard={} reason=\"{}\"", u.job_id, peer, u.shard, why);
  }

  void on_update(const std::string& peer, const ShardUpdate& u) {
    if (u.job_id != init->job_id) return refuse(peer, u, fmt::format("not job {}", init->job_id));
    const auto it = init->shards.find(u.shard);
    if (it == init->shards.end()) return refuse(peer, u, "this node holds no such shard");
    auto& server = *it->second;
    const bool primary = init->placement[u.shard].front() == init->self_id;
    switch (u.kind) {
      case ShardUpdate::Kind::push:
      case ShardUpdate::Kind::pull: {
        const auto to = worker_address(peer);
        if (to.empty()) return refuse(peer, u, "not a worker of the job");
        if (!primary) return refuse(peer, u, "this node is a replica of the shard, not its primary");
        if (u.kind == ShardUpdate::Kind::pull) return send(to, server.state());
        if (u.origin != peer) return refuse(peer, u, fmt::format("an update that names {} as its worker", u.origin));
        elastic::Outgoing<ShardUpdate> replicas;
        auto answer = server.on_push(u, to, replicas);
        if (!answer) return refuse(peer, u, answer.error());
        // Refusals are counted where they are recomputed, by the worker (stale_rejected).
        if (!answer->rejected && !answer->duplicate) {
          ++init->counters->applied;
          init->counters->staleness_sum += answer->staleness;
        }
        send(to, std::move(*answer));
        for (auto& [address, update] : replicas) send(address, std::move(update));
        return;
      }
      case ShardUpdate::Kind::replicate: {
        if (peer != init->placement[u.shard].front()) return refuse(peer, u, "not the shard's primary");
        auto through = server.on_replicate(u);
        if (!through) return refuse(peer, u, through.error());
        // The primary counts the update durable once every replica has acked it.
        return send(worker_address(peer), ShardUpdate{u.job_id, u.shard, ShardUpdate::Kind::ack, *through, 0, {}});
      }
      case ShardUpdate::Kind::ack: {
        if (!primary) return refuse(peer, u, "an ack to a replica of the shard");
        elastic::Outgoing<gossip::ShardState> notices;
        if (auto ok = server.on_ack(worker_address(peer), u.version, notices); !ok) return refuse(peer, u, ok.error());
        for (auto& [address, notice] : notices) send(address, std::move(notice));
        return;
      }
    }
  }
};

caf::behavior shard_host(caf::event_based_actor*, std::shared_ptr<ShardHostInit> init) {
  auto host = std::make_shared<Host>(Host{std::move(init)});
  return {
      [host](wire_atom, const std::string& peer, const std::string&, const gossip::Message& m) {
        if (const auto* u = std::get_if<ShardUpdate>(&m.body)) host->on_update(peer, *u);
      },
  };
}

}  // namespace

caf::actor spawn_shard_host(caf::local_actor& parent, std::shared_ptr<ShardHostInit> init) {
  return parent.spawn<caf::detached>(shard_host, std::move(init));
}

}  // namespace tepdist::actors

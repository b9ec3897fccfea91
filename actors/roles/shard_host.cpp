#include "actors/roles/shard_host.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include "actors/atoms.hpp"
#include "actors/router.hpp"
#include "base/thread_name.hpp"
#include "elastic/state_transfer.hpp"

namespace tepdist::actors {
namespace {

using gossip::ShardTransfer;
using gossip::ShardUpdate;

struct Host {
  caf::event_based_actor* self = nullptr;
  std::shared_ptr<ShardHostInit> init;
  std::shared_ptr<const ShardHostPlan> plan;  // the installed generation's; null before the first
  ShardOptimizerFactory make_optimizer;       // the job's, or the one a release set
  // Set by a release that changed the optimiser to another layout: how many buffers a copy of the
  // layout before has (such a copy starts afresh in that generation).
  std::optional<size_t> buffers_before;
  uint64_t generation = 0;

  struct Held {
    std::unique_ptr<elastic::ShardServer> server;  // null while its state is fetched
    bool primary = false;
    bool holder = false;  // of this generation (else only kept as its source)
    // While fetching: the copy this node held in the generation before, its snapshot and digest.
    // Should the source answer that it is current, this node takes it instead of the same bytes.
    std::optional<elastic::ShardSnapshot> own;
    uint64_t own_digest = 0;
    // A striped fetch under way: the source's manifest (no values), and the pieces coming.
    struct Striped {
      ShardTransfer manifest;
      std::vector<float> flat;  // values, then each optimiser buffer
      std::optional<elastic::StatePuller> puller;
      std::chrono::steady_clock::time_point progress;  // the last piece (or the start)
    };
    std::optional<Striped> striped;
    bool whole_only = false;  // a striped fetch failed: asked for whole from here on (this generation)
    bool released = false;    // the state has what this generation's release set
  };
  std::map<uint32_t, Held> shards;
  // A copy of each shard larger than a piece this node held with its state as the generation was
  // placed: what a striped fetch of the generation pulls, here and from the others that held the
  // same state, while the copies in use move on. Let go at the next placement or frozen_keep after.
  struct Frozen {
    std::shared_ptr<std::vector<float>> flat;  // values, then each optimiser buffer (never written)
    uint64_t version = 0, digest = 0;
    int64_t optimizer_steps = 0;
    elastic::UpdateMarks marks;
    std::vector<std::string> donors;  // this node and the shard's other holders of the generation before
    bool released = false;            // with what this generation's release set
  };
  std::map<uint32_t, Frozen> frozen;
  std::chrono::steady_clock::time_point frozen_until;  // kept while pulls come, frozen_keep after the last
  static constexpr std::chrono::seconds frozen_keep{60};
  static constexpr std::chrono::seconds striped_limit{30};  // no piece for this long: the shard is fetched whole
  static constexpr double stripe_retry_ms = 2000;
  // A release's optimiser of another layout: the buffers a copy of the new one has.
  size_t buffers_after = 0;
  // Per shard this node is primary of, per worker: the cursor its latest applied push carried in
  // this generation (a checkpoint's cut).
  std::map<uint32_t, std::map<std::string, uint64_t>> cursors;
  // Left out of the generation: the (holder, shard) fetches this node still owes as their source.
  std::set<std::pair<std::string, uint32_t>> owed;
  bool ready = false;  // every shard held in this generation has its state (logged once)
  // Messages this node cannot take yet: for a shard being fetched, or of a generation it has not
  // installed. Bounded; taken again at each install and each transfer.
  struct Waiting {
    std::string peer;
    gossip::Message message;
  };
  std::vector<Waiting> waiting;
  size_t waiting_bytes = 0;
  static constexpr size_t waiting_limit = 256u << 20;

  void send(const std::string& address, gossip::Body body) const {
    gossip::Message m{init->self_id, init->incarnation, init->cluster_id, std::move(body)};
    if (address == init->self_address) {
      caf::anon_send(init->trainer, wire_atom::value, init->self_id, init->self_address, std::move(m));
      return;
    }
    // A full queue to a live peer is back-pressure: wait for room (this host has a thread of its
    // own), rather than drop an answer the worker would wait for until it resends.
    if (!init->transport->send(address, m, send_wait) && !init->transport->stopping())
      node_events().warn("send_refused peer={} reason=\"send queue full for {} s\"", address, send_wait.count());
  }
  static constexpr std::chrono::seconds send_wait{5};

  /// The address of a worker of the installed generation, or empty when the peer is not one.
  std::string worker_address(const std::string& peer) const {
    if (!plan) return {};
    const auto it = std::find(plan->workers.begin(), plan->workers.end(), peer);
    return it == plan->workers.end() ? std::string() : plan->addresses[static_cast<size_t>(it - plan->workers.begin())];
  }

  template <class M>
  void refuse(const std::string& peer, const M& u, const std::string& why) const {
    node_events().warn("shard_update_refused job={} from={} shard={} reason=\"{}\"", u.job_id, peer, u.shard, why);
  }

  void wait(const std::string& peer, gossip::Message m, size_t bytes) {
    if (waiting_bytes + bytes > waiting_limit) {
      node_events().warn("message_dropped from={} kind={} reason=\"the shard host already holds {} MiB for later\"",
                         peer, gossip::kind_name(m.body), waiting_bytes >> 20);
      return;
    }
    waiting_bytes += bytes;
    waiting.push_back({peer, std::move(m)});
  }

  /// What waited: taken again (what still cannot be taken waits again).
  void retry_waiting() {
    std::vector<Waiting> again;
    again.swap(waiting);
    waiting_bytes = 0;
    for (auto& w : again) on_message(w.peer, {}, std::move(w.message));  // shard updates: no answer to an address
  }

  elastic::ShardServer::Options options(uint32_t s) const {
    elastic::ShardServer::Options o{init->job_id, s, init->max_staleness, {}, init->max_lr};
    const auto& holders = plan->plan.placement[s];
    if (holders.empty() || holders.front() != init->self_id) return o;
    const std::string& source = plan->plan.sources[s];
    for (auto r = holders.begin() + 1; r != holders.end(); ++r) {
      o.replicas.push_back(worker_address(*r));
      if (*r == source) o.source_replica = o.replicas.back();
    }
    return o;
  }

  /// What this generation's release set, on a snapshot of shard s from before it: the program's
  /// parameters (`values`: only to a state without them; one with them may have updates since),
  /// and the optimiser's new layout (a copy of the old one starts afresh; told by its buffer count,
  /// so applying it twice changes nothing).
  std::expected<void, std::string> apply_release(uint32_t s, elastic::ShardSnapshot& snap, bool values) const {
    if (values && plan->reset) {
      const auto r = elastic::shard_range(init->elements, init->shards, s);
      if (plan->reset->size() != init->elements || snap.values.size() != r.size())
        return std::unexpected(fmt::format("the parameters the program set hold {} values; the job has {}",
                                           plan->reset->size(), init->elements));
      std::copy(plan->reset->begin() + static_cast<ptrdiff_t>(r.begin),
                plan->reset->begin() + static_cast<ptrdiff_t>(r.end), snap.values.begin());
    }
    if (buffers_before && snap.optimizer.size() == *buffers_before) {
      snap.optimizer.assign(buffers_after, std::vector<float>(snap.values.size(), 0.0f));
      snap.optimizer_steps = 0;
    }
    return {};
  }

  /// A holder's server from a snapshot of the shard; `released`: the snapshot has this
  /// generation's release (else it is applied here).
  std::expected<std::unique_ptr<elastic::ShardServer>, std::string> restore(uint32_t s, elastic::ShardSnapshot snap,
                                                                          bool released) {
    auto optimizer = make_optimizer(snap.values.size());
    if (!optimizer) return std::unexpected(optimizer.error());
    if (auto ok = apply_release(s, snap, !released); !ok) return std::unexpected(ok.error());
    auto server = elastic::ShardServer::restore(options(s), std::move(snap), std::move(*optimizer));
    if (!server) return std::unexpected(server.error());
    return std::make_unique<elastic::ShardServer>(std::move(*server));
  }

  /// Once every shard held in this generation has its state: said once (tests and operators
  /// wait for it before the next fault).
  void maybe_ready() {
    if (ready || !plan) return;
    for (const auto& [s, h] : shards)
      if (h.holder && !h.server) return;
    ready = true;
    node_events().info("shards_ready job={} generation={} held={}", init->job_id, generation,
                       std::count_if(shards.begin(), shards.end(), [](const auto& e) { return e.second.holder; }));
    // A drain may be waiting for this to know what the node holds (AsyncDriver::hand_over).
    init->counters->ready_in = generation;
    caf::anon_send(init->trainer, handover_atom::value);
  }

  /// What the trainer's acks report: the shards held in this generation with their state (a
  /// copy kept only for others to fetch is not one to continue from), and cursors from now on.
  void publish_installed() const {
    std::map<uint32_t, uint64_t> held;
    for (const auto& [s, h] : shards)
      if (h.server && h.holder) held[s] = h.server->version();
    init->counters->installed(generation, std::move(held));
  }

  /// Asks shard s's source for its state, naming the copy this node holds (if it does); `whole`:
  /// in one transfer, not striped.
  void fetch(uint32_t s, const Held& h, bool whole = false) const {
    ShardUpdate u{init->job_id, s, ShardUpdate::Kind::fetch, 0, 0, {}, init->self_id, 0, 0, whole, generation};
    if (h.own) {
      u.version = h.own->version;
      u.digest = h.own_digest;
    }
    send(s < plan->source_addresses.size() ? plan->source_addresses[s] : worker_address(plan->plan.sources[s]), u);
  }

  /// Shards still being fetched are asked for again, should a fetch or its answer be lost, or
  /// come to a source not yet there.
  void refetch(uint64_t g) {
    if (g != generation || !plan) return;
    bool waiting_for_any = false;
    for (auto& [s, h] : shards) {
      if (!h.holder || h.server) continue;
      waiting_for_any = true;
      if (!h.striped) {
        fetch(s, h, h.whole_only);
      } else if (std::chrono::steady_clock::now() - h.striped->progress > striped_limit) {
        node_events().warn("shard_stripes_abandoned job={} generation={} shard={} reason=\"no piece came for {} s\"",
                           init->job_id, generation, s, striped_limit.count());
        fetch_whole(s, h);
      } else {
        std::vector<std::pair<std::string, gossip::StatePull>> again;
        h.striped->puller->on_tick(now_ms(), again);
        for (auto& [address, pull] : again) send(address, std::move(pull));
      }
    }
    if (waiting_for_any) schedule_refetch();
  }

  static double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  /// Shard s's state as this node held it at the placement, with what the new generation's
  /// release set (Frozen): the state a striped fetch pulls. `donors`: this node and the shard's
  /// other holders of the generation before. Each serves only a copy of this very state (the
  /// digest), so one whose copy is another (a replica an update behind) is passed over.
  void freeze(uint32_t s, elastic::ShardSnapshot snap, std::vector<std::string> donors) {
    if (!apply_release(s, snap, true)) return;
    Frozen f;
    f.version = snap.version;
    f.digest = elastic::state_digest(snap);
    f.optimizer_steps = snap.optimizer_steps;
    f.marks = std::move(snap.marks);
    f.donors = std::move(donors);
    f.released = plan->reset || plan->optimizer;
    const size_t total = snap.values.size() * (1 + snap.optimizer.size());
    f.flat = std::make_shared<std::vector<float>>(std::move(snap.values));
    f.flat->reserve(total);
    for (const auto& b : snap.optimizer) f.flat->insert(f.flat->end(), b.begin(), b.end());
    frozen[s] = std::move(f);
  }

  /// A striped fetch of shard s failed: from here on in this generation, it comes whole.
  void fetch_whole(uint32_t s, Held& h) {
    h.striped.reset();
    h.whole_only = true;
    fetch(s, h, true);
  }

  /// Each resend_every: what a replica of a shard this node is primary of has not acked, its ack
  /// standing still for a whole tick (a replication dropped on a full send queue or a full
  /// buffer), goes to it again.
  void tick() {
    for (auto& [s, h] : shards) {
      if (!h.primary || !h.server) continue;
      elastic::Outgoing<ShardUpdate> again;
      h.server->on_tick(again);
      std::map<std::string, size_t> updates;
      for (auto& [address, update] : again) {
        ++updates[address];
        update.generation = generation;
        send(address, std::move(update));
      }
      for (const auto& [address, n] : updates)
        node_events().info("replication_resent job={} shard={} to={} updates={} reason=\"its ack stood still for {} s\"",
                           init->job_id, s, address, n, resend_every.count());
    }
    self->delayed_send(self, resend_every, tick_atom::value);
  }
  static constexpr std::chrono::seconds resend_every{1};

  void unfreeze(uint64_t g) {
    if (g != generation || frozen.empty()) return;
    const auto now = std::chrono::steady_clock::now();
    if (now < frozen_until)  // pulls came since: kept for frozen_keep after the last
      return self->delayed_send(self, std::chrono::duration_cast<std::chrono::milliseconds>(frozen_until - now) +
                                          std::chrono::milliseconds(1),
                                unfreeze_atom::value, g);
    frozen.clear();
  }

  void schedule_refetch() const {
    self->delayed_send(self, std::chrono::seconds(2), refetch_atom::value, generation);
  }

  void lost(const std::string& why) const {
    node_events().warn("shard_lost job={} generation={} reason=\"{}\"", init->job_id, generation, why);
    caf::anon_send(init->trainer, shardlost_atom::value, why);
  }

  /// A generation's plan: every shard this node holds in it starts from its source's state.
  void place(std::shared_ptr<const ShardHostPlan> next) {
    if (gather) end_gather(fmt::format("generation {} was installed meanwhile", next->generation));
    // The copies a striped fetch of the new generation pulls: of each shard larger than a piece
    // that this node held with its state, where the new generation has holders that will fetch it
    // (new ones, or every one when a release changes the state). Taken before the plan changes.
    frozen.clear();
    std::vector<std::tuple<uint32_t, elastic::ShardSnapshot, std::vector<std::string>>> to_freeze;
    const bool release = next->reset || next->optimizer;
    for (const auto& [s, h] : shards) {
      if (!h.server || !h.holder || s >= next->plan.placement.size()) continue;
      const auto& before = plan->plan.placement[s];
      const auto& after = next->plan.placement[s];
      const bool fetched = release || std::any_of(after.begin(), after.end(), [&](const std::string& id) {
        return std::find(before.begin(), before.end(), id) == before.end();
      });
      if (!fetched) continue;  // nobody fetches it: no copy (a snapshot copies the whole shard)
      auto snap = h.server->snapshot();
      if (snap.values.size() * (1 + snap.optimizer.size()) <= init->piece) continue;
      // Donors: this node and the shard's other holders that are still workers (one dead or gone
      // would hold its pieces back until they are asked again elsewhere).
      std::vector<std::string> donors{init->self_address};
      for (const auto& id : before)
        if (const auto w = std::find(next->workers.begin(), next->workers.end(), id);
            id != init->self_id && w != next->workers.end())
          donors.push_back(next->addresses[static_cast<size_t>(w - next->workers.begin())]);
      to_freeze.emplace_back(s, std::move(snap), std::move(donors));
    }
    plan = std::move(next);
    generation = plan->generation;
    ready = false;
    buffers_before.reset();
    if (plan->optimizer) {
      auto before = make_optimizer(1), after = plan->optimizer(1);
      if (!before || !after) return lost(fmt::format("the optimiser a release set: {}", before ? after.error() : before.error()));
      const size_t old_buffers = (*before)->state().size(), new_buffers = (*after)->state().size();
      if (!compute::same_layout(**before, **after)) {
        // A copy's buffer count says which layout it has; two layouts of one count could not be told apart.
        if (old_buffers == new_buffers)
          return lost(fmt::format("the optimiser a release set keeps {} buffers as the one before, of another kind",
                                  new_buffers));
        buffers_before = old_buffers;
        buffers_after = new_buffers;
      }
      make_optimizer = plan->optimizer;
      node_events().info("shard_optimizer_changed job={} generation={} carried={}", init->job_id, generation,
                         !buffers_before);
    }
    cursors.clear();  // they point into the lists of the generation before
    for (auto& [s, snap, donors] : to_freeze) freeze(s, std::move(snap), std::move(donors));
    if (!frozen.empty()) {
      frozen_until = std::chrono::steady_clock::now() + frozen_keep;
      self->delayed_send(self, frozen_keep, unfreeze_atom::value, generation);
    }
    std::map<uint32_t, Held> kept;
    std::string held;
    bool fetching = false;
    for (uint32_t s = 0; s < init->shards; ++s) {
      const auto& holders = plan->plan.placement[s];
      const bool holder = std::find(holders.begin(), holders.end(), init->self_id) != holders.end();
      const std::string& source = plan->plan.sources[s];
      auto old = shards.find(s);
      Held h{nullptr, holder && holders.front() == init->self_id, holder, std::nullopt, 0, std::nullopt, false, false};
      if (source.empty()) {  // the first generation: the job's initial parameters
        if (!holder) continue;
        const auto r = elastic::shard_range(init->elements, init->shards, s);
        auto optimizer = make_optimizer(r.size());
        if (!optimizer) return lost(fmt::format("shard {}: {}", s, optimizer.error()));
        if (plan->initial_optimizer) {
          auto state = (*optimizer)->state();
          if (state.size() != plan->initial_optimizer->size())
            return lost(fmt::format("shard {}: the checkpoint holds {} optimiser buffers; the shard's optimiser has {}", s,
                                    plan->initial_optimizer->size(), state.size()));
          for (size_t b = 0; b < state.size(); ++b)
            std::copy((*plan->initial_optimizer)[b].begin() + static_cast<ptrdiff_t>(r.begin),
                      (*plan->initial_optimizer)[b].begin() + static_cast<ptrdiff_t>(r.end), state[b].second.begin());
          (*optimizer)->set_steps(plan->initial_optimizer_steps);
        }
        h.server = std::make_unique<elastic::ShardServer>(
            options(s),
            std::vector<float>(plan->initial->begin() + static_cast<ptrdiff_t>(r.begin),
                               plan->initial->begin() + static_cast<ptrdiff_t>(r.end)),
            std::move(*optimizer));
      } else if (source == init->self_id) {
        // This node's state is the generation's: it carries on, with the new holders to replicate
        // to (they fetch it from here); not a holder any more, it keeps it only for them.
        if (old == shards.end() || !old->second.server) {
          lost(fmt::format("shard {}: generation {} names this node its source, but it does not hold it", s, generation));
          continue;
        }
        // A holder takes what a release set; a copy kept only for others is sent as it is.
        auto server = holder ? restore(s, old->second.server->snapshot(), false) : std::move(old->second.server);
        if (!server) return lost(fmt::format("shard {}: {}", s, server.error()));
        h.server = std::move(*server);
        h.released = holder && (plan->reset || plan->optimizer);
      } else if (holder) {
        // A holder in the generation before (its copy whole) offers its copy's digest: holders
        // that stayed usually hold the source's very state, and then nothing needs to move.
        if (old != shards.end() && old->second.server && old->second.holder) {
          h.own = old->second.server->snapshot();
          h.own_digest = elastic::state_digest(*h.own);
        }
        fetch(s, h);
        fetching = true;
      } else {
        continue;
      }
      if (holder) held += fmt::format("{}{}{}{}", held.empty() ? "" : ",", s, h.primary ? "p" : "r", h.server ? "" : "*");
      kept.emplace(s, std::move(h));
    }
    shards = std::move(kept);
    // Holding nothing in this generation, only copies for others to fetch: a leaver handing over.
    owed.clear();
    if (std::none_of(shards.begin(), shards.end(), [](const auto& e) { return e.second.holder; })) {
      for (uint32_t s = 0; s < init->shards; ++s)
        if (plan->plan.sources[s] == init->self_id)
          for (const auto& h : plan->plan.placement[s]) owed.emplace(h, s);
      node_events().info("shards_handing_over job={} generation={} fetches_owed={}", init->job_id, generation, owed.size());
      if (owed.empty()) handed_over();
    }
    publish_installed();
    caf::anon_send(init->trainer, handover_atom::value);  // an ack held back for the placement may go
    if (fetching) schedule_refetch();
    node_events().info("shards_placed job={} generation={} shards={} held={}", init->job_id, generation, init->shards,
                       held.empty() ? "-" : held);
    maybe_ready();
    retry_waiting();
  }

  /// A transfer's snapshot, or what is wrong with it.
  std::expected<elastic::ShardSnapshot, std::string> snapshot_of(const ShardTransfer& t) const {
    const auto r = elastic::shard_range(init->elements, init->shards, t.shard);
    const size_t n = r.size();
    if (n == 0 || t.chunk.offset != 0 || t.chunk.data.size() != t.chunk.total || t.chunk.data.size() < n ||
        t.chunk.data.size() % n != 0)
      return std::unexpected(fmt::format("{} values for a shard of {}", t.chunk.data.size(), n));
    if (!std::all_of(t.chunk.data.begin(), t.chunk.data.end(), [](float v) { return std::isfinite(v); }))
      return std::unexpected("values that are not finite");
    elastic::ShardSnapshot snap;
    snap.version = t.version;
    snap.optimizer_steps = t.optimizer_steps;
    snap.values.assign(t.chunk.data.begin(), t.chunk.data.begin() + static_cast<ptrdiff_t>(n));
    for (size_t k = n; k < t.chunk.data.size(); k += n)
      snap.optimizer.emplace_back(t.chunk.data.begin() + static_cast<ptrdiff_t>(k),
                                  t.chunk.data.begin() + static_cast<ptrdiff_t>(k + n));
    for (const auto& m : t.marks) snap.marks[m.worker] = {m.boot, m.seq};
    return snap;
  }

  void on_transfer(const std::string& peer, const ShardTransfer& t) {
    if (t.job_id != init->job_id || t.generation != generation || t.shard >= init->shards) return;  // an older generation's
    if (gather && !t.current && gather->pending.contains(t.shard) && peer == plan->plan.placement[t.shard].front())
      gathered(peer, t);
    const auto it = shards.find(t.shard);
    if (it == shards.end() || it->second.server || !it->second.holder) return;  // not fetched here, or already come
    if (peer != plan->plan.sources[t.shard]) return refuse(peer, t, "not the shard's source");
    if (!t.refused.empty()) return lost(fmt::format("shard {}: its source {} says: {}", t.shard, peer, t.refused));
    if (!t.current && !t.donors.empty()) {
      // A late manifest (of a fetch sent before the one under way), or one after a striped fetch
      // failed here (the whole state is on its way): not started again.
      const auto& st = it->second.striped;
      if (it->second.whole_only || (st && st->manifest.version == t.version && st->manifest.digest == t.digest)) return;
      return start_striped(t.shard, it->second, t);
    }
    std::expected<elastic::ShardSnapshot, std::string> snap;
    if (t.current) {
      if (!it->second.own || it->second.own->version != t.version)
        return refuse(peer, t, "said current, but this node holds no copy at that version");
      snap = std::move(*it->second.own);
    } else {
      snap = snapshot_of(t);
    }
    it->second.own.reset();
    if (!snap) return refuse(peer, t, snap.error());
    took(t.shard, it->second, std::move(*snap), t.released,
         fmt::format("from={} version={} kept_own={}", peer, t.version, t.current));
  }

  /// Shard s's state has come (or this node's own copy is it): the holder serves from here. A
  /// state the source holds that cannot be restored here (another size, another optimiser
  /// layout) would fail again each time: the shard is lost, saying why.
  void took(uint32_t s, Held& h, elastic::ShardSnapshot snap, bool released, const std::string& how) {
    auto server = restore(s, std::move(snap), released);
    if (!server) return lost(fmt::format("shard {}: its state cannot be taken here: {}", s, server.error()));
    h.server = std::move(*server);
    h.released = plan->reset || plan->optimizer;
    h.striped.reset();
    h.own.reset();
    init->counters->note_version(s, h.server->version());
    // A replica holds the shard from here: the primary counts what it holds as durable.
    if (!h.primary)
      send(worker_address(plan->plan.placement[s].front()),
           ShardUpdate{init->job_id, s, ShardUpdate::Kind::ack, h.server->version(), 0, {}, {}, 0, 0, false, generation});
    node_events().info("shard_fetched job={} generation={} shard={} {}", init->job_id, generation, s, how);
    maybe_ready();
    retry_waiting();
  }

  // -- Striped fetches --

  /// The source's manifest: the values and optimiser buffers come striped over its donors.
  void start_striped(uint32_t s, Held& h, const ShardTransfer& t) {
    const size_t n = elastic::shard_range(init->elements, init->shards, s).size();
    const size_t total = t.chunk.total;
    if (n == 0 || total < n || total % n != 0 || total / n > 1 + max_buffers || !t.chunk.data.empty()) {
      refuse(plan->plan.sources[s], t, fmt::format("a manifest of {} elements for a shard of {}", total, n));
      return fetch_whole(s, h);
    }
    Held::Striped st;
    st.manifest = t;
    st.manifest.chunk = {};
    st.flat.assign(total, 0.0f);
    std::vector<std::string> donors;
    for (const auto& d : t.donors)
      if (d != init->self_address && std::find(donors.begin(), donors.end(), d) == donors.end()) donors.push_back(d);
    st.puller.emplace(elastic::StatePuller::Options{init->job_id, t.version, total, init->piece, stripe_retry_ms,
                                                    std::move(donors), true, s, t.digest});
    st.progress = std::chrono::steady_clock::now();
    std::vector<std::pair<std::string, gossip::StatePull>> out;
    st.puller->start(now_ms(), out);
    node_events().info("shard_stripes_asked job={} generation={} shard={} version={} pieces={} donors={}", init->job_id,
                       generation, s, t.version, st.puller->pieces(), out.empty() ? 0 : st.manifest.donors.size());
    h.striped = std::move(st);
    for (auto& [address, pull] : out) send(address, std::move(pull));
  }
  static constexpr size_t max_buffers = 8;  // optimiser buffers a shard's state may have

  /// A donor's piece of a striped fetch; the last one completes it, checked against the digest.
  void on_piece(const std::string& peer, const std::string& address, const gossip::StatePiece& p) {
    if (p.job_id != init->job_id) return;
    const auto it = shards.find(p.chunk.shard);
    if (it == shards.end() || it->second.server || !it->second.striped) return;  // done, or not fetched so
    auto& st = *it->second.striped;
    const auto& donors = st.manifest.donors;
    if (std::find(donors.begin(), donors.end(), address) == donors.end()) {
      node_events().warn("shard_piece_refused job={} from={} shard={} reason=\"not a donor the source named\"",
                         init->job_id, peer, p.chunk.shard);
      return;
    }
    if (elastic::is_refusal(p)) {  // the donor does not hold that state: the next one is asked
      std::vector<std::pair<std::string, gossip::StatePull>> again;
      if (auto ok = st.puller->on_refusal(p, address, now_ms(), again); !ok)
        node_events().debug("shard_piece_refused job={} from={} shard={} reason=\"a refusal of another pull: {}\"",
                            init->job_id, peer, p.chunk.shard, ok.error());
      for (auto& [to, pull] : again) send(to, std::move(pull));
      return;
    }
    if (auto ok = st.puller->on_piece(p, elastic::StateView({std::span<float>(st.flat)})); !ok) {
      node_events().warn("shard_piece_refused job={} from={} shard={} reason=\"{}\"", init->job_id, peer, p.chunk.shard,
                         ok.error());
      return;
    }
    st.progress = std::chrono::steady_clock::now();
    if (!st.puller->done()) return;
    const uint32_t s = p.chunk.shard;
    const size_t n = elastic::shard_range(init->elements, init->shards, s).size();
    elastic::ShardSnapshot snap;
    snap.version = st.manifest.version;
    snap.optimizer_steps = st.manifest.optimizer_steps;
    snap.values.assign(st.flat.begin(), st.flat.begin() + static_cast<ptrdiff_t>(n));
    for (size_t k = n; k < st.flat.size(); k += n)
      snap.optimizer.emplace_back(st.flat.begin() + static_cast<ptrdiff_t>(k), st.flat.begin() + static_cast<ptrdiff_t>(k + n));
    for (const auto& m : st.manifest.marks) snap.marks[m.worker] = {m.boot, m.seq};
    const bool finite = std::all_of(st.flat.begin(), st.flat.end(), [](float v) { return std::isfinite(v); });
    if (!finite || elastic::state_digest(snap) != st.manifest.digest) {
      // A donor whose copy went another way at that version: the source sends it whole.
      node_events().warn("shard_stripes_refused job={} generation={} shard={} reason=\"{}\"", init->job_id, generation,
                         s, finite ? "the pieces do not make the source's digest" : "values that are not finite");
      return fetch_whole(s, it->second);
    }
    const auto pieces = st.puller->pieces();
    const auto donors_named = st.manifest.donors.size();
    const bool released = st.manifest.released;
    took(s, it->second, std::move(snap), released,
         fmt::format("from={} version={} kept_own=false striped pieces={} donors={}", plan->plan.sources[s],
                     st.manifest.version, pieces, donors_named));
  }

  /// A striped fetch's pull: served from this node's frozen copy, if it is the state asked for.
  void serve_pull(const std::string& peer, const std::string& address, const gossip::StatePull& pull) {
    if (pull.job_id != init->job_id || address.empty()) return;
    const auto f = frozen.find(pull.shard);
    if (f == frozen.end() || f->second.version != pull.step || f->second.digest != pull.digest) {
      // Said at once (a piece of nothing), so the asker asks the next holder without waiting.
      node_events().debug("shard_pull_refused job={} from={} shard={} version={} reason=\"{}\"", pull.job_id, peer,
                          pull.shard, pull.step, f == frozen.end() ? "no frozen copy here" : "another state here");
      return send(address, elastic::refusal_of(pull));
    }
    frozen_until = std::chrono::steady_clock::now() + frozen_keep;
    auto pieces = elastic::serve_state(pull, {init->job_id, 0, f->second.version},
                                       elastic::StateView({std::span<float>(*f->second.flat)}), init->piece);
    if (!pieces)
      return node_events().warn("shard_pull_refused job={} from={} shard={} reason=\"{}\"", pull.job_id, peer,
                                pull.shard, pieces.error());
    for (auto& piece : *pieces) send(address, std::move(piece));
  }

  // -- Checkpoints: rank 0's host gathers every shard --

  struct Gather {
    uint64_t id = 0;
    int tries = 0;
    std::set<uint32_t> pending;
    std::map<uint32_t, elastic::ShardSnapshot> got;
    std::map<uint32_t, std::map<std::string, uint64_t>> cursors;  // per shard, as its primary had them
  };
  std::optional<Gather> gather;
  static constexpr int gather_tries = 10;  // asked every 2 s

  /// The gathered shards, whole, into `out`; or what does not fit.
  std::string assemble(ShardGather& out) const {
    const size_t buffers = gather->got.begin()->second.optimizer.size();
    out.values.resize(init->elements);
    out.optimizer.assign(buffers, std::vector<float>(init->elements));
    out.optimizer_steps = std::numeric_limits<int64_t>::max();
    for (const auto& [s, snap] : gather->got) {
      const auto r = elastic::shard_range(init->elements, init->shards, s);
      const auto at = static_cast<ptrdiff_t>(r.begin);
      if (snap.values.size() != r.size() || snap.optimizer.size() != buffers)
        return fmt::format("shard {} came with {} values and {} optimiser buffers (expected {} and {})", s,
                           snap.values.size(), snap.optimizer.size(), r.size(), buffers);
      std::copy(snap.values.begin(), snap.values.end(), out.values.begin() + at);
      for (size_t b = 0; b < buffers; ++b) {
        if (snap.optimizer[b].size() != r.size())
          return fmt::format("shard {}'s optimiser buffer {} holds {} values, not {}", s, b, snap.optimizer[b].size(),
                             r.size());
        std::copy(snap.optimizer[b].begin(), snap.optimizer[b].end(), out.optimizer[b].begin() + at);
      }
      out.optimizer_steps = std::min(out.optimizer_steps, snap.optimizer_steps);
    }
    // A worker's positions are in the checkpoint as far as every shard holds them.
    for (const auto& [worker, c] : gather->cursors.begin()->second) {
      uint64_t least = c;
      for (const auto& [s, of_shard] : gather->cursors) {
        const auto it = of_shard.find(worker);
        least = std::min(least, it == of_shard.end() ? 0 : it->second);
      }
      out.cursors[worker] = least;
    }
    return {};
  }

  void end_gather(std::string error) {
    auto out = std::make_shared<ShardGather>();
    out->id = gather->id;
    out->error = error.empty() ? assemble(*out) : std::move(error);
    if (!out->error.empty()) out->values.clear(), out->optimizer.clear(), out->cursors.clear();  // nothing half-made
    gather.reset();
    const uint64_t id = out->id;
    caf::anon_send(init->trainer, gather_atom::value, id, std::shared_ptr<const ShardGather>(std::move(out)));
  }

  /// The trainer asks for every shard: those held here are taken now, the others fetched.
  void start_gather(uint64_t id) {
    if (gather) end_gather("a newer checkpoint was asked for");
    gather.emplace();
    gather->id = id;
    if (!plan || !ready) return end_gather("this node's shards are still being fetched for this generation");
    // From each shard's primary: a replica's copy may lag it, and only the primary knows the cursors.
    for (uint32_t s = 0; s < init->shards; ++s) {
      const auto it = shards.find(s);
      if (it != shards.end() && it->second.primary && it->second.server) {
        gather->got.emplace(s, it->second.server->snapshot());
        gather->cursors[s] = cursors[s];
      } else {
        gather->pending.insert(s);
      }
    }
    ask_gather();
  }

  void ask_gather() {
    if (gather->pending.empty()) return end_gather({});
    for (const auto s : gather->pending)
      send(worker_address(plan->plan.placement[s].front()),  // whole: a checkpoint takes the state as it is
           ShardUpdate{init->job_id, s, ShardUpdate::Kind::fetch, 0, 0, {}, init->self_id, 0, 0, true, generation});
    self->delayed_send(self, std::chrono::seconds(2), regather_atom::value, gather->id);
  }

  void regather(uint64_t id) {
    if (!gather || gather->id != id) return;
    if (++gather->tries >= gather_tries) {
      const uint32_t s = *gather->pending.begin();
      return end_gather(fmt::format("shard {}'s primary {} did not send it within {} s", s,
                                    plan->plan.placement[s].front(), 2 * gather_tries));
    }
    ask_gather();
  }

  void gathered(const std::string& peer, const ShardTransfer& t) {
    if (!t.refused.empty()) return;  // the primary is still fetching it: asked again at the next try
    auto snap = snapshot_of(t);
    if (!snap) return refuse(peer, t, snap.error());
    gather->pending.erase(t.shard);
    gather->got.insert_or_assign(t.shard, std::move(*snap));
    gather->cursors[t.shard] = {t.cursors.begin(), t.cursors.end()};
    if (gather->pending.empty()) end_gather({});
  }

  void handed_over() const {
    node_events().info("shards_handed_over job={} generation={}", init->job_id, generation);
    init->counters->handed_over_in = generation;
    caf::anon_send(init->trainer, handover_atom::value);
  }

  void serve_fetch(const std::string& peer, const ShardUpdate& u) {
    const auto to = worker_address(peer);
    if (to.empty()) return refuse(peer, u, "not a worker of the job");
    // Owed no more once sent: the transport delivers it before the node goes (a lost one would
    // be asked for again, from a node that may have gone: the next generation says so).
    const bool was_owed = owed.erase({peer, u.shard}) > 0;
    ShardTransfer t{init->job_id, u.shard, generation, 0, 0, {}};
    const auto it = shards.find(u.shard);
    if (it == shards.end() || !it->second.server) {
      t.refused = fmt::format("{} does not hold shard {} in generation {}", init->self_id, u.shard, generation);
      return send(to, std::move(t));
    }
    auto snap = it->second.server->snapshot();
    if (u.digest != 0 && u.version == snap.version && u.digest == elastic::state_digest(snap)) {
      // The asker holds this very state: it keeps its copy, and nothing else needs to travel.
      t.version = snap.version;
      t.current = true;
      t.released = it->second.released;
      send(to, std::move(t));
      if (was_owed && owed.empty()) handed_over();
      return;
    }
    // Striped: a manifest of the state frozen at the placement; the asker pulls it from every
    // holder of it (updates since come to a new replica from the primary, in version order). Not
    // from a leaver handing over: it goes once its fetches are served.
    const bool leaving = std::none_of(shards.begin(), shards.end(), [](const auto& e) { return e.second.holder; });
    if (const auto f = frozen.find(u.shard); !u.resend && !leaving && f != frozen.end() && f->second.donors.size() >= 2) {
      const auto& z = f->second;
      t.released = z.released;
      t.version = z.version;
      t.optimizer_steps = z.optimizer_steps;
      t.chunk = gossip::TensorChunk{z.version, u.shard, 0, z.flat->size(), {}, nullptr};
      t.digest = z.digest;
      t.donors = z.donors;
      for (const auto& [worker, mark] : z.marks) t.marks.push_back({worker, mark.boot, mark.seq});
      if (const auto c = cursors.find(u.shard); c != cursors.end()) t.cursors.assign(c->second.begin(), c->second.end());
      return send(to, std::move(t));
    }
    auto flat = std::make_shared<std::vector<float>>(snap.values);
    for (const auto& b : snap.optimizer) flat->insert(flat->end(), b.begin(), b.end());
    t.released = it->second.released;
    t.version = snap.version;
    t.optimizer_steps = snap.optimizer_steps;
    t.chunk = gossip::TensorChunk{snap.version, u.shard, 0, flat->size(), std::span<const float>(*flat), flat};
    for (const auto& [worker, mark] : snap.marks) t.marks.push_back({worker, mark.boot, mark.seq});
    if (const auto c = cursors.find(u.shard); c != cursors.end()) t.cursors.assign(c->second.begin(), c->second.end());
    send(to, std::move(t));
    if (was_owed && owed.empty()) handed_over();
  }

  void on_message(const std::string& peer, const std::string& address, gossip::Message m) {
    if (const auto* t = std::get_if<ShardTransfer>(&m.body)) return on_transfer(peer, *t);
    if (const auto* p = std::get_if<gossip::StatePiece>(&m.body)) return on_piece(peer, address, *p);
    if (const auto* p = std::get_if<gossip::StatePull>(&m.body)) return serve_pull(peer, address, *p);
    const auto* u = std::get_if<ShardUpdate>(&m.body);
    if (!u) return;
    if (u->job_id != init->job_id) return refuse(peer, *u, fmt::format("not job {}", init->job_id));
    if (u->generation < generation) return;  // its sender sends again in the new generation
    if (u->generation > generation || !plan) return wait(peer, std::move(m), u->chunk.data.size_bytes() + 64);
    if (u->shard >= init->shards) return refuse(peer, *u, fmt::format("no shard {} of {}", u->shard, init->shards));
    if (u->kind == ShardUpdate::Kind::fetch) return serve_fetch(peer, *u);
    const auto it = shards.find(u->shard);
    if (it == shards.end() || !it->second.holder) return refuse(peer, *u, "this node holds no such shard");
    if (!it->second.server) return wait(peer, std::move(m), u->chunk.data.size_bytes() + 64);  // being fetched
    on_update(peer, *u, it->second);
  }

  void on_update(const std::string& peer, const ShardUpdate& u, Held& held) {
    auto& server = *held.server;
    const auto& holders = plan->plan.placement[u.shard];
    switch (u.kind) {
      case ShardUpdate::Kind::push:
      case ShardUpdate::Kind::pull: {
        const auto to = worker_address(peer);
        if (to.empty()) return refuse(peer, u, "not a worker of the job");
        if (!held.primary) return refuse(peer, u, "this node is a replica of the shard, not its primary");
        if (u.kind == ShardUpdate::Kind::pull) {
          auto st = server.state();
          st.generation = generation;
          return send(to, std::move(st));
        }
        if (u.origin != peer) return refuse(peer, u, fmt::format("an update that names {} as its worker", u.origin));
        elastic::Outgoing<ShardUpdate> replicas;
        auto answer = server.on_push(u, to, replicas);
        if (!answer) return refuse(peer, u, answer.error());
        // Refusals are counted where they are recomputed, by the worker (stale_rejected).
        if (answer->duplicate) ++init->counters->duplicates;
        if (!answer->rejected && !answer->duplicate) {
          ++init->counters->applied;
          init->counters->staleness_sum += answer->staleness;
        }
        if (!answer->rejected) {
          init->counters->note_cursor(u.origin, u.consumed);
          auto& c = cursors[u.shard][u.origin];
          c = std::max(c, u.consumed);
        }
        if (!answer->rejected && !answer->duplicate) init->counters->note_version(u.shard, server.version());
        answer->generation = generation;
        send(to, std::move(*answer));
        for (auto& [address, update] : replicas) {
          update.generation = generation;
          send(address, std::move(update));
        }
        return;
      }
      case ShardUpdate::Kind::replicate: {
        if (peer != holders.front()) return refuse(peer, u, "not the shard's primary");
        // One the fetched state already holds (the source was the primary), or one sent again, is
        // acked again.
        auto through = server.on_replicate(u);
        if (!through) return refuse(peer, u, through.error());
        init->counters->note_version(u.shard, *through);
        // The primary counts the update durable once every replica has acked it.
        return send(worker_address(peer), ShardUpdate{u.job_id, u.shard, ShardUpdate::Kind::ack, *through, 0, {}, {}, 0, 0,
                                                      false, generation});
      }
      case ShardUpdate::Kind::ack: {
        if (!held.primary) return refuse(peer, u, "an ack to a replica of the shard");
        elastic::Outgoing<gossip::ShardState> notices;
        if (auto ok = server.on_ack(worker_address(peer), u.version, notices); !ok) return refuse(peer, u, ok.error());
        for (auto& [address, notice] : notices) {
          notice.generation = generation;
          send(address, std::move(notice));
        }
        return;
      }
      case ShardUpdate::Kind::fetch: return;  // served above
    }
  }
};

caf::behavior shard_host(caf::event_based_actor* self, std::shared_ptr<ShardHostInit> init) {
  base::name_this_thread("shard-host");  // detached: this is its own thread
  auto host = std::make_shared<Host>();
  host->self = self;
  host->init = std::move(init);
  host->make_optimizer = host->init->optimizer;
  self->delayed_send(self, Host::resend_every, tick_atom::value);
  return {
      [host](wire_atom, const std::string& peer, const std::string& address, const gossip::Message& m) {
        host->on_message(peer, address, m);
      },
      [host](place_atom, std::shared_ptr<const ShardHostPlan> plan) { host->place(std::move(plan)); },
      [host](refetch_atom, uint64_t generation) { host->refetch(generation); },
      [host](gather_atom, uint64_t id) { host->start_gather(id); },
      [host](regather_atom, uint64_t id) { host->regather(id); },
      [host](unfreeze_atom, uint64_t generation) { host->unfreeze(generation); },
      [host](tick_atom) { host->tick(); },
      // Fault injection: the host fails by itself, as a bug in it would (an exit the trainer sent
      // would not do: an actor drops its link to the sender of an exit before it goes).
      [self](hostcrash_atom) { self->quit(caf::make_error(caf::sec::runtime_error, "fault injection: the shard host fails")); },
  };
}

}  // namespace

caf::actor spawn_shard_host(caf::local_actor& parent, std::shared_ptr<ShardHostInit> init) {
  // Linked: a host that fails takes its trainer with it, which the supervisor restarts, and the
  // restarted trainer rejoins as a restarted member whose shards come back from their replicas
  // (elastic training, part 2). Unlinked, its shards would go unserved with nobody told.
  return parent.spawn<caf::detached + caf::linked>(shard_host, std::move(init));
}

}  // namespace tepdist::actors


#include "sims/simulation.hpp"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <queue>
#include <random>
#include <set>

#include "elastic/coordination.hpp"
#include "gossip/swim/swim.hpp"

namespace tepdist::sims {
namespace {

using gossip::Member;
using gossip::swim::Event;
using gossip::swim::Output;
using gossip::swim::Swim;

std::string node_id(int i) { return fmt::format("n{:05d}", i); }

/// An input a loaded node has yet to handle: a message, or its own tick.
struct Input {
  double ready_at;  // when it arrived, or fell due
  bool tick = false;
  std::string from;
  gossip::Body body;
};

struct Node {
  std::string id;
  std::unique_ptr<Swim> swim;
  bool running = false;       // killed or left nodes are not
  bool left = false;
  double paused_until = -1;   // paused while now < paused_until
  bool ever_killed = false, ever_paused = false;
  uint64_t incarnation = 1;
  uint64_t timer_generation = 0;
  double timer_at = -1;  // when the live timer is due
  // Simulated load: the machine's, so it outlives a restart of the node.
  std::unique_ptr<SimulatedCpu> cpu;  // none: every input is handled the moment it comes
  bool ever_loaded = false;
  std::deque<Input> inbox;            // waiting for the CPU, in arrival order; the front is next
  bool tick_queued = false;           // a tick waits in the inbox: it asks for the next one itself
  double work_began = 0;              // when the CPU began on the input being handled
  uint64_t handle_generation = 0;     // a restart empties the inbox; older handle actions are stale
};

struct Action {
  double at;
  uint64_t seq;  // ties broken by insertion order: deterministic
  enum class Kind { deliver, timer, fault, heal_check, handle, job } kind;
  int node = -1;             // deliver: to; timer, handle: whose
  uint64_t generation = 0;   // timer, handle: stale unless it matches the node's
  std::string from;          // deliver
  gossip::Body body;         // deliver
  size_t fault = 0;          // fault: index
};

/// The queue orders these small keys; the actions they name wait in a slab (a heap of whole
/// actions, message bodies and all, spent most of a large run moving them).
struct Key {
  double at;
  uint64_t seq;
  uint32_t slot;
  bool operator>(const Key& o) const { return at != o.at ? at > o.at : seq > o.seq; }
};

class Sim {
 public:
  Sim(const Scenario& s, uint64_t seed) : s_(s), rng_(seed) {
    report_.scenario = s.name;
    report_.seed = seed;
  }

  Report run() {
    const auto wall0 = std::chrono::steady_clock::now();
    // A formed cluster at time 0: every node starts knowing every other (a state sync applied
    // locally), so scenarios begin from steady state rather than from N joins at once.
    std::vector<Member> everyone;
    for (int i = 0; i < s_.nodes; ++i) everyone.push_back(member(i, 1));
    const auto interned = Swim::intern(*directory_, everyone);
    if (s_.job.enabled) {
      job_ = std::make_unique<SimJob>(s_.job);
      for (int i = 0; i < s_.nodes; ++i) founders_.push_back(node_id(i)), founder_boots_.push_back(1);
      push({s_.job.step_ms, 0, Action::Kind::job, -1, 0, "", {}, 0});
    }
    for (int i = 0; i < s_.nodes; ++i) start(i, 1, {}, &interned);
    for (size_t f = 0; f < s_.faults.size(); ++f) push({s_.faults[f].at_s * 1000, 0, Action::Kind::fault, -1, 0, "", {}, f});
    const double end = s_.duration_s * 1000;
    while (!queue_.empty() && queue_.top().at <= end) {
      const uint32_t slot = queue_.top().slot;
      queue_.pop();
      Action a = std::move(slab_[slot]);
      free_.push_back(slot);
      now_ = a.at;
      switch (a.kind) {
        case Action::Kind::deliver: deliver(a); break;
        case Action::Kind::timer: timer(a); break;
        case Action::Kind::fault: fault(s_.faults[a.fault]); break;
        case Action::Kind::heal_check: heal_check(); break;
        case Action::Kind::handle: handle(a); break;
        case Action::Kind::job: job_round(); break;
      }
    }
    now_ = end;
    check();
    report_.nodes = static_cast<int>(nodes_.size());
    report_.simulated_s = s_.duration_s;
    const double node_seconds = std::max(1.0, static_cast<double>(nodes_.size()) * s_.duration_s);
    report_.messages_per_node_s = static_cast<double>(messages_) / node_seconds;
    report_.bytes_per_node_s = static_cast<double>(bytes_) / node_seconds;
    report_.event_log_hash = hash_;
    report_.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    report_.peak_rss_mb = static_cast<double>(u.ru_maxrss) / 1024.0;
    return report_;
  }

 private:
  /// Each start of a node is a new run: its first incarnation doubles as its boot id.
  Member member(int i, uint64_t incarnation) const {
    return {node_id(i), node_id(i), incarnation, Member::State::alive, "sim", {"worker"}, {}, incarnation};
  }

  void push(Action a) {
    a.seq = seq_++;
    uint32_t slot;
    if (free_.empty()) {
      slot = static_cast<uint32_t>(slab_.size());
      slab_.push_back(std::move(a));
    } else {
      slot = free_.back();
      free_.pop_back();
      slab_[slot] = std::move(a);
    }
    queue_.push({slab_[slot].at, slab_[slot].seq, slot});
  }

  void start(int i, uint64_t incarnation, const std::vector<std::string>& seeds,
             const std::vector<Swim::Interned>* known) {
    if (static_cast<size_t>(i) >= nodes_.size()) {
      nodes_.resize(static_cast<size_t>(i) + 1);
      started_at_.resize(nodes_.size());
    }
    started_at_[static_cast<size_t>(i)] = now_;
    Node& n = nodes_[static_cast<size_t>(i)];
    n.id = node_id(i);
    n.incarnation = incarnation;
    n.running = true;
    n.left = false;
    n.paused_until = -1;
    n.timer_at = -1;
    n.inbox.clear();  // what the old process had not read dies with it
    n.tick_queued = false;
    ++n.handle_generation;
    n.swim = std::make_unique<Swim>(member(i, incarnation), s_.swim, [this](uint64_t k) { return rng_() % k; },
                                    directory_);
    if (job_) job_->start(n.id, incarnation, known != nullptr, founders_, founder_boots_);
    Output out;
    n.swim->join(now_, seeds, out);
    if (known) n.swim->adopt(now_, *known);  // the formed cluster's bookkeeping is not news
    apply(i, out);
  }

  bool paused(const Node& n) const { return now_ < n.paused_until; }

  void schedule_timer(int i) {
    Node& n = nodes_[static_cast<size_t>(i)];
    if (n.tick_queued) return;  // the queued tick runs tick(), which asks again after
    const double at = std::max(now_, paused(n) ? n.paused_until : n.swim->next_deadline_ms());
    // A timer already due no later serves: it runs tick(), which does what is due and asks again.
    // (Scheduling anew on every message left the queue mostly stale timers.)
    if (n.timer_at >= now_ && n.timer_at <= at) return;
    n.timer_at = at;
    push({at, 0, Action::Kind::timer, i, ++n.timer_generation, "", {}, 0});
  }

  void apply(int i, Output& out) {
    const Node& n = nodes_[static_cast<size_t>(i)];
    for (const auto& e : out.events) record(n.id, e);
    for (auto& send : out.sends) {
      ++messages_;
      bytes_ += 64 + body_bytes(send.body);
      const int to = std::stoi(send.address.substr(1));
      if (watched(n.id) || watched(send.address)) watch("sent", n.id, send.address, send.body);
      if (static_cast<size_t>(to) >= nodes_.size()) continue;
      const SimLink link = link_between(i, to);
      if (dropped(i, to, link.loss)) continue;
      std::normal_distribution<double> jitter(0.0, link.jitter_ms);
      const double delay = std::max(0.05, link.latency_ms + (link.jitter_ms > 0 ? jitter(rng_) : 0.0));
      push({now_ + delay, 0, Action::Kind::deliver, to, 0, n.id, std::move(send.body), 0});
    }
    schedule_timer(i);
    if (job_ && !out.events.empty()) {
      SimJob::Sends sends;
      job_->on_view(n.id, now_, n.swim->members(), sends);
      send_job(i, sends);
      send_shards();
    }
  }

  /// Job control's messages, over the same simulated links as membership's.
  void send_job(int from, SimJob::Sends& sends) {
    for (auto& send : sends) {
      ++messages_;
      const int to = std::stoi(send.to.substr(1));
      if (static_cast<size_t>(to) >= nodes_.size()) continue;
      const SimLink link = link_between(from, to);
      if (dropped(from, to, link.loss)) continue;
      std::normal_distribution<double> jitter(0.0, link.jitter_ms);
      const double delay = std::max(0.05, link.latency_ms + (link.jitter_ms > 0 ? jitter(rng_) : 0.0));
      push({now_ + delay, 0, Action::Kind::deliver, to, 0, node_id(from), std::move(send.body), 0});
    }
  }

  /// The async shard protocol's messages (sims/shards.hpp), from whichever node sent each. They
  /// travel as over the real transport's TCP lane: in order between two nodes and not lost at
  /// random; a partition loses what crosses it (a connection broken), as does a node not running.
  void send_shards() {
    for (auto& [sender, receiver, body] : job_->take_shard_sends()) {
      ++messages_;
      const int from = std::stoi(sender.substr(1)), to = std::stoi(receiver.substr(1));
      if (static_cast<size_t>(to) >= nodes_.size() || dropped(from, to, 0.0)) continue;
      const SimLink link = link_between(from, to);
      std::normal_distribution<double> jitter(0.0, link.jitter_ms);
      double at = now_ + std::max(0.05, link.latency_ms + (link.jitter_ms > 0 ? jitter(rng_) : 0.0));
      auto& last = in_order_[{from, to}];
      at = last = std::max(at, last);
      push({at, 0, Action::Kind::deliver, to, 0, node_id(from), std::move(body), 0});
    }
  }

  /// Every step_ms: generations that can step do; every 500 ms each node's job control ticks.
  void job_round() {
    auto ready = [this](const std::string& id) {
      const auto& n = nodes_[static_cast<size_t>(std::stoi(id.substr(1)))];
      return n.running && !paused(n);
    };
    auto reach = [this](const std::string& a, const std::string& b) {
      const int x = std::stoi(a.substr(1)), y = std::stoi(b.substr(1));
      for (const auto& [start, end, side] : partitions_)
        if (now_ >= start && now_ < end && side.count(x) != side.count(y)) return false;
      return true;
    };
    if (s_.job.drain_s > 0 && now_ >= (s_.duration_s - s_.job.drain_s) * 1000) job_->drain();
    job_->step(ready, reach);
    send_shards();
    if (++job_rounds_ % std::max<uint64_t>(1, static_cast<uint64_t>(500 / s_.job.step_ms)) == 0)
      for (size_t i = 0; i < nodes_.size(); ++i) {
        if (!nodes_[i].running || paused(nodes_[i])) continue;
        SimJob::Sends sends;
        job_->on_tick(nodes_[i].id, now_, sends);
        send_job(static_cast<int>(i), sends);
        send_shards();
      }
    push({now_ + s_.job.step_ms, 0, Action::Kind::job, -1, 0, "", {}, 0});
  }

  static size_t body_bytes(const gossip::Body& b) {
    size_t total = 0;
    auto add = [&](const std::vector<Member>& ms) {
      for (const auto& m : ms) total += gossip::swim::Dissemination::estimate_bytes(m);
    };
    std::visit(
        [&](const auto& m) {
          using T = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<T, gossip::Ping> || std::is_same_v<T, gossip::Ack>) add(m.updates);
          if constexpr (std::is_same_v<T, gossip::PingReq>) add(m.updates), total += 64;
          if constexpr (std::is_same_v<T, gossip::StateSync>) add(m.members);
          if constexpr (std::is_same_v<T, gossip::Join> || std::is_same_v<T, gossip::Leave>) total += 64;
        },
        b);
    return total;
  }

  /// The link between two nodes' regions, or the scenario's default one.
  SimLink link_between(int a, int b) const {
    const SimLink fallback{s_.latency_ms, s_.jitter_ms, s_.loss};
    if (s_.regions.empty()) return fallback;
    std::string ra = s_.regions[static_cast<size_t>(a) % s_.regions.size()],
                rb = s_.regions[static_cast<size_t>(b) % s_.regions.size()];
    if (rb < ra) std::swap(ra, rb);
    auto it = s_.links.find({ra, rb});
    return it == s_.links.end() ? fallback : it->second;
  }

  bool dropped(int from, int to, double loss) {
    for (const auto& [start, end, side] : partitions_)
      if (now_ >= start && now_ < end && side.count(from) != side.count(to)) return true;
    return loss > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < loss;
  }

  void deliver(Action& a) {
    Node& n = nodes_[static_cast<size_t>(a.node)];
    if (!n.running) return;
    if (paused(n)) {  // it reads its socket when it wakes
      a.at = n.paused_until;
      push(std::move(a));
      return;
    }
    if (std::holds_alternative<gossip::GenerationVote>(a.body) || std::holds_alternative<gossip::JobStart>(a.body) ||
        std::holds_alternative<gossip::ShardUpdate>(a.body) || std::holds_alternative<gossip::ShardState>(a.body)) {
      if (!job_) return;
      SimJob::Sends sends;
      job_->on_message(n.id, now_, a.from, a.body, sends);
      send_job(a.node, sends);
      return send_shards();
    }
    if (queues(n)) return enqueue(a.node, {now_, false, std::move(a.from), std::move(a.body)});
    if (watched(n.id)) watch("handled", n.id, a.from, a.body);
    Output out;
    n.swim->on_message(now_, a.from, a.from, a.body, out);  // ids double as addresses here
    apply(a.node, out);
  }

  void timer(const Action& a) {
    Node& n = nodes_[static_cast<size_t>(a.node)];
    if (!n.running || a.generation != n.timer_generation) return;
    n.timer_at = -1;  // this one is spent
    if (paused(n)) return schedule_timer(a.node);
    if (queues(n)) {
      n.tick_queued = true;
      return enqueue(a.node, {now_, true, "", {}});
    }
    Output out;
    n.swim->tick(now_, out);
    apply(a.node, out);
  }

  // ---- simulated load ----------------------------------------------------------------------

  /// Whether an input for this node must queue: inputs before it still wait, or its CPU is loaded.
  bool queues(Node& n) { return !n.inbox.empty() || (n.cpu && n.cpu->slows(now_, rng_)); }

  void enqueue(int i, Input in) {
    Node& n = nodes_[static_cast<size_t>(i)];
    n.inbox.push_back(std::move(in));
    if (n.inbox.size() == 1) schedule_handle(i);  // otherwise handling the one before schedules it
  }

  /// The node takes up its next input now; it is handled once the CPU has done it.
  void schedule_handle(int i) {
    Node& n = nodes_[static_cast<size_t>(i)];
    const Work w = n.cpu ? n.cpu->work(now_, rng_) : Work{now_, now_};
    n.work_began = w.began_ms;
    push({w.done_ms, 0, Action::Kind::handle, i, n.handle_generation, "", {}, 0});
  }

  /// Which queued input the CPU took up: the first to arrive, or with timers_first a tick that was
  /// due by the time a stall let the CPU choose.
  size_t next_input(const Node& n) const {
    if (!n.tick_queued || !n.cpu || !n.cpu->knobs().timers_first) return 0;
    for (size_t k = 0; k < n.inbox.size(); ++k)
      if (n.inbox[k].tick) return n.inbox[k].ready_at <= n.work_began ? k : 0;
    return 0;
  }

  /// A queued input is handled: the core is handed the time the node gets it done, as a loaded
  /// node's own clock would say, however long ago the input arrived or fell due.
  void handle(const Action& a) {
    Node& n = nodes_[static_cast<size_t>(a.node)];
    if (!n.running || a.generation != n.handle_generation || n.inbox.empty()) return;
    if (paused(n)) {
      push({n.paused_until, 0, Action::Kind::handle, a.node, a.generation, "", {}, 0});
      return;
    }
    const auto next = n.inbox.begin() + static_cast<ptrdiff_t>(next_input(n));
    Input in = std::move(*next);
    n.inbox.erase(next);
    note_lateness(n, in);
    Output out;
    if (in.tick) {
      n.tick_queued = false;
      n.swim->tick(now_, out);
    } else {
      if (watched(n.id)) watch("handled", n.id, in.from, in.body);
      n.swim->on_message(now_, in.from, in.from, in.body, out);
    }
    apply(a.node, out);
    if (!n.inbox.empty()) schedule_handle(a.node);
  }

  void note_lateness(const Node& n, const Input& in) {
    const double late_ms = now_ - in.ready_at;
    ++report_.loaded_inputs;
    report_.max_lateness_ms = std::max(report_.max_lateness_ms, late_ms);
    // Later than a probe timeout is what SWIM can notice: an ack handled that late may already
    // have been given up on, a tick that late sends its probe and its verdicts late.
    if (late_ms <= s_.swim.probe_timeout_ms) return;
    ++report_.late_inputs;
    if (in.tick) ++report_.late_ticks;
    if (trace_)
      fmt::print(stderr, "{:.3f}:{}:late_{}:{}:{:.1f}ms late, {} more queued\n", now_, n.id,
                 in.tick ? "tick" : body_name(in.body), in.tick ? n.id : in.from, late_ms, n.inbox.size());
  }

  bool watched(const std::string& id) const { return !watch_.empty() && watch_.contains(id); }

  /// A message to or from a watched node, with the member records it carries (id, state,
  /// incarnation): what the events alone do not say when tracing why a seed went wrong.
  void watch(const char* what, const std::string& node, const std::string& peer, const gossip::Body& body) {
    static constexpr const char* state_names[] = {"alive", "suspect", "dead", "left"};
    std::string updates;
    auto add = [&](const std::vector<Member>& ms) {
      for (const auto& m : ms)
        updates += fmt::format(" {}/{}/{}", m.id, state_names[static_cast<size_t>(m.state)], m.incarnation);
    };
    std::visit(
        [&](const auto& m) {
          using T = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<T, gossip::Ping> || std::is_same_v<T, gossip::Ack> ||
                        std::is_same_v<T, gossip::PingReq>)
            add(m.updates);
          if constexpr (std::is_same_v<T, gossip::StateSync>) updates = fmt::format(" ({} members)", m.members.size());
        },
        body);
    fmt::print(stderr, "{:.3f}:{}:{}_{}:{}:{}\n", now_, node, what, body_name(body), peer, updates);
  }

  static const char* body_name(const gossip::Body& b) {
    return std::visit(
        [](const auto& m) -> const char* {
          using T = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<T, gossip::Ping>) return "ping";
          if constexpr (std::is_same_v<T, gossip::Ack>) return "ack";
          if constexpr (std::is_same_v<T, gossip::PingReq>) return "ping_req";
          if constexpr (std::is_same_v<T, gossip::StateSync>) return "state_sync";
          if constexpr (std::is_same_v<T, gossip::Join>) return "join";
          if constexpr (std::is_same_v<T, gossip::Leave>) return "leave";
          return "other";
        },
        b);
  }

  /// Puts simulated load on the fault's nodes and on its share of all nodes, drawn from the seed.
  void load(const Fault& f) {
    std::vector<int> chosen = f.nodes;
    const auto share = static_cast<size_t>(std::lround(f.fraction * static_cast<double>(nodes_.size())));
    if (share > 0) {
      std::vector<int> all(nodes_.size());
      for (size_t k = 0; k < all.size(); ++k) all[k] = static_cast<int>(k);
      for (size_t k = 0; k < share; ++k) std::swap(all[k], all[k + rng_() % (all.size() - k)]);  // Fisher-Yates
      chosen.insert(chosen.end(), all.begin(), all.begin() + static_cast<ptrdiff_t>(share));
    }
    std::sort(chosen.begin(), chosen.end());
    chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
    const double until = f.duration_s > 0 ? now_ + f.duration_s * 1000 : std::numeric_limits<double>::infinity();
    for (int i : chosen) {
      Node& n = nodes_[static_cast<size_t>(i)];
      n.cpu = std::make_unique<SimulatedCpu>(f.load, now_, until, rng_);
      n.ever_loaded = true;
      if (trace_) fmt::print(stderr, "{:.3f}:{}:loaded\n", now_, n.id);
    }
    report_.loaded_nodes =
        static_cast<int>(std::count_if(nodes_.begin(), nodes_.end(), [](const Node& n) { return n.ever_loaded; }));
  }

  int random_running(int except) {
    std::vector<int> live;
    for (size_t i = 0; i < nodes_.size(); ++i)
      if (nodes_[i].running && static_cast<int>(i) != except) live.push_back(static_cast<int>(i));
    return live.empty() ? -1 : live[rng_() % live.size()];
  }

  void fault(const Fault& f) {
    switch (f.kind) {
      case Fault::Kind::kill:
        for (int i : f.nodes) {
          nodes_[static_cast<size_t>(i)].running = false;
          nodes_[static_cast<size_t>(i)].ever_killed = true;
          kills_.push_back({i, now_});
          if (job_) job_->stop(node_id(i));
        }
        break;
      case Fault::Kind::restart:
        for (int i : f.nodes) {
          const int seed = random_running(i);
          start(i, nodes_[static_cast<size_t>(i)].incarnation + 1000, {seed >= 0 ? node_id(seed) : node_id(i)}, nullptr);
          for (auto& k : kills_)
            if (k.node == i && k.restarted_at < 0) k.restarted_at = now_;
        }
        break;
      case Fault::Kind::pause:
        for (int i : f.nodes) {
          nodes_[static_cast<size_t>(i)].paused_until = now_ + f.duration_s * 1000;
          nodes_[static_cast<size_t>(i)].ever_paused = true;
        }
        break;
      case Fault::Kind::partition:
        partitions_.push_back({now_, now_ + f.duration_s * 1000, std::set<int>(f.nodes.begin(), f.nodes.end())});
        healed_at_ = std::max(healed_at_, now_ + f.duration_s * 1000);
        one_coordinator_at_ = -1;
        push({healed_at_, 0, Action::Kind::heal_check, -1, 0, "", {}, 0});
        break;
      case Fault::Kind::join: {
        last_join_ = now_;
        joiners_.clear();
        for (int c = 0; c < f.count; ++c) {
          const int seed = random_running(-1);
          const int i = static_cast<int>(nodes_.size());
          joiners_.push_back(node_id(i));
          start(i, 1, {node_id(seed)}, nullptr);
        }
        break;
      }
      case Fault::Kind::load: load(f); break;
      case Fault::Kind::leave:
        for (int i : f.nodes) {
          Node& n = nodes_[static_cast<size_t>(i)];
          Output out;
          n.swim->leave(now_, out);
          apply(i, out);
          n.running = false;
          n.left = true;
          if (job_) job_->stop(n.id);
        }
        break;
    }
  }

  void record(const std::string& observer, const Event& e) {
    ++report_.events;
    const std::string line = fmt::format("{:.3f}:{}:{}:{}:{};", now_, observer, gossip::swim::event_name(e.kind),
                                         e.member.id, e.member.incarnation);
    for (unsigned char c : line) hash_ = (hash_ ^ c) * 0x100000001b3ull;
    if (trace_) fmt::print(stderr, "{}\n", line);
    if (e.kind == Event::Kind::dead) dead_seen_[e.member.id][observer] = now_;
    if (e.kind == Event::Kind::joined) joined_seen_[e.member.id].try_emplace(observer, now_);  // the first time
    if (e.kind == Event::Kind::dead) {
      const int target = std::stoi(e.member.id.substr(1));
      const Node& t = nodes_[static_cast<size_t>(target)];
      if (!t.ever_killed && !t.ever_paused && !t.left && !partitioned_ever()) {
        ++report_.false_positives;
        false_positive_ = fmt::format("{} declared {} dead at {:.1f} s", observer, e.member.id, now_ / 1000);
        if (report_.false_deaths.size() < 100) report_.false_deaths.push_back(false_positive_);
      }
    }
  }

  bool partitioned_ever() const { return !partitions_.empty(); }

  static bool live(Member::State s) { return s == Member::State::alive || s == Member::State::suspect; }

  /// The coordinator a node names: by the one rule (elastic::LowestLiveId) over the live ids it
  /// knows, itself included.
  static std::string coordinator_of(const Node& n) {
    elastic::LowestLiveId rule;
    rule.offer(n.id, true);
    n.swim->for_each_member([&](const std::string& id, Member::State state) { rule.offer(id, live(state)); });
    return *rule.holder();
  }

  /// A node's view of who is live, as a count and an order-free digest of the ids: equal views
  /// give equal pairs without a set of strings per node (10,000 nodes would need 10^8).
  static std::pair<size_t, uint64_t> live_digest(const Node& n) {
    size_t count = 0;
    uint64_t digest = 0;
    n.swim->for_each_member([&](const std::string& id, Member::State state) {
      if (!live(state)) return;
      ++count;
      digest += mix(std::hash<std::string>{}(id));
    });
    return {count, digest};
  }

  static uint64_t mix(uint64_t x) {  // splitmix64's finaliser: sums of mixed hashes do not cancel
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }

  /// After the last partition heals: every 100 simulated ms, whether the running nodes all name
  /// the same coordinator (the lowest live id each knows); the first time they do is reported.
  void heal_check() {
    if (now_ < healed_at_ || one_coordinator_at_ >= 0) return;
    std::set<std::string> named;
    for (const auto& n : nodes_) {
      if (!n.running || paused(n)) continue;
      named.insert(coordinator_of(n));
    }
    if (named.size() <= 1) {
      one_coordinator_at_ = now_;
      report_.heal_to_one_coordinator_s = (now_ - healed_at_) / 1000.0;
      return;
    }
    push({now_ + 100, 0, Action::Kind::heal_check, -1, 0, "", {}, 0});
  }

  void check() {
    std::vector<int> live;
    for (size_t i = 0; i < nodes_.size(); ++i)
      if (nodes_[i].running) live.push_back(static_cast<int>(i));
    if (job_) {
      std::vector<std::string> running;
      for (int i : live) running.push_back(node_id(i));
      job_->check_settled(now_, running);
      for (const auto& b : job_->broken()) report_.broken.push_back(b);
      report_.job = job_->report();
    }
    uint64_t truth = 0;
    for (int i : live) truth += mix(std::hash<std::string>{}(node_id(i)));
    auto seen_live = [&](int observer, const std::string& id) {
      const auto state = nodes_[static_cast<size_t>(observer)].swim->state_of(id);
      return state && Sim::live(*state);
    };
    // Detection: each kill not undone by a restart, until every node that was running when it
    // happened (and still is) had declared it dead. Nodes that joined later need only not believe
    // it alive.
    for (const auto& k : kills_) {
      if (k.restarted_at >= 0) continue;
      const std::string id = node_id(k.node);
      double last = -1;
      int missing = 0;
      for (int i : live) {
        auto it = dead_seen_[id].find(node_id(i));
        const bool declared = it != dead_seen_[id].end() && it->second >= k.at;
        if (declared) {
          last = std::max(last, it->second);
        } else if (started_at_[static_cast<size_t>(i)] <= k.at || seen_live(i, id)) {
          ++missing;
        }
      }
      if (missing == 0 && last >= 0) report_.detection_s.push_back((last - k.at) / 1000.0);
      else if (s_.killed_detected)
        report_.broken.push_back(fmt::format("killed_detected: {} killed at {:.1f} s, still not dead to {} live nodes",
                                             id, k.at / 1000, missing));
    }
    if (last_join_ >= 0) {
      double last = last_join_;
      bool all = true;
      for (const auto& j : joiners_)
        for (int i : live) {
          if (node_id(i) == j) continue;
          auto it = joined_seen_[j].find(node_id(i));
          if (it == joined_seen_[j].end()) all = false;
          else last = std::max(last, it->second);
        }
      if (all) {
        report_.join_convergence_s = (last - last_join_) / 1000.0;
        report_.join_convergence_rounds = (last - last_join_) / s_.swim.probe_interval_ms;
      }
      report_.join_rounds_bound = 3 * std::log2(static_cast<double>(std::max<size_t>(2, live.size())));
      if (s_.join_rounds && (!all || report_.join_convergence_rounds > report_.join_rounds_bound))
        report_.broken.push_back(fmt::format(
            "join_rounds: the joins at {:.1f} s {}, bound 3 log2(N) = {:.1f} probe rounds", last_join_ / 1000,
            all ? fmt::format("known to all in {:.1f} probe rounds", report_.join_convergence_rounds)
                : std::string("never known to every live node"),
            report_.join_rounds_bound));
    }
    if (s_.converge)
      for (int i : live) {
        const auto [count, digest] = live_digest(nodes_[static_cast<size_t>(i)]);
        if (count != live.size() || digest != truth) {
          report_.broken.push_back(fmt::format("converge: {} sees {} live members, {} are{}", node_id(i), count,
                                               live.size(), count == live.size() ? " (others than those)" : ""));
          break;
        }
      }
    if (s_.no_false_positives && report_.false_positives > 0)
      report_.broken.push_back(fmt::format("no_false_positives: {} dead declarations about live nodes, e.g. {}",
                                           report_.false_positives, false_positive_));
    if (s_.one_coordinator && healed_at_ >= 0) {
      // One coordinator within a bound after the heal. Each node held dead across the partition
      // must refute for itself: its first reconnect after the heal (within one interval) reaches a
      // member of the other side, whose answer tells it it is held dead; it refutes, and a later
      // reconnect (at most two more intervals, as it may first pick a member that is really dead)
      // carries the higher incarnation the other side accepts. The refutations then spread like
      // any gossip, for which the bound allows ten probe intervals.
      const double bound_s = (3 * s_.swim.reconnect_interval_ms + 10 * s_.swim.probe_interval_ms) / 1000.0;
      report_.heal_bound_s = bound_s;
      if (report_.heal_to_one_coordinator_s < 0 || report_.heal_to_one_coordinator_s > bound_s)
        report_.broken.push_back(fmt::format(
            "one_coordinator: {} after the partition healed, bound 3 reconnect intervals + 10 probe intervals = {:.1f} s",
            report_.heal_to_one_coordinator_s < 0 ? std::string("never one coordinator")
                                                  : fmt::format("one coordinator {:.1f} s", report_.heal_to_one_coordinator_s),
            bound_s));
    }
    if (s_.one_coordinator && !live.empty()) {
      std::set<std::string> coordinators;
      for (int i : live) coordinators.insert(coordinator_of(nodes_[static_cast<size_t>(i)]));
      if (coordinators.size() != 1)
        report_.broken.push_back(fmt::format("one_coordinator: live nodes name {} coordinators", coordinators.size()));
    }
  }

  struct Kill {
    int node;
    double at;
    double restarted_at = -1;
  };

  const Scenario& s_;
  std::mt19937_64 rng_;
  std::shared_ptr<gossip::swim::Directory> directory_ = std::make_shared<gossip::swim::Directory>();
  double now_ = 0;
  uint64_t seq_ = 0;
  std::priority_queue<Key, std::vector<Key>, std::greater<>> queue_;
  std::vector<Action> slab_;
  std::vector<uint32_t> free_;  // slots of slab_ not in the queue
  std::vector<Node> nodes_;
  std::vector<double> started_at_;  // the latest start of each node
  std::vector<std::tuple<double, double, std::set<int>>> partitions_;
  std::vector<Kill> kills_;
  std::vector<std::string> joiners_;
  double last_join_ = -1;
  double healed_at_ = -1, one_coordinator_at_ = -1;
  std::map<std::string, std::map<std::string, double>> dead_seen_, joined_seen_;
  std::string false_positive_;  // the last one, for the report
  uint64_t messages_ = 0, bytes_ = 0;
  std::unique_ptr<SimJob> job_;  // with [job]
  std::map<std::pair<int, int>, double> in_order_;  // shard messages: the last delivery time per link
  std::vector<std::string> founders_;
  std::vector<uint64_t> founder_boots_;
  uint64_t job_rounds_ = 0;
  uint64_t hash_ = 0xcbf29ce484222325ull;
  Report report_;
  bool trace_ = std::getenv("TEPDIST_SIM_TRACE") != nullptr;  // every event on stderr, for debugging a seed
  std::set<std::string> watch_ = watch_list();  // nodes whose every message goes to stderr

  /// TEPDIST_SIM_WATCH=n00007,n00042: the nodes to watch.
  static std::set<std::string> watch_list() {
    std::set<std::string> out;
    const char* env = std::getenv("TEPDIST_SIM_WATCH");
    for (std::string_view rest = env ? env : ""; !rest.empty();) {
      const size_t comma = rest.find(',');
      if (comma != 0) out.emplace(rest.substr(0, comma));
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    }
    return out;
  }
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(std::min<double>(static_cast<double>(v.size() - 1), std::floor(p * static_cast<double>(v.size()))))];
}

}  // namespace

Report simulate(const Scenario& scenario, uint64_t seed) { return Sim(scenario, seed).run(); }

std::string format_report(const Report& r, bool json) {
  if (json) {
    nlohmann::json j = {{"scenario", r.scenario},
                        {"seed", r.seed},
                        {"nodes", r.nodes},
                        {"simulated_s", r.simulated_s},
                        {"detection_s", {{"p50", percentile(r.detection_s, 0.5)},
                                         {"p90", percentile(r.detection_s, 0.9)},
                                         {"p99", percentile(r.detection_s, 0.99)},
                                         {"all", r.detection_s}}},
                        {"join_convergence_s", r.join_convergence_s},
                        {"join_convergence_rounds", r.join_convergence_rounds},
                        {"join_rounds_bound", r.join_rounds_bound},
                        {"heal_to_one_coordinator_s", r.heal_to_one_coordinator_s},
                        {"heal_bound_s", r.heal_bound_s},
                        {"false_positives", r.false_positives},
                        {"false_deaths", r.false_deaths},
                        {"loaded_nodes", r.loaded_nodes},
                        {"loaded_inputs", r.loaded_inputs},
                        {"late_inputs", r.late_inputs},
                        {"late_ticks", r.late_ticks},
                        {"max_lateness_ms", r.max_lateness_ms},
                        {"messages_per_node_s", r.messages_per_node_s},
                        {"bytes_per_node_s", r.bytes_per_node_s},
                        {"events", r.events},
                        {"event_log_hash", fmt::format("{:016x}", r.event_log_hash)},
                        {"wall_s", r.wall_s},
                        {"peak_rss_mb", r.peak_rss_mb},
                        {"broken", r.broken}};
    if (r.job) {
      j["job"] = {{"generations", r.job->generations}, {"steps", r.job->steps}, {"epochs", r.job->epochs},
                  {"pulls", r.job->pulls}, {"lost", r.job->lost}};
      if (const auto& sh = r.job->shards)
        j["job"]["shards"] = {{"applied", sh->applied},     {"durable", sh->durable}, {"duplicates", sh->duplicates},
                              {"takeovers", sh->takeovers}, {"lost", sh->lost}};
    }
    return j.dump(2) + "\n";
  }
  std::string s = fmt::format("scenario {} seed {}: {} nodes, {} simulated s in {:.2f} s wall, peak {:.0f} MB\n",
                              r.scenario, r.seed, r.nodes, r.simulated_s, r.wall_s, r.peak_rss_mb);
  if (!r.detection_s.empty())
    s += fmt::format("  kill to everyone knows: p50 {:.2f} s, p90 {:.2f} s, p99 {:.2f} s ({} kills)\n",
                     percentile(r.detection_s, 0.5), percentile(r.detection_s, 0.9), percentile(r.detection_s, 0.99),
                     r.detection_s.size());
  if (r.join_convergence_s >= 0)
    s += fmt::format("  join converged in {:.2f} s ({:.1f} probe rounds; 3 log2(N) = {:.1f})\n", r.join_convergence_s,
                     r.join_convergence_rounds, r.join_rounds_bound);
  if (r.heal_bound_s >= 0)
    s += fmt::format("  after the partition healed, one coordinator in {:.2f} s (bound {:.1f} s)\n",
                     r.heal_to_one_coordinator_s, r.heal_bound_s);
  if (r.loaded_nodes > 0)
    s += fmt::format("  simulated load on {} nodes: {} inputs handled, {} of them ({} ticks) over a probe timeout "
                     "late, the latest {:.0f} ms\n",
                     r.loaded_nodes, r.loaded_inputs, r.late_inputs, r.late_ticks, r.max_lateness_ms);
  s += fmt::format("  false positives {}; {:.1f} messages and {:.0f} bytes per node per second\n", r.false_positives,
                   r.messages_per_node_s, r.bytes_per_node_s);
  for (size_t k = 0; k < r.false_deaths.size() && k < 10; ++k)
    s += fmt::format("  false death: {}\n", r.false_deaths[k]);
  s += fmt::format("  {} events, event log hash {:016x}\n", r.events, r.event_log_hash);
  if (r.job) {
    s += fmt::format("  job: {} generations installed, {} steps, {} epochs, {} state pulls\n", r.job->generations,
                     r.job->steps, r.job->epochs, r.job->pulls);
    if (const auto& sh = r.job->shards)
      s += fmt::format("  shards: {} updates applied, {} durable, {} resends already held, {} take-overs{}\n",
                       sh->applied, sh->durable, sh->duplicates, sh->takeovers,
                       sh->lost.empty() ? "" : ", lost: " + sh->lost);
    if (!r.job->lost.empty()) s += fmt::format("  job lost: {}\n", r.job->lost);
  }
  for (const auto& b : r.broken) s += fmt::format("  BROKEN {}\n", b);
  s += r.broken.empty() ? "  all invariants hold\n" : fmt::format("  replay with --seed {}\n", r.seed);
  return s;
}

}  // namespace tepdist::sims

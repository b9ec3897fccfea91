// The SWIM core driven by a small in-process network on a virtual clock: every run is a function
// of its seed, so detection times can be asserted exactly enough to mean something.

#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "gossip/swim/swim.hpp"

using namespace tepdist::gossip;
using namespace tepdist::gossip::swim;

namespace {

/// N Swim cores exchanging messages with 1 ms of latency; nodes can be killed (silenced) and
/// restarted. Ids double as addresses.
struct Net {
  struct Delivery {
    std::string to, from;
    Body body;
  };
  double now = 0;
  double latency_ms = 1;
  double loss = 0;  // probability each message is lost
  std::mt19937_64 rng;
  std::map<std::string, std::unique_ptr<Swim>> nodes;
  std::set<std::string> killed;
  std::multimap<double, Delivery> queue;
  std::vector<std::pair<std::string, Event>> events;  // (observer, event)

  explicit Net(uint64_t seed) : rng(seed) {}

  Swim& add(const std::string& id, std::vector<std::string> seeds, uint64_t incarnation = 1) {
    killed.erase(id);
    auto& node = nodes[id] = std::make_unique<Swim>(Member{id, id, incarnation, Member::State::alive, "local", {}},
                                                    Config::lan(), [this](uint64_t n) { return rng() % n; });
    Output out;
    node->join(now, seeds, out);
    apply(id, out);
    return *node;
  }

  void apply(const std::string& from, Output& out) {
    for (auto& e : out.events) events.emplace_back(from, e);
    for (auto& s : out.sends) {
      if (killed.count(s.address)) continue;
      if (loss > 0 && std::uniform_real_distribution<double>(0, 1)(rng) < loss) continue;
      queue.emplace(now + latency_ms, Delivery{s.address, from, std::move(s.body)});
    }
  }

  void run_until(double end_ms) {
    while (true) {
      double next = queue.empty() ? end_ms + 1 : queue.begin()->first;
      for (auto& [id, n] : nodes)
        if (!killed.count(id)) next = std::min(next, n->next_deadline_ms());
      if (next > end_ms) break;
      now = std::max(now, next);
      while (!queue.empty() && queue.begin()->first <= now) {
        auto d = std::move(queue.begin()->second);
        queue.erase(queue.begin());
        if (killed.count(d.to) || !nodes.count(d.to)) continue;
        Output out;
        nodes[d.to]->on_message(now, d.from, d.from, d.body, out);
        apply(d.to, out);
      }
      for (auto& [id, n] : nodes) {
        if (killed.count(id) || n->next_deadline_ms() > now) continue;
        Output out;
        n->tick(now, out);
        apply(id, out);
      }
    }
    now = end_ms;
  }

  /// The state `observer` holds for `id` (nullopt: not known).
  std::optional<Member::State> view(const std::string& observer, const std::string& id) {
    for (const auto& m : nodes.at(observer)->members())
      if (m.id == id) return m.state;
    return std::nullopt;
  }

  /// Runs until `observer` reports `kind` about `id`, at most until limit_ms; returns whether it did.
  bool run_until_seen(const std::string& observer, Event::Kind kind, const std::string& id, double limit_ms) {
    while (!saw(observer, kind, id) && now < limit_ms) run_until(now + 100);
    return saw(observer, kind, id);
  }

  /// Whether `observer` reported `kind` about `id`.
  bool saw(const std::string& observer, Event::Kind kind, const std::string& id) {
    for (const auto& [who, e] : events)
      if (who == observer && e.kind == kind && e.member.id == id) return true;
    return false;
  }
};

std::unique_ptr<Net> cluster(size_t n, uint64_t seed) {
  auto net = std::make_unique<Net>(seed);
  net->add("n0", {});
  for (size_t i = 1; i < n; ++i) {
    std::string id = "n";
    id += std::to_string(i);
    net->add(id, {"n0"});
  }
  net->run_until(10000);
  return net;
}

}  // namespace

TEST_CASE("members joining through one seed all come to know each other", "[gossip][swim]") {
  auto net = cluster(8, 1);
  for (const auto& [observer, node] : net->nodes) {
    INFO(observer);
    CHECK(node->live_count() == 8);
  }
}

TEST_CASE("a killed member is declared dead by every other, and nobody else is", "[gossip][swim]") {
  auto net = cluster(6, 2);
  net->killed.insert("n3");
  const double killed_at = net->now;
  net->run_until(killed_at + 40000);
  for (const auto& [observer, node] : net->nodes) {
    if (observer == "n3") continue;
    INFO(observer);
    CHECK(net->saw(observer, Event::Kind::dead, "n3"));
    CHECK(net->view(observer, "n3") != Member::State::alive);  // dead, or forgotten after retention
    CHECK(node->live_count() == 5);
    for (const auto& [who, e] : net->events)
      if (e.kind == Event::Kind::dead) CHECK(e.member.id == "n3");  // no false deaths
  }
}

TEST_CASE("at 5% message loss no live member is declared dead", "[gossip][swim]") {
  auto net = cluster(8, 9);
  net->loss = 0.05;
  net->run_until(net->now + 300000);  // five virtual minutes
  size_t suspicions = 0;
  for (const auto& [who, e] : net->events) {
    CHECK(e.kind != Event::Kind::dead);
    suspicions += e.kind == Event::Kind::suspected;
  }
  CHECK(suspicions > 0);  // losses did cause suspicions: refutation is what kept everyone alive
  for (const auto& [observer, node] : net->nodes) CHECK(node->live_count() == 8);
}

TEST_CASE("a suspected member refutes with a higher incarnation and is alive again", "[gossip][swim]") {
  auto net = cluster(5, 3);
  // n1 falsely accuses n2 (as if one probe was lost): n2 hears of it and outbids the rumour.
  Member rumour{"n2", "n2", 1, Member::State::suspect, "local", {}};
  Output out;
  net->nodes["n4"]->on_message(net->now, "n1", "n1", Ping{999, {rumour}}, out);
  net->apply("n4", out);
  net->run_until(net->now + 20000);
  CHECK(net->nodes["n2"]->self().incarnation > 1);
  for (const auto& [observer, node] : net->nodes) CHECK(net->view(observer, "n2") == Member::State::alive);
  CHECK(net->saw("n4", Event::Kind::suspected, "n2"));
  CHECK(net->saw("n4", Event::Kind::alive_again, "n2"));
}

TEST_CASE("a suspicion learned from a state sync reaches the suspect, which refutes it", "[gossip][swim]") {
  // State syncs do not re-gossip what they carry (a joiner would flood its news of thousands of
  // members), so nobody gossips n4's suspicion; the member that sent the sync may even have heard
  // the refutation since. The accused must still hear of it: n4's probes and reminders to a suspect
  // carry the suspicion whatever the gossip holds (without them this test fails: n4 declares a
  // live n2 dead).
  auto net = cluster(5, 3);
  Member rumour{"n2", "n2", 1, Member::State::suspect, "local", {}};
  rumour.accuser = "n1";
  Output out;
  net->nodes["n4"]->on_message(net->now, "n1", "n1", StateSync{{rumour}, true, 0}, out);
  net->apply("n4", out);
  REQUIRE(net->view("n4", "n2") == Member::State::suspect);
  net->run_until(net->now + 20000);
  CHECK(net->nodes["n2"]->self().incarnation > 1);
  for (const auto& [observer, node] : net->nodes) CHECK(net->view(observer, "n2") == Member::State::alive);
  CHECK(net->saw("n4", Event::Kind::alive_again, "n2"));
  CHECK_FALSE(net->saw("n4", Event::Kind::dead, "n2"));
}

TEST_CASE("a restarted member with a higher incarnation is accepted at once", "[gossip][swim]") {
  auto net = cluster(5, 4);
  net->killed.insert("n2");
  REQUIRE(net->run_until_seen("n0", Event::Kind::dead, "n2", net->now + 40000));
  net->add("n2", {"n0"}, /*incarnation=*/100);  // same id, a new start
  // Piggybacked gossip reaches most members within seconds; push-pull (every 30 s) the rest.
  net->run_until(net->now + 40000);
  for (const auto& [observer, node] : net->nodes) {
    INFO(observer << " knows " << node->members().size() << " members");
    CHECK(net->view(observer, "n2") == Member::State::alive);
  }
}

TEST_CASE("stale gossip cannot bring a dead member back", "[gossip][swim]") {
  auto net = cluster(4, 5);
  net->killed.insert("n3");
  REQUIRE(net->run_until_seen("n0", Event::Kind::dead, "n3", net->now + 40000));
  REQUIRE(net->view("n0", "n3") == Member::State::dead);  // remembered for dead_retention_ms
  Output out;
  net->nodes["n0"]->on_message(net->now, "n1", "n1", Ping{1, {{"n3", "n3", 1, Member::State::alive, "local", {}}}},
                               out);
  CHECK(net->view("n0", "n3") == Member::State::dead);
}

TEST_CASE("a member that leaves is marked left, not dead", "[gossip][swim]") {
  auto net = cluster(5, 6);
  Output out;
  net->nodes["n2"]->leave(net->now, out);
  net->apply("n2", out);
  net->killed.insert("n2");  // and goes away
  net->run_until(net->now + 40000);
  for (const auto& [observer, node] : net->nodes) {
    if (observer == "n2") continue;
    CHECK(net->saw(observer, Event::Kind::left, "n2"));
    CHECK_FALSE(net->saw(observer, Event::Kind::dead, "n2"));
  }
}

TEST_CASE("the same seed gives the same run, another seed another", "[gossip][swim]") {
  auto log = [](uint64_t seed) {
    auto net = cluster(6, seed);
    net->killed.insert("n4");
    net->run_until(net->now + 30000);
    std::string s;
    for (const auto& [who, e] : net->events) s += who + ":" + event_name(e.kind) + ":" + e.member.id + ";";
    return s;
  };
  CHECK(log(7) == log(7));
  CHECK(log(7) != log(8));
}

TEST_CASE("suspicion shortens as independent members confirm it (Lifeguard)", "[gossip][swim]") {
  Suspicion s(0, 1000, 6000, 3, "a");
  CHECK(s.deadline_ms() == 6000);
  CHECK(s.confirm("b"));
  CHECK_FALSE(s.confirm("b"));  // one member counts once
  const double one = s.deadline_ms();
  CHECK(one < 6000);
  CHECK(s.confirm("c"));
  CHECK(s.confirm("d"));
  CHECK(s.deadline_ms() == Approx(1000));
  CHECK(s.deadline_ms() < one);
}

TEST_CASE("piggybacked updates go least-sent and newest first, within the budget, a bounded number of times",
          "[gossip][swim]") {
  Dissemination d;
  auto m = [](const std::string& id) { return Member{id, id + ":1", 1, Member::State::alive, "r", {}}; };
  d.enqueue(m("a"));
  d.enqueue(m("b"));
  d.enqueue(m("c"));
  const size_t one = Dissemination::estimate_bytes(m("a"));
  auto first = d.pick(2 * one, 2);
  REQUIRE(first.size() == 2);
  CHECK(first[0].id == "c");  // newest first
  CHECK(first[1].id == "b");
  auto second = d.pick(2 * one, 2);
  CHECK(second[0].id == "a");  // never sent yet: before those sent once
  d.pick(10 * one, 2);
  CHECK(d.size() == 0);  // each sent twice: done
}

TEST_CASE("local health awareness stretches this node's own timeouts, within bounds", "[gossip][swim]") {
  Awareness a(8);
  CHECK(a.scale(500) == 500);
  for (int i = 0; i < 20; ++i) a.apply(1);
  CHECK(a.score() == 7);
  CHECK(a.scale(500) == 4000);
  a.apply(-3);
  CHECK(a.scale(500) == 2500);
}

TEST_CASE("a directory numbers each id and each set of details once, and rebuilds the records", "[gossip][swim]") {
  Directory d;
  const uint32_t a = d.intern_id("node-a"), b = d.intern_id("node-b");
  CHECK(a != b);
  CHECK(d.intern_id("node-a") == a);
  CHECK(d.find_id("node-b") == b);
  CHECK(d.find_id("node-c") == Directory::none);  // finding does not intern
  CHECK(d.ids() == 2);
  // Fields are told apart by length, not by a separator a field could hold.
  const Member one{"x", "10.0.0.1:7000", 1, Member::State::alive, "eu", {"worker", "shard"}};
  Member other = one;
  other.roles = {"workers", "hard"};
  Member split = one;
  split.roles = {"worker" "shard"};
  CHECK(d.intern_details(one) == d.intern_details(one));
  CHECK(d.intern_details(one) != d.intern_details(other));
  CHECK(d.intern_details(one) != d.intern_details(split));
  const Member rebuilt = d.member(b, d.intern_details(one), 7, Member::State::suspect, a);
  CHECK(rebuilt == Member{"node-b", "10.0.0.1:7000", 7, Member::State::suspect, "eu", {"worker", "shard"}, "node-a"});
  CHECK(d.member(a, d.intern_details(one), 1, Member::State::alive, Directory::none).accuser.empty());
}

TEST_CASE("cores sharing one directory keep their own views", "[gossip][swim]") {
  auto directory = std::make_shared<Directory>();
  std::mt19937_64 rng(5);
  auto below = [&](uint64_t n) { return rng() % n; };
  const std::vector<Member> view{{"a", "a", 1, Member::State::alive, "r", {}}, {"b", "b", 1, Member::State::alive, "r", {}},
                                 {"c", "c", 1, Member::State::alive, "r", {}}};
  Swim a(view[0], Config::lan(), below, directory), b(view[1], Config::lan(), below, directory);
  const auto interned = Swim::intern(*directory, view);
  a.adopt(0, interned);
  b.adopt(0, interned);
  CHECK(a.live_count() == 3);
  // b hears that c left; a does not: each core's records are its own.
  Output out;
  Member gone = view[2];
  gone.incarnation = 2;
  gone.state = Member::State::left;
  b.on_message(10, "c", "c", Leave{gone}, out);
  CHECK(b.state_of("c") == Member::State::left);
  CHECK(a.state_of("c") == Member::State::alive);
  CHECK(a.state_of("a") == Member::State::alive);  // itself
  CHECK_FALSE(a.state_of("d"));
  CHECK(b.live_count() == 2);
  REQUIRE(out.events.size() == 1);
  CHECK(out.events[0].kind == Event::Kind::left);
  CHECK(out.events[0].member.id == "c");
  // members(): itself first, the others in id order.
  const auto members = b.members();
  REQUIRE(members.size() == 3);
  CHECK(members[0].id == "b");
  CHECK(members[1].id == "a");
  CHECK(members[2].id == "c");
}

// The SWIM core against the faults a loaded or departing node brings: ticks that come late, acks
// that wait unread, leaves, rumours about live members, restarts between two probes. Each case
// drives one or a few cores by hand, so the order of inputs is exactly the one that went wrong.

#include <catch2/catch.hpp>
#include <limits>
#include <random>
#include <set>

#include "gossip/swim/swim.hpp"

using namespace tepdist::gossip;
using namespace tepdist::gossip::swim;

namespace {

Member member(const std::string& id, uint64_t incarnation = 1, uint64_t boot_id = 0) {
  return Member{id, id, incarnation, Member::State::alive, "local", {}, {}, boot_id};
}

/// A core that knows `others` (as a state sync from them brought them), with a seeded draw.
struct Core {
  std::mt19937_64 rng{7};
  Swim swim;
  explicit Core(const std::string& id, const std::vector<std::string>& others, uint64_t boot_id = 0)
      : swim(member(id, 1, boot_id), Config::lan(), [this](uint64_t n) { return rng() % n; }) {
    Output out;
    swim.join(0, {}, out);
    std::vector<Member> known;
    for (const auto& o : others) known.push_back(member(o));
    for (const auto& o : others) swim.on_message(0, o, o, StateSync{known, true, 0}, out);
  }
};

template <class T>
std::vector<std::pair<std::string, T>> sent(const Output& out) {
  std::vector<std::pair<std::string, T>> found;
  for (const auto& s : out.sends)
    if (const auto* m = std::get_if<T>(&s.body)) found.emplace_back(s.address, *m);
  return found;
}

bool reported(const Output& out, Event::Kind kind, const std::string& id) {
  for (const auto& e : out.events)
    if (e.kind == kind && e.member.id == id) return true;
  return false;
}

/// Ticks `core` at `now` and returns what it asked for.
Output tick(Swim& core, double now) {
  Output out;
  core.tick(now, out);
  return out;
}

}  // namespace

TEST_CASE("a tick that comes late does not suspect a member whose ack waits unread", "[gossip][swim][faults]") {
  Core a("a", {"b"});
  // The first probe goes out on time.
  const double t0 = Config::lan().probe_interval_ms;
  Output first = tick(a.swim, t0);
  const auto pings = sent<Ping>(first);
  REQUIRE(pings.size() == 1);
  CHECK(pings[0].first == "b");
  // b answers at once, but a's process is descheduled for 600 ms: its next tick comes long after
  // the probe's whole interval, before it has read the ack, and again a millisecond later.
  Output late = tick(a.swim, t0 + 600);
  // Its own lateness makes it slower to accuse, not quicker (Lifeguard's local health).
  CHECK(a.swim.awareness() > 0);
  Output later = tick(a.swim, t0 + 601);
  Output read;
  a.swim.on_message(t0 + 602, "b", "b", Ack{pings[0].second.seq_no, {}}, read);
  // From then on a runs on time and b answers every probe.
  Output after;
  for (double t = t0 + 610; t < t0 + 3000; t += 10) {
    Output step;
    a.swim.tick(t, step);
    for (const auto& [to, ping] : sent<Ping>(step)) a.swim.on_message(t + 1, to, to, Ack{ping.seq_no, {}}, step);
    after.events.insert(after.events.end(), step.events.begin(), step.events.end());
  }
  for (const Output* o : {&late, &later, &read, &after}) CHECK_FALSE(reported(*o, Event::Kind::suspected, "b"));
  CHECK(a.swim.state_of("b") == Member::State::alive);
}

TEST_CASE("indirect probes sent late still get their whole time before a suspicion", "[gossip][swim][faults]") {
  Core a("a", {"b", "c"});
  const Config lan = Config::lan();
  double t0 = lan.probe_interval_ms;
  Output first = tick(a.swim, t0);
  auto pings = sent<Ping>(first);
  REQUIRE(pings.size() == 1);
  const std::string target = pings[0].first;
  // The direct ack is lost; the tick that should send the ping-reqs at t0 + 100 comes 20 ms late
  // (too little to count as this node's own stall).
  const double sent_at = t0 + lan.probe_timeout_ms + 20;
  Output req = tick(a.swim, sent_at);
  const auto reqs = sent<PingReq>(req);
  REQUIRE(reqs.size() == 1);
  // At the interval's nominal end the relay has had 80 ms of its 100: no verdict yet.
  Output at_end = tick(a.swim, t0 + lan.probe_interval_ms);
  CHECK_FALSE(reported(at_end, Event::Kind::suspected, target));
  // The relayed ack comes within the indirect probes' full time, and counts.
  Output relayed;
  a.swim.on_message(sent_at + 90, reqs[0].first, reqs[0].first, Ack{reqs[0].second.seq_no, {}}, relayed);
  Output after;
  for (double t = sent_at + 95; t < sent_at + 400; t += 5) a.swim.tick(t, after);
  CHECK_FALSE(reported(after, Event::Kind::suspected, target));
  CHECK(a.swim.state_of(target) == Member::State::alive);
}

TEST_CASE("a leave is told to every live member, and the leaver answers probes with it", "[gossip][swim][faults]") {
  std::vector<std::string> others;
  for (int i = 1; i <= 9; ++i) {
    std::string id = "n";  // (not "n" + to_string: g++ 12 warns of a bogus overlap there)
    id += std::to_string(i);
    others.push_back(id);
  }
  Core a("n0", others);
  Output out;
  a.swim.leave(1000, out);
  std::set<std::string> told;
  for (const auto& [to, leave] : sent<Leave>(out)) {
    CHECK(leave.member.id == "n0");
    CHECK(leave.member.state == Member::State::left);
    told.insert(to);
  }
  CHECK(told == std::set<std::string>(others.begin(), others.end()));
  // A member that missed it probes the leaver, which is still running: the ack says it left.
  Output answer;
  a.swim.on_message(1100, "n4", "n4", Ping{42, {}}, answer);
  const auto acks = sent<Ack>(answer);
  REQUIRE(acks.size() == 1);
  CHECK(acks[0].first == "n4");
  CHECK(acks[0].second.seq_no == 42);
  REQUIRE_FALSE(acks[0].second.updates.empty());
  CHECK(acks[0].second.updates[0].id == "n0");
  CHECK(acks[0].second.updates[0].state == Member::State::left);
  // And the prober, reading it, marks the leaver left rather than suspecting it.
  Core b("n4", {"n0"});
  Output merged;
  b.swim.on_message(1101, "n0", "n0", acks[0].second, merged);
  CHECK(reported(merged, Event::Kind::left, "n0"));
  CHECK(b.swim.state_of("n0") == Member::State::left);
}

TEST_CASE("a leave is taken only from the member that leaves", "[gossip][swim][faults]") {
  Core a("a", {"b", "c"});
  Member forged = member("c", 5);
  forged.state = Member::State::left;
  Output out;
  a.swim.on_message(10, "b", "b", Leave{forged}, out);
  CHECK(a.swim.state_of("c") == Member::State::alive);
  CHECK(out.events.empty());
  a.swim.on_message(11, "c", "c", Leave{forged}, out);
  CHECK(a.swim.state_of("c") == Member::State::left);
}

TEST_CASE("a live member refutes a rumour that it left, and says so", "[gossip][swim][faults]") {
  Core a("a", {"b"});
  Member rumour = member("a", 3);
  rumour.state = Member::State::left;
  Output out;
  a.swim.on_message(10, "b", "b", Ping{1, {rumour}}, out);
  CHECK(a.swim.self().state == Member::State::alive);
  CHECK(a.swim.self().incarnation > 3);
  REQUIRE(reported(out, Event::Kind::refuted, "a"));
  // The refutation rides on the answer, so whoever believed the rumour hears it at once.
  const auto acks = sent<Ack>(out);
  REQUIRE(acks.size() == 1);
  bool carried = false;
  for (const auto& u : acks[0].second.updates) carried |= u.id == "a" && u.state == Member::State::alive && u.incarnation > 3;
  CHECK(carried);
}

TEST_CASE("a live member with another boot id is a restart, a higher incarnation alone is not", "[gossip][swim][faults]") {
  Core a("a", {});
  Output out;
  a.swim.on_message(0, "b", "b", StateSync{{member("b", 10, 111)}, true, 0}, out);
  REQUIRE(reported(out, Event::Kind::joined, "b"));
  // A refutation: same run, higher incarnation.
  Output refuted;
  a.swim.on_message(10, "b", "b", Ping{1, {member("b", 11, 111)}}, refuted);
  CHECK(reported(refuted, Event::Kind::updated, "b"));
  CHECK_FALSE(reported(refuted, Event::Kind::restarted, "b"));
  // A restart between two probes: nobody saw it die, but its boot id changed.
  Output restarted;
  a.swim.on_message(20, "b", "b", Ping{2, {member("b", 5000, 222)}}, restarted);
  CHECK(reported(restarted, Event::Kind::restarted, "b"));
  const auto members = a.swim.members();
  REQUIRE(members.size() == 2);
  CHECK(members[1].boot_id == 222);
}

TEST_CASE("a death heard about a member held alive is a suspicion it can refute", "[gossip][swim][faults]") {
  // c was cut off and declared b dead; the link is back and c's verdict reaches a, which has no
  // doubt about b: a suspects b (told on a's next probe) instead of declaring it dead.
  Core a("a", {"b", "c", "d"});
  Member verdict = member("b");
  verdict.state = Member::State::dead;
  Output out;
  a.swim.on_message(10, "c", "c", Ping{1, {verdict}}, out);
  CHECK(reported(out, Event::Kind::suspected, "b"));
  CHECK_FALSE(reported(out, Event::Kind::dead, "b"));
  CHECK(a.swim.state_of("b") == Member::State::suspect);
  // a checks the suspicion itself with its next probe, which tells b so.
  Output probe = tick(a.swim, Config::lan().probe_interval_ms);
  const auto pings = sent<Ping>(probe);
  REQUIRE(pings.size() >= 1);
  CHECK(pings[0].first == "b");
  REQUIRE_FALSE(pings[0].second.updates.empty());
  CHECK(pings[0].second.updates[0].id == "b");
  CHECK(pings[0].second.updates[0].state == Member::State::suspect);
  // The same word again from c, the accuser, is no new evidence: b stays suspect.
  Output again;
  a.swim.on_message(20, "c", "c", Ping{2, {verdict}}, again);
  CHECK_FALSE(reported(again, Event::Kind::dead, "b"));
  // From another member it is independent word that the suspicion ran out: taken at once.
  Output second;
  a.swim.on_message(30, "d", "d", Ping{3, {verdict}}, second);
  CHECK(reported(second, Event::Kind::dead, "b"));
}

TEST_CASE("a verdict is pushed at once to a few live members, a suspicion rides on the probes only",
          "[gossip][swim][faults]") {
  Core a("a", {"b", "c", "d", "e", "f", "g"});
  Member claim{"b", "b", 1, Member::State::suspect, "local", {}, "c"};
  // A suspicion is not pushed: it starts a course on every node that hears it, and spread fast it
  // would leave a loaded suspect less time to refute (the loaded-nodes scenario measured it).
  Output heard;
  a.swim.on_message(10, "c", "c", Ping{1, {claim}}, heard);
  REQUIRE(reported(heard, Event::Kind::suspected, "b"));
  CHECK(sent<Ping>(heard).empty());
  // Independent word that the suspicion ran out (d is not an accuser): a declares b dead, and
  // pushes the verdict to urgent_fanout live members, none of them d (which knows) or b.
  Member verdict = claim;
  verdict.state = Member::State::dead;
  Output out;
  a.swim.on_message(20, "d", "d", Ping{2, {verdict}}, out);
  REQUIRE(reported(out, Event::Kind::dead, "b"));
  std::set<std::string> told;
  for (const auto& [to, ping] : sent<Ping>(out)) {
    bool carries = false;
    for (const auto& u : ping.updates) carries = carries || (u.id == "b" && u.state == Member::State::dead);
    CHECK(carries);
    told.insert(to);
  }
  CHECK(told.size() == static_cast<size_t>(Config::lan().urgent_fanout));
  CHECK_FALSE(told.contains("d"));
  CHECK_FALSE(told.contains("b"));
  // The same verdict again is no news: nothing more is pushed.
  Output again;
  a.swim.on_message(30, "e", "e", Ping{3, {verdict}}, again);
  CHECK(sent<Ping>(again).empty());
}

TEST_CASE("a probe that fails after its target refuted does not suspect the new incarnation",
          "[gossip][swim][faults]") {
  Core a("a", {"b"});
  const double t0 = Config::lan().probe_interval_ms;
  const auto pings = sent<Ping>(tick(a.swim, t0));
  REQUIRE(pings.size() == 1);
  // The ack never comes (b is stalled), but b's refutation of an older suspicion reaches a while
  // the probe is out: newer word from b than the probe.
  Output refutation;
  a.swim.on_message(t0 + 50, "b", "b", Ack{0, {member("b", 2)}}, refutation);
  Output rest;
  for (double t = t0 + 60; t <= t0 + Config::lan().probe_interval_ms + 1; t += 10) a.swim.tick(t, rest);
  CHECK_FALSE(reported(rest, Event::Kind::suspected, "b"));
  CHECK(a.swim.state_of("b") == Member::State::alive);
  // A probe sent after the refutation that fails is a new silence: that one suspects.
  Output later;
  for (double t = t0 + 300; t <= t0 + 1000; t += 10) a.swim.tick(t, later);
  CHECK(reported(later, Event::Kind::suspected, "b"));
}

TEST_CASE("a suspicion of a newer incarnation starts afresh instead of shortening the refuted one",
          "[gossip][swim][faults]") {
  Core a("a", {"b", "c", "d"});
  const Member old_claim{"b", "b", 1, Member::State::suspect, "local", {}, "c"};
  Output out;
  a.swim.on_message(0, "c", "c", Ping{1, {old_claim}}, out);
  REQUIRE(a.swim.state_of("b") == Member::State::suspect);
  // b refuted (incarnation 2, which a missed) and was suspected again by d, late in a's suspicion.
  const Member new_claim{"b", "b", 2, Member::State::suspect, "local", {}, "d"};
  const double later = 1000;
  a.swim.on_message(later, "d", "d", Ping{2, {new_claim}}, out);
  // Counted as a confirmation, the old suspicion would end at its minimum from time 0; as a new
  // one it runs at least that long from now.
  const double min = Config::lan().suspicion_mult * Config::lan().probe_interval_ms;
  Output verdicts;
  for (double t = later; t < later + min - 1; t += 5) a.swim.tick(t, verdicts);
  CHECK_FALSE(reported(verdicts, Event::Kind::dead, "b"));
  const auto members = a.swim.members();
  for (const auto& m : members)
    if (m.id == "b") CHECK(m.incarnation == 2);
}

TEST_CASE("a node whose ticks always come a little late still suspects and declares a dead member",
          "[gossip][swim][faults]") {
  Core a("a", {"b", "c", "d"});
  const double lag = 30;  // past a quarter of the probe timeout: each tick counts as late
  Output all;
  double t = Config::lan().probe_interval_ms + lag;
  while (t < 60000 && !reported(all, Event::Kind::dead, "b")) {
    Output step;
    a.swim.tick(t, step);
    // c and d answer every probe and relay; b is dead.
    for (const auto& [to, ping] : sent<Ping>(step))
      if (to != "b") a.swim.on_message(t + 1, to, to, Ack{ping.seq_no, {}}, step);
    all.events.insert(all.events.end(), step.events.begin(), step.events.end());
    t = std::max(t + 1, a.swim.next_deadline_ms() + lag);
  }
  CHECK(reported(all, Event::Kind::suspected, "b"));
  CHECK(reported(all, Event::Kind::dead, "b"));
  CHECK(t < 30000);
  CHECK_FALSE(reported(all, Event::Kind::dead, "c"));
  CHECK_FALSE(reported(all, Event::Kind::dead, "d"));
}

TEST_CASE("a leaver's core asks for no more ticks and takes no more news", "[gossip][swim][faults]") {
  Core a("a", {"b"});
  Output out;
  a.swim.leave(100, out);
  CHECK(a.swim.next_deadline_ms() == std::numeric_limits<double>::infinity());
  Member rumour = member("b", 9);
  rumour.state = Member::State::suspect;
  Output after;
  a.swim.on_message(200, "b", "b", Ping{5, {rumour}}, after);
  CHECK(after.events.empty());
  CHECK(a.swim.state_of("b") == Member::State::alive);
  REQUIRE(sent<Ack>(after).size() == 1);
}

TEST_CASE("a node whose roles lost their state announces a new boot id: members see a restart at once",
          "[gossip][swim][faults]") {
  Core a("a", {});
  Core b("b", {"a"}, 111);
  Output met;
  a.swim.on_message(0, "b", "b", StateSync{{b.swim.self()}, true, 0}, met);  // a knows b's first run
  Output out;
  const uint64_t before = b.swim.self().incarnation;
  b.swim.new_boot(0, 999, out);
  CHECK(b.swim.self().boot_id == 999);
  CHECK(b.swim.self().incarnation > before);
  // Told first-hand to every live member, not left to gossip rounds.
  const auto pings = sent<Ping>(out);
  REQUIRE(pings.size() == 1);
  Output heard;
  a.swim.on_message(1, "b", "b", pings[0].second, heard);
  CHECK(reported(heard, Event::Kind::restarted, "b"));
}

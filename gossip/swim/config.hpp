#pragma once
// SWIM knobs, in one place, with their units and what raising them trades. The LAN profile probes
// five times as often as memberlist's (which follows the SWIM and Lifeguard papers) and suspects
// for three quarters as many intervals: in simulation a kill is known to all of 100 nodes in a
// median 1.6 s (verdicts pushed to urgent_fanout members), with no false deaths over 300 seeds of
// a churn scenario at 5% loss nor 300 of the loaded-nodes one (suspicion_mult 2 was faster but had
// 2 false deaths in the churn seeds). The WAN profile is memberlist's LAN pace (probe
// 1 s, ack timeout 500 ms, suspicion_mult 4), which leaves room for round trips of 250 ms: three
// regions 40-110 ms apart at 1% loss see a kill everywhere in about 13 s with no false deaths over
// 50 seeds, where memberlist's WAN knobs (5 s, 3 s, 6) took 75 s or more.

#include <cstdint>
#include <string>

namespace tepdist::gossip::swim {

struct Config {
  /// Time between probes of one member; ms. Lower detects failures sooner at more traffic: each
  /// node sends one ping (and gets one ack) per interval.
  double probe_interval_ms = 200;
  /// How long to wait for a direct ack before asking others to probe; ms. Must exceed the
  /// network's round trip with margin, or healthy nodes get indirect probes they do not need.
  double probe_timeout_ms = 100;
  /// Members asked to probe on our behalf when the direct probe fails (k). More lowers false
  /// positives from one bad link, at k ping-reqs per failed probe.
  int indirect_checks = 3;
  /// Suspicion lasts at least suspicion_mult * log10(N + 1) probe intervals before death is
  /// declared. Higher: fewer false deaths, slower detection.
  double suspicion_mult = 3;
  /// The longest suspicion is this times the shortest; independent confirmations shrink it from
  /// the longest towards the shortest (Lifeguard).
  double suspicion_max_timeout_mult = 6;
  /// Each update is piggybacked about retransmit_mult * log10(N + 1) times. Higher: more reliable
  /// dissemination, more bytes per message.
  double retransmit_mult = 4;
  /// A node that has just declared a member dead or left (its own verdict, or one it took from
  /// another) pushes it at once to this many random live members, on a ping of its own, instead
  /// of leaving it to ride on the next probes only: the verdict then reaches most of the cluster
  /// in a few network round trips, and piggybacking catches the few the pushes missed
  /// (memberlist's GossipNodes, sent on learning rather than on a timer). Suspicions and
  /// refutations are not pushed (a suspect would get less time to refute). Costs about fanout x N
  /// pings and acks per verdict; 0 turns it off.
  int urgent_fanout = 3;
  /// Piggybacked updates per message are bounded by this many bytes (estimated).
  size_t gossip_budget_bytes = 1200;
  /// Push-pull anti-entropy with one random member every this many ms, scaled by log2(N / 32)
  /// beyond 32 members so the cost stays about constant per node, not N^2 in all.
  double push_pull_interval_ms = 30000;
  /// Dead and left members are remembered this long, so older gossip cannot bring them back; ms.
  double dead_retention_ms = 30000;
  /// Every this many ms, a push-pull with one member this node holds dead (not one that left): if
  /// it is alive after all (a partition healed), it refutes and the two views merge. Without it,
  /// two sides of a healed partition that declared each other dead would never speak again. ms.
  double reconnect_interval_ms = 2000;
  /// How long a dead member is tried that way; ms.
  double reconnect_timeout_ms = 600000;
  /// Local health awareness: a node that misses acks or is suspected itself multiplies its own
  /// timeouts by up to this (Lifeguard), instead of accusing others while it is the slow one.
  int awareness_max_multiplier = 8;

  /// A LAN: round trips well under a millisecond.
  static Config lan() { return {}; }
  /// A WAN: round trips up to a few hundred milliseconds, lossier links.
  static Config wan() {
    Config c;
    c.probe_interval_ms = 1000;
    c.probe_timeout_ms = 500;
    c.suspicion_mult = 4;
    c.push_pull_interval_ms = 60000;
    c.reconnect_interval_ms = 10000;
    return c;
  }
};

}  // namespace tepdist::gossip::swim

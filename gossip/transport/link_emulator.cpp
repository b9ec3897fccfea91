#include "gossip/transport/link_emulator.hpp"

#include <algorithm>

namespace tepdist::gossip {
namespace {

std::pair<std::string, std::string> key(const std::string& a, const std::string& b) {
  return a <= b ? std::pair{a, b} : std::pair{b, a};
}

}  // namespace

void NetworkModel::set_link(const std::string& a, const std::string& b, const LinkProfile& p) { links[key(a, b)] = p; }

const LinkProfile* NetworkModel::link(const std::string& a, const std::string& b) const {
  const auto it = links.find(key(a, b));
  return it == links.end() ? nullptr : &it->second;
}

std::optional<double> NetworkModel::partitioned_until_ms(const std::string& a, const std::string& b,
                                                         double t_ms) const {
  std::optional<double> until;
  for (const auto& p : partitions) {
    const bool pair = (p.a == a && p.b == b) || (p.a == b && p.b == a);
    const double start = p.at_s * 1000.0, end = (p.at_s + p.duration_s) * 1000.0;
    if (pair && t_ms >= start && t_ms < end) until = std::max(until.value_or(end), end);
  }
  return until;
}

LinkEmulator::LinkEmulator(NetworkModel model, std::string self_region)
    : model_(std::move(model)), self_region_(std::move(self_region)) {}

double LinkEmulator::transmit(LinkState& s, const LinkProfile& p, size_t bytes, double start_ms) {
  const double begin = std::max(start_ms, s.free_at_ms);
  // Mbit/s = 1,000 bits per millisecond per Mbit.
  const double serialise = p.bandwidth_mbit > 0 ? static_cast<double>(bytes) * 8.0 / (p.bandwidth_mbit * 1000.0) : 0.0;
  s.free_at_ms = begin + serialise;
  return s.free_at_ms;
}

double LinkEmulator::stream_release_ms(const std::string& peer, const std::string& peer_region, size_t bytes,
                                       double now_ms, double jitter_draw) {
  const LinkProfile* p = model_.link(self_region_, peer_region);
  LinkState& s = links_[peer];
  double start = now_ms;
  // A partition holds the stream until it heals; a later partition may cover that moment too.
  for (int guard = 0; guard < 64; ++guard) {
    const auto until = model_.partitioned_until_ms(self_region_, peer_region, std::max(start, s.free_at_ms));
    if (!until) break;
    start = *until;
  }
  if (!p) {
    s.last_release_ms = std::max(s.last_release_ms, std::max(start, s.free_at_ms));
    return s.last_release_ms;
  }
  const double sent = transmit(s, *p, bytes, start);
  const double arrival = sent + std::max(0.0, p->latency_ms + p->jitter_ms * jitter_draw);
  s.last_release_ms = std::max(s.last_release_ms, arrival);
  return s.last_release_ms;
}

std::optional<double> LinkEmulator::datagram_release_ms(const std::string& peer, const std::string& peer_region,
                                                        size_t bytes, double now_ms, double jitter_draw,
                                                        double loss_draw) {
  if (model_.partitioned_until_ms(self_region_, peer_region, now_ms)) return std::nullopt;
  const LinkProfile* p = model_.link(self_region_, peer_region);
  if (!p) return now_ms;
  if (loss_draw < p->loss) return std::nullopt;
  const double sent = transmit(links_[peer], *p, bytes, now_ms);
  return sent + std::max(0.0, p->latency_ms + p->jitter_ms * jitter_draw);
}

}  // namespace tepdist::gossip

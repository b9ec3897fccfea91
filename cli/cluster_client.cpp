#include "cli/cluster_client.hpp"

#include <fmt/format.h>
#include <unistd.h>

namespace tepdist::cli {

namespace {

gossip::TransportOptions client_options(const elastic::JobConfig& config, const std::string& secret,
                                        const std::string& id) {
  gossip::TransportOptions o;
  o.identity = {config.cluster.cluster_id, id, "local", secret, "", config.cluster.frames()};
  o.limits.max_frame_bytes = static_cast<uint32_t>(config.cluster.max_frame_mb) << 20;
  return o;
}

}  // namespace

ClusterClient::ClusterClient(const elastic::JobConfig& config, const std::string& secret, const std::string& name)
    : cluster_id_(config.cluster.cluster_id),
      id_(fmt::format("{}-{}", name, ::getpid())),
      options_(client_options(config, secret, id_)),
      transport_(options_, gossip::TransportEvents{
                               [this](const std::string&, const std::string&, gossip::Message m) {
                                 std::lock_guard lock(mutex_);
                                 if (auto* sync = std::get_if<gossip::StateSync>(&m.body); sync && sync->reply)
                                   view_ = std::move(*sync);
                                 else if (inbox_.size() < 64)  // an answer or two is all a client expects
                                   inbox_.push_back(std::move(m));
                                 arrived_.notify_all();
                               },
                               nullptr,
                               [this](const std::string& peer, const std::string& reason) {
                                 std::lock_guard lock(mutex_);
                                 lost_ = fmt::format("the connection to {} closed: {}", peer, reason);
                                 arrived_.notify_all();
                               },
                               [this](const std::string& peer, const std::string& reason) {
                                 std::lock_guard lock(mutex_);
                                 refused_ = fmt::format("{} refused: {}", peer, reason);
                                 arrived_.notify_all();
                               }}) {}

std::expected<void, std::string> ClusterClient::start() {
  if (auto bound = transport_.start(); !bound) return std::unexpected(bound.error());
  return {};
}

std::expected<gossip::StateSync, std::string> ClusterClient::ask_view(const std::string& peer,
                                                                      std::chrono::milliseconds limit) {
  {
    std::lock_guard lock(mutex_);
    view_.reset();
  }
  send(peer, gossip::StateSync{{}, false, 0});
  std::unique_lock lock(mutex_);
  if (!arrived_.wait_for(lock, limit, [&] { return view_ || refused_; }))
    return std::unexpected(
        fmt::format("no answer from {} within {} s (is a node listening there?)", peer, limit.count() / 1000.0));
  if (refused_) return std::unexpected(*refused_);
  return *view_;
}

void ClusterClient::send(const std::string& address, gossip::Body body) {
  transport_.send(address, {id_, 1, cluster_id_, std::move(body)});
}

std::expected<std::optional<gossip::Message>, std::string> ClusterClient::next(std::chrono::milliseconds limit) {
  std::unique_lock lock(mutex_);
  arrived_.wait_for(lock, limit, [&] { return !inbox_.empty() || refused_ || lost_; });
  if (!inbox_.empty()) {
    auto m = std::move(inbox_.front());
    inbox_.pop_front();
    return m;
  }
  if (refused_) return std::unexpected(*refused_);
  if (lost_) return std::unexpected(*lost_);
  return std::optional<gossip::Message>();
}

}  // namespace tepdist::cli

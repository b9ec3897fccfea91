#pragma once
// Gossip averaging, sans-IO: decentralised training's one collective. Every worker keeps a full
// replica and takes local steps; every few steps an active worker averages its parameters with one
// randomly chosen passive worker (asynchronous decentralised SGD, Lian et al., "Asynchronous
// Decentralized Parallel Stochastic Gradient Descent", 2018).
//
// Pairing cannot deadlock: even ranks are active and odd ranks passive (AD-PSGD's bipartite
// split). A passive worker never starts an exchange, so no two workers ever wait on each other,
// and an active one never waits at all: it keeps stepping while its exchange is in flight.
//
//   active  --GossipAverage (its parameters x_s, in chunks)-->           passive
//   passive: x_p <- (x_s + x_p) / 2, answers with its x_p from before --> active
//   active:  x_a <- x_a + (x_p - x_s) / 2
//
// Had the active side not stepped meanwhile, both now hold (x_s + x_p) / 2; the local steps it
// took in between are kept on top. Each chunk is averaged on its own, so an exchange cut short
// (a chunk lost, a partner finished) leaves every chunk either averaged or untouched. An
// exchange that has waited timeout_steps of the active side's steps is abandoned.
//
// No socket, thread or clock inside: the caller sends what the functions append, to the partner.

#include <cstdint>
#include <expected>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gossip/wire/messages.hpp"

namespace tepdist::gossip::collective {

class GossipAveraging {
 public:
  struct Options {
    uint64_t job_id = 0;
    uint32_t rank = 0, world = 1;
    size_t elements = 0;
    size_t chunk_elements = 65536;  ///< the largest piece one message carries
    uint64_t every = 4;             ///< active side: local steps between exchanges
    uint64_t timeout_steps = 16;    ///< active side: steps an unanswered exchange may wait
  };

  explicit GossipAveraging(Options options);

  /// Even ranks start exchanges; odd ranks answer them. A world of one has no exchanges.
  bool active() const { return o_.rank % 2 == 0 && o_.world > 1; }
  /// The passive partner for a random draw (uniform over the odd ranks).
  uint32_t partner(uint64_t random) const;

  /// After each local step: whether an active worker should start an exchange now. Counts the
  /// step, and abandons an exchange that has waited too long.
  bool after_step();
  /// Starts exchange `id` with the parameters as they are; appends the chunks to send the partner.
  void begin(uint64_t id, std::span<const float> params, std::vector<GossipAverage>& out);
  /// Passive side: averages its parameters with a request chunk and appends the answer.
  std::expected<void, std::string> on_request(const GossipAverage& request, std::span<float> params,
                                              std::vector<GossipAverage>& out);
  /// Active side: a chunk of the partner's answer (the caller checks it came from that partner).
  std::expected<void, std::string> on_reply(const GossipAverage& reply, std::span<float> params);

  bool in_flight() const { return exchange_ != 0; }
  /// Drops the exchange in flight (the job is ending): later answers to it are refused.
  void abandon();
  uint64_t completed() const { return completed_; }
  uint64_t abandoned() const { return abandoned_; }
  uint64_t answered() const { return answered_; }

 private:
  std::expected<void, std::string> check(const GossipAverage& m) const;

  Options o_;
  uint64_t steps_ = 0, exchange_ = 0, started_at_ = 0;
  std::shared_ptr<const std::vector<float>> sent_;  // x_s of the exchange in flight
  std::vector<uint8_t> replied_;                    // per chunk
  size_t replies_ = 0;
  uint64_t completed_ = 0, abandoned_ = 0, answered_ = 0;
};

}  // namespace tepdist::gossip::collective

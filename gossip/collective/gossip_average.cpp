#include "gossip/collective/gossip_average.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace tepdist::gossip::collective {

GossipAveraging::GossipAveraging(Options options) : o_(options) {
  o_.chunk_elements = std::max<size_t>(1, o_.chunk_elements);
  o_.every = std::max<uint64_t>(1, o_.every);
}

uint32_t GossipAveraging::partner(uint64_t random) const {
  const uint32_t passive = o_.world / 2;  // ranks 1, 3, 5, ...
  return 2 * static_cast<uint32_t>(random % std::max<uint32_t>(1, passive)) + 1;
}

bool GossipAveraging::after_step() {
  ++steps_;
  if (!active()) return false;
  if (in_flight() && steps_ - started_at_ >= o_.timeout_steps) {
    abandon();
    ++abandoned_;
  }
  return !in_flight() && steps_ % o_.every == 0;
}

void GossipAveraging::begin(uint64_t id, std::span<const float> params, std::vector<GossipAverage>& out) {
  exchange_ = id == 0 ? 1 : id;
  started_at_ = steps_;
  auto sent = std::make_shared<const std::vector<float>>(params.begin(), params.end());
  const size_t chunks = (sent->size() + o_.chunk_elements - 1) / o_.chunk_elements;
  replied_.assign(chunks, 0);
  replies_ = 0;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t off = c * o_.chunk_elements, len = std::min(o_.chunk_elements, sent->size() - off);
    out.push_back(GossipAverage{o_.job_id, exchange_, false,
                                TensorChunk{steps_, 0, off, sent->size(), std::span<const float>(sent->data() + off, len), sent}});
  }
  sent_ = std::move(sent);
}

std::expected<void, std::string> GossipAveraging::check(const GossipAverage& m) const {
  if (m.job_id != o_.job_id) return std::unexpected(fmt::format("job {}, not {}", m.job_id, o_.job_id));
  const auto& c = m.chunk;
  if (c.total != o_.elements || c.offset % o_.chunk_elements != 0 || c.offset >= o_.elements ||
      c.data.size() != std::min(o_.chunk_elements, o_.elements - c.offset))
    return std::unexpected(fmt::format("a chunk of {} values at offset {} (total {}) does not fit {} parameters in chunks "
                                       "of {}",
                                       c.data.size(), c.offset, c.total, o_.elements, o_.chunk_elements));
  if (!std::all_of(c.data.begin(), c.data.end(), [](float v) { return std::isfinite(v); }))
    return std::unexpected(std::string("parameters that are not finite"));
  return {};
}

std::expected<void, std::string> GossipAveraging::on_request(const GossipAverage& request, std::span<float> params,
                                                             std::vector<GossipAverage>& out) {
  if (request.reply) return std::unexpected(std::string("an answer, not a request"));
  if (active()) return std::unexpected(fmt::format("rank {} is active and answers no exchange", o_.rank));
  if (auto ok = check(request); !ok) return ok;
  const auto& c = request.chunk;
  auto before = std::make_shared<const std::vector<float>>(params.begin() + static_cast<ptrdiff_t>(c.offset),
                                                           params.begin() + static_cast<ptrdiff_t>(c.offset + c.data.size()));
  for (size_t i = 0; i < c.data.size(); ++i) params[c.offset + i] = 0.5f * (params[c.offset + i] + c.data[i]);
  out.push_back(GossipAverage{o_.job_id, request.exchange, true,
                              TensorChunk{steps_, 0, c.offset, c.total, std::span<const float>(*before), before}});
  if (c.offset + c.data.size() == o_.elements) ++answered_;
  return {};
}

std::expected<void, std::string> GossipAveraging::on_reply(const GossipAverage& reply, std::span<float> params) {
  if (!reply.reply) return std::unexpected(std::string("a request, not an answer"));
  if (!in_flight() || reply.exchange != exchange_)
    return std::unexpected(fmt::format("an answer to exchange {}, which is not in flight", reply.exchange));
  if (auto ok = check(reply); !ok) return ok;
  const auto& c = reply.chunk;
  const size_t index = c.offset / o_.chunk_elements;
  if (replied_[index]) return std::unexpected(fmt::format("a second answer for offset {}", c.offset));
  replied_[index] = 1;
  const auto& sent = *sent_;
  for (size_t i = 0; i < c.data.size(); ++i) params[c.offset + i] += 0.5f * (c.data[i] - sent[c.offset + i]);
  if (++replies_ == replied_.size()) {
    ++completed_;
    exchange_ = 0;
    sent_.reset();
  }
  return {};
}

void GossipAveraging::abandon() {
  exchange_ = 0;
  sent_.reset();
  replied_.clear();
  replies_ = 0;
}

}  // namespace tepdist::gossip::collective

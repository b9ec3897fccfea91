#include "gossip/collective/ring_allreduce.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <memory>

#include "base/check.hpp"

namespace tepdist::gossip::collective {

RingAllReduce::RingAllReduce(Options options) : o_(options), step_(options.steps_done) {
  o_.world = std::max<uint32_t>(1, o_.world);
  o_.chunk_elements = std::max<size_t>(1, o_.chunk_elements);
  // Slots: every chunk this rank receives in one step, phase by phase, round by round.
  for (uint8_t phase = 0; phase < (pair() ? 1 : 2); ++phase)
    for (uint32_t round = 0; round + 1 < o_.world; ++round) {
      slot_base_.push_back(expected_);
      const Range s = received_range(phase, round);
      expected_ += (s.end - s.begin + o_.chunk_elements - 1) / o_.chunk_elements;
    }
}

RingAllReduce::Range RingAllReduce::received_range(uint8_t phase, uint32_t round) const {
  if (pair()) return {0, o_.elements};
  return segment(segment_received(phase, round));
}

RingAllReduce::Range RingAllReduce::segment(uint32_t index) const {
  const size_t n = o_.world;
  return {o_.elements * index / n, o_.elements * (index + 1) / n};
}

uint32_t RingAllReduce::segment_received(uint8_t phase, uint32_t round) const {
  const uint32_t n = o_.world;
  // Reduce-scatter round s brings segment (r - s - 1) mod N; all-gather round s brings (r - s) mod N.
  return (o_.rank + n * 2 - round - (phase == 0 ? 1 : 0)) % n;
}

std::expected<size_t, std::string> RingAllReduce::slot_of(const RingChunk& c) const {
  if (c.phase > 1) return std::unexpected(fmt::format("phase {} is neither 0 nor 1", c.phase));
  if (pair() && c.phase != 0) return std::unexpected(fmt::format("phase {} between two ranks, which exchange in phase 0", c.phase));
  if (o_.world < 2 || c.round >= o_.world - 1)  // (not round + 1: a round of 2^32 - 1 would wrap)
    return std::unexpected(fmt::format("round {} in a ring of {}", c.round, o_.world));
  if (c.chunk.total != o_.elements)
    return std::unexpected(fmt::format("a buffer of {} elements, not {}", c.chunk.total, o_.elements));
  const Range s = received_range(c.phase, c.round);
  const size_t offset = c.chunk.offset;
  if (offset < s.begin || offset >= s.end || (offset - s.begin) % o_.chunk_elements != 0)
    return std::unexpected(fmt::format("offset {} is not a chunk of segment [{}, {}) expected in phase {} round {}", offset,
                                       s.begin, s.end, c.phase, c.round));
  if (c.chunk.data.size() != std::min(o_.chunk_elements, s.end - offset))
    return std::unexpected(fmt::format("{} elements at offset {}, expected {}", c.chunk.data.size(), offset,
                                       std::min(o_.chunk_elements, s.end - offset)));
  return slot_base_[static_cast<size_t>(c.phase) * (o_.world - 1) + c.round] + (offset - s.begin) / o_.chunk_elements;
}

RingAllReduce::Range RingAllReduce::own() const {
  if (o_.world < 2) return {0, 0};
  return pair() ? Range{0, o_.elements} : segment(o_.rank);
}

void RingAllReduce::emit(uint8_t phase, uint32_t round, size_t begin, size_t end, std::vector<RingChunk>& out) {
  emit(step_, buffer_, phase, round, begin, end, out);
}

void RingAllReduce::emit(uint64_t step, std::span<const float> buffer, uint8_t phase, uint32_t round, size_t begin,
                         size_t end, std::vector<RingChunk>& out) {
  // The transport may hold a frame for seconds (link emulation) while this buffer changes: send an
  // immutable copy.
  auto copy = std::make_shared<const std::vector<float>>(buffer.begin() + static_cast<ptrdiff_t>(begin),
                                                         buffer.begin() + static_cast<ptrdiff_t>(end));
  bytes_sent_ += (end - begin) * sizeof(float);
  out.push_back({o_.job_id, phase, round, TensorChunk{step, 0, begin, o_.elements, *copy, copy}});
}

void RingAllReduce::offer(uint64_t step, std::span<const float> buffer, size_t begin, size_t end,
                          std::vector<RingChunk>& out) {
  TEPDIST_CHECK(can_offer(step));
  TEPDIST_CHECK(buffer.size() == o_.elements && begin <= end && end <= o_.elements);
  const Range mine = own();
  const size_t chunks = (mine.end - mine.begin + o_.chunk_elements - 1) / o_.chunk_elements;
  if (offered_step_ != step) {
    offered_step_ = step;
    offered_.assign(chunks, 0);
    offered_ranges_.assign(chunks, {});
  }
  begin = std::max(begin, mine.begin);
  end = std::min(end, mine.end);
  // Chunk by chunk of own() that [begin, end) touches: count what is offered, send what is whole.
  for (size_t b = begin; b < end;) {
    const size_t k = (b - mine.begin) / o_.chunk_elements;
    const size_t chunk_begin = mine.begin + k * o_.chunk_elements;
    const size_t chunk_end = std::min(mine.end, chunk_begin + o_.chunk_elements);
    const size_t upto = std::min(end, chunk_end);
    // Each element at most once: no range of this chunk offered before overlaps this one.
    TEPDIST_CHECK(offered_[k] != SIZE_MAX && "offer(): an element offered twice");
    for (const auto& r : offered_ranges_[k]) TEPDIST_CHECK((upto <= r.begin || r.end <= b) && "offer(): an element offered twice");
    offered_ranges_[k].push_back({b, upto});
    offered_[k] += upto - b;
    if (offered_[k] == chunk_end - chunk_begin) {
      emit(step, buffer, 0, 0, chunk_begin, chunk_end, out);
      offered_[k] = SIZE_MAX;
      offered_ranges_[k].clear();
    }
    b = upto;
  }
}

void RingAllReduce::start(uint64_t step, std::span<float> buffer, std::vector<RingChunk>& out) {
  const bool offered = offered_step_ == step;
  offered_step_ = 0;
  step_ = step;
  buffer_ = buffer;
  active_ = true;
  seen_.assign(expected_, 0);
  received_ = 0;
  const Range mine = own();
  for (size_t b = mine.begin, k = 0; b < mine.end; b += o_.chunk_elements, ++k)
    if (!offered || offered_[k] != SIZE_MAX) emit(0, 0, b, std::min(mine.end, b + o_.chunk_elements), out);
  std::vector<RingChunk> early;
  early.swap(early_);
  for (auto& c : early) {
    if (c.chunk.step != step_) continue;
    auto slot = slot_of(c);
    if (!slot || seen_[*slot]) continue;  // a duplicate kept while early: ignored like any other
    seen_[*slot] = 1;
    ++received_;
    apply(c, out);
  }
}

std::expected<void, std::string> RingAllReduce::on_chunk(const RingChunk& c, std::vector<RingChunk>& out) {
  if (c.job_id != o_.job_id) return std::unexpected(fmt::format("chunk of job {}, not {}", c.job_id, o_.job_id));
  auto slot = slot_of(c);
  if (!slot) return std::unexpected(slot.error());
  if (c.chunk.step == step_ + 1) {  // a neighbour already on the next step
    if (early_.size() >= expected_) return std::unexpected(fmt::format("too many chunks ahead of step {}", step_));
    early_.push_back(c);
    return {};
  }
  if (!active_ || c.chunk.step != step_)
    return std::unexpected(fmt::format("chunk of step {} while at step {}", c.chunk.step, step_));
  if (seen_[*slot])
    return std::unexpected(fmt::format("duplicate chunk: phase {} round {} offset {}", c.phase, c.round, c.chunk.offset));
  seen_[*slot] = 1;
  ++received_;
  apply(c, out);
  return {};
}

void RingAllReduce::apply(const RingChunk& c, std::vector<RingChunk>& out) {
  const size_t begin = c.chunk.offset, end = begin + c.chunk.data.size();
  float* dst = buffer_.data() + begin;
  const float* src = c.chunk.data.data();
  const bool last_round = c.round + 2 == o_.world;
  if (pair()) {  // the partner's whole buffer, in chunks: added, and sent on nowhere
    for (size_t i = 0; i < end - begin; ++i) dst[i] += src[i];
  } else if (c.phase == 0) {
    for (size_t i = 0; i < end - begin; ++i) dst[i] += src[i];
    // Reduced once more: on to the next rank, or, complete, into the all-gather.
    if (last_round) emit(1, 0, begin, end, out);
    else emit(0, c.round + 1, begin, end, out);
  } else {
    std::copy(src, src + (end - begin), dst);
    if (!last_round) emit(1, c.round + 1, begin, end, out);
  }
}

}  // namespace tepdist::gossip::collective

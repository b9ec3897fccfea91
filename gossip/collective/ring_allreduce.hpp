#pragma once
// Ring all-reduce, sans-IO: the bandwidth-optimal sum of one float buffer over N ranks, each
// talking only to its ring neighbours (Patarasuk & Yuan, 2009; as in Horovod and NCCL's ring).
//
// The buffer is cut into N segments. Reduce-scatter: in round s (0 .. N-2) rank r sends segment
// (r - s) mod N to rank r + 1 and adds the segment (r - s - 1) mod N it receives from rank r - 1 into
// its own copy; after N - 1 rounds rank r holds the complete sum of segment (r + 1) mod N.
// All-gather: in round s rank r passes on segment (r + 1 - s) mod N, and overwrites the segment it
// receives. Each rank sends 2 (N - 1) / N of the buffer in all, whatever N is.
//
// Segments are cut further into chunks of at most chunk_elements, and each chunk moves on as
// soon as it has been reduced: the rounds overlap (pipelining) instead of waiting for whole
// segments. Every sum is computed once, by one rank, in one order, and copied bit for bit to the
// others, so all ranks end with identical buffers.
//
// Two ranks exchange instead: each sends its whole buffer to the other (phase 0, round 0, the
// same bytes as the ring's two rounds) and adds what it receives; a + b and b + a are the same
// float (a NaN stays a NaN on both), so both hold the same sums. The ring would take two exchanges
// after the later rank is ready (its half to the other, the other's sum back); this takes none for
// the later rank, whose partner's buffer is already in when it starts, and one for the earlier
// (measured on two local nodes of a sync job: see the README's load-balancing figures).
//
// A rank's first sends (its own segment in round 0; its whole buffer for two ranks) depend on
// nothing received, so they may go before start(): offer() takes the parts of the next step's
// buffer that are final (a layer's gradients, as the backward pass finishes them) and sends each
// chunk wholly covered, while the rest of the buffer is still being computed. start() sends what
// is left. The chunks are the same, whenever they go.
//
// The class owns no socket, thread or clock: start() and on_chunk() return the chunks to send
// (always to the next rank), and done() says when the buffer holds the sum. Chunks of the next
// step that arrive before start() (a faster neighbour) are kept until then; anything else that
// does not fit the geometry (another job, an old step, a wrong offset, a duplicate) is refused
// with a reason, and changes nothing.

#include <cstdint>
#include <expected>
#include <span>
#include <string>
#include <vector>

#include "gossip/wire/messages.hpp"

namespace tepdist::gossip::collective {

class RingAllReduce {
 public:
  struct Options {
    uint64_t job_id = 0;
    uint32_t rank = 0, world = 1;
    size_t elements = 0;             ///< the buffer's length, the same on every rank
    size_t chunk_elements = 65536;   ///< the largest piece one message carries
    uint64_t steps_done = 0;         ///< steps summed before this ring existed: the first start() is steps_done + 1
  };

  explicit RingAllReduce(Options options);

  /// Begins summing `buffer` (elements long; it must stay valid and untouched by the caller until
  /// done()) for training step `step`: steps count from 1, one after the other. Appends to `out` what to
  /// send to the next rank, including what chunks that arrived early now allow.
  void start(uint64_t step, std::span<float> buffer, std::vector<RingChunk>& out);

  /// Before start(step), after the previous step is done: elements [begin, end) of the buffer step
  /// `step` will sum hold their final values (each element is offered at most once per step). Appends
  /// to `out` this rank's first-round chunks that offered ranges now cover wholly; they are copied,
  /// and the rest of `buffer` may still change until start().
  void offer(uint64_t step, std::span<const float> buffer, size_t begin, size_t end, std::vector<RingChunk>& out);
  /// Whether offer(step, ...) may be called now: the step after the ring's, the ring's done.
  bool can_offer(uint64_t step) const { return step == step_ + 1 && (!active_ || done()); }

  /// A chunk from the previous rank. Appends to `out` what to send on. An error names what is
  /// wrong with the chunk; the state is then unchanged.
  std::expected<void, std::string> on_chunk(const RingChunk& chunk, std::vector<RingChunk>& out);

  /// Whether the buffer of the current step holds the sum over all ranks.
  bool done() const { return active_ && received_ == expected_; }
  uint64_t step() const { return step_; }
  /// Tensor payload bytes this rank has sent so far, over all steps.
  uint64_t bytes_sent() const { return bytes_sent_; }
  /// Chunks expected from the previous rank per step: 2 (N - 1) segments' worth (the whole buffer
  /// for two ranks).
  size_t chunks_per_step() const { return expected_; }

 private:
  struct Range {
    size_t begin, end;
  };
  /// Two ranks: the exchange, not the ring.
  bool pair() const { return o_.world == 2; }
  Range segment(uint32_t index) const;
  /// The range of the buffer that arrives in (phase, round).
  Range received_range(uint8_t phase, uint32_t round) const;
  uint32_t segment_received(uint8_t phase, uint32_t round) const;
  /// The slot (phase, round, chunk) of a chunk within one step, or why it has none.
  std::expected<size_t, std::string> slot_of(const RingChunk& c) const;
  void apply(const RingChunk& c, std::vector<RingChunk>& out);
  void emit(uint8_t phase, uint32_t round, size_t begin, size_t end, std::vector<RingChunk>& out);
  void emit(uint64_t step, std::span<const float> buffer, uint8_t phase, uint32_t round, size_t begin, size_t end,
            std::vector<RingChunk>& out);
  /// This rank's round-0 range (its segment; the whole buffer for two ranks).
  Range own() const;

  Options o_;
  std::vector<size_t> slot_base_;  // first slot of each (phase, round)
  size_t expected_ = 0;
  bool active_ = false;
  uint64_t step_ = 0;
  std::span<float> buffer_;
  std::vector<uint8_t> seen_;     // per slot of the current step
  size_t received_ = 0;
  std::vector<RingChunk> early_;  // chunks of step_ + 1, from a neighbour that is ahead
  uint64_t offered_step_ = 0;     // the step offer() has sent chunks of (0: none)
  std::vector<size_t> offered_;   // per chunk of own(): elements offered; SIZE_MAX once sent
  std::vector<std::vector<Range>> offered_ranges_;  // per chunk of own() not yet sent: the ranges offered
  uint64_t bytes_sent_ = 0;
};

}  // namespace tepdist::gossip::collective

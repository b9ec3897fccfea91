#pragma once
// State transfer, sans-IO: a member behind (or a joiner) pulls a job's state from the members
// that hold it (donors), striped over all of them at once, and a donor answers from its own.
//
//   state       one flat vector of floats made of several buffers laid end to end (parameters,
//               then each optimiser state buffer); StateView maps offsets into them, so neither
//               side copies the whole state to send or receive it.
//   striping    [0, total) is cut into one stripe per donor, each asked for in pieces of at most
//               `piece` elements, all at once (the donors' links work in parallel).
//   loss        a piece not received `retry_ms` after it was asked for is asked again from the
//               next donor in turn; a donor that answers for another step is refused (sync
//               donors hold the state of exactly one step).
//   generation  the job's state is asked for, and served, as of the generation the puller
//               installed: a donor that has not installed it yet holds its pulls until it does, and
//               a piece of another generation's state is refused, even at the same step (a
//               program may set the parameters anew at a between-epochs hold).
//   refusal     a donor that does not hold the state asked for says so at once, with a piece of
//               nothing (refusal_of); the puller asks its next donor for that stripe without
//               waiting for the retry.
//   done        when every element has arrived once (pieces are placed by offset; a duplicate
//               changes nothing).

#include <cstdint>
#include <expected>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gossip/wire/messages.hpp"

namespace tepdist::elastic {

/// Buffers laid end to end as one vector.
class StateView {
 public:
  explicit StateView(std::vector<std::span<float>> parts) : parts_(std::move(parts)) {}
  size_t size() const;
  /// Copies [offset, offset + out.size()) out; false if that is outside the state.
  bool read(size_t offset, std::span<float> out) const;
  /// Copies `in` to [offset, offset + in.size()); false if that is outside the state.
  bool write(size_t offset, std::span<const float> in) const;

 private:
  std::vector<std::span<float>> parts_;
};

class StatePuller {
 public:
  struct Options {
    uint64_t job_id = 0;
    uint64_t step = 0;            ///< the step the state is wanted at
    size_t total = 0;             ///< elements in the whole state
    size_t piece = 1 << 16;       ///< elements per request
    double retry_ms = 5000;
    std::vector<std::string> donors;  ///< addresses
    /// Async, a striped shard fetch: shard `shard`'s state at version `step` (StatePull::of_shard),
    /// the one whose digest is `digest`.
    bool of_shard = false;
    uint32_t shard = 0;
    uint64_t digest = 0;
    /// The job's state: of the generation the puller installed (0: a shard's state).
    uint64_t generation = 0;
  };
  explicit StatePuller(Options options);
  /// The first requests: (donor address, request).
  void start(double now, std::vector<std::pair<std::string, gossip::StatePull>>& out);
  /// A piece; written into `state` if it is one asked for and not had yet.
  std::expected<void, std::string> on_piece(const gossip::StatePiece& piece, const StateView& state);
  /// Asks again, from the next donor, for pieces that did not come in time.
  void on_tick(double now, std::vector<std::pair<std::string, gossip::StatePull>>& out);
  /// `donor` (an address) does not hold the state: what it was asked for is asked of the next now,
  /// unless every donor has refused it in turn: then it waits for the tick (retry_ms), so donors
  /// that all refuse for a while (a generation the puller has not installed yet) are not asked
  /// round and round at the rate the refusals come back.
  void refused(const std::string& donor, double now, std::vector<std::pair<std::string, gossip::StatePull>>& out);
  /// `refusal` (is_refusal) came from `donor`: if it answers this pull (its job, shard,
  /// generation and step), as refused(); otherwise why it is not this pull's, and nothing moves.
  std::expected<void, std::string> on_refusal(const gossip::StatePiece& refusal, const std::string& donor, double now,
                                              std::vector<std::pair<std::string, gossip::StatePull>>& out);
  bool done() const { return received_ == requests_.size(); }
  size_t pieces() const { return requests_.size(); }

 private:
  struct Request {
    size_t offset, count;
    size_t donor;
    double asked_at;
    bool received = false;
    size_t refusals = 0;  // refused in a row since the last tick moved it
  };
  gossip::StatePull pull(const Request& r) const;

  Options o_;
  std::vector<Request> requests_;
  size_t received_ = 0;
};

/// What a donor serves: the job (or shard) and the generation and step its state is of.
struct ServedState {
  uint64_t job_id = 0;
  uint64_t generation = 0;  ///< 0: a shard's state (StatePull::generation)
  uint64_t step = 0;
};

/// A donor's answer that it does not hold the state `pull` asks for: a piece of nothing (no
/// values, a total of 0, at offset 0) naming the pull's job, shard, generation and step.
gossip::StatePiece refusal_of(const gossip::StatePull& pull);
/// Whether `piece` is a donor's refusal (refusal_of), not a piece of a state.
inline bool is_refusal(const gossip::StatePiece& piece) { return piece.chunk.total == 0 && piece.chunk.data.empty(); }

/// A donor's answer to `pull` from `state`, which is `of`: pieces of at most `piece` elements,
/// each an immutable snapshot (of a shard's state: marked so, naming the shard). An error
/// (another job, generation or step, out of range) says why.
std::expected<std::vector<gossip::StatePiece>, std::string> serve_state(const gossip::StatePull& pull,
                                                                       const ServedState& of, const StateView& state,
                                                                       size_t piece);

}  // namespace tepdist::elastic

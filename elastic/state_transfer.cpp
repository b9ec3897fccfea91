#include "elastic/state_transfer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "base/check.hpp"

namespace tepdist::elastic {

size_t StateView::size() const {
  size_t n = 0;
  for (const auto& p : parts_) n += p.size();
  return n;
}

namespace {

/// Calls f(part, begin within part, begin within the range, count) for each part [offset, offset + n) touches.
template <class F>
bool for_range(const std::vector<std::span<float>>& parts, size_t offset, size_t n, F f) {
  size_t base = 0, done = 0;
  for (const auto& p : parts) {
    if (done == n) break;
    const size_t at = offset + done;
    if (at < base + p.size()) {
      const size_t within = at - base;
      const size_t take = std::min(n - done, p.size() - within);
      f(p, within, done, take);
      done += take;
    }
    base += p.size();
  }
  return done == n;
}

}  // namespace

bool StateView::read(size_t offset, std::span<float> out) const {
  if (offset + out.size() > size()) return false;
  return for_range(parts_, offset, out.size(), [&](std::span<float> p, size_t within, size_t at, size_t take) {
    std::copy_n(p.begin() + static_cast<ptrdiff_t>(within), take, out.begin() + static_cast<ptrdiff_t>(at));
  });
}

bool StateView::write(size_t offset, std::span<const float> in) const {
  if (offset + in.size() > size()) return false;
  return for_range(parts_, offset, in.size(), [&](std::span<float> p, size_t within, size_t at, size_t take) {
    std::copy_n(in.begin() + static_cast<ptrdiff_t>(at), take, p.begin() + static_cast<ptrdiff_t>(within));
  });
}

StatePuller::StatePuller(Options options) : o_(std::move(options)) {
  o_.piece = std::max<size_t>(1, o_.piece);
  const size_t donors = std::max<size_t>(1, o_.donors.size());
  const size_t stripe = (o_.total + donors - 1) / donors;
  for (size_t d = 0; d < donors; ++d) {
    const size_t begin = std::min(o_.total, d * stripe), end = std::min(o_.total, begin + stripe);
    for (size_t at = begin; at < end; at += o_.piece) requests_.push_back({at, std::min(o_.piece, end - at), d, 0});
  }
}

gossip::StatePull StatePuller::pull(const Request& r) const {
  return gossip::StatePull{o_.job_id, o_.step, r.offset, r.count, o_.of_shard, o_.shard, o_.digest, o_.generation};
}

void StatePuller::start(double now, std::vector<std::pair<std::string, gossip::StatePull>>& out) {
  if (o_.donors.empty()) return;
  for (auto& r : requests_) {
    r.asked_at = now;
    out.emplace_back(o_.donors[r.donor], pull(r));
  }
}

namespace {

/// Why `piece` is not an answer to this pull (job, shard or not, generation, step), if it is not.
std::expected<void, std::string> answers(const StatePuller::Options& o, const gossip::StatePiece& piece) {
  if (piece.job_id != o.job_id) return std::unexpected(fmt::format("a piece of job {}, not {}", piece.job_id, o.job_id));
  if (piece.of_shard != o.of_shard || (o.of_shard && piece.chunk.shard != o.shard))
    return std::unexpected(piece.of_shard ? fmt::format("a piece of shard {}'s state", piece.chunk.shard)
                                          : std::string("a piece of the job's state, not a shard's"));
  if (piece.generation != o.generation)
    return std::unexpected(
        fmt::format("a piece of generation {}'s state, not generation {}'s", piece.generation, o.generation));
  if (piece.chunk.step != o.step)
    return std::unexpected(fmt::format("a piece of the state at step {}, not {}", piece.chunk.step, o.step));
  return {};
}

}  // namespace

std::expected<void, std::string> StatePuller::on_piece(const gossip::StatePiece& piece, const StateView& state) {
  if (auto ok = answers(o_, piece); !ok) return ok;
  if (piece.chunk.total != o_.total)
    return std::unexpected(fmt::format("a piece of a state of {} elements, not {}", piece.chunk.total, o_.total));
  const auto it = std::find_if(requests_.begin(), requests_.end(), [&](const Request& r) {
    return r.offset == piece.chunk.offset && r.count == piece.chunk.data.size();
  });
  if (it == requests_.end())
    return std::unexpected(fmt::format("a piece [{}, +{}) that was not asked for", piece.chunk.offset,
                                       piece.chunk.data.size()));
  if (it->received) return {};
  if (!state.write(it->offset, piece.chunk.data)) return std::unexpected(std::string("a piece outside the state"));
  it->received = true;
  ++received_;
  return {};
}

void StatePuller::on_tick(double now, std::vector<std::pair<std::string, gossip::StatePull>>& out) {
  if (o_.donors.empty()) return;
  for (auto& r : requests_) {
    if (r.received || now - r.asked_at < o_.retry_ms) continue;
    r.refusals = 0;
    r.donor = (r.donor + 1) % o_.donors.size();
    r.asked_at = now;
    out.emplace_back(o_.donors[r.donor], pull(r));
  }
}

void StatePuller::refused(const std::string& donor, double now, std::vector<std::pair<std::string, gossip::StatePull>>& out) {
  if (o_.donors.size() < 2) return;  // nobody else to ask: the ticks ask it again
  for (auto& r : requests_) {
    if (r.received || o_.donors[r.donor] != donor) continue;
    if (++r.refusals >= o_.donors.size()) continue;  // every donor refused it: on_tick asks again
    r.donor = (r.donor + 1) % o_.donors.size();
    r.asked_at = now;
    out.emplace_back(o_.donors[r.donor], pull(r));
  }
}

std::expected<void, std::string> StatePuller::on_refusal(const gossip::StatePiece& refusal, const std::string& donor,
                                                         double now,
                                                         std::vector<std::pair<std::string, gossip::StatePull>>& out) {
  TEPDIST_CHECK(is_refusal(refusal));
  if (auto ok = answers(o_, refusal); !ok) return ok;
  refused(donor, now, out);
  return {};
}

gossip::StatePiece refusal_of(const gossip::StatePull& pull) {
  // At offset 0: the wire takes no chunk that starts past its tensor's end (a total of 0), and the
  // puller moves whatever it asked of this donor, not one piece.
  return {pull.job_id, gossip::TensorChunk{pull.step, pull.of_shard ? pull.shard : 0, 0, 0, {}, nullptr}, pull.of_shard,
          pull.generation};
}

std::expected<std::vector<gossip::StatePiece>, std::string> serve_state(const gossip::StatePull& pull,
                                                                       const ServedState& of, const StateView& state,
                                                                       size_t piece) {
  const auto [job_id, generation, step] = of;
  if (pull.job_id != job_id) return std::unexpected(fmt::format("job {} is not running here", pull.job_id));
  if (pull.generation != generation)
    return std::unexpected(
        fmt::format("the state here is generation {}'s, not generation {}'s", generation, pull.generation));
  if (pull.step != step)
    return std::unexpected(fmt::format("the state here is at step {}, not {}", step, pull.step));
  const size_t total = state.size();
  if (pull.offset > total || pull.count > total - pull.offset || pull.count == 0)
    return std::unexpected(fmt::format("[{}, +{}) is outside a state of {} elements", pull.offset, pull.count, total));
  std::vector<gossip::StatePiece> out;
  piece = std::max<size_t>(1, piece);
  for (size_t at = pull.offset; at < pull.offset + pull.count; at += piece) {
    const size_t n = std::min(piece, pull.offset + pull.count - at);
    auto copy = std::make_shared<std::vector<float>>(n);
    state.read(at, *copy);
    std::shared_ptr<const std::vector<float>> snapshot = copy;
    out.push_back({job_id, gossip::TensorChunk{step, pull.of_shard ? pull.shard : 0, at, total, *snapshot, snapshot},
                   pull.of_shard, generation});
  }
  return out;
}

}  // namespace tepdist::elastic

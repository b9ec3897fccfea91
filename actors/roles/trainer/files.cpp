// A job's files on a node that cannot read them where the config says (another machine than the
// submitter's, or a stale copy): fetched from the submitter into RESULTS_DIR/files, checked, and
// read from there (elastic/job_files.hpp has the protocol).

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "actors/roles/trainer/job.hpp"

namespace tepdist::actors::trainer_detail {
namespace {

namespace fs = std::filesystem;

/// Whether `path` holds exactly the bytes `f` describes (the size first: a cheap no).
bool holds(const std::string& path, const gossip::JobFile& f) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec || size != f.size) return false;
  const auto d = elastic::describe_file(path);
  return d && d->checksum == f.checksum;
}

std::string files_dir(const TrainerState& s) { return (fs::path(s.o.results_dir) / "files").string(); }

/// Where this node holds `f`'s bytes: at its path, or fetched before (into files_dir); empty: nowhere.
std::string where_held(const TrainerState& s, const gossip::JobFile& f) {
  if (holds(f.path, f)) return f.path;
  if (auto cached = elastic::cached_name(files_dir(s), f); holds(cached, f)) return cached;
  return {};
}

void close_parts(TrainerState::Fetching& f) {
  for (int& fd : f.fds)
    if (fd >= 0) ::close(std::exchange(fd, -1));
}

/// A fetch that failed leaves no part files behind.
void remove_parts(const TrainerState& s, const TrainerState::Fetching& f) {
  if (!f.fetcher) return;
  std::error_code ec;
  for (const auto& file : f.fetcher->files()) fs::remove(elastic::cached_name(files_dir(s), file) + ".part", ec);
}

/// The fetch failed: the job is refused here (a joiner declines it), saying which file and why.
void fetch_failed(Trainer* self, const std::string& why) {
  auto& s = self->state;
  auto f = std::move(*s.fetching);
  s.fetching.reset();
  close_parts(f);
  remove_parts(s, f);
  const auto message = fmt::format("cannot get the job's files from its submitter {}: {}", f.start.submitter, why);
  if (f.for_reset) {
    if (s.job && s.job->start.job_id == f.start.job_id) fail_everywhere(self, message);
    return;
  }
  if (!f.has_state && f.start.generation >= 2) return decline_join(self, f.start, message);
  s.ended_jobs.insert(f.start.job_id);
  fail_start(self, f.start, message);
}

void send_fetches(Trainer* self, const std::vector<gossip::FileFetch>& asks) {
  auto& s = self->state;
  for (const auto& a : asks)
    if (!send_to(self, s.fetching->start.submitter, a)) return fetch_failed(self, "its send queue stayed full");
}

/// Every file is here: the job starts, reading the fetched ones from the cache (or, for a
/// release's parameters, the generation that waited for them is entered).
void fetched_all(Trainer* self) {
  auto& s = self->state;
  auto f = std::move(*s.fetching);
  s.fetching.reset();
  close_parts(f);
  node_events().info("job_files_fetched job={} files={} seconds={:.1f}", f.start.job_id, f.index.size(),
                     seconds_between(f.since, Clock::now()));
  if (f.for_reset) {
    // In the cache now: the generation that waited for it is entered (or a newer one).
    if (s.job && s.job->start.job_id == f.start.job_id && s.job->control) enter_generation(self);
    return;
  }
  if (s.ended_jobs.contains(f.start.job_id) || s.job) return;  // stopped, or another started, meanwhile
  // Each fetched file, for every entry of the record with its bytes (a file listed twice came once).
  for (size_t k = 0; k < f.fetched.size(); ++k)
    for (size_t i = 0; i < f.start.files.size() && i < s.local_files.size(); ++i)
      if (s.local_files[i].empty() && f.start.files[i].checksum == f.fetcher->files()[k].checksum)
        s.local_files[i] = f.fetched[k];
  start_job(self, f.start, f.has_state);
}

/// Starts fetching `missing` (of f's job) from the submitter f's record names.
void begin_fetch(Trainer* self, TrainerState::Fetching f, std::vector<gossip::JobFile> missing) {
  auto& s = self->state;
  f.since = Clock::now();
  f.fetched.assign(missing.size(), std::string());
  auto fail = [&](const std::string& why) {
    s.fetching = std::move(f);
    fetch_failed(self, why);
  };
  const auto dir = files_dir(s);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return fail(fmt::format("cannot create {}: {}", dir, ec.message()));
  if (f.start.submitter.empty()) return fail("the job names no submitter");
  // Pieces that fit this node's frames (the piece's message adds well under 64 KiB).
  elastic::FileFetcher::Options options;
  options.piece_bytes = static_cast<size_t>(
      std::clamp<int64_t>(s.o.max_frame_kb * 1024 - (64 << 10), 4096, gossip::FilePiece::max_bytes));
  auto fetcher = elastic::FileFetcher::make(f.start.job_id, missing, options);
  if (!fetcher) return fail(fetcher.error());
  for (size_t k = 0; k < missing.size(); ++k) {
    const auto& file = missing[k];
    const auto cached = elastic::cached_name(dir, file);
    const auto part = cached + ".part";
    const int fd = ::open(part.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    f.fds.push_back(fd);
    if (fd < 0) return fail(fmt::format("cannot write {}: {}", part, std::strerror(errno)));
    if (file.size == 0) {
      // Nothing to fetch: an empty file is its checksum's only content.
      if (file.checksum != elastic::fnv1a_basis)
        return fail(fmt::format("{} is listed as 0 bytes with checksum {:016x}, which no empty file has", file.path,
                                file.checksum));
      ::close(std::exchange(f.fds.back(), -1));
      fs::rename(part, cached, ec);
      if (ec) return fail(fmt::format("cannot rename {}: {}", part, ec.message()));
      f.fetched[k] = cached;
    }
  }
  uint64_t bytes = 0;
  for (const auto& file : missing) bytes += file.size;
  node_events().info("job_files_fetching job={} files={} bytes={} from={}", f.start.job_id, missing.size(), bytes,
                     f.start.submitter);
  f.fetcher.emplace(std::move(*fetcher));
  s.fetching = std::move(f);
  std::vector<gossip::FileFetch> asks;
  s.fetching->fetcher->start(now_ms(s), asks);
  start_ticking(self);
  send_fetches(self, asks);
  if (s.fetching && s.fetching->fetcher->done()) fetched_all(self);  // empty files only
}

}  // namespace

void prepare_job(Trainer* self, const gossip::JobStart& record, bool has_state) {
  auto& s = self->state;
  if (s.fetching) {
    // Fetching for this job already: a later record (a newer generation) is the one to start with.
    if (s.fetching->start.job_id == record.job_id && record.generation > s.fetching->start.generation)
      s.fetching->start = record;
    return;
  }
  s.local_files_job = record.job_id;
  s.local_files.assign(record.files.size(), std::string());
  std::vector<gossip::JobFile> missing;
  std::vector<size_t> index;
  for (size_t i = 0; i < record.files.size(); ++i) {
    s.local_files[i] = where_held(s, record.files[i]);
    if (s.local_files[i].empty()) {
      missing.push_back(record.files[i]);
      index.push_back(i);
    }
  }
  if (missing.empty()) return start_job(self, record, has_state);
  // The same bytes listed twice (a training set that is also the test set) come once.
  for (size_t k = 1; k < missing.size(); ++k)
    for (size_t m = 0; m < k; ++m)
      if (missing[k].checksum == missing[m].checksum) {
        missing.erase(missing.begin() + static_cast<ptrdiff_t>(k));
        index.erase(index.begin() + static_cast<ptrdiff_t>(k--));
        break;
      }
  TrainerState::Fetching f{record, has_state};
  f.index = std::move(index);
  begin_fetch(self, std::move(f), std::move(missing));
}

std::string reset_file_here(Trainer* self, const gossip::JobStart& r) {
  auto& s = self->state;
  if (r.reset_file_checksum == 0) return r.reset_file;  // nothing to fetch it by: read where it is
  const gossip::JobFile file{r.reset_file, r.reset_file_size, r.reset_file_checksum};
  if (auto here = where_held(s, file); !here.empty()) return here;
  if (s.fetching) return {};  // one fetch at a time: when it ends, the generation is entered again
  TrainerState::Fetching f{r, true};
  if (f.start.submitter_id.empty() && s.job) f.start.submitter_id = s.job->start.submitter_id;
  f.for_reset = true;
  f.index = {0};
  begin_fetch(self, std::move(f), {file});
  return {};
}

void on_file_piece(Trainer* self, const std::string& peer, const gossip::FilePiece& piece) {
  auto& s = self->state;
  // Only the submitter's (a forged refusal would fail the fetch): the record names it.
  if (!s.fetching || (!s.fetching->start.submitter_id.empty() && peer != s.fetching->start.submitter_id)) return;
  auto& f = *s.fetching;
  std::vector<gossip::FileFetch> more;
  auto w = f.fetcher->on_piece(now_ms(s), piece, more);
  if (!w) return fetch_failed(self, w.error());
  if (!w->has_value()) return;
  const auto& [file, offset, data] = **w;
  const auto& described = f.fetcher->files()[file];
  if (::pwrite(f.fds[file], data->data(), data->size(), static_cast<off_t>(offset)) != static_cast<ssize_t>(data->size()))
    return fetch_failed(self, fmt::format("cannot write {}: {}", elastic::cached_name(files_dir(s), described) + ".part",
                                          std::strerror(errno)));
  if (f.fetcher->complete(file)) {
    // Whole: checked against the record before it is taken (a piece changed on the way, or the
    // submitter's file changed since it was described), then renamed into place.
    const auto cached = elastic::cached_name(files_dir(s), described);
    const auto part = cached + ".part";
    ::fsync(f.fds[file]);
    ::close(std::exchange(f.fds[file], -1));
    const auto got = elastic::describe_file(part);
    if (!got || got->checksum != described.checksum) {
      std::error_code ec;
      fs::remove(part, ec);
      return fetch_failed(self, fmt::format("{} came with checksum {:016x}, not the {:016x} the job lists", described.path,
                                            got ? got->checksum : 0, described.checksum));
    }
    std::error_code ec;
    fs::rename(part, cached, ec);
    if (ec) return fetch_failed(self, fmt::format("cannot rename {}: {}", part, ec.message()));
    f.fetched[file] = cached;
  }
  send_fetches(self, more);
  if (s.fetching && s.fetching->fetcher->done()) fetched_all(self);
}

void tick_files(Trainer* self) {
  auto& s = self->state;
  if (!s.fetching) return;
  std::vector<gossip::FileFetch> again;
  if (auto ok = s.fetching->fetcher->on_tick(now_ms(s), again); !ok) return fetch_failed(self, ok.error());
  send_fetches(self, again);
}

}  // namespace tepdist::actors::trainer_detail

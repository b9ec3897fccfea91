#pragma once
// The files a job reads (its data sets, the parameters it starts from) reach workers that do not
// have them: over the wire, from the job's submitter, which has them by construction (it named
// them). The submitter lists each file in the job record with its size and checksum
// (gossip::JobFile); a worker that cannot read the same bytes at the path (another machine, or a
// stale copy) fetches them in pieces into its own cache, checks the checksum, and reads them from
// there. The submitter serves only the files its job lists, by checksum: no path crosses the
// wire as a request.
//
// FileFetcher is the fetching side without I/O: which pieces to ask for, a window of them in
// flight, asking again for what is overdue, and what to write where. The trainer writes, checks
// and renames (actors/roles/trainer/files.cpp).

#include <cstdint>
#include <expected>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "elastic/config.hpp"
#include "gossip/wire/messages.hpp"

namespace tepdist::elastic {

/// FNV-1a (64-bit) over bytes, continuing from `hash` (start: the offset basis).
constexpr uint64_t fnv1a_basis = 0xcbf29ce484222325ull;
uint64_t fnv1a(const uint8_t* data, size_t size, uint64_t hash = fnv1a_basis);

/// The file at `path` as a job record lists it (size and checksum of its bytes), or why not.
std::expected<gossip::JobFile, std::string> describe_file(const std::string& path);

/// The files `config` makes a worker read: data.train_file and data.test_file (dataset "files"),
/// model.init_file, each described; an error names the key and the file.
std::expected<std::vector<gossip::JobFile>, std::string> describe_job_files(const JobConfig& config);

/// Replaces, in `config`, every path of `files` with where this node has the bytes (`local`, same
/// order; an empty entry leaves the path as it is).
void use_local_files(JobConfig& config, const std::vector<gossip::JobFile>& files, const std::vector<std::string>& local);

/// Where this node keeps a fetched file: DIR/CHECKSUM (16 hex digits).
std::string cached_name(const std::string& dir, const gossip::JobFile& f);

class FileFetcher {
 public:
  struct Options {
    size_t piece_bytes = gossip::FilePiece::max_bytes;
    size_t window = 8;          ///< pieces in flight, over all files
    double retry_ms = 3000;     ///< a piece not answered by then is asked for again
    double give_up_ms = 120000; ///< no new piece for this long: the fetch fails
    uint64_t max_file_bytes = uint64_t{64} << 30;  ///< a record asking for more is refused
  };
  /// What to write: `data` at `offset` of files[file] (data points into the FilePiece on_piece was
  /// given: valid as long as it is).
  struct Write {
    size_t file;
    uint64_t offset;
    const std::vector<uint8_t>* data;
  };

  /// Fetches `files` (the ones this node lacks, each checksum once) of job `job_id`. An error: a
  /// file too large, or one listed twice.
  static std::expected<FileFetcher, std::string> make(uint64_t job_id, std::vector<gossip::JobFile> files, Options o);

  /// The first requests (and, after each piece, the next ones: on_piece appends them).
  void start(double now, std::vector<gossip::FileFetch>& out);
  /// A piece from the submitter: what to write, nothing (a repeat, or not asked for), or the
  /// fetch's failure (the submitter refused, naming why; a piece of the wrong size).
  std::expected<std::optional<Write>, std::string> on_piece(double now, const gossip::FilePiece& p,
                                                            std::vector<gossip::FileFetch>& out);
  /// Asks again for the pieces overdue; an error when nothing came for give_up_ms.
  std::expected<void, std::string> on_tick(double now, std::vector<gossip::FileFetch>& out);

  const std::vector<gossip::JobFile>& files() const { return files_; }
  /// Every piece of files[i] has come.
  bool complete(size_t i) const { return received_[i] == files_[i].size; }
  bool done() const;

 private:
  FileFetcher(uint64_t job_id, std::vector<gossip::JobFile> files, Options o);
  void fill(double now, std::vector<gossip::FileFetch>& out);
  uint64_t piece_length(size_t file, uint64_t offset) const;

  uint64_t job_id_;
  std::vector<gossip::JobFile> files_;
  Options o_;
  struct InFlight {
    size_t file;
    uint64_t offset;
    double asked_at;
  };
  std::vector<InFlight> in_flight_;
  std::vector<uint64_t> next_;      // per file: the next offset not asked for yet
  std::vector<uint64_t> received_;  // per file: bytes received
  std::vector<std::set<uint64_t>> got_;
  double last_progress_ = 0;
};

}  // namespace tepdist::elastic

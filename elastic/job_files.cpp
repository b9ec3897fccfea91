#include "elastic/job_files.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

namespace tepdist::elastic {

uint64_t fnv1a(const uint8_t* data, size_t size, uint64_t hash) {
  for (size_t i = 0; i < size; ++i) {
    hash ^= data[i];
    hash *= 0x100000001b3ull;
  }
  return hash;
}

std::expected<gossip::JobFile, std::string> describe_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::unexpected(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
  gossip::JobFile f{path, 0, fnv1a_basis};
  std::vector<char> buffer(1u << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto n = static_cast<size_t>(in.gcount());
    f.checksum = fnv1a(reinterpret_cast<const uint8_t*>(buffer.data()), n, f.checksum);
    f.size += n;
  }
  if (in.bad()) return std::unexpected(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
  return f;
}

namespace {

/// The config's file paths, each with its key.
std::vector<std::pair<const char*, std::string*>> file_keys(JobConfig& c) {
  std::vector<std::pair<const char*, std::string*>> out;
  if (c.data.dataset == "files") {
    out.emplace_back("data.train_file", &c.data.train_file);
    out.emplace_back("data.test_file", &c.data.test_file);
  }
  out.emplace_back("model.init_file", &c.model.init_file);
  std::erase_if(out, [](const auto& k) { return k.second->empty(); });
  return out;
}

}  // namespace

std::expected<std::vector<gossip::JobFile>, std::string> describe_job_files(const JobConfig& config) {
  std::vector<gossip::JobFile> out;
  auto c = config;
  for (const auto& [key, path] : file_keys(c)) {
    auto f = describe_file(*path);
    if (!f) return std::unexpected(fmt::format("{}: {}", key, f.error()));
    out.push_back(std::move(*f));
  }
  return out;
}

void use_local_files(JobConfig& config, const std::vector<gossip::JobFile>& files, const std::vector<std::string>& local) {
  for (const auto& [key, path] : file_keys(config))
    for (size_t i = 0; i < files.size() && i < local.size(); ++i)
      if (files[i].path == *path && !local[i].empty()) {
        *path = local[i];
        break;
      }
}

std::string cached_name(const std::string& dir, const gossip::JobFile& f) {
  return fmt::format("{}/{:016x}", dir, f.checksum);
}

std::expected<FileFetcher, std::string> FileFetcher::make(uint64_t job_id, std::vector<gossip::JobFile> files, Options o) {
  for (size_t i = 0; i < files.size(); ++i)
    for (size_t k = 0; k < i; ++k)
      if (files[i].checksum == files[k].checksum)
        return std::unexpected(fmt::format("{} and {} are listed as the same bytes: fetch them once", files[k].path,
                                           files[i].path));
  for (const auto& f : files)
    if (f.size > o.max_file_bytes)
      return std::unexpected(fmt::format("{} is {} bytes; this node fetches files of at most {}", f.path, f.size,
                                         o.max_file_bytes));
  o.piece_bytes = std::clamp<size_t>(o.piece_bytes, 1, gossip::FilePiece::max_bytes);
  o.window = std::max<size_t>(1, o.window);
  return FileFetcher(job_id, std::move(files), o);
}

FileFetcher::FileFetcher(uint64_t job_id, std::vector<gossip::JobFile> files, Options o)
    : job_id_(job_id), files_(std::move(files)), o_(o), next_(files_.size(), 0), received_(files_.size(), 0),
      got_(files_.size()) {}

bool FileFetcher::done() const {
  for (size_t i = 0; i < files_.size(); ++i)
    if (!complete(i)) return false;
  return true;
}

uint64_t FileFetcher::piece_length(size_t file, uint64_t offset) const {
  return std::min<uint64_t>(o_.piece_bytes, files_[file].size - offset);
}

void FileFetcher::fill(double now, std::vector<gossip::FileFetch>& out) {
  for (size_t i = 0; i < files_.size() && in_flight_.size() < o_.window; ++i)
    while (next_[i] < files_[i].size && in_flight_.size() < o_.window) {
      const uint64_t length = piece_length(i, next_[i]);
      in_flight_.push_back({i, next_[i], now});
      out.push_back({job_id_, files_[i].checksum, next_[i], length});
      next_[i] += length;
    }
}

void FileFetcher::start(double now, std::vector<gossip::FileFetch>& out) {
  last_progress_ = now;
  fill(now, out);
}

std::expected<std::optional<FileFetcher::Write>, std::string> FileFetcher::on_piece(double now, const gossip::FilePiece& p,
                                                                                    std::vector<gossip::FileFetch>& out) {
  if (p.job_id != job_id_) return std::nullopt;
  const auto file = std::ranges::find(files_, p.checksum, &gossip::JobFile::checksum);
  if (file == files_.end()) return std::nullopt;
  const auto i = static_cast<size_t>(file - files_.begin());
  const auto asked = std::ranges::find_if(in_flight_, [&](const InFlight& f) { return f.file == i && f.offset == p.offset; });
  if (asked == in_flight_.end() || got_[i].contains(p.offset)) return std::nullopt;  // a repeat, or never asked
  if (!p.refused.empty()) return std::unexpected(fmt::format("the submitter does not serve {}: {}", file->path, p.refused));
  if (p.data.size() != piece_length(i, p.offset))
    return std::unexpected(fmt::format("a piece of {} at {} holds {} bytes; {} were asked for", file->path, p.offset,
                                       p.data.size(), piece_length(i, p.offset)));
  in_flight_.erase(asked);
  got_[i].insert(p.offset);
  received_[i] += p.data.size();
  last_progress_ = now;
  fill(now, out);
  return Write{i, p.offset, &p.data};
}

std::expected<void, std::string> FileFetcher::on_tick(double now, std::vector<gossip::FileFetch>& out) {
  if (done()) return {};
  if (now - last_progress_ >= o_.give_up_ms)
    return std::unexpected(fmt::format("no piece of the job's files came from its submitter for {:.0f} s",
                                       o_.give_up_ms / 1000));
  for (auto& f : in_flight_)
    if (now - f.asked_at >= o_.retry_ms) {
      f.asked_at = now;
      out.push_back({job_id_, files_[f.file].checksum, f.offset, piece_length(f.file, f.offset)});
    }
  return {};
}

}  // namespace tepdist::elastic

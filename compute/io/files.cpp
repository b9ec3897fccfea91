#include "compute/io/files.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

namespace tepdist::compute {
namespace {

std::unexpected<Error> io_error(const std::filesystem::path& path, std::string_view what) {
  return fail(Errc::io, fmt::format("{}: {}: {}", path.string(), what, std::strerror(errno)));
}

/// Closes a descriptor when it goes out of scope.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

Result<void> write_file_atomically(const std::filesystem::path& path, std::string_view contents, unsigned mode) {
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";
  static std::atomic<uint64_t> serial{0};
  const std::filesystem::path tmp = fmt::format("{}.tmp.{}.{}", path.string(), ::getpid(), serial++);
  {
    Fd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode & 0777)};
    if (f.fd < 0) return io_error(tmp, "cannot create");
    // The umask may have taken bits away; the mode asked for is the mode the file gets.
    if (::fchmod(f.fd, static_cast<mode_t>(mode & 0777)) != 0) {
      auto err = io_error(tmp, "cannot set the file's mode");
      ::unlink(tmp.c_str());
      return err;
    }
    const char* p = contents.data();
    size_t left = contents.size();
    while (left > 0) {
      const ssize_t n = ::write(f.fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        auto err = io_error(tmp, "cannot write");
        ::unlink(tmp.c_str());
        return err;
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
    if (::fsync(f.fd) != 0) {
      auto err = io_error(tmp, "cannot fsync");
      ::unlink(tmp.c_str());
      return err;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    auto err = io_error(path, "cannot rename the temporary into place");
    ::unlink(tmp.c_str());
    return err;
  }
  // The rename is durable only once the directory entry is.
  Fd d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd >= 0) ::fsync(d.fd);
  return {};
}

Result<std::string> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error(path, "cannot open");
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return io_error(path, "cannot read");
  return data;
}

}  // namespace tepdist::compute

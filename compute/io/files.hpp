#pragma once
// Whole-file reads and crash-safe writes.

#include <filesystem>
#include <string>
#include <string_view>

#include "compute/error.hpp"

namespace tepdist::compute {

/// Writes contents to path so that a crash at any point leaves either the old file or the new one,
/// never a mix: write a temporary beside it, fsync, rename over path, fsync the directory. The file
/// has exactly `mode` (0600 for secrets), whatever was at path before: the temporary is created
/// afresh (O_EXCL, O_NOFOLLOW: never through a link planted at its name) and the rename replaces
/// path itself, a link included, not what a link points to.
Result<void> write_file_atomically(const std::filesystem::path& path, std::string_view contents,
                                   unsigned mode = 0644);

/// The whole file; errors name it.
Result<std::string> read_file(const std::filesystem::path& path);

}  // namespace tepdist::compute

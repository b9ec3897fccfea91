#pragma once
// A data set as one file, so that any data a program holds in memory can reach node processes
// as it is (bytes or floats, any sample shape), not rewritten as images. The layout is
// safetensors (a well-known container: 8-byte little-endian header length, a JSON header, the
// raw little-endian data):
//   "x": the samples, dtype U8 or F32, shape [n, ...sample]
//   "y": the labels, dtype I32, shape [n]
//   "__metadata__": {"format": "tepdist-dataset", "classes": "10", "crc32": "<of the data bytes>"}
// The CRC-32 makes a torn or corrupted file an error rather than other data.

#include <filesystem>

#include "compute/data/dataset.hpp"
#include "compute/error.hpp"

namespace tepdist::compute {

/// Writes `data` (checked first: Dataset::check) to path, crash-safely.
Result<void> save_dataset(const std::filesystem::path& path, const Dataset& data);

/// Reads a file save_dataset wrote; errors name the file and what is wrong with it.
Result<Dataset> load_dataset(const std::filesystem::path& path);

}  // namespace tepdist::compute

#include "compute/data/dataset_file.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <bit>
#include <charconv>
#include <cstring>
#include <limits>

#include "compute/io/files.hpp"

namespace tepdist::compute {
namespace {

using nlohmann::json;
static_assert(std::endian::native == std::endian::little, "the file's data is little-endian, as is this machine's");

constexpr uint64_t max_header_bytes = 1 << 20;
constexpr const char* format_name = "tepdist-dataset";

uint32_t crc_of(std::string_view bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (size_t at = 0; at < bytes.size();) {  // zlib takes at most 4 GiB - 1 a call
    const auto n = static_cast<uInt>(std::min<size_t>(bytes.size() - at, std::numeric_limits<uInt>::max()));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + at), n);
    at += n;
  }
  return static_cast<uint32_t>(crc);
}

std::unexpected<Error> bad(const std::filesystem::path& path, const std::string& why) {
  return fail(Errc::corrupt, fmt::format("{}: not a tepdist data set file: {}", path.string(), why));
}

}  // namespace

Result<void> save_dataset(const std::filesystem::path& path, const Dataset& data) {
  if (auto ok = data.check(); !ok) return std::unexpected(ok.error());
  const std::string_view samples =
      data.floats() ? std::string_view(reinterpret_cast<const char*>(data.features.data()), data.sample_bytes())
                    : std::string_view(reinterpret_cast<const char*>(data.pixels.data()), data.sample_bytes());
  const std::string_view labels(reinterpret_cast<const char*>(data.labels.data()), data.labels.size() * sizeof(int32_t));
  json shape = json::array({data.size()});
  for (int64_t d = 0; d < data.sample.rank(); ++d) shape.push_back(data.sample[d]);
  const uint64_t x_end = samples.size(), y_end = x_end + labels.size();
  std::string body;
  body.reserve(y_end);
  body.append(samples).append(labels);
  json header = {{"__metadata__",
                  {{"format", format_name}, {"classes", std::to_string(data.classes)}, {"crc32", std::to_string(crc_of(body))}}},
                 {"x", {{"dtype", data.floats() ? "F32" : "U8"}, {"shape", shape}, {"data_offsets", {0, x_end}}}},
                 {"y", {{"dtype", "I32"}, {"shape", {data.size()}}, {"data_offsets", {x_end, y_end}}}}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the format allows padding; it aligns the data
  std::string out(8, '\0');
  const uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  out += text;
  out += body;
  return write_file_atomically(path, out);
}

Result<Dataset> load_dataset(const std::filesystem::path& path) {
  auto file = read_file(path);
  if (!file) return std::unexpected(file.error());
  const std::string_view in = *file;
  if (in.size() < 8) return bad(path, "too short for a header");
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, in.data(), 8);
  if (header_bytes > max_header_bytes || 8 + header_bytes > in.size()) return bad(path, "header length out of range");
  const std::string_view body = in.substr(8 + header_bytes);
  Dataset d;
  try {
    const json header = json::parse(in.substr(8, header_bytes));
    const json& meta = header.at("__metadata__");
    if (meta.value("format", "") != format_name) return bad(path, "its metadata does not say format tepdist-dataset");
    if (std::to_string(crc_of(body)) != meta.at("crc32").get<std::string>())
      return fail(Errc::corrupt, fmt::format("{}: the data fails its CRC-32 (a torn or corrupted file)", path.string()));
    const std::string classes = meta.at("classes").get<std::string>();
    if (std::from_chars(classes.data(), classes.data() + classes.size(), d.classes).ec != std::errc() ||
        d.classes < 1 || d.classes > (int64_t{1} << 31))
      return bad(path, fmt::format("its metadata's classes \"{}\" is not a count of classes", classes));
    const json& x = header.at("x");
    const json& y = header.at("y");
    const std::string dtype = x.at("dtype").get<std::string>();
    if (dtype != "U8" && dtype != "F32") return bad(path, fmt::format("x has dtype {}; U8 or F32 are read", dtype));
    if (y.at("dtype") != "I32") return bad(path, "y is not I32");
    const auto dims = x.at("shape").get<std::vector<int64_t>>();
    const auto n = y.at("shape").at(0).get<int64_t>();
    if (dims.size() < 2 || dims[0] != n || n < 0) return bad(path, "x is not [n, ...sample] for y's n labels");
    if (dims.size() > Shape::max_rank)
      return bad(path, fmt::format("x has rank {}; samples of rank {} at most are read", dims.size(), Shape::max_rank - 1));
    // Sizes checked against the data before anything is allocated or indexed: no product wraps.
    const uint64_t width = dtype == "F32" ? sizeof(float) : 1;
    uint64_t per = 1, count = 0, bytes = 0;
    for (size_t k = 1; k < dims.size(); ++k)
      if (dims[k] <= 0 || __builtin_mul_overflow(per, static_cast<uint64_t>(dims[k]), &per))
        return bad(path, "x has a sample dimension that is not positive, or samples too large to hold");
    if (per > body.size() || __builtin_mul_overflow(static_cast<uint64_t>(n), per, &count) ||
        __builtin_mul_overflow(count, width, &bytes) || bytes > body.size())
      return bad(path, "its shapes hold more data than the file");
    d.sample = Shape(std::span(dims).subspan(1));
    auto slice = [&](const json& t, uint64_t size) -> std::optional<std::string_view> {
      const auto begin = t.at("data_offsets").at(0).get<uint64_t>(), end = t.at("data_offsets").at(1).get<uint64_t>();
      if (begin > end || end > body.size() || end - begin != size) return std::nullopt;
      return body.substr(begin, end - begin);
    };
    d.kind = dtype == "F32" ? Dataset::Kind::floats : Dataset::Kind::bytes;
    const auto xs = slice(x, bytes);
    const auto ys = slice(y, static_cast<uint64_t>(n) * sizeof(int32_t));  // n <= bytes <= the file's size
    if (!xs || !ys) return bad(path, "data offsets outside the file or of the wrong size");
    if (d.floats()) {
      d.features.resize(count);
      std::memcpy(d.features.data(), xs->data(), xs->size());
    } else {
      d.pixels.assign(xs->begin(), xs->end());
    }
    d.labels.resize(static_cast<size_t>(n));
    std::memcpy(d.labels.data(), ys->data(), ys->size());
  } catch (const json::exception& e) {
    return bad(path, fmt::format("malformed header: {}", e.what()));
  }
  if (auto ok = d.check(); !ok) return fail(Errc::corrupt, fmt::format("{}: {}", path.string(), ok.error().message));
  return d;
}

}  // namespace tepdist::compute

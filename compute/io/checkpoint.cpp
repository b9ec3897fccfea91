#include "compute/io/checkpoint.hpp"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <tuple>
#include <vector>
#include <nlohmann/json.hpp>

#include "compute/io/files.hpp"

namespace tepdist::compute {
namespace {

using nlohmann::json;

constexpr std::string_view checkpoint_magic = "TEPDCKPT";
constexpr uint32_t checkpoint_version = 1;
constexpr uint64_t max_header_bytes = 64u << 20;  // far above any real header; bounds a hostile one

template <class T>
void put(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  out.append(bytes, sizeof(T));
}

template <class T>
T get(std::string_view in, size_t at) {
  T value;
  std::memcpy(&value, in.data() + at, sizeof(T));
  return value;
}

uint32_t crc32_of(std::string_view bytes) {
  return static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
}

json shape_json(const Shape& s) { return s.dims(); }

json parameters_json(const Model& model) {
  json params = json::array();
  for (const auto& p : model.named_parameters())
    params.push_back({{"name", p.name}, {"shape", shape_json(p.shape)}, {"offset", p.offset}});
  return params;
}

void append_floats(std::string& out, std::span<const float> v) {
  out.append(reinterpret_cast<const char*>(v.data()), v.size_bytes());
}

std::unexpected<Error> corrupt(const std::filesystem::path& path, std::string_view what) {
  return fail(Errc::corrupt, fmt::format("{}: {}", path.string(), what));
}

json job_json(const TrainingState::Job& j) {
  json out = {{"job_id", j.job_id},     {"generation", j.generation}, {"mode", j.mode},
              {"position", j.position}, {"samples", j.samples},       {"reference_batch", j.reference_batch}};
  if (!j.remaining.empty()) out["remaining"] = j.remaining;
  if (j.lr_factor != 1) out["lr_factor"] = j.lr_factor;
  return out;
}

/// The training fields of a header (throws json::exception on a missing or mistyped one).
TrainingState state_of(const json& header) {
  TrainingState state;
  state.step = header.at("step").get<int64_t>();
  state.epoch = header.at("epoch").get<int64_t>();
  state.seed = header.at("seed").get<uint64_t>();
  if (header.contains("job")) {
    const json& j = header.at("job");
    state.job = TrainingState::Job{j.at("job_id").get<uint64_t>(),   j.at("generation").get<uint64_t>(),
                                   j.at("mode").get<std::string>(),  j.at("position").get<uint64_t>(),
                                   j.at("samples").get<uint64_t>(),  j.at("reference_batch").get<uint64_t>()};
    if (j.contains("remaining")) state.job->remaining = j.at("remaining").get<std::vector<uint64_t>>();
    if (state.job->remaining.size() % 3 != 0) throw json::other_error::create(501, "job.remaining is not triples", &j);
    if (j.contains("lr_factor")) {
      state.job->lr_factor = j.at("lr_factor").get<double>();
      if (!(state.job->lr_factor > 0 && state.job->lr_factor <= 1))
        throw json::other_error::create(501, "job.lr_factor is not in (0, 1]", &j);
    }
  }
  return state;
}

/// A checkpoint file read whole and checked (magic, CRC, version, header bounds): its header and
/// where the data begins.
/// Whether the float whose bytes start at `at` (not necessarily aligned) is finite.
bool finite_at(const char* at) {
  uint32_t bits;
  std::memcpy(&bits, at, sizeof bits);
  return (bits & 0x7f800000u) != 0x7f800000u;  // an exponent of all ones: an infinity or a NaN
}

/// The first value of `values` (buffer `buffer` of `model`'s state: the parameters, or an
/// optimiser buffer laid out as they are) that is not finite, named; nothing if all are.
std::optional<std::string> non_finite(const Model& model, std::string_view buffer, std::span<const float> values) {
  const auto bad = std::find_if(values.begin(), values.end(), [](float v) { return !std::isfinite(v); });
  if (bad == values.end()) return std::nullopt;
  const auto at = static_cast<int64_t>(bad - values.begin());
  for (const auto& p : model.named_parameters())
    if (at >= p.offset && at < p.offset + p.shape.elements())
      return fmt::format("{} of {}, element {}, is {}", buffer, p.name, at - p.offset, *bad);
  return fmt::format("{} element {} is {}", buffer, at, *bad);
}

struct Opened {
  std::string file;
  json header;
  size_t data_at = 0;
};

Result<Opened> open_checkpoint(const std::filesystem::path& path) {
  auto file = read_file(path);
  if (!file) return std::unexpected(file.error());
  Opened o{std::move(*file), {}, 0};
  const std::string_view in = o.file;
  const size_t prefix = checkpoint_magic.size() + sizeof(uint32_t) + sizeof(uint64_t);
  if (in.size() < prefix + sizeof(uint32_t) || in.substr(0, checkpoint_magic.size()) != checkpoint_magic)
    return corrupt(path, "not a tepdist checkpoint");
  if (crc32_of(in.substr(0, in.size() - 4)) != get<uint32_t>(in, in.size() - 4))
    return corrupt(path, "checksum mismatch (the file is damaged or was cut short)");
  if (const auto v = get<uint32_t>(in, checkpoint_magic.size()); v != checkpoint_version)
    return corrupt(path, fmt::format("checkpoint version {} (this build reads {})", v, checkpoint_version));
  const auto header_bytes = get<uint64_t>(in, checkpoint_magic.size() + sizeof(uint32_t));
  if (header_bytes > max_header_bytes || prefix + header_bytes > in.size() - 4)
    return corrupt(path, "header length out of range");
  try {
    o.header = json::parse(in.substr(prefix, header_bytes));
  } catch (const json::exception& e) {
    return corrupt(path, fmt::format("malformed header: {}", e.what()));
  }
  o.data_at = prefix + header_bytes;
  // A state that is not finite is a diverged one: never resumed (save_checkpoint does not write
  // one; an older build's file is passed over for the one before it).
  const size_t data_end = in.size() - 4;
  for (size_t at = o.data_at; at + sizeof(float) <= data_end; at += sizeof(float))
    if (!finite_at(in.data() + at))
      return fail(Errc::diverged, fmt::format("{}: holds a value that is not finite (value {} of its data): a diverged "
                                              "state, not resumed",
                                              path.string(), (at - o.data_at) / sizeof(float)));
  return o;
}

/// Writes a .safetensors file of `tensors` (name, shape, values), in the order given.
Result<void> write_safetensors(const std::filesystem::path& path,
                               const std::vector<std::tuple<std::string, json, std::span<const float>>>& tensors) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}, {"producer", "tepdist"}};
  uint64_t offset = 0;
  for (const auto& [name, shape, values] : tensors) {
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {offset, offset + values.size_bytes()}}};
    offset += values.size_bytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the format allows padding; it aligns the data
  std::string out;
  out.reserve(8 + text.size() + offset);
  put<uint64_t>(out, text.size());
  out += text;
  for (const auto& t : tensors) append_floats(out, std::get<2>(t));
  return write_file_atomically(path, out);
}

}  // namespace

Result<void> save_checkpoint(const std::filesystem::path& path, Model& model, Optimizer& optimizer,
                             const TrainingState& state) {
  json buffers = json::array({"parameters"});
  auto opt_state = optimizer.state();
  // A diverged state is not a checkpoint: the last one written stays the one to resume from.
  auto bad = non_finite(model, "parameter", model.parameters());
  for (size_t i = 0; i < opt_state.size() && !bad; ++i)
    bad = non_finite(model, "optimizer " + opt_state[i].first, opt_state[i].second);
  if (bad)
    return fail(Errc::diverged, fmt::format("{}: not written: {} (a diverged state is not saved)", path.string(), *bad));
  for (const auto& [name, buf] : opt_state) buffers.push_back("optimizer." + name);
  json header = {
      {"step", state.step},
      {"epoch", state.epoch},
      {"seed", state.seed},
      {"model_rng", model.rng().state()},
      {"optimizer", {{"name", optimizer.name()}, {"steps", optimizer.steps()}}},
      {"parameters", parameters_json(model)},
      {"parameter_count", model.parameters().size()},
      {"buffers", buffers},
  };
  if (state.job) header["job"] = job_json(*state.job);
  const std::string header_text = header.dump();
  std::string out;
  out.reserve(header_text.size() + (1 + opt_state.size()) * model.parameters().size_bytes() + 64);
  out.append(checkpoint_magic);
  put<uint32_t>(out, checkpoint_version);
  put<uint64_t>(out, header_text.size());
  out += header_text;
  append_floats(out, model.parameters());
  for (const auto& [name, buf] : opt_state) append_floats(out, buf);
  put<uint32_t>(out, crc32_of(out));
  return write_file_atomically(path, out);
}

Result<TrainingState> load_checkpoint(const std::filesystem::path& path, Model& model, Optimizer& optimizer) {
  auto opened = open_checkpoint(path);
  if (!opened) return std::unexpected(opened.error());
  const std::string_view in = opened->file;
  const json& header = opened->header;
  TrainingState state;
  Rng::State model_rng;
  int64_t optimizer_steps = 0;
  try {
    state = state_of(header);
    model_rng = header.at("model_rng").get<Rng::State>();
    optimizer_steps = header.at("optimizer").at("steps").get<int64_t>();
    if (header.at("parameters") != parameters_json(model))
      return fail(Errc::mismatch, fmt::format("{}: was saved from a different model (parameter names or shapes differ)",
                                              path.string()));
    const auto opt_name = header.at("optimizer").at("name").get<std::string>();
    if (opt_name != optimizer.name())
      return fail(Errc::mismatch,
                  fmt::format("{}: holds {} optimizer state but the job uses {}", path.string(), opt_name, optimizer.name()));
  } catch (const json::exception& e) {
    return corrupt(path, fmt::format("malformed header: {}", e.what()));
  }

  auto opt_state = optimizer.state();
  const size_t floats = model.parameters().size();
  const size_t data_bytes = (1 + opt_state.size()) * floats * sizeof(float);
  if (opened->data_at + data_bytes + 4 != in.size()) return corrupt(path, "data size does not match the header");
  const char* data = in.data() + opened->data_at;
  std::memcpy(model.parameters().data(), data, floats * sizeof(float));
  for (size_t i = 0; i < opt_state.size(); ++i)
    std::memcpy(opt_state[i].second.data(), data + (1 + i) * floats * sizeof(float), floats * sizeof(float));
  optimizer.set_steps(optimizer_steps);
  model.rng().set_state(model_rng);
  return state;
}

Result<void> export_safetensors(const std::filesystem::path& path, const Model& model) {
  std::vector<std::tuple<std::string, json, std::span<const float>>> tensors;
  for (const auto& p : model.named_parameters())
    tensors.emplace_back(p.name, shape_json(p.shape),
                         model.parameters().subspan(static_cast<size_t>(p.offset), static_cast<size_t>(p.shape.elements())));
  return write_safetensors(path, tensors);
}

Result<CheckpointSummary> check_checkpoint(const std::filesystem::path& path) {
  auto opened = open_checkpoint(path);
  if (!opened) return std::unexpected(opened.error());
  CheckpointSummary summary;
  summary.bytes = opened->file.size();
  summary.crc = get<uint32_t>(opened->file, opened->file.size() - 4);
  try {
    summary.state = state_of(opened->header);
  } catch (const json::exception& e) {
    return corrupt(path, fmt::format("malformed header: {}", e.what()));
  }
  return summary;
}

Result<void> export_checkpoint_safetensors(const std::filesystem::path& checkpoint, const std::filesystem::path& out) {
  auto opened = open_checkpoint(checkpoint);
  if (!opened) return std::unexpected(opened.error());
  const std::string_view in = opened->file;
  std::vector<std::tuple<std::string, json, std::span<const float>>> tensors;
  std::vector<float> parameters;  // copied out: the data need not be aligned for floats in the file
  try {
    const auto count = opened->header.at("parameter_count").get<uint64_t>();
    if (count > (in.size() - opened->data_at) / sizeof(float))
      return corrupt(checkpoint, "the parameters run past the end of the file");
    parameters.resize(count);
    std::memcpy(parameters.data(), in.data() + opened->data_at, count * sizeof(float));
    const float* values = parameters.data();
    std::set<std::string> names;
    for (const auto& p : opened->header.at("parameters")) {
      const auto name = p.at("name").get<std::string>();
      if (name == "__metadata__" || !names.insert(name).second)
        return corrupt(checkpoint, fmt::format("parameter name '{}' is reserved or repeated", name));
      // Every dimension a non-negative integer, and the product bounded before it can wrap.
      uint64_t elements = 1;
      for (const auto& d : p.at("shape")) {
        if (!d.is_number_unsigned()) return corrupt(checkpoint, fmt::format("parameter '{}' has a bad shape", name));
        const auto extent = d.get<uint64_t>();
        if (extent != 0 && elements > count / extent)
          return corrupt(checkpoint, fmt::format("parameter '{}' is larger than the parameters", name));
        elements *= extent;
      }
      const auto offset = p.at("offset").get<uint64_t>();
      if (offset > count || elements > count - offset)
        return corrupt(checkpoint, fmt::format("parameter '{}' lies outside the parameters", name));
      tensors.emplace_back(name, p.at("shape"), std::span<const float>(values + offset, elements));
    }
  } catch (const json::exception& e) {
    return corrupt(checkpoint, fmt::format("malformed header: {}", e.what()));
  }
  return write_safetensors(out, tensors);
}

Result<void> import_safetensors(const std::filesystem::path& path, Model& model) {
  auto file = read_file(path);
  if (!file) return std::unexpected(file.error());
  const std::string_view in = *file;
  if (in.size() < 8) return corrupt(path, "too short for a safetensors header");
  const auto header_bytes = get<uint64_t>(in, 0);
  if (header_bytes > max_header_bytes || 8 + header_bytes > in.size()) return corrupt(path, "header length out of range");
  const std::string_view data = in.substr(8 + header_bytes);
  std::vector<std::pair<const NamedParameter*, std::string_view>> found;
  try {
    const json header = json::parse(in.substr(8, header_bytes));
    for (const auto& p : model.named_parameters()) {
      if (!header.contains(p.name)) return fail(Errc::mismatch, fmt::format("{}: has no tensor '{}'", path.string(), p.name));
      const json& t = header.at(p.name);
      if (t.at("dtype") != "F32")
        return fail(Errc::mismatch, fmt::format("{}: '{}' is {}, not F32", path.string(), p.name, t.at("dtype").dump()));
      if (t.at("shape") != shape_json(p.shape))
        return fail(Errc::mismatch, fmt::format("{}: '{}' has shape {}, the model needs {}", path.string(), p.name,
                                                t.at("shape").dump(), p.shape.to_string()));
      const auto begin = t.at("data_offsets").at(0).get<uint64_t>(), end = t.at("data_offsets").at(1).get<uint64_t>();
      if (begin > end || end > data.size() || end - begin != static_cast<uint64_t>(p.shape.elements()) * sizeof(float))
        return corrupt(path, fmt::format("'{}' has data offsets outside the file or of the wrong size", p.name));
      found.emplace_back(&p, data.substr(begin, end - begin));
    }
  } catch (const json::exception& e) {
    return corrupt(path, fmt::format("malformed header: {}", e.what()));
  }
  for (const auto& [p, bytes] : found) std::memcpy(model.parameters().data() + p->offset, bytes.data(), bytes.size());
  return {};
}

}  // namespace tepdist::compute

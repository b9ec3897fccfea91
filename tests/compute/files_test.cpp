#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/support/temp_dir.hpp"
#include "compute/io/checkpoint.hpp"
#include "compute/io/files.hpp"
#include "compute/presets.hpp"
#include "compute/ref/ref_backend.hpp"
#include "compute/train.hpp"

using namespace tepdist::compute;
namespace fs = std::filesystem;
using tepdist::test::TempDir;

namespace {

std::unique_ptr<Model> built_mlp(uint64_t seed) {
  auto m = make_mlp(16, 10);
  REQUIRE(m->build({1, 28, 28}, seed).has_value());
  return m;
}

std::unique_ptr<Optimizer> sgd(size_t n) { return std::move(*make_optimizer({}, n)); }

/// A few real steps, so parameters, momentum and the step count all hold something.
void train_a_little(Model& m, Optimizer& opt) {
  auto backend = make_ref_backend();
  const Dataset d = make_synthetic(64, 0);
  Tensor x;
  std::vector<int32_t> y;
  LossScratch scratch;
  const auto order = shuffled_indices(d.size(), 0, 0);
  gather_batch(d, order, x, y);
  for (int i = 0; i < 3; ++i) {
    REQUIRE(try_compute_gradients(m, *backend, x, y, scratch).has_value());
    opt.step(m.parameters(), m.gradients(), 0.01f);
  }
}

std::string slurp(const fs::path& p) { return *read_file(p); }

}  // namespace

TEST_CASE("a checkpoint restores parameters, optimiser state, step and random state", "[compute][checkpoint]") {
  TempDir dir;
  auto m = built_mlp(1);
  auto opt = sgd(m->parameters().size());
  train_a_little(*m, *opt);
  m->rng().next();
  const std::vector<float> params(m->parameters().begin(), m->parameters().end());
  const std::vector<float> momentum(opt->state()[0].second.begin(), opt->state()[0].second.end());
  const auto rng = m->rng().state();
  REQUIRE(save_checkpoint(dir.path / "ckpt", *m, *opt, {3, 1, 42, {}}).has_value());

  auto fresh = built_mlp(2);
  auto fresh_opt = sgd(fresh->parameters().size());
  auto state = load_checkpoint(dir.path / "ckpt", *fresh, *fresh_opt);
  REQUIRE(state.has_value());
  CHECK(state->step == 3);
  CHECK(state->epoch == 1);
  CHECK(state->seed == 42);
  CHECK(std::equal(params.begin(), params.end(), fresh->parameters().begin()));
  CHECK(std::equal(momentum.begin(), momentum.end(), fresh_opt->state()[0].second.begin()));
  CHECK(fresh_opt->steps() == 3);
  CHECK(fresh->rng().state() == rng);
}

TEST_CASE("a cluster checkpoint says where its job stood, and exports without a model what the model exports",
          "[compute][checkpoint]") {
  TempDir dir;
  auto m = built_mlp(1);
  auto opt = sgd(m->parameters().size());
  train_a_little(*m, *opt);
  const TrainingState saved{12, 1, 42, TrainingState::Job{99, 3, "sync", 256, 4096, 192}};
  REQUIRE(save_checkpoint(dir.path / "ckpt", *m, *opt, saved).has_value());
  const auto summary = check_checkpoint(dir.path / "ckpt");
  REQUIRE(summary.has_value());
  CHECK(summary->state.step == 12);
  CHECK(summary->state.job == saved.job);
  CHECK(summary->bytes == fs::file_size(dir.path / "ckpt"));
  auto fresh = built_mlp(2);
  auto fresh_opt = sgd(fresh->parameters().size());
  const auto loaded = load_checkpoint(dir.path / "ckpt", *fresh, *fresh_opt);
  REQUIRE(loaded.has_value());
  CHECK(loaded->job == saved.job);
  // Gossip and async: the positions left, whichever workers held them; and a plateau decay in effect.
  const TrainingState async{40, 0, 42, TrainingState::Job{99, 2, "async", 0, 7680, 192, {0, 128, 2048, 0, 4096, 6144, 1, 0, 6144}, 0.25}};
  REQUIRE(save_checkpoint(dir.path / "async", *m, *opt, async).has_value());
  const auto async_loaded = load_checkpoint(dir.path / "async", *fresh, *fresh_opt);
  REQUIRE(async_loaded.has_value());
  CHECK(async_loaded->job == async.job);
  CHECK(async_loaded->job->lr_factor == 0.25);
  CHECK(loaded->job->lr_factor == 1);  // none decayed: absent from the file, 1 when read
  // tepdist train's checkpoints have no job.
  REQUIRE(save_checkpoint(dir.path / "plain", *m, *opt, {3, 1, 42, {}}).has_value());
  CHECK_FALSE(check_checkpoint(dir.path / "plain")->state.job.has_value());

  REQUIRE(export_checkpoint_safetensors(dir.path / "ckpt", dir.path / "from_checkpoint.safetensors").has_value());
  REQUIRE(export_safetensors(dir.path / "from_model.safetensors", *m).has_value());
  CHECK(slurp(dir.path / "from_checkpoint.safetensors") == slurp(dir.path / "from_model.safetensors"));

  // Cut short: refused, naming the file, and nothing written.
  fs::resize_file(dir.path / "ckpt", fs::file_size(dir.path / "ckpt") - 9);
  const auto cut = export_checkpoint_safetensors(dir.path / "ckpt", dir.path / "cut.safetensors");
  REQUIRE_FALSE(cut.has_value());
  CHECK_THAT(cut.error().message, Catch::Contains((dir.path / "ckpt").string()) && Catch::Contains("checksum"));
  CHECK_FALSE(fs::exists(dir.path / "cut.safetensors"));
}

TEST_CASE("a crafted checkpoint header (its CRC made to match) is refused by export and load, never trusted",
          "[compute][checkpoint]") {
  TempDir dir;
  auto m = built_mlp(1);
  auto opt = sgd(m->parameters().size());
  REQUIRE(save_checkpoint(dir.path / "ckpt", *m, *opt, {3, 1, 42, {}}).has_value());
  const std::string file = slurp(dir.path / "ckpt");
  const size_t prefix = 8 + 4 + 8;
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file.data() + 12, 8);
  const auto header = nlohmann::json::parse(file.substr(prefix, header_bytes));
  const std::string data = file.substr(prefix + header_bytes, file.size() - prefix - header_bytes - 4);
  // Writes the file with `h` as its header and a CRC that matches, as an attacker would.
  const auto crafted = [&](const nlohmann::json& h, const std::string& name) {
    const std::string text = h.dump();
    std::string out = file.substr(0, 12);
    const uint64_t n = text.size();
    out.append(reinterpret_cast<const char*>(&n), 8);
    out += text + data;
    const auto crc = static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(out.data()), static_cast<uInt>(out.size())));
    out.append(reinterpret_cast<const char*>(&crc), 4);
    std::ofstream(dir.path / name, std::ios::binary) << out;
    return dir.path / name;
  };
  auto huge = header;
  huge["parameters"][0]["shape"] = {4294967296ull, 4294967296ull};  // wraps to 0 elements if unchecked
  auto negative = header;
  negative["parameters"][0]["shape"] = {-1, -1};
  auto repeated = header;
  repeated["parameters"][1]["name"] = repeated["parameters"][0]["name"];
  auto no_steps = header;
  no_steps["optimizer"].erase("steps");
  for (const auto& [h, name] : {std::pair{huge, "huge"}, {negative, "negative"}, {repeated, "repeated"}}) {
    INFO(name);
    const auto path = crafted(h, name);
    const auto out = dir.path / (std::string(name) + ".safetensors");
    const auto exported = export_checkpoint_safetensors(path, out);
    REQUIRE_FALSE(exported.has_value());
    CHECK_THAT(exported.error().message, Catch::Contains(path.string()));
    CHECK_FALSE(fs::exists(out));
  }
  const auto loaded = load_checkpoint(crafted(no_steps, "no_steps"), *m, *opt);
  REQUIRE_FALSE(loaded.has_value());
  CHECK_THAT(loaded.error().message, Catch::Contains("malformed header"));
}

TEST_CASE("a damaged checkpoint is detected by its checksum and loads nothing", "[compute][checkpoint]") {
  TempDir dir;
  auto m = built_mlp(1);
  auto opt = sgd(m->parameters().size());
  REQUIRE(save_checkpoint(dir.path / "ckpt", *m, *opt, {}).has_value());
  std::string bytes = slurp(dir.path / "ckpt");

  auto target = built_mlp(2);
  auto target_opt = sgd(target->parameters().size());
  const std::vector<float> before(target->parameters().begin(), target->parameters().end());
  SECTION("one flipped bit in the data") { bytes[bytes.size() / 2] ^= 0x10; }
  SECTION("cut short") { bytes.resize(bytes.size() - 100); }
  SECTION("not a checkpoint at all") { bytes = "hello"; }
  std::ofstream(dir.path / "bad", std::ios::binary) << bytes;
  auto r = load_checkpoint(dir.path / "bad", *target, *target_opt);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::corrupt);
  CHECK_THAT(r.error().message, Catch::Contains((dir.path / "bad").string()));
  CHECK(std::equal(before.begin(), before.end(), target->parameters().begin()));
}

TEST_CASE("a checkpoint of another model or optimiser is refused", "[compute][checkpoint]") {
  TempDir dir;
  auto m = built_mlp(1);
  auto opt = sgd(m->parameters().size());
  REQUIRE(save_checkpoint(dir.path / "ckpt", *m, *opt, {}).has_value());
  auto other = make_mlp(32, 10);
  REQUIRE(other->build({1, 28, 28}, 0).has_value());
  auto other_opt = sgd(other->parameters().size());
  auto r = load_checkpoint(dir.path / "ckpt", *other, *other_opt);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::mismatch);

  OptimizerOptions adam;
  adam.name = "adam";
  auto adam_opt = std::move(*make_optimizer(adam, m->parameters().size()));
  auto r2 = load_checkpoint(dir.path / "ckpt", *m, *adam_opt);
  REQUIRE_FALSE(r2.has_value());
  CHECK_THAT(r2.error().message, Catch::Contains("sgd") && Catch::Contains("adam"));
}

TEST_CASE("atomic writes replace the file whole and leave no temporary behind", "[compute][files]") {
  TempDir dir;
  const auto p = dir.path / "f";
  REQUIRE(write_file_atomically(p, "first").has_value());
  REQUIRE(write_file_atomically(p, "second").has_value());
  CHECK(slurp(p) == "second");
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);
  auto r = write_file_atomically(dir.path / "no" / "such" / "dir", "x");
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::io);
}

TEST_CASE("a private file gets exactly its mode, over a looser file or a planted link, never through the link",
          "[compute][files]") {
  TempDir dir;
  const auto group_or_others = fs::perms::group_all | fs::perms::others_all;
  // A file that was there before, readable by everyone: afterwards it is the owner's only.
  const auto loose = dir.path / "secret";
  std::ofstream(loose) << "old";
  fs::permissions(loose, fs::perms::all);
  REQUIRE(write_file_atomically(loose, "new", 0600).has_value());
  CHECK(slurp(loose) == "new");
  CHECK((fs::status(loose).permissions() & group_or_others) == fs::perms::none);
  // A link planted where the file goes: the link is replaced; what it pointed to is untouched.
  const auto target = dir.path / "elsewhere";
  std::ofstream(target) << "someone else's";
  const auto link = dir.path / "cluster.toml";
  fs::create_symlink(target, link);
  REQUIRE(write_file_atomically(link, "private", 0600).has_value());
  CHECK_FALSE(fs::is_symlink(link));
  CHECK(slurp(link) == "private");
  CHECK(slurp(target) == "someone else's");
  CHECK((fs::status(link).permissions() & group_or_others) == fs::perms::none);
  // Even under a umask that would take the owner's bits, the mode asked for is the mode.
  const mode_t old = ::umask(0277);
  const auto r = write_file_atomically(dir.path / "masked", "x", 0600);
  ::umask(old);
  REQUIRE(r.has_value());
  CHECK((fs::status(dir.path / "masked").permissions() & fs::perms::owner_all) ==
        (fs::perms::owner_read | fs::perms::owner_write));
}

TEST_CASE("safetensors export and import round-trip the parameters", "[compute][safetensors]") {
  TempDir dir;
  auto a = built_mlp(1);
  REQUIRE(export_safetensors(dir.path / "m.safetensors", *a).has_value());
  auto b = built_mlp(2);
  REQUIRE(import_safetensors(dir.path / "m.safetensors", *b).has_value());
  CHECK(std::equal(a->parameters().begin(), a->parameters().end(), b->parameters().begin()));

  auto wrong = make_mlp(8, 10);
  REQUIRE(wrong->build({1, 28, 28}, 0).has_value());
  auto r = import_safetensors(dir.path / "m.safetensors", *wrong);
  REQUIRE_FALSE(r.has_value());
  CHECK_THAT(r.error().message, Catch::Contains("fc1.weight") && Catch::Contains("shape"));
}

TEST_CASE("an independent Python reader of the safetensors format reads back every value", "[compute][safetensors]") {
  TempDir dir;
  auto m = built_mlp(3);
  const auto file = dir.path / "m.safetensors";
  REQUIRE(export_safetensors(file, *m).has_value());
  const auto dump = dir.path / "dump.json";
  const std::string command = std::string(TEPDIST_PYTHON) + " " + TEPDIST_SAFETENSORS_READER + " " +
                              file.string() + " > " + dump.string();
  REQUIRE(std::system(command.c_str()) == 0);
  const auto tensors = nlohmann::json::parse(slurp(dump));
  REQUIRE(tensors.size() == m->named_parameters().size());
  for (const auto& p : m->named_parameters()) {
    INFO(p.name);
    REQUIRE(tensors.contains(p.name));
    CHECK(tensors[p.name]["shape"].get<std::vector<int64_t>>() == p.shape.dims());
    const auto values = tensors[p.name]["values"].get<std::vector<double>>();
    REQUIRE(static_cast<int64_t>(values.size()) == p.shape.elements());
    for (size_t i = 0; i < values.size(); ++i)
      REQUIRE(static_cast<float>(values[i]) == m->parameters()[static_cast<size_t>(p.offset) + i]);
  }
}

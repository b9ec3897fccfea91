#include <catch2/catch.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "elastic/config.hpp"

using namespace tepdist::elastic;

namespace {

JobConfig parse_ok(const std::string& text, std::vector<std::string> overrides = {}) {
  auto c = parse_config(text, "job.toml", overrides);
  INFO((c ? std::string() : c.error().message));
  REQUIRE(c.has_value());
  return *c;
}

std::string parse_error(const std::string& text, std::vector<std::string> overrides = {}) {
  auto c = parse_config(text, "job.toml", overrides);
  REQUIRE_FALSE(c.has_value());
  return c.error().message;
}

}  // namespace

TEST_CASE("no file means the documented defaults: LeNet, Fashion-MNIST, SGD 0.01/0.9, batch 64, seed 0",
          "[elastic][config]") {
  auto c = load_config(std::nullopt);
  REQUIRE(c.has_value());
  CHECK(c->model.preset == "lenet");
  CHECK(c->model.layers.empty());
  CHECK(c->data.dataset == "fashion-mnist");
  CHECK(c->optimizer.options.name == "sgd");
  CHECK(c->optimizer.schedule.base_lr == Approx(0.01f));
  CHECK(c->optimizer.options.momentum == Approx(0.9f));
  CHECK(c->data.batch_size == 64);
  CHECK(c->job.seed == 0);
}

TEST_CASE("every key's documented default is the default the code uses", "[elastic][config]") {
  const JobConfig defaults = *load_config(std::nullopt);
  for (const auto& k : schema()) {
    if (k.type == KeyType::layers) continue;  // the empty list means "use the preset"
    if (k.type == KeyType::table) continue;   // [nodes.NAME]: a node without a table has the defaults
    const std::string o = std::string(k.section) + "." + std::string(k.key) + "=" + std::string(k.default_text);
    INFO(o);
    auto c = parse_config("", "defaults", std::vector<std::string>{o});
    REQUIRE(c.has_value());
    CHECK(c->same_settings(defaults));
  }
}

TEST_CASE("configs/train.toml is the built-in default written out", "[elastic][config]") {
  auto file = load_config(std::string(TEPDIST_SOURCE_DIR) + "/configs/train.toml");
  INFO((file ? std::string() : file.error().message));
  REQUIRE(file.has_value());
  CHECK(file->same_settings(*load_config(std::nullopt)));
}

TEST_CASE("docs/config.md holds the schema as the code has it", "[elastic][config]") {
  std::ifstream in(std::string(TEPDIST_SOURCE_DIR) + "/docs/config.md");
  REQUIRE(in);
  std::stringstream doc;
  doc << in.rdbuf();
  // If this fails after a schema change: build config_doc and run it on docs/config.md.
  CHECK_THAT(doc.str(), Catch::Contains("<!-- schema:begin -->\n" + schema_markdown() + "<!-- schema:end -->"));
}

TEST_CASE("values are read into their fields", "[elastic][config]") {
  const auto c = parse_ok(R"(
[job]
epochs = 10
seed = 7
eval_every_steps = 100
[optimizer]
name = "adamw"
lr = 1        # an integer is a fine number
weight_decay = 0.01
schedule = "cosine"
warmup_steps = 50
[data]
batch_size = 128
shuffle = false
[compute]
threads = 2
)");
  CHECK(c.job.epochs == 10);
  CHECK(c.job.seed == 7);
  CHECK(c.job.eval_every_steps == 100);
  CHECK(c.optimizer.options.name == "adamw");
  CHECK(c.optimizer.schedule.base_lr == 1.0f);
  CHECK(c.optimizer.options.weight_decay == Approx(0.01f));
  CHECK(c.optimizer.schedule.kind == "cosine");
  CHECK(c.optimizer.schedule.warmup_steps == 50);
  CHECK(c.data.batch_size == 128);
  CHECK_FALSE(c.data.shuffle);
  CHECK(c.compute.threads == 2);
}

TEST_CASE("an unknown key is named with its file, line and a suggestion", "[elastic][config]") {
  const auto e = parse_error("[job]\nepochs = 2\n\n[optimizer]\nlearning_rate = 0.1\nmomentun = 0.5\n");
  CHECK_THAT(e, Catch::StartsWith("job.toml:5: unknown key optimizer.learning_rate"));
  const auto typo = parse_error("[optimizer]\nmomentun = 0.5\n");
  CHECK_THAT(typo, Catch::Contains("job.toml:2") && Catch::Contains("did you mean 'momentum'"));
}

TEST_CASE("an unknown section is named", "[elastic][config]") {
  CHECK_THAT(parse_error("[jobs]\nepochs = 1\n"), Catch::Contains("unknown section [jobs]") && Catch::Contains("'job'"));
}

TEST_CASE("a value of the wrong type is named with its line", "[elastic][config]") {
  CHECK_THAT(parse_error("[data]\n\nbatch_size = \"64\"\n"),
             Catch::StartsWith("job.toml:3: data.batch_size must be an integer"));
  CHECK_THAT(parse_error("[job]\nepochs = 2.5\n"), Catch::Contains("job.epochs must be an integer"));
  CHECK_THAT(parse_error("[data]\nshuffle = 1\n"), Catch::Contains("data.shuffle must be true or false"));
}

TEST_CASE("out-of-range values and unknown choices are refused with the range", "[elastic][config]") {
  CHECK_THAT(parse_error("[data]\nbatch_size = 0\n"), Catch::Contains("data.batch_size = 0 is out of range [1, 65536]"));
  CHECK_THAT(parse_error("[optimizer]\nlr = 0\n"), Catch::Contains("(0, 10]"));
  CHECK_THAT(parse_error("[optimizer]\nmomentum = 1.0\n"), Catch::Contains("[0, 1)"));
  CHECK_THAT(parse_error("[optimizer]\nname = \"adan\"\n"), Catch::Contains("did you mean 'adam'"));
  CHECK_THAT(parse_error("[job]\nmode = \"gossips\"\n"), Catch::Contains("job.mode"));
}

TEST_CASE("syntax errors name the file", "[elastic][config]") {
  CHECK_THAT(parse_error("[job\nepochs = 1\n"), Catch::StartsWith("job.toml: not valid TOML"));
}

TEST_CASE("overrides given with --set take TOML values or bare words and are validated like the file", "[elastic][config]") {
  const auto c = parse_ok("[optimizer]\nlr = 0.1\n", {"optimizer.lr=0.5", "optimizer.name=adam", "job.epochs=4"});
  CHECK(c.optimizer.schedule.base_lr == 0.5f);
  CHECK(c.optimizer.options.name == "adam");
  CHECK(c.job.epochs == 4);
  CHECK_THAT(parse_error("", {"job.epochs=0"}), Catch::StartsWith("--set job.epochs:1: job.epochs = 0 is out of range"));
  CHECK_THAT(parse_error("", {"epochs=3"}), Catch::Contains("expected section.key=value"));
  CHECK_THAT(parse_error("", {"job.epoch=3"}), Catch::Contains("unknown key job.epoch"));
}

TEST_CASE("a model is described by its layers", "[elastic][config]") {
  const auto c = parse_ok(R"([model]
layers = [
  { type = "conv2d", out_channels = 8, kernel = 3, padding = 1 },
  { type = "relu" },
  { type = "flatten" },
  { type = "linear", out_features = 10, name = "head" },
]
)");
  REQUIRE(c.model.layers.size() == 4);
  CHECK(c.model.layers[0].type == "conv2d");
  CHECK(c.model.layers[3].name == "head");
  auto model = tepdist::compute::make_model(c.model.layers);
  REQUIRE(model.has_value());
  REQUIRE((*model)->build({1, 28, 28}, 0).has_value());
  CHECK((*model)->named_parameters().back().name == "head.bias");
}

TEST_CASE("bad layers are named by position and line", "[elastic][config]") {
  CHECK_THAT(parse_error("[model]\nlayers = [\n  { type = \"relu\" },\n  { type = \"conv2d\", kernel = 3 },\n]\n"),
             Catch::Contains("job.toml:4") && Catch::Contains("model.layers[2]") && Catch::Contains("out_channels"));
  CHECK_THAT(parse_error("[model]\nlayers = [ { kernel = 3 } ]\n"), Catch::Contains("needs a type"));
  CHECK_THAT(parse_error("[model]\nlayers = [ { type = \"linear\", out_features = \"ten\" } ]\n"),
             Catch::Contains("must be a number"));
  CHECK_THAT(parse_error("[model]\npreset = \"mlp\"\nlayers = [ { type = \"relu\" } ]\n"),
             Catch::Contains("either model.preset or model.layers"));
}

TEST_CASE("a missing config file is named", "[elastic][config]") {
  auto c = load_config(std::filesystem::path("/nonexistent/job.toml"));
  REQUIRE_FALSE(c.has_value());
  CHECK_THAT(c.error().message, Catch::Contains("/nonexistent/job.toml"));
}

TEST_CASE("configs/cross_region.toml describes four nodes in three regions", "[elastic][config][network]") {
  auto c = load_config(std::string(TEPDIST_SOURCE_DIR) + "/configs/cross_region.toml");
  INFO((c ? std::string() : c.error().message));
  REQUIRE(c.has_value());
  std::vector<std::string> regions;
  for (int64_t i = 0; i < 5; ++i) regions.push_back(c->node(tepdist::elastic::local_node_name(i)).region);
  CHECK(regions == std::vector<std::string>{"us-east", "us-east", "eu-west", "ap-south", "local"});
  const auto* us_eu = c->network.model.link("eu-west", "us-east");
  REQUIRE(us_eu != nullptr);
  CHECK(us_eu->latency_ms == 40.0);
  CHECK(us_eu->bandwidth_mbit == 100.0);
  CHECK(c->network.model.link("ap-south", "us-east")->latency_ms == 110.0);
  CHECK(c->network.model.link("us-east", "us-east")->bandwidth_mbit == 1000.0);
}

TEST_CASE("network links and partitions are checked field by field", "[elastic][config][network]") {
  const auto ok = parse_ok(
      "[[network.partition]]\nat_s = 5\nduration_s = 2.5\nbetween = [\"a\", \"b\"]\n"
      "[[network.link]]\nbetween = [\"a\", \"b\"]\nlatency_ms = 10\nloss = 0.05\n");
  REQUIRE(ok.network.model.partitions.size() == 1);
  CHECK(ok.network.model.partitions[0].duration_s == 2.5);
  CHECK(ok.network.model.link("b", "a")->loss == 0.05);
  CHECK_THAT(parse_error("[[network.link]]\nbetween = [\"a\", \"b\"]\nlatency = 10\n"),
             Catch::Contains("job.toml:3") && Catch::Contains("network.link[1].latency") &&
                 Catch::Contains("latency_ms"));
  CHECK_THAT(parse_error("[[network.link]]\nbetween = [\"a\"]\n"), Catch::Contains("two region names"));
  CHECK_THAT(parse_error("[[network.link]]\nbetween = [\"a\", \"b\"]\nloss = 2\n"), Catch::Contains("out of range"));
  CHECK_THAT(parse_error("[[network.partition]]\nbetween = [\"a\", \"b\"]\nat_s = 1\n"), Catch::Contains("duration_s"));
  CHECK_THAT(parse_error("[[network.link]]\nbetween = [\"a\", \"b\"]\n[[network.link]]\nbetween = [\"b\", \"a\"]\n"),
             Catch::Contains("twice"));
}

TEST_CASE("the cluster secret comes from a file only its owner can read", "[elastic][config][secret]") {
  const std::string path = std::filesystem::temp_directory_path() / ("tepdist-secret-" + std::to_string(::getpid()));
  std::ofstream(path) << "hunter2 hunter2 hunter2\n";
  JobConfig::Cluster c;
  c.secret_file = path;
  std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  auto secret = load_secret(c);
  REQUIRE(secret.has_value());
  CHECK(*secret == "hunter2 hunter2 hunter2");
  std::filesystem::permissions(path, std::filesystem::perms::group_read, std::filesystem::perm_options::add);
  auto loose = load_secret(c);
  REQUIRE_FALSE(loose.has_value());
  CHECK_THAT(loose.error().message, Catch::Contains("0600") && Catch::Contains(path));
  std::filesystem::remove(path);
  CHECK_FALSE(load_secret(c).has_value());
  CHECK_FALSE(load_secret(JobConfig::Cluster{}).has_value());
  JobConfig::Cluster inline_secret;
  inline_secret.secret = "sixteen bytes ok";
  CHECK(load_secret(inline_secret).value() == "sixteen bytes ok");
}

TEST_CASE("the job text the nodes get holds no inline secret, and every other setting", "[elastic][config][secret]") {
  const std::string secret = "an inline secret that must stay here";
  const std::vector<std::string> overrides = {"cluster.secret=\"" + secret + "\"", "job.epochs=3"};
  auto c = parse_config("[job]\nmode = \"sync\"\n[cluster]\nsecret = \"written in the file too\"\n", "job.toml", overrides);
  REQUIRE(c);
  REQUIRE(c->text.find(secret) != std::string::npos);  // the launcher's own copy has it
  auto shipped = text_for_nodes(*c);
  REQUIRE(shipped);
  CHECK(shipped->find(secret) == std::string::npos);
  CHECK(shipped->find("written in the file too") == std::string::npos);
  auto back = parse_config(*shipped, "shipped");
  REQUIRE(back);
  CHECK(back->cluster.secret.empty());
  back->cluster.secret = c->cluster.secret;
  CHECK(back->same_settings(*c));
}

TEST_CASE("a cluster secret shorter than 16 bytes is refused, saying how long it is and where it came from",
          "[elastic][config][secret]") {
  JobConfig::Cluster inline_secret;
  inline_secret.secret = "fifteen bytes!!";
  auto short_inline = load_secret(inline_secret);
  REQUIRE_FALSE(short_inline);
  CHECK_THAT(short_inline.error().message, Catch::Contains("[cluster] secret") && Catch::Contains("15 bytes") &&
                                               Catch::Contains("at least 16"));
  const std::string path = std::filesystem::temp_directory_path() / ("tepdist-short-" + std::to_string(::getpid()));
  std::ofstream(path) << "hunter2\n";
  std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  JobConfig::Cluster from_file;
  from_file.secret_file = path;
  auto short_file = load_secret(from_file);
  std::filesystem::remove(path);
  REQUIRE_FALSE(short_file);
  CHECK_THAT(short_file.error().message, Catch::Contains(path) && Catch::Contains("7 bytes"));
}

TEST_CASE("configs/async.toml and configs/gossip.toml load and say their modes", "[elastic][config]") {
  auto a = load_config(std::string(TEPDIST_SOURCE_DIR) + "/configs/async.toml");
  INFO((a ? std::string() : a.error().message));
  REQUIRE(a);
  CHECK(a->job.mode == "async");
  CHECK(a->elastic.replication == 2);
  CHECK(a->cluster.local_nodes == 4);
  auto g = load_config(std::string(TEPDIST_SOURCE_DIR) + "/configs/gossip.toml");
  INFO((g ? std::string() : g.error().message));
  REQUIRE(g);
  CHECK(g->job.mode == "gossip");
  CHECK(g->job.gossip_every == 4);
  // The modes differ in how they train, not in what: same model, batch and learning rate.
  CHECK(a->optimizer == g->optimizer);
  CHECK(a->data == g->data);
  CHECK(a->model == g->model);
}

TEST_CASE("per-node settings live in [nodes.NAME] tables, checked, overridable, and regions by index are refused",
          "[elastic][config][nodes]") {
  const auto c = parse_ok("[nodes.node-01]\nregion = \"eu\"\n[nodes.edge]\nregion = \"ap\"\n",
                          {"nodes.node-01.region=us", "nodes.node-07.region=sa"});
  CHECK(c.node("node-01").region == "us");  // --set wins over the file
  CHECK(c.node("edge").region == "ap");
  CHECK(c.node("node-07").region == "sa");  // a table made by --set alone
  CHECK(c.node("node-00").region == "local");
  CHECK(tepdist::elastic::local_node_name(3) == "node-03");
  CHECK_THAT(parse_error("[nodes.node-01]\nregoin = \"eu\"\n"), Catch::Contains("unknown key nodes.node-01.regoin"));
  CHECK_THAT(parse_error("[nodes.node-01]\nregion = 3\n"), Catch::Contains("nodes.node-01.region must be"));
  CHECK_THAT(parse_error("[nodes]\nnode-01 = \"eu\"\n"), Catch::Contains("nodes.node-01 must be a table"));
  CHECK_THAT(parse_error("[network]\nregions = [\"a\"]\n"), Catch::Contains("[nodes.node-00] region"));
  CHECK_THAT(parse_error("", {"nodes.region=eu"}), Catch::Contains("expected nodes.NAME.KEY=value"));
  // A node's own CUDA device, over the job's [compute] device (-1: none of its own).
  const auto devices = parse_ok("[compute]\ndevice = 2\n[nodes.node-01]\ndevice = 1\n", {"nodes.node-03.device=3"});
  CHECK(devices.compute.device == 2);
  CHECK(devices.node("node-01").device == 1);
  CHECK(devices.node("node-03").device == 3);
  CHECK(devices.node("node-00").device == -1);
  CHECK_THAT(parse_error("[nodes.node-01]\ndevice = 64\n"), Catch::Contains("nodes.node-01.device must be an integer from 0 to 63"));
  CHECK_THAT(parse_error("[nodes.node-01]\ndevice = 1.5\n"), Catch::Contains("nodes.node-01.device must be an integer"));
}

TEST_CASE("a receive budget below the largest frame is refused, naming both keys", "[elastic][config]") {
  const std::vector<std::string> overrides = {"cluster.max_frame_mb=256"};
  auto c = parse_config("[job]\nmode = \"sync\"\n", "job.toml", overrides);
  REQUIRE_FALSE(c);
  CHECK_THAT(c.error().message, Catch::Contains("cluster.receive_queue_mb (128)") &&
                                    Catch::Contains("cluster.max_frame_mb (256)"));
  const std::vector<std::string> both = {"cluster.max_frame_mb=256", "cluster.receive_queue_mb=256"};
  CHECK(parse_config("[job]\nmode = \"sync\"\n", "job.toml", both));
}

TEST_CASE("the monitor endpoint listens on loopback by default, takes an IP address and port, and can be turned off",
          "[elastic][config]") {
  CHECK(parse_ok("").monitor.http == "127.0.0.1:0");
  CHECK(parse_ok("[monitor]\nhttp = \"0.0.0.0:9464\"\n").monitor.http == "0.0.0.0:9464");
  CHECK(parse_ok("[monitor]\nhttp = \"[::1]:0\"\n").monitor.http == "[::1]:0");
  CHECK(parse_ok("[monitor]\nhttp = \"\"\n").monitor.http.empty());
  for (const auto* bad : {"localhost:9464", "127.0.0.1", "127.0.0.1:65536", "127.0.0.1:-1", "::1:0", "127.0.0.1:80x"}) {
    INFO(bad);
    CHECK_THAT(parse_error(std::string("[monitor]\nhttp = \"") + bad + "\"\n"),
               Catch::Contains("monitor.http") && Catch::Contains(bad));
  }
}

TEST_CASE("pause_between_epochs is for cluster jobs, and dataset files needs its training file", "[elastic][config]") {
  for (const auto* mode : {"sync", "async", "gossip"})
    CHECK(parse_ok(fmt::format("[job]\nmode = \"{}\"\npause_between_epochs = true\n", mode)).job.pause_between_epochs);
  CHECK_THAT(parse_error("[job]\nmode = \"single\"\npause_between_epochs = true\n"),
             Catch::Contains("job.pause_between_epochs is for cluster jobs"));
  CHECK_THAT(parse_error("[data]\ndataset = \"files\"\n"), Catch::Contains("data.dataset = \"files\" needs data.train_file"));
  const auto c = parse_ok("[data]\ndataset = \"files\"\ntrain_file = \"a.tds\"\ntest_file = \"b.tds\"\n");
  CHECK(c.data.train_file == "a.tds");
  CHECK(c.data.test_file == "b.tds");
}

TEST_CASE("toml_string quotes any path so that an override reads it back as it was", "[elastic][config]") {
  for (const std::string& path : {std::string("/plain/path"), std::string("/a \"quoted\" \\ name"),
                                 std::string("/with\nnewline\tand\x7f")}) {
    const auto c = parse_ok("", {"data.train_file=" + toml_string(path), "data.dataset=\"files\""});
    CHECK(c.data.train_file == path);
  }
}

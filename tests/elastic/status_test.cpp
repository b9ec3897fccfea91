// The status document: one model, rendered as the table and the JSON `tepdist status` prints.

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "elastic/status.hpp"

using tepdist::gossip::JobStatus;
using tepdist::gossip::Member;
using tepdist::gossip::StateSync;
namespace elastic = tepdist::elastic;

namespace {

StateSync answer(std::optional<JobStatus> job) {
  const Member a{"a", "10.0.0.1:7000", 5, Member::State::alive, "eu", {"worker"}, {}, 1};
  const Member b{"b", "10.0.0.2:7000", 6, Member::State::dead, "us", {"worker"}, {}, 2};
  return StateSync{{a, b}, true, 1234, {{0, {"a", "b"}}}, std::move(job)};
}

}  // namespace

TEST_CASE("the status document shows the job's generation and each worker's position, in JSON and the table",
          "[elastic][status]") {
  JobStatus job{7, "gossip", 3, "voting", {40, 1, 512, 9000}, {{"a", 512}, {"c", 128}}};
  job.loads = {{"a", 1234.4, 0}, {"c", 0, 0}};  // gossip: the answering worker knows its own speed
  job.lr = 0.025;
  const auto doc = elastic::status_document("10.0.0.1:7000", answer(job));
  const auto json = nlohmann::json::parse(elastic::status_json(doc));
  CHECK(json["source"] == "10.0.0.1:7000");
  CHECK(json["members"].size() == 2);
  CHECK(json["members"][1]["state"] == "dead");
  CHECK(json["members"][0]["shards"][0]["primary"] == true);
  CHECK(json["members"][1]["shards"][0]["primary"] == false);
  CHECK(json["job"]["generation"] == 3);
  CHECK(json["job"]["phase"] == "voting");
  CHECK(json["job"]["samples"] == 9000);
  CHECK(json["job"]["workers"][1]["id"] == "c");
  CHECK(json["job"]["workers"][1]["position"] == 128);
  CHECK(json["job"]["workers"][0]["samples_per_second"] == Approx(1234.4));
  CHECK(json["job"]["workers"][1]["samples_per_second"].is_null());  // not known there
  CHECK(json["job"]["workers"][0]["share"].is_null());                // gossip has no shares
  CHECK(json["job"]["lr"] == Approx(0.025));

  const auto table = elastic::status_table(doc);
  CHECK_THAT(table, Catch::Contains("job 7 (gossip): generation 3, voting, epoch 2, step 40, 9000 samples"));
  CHECK_THAT(table, Catch::Contains("0p"));
  CHECK_THAT(table, Catch::Contains("learning rate in effect 0.025"));
  CHECK_THAT(table, Catch::Contains("a                       512        -      -         1234      -          -"));
  CHECK_THAT(table, Catch::Contains("c                       128        -      -            -      -          -"));
}

TEST_CASE("each worker's step, lag and staleness come from its own fresh figures, of this job only",
          "[elastic][status][monitor]") {
  // a and c are workers of async job 7; a answers. c is 30 steps behind a. b is dead (its figures
  // stale), d's figures are of another job: neither counts for the lag.
  JobStatus job{7, "async", 2, "training", {130, 1, 512, 9000}, {{"a", 512}, {"b", 300}, {"c", 128}, {"d", 64}}};
  auto sync = answer(job);
  sync.members.push_back({"c", "10.0.0.3:7000", 1, Member::State::alive, "eu", {"worker"}, {}, 3});
  sync.members.push_back({"d", "10.0.0.4:7000", 1, Member::State::alive, "eu", {"worker"}, {}, 4});
  elastic::FigureTable figures{
      {"a", {100000, {{"job_id", 7}, {"step", 130}, {"samples_per_second", 900}, {"staleness", 2.5}}}},
      {"b", {99500, {{"job_id", 7}, {"step", 400}}}},
      {"c", {99800, {{"job_id", 7}, {"step", 100}, {"staleness", 6.25}}}},
      {"d", {99900, {{"job_id", 6}, {"step", 900}}}}};
  sync.figures = elastic::snapshot_of(figures);
  const auto doc = elastic::status_document("10.0.0.1:7000", sync);
  const auto json = nlohmann::json::parse(elastic::status_json(doc));
  const auto& w = json["job"]["workers"];
  REQUIRE(w.size() == 4);
  CHECK(w[0]["step"] == 130);
  CHECK(w[0]["lag_steps"] == 0);
  CHECK(w[0]["staleness"] == Approx(2.5));
  CHECK(w[0]["samples_per_second"] == Approx(900));  // from its figures: the answer has no load for it
  CHECK(w[1]["step"].is_null());                     // b: dead, its figures stale
  CHECK(w[1]["lag_steps"].is_null());
  CHECK(w[2]["step"] == 100);
  CHECK(w[2]["lag_steps"] == 30);
  CHECK(w[2]["staleness"] == Approx(6.25));
  CHECK(w[3]["step"].is_null());  // d: another job's figures
  const auto table = elastic::status_table(doc);
  INFO(table);
  CHECK_THAT(table, Catch::Contains("WORKER") && Catch::Contains("LAG") && Catch::Contains("STALENESS"));
  CHECK_THAT(table, Catch::Contains("c                       128      100     30            -      -        6.2"));
}

TEST_CASE("a member without a job says so in both renderings", "[elastic][status]") {
  const auto doc = elastic::status_document("x", answer(std::nullopt));
  CHECK(nlohmann::json::parse(elastic::status_json(doc))["job"].is_null());
  CHECK_THAT(elastic::status_table(doc), Catch::Contains("no job on this member"));
}

TEST_CASE("async: each shard's version is its primary's, a replica's is not taken, one not heard is unknown",
          "[elastic][status]") {
  auto sync = answer(JobStatus{7, "async", 2, "training", {40, 1, 512, 9000}, {{"a", 512}}});
  sync.shards = {{0, {"a", "b"}}, {1, {"b", "a"}}};
  auto doc = elastic::status_document("10.0.0.1:7000", sync);
  CHECK(elastic::shard_primaries(doc).size() == 2);
  // a holds both: primary of 0 (version 91), replica of 1 (90, behind its primary's).
  auto from_a = sync;
  from_a.job->held_shards = {{0, 91}, {1, 90}};
  elastic::add_versions(doc, "a", from_a);
  const auto json = nlohmann::json::parse(elastic::status_json(doc));
  REQUIRE(json["shards"].size() == 2);
  CHECK(json["shards"][0]["primary"] == "a");
  CHECK(json["shards"][0]["replicas"] == nlohmann::json::array({"b"}));
  CHECK(json["shards"][0]["version"] == 91);
  CHECK(json["shards"][1]["version"].is_null());  // b did not answer
  const auto table = elastic::status_table(doc);
  CHECK_THAT(table, Catch::Contains("SHARD") && Catch::Contains("91 b"));
  CHECK_THAT(table, Catch::Contains("? a"));
}

TEST_CASE("the status document carries the job's course: loss, evaluations, history and generations", "[elastic][status]") {
  JobStatus job{7, "sync", 2, "training", {96, 1, 0, 12288}, {{"a", 0}}};
  job.lr = 0.05;
  job.loss = 0.4375;
  job.evaluations = {{48, 0, 2.5, 0.8125, 0.5}, {96, 1, 5.25, 0.84375, 0.4375}};
  job.history = {{40, 2.0, 0.625, 6400.5, 0.05}};
  job.generations = {{1, 0, 2, 1796273776109}, {2, 40, 3, 1796273779109}};
  const auto doc = elastic::status_document("10.0.0.1:7000", answer(job));
  const auto json = nlohmann::json::parse(elastic::status_json(doc));
  CHECK(json["job"]["loss"] == Approx(0.4375));
  REQUIRE(json["job"]["evaluations"].size() == 2);
  CHECK(json["job"]["evaluations"][1]["step"] == 96);
  CHECK(json["job"]["evaluations"][1]["test_accuracy"] == Approx(0.84375));
  CHECK(json["job"]["evaluations"][1]["test_loss"] == Approx(0.4375));
  REQUIRE(json["job"]["history"].size() == 1);
  CHECK(json["job"]["history"][0]["samples_per_second"] == Approx(6400.5));
  CHECK(json["job"]["history"][0]["lr"] == Approx(0.05));
  REQUIRE(json["job"]["generations"].size() == 2);
  CHECK(json["job"]["generations"][1]["resume_step"] == 40);
  CHECK(json["job"]["generations"][1]["workers"] == 3);
  const auto table = elastic::status_table(doc);
  CHECK_THAT(table, Catch::Contains("training loss 0.4375"));
  CHECK_THAT(table, Catch::Contains("test accuracy 0.8438, test loss 0.4375 (step 96, 2 evaluations)"));
}

TEST_CASE("every node's figures travel as a labelled snapshot, merge newest first, and only for members",
          "[elastic][status][monitor]") {
  elastic::FigureTable table{{"a", {1000, {{"step", 12}, {"loss", 0.5}}}}, {"b", {900, {{"step", 10}}}}};
  const auto snapshot = elastic::snapshot_of(table);
  CHECK(snapshot.entries.size() == 5);  // unix_ms and the figures, per node
  for (const auto& e : snapshot.entries) CHECK(e.labels == std::vector<std::pair<std::string, std::string>>{{"node", e.labels[0].second}});
  CHECK(elastic::table_of(snapshot) == table);

  // Newer wins, older is ignored, an id membership does not know is not taken.
  elastic::FigureTable mine{{"a", {1500, {{"step", 20}}}}, {"b", {800, {{"step", 9}}}}};
  elastic::FigureTable in = table;
  in["intruder"] = {5000, {{"step", 1}}};
  CHECK(elastic::merge_figures(mine, in, {"a", "b"}));
  CHECK(mine.at("a").unix_ms == 1500);  // its own was newer
  CHECK(mine.at("b") == table.at("b"));
  CHECK_FALSE(mine.contains("intruder"));
  CHECK_FALSE(elastic::merge_figures(mine, in, {"a", "b"}));  // nothing newer a second time

  // Entries without a node label, and nodes without a time, are left out.
  tepdist::gossip::MetricsSnapshot odd{{{"step", {}, 3}, {"step", {{"node", "c"}}, 4}}};
  CHECK(elastic::table_of(odd).empty());
}

TEST_CASE("the status shows every node's figures, a dead member's and an old summary marked stale",
          "[elastic][status][monitor]") {
  auto sync = answer(std::nullopt);  // a alive, b dead
  elastic::FigureTable figures{{"a", {100000, {{"step", 40}, {"samples_per_second", 812.5}}}},
                               {"b", {99000, {{"step", 38}}}},
                               {"c", {90000, {{"step", 30}}}}};  // c: 10 s older, and not a member
  sync.figures = elastic::snapshot_of(figures);
  const auto doc = elastic::status_document("10.0.0.1:7000", sync);
  const auto json = nlohmann::json::parse(elastic::status_json(doc));
  REQUIRE(json["nodes"].size() == 3);
  CHECK(json["nodes"][0]["id"] == "a");
  CHECK(json["nodes"][0]["stale"] == false);
  CHECK(json["nodes"][0]["figures"]["samples_per_second"] == Approx(812.5));
  CHECK(json["nodes"][1]["stale"] == true);  // b is dead: its last figures stay, stale
  CHECK(json["nodes"][1]["state"] == "dead");
  CHECK(json["nodes"][2]["stale"] == true);
  CHECK(json["nodes"][2]["age_s"] == Approx(10.0));
  const auto table = elastic::status_table(doc);
  CHECK_THAT(table, Catch::Contains("NODE") && Catch::Contains("stale"));
}

TEST_CASE("the status carries the answering node's membership events, oldest first", "[elastic][status][monitor]") {
  auto sync = answer(std::nullopt);
  sync.events = {{1000, "joined", "b"}, {5000, "dead", "b"}};
  const auto json = nlohmann::json::parse(elastic::status_json(elastic::status_document("x", sync)));
  REQUIRE(json["events"].size() == 2);
  CHECK(json["events"][0]["kind"] == "joined");
  CHECK(json["events"][1]["member"] == "b");
  CHECK(json["events"][1]["unix_ms"] == 5000);
}

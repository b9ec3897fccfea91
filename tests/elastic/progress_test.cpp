// Positions and rates across changes of the number of workers.

#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "elastic/coordination.hpp"
#include "elastic/progress.hpp"

using namespace tepdist;
using gossip::JobProgress;

TEST_CASE("sync: with a fixed world the slices are the fixed split, step for step", "[elastic][progress]") {
  const int64_t n = 1000, world = 3, batch = 64;
  JobProgress p;
  const int64_t per_epoch = elastic::sync_steps_per_epoch(n, world, batch);
  for (int64_t t = 0; t < 2 * per_epoch; ++t) {
    for (int64_t r = 0; r < world; ++r)
      CHECK(elastic::sync_slice(p, n, batch, r) == elastic::sync_batch_slice(n, world, batch, t % per_epoch, r));
    p = elastic::after_sync_step(p, n, world, batch);
    CHECK(p.step == static_cast<uint64_t>(t + 1));
    CHECK(p.epoch == static_cast<uint64_t>((t + 1) / per_epoch));
  }
  CHECK(p.samples == 2 * n);
}

TEST_CASE("sync: whatever the world does from step to step, each epoch uses every position once",
          "[elastic][progress]") {
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    std::mt19937_64 random(seed);
    const int64_t n = 200 + static_cast<int64_t>(random() % 2000), batch = 1 + static_cast<int64_t>(random() % 40);
    JobProgress p;
    std::vector<int> used(static_cast<size_t>(n), 0);
    uint64_t epoch = 0;
    while (p.epoch < 3) {
      const int64_t world = 1 + static_cast<int64_t>(random() % 7);
      for (int64_t r = 0; r < world; ++r) {
        const auto [b, e] = elastic::sync_slice(p, n, batch, r);
        for (int64_t i = b; i < e; ++i) ++used[static_cast<size_t>(i)];
      }
      p = elastic::after_sync_step(p, n, world, batch);
      if (p.epoch != epoch) {
        INFO("seed " << seed << " epoch " << epoch);
        CHECK(std::all_of(used.begin(), used.end(), [](int u) { return u == 1; }));
        std::fill(used.begin(), used.end(), 0);
        epoch = p.epoch;
      }
    }
    CHECK(p.samples == 3 * static_cast<uint64_t>(n));
  }
}

TEST_CASE("job_finished: epochs or max_steps, whichever comes first", "[elastic][progress]") {
  CHECK_FALSE(elastic::job_finished({5, 1, 0, 0}, 2, 0));
  CHECK(elastic::job_finished({5, 2, 0, 0}, 2, 0));
  CHECK(elastic::job_finished({5, 0, 0, 0}, 2, 5));
}

TEST_CASE("the rate: the schedule by samples, scaled with the global batch, ramped after a change",
          "[elastic][progress]") {
  compute::ScheduleOptions s;
  s.kind = "step";
  s.base_lr = 0.1f;
  s.step_size = 10;
  s.gamma = 0.5f;
  auto schedule = compute::LrSchedule::make(s);
  REQUIRE(schedule);
  const int64_t n = 6400, ref = 192;  // 3 workers x 64
  elastic::RatePolicy policy(*schedule, {n, ref, 4});
  policy.set_generation({}, 0, ref);
  // Unchanged world: exactly the step schedule.
  JobProgress p;
  for (int t = 0; t < 40; ++t) {
    CHECK(policy.at(p) == schedule->at(t % 34 + (t >= 34 ? 34 : 0)));
    p = elastic::after_sync_step(p, n, 3, 64);
  }
  // Two workers from here: the scale goes from 1 to 2/3 over 4 global batches of 128.
  const JobProgress at{40, 1, 1152, 7552};
  policy.set_generation(at, ref, 128);
  const float base = schedule->at(policy.schedule_step(at));
  CHECK(policy.at(at) == Approx(base));
  JobProgress half = at;
  half.samples += 256;
  CHECK(policy.at(half) == Approx(base * (1 + (2.0 / 3 - 1) * 0.5)));
  JobProgress later = at;
  later.samples += 4 * 128;
  later.position += 4 * 128;
  CHECK(policy.at(later) == Approx(schedule->at(policy.schedule_step(later)) * 2.0 / 3));
  // The schedule counts samples: 1152 + 512 positions into epoch 1 is reference step 34 + 8.
  CHECK(policy.schedule_step(later) == 34 + 8);
}

TEST_CASE("gossip spans: whatever the changes, every position of every epoch is trained on once", "[elastic][progress]") {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    INFO("seed " << seed);
    std::mt19937_64 random(seed);
    const int64_t n = 100 + static_cast<int64_t>(random() % 900), epochs = 1 + static_cast<int64_t>(random() % 3);
    const uint64_t batch = 1 + random() % 40;
    auto lists = elastic::initial_spans(n, epochs, 1 + static_cast<int64_t>(random() % 5));
    std::vector<uint64_t> consumed(lists.size(), 0), mixed(lists.size(), 0);
    std::vector<std::vector<int>> used(static_cast<size_t>(epochs), std::vector<int>(static_cast<size_t>(n), 0));
    // What each worker trained on since its last mixing: lost if it dies before the next.
    std::vector<std::vector<std::pair<uint64_t, uint64_t>>> unmixed(lists.size());
    std::vector<uint64_t> unmixed_epoch(lists.size());
    for (int round = 0; round < 60; ++round) {
      // Some local steps on random workers, now and then a mixing.
      for (int k = 0; k < 20; ++k) {
        const size_t w = random() % lists.size();
        const auto slice = elastic::next_slice(lists[w], consumed[w], batch);
        if (slice.count == 0) continue;
        for (const auto& [b, e] : slice.pieces) {
          for (uint64_t p = b; p < e; ++p) ++used[slice.epoch][p];
          unmixed[w].push_back({slice.epoch, 0});
          unmixed[w].back() = {slice.epoch * 1000000 + b, e - b};
        }
        consumed[w] += slice.count;
        if (random() % 3 == 0) mixed[w] = consumed[w], unmixed[w].clear();
      }
      if (random() % 4 != 0) continue;
      // A change: one worker dies (its unmixed steps are undone), one joins, or both.
      std::vector<elastic::Spans> rests;
      const bool kill = lists.size() > 1 && random() % 2 == 0;
      const size_t victim = random() % lists.size();
      for (size_t w = 0; w < lists.size(); ++w) {
        if (kill && w == victim) {
          for (const auto& [key, len] : unmixed[w])
            for (uint64_t p = key % 1000000; p < key % 1000000 + len; ++p) --used[key / 1000000][p];
          rests.push_back(elastic::rest_after(lists[w], mixed[w]));
        } else {
          rests.push_back(elastic::rest_after(lists[w], consumed[w]));
        }
      }
      const size_t next = lists.size() - (kill ? 1 : 0) + (random() % 2);
      lists = elastic::resplit(rests, std::max<size_t>(1, next));
      consumed.assign(lists.size(), 0);
      mixed.assign(lists.size(), 0);
      unmixed.assign(lists.size(), {});
    }
    // Everyone trains to the end of their lists.
    for (size_t w = 0; w < lists.size(); ++w)
      for (auto slice = elastic::next_slice(lists[w], consumed[w], batch); slice.count > 0;
           slice = elastic::next_slice(lists[w], consumed[w], batch)) {
        for (const auto& [b, e] : slice.pieces)
          for (uint64_t p = b; p < e; ++p) ++used[slice.epoch][p];
        consumed[w] += slice.count;
      }
    for (const auto& epoch : used) CHECK(std::all_of(epoch.begin(), epoch.end(), [](int u) { return u == 1; }));
  }
}

TEST_CASE("gossip spans: a step stays in one epoch, the first split is the equal one", "[elastic][progress]") {
  const auto lists = elastic::initial_spans(10, 2, 3);
  REQUIRE(lists.size() == 3);
  CHECK(lists[0] == elastic::Spans{{0, 0, 3}, {1, 0, 3}});
  CHECK(lists[2] == elastic::Spans{{0, 6, 10}, {1, 6, 10}});
  const auto s = elastic::next_slice(lists[2], 2, 5);
  CHECK(s.epoch == 0);
  CHECK(s.count == 2);  // the rest of epoch 0, not into epoch 1
  CHECK(elastic::next_slice(lists[2], 8, 5).count == 0);
  const auto re = elastic::resplit({elastic::rest_after(lists[0], 2), elastic::rest_after(lists[1], 3)}, 2);
  // Epoch 0 rest: [2,3) and nothing of worker 1's; epoch 1: [0,3) and [3,6): 7 positions.
  CHECK(elastic::span_total(re[0]) + elastic::span_total(re[1]) == 7);
  // Epoch 0's one position left goes to one share, epoch 1's six are split three and three.
  CHECK(re[1].front() == elastic::Span{0, 2, 3});
  CHECK(elastic::span_total(re[0]) == 3);
}

TEST_CASE("job pace: a worker's cursor tells the job's samples, whatever the number of workers", "[elastic][progress]") {
  const int64_t n = 6000, epochs = 5;
  const uint64_t ref = 256;  // 4 workers x 64 at the start
  std::vector<std::vector<uint64_t>> lists;
  for (const auto& l : elastic::initial_spans(n, epochs, 4)) lists.push_back(elastic::triples_of(l));
  // The first generation: a quarter of the way through its list, a worker holds the job a
  // quarter of the way through all of it.
  const elastic::JobPace first(lists, 1, n, epochs, ref, {});
  CHECK(first.at(0).samples == 0);
  const auto quarter = first.at(elastic::span_total(elastic::spans_of(lists[1])) / 4);
  CHECK(quarter.epoch == 1);
  CHECK(quarter.position == 1500);
  CHECK(quarter.step == 7500 / ref);
  CHECK(quarter.samples == 7500);

  // Half the job done, the rest re-split over 8 workers by speed (one twice as fast as the others):
  // each of them at the end of its own list puts the job at its end, the fast one too, and at the
  // middle of its list half-way through the rest.
  std::vector<elastic::Spans> rests;
  for (const auto& l : lists) rests.push_back(elastic::rest_after(elastic::spans_of(l), elastic::span_total(elastic::spans_of(l)) / 2));
  const std::vector<double> speeds{2, 1, 1, 1, 1, 1, 1, 1};
  std::vector<std::vector<uint64_t>> second;
  for (const auto& l : elastic::resplit(rests, 8, speeds)) second.push_back(elastic::triples_of(l));
  const JobProgress resume{600, 2, 3000, 153600};  // the record's: its samples are where the ramp counts from
  for (size_t rank : {0u, 5u}) {
    const elastic::JobPace pace(second, rank, n, epochs, ref, resume);
    const uint64_t own = elastic::span_total(elastic::spans_of(second[rank]));
    CHECK(pace.at(0).samples == resume.samples);
    CHECK(pace.at(0).epoch == 2);
    CHECK(pace.at(0).position == 3000);
    const auto mid = pace.at(own / 2);
    CHECK(mid.epoch * n + mid.position == Approx(15000 + 7500).margin(10));  // within a position of its list
    const auto end = pace.at(own);
    CHECK(end.epoch == 5);
    CHECK(end.position == 0);
    CHECK(end.step == 30000 / ref);
    CHECK(end.samples == resume.samples + 15000);
  }
}

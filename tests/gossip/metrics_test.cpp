#include <catch2/catch.hpp>
#include <thread>

#include "gossip/metrics/registry.hpp"

using namespace tepdist::gossip;

TEST_CASE("counters with the same name and labels are one metric, whatever the label order", "[gossip][metrics]") {
  MetricsRegistry r;
  r.counter("frames_in_total", {{"peer", "b"}, {"kind", "ping"}}).add(2);
  r.counter("frames_in_total", {{"kind", "ping"}, {"peer", "b"}}).add(3);
  r.counter("frames_in_total", {{"kind", "ping"}, {"peer", "c"}}).add();
  CHECK(r.counter("frames_in_total", {{"peer", "b"}, {"kind", "ping"}}).value() == 5);
  const auto text = r.render_prometheus();
  CHECK_THAT(text, Catch::Contains("# TYPE frames_in_total counter\n"));
  CHECK_THAT(text, Catch::Contains("frames_in_total{kind=\"ping\",peer=\"b\"} 5\n"));
  CHECK_THAT(text, Catch::Contains("frames_in_total{kind=\"ping\",peer=\"c\"} 1\n"));
}

TEST_CASE("histograms render cumulative buckets, sum and count", "[gossip][metrics]") {
  MetricsRegistry r;
  auto& h = r.histogram("send_latency_ms", {{"peer", "b"}}, "frame queued to written", {1, 10, 100});
  for (double v : {0.5, 5.0, 5.0, 50.0, 500.0}) h.observe(v);
  const auto text = r.render_prometheus();
  CHECK_THAT(text, Catch::Contains("# HELP send_latency_ms frame queued to written\n"));
  CHECK_THAT(text, Catch::Contains("send_latency_ms_bucket{peer=\"b\",le=\"1\"} 1\n"));
  CHECK_THAT(text, Catch::Contains("send_latency_ms_bucket{peer=\"b\",le=\"10\"} 3\n"));
  CHECK_THAT(text, Catch::Contains("send_latency_ms_bucket{peer=\"b\",le=\"+Inf\"} 5\n"));
  CHECK_THAT(text, Catch::Contains("send_latency_ms_count{peer=\"b\"} 5\n"));
  CHECK_THAT(text, Catch::Contains("send_latency_ms_sum{peer=\"b\"} 560.5\n"));
}

TEST_CASE("gauges go up and down and label values are escaped", "[gossip][metrics]") {
  MetricsRegistry r;
  auto& g = r.gauge("send_queue_bytes", {{"peer", "a\"b"}});
  g.add(10);
  g.add(-4);
  CHECK(g.value() == 6.0);
  CHECK_THAT(r.render_prometheus(), Catch::Contains("send_queue_bytes{peer=\"a\\\"b\"} 6\n"));
}

TEST_CASE("recording from many threads loses nothing", "[gossip][metrics]") {
  MetricsRegistry r;
  auto& c = r.counter("n");
  auto& g = r.gauge("g");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c.add();
        g.add(1.0);
      }
    });
  for (auto& t : threads) t.join();
  CHECK(c.value() == 40000);
  CHECK(g.value() == 40000.0);
}

TEST_CASE("common labels lead every series, and a series' own label of the same name wins", "[gossip][metrics]") {
  MetricsRegistry r;
  r.counter("tepdist_x_total", {{"peer", "b"}}).add(2);
  r.gauge("tepdist_y", {{"node", "own"}}).set(1.5);
  r.histogram("tepdist_z_seconds", {}, "", {0.5}).observe(0.25);
  r.set_common_labels({{"node", "n1"}});
  const auto text = r.render_prometheus();
  CHECK_THAT(text, Catch::Contains("tepdist_x_total{node=\"n1\",peer=\"b\"} 2\n"));
  CHECK_THAT(text, Catch::Contains("tepdist_y{node=\"own\"} 1.5\n"));
  CHECK_THAT(text, Catch::Contains("tepdist_z_seconds_bucket{node=\"n1\",le=\"0.5\"} 1\n"));
  CHECK_THAT(text, Catch::Contains("tepdist_z_seconds_count{node=\"n1\"} 1\n"));
}

TEST_CASE("the monitor reads gauges and histograms back: one series, or summed over label sets", "[gossip][metrics]") {
  MetricsRegistry r;
  CHECK_FALSE(r.gauge_value("queue_bytes", {{"peer", "b"}}));  // never made: none, not 0
  CHECK(r.gauge_total("queue_bytes") == 0);
  r.gauge("queue_bytes", {{"peer", "b"}}).set(100);
  r.gauge("queue_bytes", {{"peer", "c"}}).set(28);
  CHECK(r.gauge_value("queue_bytes", {{"peer", "b"}}) == 100);
  CHECK_FALSE(r.gauge_value("queue_bytes", {{"peer", "d"}}));
  CHECK(r.gauge_total("queue_bytes") == 128);
  r.histogram("step_seconds", {{"mode", "sync"}}, "", {0.1, 1}).observe(0.25);
  r.histogram("step_seconds", {{"mode", "async"}}, "", {0.1, 1}).observe(0.5);
  const auto [sum, count] = r.histogram_total("step_seconds");
  CHECK(sum == Approx(0.75));
  CHECK(count == 2);
  CHECK(r.histogram_total("none").second == 0);
}

// The link emulator against a fake clock, to the exact millisecond.

#include <catch2/catch.hpp>

#include "gossip/transport/link_emulator.hpp"

using namespace tepdist::gossip;

namespace {

NetworkModel transatlantic() {
  NetworkModel m;
  // 1 Mbit/s: 1,250 bytes take exactly 10 ms to serialise.
  m.set_link("us-east", "eu-west", {40.0, 0.0, 1.0, 0.0});
  m.set_link("us-east", "us-east", {1.0, 0.0, 0.0, 0.0});
  return m;
}

}  // namespace

TEST_CASE("a frame arrives after its serialisation time plus the one-way latency", "[gossip][link]") {
  LinkEmulator e(transatlantic(), "us-east");
  CHECK(e.stream_release_ms("b", "eu-west", 1250, 100.0, 0.0) == 100.0 + 10.0 + 40.0);
}

TEST_CASE("a big frame delays the ones behind it on the same link only", "[gossip][link]") {
  LinkEmulator e(transatlantic(), "us-east");
  CHECK(e.stream_release_ms("b", "eu-west", 12500, 0.0, 0.0) == 100.0 + 40.0);  // 100 ms on the wire
  CHECK(e.stream_release_ms("b", "eu-west", 1250, 1.0, 0.0) == 110.0 + 40.0);   // queued behind it
  CHECK(e.stream_release_ms("c", "eu-west", 1250, 1.0, 0.0) == 1.0 + 10.0 + 40.0);  // another peer's link
  CHECK(e.stream_release_ms("d", "us-east", 1250, 1.0, 0.0) == 2.0);              // unlimited bandwidth, 1 ms
  CHECK(e.stream_release_ms("b", "eu-west", 1250, 500.0, 0.0) == 550.0);          // the queue has drained
}

TEST_CASE("jitter moves arrivals but never reorders a stream", "[gossip][link]") {
  NetworkModel m;
  m.set_link("a", "b", {50.0, 20.0, 0.0, 0.0});
  LinkEmulator e(m, "a");
  CHECK(e.stream_release_ms("p", "b", 100, 0.0, 1.0) == 70.0);
  CHECK(e.stream_release_ms("p", "b", 100, 1.0, -1.0) == 70.0);  // would be 31: held behind the first
  CHECK(e.stream_release_ms("p", "b", 100, 100.0, -0.5) == 140.0);
}

TEST_CASE("a partition holds stream frames until it heals and drops datagrams", "[gossip][link]") {
  NetworkModel m = transatlantic();
  m.partitions.push_back({1.0, 2.0, "eu-west", "us-east"});  // from 1,000 ms to 3,000 ms
  LinkEmulator e(m, "us-east");
  CHECK(e.stream_release_ms("b", "eu-west", 1250, 500.0, 0.0) == 550.0);
  CHECK(e.stream_release_ms("b", "eu-west", 1250, 1500.0, 0.0) == 3000.0 + 10.0 + 40.0);
  CHECK_FALSE(e.datagram_release_ms("b", "eu-west", 100, 2000.0, 0.0, 0.99).has_value());
  CHECK(e.stream_release_ms("d", "us-east", 10, 2000.0, 0.0) == 2001.0);  // other links are unaffected
  CHECK(e.datagram_release_ms("b", "eu-west", 125, 3500.0, 0.0, 0.99) == 3500.0 + 1.0 + 40.0);
}

TEST_CASE("datagrams are lost with the link's loss probability", "[gossip][link]") {
  NetworkModel m;
  m.set_link("a", "b", {5.0, 0.0, 0.0, 0.25});
  LinkEmulator e(m, "a");
  CHECK_FALSE(e.datagram_release_ms("p", "b", 10, 0.0, 0.0, 0.10).has_value());
  CHECK(e.datagram_release_ms("p", "b", 10, 0.0, 0.0, 0.30) == 5.0);
}

TEST_CASE("pairs that are not listed are not emulated", "[gossip][link]") {
  LinkEmulator e(transatlantic(), "ap-south");
  CHECK(e.stream_release_ms("p", "eu-west", 1 << 20, 7.0, 1.0) == 7.0);
  CHECK(e.datagram_release_ms("p", "eu-west", 10, 7.0, 1.0, 0.0) == 7.0);
}

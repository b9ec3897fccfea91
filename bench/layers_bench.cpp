// Per-layer micro-benchmarks: LeNet's layers at batch 64, forward and backward, reference against
// oneDNN. Run: build/bench/tepdist_layers_bench [--benchmark_filter=conv]
// Each benchmark reports items/s (samples per second through that one layer) and GFLOP/s where
// the layer has a well-defined multiply-add count.

#include <benchmark/benchmark.h>
#include <omp.h>

#include "compute/backends.hpp"
#include "compute/rng.hpp"

using namespace tepdist::compute;

namespace {

constexpr int64_t batch = 64;
const char* backend_names[] = {"ref", "onednn"};

std::unique_ptr<Backend> backend_for(const benchmark::State& state) {
  auto b = std::move(*make_backend(backend_names[state.range(0)]));
  b->set_threads(static_cast<int>(state.range(1)));
  return b;
}

Tensor random_tensor(Shape s) {
  Tensor t(s);
  Rng r(1);
  for (float& v : t.span()) v = r.uniform(-1.0f, 1.0f);
  return t;
}

void report(benchmark::State& state, double flops_per_iteration) {
  state.SetLabel(backend_names[state.range(0)]);
  state.SetItemsProcessed(state.iterations() * batch);
  if (flops_per_iteration > 0)
    state.counters["GFLOP/s"] = benchmark::Counter(flops_per_iteration * static_cast<double>(state.iterations()) / 1e9,
                                                   benchmark::Counter::kIsRate);
}

enum class Pass { forward, backward_data, backward_weights };

void conv(benchmark::State& state, Conv2dGeometry g, Pass pass) {
  auto b = backend_for(state);
  auto k = b->make_conv2d(g);
  Tensor x = random_tensor(g.input()), w = random_tensor(g.weight()), bias = random_tensor({g.k}),
         y = random_tensor(g.output()), dx(g.input()), dw(g.weight()), db({g.k});
  for (auto _ : state) {
    switch (pass) {
      case Pass::forward: k->forward(x, w, bias, y); break;
      case Pass::backward_data: k->backward_data(y, w, dx); break;
      case Pass::backward_weights: k->backward_weights(x, y, dw, db); break;
    }
    benchmark::ClobberMemory();
  }
  report(state, 2.0 * static_cast<double>(g.output().elements() * g.c * g.r * g.s));
}

void linear(benchmark::State& state, LinearGeometry g, Pass pass) {
  auto b = backend_for(state);
  auto k = b->make_linear(g);
  Tensor x = random_tensor({g.n, g.in}), w = random_tensor({g.out, g.in}), bias = random_tensor({g.out}),
         y = random_tensor({g.n, g.out}), dx({g.n, g.in}), dw({g.out, g.in}), db({g.out});
  for (auto _ : state) {
    switch (pass) {
      case Pass::forward: k->forward(x, w, bias, y); break;
      case Pass::backward_data: k->backward_data(y, w, dx); break;
      case Pass::backward_weights: k->backward_weights(x, y, dw, db); break;
    }
    benchmark::ClobberMemory();
  }
  report(state, 2.0 * static_cast<double>(g.n * g.in * g.out));
}

void pool(benchmark::State& state, Pool2dGeometry g, bool backward) {
  auto b = backend_for(state);
  auto k = b->make_max_pool2d(g);
  Tensor x = random_tensor(g.input()), y(g.output()), dx(g.input());
  k->forward(x, y);
  for (auto _ : state) {
    if (backward)
      k->backward(y, dx);
    else
      k->forward(x, y);
    benchmark::ClobberMemory();
  }
  report(state, 0);
}

const Conv2dGeometry conv1{batch, 1, 28, 28, 20, 5, 5, 1, 0}, conv2{batch, 20, 12, 12, 50, 5, 5, 1, 0};
const Pool2dGeometry pool1{batch, 20, 24, 24, 2, 2}, pool2{batch, 50, 8, 8, 2, 2};
const LinearGeometry fc1{batch, 800, 500}, fc2{batch, 500, 10};

// Args: {backend (0 ref, 1 onednn), threads}
void args(benchmark::internal::Benchmark* b) {
  for (int64_t backend : {0, 1})
    for (int64_t threads : {1, 2}) b->Args({backend, threads});
  b->ArgNames({"backend", "threads"})->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK_CAPTURE(conv, conv1_forward, conv1, Pass::forward)->Apply(args);
BENCHMARK_CAPTURE(conv, conv1_backward_weights, conv1, Pass::backward_weights)->Apply(args);
BENCHMARK_CAPTURE(conv, conv2_forward, conv2, Pass::forward)->Apply(args);
BENCHMARK_CAPTURE(conv, conv2_backward_data, conv2, Pass::backward_data)->Apply(args);
BENCHMARK_CAPTURE(conv, conv2_backward_weights, conv2, Pass::backward_weights)->Apply(args);
BENCHMARK_CAPTURE(pool, pool1_forward, pool1, false)->Apply(args);
BENCHMARK_CAPTURE(pool, pool1_backward, pool1, true)->Apply(args);
BENCHMARK_CAPTURE(pool, pool2_forward, pool2, false)->Apply(args);
BENCHMARK_CAPTURE(pool, pool2_backward, pool2, true)->Apply(args);
BENCHMARK_CAPTURE(linear, fc1_forward, fc1, Pass::forward)->Apply(args);
BENCHMARK_CAPTURE(linear, fc1_backward_data, fc1, Pass::backward_data)->Apply(args);
BENCHMARK_CAPTURE(linear, fc1_backward_weights, fc1, Pass::backward_weights)->Apply(args);
BENCHMARK_CAPTURE(linear, fc2_forward, fc2, Pass::forward)->Apply(args);

BENCHMARK_MAIN();

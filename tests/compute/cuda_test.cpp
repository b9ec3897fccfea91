// The CUDA backend against the reference, as onednn_test.cpp checks the oneDNN one, and its NCCL
// communicator. Every test here is tagged [cuda] and needs a CUDA device: without one it says so
// ("no CUDA device here") and ctest reports it skipped. scripts/gpu-check.sh runs them on a GPU
// machine.
//
// Tolerances: strict float32 on both sides (cuDNN's FMA math, no TF32), summed in other orders
// (cuDNN and cuBLAS in blocks with fused multiply-adds), as for oneDNN: 1e-4 relative plus 1e-4
// absolute. The optimiser's update, elementwise and unfused, must be bit-identical.

#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>

#include "compute/cuda/cublas.hpp"
#include "compute/cuda/cuda_backend.hpp"
#include "compute/cuda/nccl_group.hpp"
#include "compute/optimizer.hpp"
#include "compute/presets.hpp"
#include "compute/ref/ref_backend.hpp"
#include "compute/resident.hpp"
#include "compute/train.hpp"

#include <cuda_runtime.h>

using namespace tepdist::compute;

namespace {

/// The CUDA backend on device 0, or null after a visible warning when this machine has no device.
std::unique_ptr<Backend> cuda_or_skip() {
  auto made = make_cuda_backend(0);
  if (!made) {
    WARN("no CUDA device here, skipped: " << made.error().message);
    return nullptr;
  }
  return std::move(*made);
}

Tensor random_tensor(Shape s, uint64_t seed) {
  Tensor t(s);
  Rng r(seed);
  for (float& v : t.span()) v = r.uniform(-1.0f, 1.0f);
  return t;
}

/// Within tolerance of want everywhere, NaN exactly where want is NaN.
void require_close(ConstTensorView got, ConstTensorView want, double tolerance = 1e-4) {
  REQUIRE(got.shape == want.shape);
  int64_t wrong = 0, first = -1;
  for (int64_t i = 0; i < got.elements(); ++i) {
    const float g = got.data[i], w = want.data[i];
    if (std::isnan(w) != std::isnan(g) || (!std::isnan(w) && std::abs(g - w) > tolerance * (1.0 + std::abs(w))))
      if (wrong++ == 0) first = i;
  }
  INFO(wrong << " of " << got.elements() << " elements differ, the first at " << first << ": cuda "
             << (first >= 0 ? got.data[first] : 0.0f) << ", ref " << (first >= 0 ? want.data[first] : 0.0f));
  CHECK(wrong == 0);
}

Tensor copy_of(std::span<const float> values) {
  Tensor t({static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

/// Strided and padded convolutions, a pool first, overlapping pool windows.
class Awkward : public Model {
 public:
  Awkward() {
    add<MaxPool2d>(2);
    add<Relu>();
    add<Conv2d>(0, 9, 3, 2, 1);
    add<Conv2d>(0, 11, 2, 1, 0);
    add<Conv2d>(0, 4, 3, 1, 1);
    add<MaxPool2d>(3, 2);
    add<Flatten>();
    add<Linear>(0, 32);
    add<Linear>(0, 10);
  }
};

std::unique_ptr<Model> built(const std::function<std::unique_ptr<Model>()>& make) {
  auto m = make();
  REQUIRE(m->build({1, 28, 28}, 3).has_value());
  return m;
}

}  // namespace

TEST_CASE("cuda conv2d, max_pool2d and linear agree with the reference", "[cuda][conv2d][pool][linear]") {
  auto cuda = cuda_or_skip();
  if (!cuda) return;
  auto ref = make_ref_backend();
  // compute.deterministic = false: cuDNN's fastest measured algorithms, atomics included
  auto fastest = std::move(make_cuda_backend(0, false).value());
  for (Backend* backend : {cuda.get(), fastest.get()})
  for (const Conv2dGeometry& g : {Conv2dGeometry{8, 1, 28, 28, 20, 5, 5, 1, 0}, Conv2dGeometry{8, 20, 12, 12, 50, 5, 5, 1, 0},
                                 Conv2dGeometry{3, 3, 9, 7, 5, 3, 3, 2, 1}}) {
    CAPTURE(backend->describe(), g.c, g.k, g.stride, g.pad);
    auto a = backend->make_conv2d(g);
    auto b = ref->make_conv2d(g);
    const Tensor x = random_tensor(g.input(), 1), w = random_tensor(g.weight(), 2), bias = random_tensor({g.k}, 3),
                 dy = random_tensor(g.output(), 4);
    Tensor y1(g.output()), y2(g.output()), dx1(g.input()), dx2(g.input()), dw1(g.weight()), dw2(g.weight()),
        db1({g.k}), db2({g.k});
    a->forward(x, w, bias, y1);
    b->forward(x, w, bias, y2);
    require_close(y1, y2);
    a->backward_data(dy, w, dx1);
    b->backward_data(dy, w, dx2);
    require_close(dx1, dx2);
    a->backward_weights(x, dy, dw1, db1);
    b->backward_weights(x, dy, dw2, db2);
    require_close(dw1, dw2);
    require_close(db1, db2);
  }
  for (const Pool2dGeometry& g : {Pool2dGeometry{4, 20, 24, 24, 2, 2}, Pool2dGeometry{2, 3, 7, 9, 3, 2}}) {
    auto a = cuda->make_max_pool2d(g);
    auto b = ref->make_max_pool2d(g);
    const Tensor x = random_tensor(g.input(), 5), dy = random_tensor(g.output(), 6);
    Tensor y1(g.output()), y2(g.output()), dx1(g.input()), dx2(g.input());
    a->forward(x, y1);
    b->forward(x, y2);
    require_close(y1, y2, 0.0);
    a->backward(dy, dx1);
    b->backward(dy, dx2);
    require_close(dx1, dx2, 1e-6);  // overlapping windows add up to 4 terms
  }
  for (const LinearGeometry& g : {LinearGeometry{16, 800, 500}, LinearGeometry{7, 13, 3}}) {
    auto a = cuda->make_linear(g);
    auto b = ref->make_linear(g);
    const Tensor x = random_tensor({g.n, g.in}, 7), w = random_tensor({g.out, g.in}, 8), bias = random_tensor({g.out}, 9),
                 dy = random_tensor({g.n, g.out}, 10);
    Tensor y1({g.n, g.out}), y2(y1.shape()), dx1({g.n, g.in}), dx2(dx1.shape()), dw1({g.out, g.in}), dw2(dw1.shape()),
        db1({g.out}), db2({g.out});
    a->forward(x, w, bias, y1);
    b->forward(x, w, bias, y2);
    require_close(y1, y2);
    a->backward_data(dy, w, dx1);
    b->backward_data(dy, w, dx2);
    require_close(dx1, dx2);
    a->backward_weights(x, dy, dw1, db1);
    b->backward_weights(x, dy, dw2, db2);
    require_close(dw1, dw2);
    require_close(db1, db2);
  }
}

TEST_CASE("cuda relu, max_pool2d and the loss keep NaN as the reference does", "[cuda][nan]") {
  auto cuda = cuda_or_skip();
  if (!cuda) return;
  auto ref = make_ref_backend();
  Tensor x = random_tensor({2, 3, 6, 6}, 13);
  x[7] = x[8] = NAN;
  for (int64_t i = 36; i < 40; ++i) x[i] = NAN;
  Tensor y1(x.shape()), y2(x.shape());
  cuda->relu_forward(x, y1);
  ref->relu_forward(x, y2);
  require_close(y1, y2, 0.0);
  CHECK(std::isnan(y1[7]));
  for (const Pool2dGeometry& g : {Pool2dGeometry{2, 3, 6, 6, 2, 2}, Pool2dGeometry{2, 3, 6, 6, 3, 1}}) {
    auto a = cuda->make_max_pool2d(g);
    auto b = ref->make_max_pool2d(g);
    Tensor p1(g.output()), p2(g.output()), dy = random_tensor(g.output(), 2), dx1(g.input()), dx2(g.input());
    a->forward(x, p1);
    b->forward(x, p2);
    require_close(p1, p2, 0.0);
    CHECK(std::isnan(p1[0]));
    a->backward(dy, dx1);
    b->backward(dy, dx2);
    require_close(dx1, dx2, 1e-6);  // the gradient goes to the first NaN, as in the reference
  }
  Tensor logits = random_tensor({3, 10}, 14);
  logits[14] = NAN;
  const std::vector<int32_t> labels{1, 2, 3};
  Tensor q1({3, 10}), q2({3, 10});
  CHECK(std::isnan(cuda->softmax_cross_entropy_forward(logits, labels, q1).value()));
  CHECK(std::isnan(ref->softmax_cross_entropy_forward(logits, labels, q2).value()));
  require_close(q1, q2, 1e-6);

  const Tensor z = random_tensor({16, 10}, 11);
  std::vector<int32_t> l16(16);
  for (size_t i = 0; i < l16.size(); ++i) l16[i] = static_cast<int32_t>((i * 7) % 10);
  Tensor p1({16, 10}), p2({16, 10}), g1({16, 10}), g2({16, 10});
  const float loss1 = cuda->softmax_cross_entropy_forward(z, l16, p1).value();
  const float loss2 = ref->softmax_cross_entropy_forward(z, l16, p2).value();
  CHECK(loss1 == Approx(loss2).epsilon(1e-6));
  require_close(p1, p2, 1e-6);
  REQUIRE(cuda->softmax_cross_entropy_backward(p1, l16, g1).has_value());
  REQUIRE(ref->softmax_cross_entropy_backward(p2, l16, g2).has_value());
  require_close(g1, g2, 1e-6);
  // the labels are checked before any kernel runs, as on every backend
  const std::vector<int32_t> bad{1, 10, 3};
  const auto refused = cuda->softmax_cross_entropy_forward(logits, bad, q1);
  REQUIRE_FALSE(refused.has_value());
  CHECK_THAT(refused.error().message, Catch::Contains("label 10 at index 1"));
}

TEST_CASE("training on cuda, state on the device, follows the reference step for step: loss, gradient, parameters",
          "[cuda][model][resident]") {
  auto cuda = cuda_or_skip();
  if (!cuda) return;
  auto ref = make_ref_backend();
  const std::function<std::unique_ptr<Model>()> makes[] = {
      make_lenet, [] { return make_mlp(); }, [] { return std::unique_ptr<Model>(new Awkward()); }};
  // SGD: Adam's normalised step would turn a rounding-size gradient's sign into a whole lr step
  // (its bitwise agreement with the host is the next test's).
  for (const char* optimizer : {"sgd"}) {
    for (size_t m = 0; m < std::size(makes); ++m) {
      CAPTURE(optimizer, m);
      // on_device: the state on the device; host_level: the model's host buffers, each step through
      // the cuda plan's host-level forward and backward (what a cluster worker runs today)
      auto on_device = built(makes[m]), on_host = built(makes[m]), host_level = built(makes[m]);
      OptimizerOptions o;
      o.name = optimizer;
      auto a = std::move(make_resident(*on_device, *cuda, o).value());
      auto b = std::move(make_resident(*on_host, *ref, o).value());
      auto c = std::move(make_optimizer(o, host_level->parameters().size()).value());
      LossScratch scratch;
      CHECK_THAT(a->where(), Catch::Contains("cuda:0"));
      Rng r(5);
      for (int step = 0; step < 3; ++step) {
        const int64_t batch = step == 2 ? 7 : 16;  // an odd last batch: another plan
        Tensor x({batch, 1, 28, 28});
        for (float& v : x.span()) v = r.uniform();
        std::vector<int32_t> y(static_cast<size_t>(batch));
        for (auto& l : y) l = static_cast<int32_t>(r.below(10));
        const float l1 = a->compute_gradients(x, y).value();
        const float l2 = b->compute_gradients(x, y).value();
        CHECK(l1 == Approx(l2).epsilon(1e-4));
        CHECK(a->gradient_finite());
        a->pull_gradients();
        require_close(copy_of(on_device->gradients()), copy_of(on_host->gradients()));
        const float l3 = try_compute_gradients(*host_level, *cuda, x, y, scratch).value();
        CHECK(l3 == Approx(l2).epsilon(1e-4));
        require_close(copy_of(host_level->gradients()), copy_of(on_host->gradients()));
        a->step(0.01f);
        b->step(0.01f);
        c->step(host_level->parameters(), host_level->gradients(), 0.01f);
      }
      a->pull_parameters();
      require_close(copy_of(on_device->parameters()), copy_of(on_host->parameters()), 1e-4);
      require_close(copy_of(host_level->parameters()), copy_of(on_host->parameters()), 1e-4);
      CHECK(a->optimizer().steps() == 3);
      // evaluation through the model's host-level plan sees the pulled parameters
      Tensor x = random_tensor({5, 1, 28, 28}, 9);
      const ConstTensorView z1 = on_device->forward(*cuda, x, false).value();
      const Tensor got = copy_of(z1.span());
      const ConstTensorView z2 = on_host->forward(*ref, x, false).value();
      require_close(got, copy_of(z2.span()));
    }
  }
}

TEST_CASE("the cuda optimisers update bit for bit as the host's do, so CPU and GPU replicas stay identical",
          "[cuda][optimizer]") {
  auto cuda = cuda_or_skip();
  if (!cuda) return;
  OptimizerOptions sgd, nesterov, plain, adam, adamw;
  nesterov.nesterov = true;
  nesterov.weight_decay = 1e-4f;
  plain.momentum = 0.0f;
  adam.name = "adam";
  adam.weight_decay = 1e-3f;
  adamw.name = "adamw";
  adamw.weight_decay = 1e-2f;
  for (const OptimizerOptions& o : {sgd, nesterov, plain, adam, adamw}) {
    CAPTURE(o.name, o.momentum, o.nesterov);
    auto model = built(make_lenet);
    auto resident = std::move(make_resident(*model, *cuda, o).value());
    auto host = std::move(make_optimizer(o, model->parameters().size()).value());
    std::vector<float> params(model->parameters().begin(), model->parameters().end());
    Rng r(17);
    for (int step = 0; step < 5; ++step) {
      std::vector<float> grads(params.size());
      for (float& g : grads) g = r.uniform(-0.1f, 0.1f);
      std::copy(grads.begin(), grads.end(), model->gradients().begin());
      resident->push_gradients();
      resident->step(0.05f);
      host->step(params, grads, 0.05f);
    }
    resident->pull_parameters();
    CHECK(std::memcmp(params.data(), model->parameters().data(), params.size() * sizeof(float)) == 0);
    // what a checkpoint saves: the optimiser's state, pulled, is the host optimiser's bit for bit
    resident->pull_optimizer();
    const auto state = resident->optimizer().state();
    const auto want = host->state();
    REQUIRE(state.size() == want.size());
    for (size_t k = 0; k < state.size(); ++k)
      CHECK(std::memcmp(state[k].second.data(), want[k].second.data(), want[k].second.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("the cuda backend refuses what it cannot run on the device, and a device it does not have",
          "[cuda][errors]") {
  auto cuda = cuda_or_skip();
  if (!cuda) return;
  class WithDropout : public Model {
   public:
    WithDropout() {
      add<Flatten>();
      add<Dropout>(0.5f);
      add<Linear>(0, 10);
    }
  };
  auto model = built([] { return std::unique_ptr<Model>(new WithDropout()); });
  const auto refused = make_resident(*model, *cuda, {});
  REQUIRE_FALSE(refused.has_value());
  CHECK_THAT(refused.error().message, Catch::Contains("layer 2 ('dropout1')"));
  CHECK_FALSE(cuda->check_layers(model->planned_layers(4)).has_value());
  const auto missing = make_cuda_backend(99);
  REQUIRE_FALSE(missing.has_value());
  CHECK_THAT(missing.error().message, Catch::Contains("compute.device 99"));
}

TEST_CASE("nccl: a one-rank communicator sums, is aborted, and a new one is built for the next generation",
          "[cuda][nccl]") {
  auto cuda = cuda_or_skip();
  if (!cuda) return;
  using cuda::NcclGroup;
  using namespace std::chrono_literals;
  for (int generation = 0; generation < 2; ++generation) {
    auto group = std::move(NcclGroup::join(NcclGroup::new_id().value(), 1, 0, 0).value());
    REQUIRE(group->wait(30s).has_value());
    std::vector<float> host(1000);
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f + static_cast<float>(generation);
    float* device = nullptr;
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&device), host.size() * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMemcpy(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(group->all_reduce_sum(device, host.size()).has_value());
    REQUIRE(group->wait(30s).has_value());
    std::vector<float> back(host.size());
    REQUIRE(cudaMemcpy(back.data(), device, back.size() * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    cudaFree(device);
    CHECK(back == host);  // the sum over one rank
    group->abort();       // the generation changes
    CHECK(group->poll() == NcclGroup::State::aborted);
    CHECK_FALSE(group->all_reduce_sum(nullptr, 1).has_value());
  }
}

TEST_CASE("nccl: a peer that never comes does not hang the survivor: the wait runs out and aborts",
          "[cuda][nccl]") {
  auto cuda = cuda_or_skip();
  if (!cuda) return;
  using cuda::NcclGroup;
  using namespace std::chrono_literals;
  // rank 1 of 2 never joins, as when it died between the generation's start and NCCL's bootstrap
  auto group = std::move(NcclGroup::join(NcclGroup::new_id().value(), 2, 0, 0).value());
  const auto t0 = std::chrono::steady_clock::now();
  const auto waited = group->wait(2s);
  const auto took = std::chrono::steady_clock::now() - t0;
  REQUIRE_FALSE(waited.has_value());
  CHECK_THAT(waited.error().message, Catch::Contains("no progress"));
  CHECK(took < 20s);  // the abort itself returned promptly
  CHECK(group->poll() == NcclGroup::State::aborted);
  // and the device is usable for the next generation's communicator
  auto next = std::move(NcclGroup::join(NcclGroup::new_id().value(), 1, 0, 0).value());
  CHECK(next->wait(30s).has_value());
}

TEST_CASE("cuBLAS is opened at run time, not linked, and has every function the backend calls", "[cuda][cublas]") {
  // No device needed: this is the build's and the machine's libraries. Linked, libcublas would
  // cost every tepdist process 0.34 s and 218 MB at start (cublas.hpp).
  const auto api = tepdist::compute::cuda::cublas();
  REQUIRE(api.has_value());
  CHECK((*api)->sgemm != nullptr);
  CHECK(std::string((*api)->status_string(CUBLAS_STATUS_NOT_INITIALIZED)).find("not initialized") != std::string::npos);
}

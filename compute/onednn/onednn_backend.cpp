// oneDNN kernels. Shape contracts are those of compute/ref (see the files there); what differs is
// how the work is done, not what it computes.

#include "compute/onednn/onednn_backend.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <oneapi/dnnl/dnnl.hpp>

#include "compute/onednn/common.hpp"
#include "compute/onednn/network_plan.hpp"
#include "compute/onednn/signals.hpp"
#include "compute/ref/ref_backend.hpp"

namespace tepdist::compute {
namespace onednn {
namespace {

using dnnl::algorithm;
using dnnl::prop_kind;

/// A kernel with weights and a bias (convolution, inner product): forward, data gradient and
/// weight gradient, each primitive seeing the caller's plain buffers in the layout it prefers. The
/// two kinds differ only in how they describe their primitives; the derived constructors do that
/// and hand the descriptors to wire().
template <class Interface>
class Weighted : public Interface {
 public:
  void forward(ConstTensorView x, ConstTensorView w, ConstTensorView b, TensorView y) override {
    const SignalsHeld held;  // see signals.hpp
    auto& s = ctx_.stream;
    fwd_.execute(s, {{DNNL_ARG_SRC, x_.in(s, x.data)},
                     {DNNL_ARG_WEIGHTS, w_.in(s, w.data)},
                     {DNNL_ARG_BIAS, b_.in(s, b.data)},
                     {DNNL_ARG_DST, y_.out(y.data)}});
    y_.finish(s);
    s.wait();
  }

  void backward_data(ConstTensorView dy, ConstTensorView w, TensorView dx) override {
    const SignalsHeld held;  // see signals.hpp
    auto& s = ctx_.stream;
    bwd_data_.execute(s, {{DNNL_ARG_DIFF_DST, bd_dy_.in(s, dy.data)},
                          {DNNL_ARG_WEIGHTS, bd_w_.in(s, w.data)},
                          {DNNL_ARG_DIFF_SRC, bd_dx_.out(dx.data)}});
    bd_dx_.finish(s);
    s.wait();
  }

  void backward_weights(ConstTensorView x, ConstTensorView dy, TensorView dw, TensorView db) override {
    const SignalsHeld held;  // see signals.hpp
    auto& s = ctx_.stream;
    bwd_weights_.execute(s, {{DNNL_ARG_SRC, bw_x_.in(s, x.data)},
                             {DNNL_ARG_DIFF_DST, bw_dy_.in(s, dy.data)},
                             {DNNL_ARG_DIFF_WEIGHTS, bw_dw_.out(dw.data)},
                             {DNNL_ARG_DIFF_BIAS, bw_db_.out(db.data)}});
    bw_dw_.finish(s);
    bw_db_.finish(s);
    s.wait();
  }

 protected:
  explicit Weighted(Context& ctx) : ctx_(ctx) {}

  /// Creates the primitives and the operands between them and the plain src, weights, bias and
  /// dst buffers.
  template <class Fwd, class Bwd, class Bww>
  void wire(const md& src, const md& wei, const md& bias, const md& dst, const Fwd& fwd, const Bwd& bwd,
            const Bww& bww) {
    const auto& e = ctx_.engine;
    fwd_ = dnnl::primitive(fwd);
    bwd_data_ = dnnl::primitive(bwd);
    bwd_weights_ = dnnl::primitive(bww);
    x_ = Operand(e, src, fwd.src_desc());
    w_ = Operand(e, wei, fwd.weights_desc());
    b_ = Operand(e, bias, bias);
    y_ = Operand(e, dst, fwd.dst_desc());
    bd_dy_ = Operand(e, dst, bwd.diff_dst_desc());
    bd_w_ = Operand(e, wei, bwd.weights_desc());
    bd_dx_ = Operand(e, src, bwd.diff_src_desc());
    bw_x_ = Operand(e, src, bww.src_desc());
    bw_dy_ = Operand(e, dst, bww.diff_dst_desc());
    bw_dw_ = Operand(e, wei, bww.diff_weights_desc());
    bw_db_ = Operand(e, bias, bias);
  }

 private:
  Context& ctx_;
  dnnl::primitive fwd_, bwd_data_, bwd_weights_;
  Operand x_, w_, b_, y_, bd_dy_, bd_w_, bd_dx_, bw_x_, bw_dy_, bw_dw_, bw_db_;
};

class Conv2d final : public Weighted<Conv2dKernel> {
 public:
  Conv2d(Context& ctx, const Conv2dGeometry& g) : Weighted(ctx) {
    const dnnl::memory::dims src{g.n, g.c, g.h, g.w}, wei{g.k, g.c, g.r, g.s}, bias{g.k},
        dst{g.n, g.k, g.oh(), g.ow()}, stride{g.stride, g.stride}, pad{g.pad, g.pad};
    const md bias_md = plain(bias, tag::x);
    const auto direct = algorithm::convolution_direct;
    const dnnl::convolution_forward::primitive_desc fwd(
        {prop_kind::forward_training, direct, any(src), any(wei), bias_md, any(dst), stride, pad, pad}, ctx.engine);
    const dnnl::convolution_backward_data::primitive_desc bwd(
        {direct, any(src), any(wei), any(dst), stride, pad, pad}, ctx.engine, fwd);
    const dnnl::convolution_backward_weights::primitive_desc bww(
        {direct, any(src), any(wei), bias_md, any(dst), stride, pad, pad}, ctx.engine, fwd);
    wire(plain(src, tag::nchw), plain(wei, tag::oihw), bias_md, plain(dst, tag::nchw), fwd, bwd, bww);
  }
};

class Linear final : public Weighted<LinearKernel> {
 public:
  Linear(Context& ctx, const LinearGeometry& g) : Weighted(ctx) {
    const dnnl::memory::dims src{g.n, g.in}, wei{g.out, g.in}, bias{g.out}, dst{g.n, g.out};
    const md src_md = plain(src, tag::nc), bias_md = plain(bias, tag::x), dst_md = plain(dst, tag::nc);
    const dnnl::inner_product_forward::primitive_desc fwd(
        {prop_kind::forward_training, src_md, any(wei), bias_md, dst_md}, ctx.engine);
    const dnnl::inner_product_backward_data::primitive_desc bwd({src_md, any(wei), dst_md}, ctx.engine, fwd);
    const dnnl::inner_product_backward_weights::primitive_desc bww({src_md, any(wei), bias_md, dst_md}, ctx.engine,
                                                                   fwd);
    wire(src_md, plain(wei, tag::oi), bias_md, dst_md, fwd, bwd, bww);
  }
};

// Written so that GCC vectorises them (a compare and a mask: cmpltps, andnps or andps); with
// std::max, or with dy loaded under the condition, it left them scalar.
void relu_range(const float* x, float* y, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const float v = x[i];
    y[i] = v < 0.0f ? 0.0f : v;  // NaN < 0 is false: a NaN stays NaN
  }
}

void relu_backward_range(const float* y, const float* dy, float* dx, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const float d = dy[i];
    dx[i] = y[i] > 0.0f ? d : 0.0f;
  }
}

/// Runs fn over [0, n) in one piece per thread, or in one piece here when n is small: entering a
/// parallel region, even one its `if` keeps on one thread, took 16 us here, 6x the ReLU of the
/// 16,384 floats of an MLP's hidden layer at batch 64.
template <class Fn>
void in_pieces(int64_t n, Fn fn) {
  if (n <= (int64_t{1} << 16)) return fn(int64_t{0}, n);
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    fn(n * t / threads, n * (t + 1) / threads);
  }
}

}  // namespace

void relu(const float* x, float* y, int64_t n) {
  in_pieces(n, [&](int64_t begin, int64_t end) { relu_range(x, y, begin, end); });
}

void relu_backward(const float* y, const float* dy, float* dx, int64_t n) {
  in_pieces(n, [&](int64_t begin, int64_t end) { relu_backward_range(y, dy, dx, begin, end); });
}

namespace {

const char* isa_name(dnnl::cpu_isa isa) {
  using I = dnnl::cpu_isa;
  switch (isa) {
    case I::sse41: return "sse41";
    case I::avx: return "avx";
    case I::avx2: return "avx2";
    case I::avx2_vnni: return "avx2_vnni";
    case I::avx512_mic: return "avx512_mic";
    case I::avx512_mic_4ops: return "avx512_mic_4ops";
    case I::avx512_core: return "avx512_core";
    case I::avx512_core_vnni: return "avx512_core_vnni";
    case I::avx512_core_bf16: return "avx512_core_bf16";
    case I::avx512_core_amx: return "avx512_core_amx";
    case I::all: break;
  }
  return "unknown";
}

}  // namespace

class OnednnBackend final : public Backend {
 public:
  std::string_view name() const override { return "onednn"; }
  std::string describe() const override {
    const dnnl_version_t* v = dnnl_version();
    return fmt::format("onednn (oneDNN {}.{}.{}, ISA {})", v->major, v->minor, v->patch,
                       isa_name(dnnl::get_effective_cpu_isa()));
  }
  void set_threads(int threads) override { omp_set_num_threads(threads > 0 ? threads : omp_get_num_procs()); }
  int threads_here() const override { return omp_get_max_threads(); }

  std::unique_ptr<Conv2dKernel> make_conv2d(const Conv2dGeometry& g) override { return std::make_unique<Conv2d>(ctx_, g); }
  /// The reference's kernel: oneDNN 2.6's max pooling drops NaN (a window holding one gives its
  /// largest other value, a window of NaN the lowest float, -3.4e38), and on plain NCHW it runs
  /// its generic code, about 3x slower forward than the reference's loop (bench/layers_bench pool).
  std::unique_ptr<MaxPool2dKernel> make_max_pool2d(const Pool2dGeometry& g) override { return ref::make_max_pool2d(g); }
  std::unique_ptr<LinearKernel> make_linear(const LinearGeometry& g) override { return std::make_unique<Linear>(ctx_, g); }
  std::unique_ptr<NetworkPlan> plan_network(std::span<const PlannedLayer> layers) override {
    return onednn::plan_network(ctx_, layers);
  }

  void relu_forward(ConstTensorView x, TensorView y) override { relu(x.data, y.data, x.elements()); }
  void relu_backward(ConstTensorView y, ConstTensorView dy, TensorView dx) override {
    onednn::relu_backward(y.data, dy.data, dx.data, y.elements());
  }

 private:
  float do_softmax_cross_entropy_forward(ConstTensorView logits, std::span<const int32_t> labels,
                                         TensorView probs) override;
  void do_softmax_cross_entropy_backward(ConstTensorView probs, std::span<const int32_t> labels,
                                         TensorView dlogits) override;

  Context ctx_;
};

float OnednnBackend::do_softmax_cross_entropy_forward(ConstTensorView logits, std::span<const int32_t> labels,
                                                      TensorView probs) {
  // [n, classes] with classes ~10: too small for a primitive to pay off; a float loop over a row
  // with the max subtracted is as accurate as the reference's double one to ~1e-6 relative.
  const int64_t n = logits.shape[0], classes = logits.elements() / n;
  double loss = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float* z = logits.data + i * classes;
    float* p = probs.data + i * classes;
    const float zmax = *std::max_element(z, z + classes);
    float sum = 0.0f;
    for (int64_t j = 0; j < classes; ++j) sum += p[j] = std::exp(z[j] - zmax);
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < classes; ++j) p[j] *= inv;
    loss += static_cast<double>(std::log(sum) - (z[labels[static_cast<size_t>(i)]] - zmax));
  }
  return static_cast<float>(loss / static_cast<double>(n));
}

void OnednnBackend::do_softmax_cross_entropy_backward(ConstTensorView probs, std::span<const int32_t> labels,
                                                      TensorView dlogits) {
  const int64_t n = probs.shape[0], classes = probs.elements() / n;
  const float inv_n = 1.0f / static_cast<float>(n);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < classes; ++j) dlogits.data[i * classes + j] = probs.data[i * classes + j] * inv_n;
    dlogits.data[i * classes + labels[static_cast<size_t>(i)]] -= inv_n;
  }
}

}  // namespace onednn

std::unique_ptr<Backend> make_onednn_backend() { return std::make_unique<onednn::OnednnBackend>(); }

}  // namespace tepdist::compute

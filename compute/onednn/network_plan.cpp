// A whole network on oneDNN with activations kept in the layouts the primitives choose (blocked,
// nChw8c and the like, on AVX2) from the first convolution to the logits. Per layer the kernels of
// onednn_backend.cpp would reorder to plain NCHW and back at every boundary, and oneDNN's pooling on
// plain NCHW is its slow generic code; here reorders happen only where two primitives disagree, and
// around a max pool our direct kernel cannot take (PoolStage).
//
// Fusions (all exact, tested against the reference):
//   conv2d, relu             -> conv2d, then a ReLU in place on its output
//   conv2d, max_pool2d, relu -> conv2d, max_pool2d, then a ReLU in place on the pooled output
//   linear, relu             -> inner product, then a ReLU in place on its output
//   flatten, linear          -> inner product on the 4-D activation (its weights [out, c, h, w] are
//                               the plain [out, c*h*w] matrix, so the parameter layout is unchanged)
// The ReLU is ours (common.hpp), never oneDNN's post-op or primitive: its forward computes
// vmaxps(x, 0), which turns a NaN into 0 where the reference keeps it (backend.hpp), and its
// backward multiplies by the mask where the reference selects. A fused ReLU is differentiated from
// the stage's output, in place on its gradient.

#include "compute/onednn/network_plan.hpp"
#include "compute/onednn/blocked_pool.hpp"
#include "compute/onednn/conv_backward_data.hpp"
#include "compute/onednn/conv_backward_weights.hpp"
#include "compute/onednn/first_conv.hpp"
#include "compute/onednn/signals.hpp"
#include "compute/ref/ref_backend.hpp"

#include <fmt/format.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>
#include "base/check.hpp"

namespace tepdist::compute::onednn {
namespace {

using dnnl::algorithm;
using dnnl::prop_kind;

/// A memory's floats, for the plans' own kernels.
float* data(const dnnl::memory& m) { return static_cast<float*>(m.get_data_handle()); }
/// How many floats a memory holds, the padding of blocked layouts included.
int64_t floats(const dnnl::memory& m) { return static_cast<int64_t>(m.get_desc().get_size() / sizeof(float)); }

/// A value between two stages and its gradient, in one layout.
struct Activation {
  dnnl::memory value;
  dnnl::memory grad;  // empty for the network's input
};

/// A stage's view of its input in the layout its primitive wants. When that is the producer's
/// layout, the stage reads the producer's value and writes its gradient directly; otherwise the
/// adapter keeps buffers of its own and reorders both ways.
class Adapter {
 public:
  Adapter(Context& ctx, Activation& from, const md& want) : from_(from) {
    if (want == from.value.get_desc()) return;
    own_value_ = dnnl::memory(want, ctx.engine);
    to_own_ = dnnl::reorder(from.value, own_value_);
    if (from.grad) {
      own_grad_ = dnnl::memory(want, ctx.engine);
      to_from_ = dnnl::reorder(own_grad_, from.grad);
    }
  }
  bool converts() const { return static_cast<bool>(own_value_); }

  /// Brings the value into the wanted layout; call once per forward, before value().
  void prepare(dnnl::stream& s) {
    if (converts()) to_own_.execute(s, from_.value, own_value_);
  }
  const dnnl::memory& value() const { return converts() ? own_value_ : from_.value; }
  /// Where the stage writes the gradient of its input.
  const dnnl::memory& grad() const { return converts() ? own_grad_ : from_.grad; }
  /// Hands that gradient back to the producer; call after writing grad().
  void deliver_grad(dnnl::stream& s) {
    if (converts()) to_from_.execute(s, own_grad_, from_.grad);
  }

 private:
  Activation& from_;
  dnnl::memory own_value_, own_grad_;
  dnnl::reorder to_own_, to_from_;
};

/// One of our memories as a primitive argument that may want another layout: the memory itself
/// when the layouts agree, else a buffer in the wanted layout and the reorders to and from it.
/// Backward primitives are created with free layouts (a fixed one can send oneDNN to its slow
/// reference code: conv1's weight gradient took 590 ms a step that way) and bridged like this.
class Bridge {
 public:
  Bridge(Context& ctx, const dnnl::memory& ours, const md& theirs) : ours_(ours) {
    if (theirs == ours.get_desc()) return;
    theirs_ = dnnl::memory(theirs, ctx.engine);
    to_theirs_ = dnnl::reorder(ours_, theirs_);
    to_ours_ = dnnl::reorder(theirs_, ours_);
  }
  /// For an input: our data, in their layout.
  const dnnl::memory& in(dnnl::stream& s) {
    if (!theirs_) return ours_;
    to_theirs_.execute(s, ours_, theirs_);
    return theirs_;
  }
  /// For an output: where the primitive writes; then deliver().
  const dnnl::memory& out() const { return theirs_ ? theirs_ : ours_; }
  void deliver(dnnl::stream& s) {
    if (theirs_) to_ours_.execute(s, theirs_, ours_);
  }

 private:
  dnnl::memory ours_, theirs_;
  dnnl::reorder to_theirs_, to_ours_;
};

/// A plain parameter (or gradient) slice of the flat buffer seen in a primitive's layout.
class Weights {
 public:
  Weights(Context& ctx, const md& plain_md, const md& want) : op_(ctx.engine, plain_md, want) {}
  const dnnl::memory& in(dnnl::stream& s, const float* data) { return op_.in(s, data); }
  const dnnl::memory& out(float* data) { return op_.out(data); }
  void finish(dnnl::stream& s) { op_.finish(s); }

 private:
  Operand op_;
};

/// A memory's layout by its oneDNN tag name where it is one of those the plan meets, else
/// "blocked" (a layout of the primitive's own).
std::string layout_name(const md& d) {
  static constexpr std::pair<tag, const char*> known[] = {
      {tag::nchw, "nchw"},       {tag::nhwc, "nhwc"}, {tag::nChw8c, "nChw8c"},
      {tag::nChw16c, "nChw16c"}, {tag::ncw, "ncw"},   {tag::nc, "nc"},
      {tag::oihw, "oihw"},       {tag::oiw, "oiw"},   {tag::oi, "oi"}};
  for (const auto& [t, name] : known)
    if (d == md(d.dims(), dt::f32, t, /*allow_empty=*/true)) return name;  // a tag of another rank: empty
  return "blocked";
}

/// A layer's parameters in the flat buffers.
struct ParamRange {
  size_t begin, end;
};
ParamRange range_of(const PlannedLayer& l) {
  TEPDIST_CHECK(0 <= l.params_begin && l.params_begin < l.params_end);
  return {static_cast<size_t>(l.params_begin), static_cast<size_t>(l.params_end)};
}

class Stage {
 public:
  virtual ~Stage() = default;
  virtual void forward(dnnl::stream& s, const float* params) = 0;
  /// Writes the stage's parameter gradients, if it has any, into grads and tells `ready` of them
  /// (see GradientsReady) before it goes on to its input gradient.
  virtual void backward(dnnl::stream& s, const float* params, float* grads, const GradientsReady& ready) = 0;
  /// What runs this stage, forward and backward, and the layout of its output.
  virtual std::string path() const = 0;
  Activation out;

 protected:
  void allocate_output(Context& ctx, const md& d) {
    out.value = dnnl::memory(d, ctx.engine);
    out.grad = dnnl::memory(d, ctx.engine);
  }
};

/// Differentiates a ReLU from its output a.value, in place on a.grad: dy where y > 0, else 0, as
/// in the reference. oneDNN's (eltwise_relu_use_dst_for_bwd) multiplies dy by the mask instead, so
/// it passes a NaN dy where y is 0, and a dy where y is NaN, both of which the reference stops.
void relu_from_output(dnnl::stream& s, Activation& a) {
  s.wait();  // the primitives that wrote a.grad have finished
  relu_backward(data(a.value), data(a.grad), data(a.grad), floats(a.grad));
}

/// A layer with weights and a bias (convolution, inner product): forward with an optional ReLU on
/// its output, weight and bias gradients, and the input gradient unless it is the first layer. The two
/// kinds differ only in how their primitives are described; the derived constructors do that and
/// hand the descriptors to wire().
class WeightedStage : public Stage {
 public:
  void forward(dnnl::stream& s, const float* params) override {
    src_->prepare(s);
    bias_.set_data_handle(const_cast<float*>(params + b_off_));
    fwd_.execute(s, {{DNNL_ARG_SRC, src_->value()},
                     {DNNL_ARG_WEIGHTS, w_->in(s, params + w_off_)},
                     {DNNL_ARG_BIAS, bias_},
                     {DNNL_ARG_DST, out.value}});
    if (relu_) {
      s.wait();
      relu(data(out.value), data(out.value), floats(out.value));  // a blocked layout's padding: relu(0) = 0
    }
  }

  void backward(dnnl::stream& s, const float* params, float* grads, const GradientsReady& ready) override {
    if (relu_) relu_from_output(s, out);
    if (direct_bww_) {
      s.wait();  // out.grad is written
      direct_bww_->run(data(src_->value()), data(out.grad), grads + w_off_, grads + b_off_);
    } else {
      dbias_.set_data_handle(grads + b_off_);
      bww_.execute(s, {{DNNL_ARG_SRC, bww_src_->in(s)},
                       {DNNL_ARG_DIFF_DST, bww_dy_->in(s)},
                       {DNNL_ARG_DIFF_WEIGHTS, dw_->out(grads + w_off_)},
                       {DNNL_ARG_DIFF_BIAS, dbias_}});
      dw_->finish(s);
    }
    if (ready) {
      s.wait();  // the gradients are in the plain buffer
      ready(params_.begin, params_.end);
    }
    if (!input_grad_) return;
    if (direct_bwd_) {
      s.wait();
      direct_bwd_->run(data(out.grad), params + w_off_, data(src_->grad()));
      src_->deliver_grad(s);
      return;
    }
    bwd_.execute(s, {{DNNL_ARG_DIFF_DST, bwd_dy_->in(s)},
                     {DNNL_ARG_WEIGHTS, w_bwd_->in(s, params + w_off_)},
                     {DNNL_ARG_DIFF_SRC, bwd_dx_->out()}});
    bwd_dx_->deliver(s);
    src_->deliver_grad(s);
  }

 protected:
  WeightedStage(const PlannedLayer& l, bool input_grad)
      : w_off_(l.weight_offset), b_off_(l.bias_offset), params_(range_of(l)), input_grad_(input_grad) {}

  /// Creates the primitives and the memories and bridges between them and the plain buffers.
  /// bww_pd, when given, computes the weight gradient (else direct_bww_ does); bwd_pd the input
  /// gradient (else direct_bwd_ does, or nothing: the first layer).
  template <class Fwd, class Bww, class Bwd>
  void wire(Context& ctx, Activation& in, const md& wei_plain, const md& bias_md, bool relu, const Fwd& fwd_pd,
            const std::optional<Bww>& bww_pd, const std::optional<Bwd>& bwd_pd) {
    fwd_ = dnnl::primitive(fwd_pd);
    src_.emplace(ctx, in, fwd_pd.src_desc());
    allocate_output(ctx, fwd_pd.dst_desc());
    w_.emplace(ctx, wei_plain, fwd_pd.weights_desc());
    bias_ = dnnl::memory(bias_md, ctx.engine, DNNL_MEMORY_NONE);
    dbias_ = dnnl::memory(bias_md, ctx.engine, DNNL_MEMORY_NONE);
    if (bww_pd) {
      bww_ = dnnl::primitive(*bww_pd);
      bww_src_.emplace(ctx, src_->value(), bww_pd->src_desc());
      bww_dy_.emplace(ctx, out.grad, bww_pd->diff_dst_desc());
      dw_.emplace(ctx, wei_plain, bww_pd->diff_weights_desc());
    }
    if (bwd_pd) {
      bwd_ = dnnl::primitive(*bwd_pd);
      w_bwd_.emplace(ctx, wei_plain, bwd_pd->weights_desc());
      bwd_dy_.emplace(ctx, out.grad, bwd_pd->diff_dst_desc());
      bwd_dx_.emplace(ctx, src_->grad(), bwd_pd->diff_src_desc());
    }
    relu_ = relu;
  }

  /// "NAME: forward oneDNN (in L, out L), weight gradient ..., input gradient ...".
  std::string describe(const char* name) const {
    std::string p = fmt::format("{}: forward oneDNN (in {}, out {}{}), weight gradient {}", name,
                                layout_name(src_->value().get_desc()), layout_name(out.value.get_desc()),
                                relu_ ? ", ReLU ours" : "", direct_bww_ ? "direct" : "oneDNN");
    if (input_grad_) p += fmt::format(", input gradient {}", direct_bwd_ ? "direct" : "oneDNN");
    return p;
  }

  int64_t w_off_, b_off_;
  ParamRange params_;
  bool input_grad_;
  std::optional<ConvBackwardWeights> direct_bww_;  // a convolution's gradients by our own kernels
  std::optional<ConvBackwardData> direct_bwd_;

 private:
  dnnl::primitive fwd_, bww_, bwd_;
  std::optional<Adapter> src_;
  std::optional<Bridge> bww_src_, bww_dy_, bwd_dy_, bwd_dx_;
  std::optional<Weights> w_, w_bwd_, dw_;
  dnnl::memory bias_, dbias_;
  bool relu_ = false;
};

class ConvStage final : public WeightedStage {
 public:
  ConvStage(Context& ctx, const PlannedLayer& l, bool relu, Activation& in, bool input_grad)
      : WeightedStage(l, input_grad) {
    const Conv2dGeometry& g = l.conv;
    const dims src{g.n, g.c, g.h, g.w}, wei{g.k, g.c, g.r, g.s}, bias{g.k}, dst{g.n, g.k, g.oh(), g.ow()},
        stride{g.stride, g.stride}, pad{g.pad, g.pad};
    const md bias_md = plain(bias, tag::x);
    const auto direct = algorithm::convolution_direct;
    const auto fwd_pd = forward_pd(ctx, g, {src, wei, bias_md, dst, stride, pad});
    // The gradients by our kernels where both activations are nChw8c, else by oneDNN's.
    const bool blocked =
        fwd_pd.src_desc() == md(src, dt::f32, tag::nChw8c) && fwd_pd.dst_desc() == md(dst, dt::f32, tag::nChw8c);
    std::optional<dnnl::convolution_backward_weights::primitive_desc> bww_pd;
    if (blocked && ConvBackwardWeights::supports(g))
      direct_bww_.emplace(g);
    else
      bww_pd.emplace(dnnl::convolution_backward_weights::desc{direct, any(src), any(wei), bias_md, any(dst), stride,
                                                              pad, pad},
                     ctx.engine, fwd_pd);
    std::optional<dnnl::convolution_backward_data::primitive_desc> bwd_pd;
    if (input_grad && blocked && ConvBackwardData::supports(g))
      direct_bwd_.emplace(g);
    else if (input_grad)
      bwd_pd.emplace(dnnl::convolution_backward_data::desc{direct, any(src), any(wei), any(dst), stride, pad, pad},
                     ctx.engine, fwd_pd);
    wire(ctx, in, plain(wei, tag::oihw), bias_md, relu, fwd_pd, bww_pd, bwd_pd);
  }

  std::string path() const override { return describe("conv"); }

 private:
  /// The forward primitive. Where our direct kernels take the geometry it is asked for on nChw8c
  /// activations, the layout they are written for: oneDNN itself picks nChw8c on AVX2 but
  /// nChw16c on AVX-512, where its AVX2 kernel still takes nChw8c, and the direct gradients and
  /// pooling then ran nowhere (LeNet on a Zen 4, `tepdist train`: 6,000-6,700 samples/s with
  /// nChw16c, 10,700-11,100 with this). When oneDNN has no JIT kernel for nChw8c, the layout is
  /// its own choice.
  struct Shapes {
    dims src, wei;
    md bias;
    dims dst, stride, pad;
  };
  static dnnl::convolution_forward::primitive_desc forward_pd(Context& ctx, const Conv2dGeometry& g, const Shapes& x) {
    const auto make = [&](const md& src_md, const md& dst_md) {
      return dnnl::convolution_forward::primitive_desc({prop_kind::forward_training, algorithm::convolution_direct,
                                                        src_md, any(x.wei), x.bias, dst_md, x.stride, x.pad, x.pad},
                                                       ctx.engine);
    };
    if (ConvBackwardWeights::supports(g)) {
      try {
        auto pd = make(md(x.src, dt::f32, tag::nChw8c), md(x.dst, dt::f32, tag::nChw8c));
        if (std::string_view(pd.impl_info_str()).starts_with("jit")) return pd;
      } catch (const dnnl::error&) {
        // no implementation for nChw8c here
      }
    }
    return make(any(x.src), any(x.dst));
  }
};

/// A max pool, and the ReLU after it when `relu`. 2x2 windows on nChw8c run our direct kernel;
/// anything else the reference's on plain NCHW (the adapter reorders to it and back): oneDNN's
/// max pooling drops NaN (a window holding one gives its largest other value).
class PoolStage final : public Stage {
 public:
  PoolStage(Context& ctx, const PlannedLayer& l, bool relu, Activation& in, bool input_grad)
      : g_(l.pool), in_(in), relu_(relu), input_grad_(input_grad) {
    const dims src{g_.n, g_.c, g_.h, g_.w}, dst{g_.n, g_.c, g_.oh(), g_.ow()};
    if (in.value.get_desc() == md(src, dt::f32, tag::nChw8c) && BlockedMaxPool::supports(g_)) {
      direct_.emplace(g_);  // several times faster than oneDNN's pooling
      allocate_output(ctx, md(dst, dt::f32, tag::nChw8c));
      return;
    }
    plain_in_.emplace(ctx, in, plain(src, tag::nchw));
    ref_ = ref::make_max_pool2d(g_);
    allocate_output(ctx, plain(dst, tag::nchw));
  }

  void forward(dnnl::stream& s, const float*) override {
    if (direct_) {
      s.wait();
      direct_->forward(data(in_.value), data(out.value));
    } else {
      plain_in_->prepare(s);
      s.wait();
      ref_->forward({data(plain_in_->value()), g_.input()}, {data(out.value), g_.output()});
    }
    if (relu_) relu(data(out.value), data(out.value), floats(out.value));
  }

  void backward(dnnl::stream& s, const float*, float*, const GradientsReady&) override {
    if (!input_grad_) return;
    s.wait();  // the next stage's primitives have written out.grad
    if (relu_) relu_from_output(s, out);
    if (direct_) {
      direct_->backward(data(out.grad), data(in_.grad));
      return;
    }
    ref_->backward({data(out.grad), g_.output()}, {data(plain_in_->grad()), g_.input()});
    plain_in_->deliver_grad(s);
  }

  std::string path() const override {
    std::string how = direct_ ? "direct" : "reference";
    if (plain_in_ && plain_in_->converts())
      how += ", through reorders from and to " + layout_name(in_.value.get_desc());
    return fmt::format("max pool{}: {} (out {})", relu_ ? "+ReLU" : "", how, layout_name(out.value.get_desc()));
  }

 private:
  Pool2dGeometry g_;
  Activation& in_;
  bool relu_, input_grad_;
  std::optional<BlockedMaxPool> direct_;
  std::optional<Adapter> plain_in_;  // the reference's input and its gradient, plain NCHW
  std::unique_ptr<MaxPool2dKernel> ref_;
};

/// The first layer when it is a one-channel convolution followed by a 2x2 max pool and a ReLU:
/// one direct kernel (first_conv.hpp) instead of a convolution and a pooling primitive.
class FirstConvPoolStage final : public Stage {
 public:
  FirstConvPoolStage(Context& ctx, const PlannedLayer& conv, Activation& in)
      : in_(in), kernel_(conv.conv), w_off_(conv.weight_offset), b_off_(conv.bias_offset), params_(range_of(conv)) {
    const Conv2dGeometry& g = conv.conv;
    allocate_output(ctx, md({g.n, g.k, kernel_.pooled_h(), kernel_.pooled_w()}, dt::f32, tag::nChw8c));
  }

  void forward(dnnl::stream& s, const float* params) override {
    s.wait();
    kernel_.forward(input(), params + w_off_, params + b_off_, data(out.value));
  }

  void backward(dnnl::stream& s, const float*, float* grads, const GradientsReady& ready) override {
    s.wait();  // the next stage's primitives have written out.grad
    kernel_.backward(input(), data(out.value), data(out.grad), grads + w_off_, grads + b_off_);
    if (ready) ready(params_.begin, params_.end);
  }

  std::string path() const override {
    return fmt::format("conv+max pool+ReLU: direct (out {})", layout_name(out.value.get_desc()));
  }

 private:
  const float* input() const { return data(in_.value); }

  Activation& in_;
  FirstConvPool kernel_;
  int64_t w_off_, b_off_;
  ParamRange params_;
};

class ReluStage final : public Stage {
 public:
  ReluStage(Context& ctx, Activation& in, bool input_grad) : in_(in), input_grad_(input_grad) {
    allocate_output(ctx, in.value.get_desc());
  }

  void forward(dnnl::stream& s, const float*) override {
    s.wait();
    relu(data(in_.value), data(out.value), floats(out.value));
  }

  void backward(dnnl::stream& s, const float*, float*, const GradientsReady&) override {
    if (!input_grad_) return;
    s.wait();  // the next stage's primitives have written out.grad
    relu_backward(data(out.value), data(out.grad), data(in_.grad), floats(out.grad));  // one layout
  }

  std::string path() const override { return fmt::format("ReLU: ours (out {})", layout_name(out.value.get_desc())); }

 private:
  Activation& in_;
  bool input_grad_;
};

class LinearStage final : public WeightedStage {
 public:
  /// in may be 4-D (a flatten precedes): the inner product then reads it as [n, c*h*w].
  LinearStage(Context& ctx, const PlannedLayer& l, bool relu, Activation& in, bool input_grad)
      : WeightedStage(l, input_grad) {
    const LinearGeometry& g = l.linear;
    const dims src = in.value.get_desc().dims();
    dims wei{g.out};
    wei.insert(wei.end(), src.begin() + 1, src.end());
    const md wei_plain = plain(wei, wei.size() == 4 ? tag::oihw : wei.size() == 3 ? tag::oiw : tag::oi);
    const md bias_md = plain({g.out}, tag::x), dst_md = plain({g.n, g.out}, tag::nc);
    // A blocked 4-D input makes the product want its weights blocked alike, and the plain
    // parameters go through a reorder each step, their gradients through another. When the
    // weights outweigh the batch's activation (LeNet's fc1: 500 outputs, batch 64) it is cheaper
    // to hand the product a plain input (the adapter reorders the activation and its gradient)
    // and the plain weights as they are: 0.35 ms of a 15 ms one-thread step.
    const bool plain_weights = g.out >= g.n;
    const md src_md = src.size() == 4 && plain_weights ? plain(src, tag::nchw) : any(src);
    const md wei_md = plain_weights ? wei_plain : any(wei);
    const dnnl::inner_product_forward::primitive_desc fwd_pd(
        {prop_kind::forward_training, src_md, wei_md, bias_md, dst_md}, ctx.engine);
    const std::optional<dnnl::inner_product_backward_weights::primitive_desc> bww_pd(
        std::in_place, dnnl::inner_product_backward_weights::desc{src_md, wei_md, bias_md, dst_md}, ctx.engine,
        fwd_pd);
    std::optional<dnnl::inner_product_backward_data::primitive_desc> bwd_pd;
    if (input_grad)
      bwd_pd.emplace(dnnl::inner_product_backward_data::desc{src_md, wei_md, dst_md}, ctx.engine, fwd_pd);
    wire(ctx, in, wei_plain, bias_md, relu, fwd_pd, bww_pd, bwd_pd);
  }

  std::string path() const override { return describe("linear"); }
};

class Plan final : public NetworkPlan {
 public:
  Plan(Context& ctx, const Shape& input) : ctx_(ctx) {
    dims d = input.dims();
    input_.value = dnnl::memory(plain(d, d.size() == 4 ? tag::nchw : d.size() == 3 ? tag::ncw : tag::nc), ctx.engine,
                                DNNL_MEMORY_NONE);
  }

  /// The activation the next stage reads: the last stage's output, or the network's input.
  Activation& tail() { return stages_.empty() ? input_ : stages_.back()->out; }
  bool empty() const { return stages_.empty(); }
  void add(std::unique_ptr<Stage> stage) { stages_.push_back(std::move(stage)); }

  ConstTensorView forward(ConstTensorView x, std::span<const float> params) override {
    const SignalsHeld held;  // see signals.hpp
    auto& s = ctx_.stream;
    input_.value.set_data_handle(const_cast<float*>(x.data));
    for (auto& stage : stages_) stage->forward(s, params.data());
    s.wait();
    const auto logits = stages_.back()->out.value.get_desc().dims();
    return {static_cast<const float*>(stages_.back()->out.value.get_data_handle()), {logits[0], logits[1]}};
  }

  void backward(ConstTensorView dlogits, std::span<const float> params, std::span<float> grads,
                const GradientsReady& ready) override {
    const SignalsHeld held;  // see signals.hpp
    auto& s = ctx_.stream;
    Activation& last = stages_.back()->out;
    TEPDIST_CHECK(static_cast<size_t>(dlogits.elements()) * sizeof(float) == last.grad.get_desc().get_size());
    std::memcpy(last.grad.get_data_handle(), dlogits.data, static_cast<size_t>(dlogits.elements()) * sizeof(float));
    for (auto it = stages_.rbegin(); it != stages_.rend(); ++it) (*it)->backward(s, params.data(), grads.data(), ready);
    s.wait();
  }

  std::string path() const override {
    std::string p;
    for (const auto& stage : stages_) p += (p.empty() ? "" : "; ") + stage->path();
    return p;
  }

 private:
  Context& ctx_;
  Activation input_;
  // Stages hold references to each other's activations: a deque-like stable home is needed,
  // which unique_ptr elements give.
  std::vector<std::unique_ptr<Stage>> stages_;
};

using Kind = PlannedLayer::Kind;

bool is(std::span<const PlannedLayer> layers, size_t i, Kind k) { return i < layers.size() && layers[i].kind == k; }

}  // namespace

std::unique_ptr<NetworkPlan> plan_network(Context& ctx, std::span<const PlannedLayer> layers) {
  if (layers.empty() || layers.back().kind != Kind::linear) return nullptr;
  try {
    auto plan = std::make_unique<Plan>(ctx, layers.front().input);
    for (size_t i = 0; i < layers.size(); ++i) {
      const PlannedLayer& l = layers[i];
      const bool input_grad = !plan->empty();  // nobody needs the gradient of the network's input
      switch (l.kind) {
        case Kind::conv2d: {
          bool relu = false;
          if (is(layers, i + 1, Kind::relu)) {
            relu = true;
            ++i;
          } else if (is(layers, i + 1, Kind::max_pool2d) && is(layers, i + 2, Kind::relu)) {
            if (plan->empty() && FirstConvPool::supports(l.conv, layers[i + 1].pool)) {
              plan->add(std::make_unique<FirstConvPoolStage>(ctx, l, plan->tail()));
              i += 2;
              break;
            }
            plan->add(std::make_unique<ConvStage>(ctx, l, false, plan->tail(), input_grad));
            plan->add(std::make_unique<PoolStage>(ctx, layers[i + 1], true, plan->tail(), true));
            i += 2;
            break;
          }
          plan->add(std::make_unique<ConvStage>(ctx, l, relu, plan->tail(), input_grad));
          break;
        }
        case Kind::max_pool2d:
          plan->add(std::make_unique<PoolStage>(ctx, l, false, plan->tail(), input_grad));
          break;
        case Kind::relu: plan->add(std::make_unique<ReluStage>(ctx, plan->tail(), input_grad)); break;
        case Kind::flatten:
          if (!is(layers, i + 1, Kind::linear)) return nullptr;
          break;  // the inner product that follows reads the activation as it is
        case Kind::linear: {
          const bool relu = is(layers, i + 1, Kind::relu);
          plan->add(std::make_unique<LinearStage>(ctx, l, relu, plan->tail(), input_grad));
          if (relu) ++i;
          break;
        }
        case Kind::other: return nullptr;
      }
    }
    return plan;
  } catch (const dnnl::error&) {
    return nullptr;  // a shape oneDNN cannot plan: the per-layer kernels still can
  }
}

}  // namespace tepdist::compute::onednn

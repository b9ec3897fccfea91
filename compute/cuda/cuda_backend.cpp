// The CUDA backend (see cuda_backend.hpp). One Context per backend holds the stream and the
// cuDNN and cuBLAS handles; every operation queues on that stream, and only a host copy, which
// the caller is waiting for, synchronises with it.

#include "compute/cuda/cuda_backend.hpp"

#include <cuda_runtime.h>
#include <cudnn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "base/check.hpp"
#include "compute/cuda/cublas.hpp"
#include "compute/cuda/kernels.hpp"
#include "compute/model.hpp"
#include "compute/optimizer.hpp"
#include "compute/resident.hpp"

namespace tepdist::compute {
namespace {

// A failed CUDA, cuDNN or cuBLAS call after the backend was made is an out-of-memory or a broken
// device: nothing a step can recover from, so it is reported where it happened and ends the
// process, like a failed invariant check.
[[noreturn]] void device_failed(const char* call, const char* what, const char* file, int line) {
  fmt::print(stderr, "tepdist: CUDA call failed at {}:{}: {}: {}\n", file, line, call, what);
  std::abort();
}

#define TEPDIST_CUDA(call)                                                              \
  do {                                                                                  \
    const cudaError_t e_ = (call);                                                      \
    if (e_ != cudaSuccess) device_failed(#call, cudaGetErrorString(e_), __FILE__, __LINE__); \
  } while (0)
#define TEPDIST_CUDNN(call)                                                                 \
  do {                                                                                      \
    const cudnnStatus_t e_ = (call);                                                        \
    if (e_ != CUDNN_STATUS_SUCCESS) device_failed(#call, cudnnGetErrorString(e_), __FILE__, __LINE__); \
  } while (0)
#define TEPDIST_CUBLAS(ctx, call)                                                                    \
  do {                                                                                               \
    const cublasStatus_t e_ = (call);                                                                \
    if (e_ != CUBLAS_STATUS_SUCCESS) device_failed(#call, (ctx).api->status_string(e_), __FILE__, __LINE__); \
  } while (0)
#define TEPDIST_KERNEL(call)                                                               \
  do {                                                                                     \
    const int e_ = (call);                                                                 \
    if (e_ != 0) device_failed(#call, cuda::kernels::error_name(e_), __FILE__, __LINE__); \
  } while (0)

/// Device memory for n elements of T; grows, never shrinks.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { resize(n); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  void resize(size_t n) {
    n_ = n;
    if (n <= capacity_) return;
    if (p_) TEPDIST_CUDA(cudaFree(p_));
    p_ = nullptr;
    TEPDIST_CUDA(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(n, 1) * sizeof(T)));
    capacity_ = n;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0, capacity_ = 0;
};

struct Context {
  int device = 0;
  bool deterministic = true;  ///< cuDNN's first-ranked deterministic algorithms, else the fastest measured
  std::string description;
  cudaStream_t stream = nullptr;
  cudnnHandle_t dnn = nullptr;
  cublasHandle_t blas = nullptr;
  const cuda::Cublas* api = nullptr;  // cuBLAS, opened at run time (cublas.hpp says why)

  ~Context() {
    if (blas) api->destroy(blas);
    if (dnn) cudnnDestroy(dnn);
    if (stream) cudaStreamDestroy(stream);
  }
  /// The calling thread's current device: CUDA keeps one per thread, and actors move between threads.
  void activate() const { TEPDIST_CUDA(cudaSetDevice(device)); }
  void sync() const { TEPDIST_CUDA(cudaStreamSynchronize(stream)); }
  template <class T>
  void upload(T* device_dst, const T* host_src, size_t n) const {
    TEPDIST_CUDA(cudaMemcpyAsync(device_dst, host_src, n * sizeof(T), cudaMemcpyHostToDevice, stream));
  }
  template <class T>
  void download(T* host_dst, const T* device_src, size_t n) const {
    TEPDIST_CUDA(cudaMemcpyAsync(host_dst, device_src, n * sizeof(T), cudaMemcpyDeviceToHost, stream));
    sync();
  }
};

/// Host memory the plan copies to or from every step (a model's parameter and gradient buffers),
/// page-locked while the plan uses it so the copies run at the link's rate, not through CUDA's
/// pageable staging. Best effort: memory another plan already locked, or that cannot be locked,
/// is copied as it is (correct, slower).
class HostPin {
 public:
  HostPin() = default;
  HostPin(const HostPin&) = delete;
  HostPin& operator=(const HostPin&) = delete;
  ~HostPin() { release(); }
  void ensure(const void* p, size_t bytes) {
    if (p == p_ && bytes == bytes_) return;
    release();
    p_ = p;
    bytes_ = bytes;
    const cudaError_t e = cudaHostRegister(const_cast<void*>(p), bytes, cudaHostRegisterDefault);
    owned_ = e == cudaSuccess;
    if (!owned_) (void)cudaGetLastError();  // already locked by another plan, or not lockable
  }

 private:
  void release() {
    if (owned_) (void)cudaHostUnregister(const_cast<void*>(p_));
    owned_ = false;
    p_ = nullptr;
    bytes_ = 0;
  }
  const void* p_ = nullptr;
  size_t bytes_ = 0;
  bool owned_ = false;
};

/// A 4-D NCHW float tensor descriptor.
class TensorDesc {
 public:
  TensorDesc() { TEPDIST_CUDNN(cudnnCreateTensorDescriptor(&d_)); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d_); }
  void set(int64_t n, int64_t c, int64_t h, int64_t w) {
    TEPDIST_CUDNN(cudnnSetTensor4dDescriptor(d_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, static_cast<int>(n),
                                             static_cast<int>(c), static_cast<int>(h), static_cast<int>(w)));
  }
  cudnnTensorDescriptor_t get() const { return d_; }

 private:
  cudnnTensorDescriptor_t d_ = nullptr;
};

const char* math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_FMA_MATH: return "fma";
    case CUDNN_DEFAULT_MATH: return "default";
    case CUDNN_TENSOR_OP_MATH: return "tensor-op";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "tensor-op-conversion";
  }
  return "?";
}

/// From cuDNN's candidates, in its order (ranked by its heuristics, or by measured time): the
/// first that runs, uses plain FMA math (float32, no TF32), needs under 256 MiB of workspace and,
/// when `deterministic`, is deterministic (a rerun computes the same bits); failing that, the
/// first within the other rules without the FMA one; failing that, the first that runs. The path
/// (ConvOp::path) shows each choice's math and says when one is not deterministic, so a fallback
/// is never silent.
template <class Perf>
Perf pick_algorithm(const Perf* perfs, int count, bool deterministic, const char* what) {
  constexpr size_t workspace_cap = size_t{256} << 20;
  for (int pass = 0; pass < 3; ++pass)
    for (int i = 0; i < count; ++i) {
      const Perf& p = perfs[i];
      if (p.status != CUDNN_STATUS_SUCCESS || p.memory > workspace_cap) continue;
      if (pass < 2 && deterministic && p.determinism != CUDNN_DETERMINISTIC) continue;
      if (pass < 1 && p.mathType != CUDNN_FMA_MATH) continue;
      return p;
    }
  device_failed(what, "cuDNN offers no algorithm for this convolution", __FILE__, __LINE__);
}

/// One convolution's descriptors, algorithms and workspace; operands are device pointers.
class ConvOp {
 public:
  ConvOp(const Context& ctx, const Conv2dGeometry& g) : ctx_(ctx), g_(g) {
    TEPDIST_CHECK(g.n > 0 && g.oh() > 0 && g.ow() > 0);
    x_.set(g.n, g.c, g.h, g.w);
    y_.set(g.n, g.k, g.oh(), g.ow());
    TEPDIST_CUDNN(cudnnCreateFilterDescriptor(&w_));
    TEPDIST_CUDNN(cudnnSetFilter4dDescriptor(w_, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, static_cast<int>(g.k),
                                             static_cast<int>(g.c), static_cast<int>(g.r), static_cast<int>(g.s)));
    for (cudnnConvolutionDescriptor_t* conv : {&fwd_conv_, &data_conv_, &filter_conv_}) {
      TEPDIST_CUDNN(cudnnCreateConvolutionDescriptor(conv));
      TEPDIST_CUDNN(cudnnSetConvolution2dDescriptor(*conv, static_cast<int>(g.pad), static_cast<int>(g.pad),
                                                    static_cast<int>(g.stride), static_cast<int>(g.stride), 1, 1,
                                                    CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
      TEPDIST_CUDNN(cudnnSetConvolutionMathType(*conv, CUDNN_FMA_MATH));
    }
    // Deterministic: cuDNN's heuristics rank the algorithms, the same every run, so a rerun picks
    // the same ones and computes the same bits. Otherwise cuDNN times each (once, here) and the
    // fastest runs, atomics included.
    const bool det = ctx.deterministic;
    int count = 0;
    cudnnConvolutionFwdAlgoPerf_t fwd[16];
    if (det)
      TEPDIST_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7(ctx.dnn, x_.get(), w_, fwd_conv_, y_.get(), 16, &count, fwd));
    else
      TEPDIST_CUDNN(cudnnFindConvolutionForwardAlgorithm(ctx.dnn, x_.get(), w_, fwd_conv_, y_.get(), 16, &count, fwd));
    fwd_ = pick_algorithm(fwd, count, det, "convolution forward");
    cudnnConvolutionBwdDataAlgoPerf_t data[16];
    if (det)
      TEPDIST_CUDNN(
          cudnnGetConvolutionBackwardDataAlgorithm_v7(ctx.dnn, w_, y_.get(), data_conv_, x_.get(), 16, &count, data));
    else
      TEPDIST_CUDNN(cudnnFindConvolutionBackwardDataAlgorithm(ctx.dnn, w_, y_.get(), data_conv_, x_.get(), 16, &count, data));
    data_ = pick_algorithm(data, count, det, "convolution backward data");
    cudnnConvolutionBwdFilterAlgoPerf_t filter[16];
    if (det)
      TEPDIST_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(ctx.dnn, x_.get(), y_.get(), filter_conv_, w_, 16,
                                                                  &count, filter));
    else
      TEPDIST_CUDNN(cudnnFindConvolutionBackwardFilterAlgorithm(ctx.dnn, x_.get(), y_.get(), filter_conv_, w_, 16,
                                                                &count, filter));
    filter_ = pick_algorithm(filter, count, det, "convolution backward filter");
    TEPDIST_CUDNN(cudnnSetConvolutionMathType(fwd_conv_, fwd_.mathType));
    TEPDIST_CUDNN(cudnnSetConvolutionMathType(data_conv_, data_.mathType));
    TEPDIST_CUDNN(cudnnSetConvolutionMathType(filter_conv_, filter_.mathType));
    workspace_.resize(std::max({fwd_.memory, data_.memory, filter_.memory}));
    bias_scratch_.resize(static_cast<size_t>(g.k * cuda::kernels::bias_gradient_splits));
  }
  ConvOp(const ConvOp&) = delete;
  ConvOp& operator=(const ConvOp&) = delete;
  ~ConvOp() {
    cudnnDestroyFilterDescriptor(w_);
    for (auto conv : {fwd_conv_, data_conv_, filter_conv_}) cudnnDestroyConvolutionDescriptor(conv);
  }

  void forward(const float* x, const float* w, const float* b, float* y) {
    const float one = 1.0f, zero = 0.0f;
    TEPDIST_CUDNN(cudnnConvolutionForward(ctx_.dnn, &one, x_.get(), x, w_, w, fwd_conv_, fwd_.algo, workspace_.get(),
                                          workspace_.size(), &zero, y_.get(), y));
    TEPDIST_KERNEL(cuda::kernels::add_bias(y, b, g_.n, g_.k, g_.oh() * g_.ow(), ctx_.stream));
  }
  void backward_data(const float* dy, const float* w, float* dx) {
    const float one = 1.0f, zero = 0.0f;
    TEPDIST_CUDNN(cudnnConvolutionBackwardData(ctx_.dnn, &one, w_, w, y_.get(), dy, data_conv_, data_.algo,
                                               workspace_.get(), workspace_.size(), &zero, x_.get(), dx));
  }
  void backward_weights(const float* x, const float* dy, float* dw, float* db) {
    const float one = 1.0f, zero = 0.0f;
    TEPDIST_CUDNN(cudnnConvolutionBackwardFilter(ctx_.dnn, &one, x_.get(), x, y_.get(), dy, filter_conv_, filter_.algo,
                                                 workspace_.get(), workspace_.size(), &zero, w_, dw));
    TEPDIST_KERNEL(cuda::kernels::bias_gradient(dy, db, g_.n, g_.k, g_.oh() * g_.ow(), bias_scratch_.get(), ctx_.stream));
  }
  std::string path() const {
    auto tag = [](const auto& perf) {
      return fmt::format("{}{}", math_name(perf.mathType),
                         perf.determinism == CUDNN_DETERMINISTIC ? "" : ", non-deterministic");
    };
    return fmt::format("cudnn fwd algo {} ({}), bwd data algo {} ({}), bwd filter algo {} ({})", static_cast<int>(fwd_.algo),
                       tag(fwd_), static_cast<int>(data_.algo), tag(data_), static_cast<int>(filter_.algo), tag(filter_));
  }

 private:
  const Context& ctx_;
  Conv2dGeometry g_;
  TensorDesc x_, y_;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t fwd_conv_ = nullptr, data_conv_ = nullptr, filter_conv_ = nullptr;
  cudnnConvolutionFwdAlgoPerf_t fwd_{};
  cudnnConvolutionBwdDataAlgoPerf_t data_{};
  cudnnConvolutionBwdFilterAlgoPerf_t filter_{};
  DeviceBuffer<std::byte> workspace_;
  DeviceBuffer<float> bias_scratch_;
};

// cuBLAS is column-major: a row-major [r, c] matrix is its column-major transpose, so each
// product below is written for the transposes.

/// y [n, out] = x [n, in] w[out, in]^T + b
void linear_forward(const Context& ctx, const LinearGeometry& g, const float* x, const float* w, const float* b, float* y) {
  const float one = 1.0f, zero = 0.0f;
  TEPDIST_CUBLAS(ctx, ctx.api->sgemm(ctx.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(g.out), static_cast<int>(g.n),
                             static_cast<int>(g.in), &one, w, static_cast<int>(g.in), x, static_cast<int>(g.in), &zero, y,
                             static_cast<int>(g.out)));
  TEPDIST_KERNEL(cuda::kernels::add_bias(y, b, g.n, g.out, 1, ctx.stream));
}

/// dx [n, in] = dy [n, out] w [out, in]
void linear_backward_data(const Context& ctx, const LinearGeometry& g, const float* dy, const float* w, float* dx) {
  const float one = 1.0f, zero = 0.0f;
  TEPDIST_CUBLAS(ctx, ctx.api->sgemm(ctx.blas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(g.in), static_cast<int>(g.n),
                             static_cast<int>(g.out), &one, w, static_cast<int>(g.in), dy, static_cast<int>(g.out), &zero,
                             dx, static_cast<int>(g.in)));
}

/// dw [out, in] = dy^T x, db = dy summed over n
void linear_backward_weights(const Context& ctx, const LinearGeometry& g, const float* x, const float* dy, float* dw,
                             float* db) {
  const float one = 1.0f, zero = 0.0f;
  TEPDIST_CUBLAS(ctx, ctx.api->sgemm(ctx.blas, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(g.in), static_cast<int>(g.out),
                             static_cast<int>(g.n), &one, x, static_cast<int>(g.in), dy, static_cast<int>(g.out), &zero,
                             dw, static_cast<int>(g.in)));
  TEPDIST_KERNEL(cuda::kernels::bias_gradient(dy, db, g.n, g.out, 1, nullptr, ctx.stream));
}

/// The stage's output shape for its input.
Shape stage_output(const PlannedLayer& l) {
  switch (l.kind) {
    case PlannedLayer::Kind::conv2d: return l.conv.output();
    case PlannedLayer::Kind::max_pool2d: return l.pool.output();
    case PlannedLayer::Kind::linear: return Shape{l.linear.n, l.linear.out};
    case PlannedLayer::Kind::flatten: return Shape{l.input[0], l.input.elements() / l.input[0]};
    case PlannedLayer::Kind::relu:
    case PlannedLayer::Kind::other: return l.input;
  }
  return l.input;
}

Result<void> check_cuda_layers(std::span<const PlannedLayer> layers) {
  for (size_t i = 0; i < layers.size(); ++i) {
    const PlannedLayer& l = layers[i];
    if (l.kind == PlannedLayer::Kind::other)
      return fail(Errc::invalid_argument,
                  fmt::format("compute.backend \"cuda\" cannot run layer {} ('{}') on the device (it runs conv2d, "
                              "max_pool2d, relu, flatten and linear); use backend \"onednn\" for this model",
                              i + 1, l.name));
    const int64_t largest = std::max(l.input.elements(), stage_output(l).elements());
    if (largest > (int64_t{1} << 31) - 1)
      return fail(Errc::invalid_argument,
                  fmt::format("compute.backend \"cuda\": layer {} ('{}') holds {} values at this batch size, more "
                              "than its kernels' 32-bit indexing allows (2^31 - 1): lower data.batch_size",
                              i + 1, l.name, largest));
  }
  return {};
}

/// The whole network on the device for one batch size: one output buffer per stage (flatten
/// aliases its input), one input-gradient buffer per stage after the first.
class CudaPlan final : public NetworkPlan {
 public:
  CudaPlan(const Context& ctx, std::span<const PlannedLayer> layers) : ctx_(ctx), stages_(layers.size()) {
    int64_t params = 0;
    for (size_t i = 0; i < layers.size(); ++i) {
      Stage& s = stages_[i];
      s.layer = layers[i];
      s.output = stage_output(s.layer);
      if (s.layer.kind == PlannedLayer::Kind::conv2d) s.conv = std::make_unique<ConvOp>(ctx, s.layer.conv);
      if (s.layer.kind == PlannedLayer::Kind::max_pool2d) s.argmax.resize(static_cast<size_t>(s.output.elements()));
      if (s.layer.kind != PlannedLayer::Kind::flatten) s.y.resize(static_cast<size_t>(s.output.elements()));
      if (i > 0 && s.layer.kind != PlannedLayer::Kind::flatten) s.dx.resize(static_cast<size_t>(s.layer.input.elements()));
      if (s.layer.kind == PlannedLayer::Kind::conv2d)
        params = std::max(params, s.layer.bias_offset + s.layer.conv.k);
      if (s.layer.kind == PlannedLayer::Kind::linear)
        params = std::max(params, s.layer.bias_offset + s.layer.linear.out);
    }
    TEPDIST_CHECK(!stages_.empty() && stages_.back().output.rank() == 2);
    parameter_count_ = static_cast<size_t>(params);
  }

  const Shape& logits_shape() const { return stages_.back().output; }
  const Shape& input_shape() const { return stages_.front().layer.input; }

  /// Runs the network on the device input x with device parameters; returns the device logits.
  const float* forward_device(const float* x, const float* params) {
    const float* in = x;
    for (Stage& s : stages_) {
      const PlannedLayer& l = s.layer;
      switch (l.kind) {
        case PlannedLayer::Kind::conv2d:
          s.conv->forward(in, params + l.weight_offset, params + l.bias_offset, s.y.get());
          break;
        case PlannedLayer::Kind::max_pool2d:
          TEPDIST_KERNEL(cuda::kernels::max_pool_forward(in, s.y.get(), s.argmax.get(), l.pool.n * l.pool.c, l.pool.h,
                                                         l.pool.w, l.pool.kernel, l.pool.stride, ctx_.stream));
          break;
        case PlannedLayer::Kind::relu:
          TEPDIST_KERNEL(cuda::kernels::relu_forward(in, s.y.get(), s.output.elements(), ctx_.stream));
          break;
        case PlannedLayer::Kind::linear:
          linear_forward(ctx_, l.linear, in, params + l.weight_offset, params + l.bias_offset, s.y.get());
          break;
        case PlannedLayer::Kind::flatten: break;
        case PlannedLayer::Kind::other: TEPDIST_CHECK(!"check_cuda_layers refused it");
      }
      s.out = l.kind == PlannedLayer::Kind::flatten ? in : s.y.get();
      in = s.out;
    }
    return in;
  }

  /// Back-propagates device dlogits through the last forward (whose input was x), overwriting
  /// every device gradient.
  void backward_device(const float* x, const float* dlogits, const float* params, float* grads) {
    const float* dy = dlogits;
    for (size_t i = stages_.size(); i-- > 0;) {
      Stage& s = stages_[i];
      const PlannedLayer& l = s.layer;
      const float* in = i == 0 ? x : stages_[i - 1].out;
      float* dx = i == 0 ? nullptr : s.dx.get();
      switch (l.kind) {
        case PlannedLayer::Kind::conv2d:
          s.conv->backward_weights(in, dy, grads + l.weight_offset, grads + l.bias_offset);
          if (dx) s.conv->backward_data(dy, params + l.weight_offset, dx);
          break;
        case PlannedLayer::Kind::max_pool2d:
          if (dx)
            TEPDIST_KERNEL(cuda::kernels::max_pool_backward(dy, s.argmax.get(), dx, l.pool.n * l.pool.c, l.pool.h, l.pool.w,
                                                            l.pool.kernel, l.pool.stride, ctx_.stream));
          break;
        case PlannedLayer::Kind::relu:
          if (dx) TEPDIST_KERNEL(cuda::kernels::relu_backward(s.y.get(), dy, dx, s.output.elements(), ctx_.stream));
          break;
        case PlannedLayer::Kind::linear:
          linear_backward_weights(ctx_, l.linear, in, dy, grads + l.weight_offset, grads + l.bias_offset);
          if (dx) linear_backward_data(ctx_, l.linear, dy, params + l.weight_offset, dx);
          break;
        case PlannedLayer::Kind::flatten:
          dx = const_cast<float*>(dy);  // the same elements in another shape
          break;
        case PlannedLayer::Kind::other: TEPDIST_CHECK(!"check_cuda_layers refused it");
      }
      dy = dx;
    }
  }

  // The host-level plan, as Model::forward and backward use it: operands cross at each call.
  ConstTensorView forward(ConstTensorView x, std::span<const float> params) override {
    TEPDIST_CHECK(x.shape == input_shape() && params.size() >= parameter_count_);
    ctx_.activate();
    params_pin_.ensure(params.data(), params.size_bytes());
    params_.resize(params.size());
    ctx_.upload(params_.get(), params.data(), params.size());
    x_.resize(static_cast<size_t>(x.elements()));
    ctx_.upload(x_.get(), x.data, static_cast<size_t>(x.elements()));
    const float* logits = forward_device(x_.get(), params_.get());
    logits_.resize(logits_shape());
    ctx_.download(logits_.data(), logits, static_cast<size_t>(logits_.elements()));
    return logits_;
  }
  // The gradients reach the host in one copy at the end: one range for all of them.
  void backward(ConstTensorView dlogits, std::span<const float> params, std::span<float> grads,
                const GradientsReady& ready) override {
    TEPDIST_CHECK(dlogits.shape == logits_shape() && params.size() == params_.size() && grads.size() == params.size());
    ctx_.activate();
    dlogits_.resize(static_cast<size_t>(dlogits.elements()));
    ctx_.upload(dlogits_.get(), dlogits.data, dlogits_.size());
    grads_.resize(grads.size());
    grads_pin_.ensure(grads.data(), grads.size_bytes());
    backward_device(x_.get(), dlogits_.get(), params_.get(), grads_.get());
    ctx_.download(grads.data(), grads_.get(), grads.size());
    if (ready && !grads.empty()) ready(0, grads.size());
  }
  std::string path() const override {
    std::string s;
    for (const Stage& st : stages_) {
      if (!s.empty()) s += "; ";
      s += st.layer.name + ": ";
      switch (st.layer.kind) {
        case PlannedLayer::Kind::conv2d: s += st.conv->path(); break;
        case PlannedLayer::Kind::max_pool2d: s += "own max-pool kernel"; break;
        case PlannedLayer::Kind::relu: s += "own relu kernel"; break;
        case PlannedLayer::Kind::linear: s += "cublas sgemm"; break;
        case PlannedLayer::Kind::flatten: s += "alias"; break;
        case PlannedLayer::Kind::other: s += "?"; break;
      }
    }
    return s;
  }

 private:
  struct Stage {
    PlannedLayer layer;
    Shape output;
    std::unique_ptr<ConvOp> conv;
    DeviceBuffer<float> y, dx;
    DeviceBuffer<int32_t> argmax;
    const float* out = nullptr;  // y, or the input for flatten
  };
  const Context& ctx_;
  std::vector<Stage> stages_;
  size_t parameter_count_ = 0;
  DeviceBuffer<float> params_, grads_, x_, dlogits_;  // the host-level path's copies
  HostPin params_pin_, grads_pin_;  // declared after the buffers: unlocked first
  Tensor logits_;
};

// ---- the per-layer kernels of the Backend interface: host views, copied in and out ----------

/// d <- the host view v (d grown to fit), queued on the backend's stream.
void upload_view(const Context& ctx, DeviceBuffer<float>& d, ConstTensorView v) {
  d.resize(static_cast<size_t>(v.elements()));
  ctx.upload(d.get(), v.data, d.size());
}

class CudaConv2dKernel final : public Conv2dKernel {
 public:
  CudaConv2dKernel(const Context& ctx, const Conv2dGeometry& g) : ctx_(ctx), g_(g), op_(ctx, g) {}
  void forward(ConstTensorView x, ConstTensorView w, ConstTensorView b, TensorView y) override {
    TEPDIST_CHECK(x.shape == g_.input() && w.shape == g_.weight() && y.shape == g_.output());
    ctx_.activate();
    upload_view(ctx_, a_, x), upload_view(ctx_, w_, w), upload_view(ctx_, b_, b);
    c_.resize(static_cast<size_t>(y.elements()));
    op_.forward(a_.get(), w_.get(), b_.get(), c_.get());
    ctx_.download(y.data, c_.get(), c_.size());
  }
  void backward_data(ConstTensorView dy, ConstTensorView w, TensorView dx) override {
    TEPDIST_CHECK(dy.shape == g_.output() && dx.shape == g_.input());
    ctx_.activate();
    upload_view(ctx_, a_, dy), upload_view(ctx_, w_, w);
    c_.resize(static_cast<size_t>(dx.elements()));
    op_.backward_data(a_.get(), w_.get(), c_.get());
    ctx_.download(dx.data, c_.get(), c_.size());
  }
  void backward_weights(ConstTensorView x, ConstTensorView dy, TensorView dw, TensorView db) override {
    TEPDIST_CHECK(x.shape == g_.input() && dy.shape == g_.output() && dw.shape == g_.weight());
    ctx_.activate();
    upload_view(ctx_, a_, x), upload_view(ctx_, b_, dy);
    w_.resize(static_cast<size_t>(dw.elements()));
    c_.resize(static_cast<size_t>(db.elements()));
    op_.backward_weights(a_.get(), b_.get(), w_.get(), c_.get());
    ctx_.download(dw.data, w_.get(), w_.size());
    ctx_.download(db.data, c_.get(), c_.size());
  }

 private:
  const Context& ctx_;
  Conv2dGeometry g_;
  ConvOp op_;
  DeviceBuffer<float> a_, w_, b_, c_;
};

class CudaMaxPoolKernel final : public MaxPool2dKernel {
 public:
  CudaMaxPoolKernel(const Context& ctx, const Pool2dGeometry& g) : ctx_(ctx), g_(g) {}
  void forward(ConstTensorView x, TensorView y) override {
    TEPDIST_CHECK(x.shape == g_.input() && y.shape == g_.output());
    ctx_.activate();
    x_.resize(static_cast<size_t>(x.elements()));
    ctx_.upload(x_.get(), x.data, x_.size());
    y_.resize(static_cast<size_t>(y.elements()));
    argmax_.resize(y_.size());
    TEPDIST_KERNEL(cuda::kernels::max_pool_forward(x_.get(), y_.get(), argmax_.get(), g_.n * g_.c, g_.h, g_.w, g_.kernel,
                                                   g_.stride, ctx_.stream));
    ctx_.download(y.data, y_.get(), y_.size());
  }
  void backward(ConstTensorView dy, TensorView dx) override {
    TEPDIST_CHECK(dy.shape == g_.output() && dx.shape == g_.input());
    ctx_.activate();
    y_.resize(static_cast<size_t>(dy.elements()));
    ctx_.upload(y_.get(), dy.data, y_.size());
    x_.resize(static_cast<size_t>(dx.elements()));
    TEPDIST_KERNEL(cuda::kernels::max_pool_backward(y_.get(), argmax_.get(), x_.get(), g_.n * g_.c, g_.h, g_.w, g_.kernel,
                                                    g_.stride, ctx_.stream));
    ctx_.download(dx.data, x_.get(), x_.size());
  }

 private:
  const Context& ctx_;
  Pool2dGeometry g_;
  DeviceBuffer<float> x_, y_;
  DeviceBuffer<int32_t> argmax_;
};

class CudaLinearKernel final : public LinearKernel {
 public:
  CudaLinearKernel(const Context& ctx, const LinearGeometry& g) : ctx_(ctx), g_(g) {}
  void forward(ConstTensorView x, ConstTensorView w, ConstTensorView b, TensorView y) override {
    ctx_.activate();
    upload_view(ctx_, a_, x), upload_view(ctx_, w_, w), upload_view(ctx_, b_, b);
    c_.resize(static_cast<size_t>(y.elements()));
    linear_forward(ctx_, g_, a_.get(), w_.get(), b_.get(), c_.get());
    ctx_.download(y.data, c_.get(), c_.size());
  }
  void backward_data(ConstTensorView dy, ConstTensorView w, TensorView dx) override {
    ctx_.activate();
    upload_view(ctx_, a_, dy), upload_view(ctx_, w_, w);
    c_.resize(static_cast<size_t>(dx.elements()));
    linear_backward_data(ctx_, g_, a_.get(), w_.get(), c_.get());
    ctx_.download(dx.data, c_.get(), c_.size());
  }
  void backward_weights(ConstTensorView x, ConstTensorView dy, TensorView dw, TensorView db) override {
    ctx_.activate();
    upload_view(ctx_, a_, x), upload_view(ctx_, b_, dy);
    w_.resize(static_cast<size_t>(dw.elements()));
    c_.resize(static_cast<size_t>(db.elements()));
    linear_backward_weights(ctx_, g_, a_.get(), b_.get(), w_.get(), c_.get());
    ctx_.download(dw.data, w_.get(), w_.size());
    ctx_.download(db.data, c_.get(), c_.size());
  }

 private:
  const Context& ctx_;
  LinearGeometry g_;
  DeviceBuffer<float> a_, w_, b_, c_;
};

// ---- training state on the device -----------------------------------------------------------

class CudaResident final : public ResidentState {
 public:
  CudaResident(const Context& ctx, Model& model, const OptimizerOptions& options, std::unique_ptr<Optimizer> optimizer)
      : ctx_(ctx), model_(model), options_(options), optimizer_(std::move(optimizer)) {
    const size_t n = model.parameters().size();
    params_.resize(n);
    grads_.resize(n);
    for (const auto& [name, buffer] : optimizer_->state()) {
      TEPDIST_CHECK(buffer.size() == n);
      state_.push_back(std::make_unique<DeviceBuffer<float>>(n));
      TEPDIST_CUDA(cudaMemsetAsync(state_.back()->get(), 0, n * sizeof(float), ctx.stream));
    }
    TEPDIST_CUDA(cudaMallocHost(reinterpret_cast<void**>(&readback_), sizeof(Readback)));
    push_parameters();
  }
  ~CudaResident() override {
    if (readback_) cudaFreeHost(readback_);
  }

  Result<float> compute_gradients(ConstTensorView x, std::span<const int32_t> labels) override {
    const Shape& sample = model_.sample_shape();
    if (x.shape.rank() != sample.rank() + 1 || x.shape.sample() != sample || x.shape[0] < 1)
      return fail(Errc::invalid_argument, fmt::format("model input: expected a batch [n, {}] with n >= 1, got {}",
                                                      sample.to_string().substr(1), x.shape.to_string()));
    const int64_t n = x.shape[0];
    if (auto ok = check_labels(labels, n, model_.classes()); !ok) return std::unexpected(ok.error());
    ctx_.activate();
    auto planned = plan_for(n);
    if (!planned) return std::unexpected(planned.error());
    CudaPlan& plan = **planned;
    x_.resize(static_cast<size_t>(x.elements()));
    ctx_.upload(x_.get(), x.data, x_.size());
    labels_.resize(labels.size());
    ctx_.upload(labels_.get(), labels.data(), labels.size());
    const float* logits = plan.forward_device(x_.get(), params_.get());
    const int64_t classes = plan.logits_shape()[1];
    probs_.resize(static_cast<size_t>(n * classes));
    dlogits_.resize(probs_.size());
    row_loss_.resize(static_cast<size_t>(n));
    scalars_.resize(2);
    float* loss = reinterpret_cast<float*>(scalars_.get());
    int32_t* nonfinite = scalars_.get() + 1;
    TEPDIST_KERNEL(cuda::kernels::softmax_cross_entropy_forward(logits, labels_.get(), probs_.get(), row_loss_.get(), loss,
                                                                n, classes, ctx_.stream));
    TEPDIST_KERNEL(cuda::kernels::softmax_cross_entropy_backward(probs_.get(), labels_.get(), dlogits_.get(), n, classes,
                                                                 ctx_.stream));
    plan.backward_device(x_.get(), dlogits_.get(), params_.get(), grads_.get());
    TEPDIST_CUDA(cudaMemsetAsync(nonfinite, 0, sizeof(int32_t), ctx_.stream));
    TEPDIST_KERNEL(cuda::kernels::find_nonfinite(grads_.get(), static_cast<int64_t>(grads_.size()), nonfinite, ctx_.stream));
    // the loss out, and whether the gradient is finite, in one copy
    TEPDIST_CUDA(cudaMemcpyAsync(readback_, scalars_.get(), sizeof(Readback), cudaMemcpyDeviceToHost, ctx_.stream));
    ctx_.sync();
    finite_ = readback_->nonfinite == 0;
    return readback_->loss;
  }

  bool gradient_finite() override { return finite_; }

  void step(float lr) override {
    ctx_.activate();
    const int64_t n = static_cast<int64_t>(params_.size());
    const std::string_view name = optimizer_->name();
    if (name == "sgd") {
      TEPDIST_KERNEL(cuda::kernels::sgd_update(params_.get(), grads_.get(), state_.empty() ? nullptr : state_[0]->get(), n,
                                               lr, options_.weight_decay, options_.momentum, options_.nesterov,
                                               ctx_.stream));
      optimizer_->set_steps(optimizer_->steps() + 1);
    } else {
      TEPDIST_CHECK(name == "adam" || name == "adamw");
      optimizer_->set_steps(optimizer_->steps() + 1);
      // Adam::step's bias corrections, computed as it computes them
      const float c1 = 1.0f - std::pow(options_.beta1, static_cast<float>(optimizer_->steps()));
      const float c2 = 1.0f - std::pow(options_.beta2, static_cast<float>(optimizer_->steps()));
      TEPDIST_KERNEL(cuda::kernels::adam_update(params_.get(), grads_.get(), state_[0]->get(), state_[1]->get(), n, lr,
                                                options_.beta1, options_.beta2, options_.eps, c1, c2,
                                                options_.weight_decay, name == "adamw", ctx_.stream));
    }
  }

  Optimizer& optimizer() override { return *optimizer_; }
  std::string where() const override { return fmt::format("cuda:{} device memory", ctx_.device); }

  void pull_parameters() override { copy_out(model_.parameters(), params_); }
  void push_parameters() override { copy_in(params_, model_.parameters()); }
  void pull_gradients() override { copy_out(model_.gradients(), grads_); }
  void push_gradients() override { copy_in(grads_, model_.gradients()); }
  void pull_optimizer() override {
    const auto host = optimizer_->state();
    for (size_t k = 0; k < host.size(); ++k) copy_out(host[k].second, *state_[k]);
  }
  void push_optimizer() override {
    const auto host = optimizer_->state();
    for (size_t k = 0; k < host.size(); ++k) copy_in(*state_[k], host[k].second);
  }

 private:
  struct Readback {
    float loss;
    int32_t nonfinite;
  };

  void copy_out(std::span<float> host, const DeviceBuffer<float>& device) {
    TEPDIST_CHECK(host.size() == device.size());
    ctx_.activate();
    ctx_.download(host.data(), device.get(), host.size());
  }
  void copy_in(DeviceBuffer<float>& device, std::span<const float> host) {
    TEPDIST_CHECK(host.size() == device.size());
    ctx_.activate();
    ctx_.upload(device.get(), host.data(), host.size());
    ctx_.sync();  // the host buffer may change as soon as this returns
  }

  Result<CudaPlan*> plan_for(int64_t batch) {
    for (auto it = plans_.begin(); it != plans_.end(); ++it)
      if (it->first == batch) {
        std::rotate(it, it + 1, plans_.end());
        return plans_.back().second.get();
      }
    const auto layers = model_.planned_layers(batch);
    if (auto ok = check_cuda_layers(layers); !ok) return std::unexpected(ok.error());  // a batch too large
    constexpr size_t max_plans = 8;  // as Model keeps
    if (plans_.size() == max_plans) plans_.erase(plans_.begin());
    plans_.emplace_back(batch, std::make_unique<CudaPlan>(ctx_, layers));
    return plans_.back().second.get();
  }

  const Context& ctx_;
  Model& model_;
  OptimizerOptions options_;
  std::unique_ptr<Optimizer> optimizer_;
  DeviceBuffer<float> params_, grads_, x_, probs_, dlogits_;
  std::vector<std::unique_ptr<DeviceBuffer<float>>> state_;  // optimizer_->state()'s order
  DeviceBuffer<int32_t> labels_, scalars_;
  DeviceBuffer<double> row_loss_;
  std::vector<std::pair<int64_t, std::unique_ptr<CudaPlan>>> plans_;
  Readback* readback_ = nullptr;  // pinned
  bool finite_ = true;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(std::unique_ptr<Context> ctx) : ctx_(std::move(ctx)) {}
  std::string_view name() const override { return "cuda"; }
  std::string describe() const override { return ctx_->description; }
  void set_threads(int) override {}

  std::unique_ptr<Conv2dKernel> make_conv2d(const Conv2dGeometry& g) override {
    ctx_->activate();
    return std::make_unique<CudaConv2dKernel>(*ctx_, g);
  }
  std::unique_ptr<MaxPool2dKernel> make_max_pool2d(const Pool2dGeometry& g) override {
    return std::make_unique<CudaMaxPoolKernel>(*ctx_, g);
  }
  std::unique_ptr<LinearKernel> make_linear(const LinearGeometry& g) override {
    return std::make_unique<CudaLinearKernel>(*ctx_, g);
  }
  std::unique_ptr<NetworkPlan> plan_network(std::span<const PlannedLayer> layers) override {
    if (!check_cuda_layers(layers)) return nullptr;  // check_layers() said so where the job was set up
    ctx_->activate();
    return std::make_unique<CudaPlan>(*ctx_, layers);
  }
  Result<void> check_layers(std::span<const PlannedLayer> layers) const override { return check_cuda_layers(layers); }

  Result<std::unique_ptr<ResidentState>> make_resident(Model& model, const OptimizerOptions& options) override {
    if (auto ok = check_cuda_layers(model.planned_layers(1)); !ok) return std::unexpected(ok.error());
    auto optimizer = make_optimizer(options, model.parameters().size());
    if (!optimizer) return std::unexpected(optimizer.error());
    ctx_->activate();
    return std::make_unique<CudaResident>(*ctx_, model, options, std::move(*optimizer));
  }

  void relu_forward(ConstTensorView x, TensorView y) override {
    TEPDIST_CHECK(x.elements() == y.elements());
    ctx_->activate();
    a_.resize(static_cast<size_t>(x.elements()));
    ctx_->upload(a_.get(), x.data, a_.size());
    TEPDIST_KERNEL(cuda::kernels::relu_forward(a_.get(), a_.get(), x.elements(), ctx_->stream));
    ctx_->download(y.data, a_.get(), a_.size());
  }
  void relu_backward(ConstTensorView y, ConstTensorView dy, TensorView dx) override {
    TEPDIST_CHECK(y.elements() == dy.elements() && dy.elements() == dx.elements());
    ctx_->activate();
    a_.resize(static_cast<size_t>(y.elements()));
    b_.resize(a_.size());
    ctx_->upload(a_.get(), y.data, a_.size());
    ctx_->upload(b_.get(), dy.data, b_.size());
    TEPDIST_KERNEL(cuda::kernels::relu_backward(a_.get(), b_.get(), b_.get(), y.elements(), ctx_->stream));
    ctx_->download(dx.data, b_.get(), b_.size());
  }

 private:
  float do_softmax_cross_entropy_forward(ConstTensorView logits, std::span<const int32_t> labels,
                                         TensorView probs) override {
    const int64_t n = logits.shape[0], classes = logits.shape[1];
    ctx_->activate();
    a_.resize(static_cast<size_t>(logits.elements()));
    b_.resize(a_.size() + 1);
    labels_.resize(labels.size());
    row_loss_.resize(static_cast<size_t>(n));
    ctx_->upload(a_.get(), logits.data, a_.size());
    ctx_->upload(labels_.get(), labels.data(), labels.size());
    float* loss = b_.get() + a_.size();
    TEPDIST_KERNEL(cuda::kernels::softmax_cross_entropy_forward(a_.get(), labels_.get(), b_.get(), row_loss_.get(), loss, n,
                                                                classes, ctx_->stream));
    ctx_->download(probs.data, b_.get(), a_.size());
    float mean = 0.0f;
    ctx_->download(&mean, loss, 1);
    return mean;
  }
  void do_softmax_cross_entropy_backward(ConstTensorView probs, std::span<const int32_t> labels,
                                         TensorView dlogits) override {
    ctx_->activate();
    a_.resize(static_cast<size_t>(probs.elements()));
    b_.resize(a_.size());
    labels_.resize(labels.size());
    ctx_->upload(a_.get(), probs.data, a_.size());
    ctx_->upload(labels_.get(), labels.data(), labels.size());
    TEPDIST_KERNEL(cuda::kernels::softmax_cross_entropy_backward(a_.get(), labels_.get(), b_.get(), probs.shape[0],
                                                                 probs.shape[1], ctx_->stream));
    ctx_->download(dlogits.data, b_.get(), b_.size());
  }

  std::unique_ptr<Context> ctx_;
  DeviceBuffer<float> a_, b_;  // the host-view operations' copies
  DeviceBuffer<int32_t> labels_;
  DeviceBuffer<double> row_loss_;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_cuda_backend(int device, bool deterministic) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    return fail(Errc::invalid_argument,
                fmt::format("compute.backend \"cuda\" on device {}: no CUDA device here (the CUDA runtime says: {}); "
                            "use backend \"onednn\" on this machine",
                            device, e != cudaSuccess ? cudaGetErrorString(e) : "the driver sees no device"));
  if (device < 0 || device >= count)
    return fail(Errc::invalid_argument,
                fmt::format("compute.device {}: this machine has {} CUDA device{} (0 to {})", device, count,
                            count == 1 ? "" : "s", count - 1));
  auto api = cuda::cublas();
  if (!api) return std::unexpected(api.error());
  auto ctx = std::make_unique<Context>();
  ctx->api = *api;
  ctx->device = device;
  ctx->deterministic = deterministic;
  ctx->activate();
  cudaDeviceProp prop{};
  TEPDIST_CUDA(cudaGetDeviceProperties(&prop, device));
  TEPDIST_CUDA(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
  TEPDIST_CUDNN(cudnnCreate(&ctx->dnn));
  TEPDIST_CUDNN(cudnnSetStream(ctx->dnn, ctx->stream));
  TEPDIST_CUBLAS(*ctx, ctx->api->create(&ctx->blas));
  TEPDIST_CUBLAS(*ctx, ctx->api->set_stream(ctx->blas, ctx->stream));
  // float32 products: TF32 is a separate mode
  TEPDIST_CUBLAS(*ctx, ctx->api->set_math_mode(ctx->blas, CUBLAS_DEFAULT_MATH));
  int blas_version = 0;
  TEPDIST_CUBLAS(*ctx, ctx->api->get_version(ctx->blas, &blas_version));
  const size_t dnn = cudnnGetVersion();
  ctx->description = fmt::format("cuda:{} ({}, compute capability {}.{}, {} multiprocessors; cuDNN {}.{}.{}, cuBLAS {}, "
                                 "float32 without TF32, {})",
                                 device, prop.name, prop.major, prop.minor, prop.multiProcessorCount, dnn / 10000,
                                 dnn / 100 % 100, dnn % 100, blas_version,
                                 deterministic ? "deterministic algorithms" : "fastest measured algorithms");
  return std::make_unique<CudaBackend>(std::move(ctx));
}

}  // namespace tepdist::compute

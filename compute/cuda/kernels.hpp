#pragma once
// The CUDA backend's own kernels (kernels.cu), behind a plain C++20 interface: nvcc 13 compiles
// C++20 at most, so the .cu file sees only this header and the backend (C++23) only these
// declarations. Every pointer is device memory; every launch is asynchronous on `stream`, and
// every function returns the launch's error code (cudaSuccess, 0, when it queued).
//
// The rules are the reference backend's (compute/ref), NaN included: ReLU keeps a NaN, a pooling
// window holding a NaN gives its first NaN, a NaN logit makes its row's probabilities and the loss
// NaN. Index arithmetic is 32-bit (64-bit division is many times slower on the GPU): the backend
// refuses tensors of 2^31 elements or more. The optimiser kernels are compiled without contracted multiply-adds (-fmad=false) and in
// the host loops' order of operations, so a GPU replica's update is bit-identical to a CPU one's.

#include <cstdint>

using cudaStream_t = struct CUstream_st*;

namespace tepdist::compute::cuda::kernels {

int relu_forward(const float* x, float* y, int64_t n, cudaStream_t stream);
/// dx = dy where y > 0, else 0.
int relu_backward(const float* y, const float* dy, float* dx, int64_t n, cudaStream_t stream);

/// y[i, c, ...] += b[c] for y viewed as [outer, channels, inner].
int add_bias(float* y, const float* b, int64_t outer, int64_t channels, int64_t inner, cudaStream_t stream);
/// db[c] = sum of dy[i, c, j] over i and j, for dy viewed as [outer, channels, inner], in a fixed
/// order (the same sum every run). With inner > 1 it sums in two passes through scratch, which
/// holds channels * bias_gradient_splits floats.
constexpr int64_t bias_gradient_splits = 32;
int bias_gradient(const float* dy, float* db, int64_t outer, int64_t channels, int64_t inner, float* scratch,
                  cudaStream_t stream);

/// Max pooling without padding over x [planes, h, w]; argmax gets the flat index into x of each
/// output's maximum (the first on ties, the first NaN where there is one).
int max_pool_forward(const float* x, float* y, int32_t* argmax, int64_t planes, int64_t h, int64_t w, int64_t kernel,
                     int64_t stride, cudaStream_t stream);
/// dx[i] = the sum of dy over the outputs whose argmax is i (gathered, not scattered: overlapping
/// windows add in a fixed order).
int max_pool_backward(const float* dy, const int32_t* argmax, float* dx, int64_t planes, int64_t h, int64_t w,
                      int64_t kernel, int64_t stride, cudaStream_t stream);

/// probs = softmax(logits) per row; row_loss[i] = -log probs[i, labels[i]] (in double, as the
/// reference computes it); then loss[0] = the mean of row_loss, summed in a fixed order.
int softmax_cross_entropy_forward(const float* logits, const int32_t* labels, float* probs, double* row_loss,
                                  float* loss, int64_t n, int64_t classes, cudaStream_t stream);
/// dlogits = (probs - onehot(labels)) / n.
int softmax_cross_entropy_backward(const float* probs, const int32_t* labels, float* dlogits, int64_t n,
                                   int64_t classes, cudaStream_t stream);

/// flag[0] = 1 if any of values is NaN or infinite; flag[0] must be 0 before.
int find_nonfinite(const float* values, int64_t n, int32_t* flag, cudaStream_t stream);

/// The optimisers of compute/optimizer.cpp, element for element.
int sgd_update(float* p, const float* grad, float* momentum, int64_t n, float lr, float weight_decay, float mu,
               bool nesterov, cudaStream_t stream);
int adam_update(float* p, const float* grad, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                float eps, float c1, float c2, float weight_decay, bool decoupled, cudaStream_t stream);

/// A short name for a launch's error code.
const char* error_name(int code);

}  // namespace tepdist::compute::cuda::kernels

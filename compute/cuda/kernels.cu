// The CUDA backend's own kernels: see kernels.hpp for what each computes. Compiled with
// -fmad=false (compute/CMakeLists.txt) so no multiply and add is fused into one rounding, as on
// the host.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "compute/cuda/kernels.hpp"

namespace tepdist::compute::cuda::kernels {
namespace {

constexpr int threads = 256;

/// Blocks for a grid-stride loop over n elements: enough to fill the chip, no more.
unsigned blocks_for(int64_t n) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 8192 ? 8192 : b));
}

int launched() { return static_cast<int>(cudaGetLastError()); }

#define TEPDIST_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); i += int64_t{gridDim.x} * blockDim.x)

__global__ void relu_forward_kernel(const float* x, float* y, int64_t n) {
  // x < 0 is false for a NaN, which is kept (std::max(x, 0) on the host)
  TEPDIST_GRID_STRIDE(i, n) { y[i] = x[i] < 0.0f ? 0.0f : x[i]; }
}

__global__ void relu_backward_kernel(const float* y, const float* dy, float* dx, int64_t n) {
  TEPDIST_GRID_STRIDE(i, n) { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; }
}

__global__ void add_bias_kernel(float* y, const float* b, int64_t channels, int64_t inner, int64_t n) {
  TEPDIST_GRID_STRIDE(i, n) { y[i] += b[(i / inner) % channels]; }
}

/// One block per channel: each thread sums a fixed stride of the channel's elements, then a tree.
__global__ void bias_gradient_kernel(const float* dy, float* db, int64_t outer, int64_t channels, int64_t inner) {
  __shared__ float partial[threads];
  const int64_t c = blockIdx.x;
  const int64_t count = outer * inner;
  float sum = 0.0f;
  for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
    const int64_t i = k / inner, j = k % inner;
    sum += dy[(i * channels + c) * inner + j];
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int half = threads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[c] = partial[0];
}

__global__ void max_pool_forward_kernel(const float* x, float* y, int32_t* argmax, int64_t planes, int64_t h,
                                        int64_t w, int64_t kernel, int64_t stride, int64_t oh, int64_t ow) {
  TEPDIST_GRID_STRIDE(out, planes * oh * ow) {
    const int64_t ox = out % ow, oy = (out / ow) % oh, plane = out / (oh * ow);
    const int64_t base = plane * h * w;
    int64_t best = base + (oy * stride) * w + ox * stride;
    for (int64_t ky = 0; ky < kernel; ++ky)
      for (int64_t kx = 0; kx < kernel; ++kx) {
        const int64_t i = base + (oy * stride + ky) * w + ox * stride + kx;
        // the reference's rule: a larger value or a NaN replaces a best that is not NaN
        if (!isnan(x[best]) && !(x[i] <= x[best])) best = i;
      }
    y[out] = x[best];
    argmax[out] = static_cast<int32_t>(best);
  }
}

__global__ void max_pool_backward_kernel(const float* dy, const int32_t* argmax, float* dx, int64_t planes, int64_t h,
                                         int64_t w, int64_t kernel, int64_t stride, int64_t oh, int64_t ow) {
  TEPDIST_GRID_STRIDE(in, planes * h * w) {
    const int64_t ix = in % w, iy = (in / w) % h, plane = in / (h * w);
    // outputs whose window covers (iy, ix): oy * stride <= iy < oy * stride + kernel
    const int64_t oy0 = iy >= kernel ? (iy - kernel) / stride + 1 : 0, oy1 = iy / stride < oh - 1 ? iy / stride : oh - 1;
    const int64_t ox0 = ix >= kernel ? (ix - kernel) / stride + 1 : 0, ox1 = ix / stride < ow - 1 ? ix / stride : ow - 1;
    float sum = 0.0f;
    for (int64_t oy = oy0; oy <= oy1; ++oy)
      for (int64_t ox = ox0; ox <= ox1; ++ox) {
        const int64_t out = (plane * oh + oy) * ow + ox;
        if (argmax[out] == in) sum += dy[out];
      }
    dx[in] = sum;
  }
}

__global__ void softmax_rows_kernel(const float* logits, const int32_t* labels, float* probs, double* row_loss,
                                    int64_t n, int64_t classes) {
  TEPDIST_GRID_STRIDE(i, n) {
    const float* z = logits + i * classes;
    float* p = probs + i * classes;
    float zmax = z[0];  // std::max_element's: the first largest
    for (int64_t j = 1; j < classes; ++j)
      if (zmax < z[j]) zmax = z[j];
    double sum = 0.0;
    for (int64_t j = 0; j < classes; ++j) sum += exp(static_cast<double>(z[j] - zmax));
    for (int64_t j = 0; j < classes; ++j) p[j] = static_cast<float>(exp(static_cast<double>(z[j] - zmax)) / sum);
    row_loss[i] = log(sum) - static_cast<double>(z[labels[i]] - zmax);
  }
}

/// One block: the mean of n doubles, in a fixed order.
__global__ void mean_kernel(const double* values, float* mean, int64_t n) {
  __shared__ double partial[threads];
  double sum = 0.0;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) sum += values[k];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int half = threads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) mean[0] = static_cast<float>(partial[0] / static_cast<double>(n));
}

__global__ void softmax_backward_kernel(const float* probs, const int32_t* labels, float* dlogits, int64_t n,
                                        int64_t classes) {
  const float inv_n = 1.0f / static_cast<float>(n);
  TEPDIST_GRID_STRIDE(k, n * classes) {
    const int64_t i = k / classes, j = k % classes;
    const float onehot = j == labels[i] ? 1.0f : 0.0f;
    dlogits[k] = (probs[k] - onehot) * inv_n;
  }
}

__global__ void find_nonfinite_kernel(const float* values, int64_t n, int32_t* flag) {
  TEPDIST_GRID_STRIDE(i, n) {
    if (!isfinite(values[i])) *flag = 1;  // every writer writes the same value
  }
}

__global__ void sgd_plain_kernel(float* p, const float* grad, int64_t n, float lr, float wd) {
  TEPDIST_GRID_STRIDE(i, n) { p[i] -= lr * (grad[i] + wd * p[i]); }
}

__global__ void sgd_momentum_kernel(float* p, const float* grad, float* buf, int64_t n, float lr, float wd, float mu) {
  TEPDIST_GRID_STRIDE(i, n) {
    buf[i] = mu * buf[i] + grad[i] + wd * p[i];
    p[i] -= lr * buf[i];
  }
}

__global__ void sgd_nesterov_kernel(float* p, const float* grad, float* buf, int64_t n, float lr, float wd, float mu) {
  TEPDIST_GRID_STRIDE(i, n) {
    const float g = grad[i] + wd * p[i];
    buf[i] = mu * buf[i] + g;
    p[i] -= lr * (g + mu * buf[i]);
  }
}

__global__ void adam_kernel(float* p, const float* grad, float* m, float* v, int64_t n, float lr, float b1, float b2,
                            float eps, float decay, float l2, float inv_c1, float inv_c2) {
  TEPDIST_GRID_STRIDE(i, n) {
    const float g = grad[i] + l2 * p[i];
    m[i] = b1 * m[i] + (1.0f - b1) * g;
    v[i] = b2 * v[i] + (1.0f - b2) * g * g;
    p[i] = p[i] * decay - lr * (m[i] * inv_c1) / (sqrtf(v[i] * inv_c2) + eps);
  }
}

}  // namespace

int relu_forward(const float* x, float* y, int64_t n, cudaStream_t s) {
  relu_forward_kernel<<<blocks_for(n), threads, 0, s>>>(x, y, n);
  return launched();
}

int relu_backward(const float* y, const float* dy, float* dx, int64_t n, cudaStream_t s) {
  relu_backward_kernel<<<blocks_for(n), threads, 0, s>>>(y, dy, dx, n);
  return launched();
}

int add_bias(float* y, const float* b, int64_t outer, int64_t channels, int64_t inner, cudaStream_t s) {
  const int64_t n = outer * channels * inner;
  add_bias_kernel<<<blocks_for(n), threads, 0, s>>>(y, b, channels, inner, n);
  return launched();
}

int bias_gradient(const float* dy, float* db, int64_t outer, int64_t channels, int64_t inner, cudaStream_t s) {
  bias_gradient_kernel<<<static_cast<unsigned>(channels), threads, 0, s>>>(dy, db, outer, channels, inner);
  return launched();
}

int max_pool_forward(const float* x, float* y, int32_t* argmax, int64_t planes, int64_t h, int64_t w, int64_t kernel,
                     int64_t stride, cudaStream_t s) {
  const int64_t oh = (h - kernel) / stride + 1, ow = (w - kernel) / stride + 1;
  max_pool_forward_kernel<<<blocks_for(planes * oh * ow), threads, 0, s>>>(x, y, argmax, planes, h, w, kernel, stride,
                                                                            oh, ow);
  return launched();
}

int max_pool_backward(const float* dy, const int32_t* argmax, float* dx, int64_t planes, int64_t h, int64_t w,
                      int64_t kernel, int64_t stride, cudaStream_t s) {
  const int64_t oh = (h - kernel) / stride + 1, ow = (w - kernel) / stride + 1;
  max_pool_backward_kernel<<<blocks_for(planes * h * w), threads, 0, s>>>(dy, argmax, dx, planes, h, w, kernel, stride,
                                                                           oh, ow);
  return launched();
}

int softmax_cross_entropy_forward(const float* logits, const int32_t* labels, float* probs, double* row_loss,
                                  float* loss, int64_t n, int64_t classes, cudaStream_t s) {
  softmax_rows_kernel<<<blocks_for(n), threads, 0, s>>>(logits, labels, probs, row_loss, n, classes);
  if (const int e = launched(); e != 0) return e;
  mean_kernel<<<1, threads, 0, s>>>(row_loss, loss, n);
  return launched();
}

int softmax_cross_entropy_backward(const float* probs, const int32_t* labels, float* dlogits, int64_t n,
                                   int64_t classes, cudaStream_t s) {
  softmax_backward_kernel<<<blocks_for(n * classes), threads, 0, s>>>(probs, labels, dlogits, n, classes);
  return launched();
}

int find_nonfinite(const float* values, int64_t n, int32_t* flag, cudaStream_t s) {
  find_nonfinite_kernel<<<blocks_for(n), threads, 0, s>>>(values, n, flag);
  return launched();
}

int sgd_update(float* p, const float* grad, float* momentum, int64_t n, float lr, float wd, float mu, bool nesterov,
               cudaStream_t s) {
  if (mu == 0.0f)
    sgd_plain_kernel<<<blocks_for(n), threads, 0, s>>>(p, grad, n, lr, wd);
  else if (!nesterov)
    sgd_momentum_kernel<<<blocks_for(n), threads, 0, s>>>(p, grad, momentum, n, lr, wd, mu);
  else
    sgd_nesterov_kernel<<<blocks_for(n), threads, 0, s>>>(p, grad, momentum, n, lr, wd, mu);
  return launched();
}

int adam_update(float* p, const float* grad, float* m, float* v, int64_t n, float lr, float b1, float b2, float eps,
                float c1, float c2, float wd, bool decoupled, cudaStream_t s) {
  // the host loop's scalars, computed the same way
  const float decay = decoupled ? 1.0f - lr * wd : 1.0f;
  const float l2 = decoupled ? 0.0f : wd;
  const float inv_c1 = 1.0f / c1, inv_c2 = 1.0f / c2;
  adam_kernel<<<blocks_for(n), threads, 0, s>>>(p, grad, m, v, n, lr, b1, b2, eps, decay, l2, inv_c1, inv_c2);
  return launched();
}

const char* error_name(int code) { return cudaGetErrorName(static_cast<cudaError_t>(code)); }

}  // namespace tepdist::compute::cuda::kernels

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

__global__ void add_bias_kernel(float* y, const float* b, uint32_t channels, uint32_t inner, int64_t n) {
  TEPDIST_GRID_STRIDE(i, n) { y[i] += b[(static_cast<uint32_t>(i) / inner) % channels]; }
}

/// inner == 1 (a linear layer's [n, out]): one thread per channel down its column; neighbouring
/// threads read neighbouring floats.
__global__ void column_sum_kernel(const float* dy, float* db, uint32_t outer, uint32_t channels) {
  for (uint32_t c = blockIdx.x * blockDim.x + threadIdx.x; c < channels; c += gridDim.x * blockDim.x) {
    float sum = 0.0f;
    for (uint32_t i = 0; i < outer; ++i) sum += dy[static_cast<size_t>(i) * channels + c];
    db[c] = sum;
  }
}

/// inner > 1, first pass: block (c, s) sums rows i = s, s + splits, ... of channel c, its threads
/// across the row's inner elements, then a tree; partial[c * splits + s].
__global__ void channel_partial_kernel(const float* dy, float* partial, uint32_t outer, uint32_t channels,
                                       uint32_t inner) {
  __shared__ float part[threads];
  const uint32_t c = blockIdx.x, s = blockIdx.y, splits = gridDim.y;
  float sum = 0.0f;
  for (uint32_t i = s; i < outer; i += splits) {
    const float* row = dy + (static_cast<size_t>(i) * channels + c) * inner;
    for (uint32_t j = threadIdx.x; j < inner; j += blockDim.x) sum += row[j];
  }
  part[threadIdx.x] = sum;
  __syncthreads();
  for (int half = threads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[c * splits + s] = part[0];
}

/// Second pass: each channel's partials in order.
__global__ void channel_total_kernel(const float* partial, float* db, uint32_t channels, uint32_t splits) {
  for (uint32_t c = blockIdx.x * blockDim.x + threadIdx.x; c < channels; c += gridDim.x * blockDim.x) {
    float sum = 0.0f;
    for (uint32_t s = 0; s < splits; ++s) sum += partial[c * splits + s];
    db[c] = sum;
  }
}

__global__ void max_pool_forward_kernel(const float* x, float* y, int32_t* argmax, uint32_t h, uint32_t w,
                                        uint32_t kernel, uint32_t stride, uint32_t oh, uint32_t ow, int64_t outputs) {
  TEPDIST_GRID_STRIDE(o, outputs) {
    const uint32_t out = static_cast<uint32_t>(o);
    const uint32_t ox = out % ow, rest = out / ow, oy = rest % oh, plane = rest / oh;
    const uint32_t base = plane * h * w;
    uint32_t best = base + (oy * stride) * w + ox * stride;
    for (uint32_t ky = 0; ky < kernel; ++ky)
      for (uint32_t kx = 0; kx < kernel; ++kx) {
        const uint32_t i = base + (oy * stride + ky) * w + ox * stride + kx;
        // the reference's rule: a larger value or a NaN replaces a best that is not NaN
        if (!isnan(x[best]) && !(x[i] <= x[best])) best = i;
      }
    y[out] = x[best];
    argmax[out] = static_cast<int32_t>(best);
  }
}

__global__ void max_pool_backward_kernel(const float* dy, const int32_t* argmax, float* dx, uint32_t h, uint32_t w,
                                         uint32_t kernel, uint32_t stride, uint32_t oh, uint32_t ow, int64_t inputs) {
  TEPDIST_GRID_STRIDE(n, inputs) {
    const uint32_t in = static_cast<uint32_t>(n);
    const uint32_t ix = in % w, rest = in / w, iy = rest % h, plane = rest / h;
    // outputs whose window covers (iy, ix): oy * stride <= iy < oy * stride + kernel
    const uint32_t oy0 = iy >= kernel ? (iy - kernel) / stride + 1 : 0, oy1 = min(iy / stride, oh - 1);
    const uint32_t ox0 = ix >= kernel ? (ix - kernel) / stride + 1 : 0, ox1 = min(ix / stride, ow - 1);
    float sum = 0.0f;
    for (uint32_t oy = oy0; oy <= oy1; ++oy)
      for (uint32_t ox = ox0; ox <= ox1; ++ox) {
        const uint32_t out = (plane * oh + oy) * ow + ox;
        if (argmax[out] == static_cast<int32_t>(in)) sum += dy[out];
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
  add_bias_kernel<<<blocks_for(n), threads, 0, s>>>(y, b, static_cast<uint32_t>(channels), static_cast<uint32_t>(inner), n);
  return launched();
}

int bias_gradient(const float* dy, float* db, int64_t outer, int64_t channels, int64_t inner, float* scratch,
                  cudaStream_t s) {
  const unsigned channel_blocks = blocks_for(channels);
  if (inner == 1) {
    column_sum_kernel<<<channel_blocks, threads, 0, s>>>(dy, db, static_cast<uint32_t>(outer),
                                                         static_cast<uint32_t>(channels));
    return launched();
  }
  const dim3 grid(static_cast<unsigned>(channels), static_cast<unsigned>(bias_gradient_splits));
  channel_partial_kernel<<<grid, threads, 0, s>>>(dy, scratch, static_cast<uint32_t>(outer),
                                                  static_cast<uint32_t>(channels), static_cast<uint32_t>(inner));
  if (const int e = launched(); e != 0) return e;
  channel_total_kernel<<<channel_blocks, threads, 0, s>>>(scratch, db, static_cast<uint32_t>(channels),
                                                          static_cast<uint32_t>(bias_gradient_splits));
  return launched();
}

int max_pool_forward(const float* x, float* y, int32_t* argmax, int64_t planes, int64_t h, int64_t w, int64_t kernel,
                     int64_t stride, cudaStream_t s) {
  const int64_t oh = (h - kernel) / stride + 1, ow = (w - kernel) / stride + 1;
  const int64_t outputs = planes * oh * ow;
  max_pool_forward_kernel<<<blocks_for(outputs), threads, 0, s>>>(
      x, y, argmax, static_cast<uint32_t>(h), static_cast<uint32_t>(w), static_cast<uint32_t>(kernel),
      static_cast<uint32_t>(stride), static_cast<uint32_t>(oh), static_cast<uint32_t>(ow), outputs);
  return launched();
}

int max_pool_backward(const float* dy, const int32_t* argmax, float* dx, int64_t planes, int64_t h, int64_t w,
                      int64_t kernel, int64_t stride, cudaStream_t s) {
  const int64_t oh = (h - kernel) / stride + 1, ow = (w - kernel) / stride + 1;
  const int64_t inputs = planes * h * w;
  max_pool_backward_kernel<<<blocks_for(inputs), threads, 0, s>>>(
      dy, argmax, dx, static_cast<uint32_t>(h), static_cast<uint32_t>(w), static_cast<uint32_t>(kernel),
      static_cast<uint32_t>(stride), static_cast<uint32_t>(oh), static_cast<uint32_t>(ow), inputs);
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

#include "compute/ref/gemm.hpp"

namespace tepdist::compute::ref {

void gemm_nn(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c, bool accumulate) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; ++i) {
    float* ci = c + i * n;
    if (!accumulate)
      for (int64_t j = 0; j < n; ++j) ci[j] = 0.0f;
    for (int64_t p = 0; p < k; ++p) {
      const float aip = a[i * k + p];
      const float* bp = b + p * n;
      for (int64_t j = 0; j < n; ++j) ci[j] += aip * bp[j];
    }
  }
}

void gemm_nt(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c, bool accumulate) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; ++i) {
    const float* ai = a + i * k;
    for (int64_t j = 0; j < n; ++j) {
      const float* bj = b + j * k;
      float dot = 0.0f;
      // simd reduction: lets the compiler reorder the sum into vector lanes.
#pragma omp simd reduction(+ : dot)
      for (int64_t p = 0; p < k; ++p) dot += ai[p] * bj[p];
      c[i * n + j] = accumulate ? c[i * n + j] + dot : dot;
    }
  }
}

void gemm_tn(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c, bool accumulate) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; ++i) {
    float* ci = c + i * n;
    if (!accumulate)
      for (int64_t j = 0; j < n; ++j) ci[j] = 0.0f;
    for (int64_t p = 0; p < k; ++p) {
      const float api = a[p * m + i];
      const float* bp = b + p * n;
      for (int64_t j = 0; j < n; ++j) ci[j] += api * bp[j];
    }
  }
}

}  // namespace tepdist::compute::ref

#pragma once
// Plain-loop matrix products for the reference backend. Row-major, no blocking, no tricks beyond
// choosing the loop order that walks memory contiguously. Rows of C are split over the OpenMP team
// when called outside a parallel region; inside one they run on the calling thread.

#include <cstdint>

namespace tepdist::compute::ref {

/// C [m, n] (+)= A [m, k] * B [k, n].
void gemm_nn(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c, bool accumulate);
/// C [m, n] (+)= A [m, k] * B [n, k]^T.
void gemm_nt(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c, bool accumulate);
/// C [m, n] (+)= A [k, m]^T * B [k, n].
void gemm_tn(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c, bool accumulate);

}  // namespace tepdist::compute::ref

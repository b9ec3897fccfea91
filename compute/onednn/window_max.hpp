#pragma once
// What the direct AVX2 kernels (first_conv.cpp, blocked_pool.cpp, conv_backward_*.cpp) share: the
// 2x2 window maximum of 8 channels at a time, the byte codes that record where it stood, and
// adding a register tile of sums to memory.
//
// Include only from files whose AVX2 functions carry TEPDIST_AVX2; callers check the CPU first.

#include <immintrin.h>

#include <cstdint>

#define TEPDIST_AVX2 [[gnu::target("avx2,fma")]]

namespace tepdist::compute::onednn::window {

/// Lanes per vector, and channels per block of oneDNN's nChw8c layout.
constexpr int64_t kLanes = 8;

/// The largest of a window's candidates so far and its code: 2 * row + column within the window.
struct Pick {
  __m256 max, code;
};

/// Takes `candidate` where it is strictly greater, so the first maximum wins ties. A NaN is
/// never greater: this alone drops a NaN candidate (and keeps a NaN already picked).
TEPDIST_AVX2 inline void consider_greater(Pick& p, __m256 candidate, float code) {
  const __m256 take = _mm256_cmp_ps(candidate, p.max, _CMP_GT_OQ);
  p.max = _mm256_blendv_ps(p.max, candidate, take);
  p.code = _mm256_blendv_ps(p.code, _mm256_set1_ps(code), take);
}

/// Takes `candidate` where it is strictly greater, or where it is the first NaN: "not less or
/// equal" is true for a NaN on either side, so it takes a NaN candidate, and the ordered
/// self-compare then keeps the NaN picked.
TEPDIST_AVX2 inline void consider(Pick& p, __m256 candidate, float code) {
  const __m256 take =
      _mm256_and_ps(_mm256_cmp_ps(candidate, p.max, _CMP_NLE_UQ), _mm256_cmp_ps(p.max, p.max, _CMP_ORD_Q));
  p.max = _mm256_blendv_ps(p.max, candidate, take);
  p.code = _mm256_blendv_ps(p.code, _mm256_set1_ps(code), take);
}

/// The maximum of four candidates in window order (0, 0), (0, 1), (1, 0), (1, 1), as in the
/// reference: the first maximum on ties, and NaN, coded at the first NaN, where one is NaN.
TEPDIST_AVX2 inline Pick window_max(__m256 c00, __m256 c01, __m256 c10, __m256 c11) {
  Pick p{c00, _mm256_setzero_ps()};
  consider(p, c01, 1.0f);
  consider(p, c10, 2.0f);
  consider(p, c11, 3.0f);
  return p;
}

/// window_max for a maximum that a ReLU follows, one compare cheaper per candidate: NaN where a
/// candidate is NaN, as there, but coded at the first maximum of the others. The ReLU passes no
/// gradient to a NaN (y > 0 is false), so where the code points does not matter then.
TEPDIST_AVX2 inline Pick window_max_before_relu(__m256 c00, __m256 c01, __m256 c10, __m256 c11) {
  Pick p{c00, _mm256_setzero_ps()};
  consider_greater(p, c01, 1.0f);
  consider_greater(p, c10, 2.0f);
  consider_greater(p, c11, 3.0f);
  // All bits set (a NaN) where a pair is unordered, that is, holds a NaN.
  const __m256 nan = _mm256_or_ps(_mm256_cmp_ps(c00, c01, _CMP_UNORD_Q), _mm256_cmp_ps(c10, c11, _CMP_UNORD_Q));
  p.max = _mm256_or_ps(p.max, nan);
  return p;
}

/// Stores 8 codes (0..3, held as floats) as 8 bytes.
TEPDIST_AVX2 inline void store_codes(uint8_t* to, __m256 code) {
  const __m256i c = _mm256_cvtps_epi32(code);
  const __m128i c16 = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(to), _mm_packus_epi16(c16, c16));
}

/// 8 stored codes as 32-bit integers.
TEPDIST_AVX2 inline __m256i load_codes(const uint8_t* from) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(from)));
}

/// `d` where the code is q, else 0.
TEPDIST_AVX2 inline __m256 only_at(__m256 d, __m256i code, int q) {
  return _mm256_and_ps(d, _mm256_castsi256_ps(_mm256_cmpeq_epi32(code, _mm256_set1_epi32(q))));
}

/// Adds a register tile of accumulators to memory: to[j * row + b * block] += acc[j][b]. Inlined
/// always, so the accumulators stay in registers in the loops that fill them.
template <int NJ, int NB>
[[gnu::always_inline]] TEPDIST_AVX2 inline void add_tile(const __m256 (&acc)[NJ][NB], float* to, int64_t row,
                                                         int64_t block) {
#pragma GCC unroll 4
  for (int j = 0; j < NJ; ++j)
#pragma GCC unroll 3
    for (int b = 0; b < NB; ++b) {
      float* at = to + j * row + b * block;
      _mm256_storeu_ps(at, _mm256_add_ps(_mm256_loadu_ps(at), acc[j][b]));
    }
}

}  // namespace tepdist::compute::onednn::window

#pragma once
// 2x2 max pooling with stride 2 on oneDNN's nChw8c layout, as a direct AVX2 kernel.
//
// oneDNN 2.6's pooling (jit:avx2) took 1.9 ms a LeNet step for its second pool, forward and
// backward, on 0.2 M values: this kernel reads each window's four vectors once, keeps the maximum
// and a byte recording where it stood, and the backward pass writes each gradient to that place.
//
// Semantics are the reference's max_pool2d(2, 2): no padding, the first maximum of a window on
// ties, NaN for a window holding a NaN (its gradient goes to the first NaN), rows and columns past
// the last whole window get no gradient.

#include <cstdint>
#include <vector>

#include "compute/backend.hpp"

namespace tepdist::compute::onednn {

class BlockedMaxPool {
 public:
  /// Whether this kernel runs `g` (kernel 2, stride 2) on this CPU.
  static bool supports(const Pool2dGeometry& g);

  explicit BlockedMaxPool(const Pool2dGeometry& g);

  /// x [n, ceil(c/8), h, w, 8] -> y [n, ceil(c/8), oh, ow, 8]; records each maximum's place.
  void forward(const float* x, float* y);
  /// dx (overwritten, x's layout) from dy (y's layout) and the places of the last forward.
  void backward(const float* dy, float* dx);

 private:
  Pool2dGeometry g_;
  int64_t planes_;               // n * ceil(c/8)
  std::vector<uint8_t> where_;   // y's layout, one byte per value: 2 * row + column of the maximum
};

}  // namespace tepdist::compute::onednn

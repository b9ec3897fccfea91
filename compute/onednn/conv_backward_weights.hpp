#pragma once
// A convolution's weight and bias gradients (stride 1, no padding) from nChw8c activations, as a
// direct AVX2 kernel.
//
// oneDNN 2.6's backward-weights kernel for LeNet's second convolution took a quarter of a
// one-thread step. Here, per sample and kernel tap, a tile of 4 output channels by 3 blocks of 8
// input channels (12 accumulators) is summed over the output positions, each position one
// broadcast of the output gradient per output channel times the input vector the tap reaches.
// Threads take samples and keep their own sums, added up at the end.
//
// Layouts: x [n, ceil(c/8), h, w, 8], dy [n, ceil(k/8), oh, ow, 8]; dw [k, c, r, s] and db [k]
// are the model's plain gradients, overwritten. Padded channels do not reach them.

#include <cstdint>
#include <vector>

#include "compute/backend.hpp"

namespace tepdist::compute::onednn {

class ConvBackwardWeights {
 public:
  /// Whether this kernel computes `g`'s weight gradient (stride 1, no padding) on this CPU.
  static bool supports(const Conv2dGeometry& g);

  explicit ConvBackwardWeights(const Conv2dGeometry& g);

  void run(const float* x, const float* dy, float* dw, float* db);

 private:
  Conv2dGeometry g_;
  int64_t cblocks_, kblocks_;
  std::vector<std::vector<float>> sums_;  // per thread: [tap][k][cblocks][8], then [kblocks][8]
};

}  // namespace tepdist::compute::onednn

#pragma once
// A convolution's input gradient (stride 1, no padding) on oneDNN's nChw8c layout, as a direct
// AVX2 kernel.
//
// oneDNN 2.6's backward-data kernel for LeNet's second convolution (20 -> 50 channels, 5x5, 12x12
// input) ran at 37 GFLOP/s, a third of a one-thread step, where its forward pass reaches 65. Here
// the input gradient is a product of the output gradient [positions, k] and the weights
// [k, taps x channels], each tile of which is added where its tap lands ("col2im" fused into the
// product): a tile is 4 output positions of one row by 3 blocks of 8 input channels, 12
// accumulators summed over the output channels.
//
// Layouts: dy [n, ceil(k/8), oh, ow, 8] and dx [n, ceil(c/8), h, w, 8]; the weights are the
// model's plain [k, c, r, s]. Padded channels of dx are written as zeros (while dy is finite: the
// padded weights are zero); those of dy are not read.

#include <cstdint>
#include <vector>

#include "compute/backend.hpp"

namespace tepdist::compute::onednn {

class ConvBackwardData {
 public:
  /// Whether this kernel computes `g`'s input gradient (stride 1, no padding) on this CPU.
  static bool supports(const Conv2dGeometry& g);

  explicit ConvBackwardData(const Conv2dGeometry& g);

  /// dx (overwritten) from dy and the weights w.
  void run(const float* dy, const float* w, float* dx);

 private:
  Conv2dGeometry g_;
  int64_t cblocks_, kblocks_;
  std::vector<float> wpk_;  // [r][s][k][cblocks][8], channels past c zero
};

}  // namespace tepdist::compute::onednn

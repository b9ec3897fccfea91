#pragma once
// A network's first convolution when its input has one channel (a grey-scale image), fused with
// the 2x2 max pool and ReLU that follow it, as one direct AVX2 kernel.
//
// oneDNN 2.6 handles this stage poorly: with one input channel its weight-gradient kernel reaches
// 7 GFLOP/s, and its max pool on the 24x24 maps of LeNet took as long as the convolution itself
// (together 40% of a single-threaded LeNet step). Here one pass computes the four convolution
// outputs of each 2x2 window for 8 output channels per vector and keeps only their maximum, so the
// full-size convolution output is never written; the backward pass rebuilds its gradient from the
// recorded window positions and reduces the weight gradient over the batch.
//
// Layouts: the input is plain [n, 1, h, w]; weights [k, 1, r, s] and bias [k] are the model's
// plain parameters; the output and its gradient are oneDNN's nChw8c ([n, ceil(k/8), ph, pw, 8],
// channels past k zero), so the next convolution reads them without a reorder.
//
// Semantics are the reference's conv2d -> max_pool2d(2, 2) -> relu: stride 1, zero padding `pad`,
// the first maximum of a window on ties, NaN for a window holding a NaN (which gets no gradient),
// and the gradient of ReLU taken from its output.

#include <cstdint>
#include <vector>

#include "compute/backend.hpp"

namespace tepdist::compute::onednn {

class FirstConvPool {
 public:
  /// Whether this kernel runs conv (c == 1, stride 1) then pool (kernel 2, stride 2) on this CPU.
  static bool supports(const Conv2dGeometry& conv, const Pool2dGeometry& pool);

  explicit FirstConvPool(const Conv2dGeometry& conv);

  /// Channel blocks of 8 in the output layout.
  int64_t blocks() const { return blocks_; }
  int64_t pooled_h() const { return ph_; }
  int64_t pooled_w() const { return pw_; }

  /// y = relu(maxpool(conv(x, w) + b)), in nChw8c. Records each maximum's window position.
  void forward(const float* x, const float* w, const float* b, float* y);

  /// The weight and bias gradients (overwritten) from y and its gradient dy (both nChw8c) and the
  /// positions of the last forward.
  void backward(const float* x, const float* y, const float* dy, float* dw, float* db);

 private:
  Conv2dGeometry g_;
  int64_t blocks_, oh_, ow_, ph_, pw_, hp_, wp_;  // hp_, wp_: the padded input's size
  std::vector<float> wpk_, bpk_;                   // [block][r][s][8], [block][8]
  std::vector<uint8_t> where_;                     // [n][block][ph][pw][8]: 2 * dy + dx of the maximum
  std::vector<std::vector<float>> scratch_;        // per thread: padded input, dense gradient, sums
};

}  // namespace tepdist::compute::onednn

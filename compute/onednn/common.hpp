#pragma once
// What the oneDNN kernels and network plans share: the engine and stream, descriptor shorthands,
// and Operand, a plain caller buffer seen in the layout a primitive prefers.

#include <cstdint>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>

namespace tepdist::compute::onednn {

using md = dnnl::memory::desc;
using dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

inline md plain(const dims& d, tag t) { return md(d, dt::f32, t); }
/// A descriptor that lets the primitive choose the layout.
inline md any(const dims& d) { return md(d, dt::f32, tag::any); }

/// y = max(x, 0) over n floats, NaN where x is NaN (see backend.hpp); x and y may alias. Ours, not
/// oneDNN's: its ReLU, as a primitive or a post-op, computes vmaxps(x, 0), which returns 0 for a
/// NaN x.
void relu(const float* x, float* y, int64_t n);
/// dx = dy where y > 0, else 0, over n floats; dy and dx may alias.
void relu_backward(const float* y, const float* dy, float* dx, int64_t n);

/// The engine and stream every kernel and plan of one backend shares.
struct Context {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

/// One argument of a primitive: the caller's plain row-major buffer and, when the primitive
/// prefers another layout, a buffer of its own in that layout plus the reorders between the two.
/// Everything is created once; only data handles change per call.
class Operand {
 public:
  Operand() = default;
  Operand(const dnnl::engine& engine, const dnnl::memory::desc& plain, const dnnl::memory::desc& wanted)
      : user_(plain, engine, DNNL_MEMORY_NONE) {
    if (wanted != plain) {
      own_.emplace(wanted, engine);
      to_own_ = dnnl::reorder(user_, *own_);
      to_user_ = dnnl::reorder(*own_, user_);
    }
  }

  /// For an input: the memory to pass to the primitive, holding data in the wanted layout.
  const dnnl::memory& in(dnnl::stream& s, const float* data) {
    user_.set_data_handle(const_cast<float*>(data));
    if (!own_) return user_;
    to_own_.execute(s, user_, *own_);
    return *own_;
  }

  /// For an output: the memory the primitive writes; call finish() after executing it.
  const dnnl::memory& out(float* data) {
    user_.set_data_handle(data);
    return own_ ? *own_ : user_;
  }

  /// Copies an output written in the primitive's layout back into the caller's buffer.
  void finish(dnnl::stream& s) {
    if (own_) to_user_.execute(s, *own_, user_);
  }

 private:
  dnnl::memory user_;
  std::optional<dnnl::memory> own_;
  dnnl::reorder to_own_, to_user_;
};

}  // namespace tepdist::compute::onednn

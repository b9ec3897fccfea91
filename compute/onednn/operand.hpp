#pragma once
// One argument of a oneDNN primitive as the kernels see it: the caller's plain row-major buffer and,
// when the primitive prefers another layout, a buffer of its own in that layout plus the reorder
// between the two. Both reorders are created once; only data handles change per call.

#include <oneapi/dnnl/dnnl.hpp>
#include <optional>

namespace tepdist::compute::onednn {

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

/// \file
/// `ScopedFlushDenormal`: denormal floats flushed to zero while the executor computes.
#pragma once

#include "loadstar/config.hpp"

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#define LOADSTAR_HAS_MXCSR 1
#endif

namespace loadstar::keras::detail {

/// Sets flush-to-zero and denormals-are-zero on this thread for its lifetime, restoring the
/// previous mode afterwards.
///
/// TensorFlow runs every CPU kernel so (`port::ScopedFlushDenormal`), so Keras's numerics are
/// those of flushed denormals. It also matters for speed: Adam's `m` of a weight whose gradient
/// is zero (a dead ReLU unit) decays by `beta_1` every step into the denormal range, where each
/// arithmetic operation costs about a hundred cycles; measured on the MLP benchmark, training ran
/// 3.4 times slower without it. A no-op on processors without an MXCSR register.
class ScopedFlushDenormal {
 public:
  LOADSTAR_DECL ScopedFlushDenormal() noexcept;
  ~ScopedFlushDenormal() {
#if defined(LOADSTAR_HAS_MXCSR)
    _mm_setcsr(saved_);
#endif
  }
  ScopedFlushDenormal(const ScopedFlushDenormal&) = delete;
  ScopedFlushDenormal& operator=(const ScopedFlushDenormal&) = delete;

 private:
#if defined(LOADSTAR_HAS_MXCSR)
  static constexpr unsigned flush_to_zero = 0x8000;
  static constexpr unsigned denormals_are_zero = 0x0040;
  unsigned saved_ = 0;
#endif
};

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

ScopedFlushDenormal::ScopedFlushDenormal() noexcept {
#if defined(LOADSTAR_HAS_MXCSR)
  saved_ = _mm_getcsr();
  _mm_setcsr(saved_ | flush_to_zero | denormals_are_zero);
#endif
}

}  // namespace loadstar::keras::detail
#endif

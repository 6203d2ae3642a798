// The doctest main of the GPU tests: where no CUDA device can be used it prints why and exits
// with 77, which Meson reports as a skipped test, instead of failing every case.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <loadstar/cuda/detail/context.hpp>

int main(int argc, char** argv) {
  try {
    static_cast<void>(loadstar::cuda::detail::device_count());
  } catch (const loadstar::CudaError& error) {
    std::printf("skipped: the cuda suite needs a GPU (%s)\n", error.what());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}

// The real Fashion-MNIST for the tests that train on it: Debian's dataset-fashion-mnist, or the
// folder $LOADSTAR_FASHION_MNIST_DIR names (meson sets it from the fashion_mnist_dir option).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <loadstar/data/idx.hpp>
#include <loadstar/tensor/eigen.hpp>
#include <string>

namespace test_support {

/// One split of Fashion-MNIST.
struct FashionMnistSplit {
  loadstar::Tensor<float> x;  // (n, 28, 28) in [0, 1]
  loadstar::Tensor<std::uint8_t> y;
};

/// The split whose files start with `prefix` ("train" or "t10k"), pixels scaled to [0, 1].
inline FashionMnistSplit load_fashion_mnist(const std::string& prefix) {
  const char* dir = std::getenv("LOADSTAR_FASHION_MNIST_DIR");
  const std::filesystem::path folder = dir ? dir : "/usr/share/datasets/fashion-mnist";
  auto x = loadstar::read_idx<std::uint8_t>(folder / (prefix + "-images-idx3-ubyte.gz"), 3)
               .cast<float>();
  loadstar::as_vector(x) /= 255.0F;
  return {x, loadstar::read_idx<std::uint8_t>(folder / (prefix + "-labels-idx1-ubyte.gz"), 1)};
}

}  // namespace test_support

// Mixed precision's accuracy on the real Fashion-MNIST (Debian's dataset-fashion-mnist,
// $LOADSTAR_FASHION_MNIST_DIR): the Keras getting-started MLP trained for 10 epochs in float32 and
// under mixed_bfloat16 (its output softmax in float32, as Keras's mixed precision guide does),
// from the same seed on the same batches, for five seeds. The issue that brought mixed precision
// asks for test accuracies within 0.3 points; a single pair of runs does not hold that reliably,
// as one run's accuracy moves by about half a point with the seed and from one epoch to the next.
// Measured here (2 threads): after 10 epochs the pairs differed by at most 0.23 points with the
// bfloat16 products (CpuBackend::bfloat16_products) and by up to 0.42 with the float32 products
// (seed 1: float32 0.8810, mixed_bfloat16 0.8852); after 5 epochs by up to 0.88 (seed 3: 0.8773
// and 0.8685). The means over the five seeds differ by 0.06 and 0.20 points after 10 epochs (0.07
// after 5). So the test asks the means for 0.3 points, and each pair for one point. Suite 'slow':
// run in the optimised plain build only (under a minute with 2 threads), and again as
// 'keras_mixed_precision_accuracy_float32_products' on the float32 products.

#include <doctest/doctest.h>

#include "keras/fashion_mnist_split.hpp"

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <loadstar/keras.hpp>
#include <string>

using namespace loadstar;
using namespace loadstar::keras;

namespace {

/// The test accuracy of the MLP trained in `policy` for `epochs` epochs from seed `seed`.
double mixed_mlp_accuracy(const test_support::FashionMnistSplit& train,
                          const test_support::FashionMnistSplit& test, const std::string& policy,
                          std::uint64_t seed, std::size_t epochs) {
  set_random_seed(seed);
  const mixed_precision::PolicyScope scope(policy);
  layers::Activation output("softmax");
  output.set_dtype_policy("float32");
  Sequential model{Input({28, 28}), layers::Flatten(), layers::Dense(128, {.activation = "relu"}),
                   layers::Dense(10), std::move(output)};
  model.compile({.optimizer = optimizers::Adam({.learning_rate = 1e-3}),
                 .loss = losses::SparseCategoricalCrossentropy(),
                 .metrics = {"accuracy"},
                 .threads = 2});
  const auto start = std::chrono::steady_clock::now();
  model.fit(train.x, train.y, {.epochs = epochs, .batch_size = 32, .verbose = 0});
  const double accuracy = *model.evaluate(test.x, test.y, {.verbose = 0}).get("accuracy");
  std::printf("mlp in %s (seed %llu): test accuracy %.4f after %zu epochs (%.1f s)\n",
              policy.c_str(), static_cast<unsigned long long>(seed), accuracy, epochs,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return accuracy;
}

}  // namespace

TEST_SUITE("keras") {
  TEST_CASE("Fashion-MNIST MLP: mixed_bfloat16's mean accuracy within 0.3 points of float32's" *
            doctest::timeout(900)) {
    const auto train = test_support::load_fashion_mnist("train");
    const auto test = test_support::load_fashion_mnist("t10k");
    double float32_sum = 0, mixed_sum = 0;
    for (const std::uint64_t seed : {1, 2, 3, 7, 42}) {
      const double float32 = mixed_mlp_accuracy(train, test, "float32", seed, 10);
      const double mixed = mixed_mlp_accuracy(train, test, "mixed_bfloat16", seed, 10);
      INFO("seed ", seed, ": float32 ", float32, ", mixed_bfloat16 ", mixed);
      CHECK(std::abs(mixed - float32) <= 0.01);
      // Both trained: Keras's MLP reaches about 0.88 after 10 epochs.
      CHECK(float32 >= 0.87);
      CHECK(mixed >= 0.87);
      float32_sum += float32;
      mixed_sum += mixed;
    }
    std::printf("mean test accuracy over 5 seeds: float32 %.4f, mixed_bfloat16 %.4f\n",
                float32_sum / 5, mixed_sum / 5);
    CHECK(std::abs(mixed_sum - float32_sum) / 5 <= 0.003);
  }
}

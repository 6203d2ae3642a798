// Mixed precision's accuracy on the real Fashion-MNIST (Debian's dataset-fashion-mnist,
// $LOADSTAR_FASHION_MNIST_DIR): the Keras getting-started MLP trained in float32 and under
// mixed_bfloat16 (its output softmax in float32, as Keras's mixed precision guide does), from the
// same seed on the same batches, reaches test accuracies within 0.3 points of each other, as the
// issue that brought mixed precision asks. Suite 'slow': run in the optimised plain build only.

#include <doctest/doctest.h>

#include "keras/fashion_mnist_split.hpp"

#include <chrono>
#include <cmath>
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
  TEST_CASE("Fashion-MNIST MLP under mixed_bfloat16 reaches float32's accuracy within 0.3 points" *
            doctest::timeout(900)) {
    const auto train = test_support::load_fashion_mnist("train");
    const auto test = test_support::load_fashion_mnist("t10k");
    const double float32 = mixed_mlp_accuracy(train, test, "float32", 42, 5);
    const double mixed = mixed_mlp_accuracy(train, test, "mixed_bfloat16", 42, 5);
    INFO("float32 ", float32, ", mixed_bfloat16 ", mixed);
    CHECK(std::abs(mixed - float32) <= 0.003);
    // Both trained: Keras's MLP reaches about 0.87 after 5 epochs.
    CHECK(float32 >= 0.85);
    CHECK(mixed >= 0.85);
  }
}

// Trains the classic Keras getting-started model on Fashion-MNIST with loadstar's Keras API:
// Flatten -> Dense(128, relu) -> Dense(10), Adam(1e-3), batch 32, 5 epochs, with the progress bar
// and validation_split 0.1, then evaluates it on the test set and prints the accuracy.
//
//   fashion_mnist [folder] [threads]   (default: /usr/share/datasets/fashion-mnist, 2 threads)

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <loadstar/data/idx.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/tensor.hpp>
#include <string>

namespace {

struct Split {
  loadstar::Tensor<float> x;         // (n, 28, 28) in [0, 1]
  loadstar::Tensor<std::uint8_t> y;  // (n,) class ids
};

Split load(const std::filesystem::path& folder, const std::string& prefix) {
  const auto images =
      loadstar::read_idx<std::uint8_t>(folder / (prefix + "-images-idx3-ubyte.gz"), 3);
  auto x = images.cast<float>();
  loadstar::as_vector(x) /= 255.0f;
  return {x, loadstar::read_idx<std::uint8_t>(folder / (prefix + "-labels-idx1-ubyte.gz"), 1)};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace loadstar::keras;
  const std::filesystem::path folder = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
  const std::size_t threads = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 2;
  try {
    const Split train = load(folder, "train");
    const Split test = load(folder, "t10k");

    set_random_seed(42);
    Sequential model{Input({28, 28}), layers::Flatten(), layers::Dense(128, {.activation = "relu"}),
                     layers::Dense(10)};
    model.compile({.optimizer = optimizers::Adam({.learning_rate = 1e-3}),
                   .loss = losses::SparseCategoricalCrossentropy(/*from_logits=*/true),
                   .metrics = {"accuracy"},
                   .threads = threads});
    model.summary();

    model.fit(train.x, train.y, {.epochs = 5, .batch_size = 32, .validation_split = 0.1});

    const Logs results = model.evaluate(test.x, test.y, {.verbose = 0});
    std::printf("test loss: %.4f, test accuracy: %.4f\n", *results.get("loss"),
                *results.get("accuracy"));
  } catch (const std::exception& error) {
    std::fprintf(stderr, "fashion_mnist: %s\n", error.what());
    return 1;
  }
  return 0;
}

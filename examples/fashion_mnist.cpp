// Trains the classic Keras getting-started model on Fashion-MNIST with loadstar's Keras API:
// Flatten -> Dense(128, relu) -> Dense(10), Adam(1e-3), batch 32, 5 epochs, with the progress bar
// and validation_split 0.1, then evaluates it on the test set and prints the accuracy.
//
//   fashion_mnist [folder] [threads] [--gpu[=N]] [--cnn]
//     (default: /usr/share/datasets/fashion-mnist, 2 threads, the CPU backend); --gpu trains on
//     CUDA device N (0 by default) where the program was built with the CUDA backend
//     (LOADSTAR_WITH_CUDA, Meson's `loadstar-cuda`), with no other change to the model code;
//     --cnn trains a small CNN instead (Conv2D 32 -> MaxPooling2D -> Conv2D 64 -> MaxPooling2D ->
//     Flatten -> Dense(128, relu) -> Dense(10)), the same training otherwise.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <loadstar/data/idx.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/tensor.hpp>
#include <memory>
#include <string>
#include <string_view>
#include <vector>
#if LOADSTAR_WITH_CUDA
#include <loadstar/cuda.hpp>
#endif

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
  std::vector<std::string> positional;
  int gpu = -1;  // the CPU backend
  bool cnn = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--gpu") {
      gpu = 0;
    } else if (arg.starts_with("--gpu=")) {
      gpu = std::atoi(argv[i] + 6);
    } else if (arg == "--cnn") {
      cnn = true;
    } else {
      positional.emplace_back(arg);
    }
  }
  const std::filesystem::path folder =
      positional.size() > 0 ? positional[0] : "/usr/share/datasets/fashion-mnist";
  const std::size_t threads =
      positional.size() > 1 ? std::strtoul(positional[1].c_str(), nullptr, 10) : 2;
  try {
    std::shared_ptr<Backend> backend;  // empty: compile makes the CPU backend of `threads`
    if (gpu >= 0) {
#if LOADSTAR_WITH_CUDA
      backend = cuda_backend(gpu);
#else
      std::fprintf(stderr,
                   "fashion_mnist: --gpu: this program was built without the CUDA backend "
                   "(configure with -Dcuda=enabled where nvcc and cuBLAS are installed)\n");
      return 2;
#endif
    }
    const Split train = load(folder, "train");
    const Split test = load(folder, "t10k");

    set_random_seed(42);
    using namespace layers;
    Sequential model =
        cnn ? Sequential{Input({28, 28}),
                         Reshape({28, 28, 1}),
                         Conv2D(32, 3, {.activation = "relu"}),
                         MaxPooling2D(),
                         Conv2D(64, 3, {.activation = "relu"}),
                         MaxPooling2D(),
                         Flatten(),
                         Dense(128, {.activation = "relu"}),
                         Dense(10)}
            : Sequential{Input({28, 28}), Flatten(), Dense(128, {.activation = "relu"}), Dense(10)};
    model.compile({.optimizer = optimizers::Adam({.learning_rate = 1e-3}),
                   .loss = losses::SparseCategoricalCrossentropy(/*from_logits=*/true),
                   .metrics = {"accuracy"},
                   .threads = threads,
                   .backend = backend});
    model.summary();

    model.fit(train.x, train.y, {.epochs = 5, .batch_size = 32, .validation_split = 0.1});

    const Logs results = model.evaluate(test.x, test.y, {.verbose = 0});
    std::printf("test loss: %.4f, test accuracy: %.4f\n", *results.get("loss"),
                *results.get("accuracy"));
#if LOADSTAR_WITH_CUDA
    if (const auto* device = dynamic_cast<const loadstar::cuda::CudaBackend*>(backend.get())) {
      const auto& steps = device->graph_stats();
      std::printf(
          "cuda:%d: %zu steps replayed from CUDA graphs, %zu captured, %zu kernel by kernel\n",
          device->device_index(), steps.replayed, steps.captured, steps.eager + steps.fallbacks);
    }
#endif
  } catch (const std::exception& error) {
    std::fprintf(stderr, "fashion_mnist: %s\n", error.what());
    return 1;
  }
  return 0;
}

// Loads Fashion-MNIST from its IDX files, scales the images to float in [0, 1] and serves them as
// a Keras Sequence of batches of 32: the data side of the classic Keras getting-started example.
//
//   fashion_mnist_data [folder]   (default: /usr/share/datasets/fashion-mnist)

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <loadstar/data/array_sequence.hpp>
#include <loadstar/data/idx.hpp>
#include <loadstar/tensor.hpp>
#include <string>

namespace {

constexpr std::array<const char*, 10> class_names{"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                                  "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                                  "Bag",         "Ankle boot"};

struct Split {
  loadstar::Tensor<float> x;         // (n, 28, 28) in [0, 1]
  loadstar::Tensor<std::int64_t> y;  // (n,) class ids
};

Split load(const std::filesystem::path& folder, const std::string& prefix) {
  const auto images =
      loadstar::read_idx<std::uint8_t>(folder / (prefix + "-images-idx3-ubyte.gz"), 3);
  const auto labels =
      loadstar::read_idx<std::uint8_t>(folder / (prefix + "-labels-idx1-ubyte.gz"), 1);
  auto x = images.cast<float>();
  loadstar::as_vector(x) /= 255.0f;  // Eigen over the tensor's storage, in place
  return {x, labels.cast<std::int64_t>()};
}

void print_class_counts(const char* name, const loadstar::Tensor<std::int64_t>& y) {
  std::array<std::size_t, 10> counts{};
  for (auto label : y)
    ++counts.at(static_cast<std::size_t>(label));
  std::printf("%s per class:\n", name);
  for (std::size_t c = 0; c < counts.size(); ++c) {
    std::printf("  %zu %-12s %zu\n", c, class_names[c], counts[c]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::filesystem::path folder = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
  try {
    const Split train = load(folder, "train");
    const Split test = load(folder, "t10k");
    std::printf("train: x %s, y %s\n", train.x.shape().str().c_str(),
                train.y.shape().str().c_str());
    std::printf("test:  x %s, y %s\n", test.x.shape().str().c_str(), test.y.shape().str().c_str());
    print_class_counts("train", train.y);
    print_class_counts("test", test.y);

    const loadstar::ArraySequence sequence(train.x, train.y, 32);
    std::printf("batches of 32: %zu (the last holds %zu rows)\n", sequence.size(),
                train.x.rows() - (sequence.size() - 1) * 32);

    const auto [x, y] = sequence[0];
    const auto pixels = loadstar::as_vector(x);
    const float mean = pixels.mean();
    const float deviation = std::sqrt((pixels.array() - mean).square().mean());
    std::printf("first batch: x %s, mean %.4f, std %.4f, min %.4f, max %.4f\n",
                x.shape().str().c_str(), mean, deviation, pixels.minCoeff(), pixels.maxCoeff());
    std::printf("first batch labels:");
    for (auto label : y)
      std::printf(" %lld", static_cast<long long>(label));
    std::printf("\n");
  } catch (const std::exception& error) {
    std::fprintf(stderr, "fashion_mnist_data: %s\n", error.what());
    return 1;
  }
  return 0;
}

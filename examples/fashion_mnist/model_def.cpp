// Determined's Fashion-MNIST example (fashion_mnist_tf_keras) as a loadstar trial: the Keras
// getting-started MLP (Flatten -> Dense(hidden_size, relu) -> Dense(10)) trained with Adam on
// the training set and validated on the test set, run from an experiment configuration by the
// experiment commands that LOADSTAR_TRIAL_MAIN gives this program:
//
//   fashion_mnist_trial experiment create const.yaml      # one trial, 5 epochs
//   fashion_mnist_trial experiment create adaptive.yaml   # ASHA over learning rate and width
//   fashion_mnist_trial experiment create const.yaml --test
//
// The data are the IDX files in the folder named by the config's data.path, else by
// LOADSTAR_FASHION_MNIST_DIR, else /usr/share/datasets/fashion-mnist. With data.workers, the
// training images are read as a Keras Sequence by that many workers (in processes with
// data.use_multiprocessing), as Determined's configure_fit does.

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <loadstar/data/array_sequence.hpp>
#include <loadstar/data/idx.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/tensor.hpp>
#include <loadstar/trial/keras_trial.hpp>
#include <loadstar/trial/main.hpp>
#include <loadstar/trial/registry.hpp>
#include <memory>
#include <string>
#include <utility>

namespace {

namespace keras = loadstar::keras;
namespace trial = loadstar::trial;

/// The folder holding the four IDX files.
std::filesystem::path data_folder(const nlohmann::json& data) {
  if (data.is_object() && data.contains("path") && data["path"].is_string()) {
    return data["path"].get<std::string>();
  }
  if (const char* folder = std::getenv("LOADSTAR_FASHION_MNIST_DIR")) {
    if (*folder != '\0') return folder;
  }
  return "/usr/share/datasets/fashion-mnist";
}

/// Images scaled to [0, 1] (n, 28, 28) and their class ids (n,).
std::pair<loadstar::Tensor<float>, loadstar::Tensor<std::uint8_t>> arrays(
    const std::filesystem::path& folder, const std::string& prefix) {
  auto x = loadstar::read_idx<std::uint8_t>(folder / (prefix + "-images-idx3-ubyte.gz"), 3)
               .cast<float>();
  loadstar::as_vector(x) /= 255.0f;
  auto y = loadstar::read_idx<std::uint8_t>(folder / (prefix + "-labels-idx1-ubyte.gz"), 1);
  return {std::move(x), std::move(y)};
}

trial::DataLoader load(const std::filesystem::path& folder, const std::string& prefix) {
  auto [x, y] = arrays(folder, prefix);
  return {std::move(x), std::move(y)};
}

class FashionMNISTTrial : public trial::KerasTrial {
 public:
  using KerasTrial::KerasTrial;

  std::shared_ptr<keras::Model> build_model() override {
    const auto hidden_size = context.get_hparam("hidden_size").get<std::size_t>();
    const auto learning_rate = context.get_hparam("learning_rate").get<double>();
    auto model = std::make_shared<keras::Sequential>();
    model->add(keras::Input({28, 28}));
    model->add(keras::layers::Flatten());
    model->add(keras::layers::Dense(hidden_size, {.activation = "relu"}));
    model->add(keras::layers::Dense(10));
    context.wrap_model(*model);
    model->compile({.optimizer = keras::optimizers::Adam({.learning_rate = learning_rate}),
                    .loss = keras::losses::SparseCategoricalCrossentropy(/*from_logits=*/true),
                    .metrics = {"accuracy"},
                    .threads = 2});
    return model;
  }

  trial::DataLoader build_training_data_loader() override {
    const auto& data = context.get_data_config();
    if (!data.contains("workers")) return load(data_folder(data), "train");
    const auto [x, y] = arrays(data_folder(data), "train");
    context.configure_fit({.workers = data.at("workers").get<std::size_t>(),
                           .use_multiprocessing = data.value("use_multiprocessing", false)});
    return loadstar::ArraySequence(x, y, context.get_per_slot_batch_size());
  }

  trial::DataLoader build_validation_data_loader() override {
    return load(data_folder(context.get_data_config()), "t10k");
  }
};

}  // namespace

LOADSTAR_REGISTER_TRIAL(FashionMNISTTrial, "model_def:FashionMNISTTrial");
LOADSTAR_TRIAL_MAIN();

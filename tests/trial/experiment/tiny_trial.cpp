// Tiny trial classes for the experiment command line's end-to-end tests: a two-layer MLP on 64
// synthetic rows (seconds per experiment), which can also sleep after each batch (so that a test
// can kill the experiment in the middle), throw, throw InvalidHP, or crash its process, or read its
// training rows through the data layer's cache, as its hyperparameters say.

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <loadstar/data/dataset/from_tensor_slices.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/tensor.hpp>
#include <loadstar/trial/keras_trial.hpp>
#include <loadstar/trial/main.hpp>
#include <loadstar/trial/registry.hpp>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

namespace keras = loadstar::keras;
namespace trial = loadstar::trial;

/// A hyperparameter that may be absent.
template <typename T>
T hparam_or(const trial::TrialContext& context, const char* name, T fallback) {
  const auto& hparams = context.get_hparams();
  return hparams.contains(name) ? hparams[name].get<T>() : fallback;
}

std::pair<loadstar::Tensor<float>, loadstar::Tensor<float>> rows_tensors(std::size_t count,
                                                                         float phase) {
  loadstar::Tensor<float> x({count, 4}, 0.0f);
  loadstar::Tensor<float> y({count}, 0.0f);
  for (std::size_t i = 0; i < count; ++i) {
    for (std::size_t j = 0; j < 4; ++j) {
      x(i, j) = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 1.3 * j + phase));
    }
    y(i) = x(i, 0) + x(i, 1) > 0 ? 1.0f : 0.0f;
  }
  return {std::move(x), std::move(y)};
}

trial::DataLoader rows(std::size_t count, float phase) {
  auto [x, y] = rows_tensors(count, phase);
  return {std::move(x), std::move(y)};
}

class TinyTrial : public trial::KerasTrial {
 public:
  using KerasTrial::KerasTrial;

  std::shared_ptr<keras::Model> build_model() override {
    if (hparam_or<std::string>(context, "fail", "none") == "crash") std::abort();
    if (hparam_or<std::string>(context, "fail", "none") == "invalid") {
      throw trial::InvalidHP("tiny trial's hyperparameters cannot work");
    }
    auto model = std::make_shared<keras::Sequential>();
    model->add(keras::Input({4}));
    model->add(
        keras::layers::Dense(hparam_or<std::size_t>(context, "hidden", 8), {.activation = "relu"}));
    model->add(keras::layers::Dense(2));
    context.wrap_model(*model);
    model->compile({.optimizer = keras::optimizers::Adam(
                        {.learning_rate = hparam_or<double>(context, "learning_rate", 0.01)}),
                    .loss = keras::losses::SparseCategoricalCrossentropy(/*from_logits=*/true),
                    .metrics = {"accuracy"}});
    return model;
  }

  trial::DataLoader build_training_data_loader() override {
    if (hparam_or<std::string>(context, "fail", "none") == "throw") {
      throw std::runtime_error("tiny trial fails on purpose");
    }
    if (hparam_or<std::string>(context, "loader", "arrays") == "cached") {
      // The data layer's cache of the same rows, under the version the data config names; each
      // call of the dataset maker appends a line to the data config's `maker_calls` file.
      const auto& data = context.get_data_config();
      return trial::DataLoader(
          context.experimental
              .cache_train_dataset("tiny", data.at("version").get<std::string>(), true)([&data] {
                std::ofstream(data.at("maker_calls").get<std::string>(), std::ios::app) << "made\n";
                auto slices = rows_tensors(64, 0.0f);
                return loadstar::from_tensor_slices(std::move(slices.first),
                                                    std::move(slices.second));
              })
              .batch(context.get_per_slot_batch_size()));
    }
    return rows(64, 0.0f);
  }

  trial::DataLoader build_validation_data_loader() override { return rows(32, 0.5f); }

  std::vector<std::shared_ptr<keras::callbacks::Callback>> keras_callbacks() override {
    const auto sleep_ms = hparam_or<int>(context, "sleep_ms", 0);
    if (sleep_ms <= 0) return {};
    return {
        std::make_shared<keras::callbacks::LambdaCallback>(keras::callbacks::LambdaCallbackOptions{
            .on_batch_end = [sleep_ms](std::size_t, const keras::Logs&) {
              std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
            }})};
  }
};

}  // namespace

LOADSTAR_REGISTER_TRIAL(TinyTrial, "tiny:TinyTrial");
LOADSTAR_TRIAL_MAIN();

// Conformance with files Keras wrote (tf.keras 2.0 to 2.13, in the shared fixtures folder): what
// each loads as, and, where a fixture stores Keras's outputs for stored inputs, that loadstar
// reproduces them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <loadstar/data/hdf5.hpp>
#include <loadstar/keras.hpp>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "keras/saving_support.hpp"

using namespace loadstar;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;
using namespace saving_support;

namespace {

/// The fixture `name`, or nothing (with the reason printed) when the fixtures are absent.
std::optional<std::filesystem::path> fixture(const std::string& name) {
  const char* shared = std::getenv("LOADSTAR_SHARED_DIR");
  if (shared == nullptr) {
    MESSAGE("skipped: LOADSTAR_SHARED_DIR is not set");
    return std::nullopt;
  }
  const auto path = std::filesystem::path(shared) / "fixtures" / "keras" / name;
  if (!std::filesystem::exists(path)) {
    MESSAGE("skipped: the Keras fixture " << path.string() << " is missing");
    return std::nullopt;
  }
  return path;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> class_names(const Model& model) {
  std::vector<std::string> out;
  for (const auto& layer : model.layers())
    out.push_back(layer->class_name());
  return out;
}

std::vector<Shape> weight_shapes(const Model& model) {
  std::vector<Shape> out;
  for (const auto& w : model.get_weights())
    out.push_back(w.shape());
  return out;
}

Tensor<float> read(const std::filesystem::path& path, const std::string& name) {
  return read_hdf5<float>(path, name, {}, {.trust = Trust::trusted});
}

}  // namespace

TEST_SUITE("keras") {
  TEST_CASE("load_weights reproduces Keras's MNIST MLP predictions from a weights file") {
    const auto config = fixture("dl4j_mnist_mlp_tf_keras_2_config.json");
    const auto weights = fixture("dl4j_mnist_mlp_tf_keras_2_weights.h5");
    const auto io = fixture("dl4j_mnist_mlp_tf_keras_2_inputs_and_outputs.h5");
    if (!config || !weights || !io) return;
    auto model = model_from_json(read_text(*config));
    model->load_weights(*weights);
    CHECK(class_names(*model) ==
          std::vector<std::string>{"Dense", "Dropout", "Dense", "Dropout", "Dense"});
    CHECK(weight_shapes(*model) == std::vector<Shape>{Shape{784, 512}, Shape{512}, Shape{512, 512},
                                                      Shape{512}, Shape{512, 10}, Shape{10}});
    CHECK(model->get_weights()[0] == read(*weights, "dense_1/dense_1/kernel:0"));
    // outputs/dense_3 holds the labels; predictions/dense_3 Keras's outputs.
    const auto x = read(*io, "inputs/dense_1_input");
    check_close(model->predict(x), read(*io, "predictions/dense_3"), 1e-5);
    check_close(model->predict(x), read(*io, "activations/dense_3"), 1e-5);
  }

  TEST_CASE(
      "load_model reproduces Keras's predictions of a whole-model file and its weights twin") {
    const auto whole = fixture("dl4j_simple_sparse_xent_mlp_keras_2_model.h5");
    const auto weights = fixture("dl4j_simple_sparse_xent_mlp_keras_2_weights.h5");
    const auto io = fixture("dl4j_simple_sparse_xent_mlp_keras_2_inputs_and_outputs.h5");
    if (!whole || !weights || !io) return;
    auto model = load_model(*whole);
    CHECK(class_names(*model) == std::vector<std::string>{"Dense", "Activation"});
    CHECK(weight_shapes(*model) == std::vector<Shape>{Shape{4, 3}, Shape{3}});
    // training_config: RMSprop(learning_rate=1e-4, rho=0.9, decay=1e-6), no optimizer weights.
    REQUIRE(model->compiled());
    CHECK(model->optimizer().class_name() == "RMSprop");
    CHECK(model->optimizer().learning_rate() == doctest::Approx(1e-4));
    CHECK(model->optimizer().iterations() == 0);
    const auto x = read(*io, "inputs/dense_1_input");
    const auto predictions = model->predict(x);
    check_close(predictions, read(*io, "predictions/activation_1"), 1e-5);
    // The weights-only twin with the same architecture predicts identically.
    auto twin = model_from_json(model->to_json());
    twin->load_weights(*weights);
    CHECK(twin->predict(x) == predictions);
    // The whole-model file is also a weights file for load_weights.
    auto again = model_from_json(model->to_json());
    again->load_weights(*whole);
    CHECK(again->predict(x) == predictions);
  }

  TEST_CASE("load_model reads a tf.keras 2.10 CNN with its Adam state") {
    const auto path = fixture("purinat33_mnist_cnn_keras2.10.h5");
    if (!path) return;
    auto model = load_model(*path);
    CHECK(class_names(*model) == std::vector<std::string>{"Conv2D", "MaxPooling2D", "Conv2D",
                                                          "MaxPooling2D", "Flatten", "Dense",
                                                          "Dense", "Dense", "Dense"});
    CHECK(model->inputs()[0].shape() == Shape{28, 28, 1});
    CHECK(weight_shapes(*model).front() == Shape{3, 3, 1, 32});
    CHECK(weight_shapes(*model).size() == 12);
    REQUIRE(model->compiled());
    CHECK(model->optimizer().class_name() == "Adam");
    CHECK(model->compile_options().loss.list().front().name() == "sparse_categorical_crossentropy");
    // Adam/iter:0 is 5625; the slots are the file's m and v, matched to the kernels they belong to.
    CHECK(model->optimizer().iterations() == 5625);
    const auto slots = model->optimizer().variables();
    REQUIRE(slots.size() == 24);
    CHECK(slots[0].value == read(*path, "optimizer_weights/Adam/conv2d/kernel/m:0"));
    CHECK(slots[1].value == read(*path, "optimizer_weights/Adam/conv2d/kernel/v:0"));
    CHECK(slots[23].value == read(*path, "optimizer_weights/Adam/dense_3/bias/v:0"));
    CHECK(model->get_weights()[11] == read(*path, "model_weights/dense_3/dense_3/bias:0"));
  }

  TEST_CASE("load_model reads a Keras 2.1 Sequential list config with BatchNormalization") {
    const auto path = fixture("dl4j_cnn_batch_norm.h5");
    if (!path) return;
    auto model = load_model(*path);
    CHECK(class_names(*model) == std::vector<std::string>{"Conv2D", "BatchNormalization",
                                                          "Activation", "Conv2D", "Flatten",
                                                          "Dense"});
    CHECK(weight_shapes(*model) ==
          std::vector<Shape>{Shape{3, 3, 3, 1}, Shape{1}, Shape{1}, Shape{1}, Shape{1}, Shape{1},
                             Shape{3, 3, 1, 1}, Shape{1}, Shape{36, 1}, Shape{1}});
    CHECK(
        model->get_weights()[5] ==
        read(*path, "model_weights/batch_normalization_1/batch_normalization_1/moving_variance:0"));
    // training_config of Keras 2.1: Adam with the legacy "lr", loss "mse", no optimizer weights.
    REQUIRE(model->compiled());
    CHECK(model->optimizer().class_name() == "Adam");
    CHECK(model->optimizer().learning_rate() == doctest::Approx(0.001));
    CHECK(model->compile_options().loss.list().front().name() == "mse");
  }

  TEST_CASE("load_model reads a legacy HDF5 file named .keras by its contents") {
    const auto path = fixture("hls4ml_mlp_streaming_keras_model.keras");
    if (!path) return;
    auto model = load_model(*path);
    CHECK(class_names(*model) ==
          std::vector<std::string>{"Dense", "Activation", "Dense", "Activation"});
    CHECK(weight_shapes(*model) ==
          std::vector<Shape>{Shape{8, 4}, Shape{4}, Shape{4, 2}, Shape{2}});
    CHECK(model->get_weights()[2] == read(*path, "model_weights/fc2/fc2/kernel:0"));
    // Its training_config names no loss (tf.keras 2.11 compiled it with loss=None): not compiled.
    CHECK_FALSE(model->compiled());
  }

  TEST_CASE("load_model reads a tf.keras 2.13 file and its save_weights twin") {
    const auto whole = fixture("hls4ml_conv2d_1layer.h5");
    const auto weights = fixture("hls4ml_conv2d_1layer_weights.h5");
    if (!whole || !weights) return;
    // The kernel initializer is a Python function: Keras needs it among the custom objects too;
    // loadstar loads the file without it, with a warning (test_nested_models.cpp).
    CustomObjects custom;
    custom.add<Initializer>("function", [](const nlohmann::json&) { return Initializer::zeros(); });
    auto model = load_model(*whole, custom);
    CHECK(class_names(*model) == std::vector<std::string>{"Conv2D"});
    CHECK(weight_shapes(*model) == std::vector<Shape>{Shape{3, 3, 1, 1}, Shape{1}});
    CHECK_FALSE(model->compiled());
    // The image 1..25 of hls4ml_conv2d_1layer.py; expected values from an independent numpy
    // cross-correlation with the stored kernel (reference/keras-h5.md, section 3.2).
    Tensor<float> x({1, 5, 5, 1});
    for (std::size_t i = 0; i < 25; ++i)
      x.data()[i] = static_cast<float>(i + 1);
    const Tensor<float> expected(
        {1, 3, 3, 1}, {4.322033F, 5.004921F, 5.68781F, 7.736475F, 8.419363F, 9.102252F, 11.150917F,
                       11.833805F, 12.516694F});
    const auto predictions = model->predict(x);
    check_close(predictions, expected, 1e-5);
    // Root-level layer groups and top_level_model_weights (tf.keras 2.13's save_weights).
    auto twin = model_from_json(model->to_json(), &custom);
    twin->load_weights(*weights);
    CHECK(twin->predict(x) == predictions);
  }

  TEST_CASE("load_weights reads a Keras 2.0 weights file into its to_json architecture") {
    const auto config = fixture("hls4ml_KERAS_conv2d_model.json");
    const auto weights = fixture("hls4ml_KERAS_conv2d_model_weights.h5");
    if (!config || !weights) return;
    auto model = model_from_json(read_text(*config));
    model->load_weights(*weights);
    CHECK(class_names(*model) == std::vector<std::string>{"Conv2D", "Dropout", "Flatten", "Dense"});
    CHECK(weight_shapes(*model) ==
          std::vector<Shape>{Shape{3, 3, 1, 2}, Shape{2}, Shape{128, 10}, Shape{10}});
    CHECK(model->get_weights()[0] == read(*weights, "conv2d_1/conv2d_1/kernel:0"));
    CHECK(model->get_weights()[2] == read(*weights, "dense_1/dense_1/kernel:0"));
  }

  TEST_CASE("load_model reads a Conv2D CNN whose first layer is channels_first") {
    const auto path = fixture("dl4j_simpleconv2d.hdf5");
    if (!path) return;
    // The first Conv2D is channels_first, the second channels_last (Keras 2.3.1 allowed mixing).
    auto model = load_model(*path);
    CHECK(class_names(*model) == std::vector<std::string>{"Conv2D", "MaxPooling2D", "Conv2D",
                                                          "MaxPooling2D", "Dropout", "Flatten",
                                                          "Dense", "Dense", "Dense", "Dense"});
    CHECK(weight_shapes(*model)[2] == Shape{3, 3, 26, 15});
    CHECK(model->get_weights()[2] == read(*path, "model_weights/conv2d_2/conv2d_2/kernel:0"));
  }

  TEST_CASE("load_model reads a tf.keras 2.4 functional Conv1D model with its Adam state") {
    const auto path = fixture("dl4j_tfkeras_issue_9349.hdf5");
    if (!path) return;
    auto model = load_model(*path);
    CHECK(class_names(*model) == std::vector<std::string>{"Embedding", "Conv1D", "MaxPooling1D",
                                                          "Flatten", "Dropout", "Dense"});
    CHECK(weight_shapes(*model) ==
          std::vector<Shape>{Shape{5, 3}, Shape{2, 3, 3}, Shape{3}, Shape{3, 2}, Shape{2}});
    REQUIRE(model->compiled());
    CHECK(model->optimizer().iterations() == 12);
    CHECK(model->optimizer().variables()[2].value ==
          read(*path, "optimizer_weights/Adam/conv1d/kernel/m:0"));
  }
}

// Axes of unknown length (Keras's None): text models whose input is Input({none}) train on batches
// of different lengths as PyTorch does (tests/keras/generate_unknown_axes.py), save and load with
// null in their batch shapes, print None, and refuse, naming the layer, what cannot take them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <loadstar/data/dataset.hpp>
#include <loadstar/error.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/keras/saving/model_config.hpp>
#include <loadstar/keras/saving/saving.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "keras/layer_cases.hpp"
#include "keras/unknown_axes_cases.hpp"
#include "temp_dir.hpp"

namespace unknown_axes_test {

using loadstar::ConfigError;
using loadstar::Shape;
using loadstar::ShapeError;
using loadstar::Tensor;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;
using nlohmann::json;
using unknown_axes_cases::case_named;
using unknown_axes_cases::check_training;
using unknown_axes_cases::token_batch;

TEST_CASE("an Embedding and LSTM classifier on Input(None) trains on batches of any length") {
  auto model = unknown_axes_cases::text_lstm();
  check_training(*model, case_named("text_lstm"), "sparse_categorical_crossentropy");
}

TEST_CASE("a self-attention block on Input(None) trains on batches of any length") {
  auto model = unknown_axes_cases::text_attention();
  check_training(*model, case_named("text_attention"), "mse");
}

TEST_CASE("a Bidirectional LSTM tagger returns and learns from sequences of every length") {
  auto model = unknown_axes_cases::tagger();
  check_training(*model, case_named("tagger"), "mse");
}

TEST_CASE("a Conv1D text classifier on Input(None) trains on batches of any length") {
  // Keras's "text classification from scratch": Conv1D and GlobalMaxPooling1D over the tokens.
  auto model = unknown_axes_cases::text_cnn();
  check_training(*model, case_named("text_cnn"), "binary_crossentropy");
  // A batch shorter than the kernel is refused by the layer that cannot take it.
  CHECK_THROWS_WITH_AS(model->predict(Tensor<float>(Shape{2, 2}, 1.0F), {.verbose = 0}),
                       "conv1d layer 'conv1d': a kernel of size 3 does not fit inputs of shape "
                       "(2, 6) with valid padding",
                       ShapeError);
  CHECK(model->predict(Tensor<float>(Shape{2, 5}, 1.0F), {.verbose = 0}).shape() == Shape{2, 1});
}

TEST_CASE("MaxPooling1D and AveragePooling1D pool steps of any length") {
  auto model = unknown_axes_cases::text_cnn_pooled();
  check_training(*model, case_named("text_cnn_pooled"), "binary_crossentropy");
  CHECK_THROWS_WITH_AS(model->predict(Tensor<float>(Shape{2, 3}, 1.0F), {.verbose = 0}),
                       "average_pooling1d layer 'average_pooling1d': a pool of size 2 does not "
                       "fit inputs of shape (1, 4) with valid padding",
                       ShapeError);
}

TEST_CASE("GRU, SimpleRNN, ZeroPadding1D, Cropping1D and UpSampling1D take steps of any length") {
  auto model = unknown_axes_cases::padded_gru();
  check_training(*model, case_named("padded_gru"), "mse");
  // A batch too short for the cropping is refused by the layer that cannot take it: one token,
  // padded to 4 steps, cropped by 1 and 1, is 2 steps; Cropping1D((3, 2)) leaves nothing of 4.
  auto tokens = Input(Shape{none}, "tokens");
  auto cropped =
      call(Cropping1D({3, 2}), call(ZeroPadding1D({1, 2}), call(Embedding(12, 2), tokens)));
  Model short_crop(std::vector{tokens}, std::vector{call(GlobalAveragePooling1D(), cropped)},
                   "short_crop");
  CHECK(short_crop.predict(Tensor<float>(Shape{2, 3}, 1.0F), {.verbose = 0}).shape() ==
        Shape{2, 2});
  CHECK_THROWS_WITH_AS(short_crop.predict(Tensor<float>(Shape{2, 2}, 1.0F), {.verbose = 0}),
                       "cropping1d layer 'cropping1d': cropping 3 and 2 of spatial axis 0 leaves "
                       "nothing of inputs of shape (None, 5, 2)",
                       ShapeError);
}

TEST_CASE("Cropping2D, ZeroPadding3D and UpSampling3D take spatial axes of any size") {
  // The expected values by hand. Cropping2D(((1, 0), (0, 1))) keeps rows 1.. and columns ..w-2.
  auto image = Input(Shape{none, none, 1}, "image");
  Model crop(std::vector{image}, std::vector{call(Cropping2D({Edges{1, 0}, Edges{0, 1}}), image)},
             "crop");
  // ZeroPadding3D(((1, 0), (0, 1), (0, 0))) then UpSampling3D((1, 1, 2)): the d x h x w volume
  // at plane 1, row 0 of a (d + 1) x (h + 1) x w grid of zeros, each column doubled.
  auto volume = Input(Shape{none, none, none, 1}, "volume");
  auto grown = call(UpSampling3D({1, 1, 2}),
                    call(ZeroPadding3D({Edges{1, 0}, Edges{0, 1}, Edges{0, 0}}), volume));
  Model pad(std::vector{volume}, std::vector{grown}, "pad_repeat");
  const auto count = [](std::size_t i) { return static_cast<float>(i + 1); };
  for (const std::size_t n : {std::size_t{2}, std::size_t{4}, std::size_t{3}}) {
    const std::size_t d = n - 1, h = n, w = 6 - n;
    CAPTURE(n);
    Tensor<float> x(Shape{1, h, w, 1});
    for (std::size_t i = 0; i < x.size(); ++i)
      x.data()[i] = count(i);
    const Tensor<float> cropped = crop.predict(x, {.verbose = 0});
    REQUIRE(cropped.shape() == Shape{1, h - 1, w - 1, 1});
    for (std::size_t r = 0; r + 1 < h; ++r)
      for (std::size_t c = 0; c + 1 < w; ++c)
        CHECK(cropped.data()[r * (w - 1) + c] == count((r + 1) * w + c));
    Tensor<float> v(Shape{1, d, h, w, 1});
    for (std::size_t i = 0; i < v.size(); ++i)
      v.data()[i] = count(i);
    const Tensor<float> y = pad.predict(v, {.verbose = 0});
    REQUIRE(y.shape() == Shape{1, d + 1, h + 1, 2 * w, 1});
    for (std::size_t a = 0; a <= d; ++a)
      for (std::size_t b = 0; b <= h; ++b)
        for (std::size_t c = 0; c < 2 * w; ++c) {
          const float expected = a >= 1 && b < h ? count(((a - 1) * h + b) * w + c / 2) : 0.0F;
          CHECK(y.data()[(a * (h + 1) + b) * 2 * w + c] == expected);
        }
  }
}

/// Two batches of two token sequences, of lengths 3 and 4.
struct RaggedTokens {
  std::size_t size() const { return 2; }
  Tensor<float> operator[](std::size_t i) const { return Tensor<float>(Shape{2, 3 + i}, 1.0F); }
};

TEST_CASE("layers that take unknown lengths refuse them on the axes they need known") {
  // Each names itself and the shape it was given.
  CHECK_THROWS_WITH_AS(call(TimeDistributed(PReLU()), Input(Shape{none, none, 4})),
                       doctest::Contains("layer takes no axis of unknown length but the steps of "
                                         "(None, None, None, 4) have one"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(call(LayerNormalization(), Input(Shape{3, none})),
                       doctest::Contains("the axes it normalises must have known lengths but the "),
                       ShapeError);
  CHECK_THROWS_WITH_AS(call(BatchNormalization(), Input(Shape{3, none})),
                       doctest::Contains("the features axis it normalises must have a known "
                                         "length but the input is (None, 3, None)"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(call(GlobalAveragePooling1D(), Input(Shape{none, none})),
                       doctest::Contains("the channels axis must have a known length but the "
                                         "input is (None, None, None)"),
                       ShapeError);
  // predict stacks the batches' outputs: per-step outputs of batches of different lengths
  // cannot be stacked, and predict says so, pointing to predict_step.
  auto tokens = Input(Shape{none}, "tokens");
  Model per_step(std::vector{tokens},
                 std::vector{call(Embedding(12, 2, {.name = "embed"}), tokens)}, "per_step");
  CHECK_THROWS_WITH_AS(per_step.predict(RaggedTokens{}, {.verbose = 0}),
                       "predict: output 'embed' has samples of shape (4, 2) in batch 1 but "
                       "(3, 2) before, which one array cannot hold (an axis of unknown length); "
                       "call predict_step on each batch instead",
                       ShapeError);
  // Joined along the features, steps of unknown length concatenate.
  auto a = Input(Shape{none, 4}, "a");
  auto b = Input(Shape{none, 2}, "b");
  Model joined(std::vector{a, b}, std::vector{call(Concatenate(), {a, b})}, "joined");
  Tensor<float> xa(Shape{2, 3, 4}, 1.0F), xb(Shape{2, 3, 2}, 2.0F);
  const Tensor<float> y = joined.predict(std::vector<Tensor<float>>{xa, xb}, {.verbose = 0});
  CHECK(y.shape() == Shape{2, 3, 6});
  CHECK(y.data()[3] == 1.0F);
  CHECK(y.data()[4] == 2.0F);
}

TEST_CASE("a model with an axis of unknown length prints None and saves null") {
  auto model = unknown_axes_cases::text_lstm();
  std::ostringstream out;
  model->summary(out);
  CHECK(out.str().find("[(None, None)]") != std::string::npos);
  CHECK(out.str().find("(None, None, 5)") != std::string::npos);
  const json config = model_get_config(*model);
  CHECK(config.dump().find("[null,null]") != std::string::npos);
  const auto copy = model_from_config(config);
  CHECK(model_get_config(*copy) == config);
  copy->set_weights(model->get_weights());
  const Tensor<float> x = token_batch(case_named("text_lstm")["batches"][2]["x"], 9);
  const Tensor<float> expected = model->predict(x, {.verbose = 0});
  CHECK(layer_cases::same_bits(copy->predict(x, {.verbose = 0}), expected));
  test_support::TempDir dir;
  for (const char* file : {"model.h5", "model.keras"}) {
    INFO(file);
    model->save(dir / file);
    const auto loaded = load_model(dir / file);
    CHECK(model_get_config(*loaded)["config"]["layers"][0]["config"].dump().find("null,null") !=
          std::string::npos);
    CHECK(layer_cases::same_bits(loaded->predict(x, {.verbose = 0}), expected));
  }
}

TEST_CASE("a tf.keras Sequential text model with batch_input_shape [null, null] loads") {
  // What tf.keras 2 writes for Embedding(12, 5) made without input_length as a Sequential's first
  // layer.
  const json config = {
      {"class_name", "Sequential"},
      {"config",
       {{"name", "sequential"},
        {"layers",
         {{{"class_name", "InputLayer"},
           {"config",
            {{"batch_input_shape", {nullptr, nullptr}},
             {"dtype", "float32"},
             {"sparse", false},
             {"ragged", false},
             {"name", "embedding_input"}}}},
          {{"class_name", "Embedding"},
           {"config",
            {{"name", "embedding"},
             {"trainable", true},
             {"batch_input_shape", {nullptr, nullptr}},
             {"dtype", "float32"},
             {"input_dim", 12},
             {"output_dim", 5},
             {"embeddings_initializer",
              {{"class_name", "RandomUniform"},
               {"config", {{"minval", -0.05}, {"maxval", 0.05}, {"seed", nullptr}}}}},
             {"embeddings_regularizer", nullptr},
             {"activity_regularizer", nullptr},
             {"embeddings_constraint", nullptr},
             {"mask_zero", false},
             {"input_length", nullptr}}}},
          {{"class_name", "GlobalAveragePooling1D"},
           {"config",
            {{"name", "pool"},
             {"trainable", true},
             {"dtype", "float32"},
             {"data_format", "channels_last"},
             {"keepdims", false}}}},
          {{"class_name", "Dense"},
           {"config", {{"name", "out"}, {"units", 2}, {"activation", "linear"}}}}}}}}};
  const auto model = model_from_config(config);
  std::ostringstream out;
  model->summary(out);
  CHECK(out.str().find("(None, None, 5)") != std::string::npos);
  model->compile({.optimizer = "sgd", .loss = "mse"});
  // The mean over the steps of each length is what GlobalAveragePooling1D returns.
  for (const std::size_t length : {3U, 7U, 1U}) {
    INFO("length ", length);
    const auto weights = model->get_weights();
    Tensor<float> x(Shape{2, length});
    for (std::size_t i = 0; i < x.size(); ++i)
      x.data()[i] = static_cast<float>((i * 5) % 12);
    const Tensor<float> y = model->predict(x, {.verbose = 0});
    for (std::size_t b = 0; b < 2; ++b) {
      for (std::size_t o = 0; o < 2; ++o) {
        double expected = weights[2].data()[o];
        for (std::size_t f = 0; f < 5; ++f) {
          double mean = 0.0;
          for (std::size_t s = 0; s < length; ++s) {
            const auto token = static_cast<std::size_t>(x.data()[b * length + s]);
            mean += weights[0].data()[token * 5 + f] / static_cast<double>(length);
          }
          expected += mean * weights[1].data()[f * 2 + o];
        }
        CHECK(y.data()[b * 2 + o] == doctest::Approx(expected).epsilon(1e-5));
      }
    }
    model->train_on_batch(x, Tensor<float>(Shape{2, 2}, 0.5F));
  }
}

TEST_CASE("layers that cannot take an axis of unknown length refuse it, naming themselves") {
  auto tokens = Input(Shape{none, 4}, "x");
  CHECK_THROWS_WITH_AS(call(PReLU(), tokens),
                       doctest::Contains("layer: takes no axis of unknown length (None) but is "
                                         "called on (None, None, 4); give the Input a fixed "
                                         "length"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(call(Dense(3), Input(Shape{4, none})),
                       doctest::Contains("the last axis of its input (the features) must have a "
                                         "known length but the input is (None, 4, None)"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(call(LSTM(3), Input(Shape{none, none})),
                       doctest::Contains("with a known number of features but got (None, None, "
                                         "None)"),
                       ShapeError);
  // A batch whose known axis differs from the declared one is refused by name.
  auto in = Input(Shape{none, 4}, "x");
  Model model(std::vector{in}, std::vector{call(GlobalAveragePooling1D(), in)}, "pooled");
  CHECK_THROWS_WITH_AS(model.predict(Tensor<float>(Shape{2, 5, 3}), {.verbose = 0}),
                       "model 'pooled': input 'x' expects samples of shape (None, 4) but x has "
                       "samples of shape (5, 3)",
                       ShapeError);
  // predict stacks the batches' outputs: sequences of different lengths cannot be stacked.
  auto seq = Input(Shape{none, 2}, "s");
  Model same(std::vector{seq}, std::vector{call(Dense(1), seq)}, "per_step");
  CHECK(same.predict(Tensor<float>(Shape{3, 5, 2}), {.batch_size = 3, .verbose = 0}).shape() ==
        Shape{3, 5, 1});
}

// The checked-in reference values of tests/keras/generate_permute_repeat_unknown.py.
const json& permute_repeat_reference() {
  static const json data = layer_cases::load("permute_repeat_unknown.json");
  return data;
}

/// Sets the reference's initial weights, trains one SGD step per batch of the reference's lengths
/// and checks every loss, the final weights and the predictions of a batch of another length.
void check_permute_repeat(Model& model, const json& c) {
  INFO(c["name"].get<std::string>());
  const json& reference = permute_repeat_reference();
  const std::size_t batch = reference["batch"].get<std::size_t>();
  const auto current = model.get_weights();
  REQUIRE(current.size() == c["weight_order"].size());
  std::vector<Tensor<float>> weights;
  for (std::size_t i = 0; i < current.size(); ++i) {
    weights.push_back(layer_cases::tensor_of(
        c["initial_weights"][c["weight_order"][i].get<std::string>()], current[i].shape()));
  }
  model.set_weights(weights);
  model.compile({.optimizer = optimizers::SGD(
                     optimizers::SGDOptions{.learning_rate = reference["lr"].get<double>()}),
                 .loss = "mse"});
  // A sample's shape for a length: (length) or (length, features).
  const Shape declared = model.inputs()[0].shape();
  const auto sample = [&](std::size_t length) {
    std::vector<std::size_t> dims(declared.begin(), declared.end());
    dims[0] = length;
    return Shape(dims).prepend(batch);
  };
  for (std::size_t step = 0; step < c["batches"].size(); ++step) {
    const json& b = c["batches"][step];
    INFO("step ", step, " of length ", b["length"].get<std::size_t>());
    const Tensor<float> x = layer_cases::tensor_of(b["x"], sample(b["length"]));
    const Tensor<float> y = layer_cases::tensor_of(b["y"], layer_cases::shape_of(b["y_shape"]));
    CHECK(model.train_on_batch(x, y).get("loss").value() ==
          doctest::Approx(c["losses"][step].get<double>()).epsilon(1e-5));
  }
  const Tensor<float> predicted = model.predict(
      layer_cases::tensor_of(c["predict_x"], sample(c["predict_length"])), {.verbose = 0});
  CHECK(predicted.shape() == layer_cases::shape_of(c["prediction_shape"]));
  layer_cases::check_close("prediction", predicted, c["prediction"]);
  const auto trained = model.get_weights();
  for (std::size_t i = 0; i < trained.size(); ++i) {
    const std::string name = c["weight_order"][i];
    layer_cases::check_close(name, trained[i], c["final_weights"][name]);
  }
}

TEST_CASE("Permute and RepeatVector settle axes of unknown length per batch") {
  const json& cases = permute_repeat_reference()["cases"];
  REQUIRE(cases.size() == 2);
  {
    // Softmax over the steps through two Permutes: (None, 3) -> (3, None) -> (None, 3).
    auto x = Input(Shape{none, 4}, "x");
    auto h = call(Dense(3, {.activation = "tanh"}), x);
    auto swapped = call(Permute({2, 1}), h);
    CHECK(swapped.shape() == Shape{3, none});
    auto a = call(Permute({2, 1}), call(Softmax(), swapped));
    auto out = call(Dense(2), call(GlobalAveragePooling1D(), call(Multiply(), {a, h})));
    Model model(std::vector{x}, std::vector{out}, "permute_attention");
    check_permute_repeat(model, cases[0]);
  }
  {
    // Input((None,)) -> RepeatVector(3): (3, None), then back to (None, 3).
    auto x = Input(Shape{none}, "x");
    auto repeated = call(RepeatVector(3), x);
    CHECK(repeated.shape() == Shape{3, none});
    auto out = call(GlobalAveragePooling1D(), call(Dense(2), call(Permute({2, 1}), repeated)));
    Model model(std::vector{x}, std::vector{out}, "repeat_permute");
    check_permute_repeat(model, cases[1]);
  }
}

TEST_CASE("fit trains on a padded_batch dataset whose batches differ in length") {
  // Sentences of 1 to 7 tokens, batched by padding to each batch's longest (tf.data's
  // padded_batch): fit takes the batches as train_on_batch takes them one by one.
  const auto sentence = [](std::int64_t i) {
    const auto n = static_cast<std::size_t>(1 + (i * 5) % 7);
    Tensor<float> x(Shape{n});
    for (std::size_t k = 0; k < n; ++k)
      x.data()[k] = static_cast<float>((static_cast<std::size_t>(i) + 3 * k) % 11 + 1);
    return std::tuple{x, Tensor<float>(Shape{}, static_cast<float>(i % 3))};
  };
  auto dataset = loadstar::range(std::int64_t{0}, std::int64_t{22}).map(sentence).padded_batch(4);
  const auto compiled = [] {
    set_random_seed(5);
    auto model = unknown_axes_cases::text_lstm();
    model->compile({.optimizer = "sgd", .loss = "sparse_categorical_crossentropy"});
    return model;
  };
  auto by_fit = compiled();
  const auto history = by_fit->fit(dataset, {.epochs = 1, .verbose = 0});
  auto by_step = compiled();
  std::vector<std::size_t> lengths;
  double last = 0.0;
  for (std::int64_t first = 0; first < 22; first += 4) {
    std::vector<std::tuple<Tensor<float>, Tensor<float>>> rows;
    std::size_t longest = 0;
    for (std::int64_t i = first; i < std::min<std::int64_t>(first + 4, 22); ++i) {
      rows.push_back(sentence(i));
      longest = std::max(longest, std::get<0>(rows.back()).size());
    }
    Tensor<float> x(Shape{rows.size(), longest}, 0.0F), y(Shape{rows.size()});
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const Tensor<float>& tokens = std::get<0>(rows[r]);
      std::copy(tokens.begin(), tokens.end(), x.data() + r * longest);
      y.data()[r] = std::get<1>(rows[r]).data()[0];
    }
    lengths.push_back(longest);
    last = by_step->train_on_batch(x, y).get("loss").value();
  }
  CHECK(lengths == std::vector<std::size_t>{6, 7, 7, 6, 7, 3});
  const auto a = by_fit->get_weights(), b = by_step->get_weights();
  for (std::size_t i = 0; i < a.size(); ++i)
    CHECK(layer_cases::same_bits(a[i], b[i]));
  CHECK(std::isfinite(last));
  CHECK(history.history.at("loss").size() == 1);
}

}  // namespace unknown_axes_test

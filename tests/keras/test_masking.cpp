// Masks as Keras has them: Embedding(mask_zero=True) and Masking make one; recurrent and attention
// layers skip the masked steps, GlobalAveragePooling1D averages the unmasked ones, and a loss and
// its metrics count only them (checked against PyTorch in tests/keras/generate_unknown_axes.py);
// merges OR the masks, a layer without masking support stops the mask with a warning, and the
// layers loadstar does not apply a mask in refuse it.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <loadstar/error.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/keras/backend/cpu_backend.hpp>
#include <loadstar/keras/saving/model_config.hpp>
#include <loadstar/keras/saving/saving.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "keras/layer_cases.hpp"
#include "keras/unknown_axes_cases.hpp"
#include "temp_dir.hpp"

namespace masking_test {

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

/// The warnings given while it lives.
struct CollectWarnings {
  std::vector<std::string> seen;
  WarningHandler previous =
      set_warning_handler([this](const std::string& text) { seen.push_back(text); });
  CollectWarnings() = default;
  CollectWarnings(const CollectWarnings&) = delete;
  CollectWarnings& operator=(const CollectWarnings&) = delete;
  ~CollectWarnings() { set_warning_handler(previous); }
};

Tensor<float> tensor(Shape shape, std::vector<float> values) {
  Tensor<float> t(std::move(shape));
  REQUIRE(t.size() == values.size());
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

TEST_CASE("Embedding(mask_zero=True) before a go_backwards LSTM trains as PyTorch's masked loop") {
  auto model = unknown_axes_cases::masked_lstm();
  check_training(*model, case_named("masked_lstm"), "sparse_categorical_crossentropy");
}

TEST_CASE("a masked Bidirectional LSTM outputs 0 at masked steps, and Conv1D stops the mask") {
  CollectWarnings warnings;
  auto model = unknown_axes_cases::masked_bilstm_conv();
  REQUIRE(warnings.seen.size() == 1);
  CHECK(warnings.seen[0].find("conv1d layer '") != std::string::npos);
  CHECK(warnings.seen[0].find("(made by embedding layer '") != std::string::npos);
  CHECK(warnings.seen[0].find("does not support masking, so the mask stops there") !=
        std::string::npos);
  check_training(*model, case_named("masked_bilstm_conv"), "binary_crossentropy");
}

TEST_CASE("Masking's mask passes SimpleRNN, Dense and GRU sequences to GlobalAveragePooling1D") {
  auto model = unknown_axes_cases::masking_rnn_pool();
  check_training(*model, case_named("masking_rnn_pool"), "mse");
}

TEST_CASE("Attention and AdditiveAttention skip masked values and zero masked queries") {
  auto model = unknown_axes_cases::masked_attentions();
  check_training(*model, case_named("masked_attentions"), "mse");
}

TEST_CASE("MultiHeadAttention joins the query's and the value's masks into its attention mask") {
  auto model = unknown_axes_cases::masked_mha();
  check_training(*model, case_named("masked_mha"), "mse");
}

TEST_CASE("BatchNormalization trains on the statistics of the unmasked steps, as Keras 3") {
  auto model = unknown_axes_cases::masked_batch_norm();
  check_training(*model, case_named("masked_batch_norm"), "mse");
}

TEST_CASE("Concatenate along the steps joins its inputs' masks, an unmasked input's all counting") {
  CollectWarnings warnings;
  auto model = unknown_axes_cases::masked_concat_time();
  REQUIRE(warnings.seen.size() == 1);  // the Conv1D
  CHECK(warnings.seen[0].find("conv1d layer '") != std::string::npos);
  check_training(*model, case_named("masked_concat_time"), "mse");
  // The joined mask, read back through a masked average: the steps of [x, ones, x] that count.
  auto tokens = Input(Shape{3}, "tokens");
  auto e = call(Embedding(4, 1, {.embeddings_initializer = Initializer::ones(), .mask_zero = true}),
                tokens);
  auto ones = call(Conv1D(1, 1,
                          {.kernel_initializer = Initializer::ones(),
                           .bias_initializer = Initializer::constant(2.0F)}),
                   e);  // 3 at every step, unmasked
  Model pooled(
      std::vector{tokens},
      std::vector{call(GlobalAveragePooling1D(), call(Concatenate({.axis = 1}), {e, ones, e}))},
      "pooled");
  // e is 1 at every step, token 0 masked: the unmasked steps of [e, 3, e] are 1, 1, 3, 3, 3, 1,
  // 1, whose mean is 13 / 7.
  layer_cases::check_close("joined mask", pooled.predict(tensor({1, 3}, {2, 0, 3}), {.verbose = 0}),
                           json::array({13.0 / 7.0}));
}

TEST_CASE("TimeDistributed passes a mask on, and a masked mse counts only the unmasked steps") {
  auto model = unknown_axes_cases::masked_td_tagger();
  check_training(*model, case_named("masked_td_tagger"), "mse");
}

TEST_CASE("a masked LSTM learns the last token before the padding, through fit") {
  // Sequences of 1 to 12 tokens padded with 0 at the end; class 1 when the last token is 5 or
  // more. The mask makes the LSTM's last output its state at the last token.
  const std::size_t n = 256, steps = 12;
  Tensor<float> x(Shape{n, steps}), y(Shape{n, 1});
  loadstar::SplitMix64 rng(21);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t length = 1 + rng.next() % steps;
    float last = 0.0F;
    for (std::size_t s = 0; s < steps; ++s) {
      const float token = s < length ? static_cast<float>(1 + rng.next() % 9) : 0.0F;
      x.data()[i * steps + s] = token;
      if (s < length) last = token;
    }
    y.data()[i] = last >= 5.0F ? 1.0F : 0.0F;
  }
  set_random_seed(5);
  Sequential model{Input(Shape{steps}), Embedding(10, 8, {.mask_zero = true}), LSTM(8),
                   Dense(1, {.activation = "sigmoid"})};
  model.compile({.optimizer = "adam", .loss = "binary_crossentropy", .metrics = {"accuracy"}});
  const auto history = model.fit(x, y, {.epochs = 30, .batch_size = 32, .verbose = 0});
  const auto& accuracy = history.history.at("accuracy");
  INFO("accuracy ", accuracy.front(), " -> ", accuracy.back());
  CHECK(accuracy.back() > 0.95);
}

TEST_CASE("padding at the end of a masked sequence changes nothing") {
  auto model = unknown_axes_cases::masked_lstm();
  const Tensor<float> padded = tensor({1, 6}, {4, 7, 2, 0, 0, 0});
  const Tensor<float> inner = tensor({1, 6}, {0, 4, 0, 7, 2, 0});
  const Tensor<float> bare = tensor({1, 3}, {4, 7, 2});
  const Tensor<float> expected = model->predict(bare, {.verbose = 0});
  layer_cases::check_close("padded", model->predict(padded, {.verbose = 0}),
                           json(std::vector<float>(expected.data(), expected.data() + 3)));
  layer_cases::check_close("zeros inside", model->predict(inner, {.verbose = 0}),
                           json(std::vector<float>(expected.data(), expected.data() + 3)));
  // Without the mask the zeros are tokens like any other.
  auto unmasked = unknown_axes_cases::text_lstm();
  CHECK(unmasked->predict(padded, {.verbose = 0}).shape() == Shape{1, 3});
}

TEST_CASE("masked padding leaves every recurrent cell's training step as without it") {
  // One SGD step on [4 7 2 0 0] with the mask equals one on [4 7 2] without: the masked steps
  // take no part in the forward pass or the gradients. Keras 1's GRU (reset_after false) has no
  // PyTorch case among the masked ones; this covers it with the other cells.
  using Make = std::function<std::shared_ptr<Layer>()>;
  const std::vector<std::pair<const char*, Make>> cells = {
      {"lstm", [] { return std::make_shared<LSTM>(3); }},
      {"gru", [] { return std::make_shared<GRU>(3); }},
      {"gru_reset_before",
       [] { return std::make_shared<GRU>(3, RecurrentOptions{.reset_after = false}); }},
      {"simple_rnn",
       [] { return std::make_shared<SimpleRNN>(3, RecurrentOptions{.return_sequences = false}); }},
      {"bidirectional",
       [] { return std::make_shared<Bidirectional>(GRU(2, {.reset_after = false})); }},
  };
  for (const auto& cell : cells) {
    // Named, not a structured binding: Clang 14 cannot capture those in the lambda below.
    const char* name = cell.first;
    const Make& make = cell.second;
    INFO(name);
    const auto model_of = [&](bool mask_zero) {
      auto tokens = Input(Shape{none}, "tokens");
      auto h = call(make(), call(Embedding(9, 4, {.mask_zero = mask_zero}), tokens));
      return std::make_shared<Model>(std::vector{tokens}, std::vector{call(Dense(2), h)}, name);
    };
    set_random_seed(17);
    auto masked = model_of(true);
    auto bare = model_of(false);
    bare->set_weights(masked->get_weights());
    for (auto* m : {masked.get(), bare.get()}) {
      m->compile({.optimizer = optimizers::SGD(optimizers::SGDOptions{.learning_rate = 0.5}),
                  .loss = "mse"});
    }
    const Tensor<float> y = tensor({1, 2}, {0.5F, -1.0F});
    const double padded =
        masked->train_on_batch(tensor({1, 5}, {4, 7, 2, 0, 0}), y).get("loss").value();
    const double plain = bare->train_on_batch(tensor({1, 3}, {4, 7, 2}), y).get("loss").value();
    CHECK(padded == doctest::Approx(plain).epsilon(1e-6));
    const auto a = masked->get_weights(), b = bare->get_weights();
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO("weight ", i);
      layer_cases::check_close("weight", a[i],
                               json(std::vector<float>(b[i].data(), b[i].data() + b[i].size())));
    }
  }
}

TEST_CASE("Masking zeroes the masked steps, and a merge's mask is the OR of its inputs' masks") {
  auto a = Input(Shape{3, 2}, "a");
  auto b = Input(Shape{3, 2}, "b");
  auto ma = call(Masking(), a);
  auto mb = call(Masking(), b);
  Model both(std::vector{a, b}, std::vector{call(GlobalAveragePooling1D(), call(Add(), {ma, mb}))},
             "both");
  const Tensor<float> xa = tensor({2, 3, 2}, {1, 1, 0, 0, 0, 0, 3, 0, 0, 0, 1, 1});
  const Tensor<float> xb = tensor({2, 3, 2}, {0, 0, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0});
  // Sample 0: masks (1, 0, 0) OR (0, 1, 0): the mean of steps 0 and 1 of a + b.
  // Sample 1: masks (1, 0, 1) OR (0, 0, 0): the mean of steps 0 and 2.
  const Tensor<float> y = both.predict(std::vector<Tensor<float>>{xa, xb}, {.verbose = 0});
  layer_cases::check_close("or", y, json::array({1.5, 1.5, 2.0, 0.5}));
  // Masking's output is its input where a step counts and 0 where it is masked.
  Model masked(std::vector{a}, std::vector{call(Masking({.mask_value = 1.0F}), a)}, "masked");
  layer_cases::check_close("masking", masked.predict(xa, {.verbose = 0}),
                           json::array({0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0}));
  // With an unmasked input every step counts: the plain mean over the three steps.
  Model one(std::vector{a, b},
            std::vector{call(GlobalAveragePooling1D(), call(Add(), {call(Masking(), a), b}))},
            "one");
  layer_cases::check_close("unmasked input",
                           one.predict(std::vector<Tensor<float>>{xa, xb}, {.verbose = 0}),
                           json::array({1.0, 1.0, 4.0 / 3.0, 1.0 / 3.0}));
}

TEST_CASE("layers that would use a mask in a way loadstar does not run refuse a masked input") {
  const auto refused = [](auto make) {
    auto tokens = Input(Shape{5}, "tokens");
    auto e = call(Embedding(12, 4, {.mask_zero = true, .name = "words"}), tokens);
    auto out = make(e);
    return Model(std::vector{tokens}, std::vector{out}, "refusing");
  };
  const auto message = [](const std::string& layer) {
    return "model 'refusing': " + layer +
           " takes an input with a mask attached to it (made by embedding layer 'words'), which "
           "loadstar does not apply in this layer; drop the mask first (mask_zero=False, no "
           "Masking layer) or end it before this layer";
  };
  // Softmax given a mask as its second input: Keras's output would carry that mask, of the
  // inputs' rank, instead of the one attached to the inputs.
  CHECK_THROWS_WITH_AS(
      static_cast<void>(refused([](const KerasTensor& e) {
        return call(std::make_shared<Softmax>(SoftmaxOptions{.name = "soft"}), {e, e});
      })),
      message("softmax layer 'soft'").c_str(), ConfigError);
  // A nested model whose inner layer would refuse the mask given to its input refuses it.
  auto features = Input(Shape{5, 4}, "features");
  auto normalizer = std::make_shared<Model>(
      std::vector{features},
      std::vector{call(std::make_shared<Softmax>(SoftmaxOptions{.name = "inner_soft"}),
                       {features, features})},
      "normalizer");
  CHECK(ModelLayer(normalizer).mask_flow() == MaskFlow::refused);
  CHECK_THROWS_WITH_AS(
      static_cast<void>(refused([&](const KerasTensor& e) { return call(normalizer, e); })),
      message("functional layer 'normalizer'").c_str(), ConfigError);
  // Along the last axis Concatenate ORs the masks, and the LSTM after it reads them.
  Model joined = refused([](const KerasTensor& e) {
    return call(LSTM(2), call(Concatenate(), {e, e}));
  });
  CHECK(joined.predict(tensor({1, 5}, {1, 0, 2, 0, 0}), {.verbose = 0}).shape() == Shape{1, 2});
}

// The checked-in reference values of tests/keras/generate_nested_masks.py.
const json& nested_masks_reference() {
  static const json data = layer_cases::load("nested_masks.json");
  return data;
}

// A reference case's model: its weights set, predicting and taking one SGD step (lr 0.5, mse).
void check_nested_masks(Model& model, const json& c) {
  std::vector<Tensor<float>> weights;
  for (std::size_t i = 0; i < c["weights"].size(); ++i)
    weights.push_back(
        layer_cases::tensor_of(c["weights"][i], layer_cases::shape_of(c["shapes"][i])));
  model.set_weights(weights);
  const Tensor<float> tokens = layer_cases::tensor_of(c["tokens"], Shape{4, 5});
  const Tensor<float> targets = layer_cases::tensor_of(c["targets"], Shape{4, 1});
  layer_cases::check_close("predictions", model.predict(tokens, {.verbose = 0}), c["predictions"]);
  // Saved and loaded in both formats, the nested model's masks run again.
  test_support::TempDir dir;
  for (const char* file : {"model.h5", "model.keras"}) {
    INFO(file);
    model.save(dir / file);
    layer_cases::check_close("loaded predictions",
                             load_model(dir / file)->predict(tokens, {.verbose = 0}),
                             c["predictions"]);
  }
  model.compile(
      {.optimizer = optimizers::SGD(optimizers::SGDOptions{.learning_rate = 0.5}), .loss = "mse"});
  const double loss = model.train_on_batch(tokens, targets).get("loss").value();
  CHECK(loss == doctest::Approx(c["loss"].get<double>()).epsilon(1e-5));
  const auto after = model.get_weights();
  REQUIRE(after.size() == c["updated"].size());
  for (std::size_t i = 0; i < after.size(); ++i)
    layer_cases::check_close("updated weight " + std::to_string(i), after[i], c["updated"][i]);
}

TEST_CASE("masks run through a nested model as Keras runs them, against PyTorch") {
  const auto& cases = nested_masks_reference()["cases"];
  REQUIRE(cases.size() == 2);
  {
    INFO("a mask made inside the nested model and carried out of it");
    auto encoder = std::make_shared<Sequential>(
        std::initializer_list<SequentialItem>{
            Input(Shape{5}), Embedding(9, 3, {.mask_zero = true, .name = "inner_words"}),
            LSTM(4, {.return_sequences = true, .name = "inner_lstm"})},
        "encoder");
    CHECK(ModelLayer(encoder).mask_flow() == MaskFlow::computes);
    auto tokens = Input(Shape{5}, "tokens");
    auto pooled = call(GlobalAveragePooling1D(), call(encoder, tokens));
    Model model(std::vector{tokens}, std::vector{call(Dense(1, {.name = "head"}), pooled)},
                "inner_mask");
    check_nested_masks(model, cases[0]);
  }
  {
    INFO("the outer mask given to the nested model's input");
    auto features = Input(Shape{5, 3}, "features");
    auto inner = std::make_shared<Model>(
        std::vector{features},
        std::vector{call(LSTM(4, {.name = "inner_lstm"}),
                         call(Dense(5, {.activation = "tanh", .name = "inner_dense"}), features))},
        "reader");
    CHECK(ModelLayer(inner).mask_flow() == MaskFlow::ends);
    auto tokens = Input(Shape{5}, "tokens");
    auto words = call(Embedding(9, 3, {.mask_zero = true, .name = "words"}), tokens);
    Model model(std::vector{tokens},
                std::vector{call(Dense(1, {.name = "head"}), call(inner, words))}, "given_mask");
    check_nested_masks(model, cases[1]);
  }
  // The outer mask passes a nested model of layers that pass it, to a layer after it.
  auto features = Input(Shape{5, 3}, "features");
  auto dense = std::make_shared<Model>(
      std::vector{features}, std::vector{call(Dense(2, {.name = "d"}), features)}, "dense_only");
  CHECK(ModelLayer(dense).mask_flow() == MaskFlow::passes);
}

TEST_CASE("a mask that does not fit the layer reading it is refused, naming the layer") {
  // GlobalAveragePooling1D in channels_first would take a masked input's steps for channels.
  auto tokens = Input(Shape{4}, "tokens");
  auto e = call(Embedding(9, 3, {.mask_zero = true}), tokens);
  Model pooled(std::vector{tokens},
               std::vector{call(
                   GlobalAveragePooling1D({.data_format = "channels_first", .name = "gap"}), e)},
               "pooled");
  CHECK_THROWS_WITH_AS(pooled.predict(tensor({1, 4}, {1, 2, 0, 0}), {.verbose = 0}),
                       "global_average_pooling1d layer 'gap': takes a mask (batch, steps) on "
                       "channels_last inputs but got a mask (1, 4) for inputs (1, 4, 3) in "
                       "channels_first",
                       ShapeError);
  // A recurrent layer's mask is (batch, timesteps).
  CpuBackend backend(1);
  LSTM lstm(2, {.name = "r"});
  const Shape in[] = {Shape{3, 2}};
  lstm.build(in, 0);
  const Tensor<float> x(Shape{1, 3, 2});
  const Tensor<float> y(Shape{1, 2});
  const Tensor<float> wrong(Shape{1, 2});
  CHECK_THROWS_WITH_AS(
      lstm.forward(std::span(&x, 1), y, {.backend = backend, .input_masks = std::span(&wrong, 1)}),
      "lstm layer 'r': takes a mask (batch, timesteps) (1, 3) but got one of shape (1, 2)",
      ShapeError);
}

TEST_CASE("a tagger's loss and accuracy are the means over its unmasked steps, as Keras 3's") {
  auto model = unknown_axes_cases::masked_tagger();
  const json& c = case_named("masked_tagger");
  std::vector<Tensor<float>> weights;
  const auto current = model->get_weights();
  for (std::size_t i = 0; i < current.size(); ++i) {
    weights.push_back(layer_cases::tensor_of(
        c["initial_weights"][c["weight_order"][i].get<std::string>()], current[i].shape()));
  }
  model->set_weights(weights);
  model->compile({.optimizer = optimizers::SGD(optimizers::SGDOptions{
                      .learning_rate = unknown_axes_cases::reference()["lr"].get<double>()}),
                  .loss = "sparse_categorical_crossentropy",
                  .metrics = {"accuracy"}});
  for (std::size_t step = 0; step < c["batches"].size(); ++step) {
    const json& batch = c["batches"][step];
    INFO("step ", step);
    const Tensor<float> x = token_batch(batch["x"], batch["length"].get<std::size_t>());
    const Tensor<float> y =
        layer_cases::tensor_of(batch["y"], layer_cases::shape_of(batch["y_shape"]));
    const Logs logs = model->train_on_batch(x, y);
    CHECK(logs.get("loss").value() ==
          doctest::Approx(c["losses"][step].get<double>()).epsilon(1e-5));
    CHECK(logs.get("accuracy").value() ==
          doctest::Approx(c["accuracies"][step].get<double>()).epsilon(1e-9));
  }
  const auto trained = model->get_weights();
  for (std::size_t i = 0; i < trained.size(); ++i) {
    const std::string name = c["weight_order"][i];
    layer_cases::check_close(name, trained[i], c["final_weights"][name]);
  }
}

TEST_CASE("sample weights multiply a masked output's weights, in the loss and weighted metrics") {
  // Embedding rows 0, 1, 2 of one feature: the outputs are the tokens, masked where 0.
  auto tokens = Input(Shape{3}, "tokens");
  auto out = call(Embedding(3, 1, {.mask_zero = true}), tokens);
  Model model(std::vector{tokens}, std::vector{out}, "identity");
  model.set_weights({tensor({3, 1}, {0, 1, 2})});
  model.compile(
      {.optimizer = "sgd", .loss = "mse", .metrics = {"mae"}, .weighted_metrics = {"mae"}});
  const Tensor<float> x = tensor({2, 3}, {1, 2, 0, 2, 0, 0});
  const Tensor<float> y(Shape{2, 3, 1});
  // Squared errors 1, 4 (row 0) and 4 (row 1) unmasked; sample weights 1 and 3: Keras's
  // sum(loss * w * mask) / valid = (1 + 4 + 12) / 3. The metrics: the mean of |e| over the
  // unmasked steps, (1 + 2 + 2) / 3, and weighted, (1 + 2 + 6) / 5.
  const Logs logs = model.test_on_batch(x, y, tensor({2}, {1, 3}));
  CHECK(logs.get("loss").value() == doctest::Approx(17.0 / 3.0));
  CHECK(logs.get("mae").value() == doctest::Approx(5.0 / 3.0));
  CHECK(logs.get("weighted_mae").value() == doctest::Approx(9.0 / 5.0));
  // A batch whose every step is masked has loss 0 (Keras's divide_no_nan).
  CHECK(model.test_on_batch(tensor({1, 3}, {0, 0, 0}), Tensor<float>(Shape{1, 3, 1}))
            .get("loss")
            .value() == 0.0);
}

TEST_CASE("mask_zero, Masking and zero_output_for_mask round-trip through configs and files") {
  auto model = unknown_axes_cases::masked_bilstm_conv();
  auto masking = unknown_axes_cases::masking_rnn_pool();
  const Tensor<float> x = tensor({2, 5}, {3, 1, 0, 0, 0, 2, 0, 5, 6, 0});
  for (Model* m : {model.get(), masking.get()}) {
    const json config = model_get_config(*m);
    const std::string text = config.dump();
    INFO(text);
    if (m == model.get()) {
      CHECK(text.find("\"mask_zero\":true") != std::string::npos);
      CHECK(text.find("\"zero_output_for_mask\":true") != std::string::npos);
    } else {
      CHECK(text.find("\"class_name\":\"Masking\"") != std::string::npos);
      CHECK(text.find("\"mask_value\":0.0") != std::string::npos);
    }
    const auto copy = model_from_config(config);
    CHECK(model_get_config(*copy) == config);
    copy->set_weights(m->get_weights());
    const Tensor<float> expected = m->predict(x, {.verbose = 0});
    CHECK(layer_cases::same_bits(copy->predict(x, {.verbose = 0}), expected));
    test_support::TempDir dir;
    for (const char* file : {"model.h5", "model.keras"}) {
      INFO(file);
      m->save(dir / file);
      CHECK(layer_cases::same_bits(load_model(dir / file)->predict(x, {.verbose = 0}), expected));
    }
  }
}

TEST_CASE("a Keras-written Masking and LSTM model skips masked steps wherever they are") {
  const char* shared = std::getenv("LOADSTAR_SHARED_DIR");
  if (shared == nullptr) {
    MESSAGE("skipped: LOADSTAR_SHARED_DIR is not set");
    return;
  }
  const auto path =
      std::filesystem::path(shared) / "fixtures" / "keras" / "dl4j_masking_zero_lstm.h5";
  if (!std::filesystem::exists(path)) {
    MESSAGE("skipped: the Keras fixture " << path.string() << " is missing");
    return;
  }
  // Keras 2.2.0 (tf.keras): Masking(mask_value=0) on (10, 42), then LSTM(32, hard_sigmoid).
  auto model = load_model(path);
  CHECK(model->layers().front()->class_name() == "Masking");
  // Six steps at the start, or the same six among masked (all-zero) steps: the same output.
  Tensor<float> front(Shape{3, 10, 42});
  for (std::size_t s = 0; s < 6; ++s) {
    for (std::size_t f = 0; f < 42; ++f) {
      const float v = static_cast<float>((s * 42 + f) % 11) / 5.0F - 1.0F;
      front.data()[(0 * 10 + s) * 42 + f] = v;
      const std::size_t spread[] = {1, 2, 4, 5, 7, 9};
      front.data()[(1 * 10 + spread[s]) * 42 + f] = v;
      front.data()[(2 * 10 + (5 - s)) * 42 + f] = v;  // reversed: another sequence
    }
  }
  const Tensor<float> y = model->predict(front, {.verbose = 0});
  REQUIRE(y.shape() == Shape{3, 32});
  for (std::size_t j = 0; j < 32; ++j) {
    CHECK(y.data()[32 + j] == doctest::Approx(y.data()[j]).epsilon(1e-6));
  }
  float difference = 0.0F;
  for (std::size_t j = 0; j < 32; ++j)
    difference = std::max(difference, std::abs(y.data()[64 + j] - y.data()[j]));
  CHECK(difference > 1e-3F);
}

// The checked-in reference values of tests/keras/generate_time_distributed_masks.py.
const json& time_distributed_reference() {
  static const json data = layer_cases::load("time_distributed_masks.json");
  return data;
}

TEST_CASE("TimeDistributed gives a wrapped layer the mask of each step as Keras 3 does") {
  const json& reference = time_distributed_reference();
  const Shape shape = layer_cases::shape_of(reference["shape"]);  // batch, sentences, words
  const auto model_of = [&](const std::string& name) {
    auto tokens = Input(shape.row_shape(), "tokens");
    auto e = call(Embedding(12, 4, {.mask_zero = true}), tokens);
    // td_lstm: each sentence's last unmasked output; td_lstm_pool: the mean of the unmasked
    // words' outputs.
    auto h = name == "td_lstm"
                 ? call(TimeDistributed(LSTM(3), "td"), e)
                 : call(TimeDistributed(GlobalAveragePooling1D(), "pool"),
                        call(TimeDistributed(LSTM(3, {.return_sequences = true}), "td"), e));
    auto out = call(Dense(2), call(Flatten(), h));
    return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, name);
  };
  REQUIRE(reference["cases"].size() == 2);
  for (const auto& c : reference["cases"]) {
    INFO(c["name"].get<std::string>());
    auto model = model_of(c["name"]);
    std::vector<Tensor<float>> weights;
    const auto current = model->get_weights();
    REQUIRE(current.size() == c["weight_order"].size());
    for (std::size_t i = 0; i < current.size(); ++i) {
      weights.push_back(layer_cases::tensor_of(
          c["initial_weights"][c["weight_order"][i].get<std::string>()], current[i].shape()));
    }
    model->set_weights(weights);
    model->compile({.optimizer = optimizers::SGD(
                        optimizers::SGDOptions{.learning_rate = reference["lr"].get<double>()}),
                    .loss = "mse"});
    const Tensor<float> x = layer_cases::tensor_of(c["x"], shape);
    const Tensor<float> y = layer_cases::tensor_of(c["y"], Shape{shape[0], 2});
    CHECK(model->train_on_batch(x, y).get("loss").value() ==
          doctest::Approx(c["loss"].get<double>()).epsilon(1e-5));
    const auto trained = model->get_weights();
    for (std::size_t i = 0; i < trained.size(); ++i) {
      const std::string name = c["weight_order"][i];
      layer_cases::check_close(name, trained[i], c["final_weights"][name]);
    }
    layer_cases::check_close(
        "prediction", model->predict(layer_cases::tensor_of(c["predict_x"], shape), {.verbose = 0}),
        c["prediction"]);
  }
  // The wrapped layer's own mask of each step: a wrapped LSTM passing it (returning sequences)
  // passes it on, one ending it ends it, and BatchNormalization (inference) passes it.
  CHECK(TimeDistributed(LSTM(3, {.return_sequences = true})).mask_flow() == MaskFlow::passes);
  CHECK(TimeDistributed(LSTM(3)).mask_flow() == MaskFlow::ends);
  CHECK(TimeDistributed(GlobalAveragePooling1D()).mask_flow() == MaskFlow::ends);
  CHECK(TimeDistributed(BatchNormalization()).mask_flow() == MaskFlow::passes);
  CHECK(TimeDistributed(Dense(2)).mask_flow() == MaskFlow::passes);
  // Embedding's mask (batch, sentences) on (batch, sentences, 4) features: each step's mask
  // would be (batch), not the (batch, words) a wrapped LSTM reads on steps reshaped to (2, 2).
  auto sentences = Input(Shape{3}, "sentences");
  auto e = call(Embedding(12, 4, {.mask_zero = true}), sentences);
  auto words = call(TimeDistributed(Reshape({2, 2}), "split"), e);
  Model refusing(std::vector{sentences}, std::vector{call(TimeDistributed(LSTM(3), "td"), words)},
                 "refusing");
  CHECK_THROWS_WITH_AS(refusing.predict(Tensor<float>(Shape{2, 3}, 1.0F), {.verbose = 0}),
                       "time_distributed layer 'td': the wrapped lstm layer reads a mask of its "
                       "inputs' shape without the last axis, but the mask (2, 3) of inputs (2, 3, "
                       "2, 2) gives each step one of shape (2,) (Keras 3's mask[:, i]), which it "
                       "cannot take",
                       ShapeError);
  // In inference a wrapped BatchNormalization takes the mask of each step and ignores it.
  auto features = Input(Shape{3, 4}, "features");
  auto masked = call(Masking(), features);
  Model normalized(std::vector{features},
                   std::vector{call(TimeDistributed(BatchNormalization(), "td_norm"), masked)},
                   "normalized");
  const Tensor<float> data = layer_cases::wave(Shape{2, 3, 4}, 1.0F);
  Model plain(std::vector{features},
              std::vector{call(TimeDistributed(BatchNormalization(), "plain_norm"), features)},
              "plain");
  CHECK(layer_cases::same_bits(normalized.predict(data, {.verbose = 0}),
                               plain.predict(data, {.verbose = 0})));
}

}  // namespace masking_test

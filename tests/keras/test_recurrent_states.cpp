// Recurrent layers' states as Keras has them: `return_state` returns the final states (those of
// the last unmasked step) beside the output, and `initial_state` starts a layer from given states;
// an encoder-decoder trains as PyTorch's loop from nn.LSTM's and nn.GRU's initial states
// (tests/keras/generate_unknown_axes.py), saves and loads in both formats with Keras's tensor
// indices, and the mistakes a user can make are refused by name.
#include <doctest/doctest.h>

#include <loadstar/error.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/keras/backend/cpu_backend.hpp>
#include <loadstar/keras/saving/detail/formats.hpp>
#include <loadstar/keras/saving/model_config.hpp>
#include <loadstar/keras/saving/saving.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "keras/layer_cases.hpp"
#include "keras/unknown_axes_cases.hpp"
#include "temp_dir.hpp"

namespace recurrent_states_test {

using loadstar::ConfigError;
using loadstar::Shape;
using loadstar::ShapeError;
using loadstar::Tensor;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;
using nlohmann::json;
using unknown_axes_cases::case_named;
using unknown_axes_cases::check_training;

Tensor<float> tokens_of(Shape shape, std::vector<float> values) {
  Tensor<float> t(shape);
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

/// Saved in both formats and loaded back, `model` predicts for `x` what it predicts now, bit for
/// bit.
void check_saved_predictions(Model& model, const Tensor<float>& x) {
  const Tensor<float> expected = model.predict(x, {.verbose = 0});
  test_support::TempDir dir;
  for (const char* file : {"model.h5", "model.keras"}) {
    INFO(file);
    model.save(dir / file);
    CHECK(layer_cases::same_bits(load_model(dir / file)->predict(x, {.verbose = 0}), expected));
  }
}

TEST_CASE("an LSTM encoder's return_state starts a decoder LSTM, trained as PyTorch's loop") {
  auto model = unknown_axes_cases::seq2seq_lstm();
  check_training(*model, case_named("seq2seq_lstm"), "sparse_categorical_crossentropy");
}

TEST_CASE("GRU and SimpleRNN states, returned beside a masked sequence, train as PyTorch's loop") {
  auto model = unknown_axes_cases::gru_states();
  check_training(*model, case_named("gru_states"), "mse");
}

TEST_CASE("Bidirectional returns both directions' states and starts from given ones") {
  auto model = unknown_axes_cases::bilstm_states();
  check_training(*model, case_named("bilstm_states"), "mse");
  const Tensor<float> x = tokens_of({2, 4}, {3, 1, 4, 0, 2, 7, 0, 5});
  check_saved_predictions(*model, x);
}

TEST_CASE("Bidirectional with merge_mode None returns both directions apart, both masked") {
  auto model = unknown_axes_cases::bigru_separate();
  check_training(*model, case_named("bigru_separate"), "mse");
  const json config = model_get_config(*model);
  const std::string text = config.dump();
  INFO(text);
  CHECK(text.find("\"merge_mode\":null") != std::string::npos);
  CHECK(text.find("[\"bidirectional\",0,1,{}]") != std::string::npos);
  const Tensor<float> x = tokens_of({2, 4}, {3, 1, 4, 0, 2, 7, 0, 5});
  check_saved_predictions(*model, x);
}

TEST_CASE("Attention and AdditiveAttention return their attention scores, and learn through them") {
  auto model = unknown_axes_cases::attention_scores();
  check_training(*model, case_named("attention_scores"), "mse");
  const std::string text = model_get_config(*model).dump();
  CHECK(text.find("\"return_attention_scores\":true") != std::string::npos);
  CHECK(text.find("[\"additive_attention\",0,1,{}]") != std::string::npos);
  check_saved_predictions(*model, tokens_of({2, 5}, {3, 1, 4, 1, 5, 2, 7, 1, 8, 2}));
  // In training the scores are the distribution after dropout, as Keras's _apply_scores returns
  // it: each entry 0 or the probability of prediction over (1 - rate).
  auto q = Input({4, 3}, "q");
  auto layer = std::make_shared<Attention>(
      AttentionOptions{.dropout = 0.5F, .seed = 3, .return_attention_scores = true});
  const auto scored = call_outputs(layer, {q, q});
  Model scores({q}, {scored[1]}, "scores");
  Tensor<float> input(Shape{1, 4, 3});
  for (std::size_t i = 0; i < input.size(); ++i)
    input.data()[i] = static_cast<float>(i % 5) / 4.0F - 0.5F;
  const Tensor<float> p = scores.predict(input, {.verbose = 0});
  REQUIRE(p.shape() == Shape{1, 4, 4});
  CpuBackend backend(1);
  const Tensor<float> dropped(Shape{1, 4, 4}), output(Shape{1, 4, 3});
  const Tensor<float> extra[] = {dropped};
  const Tensor<float> call_inputs[] = {input, input};
  layer->forward(
      call_inputs, output,
      CallContext{.backend = backend, .training = true, .step = 9, .extra_outputs = extra});
  std::size_t zeros = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const float d = dropped.data()[i];
    zeros += d == 0.0F ? 1 : 0;
    if (d != 0.0F) CHECK(d == doctest::Approx(p.data()[i] * 2.0F).epsilon(1e-6));
  }
  CHECK(zeros > 0);
  CHECK(zeros < p.size());
}

TEST_CASE("MultiHeadAttention returns its attention scores, and learns through them") {
  auto model = unknown_axes_cases::mha_scores();
  check_training(*model, case_named("mha_scores"), "mse");
  const json config = model_get_config(*model);
  const std::string text = config.dump();
  INFO(text);
  // tf.keras 2's call: the value among the keyword arguments, and the scores asked for.
  CHECK(text.find("\"return_attention_scores\":true") != std::string::npos);
  CHECK(text.find("[\"multi_head_attention\",0,1,{}]") != std::string::npos);
  const Tensor<float> x = tokens_of({2, 5}, {3, 1, 4, 1, 5, 2, 7, 1, 8, 2});
  check_saved_predictions(*model, x);
  // The scores are each query's probabilities over the value steps.
  auto q = Input({4, 3}, "q");
  const auto scored =
      call_outputs(std::make_shared<MultiHeadAttention>(
                       2, 2, MultiHeadAttentionOptions{.return_attention_scores = true}),
                   {q, q});
  Model scores({q}, {scored[1]}, "scores");
  Tensor<float> input(Shape{1, 4, 3});
  for (std::size_t i = 0; i < input.size(); ++i)
    input.data()[i] = static_cast<float>(i % 5) / 4.0F - 0.5F;
  const Tensor<float> p = scores.predict(input, {.verbose = 0});
  REQUIRE(p.shape() == Shape{1, 2, 4, 4});
  for (std::size_t row = 0; row < 8; ++row) {
    float sum = 0.0F;
    for (std::size_t j = 0; j < 4; ++j)
      sum += p.data()[row * 4 + j];
    CHECK(sum == doctest::Approx(1.0F).epsilon(1e-6));
  }
}

TEST_CASE("an RNN of stacked cells trains as PyTorch's loop of its cells, masks and lengths") {
  // go_backwards: the GRU cell reads the LSTM cell's outputs in processing order, with the mask
  // reversed likewise; a masked step keeps both cells' states.
  auto model = unknown_axes_cases::stacked_cells();
  check_training(*model, case_named("stacked_cells"), "mse");
}

TEST_CASE("an RNN of stacked cells returns and takes every cell's states as its layers stacked") {
  // The same cells as an LSTM returning its sequence and states, then a GRU returning its state
  // (both checked against PyTorch above): output, h1, c1 and h2, from given initial states that
  // a Dense computes, so that their gradients train it too.
  const auto make = [](bool stacked) {
    set_random_seed(19);
    auto x = Input(Shape{none, 3}, "x");
    auto z = Input(Shape{2}, "z");
    auto h1 = call(Dense(4, {.activation = "tanh", .name = "h1"}), z);
    auto c1 = call(Dense(4, {.name = "c1"}), z);
    auto h2 = call(Dense(2, {.activation = "tanh", .name = "h2"}), z);
    std::vector<KerasTensor> states;
    if (stacked) {
      auto stack = std::make_shared<StackedRNN>(
          std::vector<StackedCell>{{.kind = CellKind::lstm, .units = 4},
                                   {.kind = CellKind::gru, .units = 2}},
          StackedRNNOptions{.return_state = true, .name = "stack"});
      states = call_outputs(stack, {x, h1, c1, h2});
    } else {
      const auto lstm = call_outputs(
          LSTM(4, {.return_sequences = true, .return_state = true, .name = "lstm"}), {x, h1, c1});
      const auto gru = call_outputs(GRU(2, {.return_state = true, .name = "gru"}), {lstm[0], h2});
      states = {gru[0], lstm[1], lstm[2], gru[1]};
    }
    REQUIRE(states.size() == 4);
    auto joined = call(Concatenate({.name = "joined"}), states);
    auto model = std::make_shared<Model>(std::vector{x, z},
                                         std::vector{call(Dense(1, {.name = "head"}), joined)},
                                         stacked ? "stacked" : "layers");
    model->compile({.optimizer = optimizers::SGD(optimizers::SGDOptions{.learning_rate = 0.3}),
                    .loss = "mse"});
    return model;
  };
  const auto as_json = [](const Tensor<float>& t) {
    json values = json::array();
    for (const float v : t)
      values.push_back(v);
    return values;
  };
  auto stacked = make(true);
  auto layers = make(false);
  // The same weights: the stack's cells are the two layers', in order.
  std::vector<Tensor<float>> weights;
  for (const auto& layer : layers->layers()) {
    if (layer->name() == "lstm" || layer->name() == "gru") {
      const auto cells = stacked->get_layer("stack")->weights();
      const std::size_t first = layer->name() == "lstm" ? 0 : 3;
      for (std::size_t k = 0; k < 3; ++k)
        weights.push_back(cells[first + k].value.clone());
    } else {
      for (const auto& w : stacked->get_layer(layer->name())->weights())
        weights.push_back(w.value.clone());
    }
  }
  layers->set_weights(weights);
  Tensor<float> x(Shape{3, 5, 3}), z(Shape{3, 2}), y(Shape{3, 1});
  for (std::size_t i = 0; i < x.size(); ++i)
    x.data()[i] = static_cast<float>((i * 7) % 11) / 5.0F - 1.0F;
  for (std::size_t i = 0; i < z.size(); ++i)
    z.data()[i] = static_cast<float>(i % 4) / 2.0F - 0.7F;
  for (std::size_t i = 0; i < y.size(); ++i)
    y.data()[i] = static_cast<float>(i) / 3.0F;
  const std::vector<Tensor<float>> in{x, z};
  for (int step = 0; step < 2; ++step) {
    INFO("step ", step);
    const double a = stacked->train_on_batch(in, y).get("loss").value();
    const double b = layers->train_on_batch(in, y).get("loss").value();
    CHECK(a == doctest::Approx(b).epsilon(1e-6));
  }
  const auto trained = stacked->get_layer("stack")->weights();
  std::size_t k = 0;
  for (const char* name : {"lstm", "gru"}) {
    for (const auto& w : layers->get_layer(name)->weights())
      layer_cases::check_close(name, trained[k++].value, as_json(w.value));
  }
  for (const char* name : {"h1", "c1", "h2", "head"}) {
    const auto a = stacked->get_layer(name)->weights(), b = layers->get_layer(name)->weights();
    for (std::size_t i = 0; i < a.size(); ++i)
      layer_cases::check_close(name, a[i].value, as_json(b[i].value));
  }
  // Keras's nested initial_state in files, both formats.
  test_support::TempDir dir;
  for (const char* file : {"stack.h5", "stack.keras"}) {
    INFO(file);
    stacked->save(dir / file);
    auto copy = load_model(dir / file);
    CHECK(layer_cases::same_bits(copy->predict(in, {.verbose = 0}),
                                 stacked->predict(in, {.verbose = 0})));
  }
}

TEST_CASE("a stateful LSTM carries its states from batch to batch until reset_states") {
  auto model = unknown_axes_cases::stateful_lstm();
  // Trained and predicted as PyTorch's loop continuing from the batch before.
  check_training(*model, case_named("stateful_lstm"), "sparse_categorical_crossentropy");
  const json config = model_get_config(*model);
  CHECK(config.dump().find("\"stateful\":true") != std::string::npos);
  // After reset_states, a batch starts from zeros: as the same layers without stateful.
  auto tokens = Input(Shape{none}, "tokens");
  auto h = call(Embedding(12, 5, {.mask_zero = true}), tokens);
  h = call(LSTM(4), h);
  Model plain({tokens}, {call(Dense(3, {.activation = "softmax"}), h)}, "plain");
  plain.set_weights(model->get_weights());
  const Tensor<float> x = tokens_of({3, 4}, {3, 1, 4, 0, 2, 7, 0, 5, 9, 9, 1, 1});
  model->reset_states();
  const Tensor<float> first = model->predict(x, {.verbose = 0});
  CHECK(layer_cases::same_bits(first, plain.predict(x, {.verbose = 0})));
  // The same batch again starts from the states the first left: another answer.
  const Tensor<float> second = model->predict(x, {.verbose = 0});
  CHECK_FALSE(layer_cases::same_bits(first, second));
  model->reset_states();
  CHECK(layer_cases::same_bits(model->predict(x, {.verbose = 0}), first));
  // Every batch must have the samples whose states it carries.
  CHECK_THROWS_WITH_AS(model->predict(tokens_of({2, 4}, {3, 1, 4, 0, 2, 7, 0, 5}), {.verbose = 0}),
                       doctest::Contains("lstm layer 'lstm': is stateful and carries the states "
                                         "of batches of 3 samples, but got a batch of 2"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(static_cast<void>(Bidirectional(LSTM(3, {.stateful = true}))),
                       doctest::Contains("wraps a stateful layer"), ConfigError);
}

TEST_CASE("a stateful layer's carried states go into a checkpoint and come back exactly") {
  auto model = unknown_axes_cases::stateful_lstm();
  const Tensor<float> x = tokens_of({3, 4}, {3, 1, 4, 0, 2, 7, 0, 5, 9, 9, 1, 1});
  CHECK(model->carried_states().empty());
  model->predict(x, {.verbose = 0});
  // Through CBOR, as the trial's and BackupAndRestore's checkpoints keep them.
  const json saved = json::from_cbor(json::to_cbor(model->carried_states()));
  REQUIRE(saved.contains("lstm"));
  CHECK(saved["lstm"].size() == 2);  // h and c
  CHECK(saved["lstm"][0]["shape"] == json::array({3, 4}));
  const Tensor<float> next = model->predict(x, {.verbose = 0});
  model->reset_states();
  model->restore_carried_states(saved);
  CHECK(layer_cases::same_bits(model->predict(x, {.verbose = 0}), next));
  // A checkpoint without them starts from zeros, as a fresh model does.
  model->restore_carried_states(json::object());
  auto fresh = unknown_axes_cases::stateful_lstm();
  fresh->set_weights(model->get_weights());
  CHECK(
      layer_cases::same_bits(model->predict(x, {.verbose = 0}), fresh->predict(x, {.verbose = 0})));
  json wrong = saved;
  wrong["lstm"][0]["shape"] = json::array({3, 5});
  wrong["lstm"][0]["values"] = std::vector<float>(15, 0.0F);
  CHECK_THROWS_WITH_AS(model->restore_carried_states(wrong),
                       doctest::Contains("lstm layer 'lstm': carries 2 states (batch, 4) but was "
                                         "given states of shapes (3, 5), (3, 4)"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(model->restore_carried_states(json{{"gone", json::array()}}),
                       doctest::Contains("carried states of layer 'gone'"), ConfigError);
}

TEST_CASE("a Keras RNN of one cell loads as that cell's layer and saves as an RNN") {
  // tf.keras 2's config of RNN(LSTMCell(3, name="cell"), return_sequences=True) after an Input.
  const json cell = {{"class_name", "LSTMCell"},
                     {"config",
                      {{"name", "cell"},
                       {"trainable", true},
                       {"dtype", "float32"},
                       {"units", 3},
                       {"activation", "tanh"},
                       {"recurrent_activation", "sigmoid"},
                       {"use_bias", true},
                       {"unit_forget_bias", true},
                       {"dropout", 0.0},
                       {"recurrent_dropout", 0.0},
                       {"implementation", 2}}}};
  const json rnn = {{"name", "rnn"},         {"trainable", true},
                    {"dtype", "float32"},    {"return_sequences", true},
                    {"return_state", false}, {"go_backwards", false},
                    {"stateful", false},     {"unroll", false},
                    {"time_major", false},   {"zero_output_for_mask", false},
                    {"cell", cell}};
  json config = {
      {"class_name", "Sequential"},
      {"config",
       {{"name", "cells"},
        {"layers",
         json::array(
             {{{"class_name", "InputLayer"},
               {"config",
                {{"batch_input_shape", {nullptr, 4, 2}}, {"dtype", "float32"}, {"name", "x"}}}},
              {{"class_name", "RNN"}, {"config", rnn}}})}}}};
  const auto model = model_from_config(config);
  const auto layer = model->get_layer("rnn");
  CHECK(layer->class_name() == "RNN");
  CHECK(model->outputs()[0].shape() == Shape{4, 3});
  // The same computation as an LSTM with those weights (checked against PyTorch elsewhere).
  Sequential lstm{Input({4, 2}), LSTM(3, {.return_sequences = true})};
  lstm.set_weights(model->get_weights());
  Tensor<float> x(Shape{2, 4, 2});
  for (std::size_t i = 0; i < x.size(); ++i)
    x.data()[i] = static_cast<float>(i % 7) / 3.0F - 1.0F;
  const Tensor<float> expected = lstm.predict(x, {.verbose = 0});
  CHECK(layer_cases::same_bits(model->predict(x, {.verbose = 0}), expected));
  const json written = model_get_config(*model);
  INFO(written.dump());
  const json& entry = written["config"]["layers"].back();
  CHECK(entry["class_name"] == "RNN");
  CHECK(entry["config"]["cell"]["class_name"] == "LSTMCell");
  CHECK(entry["config"]["cell"]["config"]["name"] == "cell");
  CHECK(entry["config"]["return_sequences"] == true);
  CHECK_FALSE(entry["config"]["cell"]["config"].contains("return_sequences"));
  test_support::TempDir dir;
  for (const char* file : {"model.h5", "model.keras"}) {
    INFO(file);
    model->save(dir / file);
    const auto loaded = load_model(dir / file);
    CHECK(loaded->get_layer("rnn")->class_name() == "RNN");
    CHECK(layer_cases::same_bits(loaded->predict(x, {.verbose = 0}), expected));
  }
  json stacked = config;
  stacked["config"]["layers"][1]["config"]["cell"] = {
      {"class_name", "StackedRNNCells"}, {"config", {{"cells", json::array({cell, cell})}}}};
  // The same cell twice: StackedRNN's cells need names of their own (their weights' names).
  CHECK_THROWS_WITH_AS(model_from_config(stacked),
                       doctest::Contains("rnn layer 'rnn': two cells are named 'cell'"),
                       ConfigError);
  json renamed = cell;
  renamed["config"]["name"] = "cell_1";
  stacked["config"]["layers"][1]["config"]["cell"]["config"]["cells"][1] = renamed;
  CHECK(model_from_config(stacked)->get_layer("rnn")->weights().size() == 6);
  // A frozen cell in a trainable RNN: one layer here, so refused rather than half applied.
  json frozen = config;
  frozen["config"]["layers"][1]["config"]["cell"]["config"]["trainable"] = false;
  CHECK_THROWS_WITH_AS(model_from_config(frozen),
                       doctest::Contains("a cell of the RNN's trainable true (loadstar runs an RNN "
                                         "and its cell as one layer) but the cell has false"),
                       ConfigError);
}

TEST_CASE("MultiHeadAttention takes Keras's attention_mask as its last input, in files too") {
  auto q = Input({4, 5}, "q");
  auto mask = Input({4, 4}, "mask");
  auto y = call(std::make_shared<MultiHeadAttention>(
                    2, 3, MultiHeadAttentionOptions{.attention_mask = true, .name = "mha"}),
                {q, q, mask});
  Model model({q, mask}, {y}, "masked_attention");
  Tensor<float> x(Shape{2, 4, 5}), m(Shape{2, 4, 4});
  for (std::size_t i = 0; i < x.size(); ++i)
    x.data()[i] = static_cast<float>(i % 9) / 4.0F - 1.0F;
  for (std::size_t i = 0; i < m.size(); ++i)
    m.data()[i] = (i % 4 == 0 || i % 3 == 1) ? 1.0F : 0.0F;
  const auto expected = model.predict_outputs(std::vector<Tensor<float>>{x, m}, {.verbose = 0});
  // A masked value step changes nothing: the value at step 2, masked for every query, altered.
  Tensor<float> all(Shape{2, 4, 4});
  for (std::size_t i = 0; i < all.size(); ++i)
    all.data()[i] = i % 4 == 2 ? 0.0F : 1.0F;
  const auto before = model.predict_outputs(std::vector<Tensor<float>>{x, all}, {.verbose = 0});
  Tensor<float> changed = x.clone();
  for (std::size_t f = 0; f < 5; ++f)
    changed.data()[2 * 5 + f] += 3.0F;
  const auto after =
      model.predict_outputs(std::vector<Tensor<float>>{changed, all}, {.verbose = 0});
  // Query step 2's own output changes (its query moved); the other steps' do not.
  for (std::size_t i : {0, 1, 3})
    for (std::size_t f = 0; f < 5; ++f)
      CHECK(after[0].data()[i * 5 + f] ==
            doctest::Approx(before[0].data()[i * 5 + f]).epsilon(1e-6));
  const std::string text = model_get_config(model).dump();
  INFO(text);
  CHECK(text.find("\"attention_mask\":[\"mask\",0,0]") != std::string::npos);
  test_support::TempDir dir;
  for (const char* file : {"model.h5", "model.keras"}) {
    INFO(file);
    model.save(dir / file);
    const auto loaded = load_model(dir / file);
    CHECK(layer_cases::same_bits(
        loaded->predict_outputs(std::vector<Tensor<float>>{x, m}, {.verbose = 0})[0], expected[0]));
  }
  CHECK_THROWS_WITH_AS(call(std::make_shared<MultiHeadAttention>(
                                2, 3, MultiHeadAttentionOptions{.attention_mask = true}),
                            {q, q, Input({4, 3})}),
                       doctest::Contains("expects an attention mask (None, query steps, value "
                                         "steps)"),
                       ShapeError);
}

TEST_CASE("what a layer with several outputs cannot be part of is refused by name") {
  auto x = Input({4, 2}, "x");
  const auto encoder = call_outputs(LSTM(3, {.return_state = true, .name = "enc"}), x);
  // A config's tensor index past the call's outputs.
  json config = model_get_config(Model({x}, {encoder[2]}, "three"));
  config["config"]["output_layers"] = json::array({json::array({"enc", 0, 3})});
  CHECK_THROWS_WITH_AS(model_from_config(config),
                       doctest::Contains("expected a tensor index below 3 (the outputs of layer "
                                         "'enc') but found 3"),
                       ConfigError);
  // Inside a model used as a layer, the call runs with the outputs nothing reads (the
  // sequence and c), as in the model itself.
  auto inner = std::make_shared<Model>(std::vector{x}, std::vector{encoder[1]}, "inner");
  auto outer_x = Input({4, 2}, "outer_x");
  Model outer({outer_x}, {call(inner, outer_x)}, "outer");
  Tensor<float> batch(Shape{3, 4, 2});
  for (std::size_t i = 0; i < batch.size(); ++i)
    batch.data()[i] = static_cast<float>((i * 7) % 11) / 5.0F - 1.0F;
  CHECK(layer_cases::same_bits(outer.predict(batch, {.verbose = 0}),
                               inner->predict(batch, {.verbose = 0})));
  // With an activity regularizer (Keras 3 would add a penalty per output).
  auto y = Input({4, 2}, "y");
  auto regularized = std::make_shared<GRU>(3, RecurrentOptions{.return_state = true});
  regularized->set_activity_regularizer(std::make_shared<regularizers::L1L2>(0.01, 0.0));
  const auto gru = call_outputs(regularized, y);
  CHECK_THROWS_WITH_AS(Model({y}, {gru[1]}, "penalized"),
                       doctest::Contains("has 2 outputs and an activity_regularizer"), ConfigError);
  // An RNN whose cell is no recurrent cell.
  const json rnn = {{"name", "rnn"},
                    {"cell", {{"class_name", "Dense"}, {"config", {{"units", 3}}}}}};
  CHECK_THROWS_WITH_AS(layers::LayerRegistry::instance().create("RNN", rnn),
                       doctest::Contains("a SimpleRNNCell, LSTMCell or GRUCell"), ConfigError);
}

TEST_CASE("the states a model outputs are the last unmasked step's") {
  auto tokens = Input(Shape{none}, "tokens");
  auto e = call(Embedding(12, 3, {.mask_zero = true}), tokens);
  const auto lstm = call_outputs(LSTM(4, {.return_state = true}), e);
  REQUIRE(lstm.size() == 3);
  CHECK(lstm[1].shape() == Shape{4});
  Model model({tokens}, {lstm[0], lstm[1], lstm[2]}, "states");
  // Keras's unique output names for one layer's several outputs.
  CHECK(model.output_names() == std::vector<std::string>{"lstm", "lstm_1", "lstm_2"});
  const Tensor<float> x = tokens_of({2, 5}, {3, 1, 4, 0, 0, 2, 7, 0, 5, 0});
  const auto outputs = model.predict_outputs(x, {.verbose = 0});
  REQUIRE(outputs.size() == 3);
  // Without zero_output_for_mask an LSTM's last output is its last hidden state.
  CHECK(layer_cases::same_bits(outputs[0], outputs[1]));
  // Trailing masked steps change nothing: the states of (3, 1, 4) alone.
  Model alone({tokens}, {lstm[1], lstm[2]}, "alone");
  const auto short_outputs =
      alone.predict_outputs(tokens_of({2, 3}, {3, 1, 4, 2, 7, 5}), {.verbose = 0});
  for (std::size_t j = 0; j < 4; ++j) {
    CHECK(outputs[1].data()[j] == doctest::Approx(short_outputs[0].data()[j]).epsilon(1e-6));
    CHECK(outputs[2].data()[j] == doctest::Approx(short_outputs[1].data()[j]).epsilon(1e-6));
    // The second row's masked step in the middle is skipped too.
    CHECK(outputs[1].data()[4 + j] ==
          doctest::Approx(short_outputs[0].data()[4 + j]).epsilon(1e-6));
  }
}

TEST_CASE("a model with return_state and initial_state saves and loads in both formats") {
  auto model = unknown_axes_cases::seq2seq_lstm();
  const Tensor<float> x = tokens_of({2, 4}, {3, 1, 4, 0, 2, 7, 0, 5});
  const Tensor<float> expected = model->predict(x, {.verbose = 0});
  const json config = model_get_config(*model);
  const std::string text = config.dump();
  INFO(text);
  CHECK(text.find("\"return_state\":true") != std::string::npos);
  // The decoder's call: the sequence, then the encoder's tensors 1 and 2 (tf.keras 2's form).
  CHECK(text.find("[\"lstm\",0,1,{}],[\"lstm\",0,2,{}]") != std::string::npos);
  const auto copy = model_from_config(config);
  CHECK(model_get_config(*copy) == config);
  copy->set_weights(model->get_weights());
  CHECK(layer_cases::same_bits(copy->predict(x, {.verbose = 0}), expected));
  check_saved_predictions(*model, x);
}

TEST_CASE("a Keras 3 config gives initial_state as a keyword, with tensor indices") {
  // As Keras 3.5 writes the functional config of an encoder-decoder (shapes trimmed).
  const auto tensor = [](const char* layer, int index) {
    return json{{"class_name", "__keras_tensor__"},
                {"config",
                 {{"shape", nullptr}, {"dtype", "float32"}, {"keras_history", {layer, 0, index}}}}};
  };
  const json input = {
      {"module", "keras.layers"},
      {"class_name", "InputLayer"},
      {"config",
       {{"batch_shape", {nullptr, 5, 2}}, {"dtype", "float32"}, {"sparse", false}, {"name", "x"}}},
      {"registered_name", nullptr},
      {"name", "x"},
      {"inbound_nodes", json::array()}};
  const auto lstm = [](const char* name, bool sequences, bool state) {
    return json{
        {"units", 3}, {"return_sequences", sequences}, {"return_state", state}, {"name", name}};
  };
  json encoder = {{"module", "keras.layers"},
                  {"class_name", "LSTM"},
                  {"config", lstm("encoder", false, true)},
                  {"registered_name", nullptr},
                  {"name", "encoder"}};
  encoder["inbound_nodes"] =
      json::array({{{"args", {tensor("x", 0)}}, {"kwargs", json::object()}}});
  json decoder = {{"module", "keras.layers"},
                  {"class_name", "LSTM"},
                  {"config", lstm("decoder", true, false)},
                  {"registered_name", nullptr},
                  {"name", "decoder"}};
  json kwargs = json::object();
  kwargs["initial_state"] = json::array({tensor("encoder", 1), tensor("encoder", 2)});
  decoder["inbound_nodes"] = json::array({{{"args", {tensor("x", 0)}}, {"kwargs", kwargs}}});
  json inner = json::object();
  inner["name"] = "s2s";
  inner["layers"] = json::array({input, encoder, decoder});
  inner["input_layers"] = json::array({"x", 0, 0});
  inner["output_layers"] =
      json::array({json::array({"decoder", 0, 0}), json::array({"encoder", 0, 2})});
  const json config = {{"module", "keras.src.models.functional"},
                       {"class_name", "Functional"},
                       {"registered_name", "Functional"},
                       {"config", inner}};
  const auto model = model_from_config(loadstar::keras::detail::legacy_model_config(config));
  REQUIRE(model->outputs().size() == 2);
  CHECK(model->outputs()[0].shape() == Shape{5, 3});
  CHECK(model->outputs()[1].shape() == Shape{3});
  CHECK(model->get_layer("decoder")->built_input_shapes().size() == 3);
  // Written back as Keras 3 does: the states under initial_state.
  const std::string written = loadstar::keras::detail::keras3_model_config(*model, false).dump();
  INFO(written);
  CHECK(written.find("\"initial_state\":[") != std::string::npos);
  CHECK(written.find("\"keras_history\":[\"encoder\",0,2]") != std::string::npos);
  // The same decoder as Keras 3's RNN of one LSTMCell takes the keyword the same way.
  json rnn_decoder = decoder;
  rnn_decoder["class_name"] = "RNN";
  rnn_decoder["config"] = {{"name", "decoder"},
                           {"return_sequences", true},
                           {"cell",
                            {{"module", "keras.layers"},
                             {"class_name", "LSTMCell"},
                             {"config", {{"units", 3}, {"name", "lstm_cell"}}},
                             {"registered_name", nullptr}}}};
  json rnn_config = config;
  rnn_config["config"]["layers"][2] = rnn_decoder;
  const auto rnn_model =
      model_from_config(loadstar::keras::detail::legacy_model_config(rnn_config));
  CHECK(rnn_model->get_layer("decoder")->class_name() == "RNN");
  CHECK(rnn_model->get_layer("decoder")->built_input_shapes().size() == 3);
  const std::string rnn_written =
      loadstar::keras::detail::keras3_model_config(*rnn_model, false).dump();
  CHECK(rnn_written.find("\"initial_state\":[") != std::string::npos);
}

TEST_CASE("the summary lists a layer's several outputs, and who reads which") {
  auto x = Input({4, 2}, "x");
  const auto encoder = call_outputs(GRU(3, {.return_state = true, .name = "enc"}), x);
  auto y = call(GRU(3, {.name = "dec"}), {x, encoder[1]});
  Model model({x}, {y}, "printed");
  std::ostringstream out;
  model.summary(out);
  INFO(out.str());
  // Keras's list of shapes, cut at the column's width as Keras cuts it.
  CHECK(out.str().find(" enc (GRU)                      [(None, 3), (None,") != std::string::npos);
  CHECK(out.str().find("'enc[0][1]'") != std::string::npos);
}

TEST_CASE("return_state and initial_state mistakes are refused by name") {
  auto x = Input({4, 2}, "x");
  // call would drop the states unseen.
  CHECK_THROWS_WITH_AS(call(LSTM(3, {.return_state = true, .name = "enc"}), x),
                       doctest::Contains("lstm layer 'enc': returns 3 outputs; call it with "
                                         "call_outputs"),
                       ConfigError);
  auto h = Input({3}, "h");
  auto wrong = Input({4}, "wrong");
  // An LSTM takes h and c.
  CHECK_THROWS_WITH_AS(call(LSTM(3, {.name = "dec"}), {x, h}),
                       doctest::Contains("takes the sequence and 2 initial states"), ShapeError);
  CHECK_THROWS_WITH_AS(call(GRU(3, {.name = "dec2"}), {x, wrong}),
                       doctest::Contains("expects initial states of shape (None, 3) but got "
                                         "(None, 4)"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(call(Bidirectional(GRU(3), MergeMode::concat, "both"), {x, h}),
                       doctest::Contains("bidirectional layer 'both': takes the sequence and 2 "
                                         "initial states"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(
      static_cast<void>(Bidirectional(LSTM(3, {.return_state = true}),
                                      LSTM(3, {.go_backwards = true}), MergeMode::concat)),
      doctest::Contains("backward_layer must have the forward layer's "
                        "return_state"),
      ConfigError);
}

}  // namespace recurrent_states_test

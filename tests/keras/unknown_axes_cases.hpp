// The PyTorch reference of tests/keras/generate_unknown_axes.py: text models on Input({none}) (an
// Embedding and LSTM classifier, a self-attention block, a Bidirectional LSTM tagger, Conv1D
// classifiers with and without 1-D pooling, a GRU and SimpleRNN stack between ZeroPadding1D,
// Cropping1D and UpSampling1D; masked by Embedding(mask_zero=True) or Masking before LSTM,
// Bidirectional(LSTM), SimpleRNN, GRU, Attention, AdditiveAttention, MultiHeadAttention,
// GlobalAveragePooling1D and a masked loss) trained one SGD step per batch on batches of
// different lengths, run on any backend.
#pragma once

#include <doctest/doctest.h>

#include <loadstar/keras.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "keras/layer_cases.hpp"

namespace unknown_axes_cases {

using loadstar::Shape;
using loadstar::Tensor;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;
using nlohmann::json;

inline const json& reference() {
  static const json data = layer_cases::load("unknown_axes.json");
  return data;
}

inline const json& case_named(const std::string& name) {
  for (const auto& c : reference()["cases"])
    if (c["name"] == name) return c;
  FAIL("no reference case " << name);
  static const json none_found;
  return none_found;
}

/// Token ids (batch, length) as floats, as a loader hands them to an Embedding.
inline Tensor<float> token_batch(const json& values, std::size_t length) {
  const std::size_t batch = reference()["batch"].get<std::size_t>();
  Tensor<float> x(Shape{batch, length});
  for (std::size_t i = 0; i < x.size(); ++i)
    x.data()[i] = values[i].get<float>();
  return x;
}

inline std::shared_ptr<Model> text_lstm() {
  auto tokens = Input(Shape{none}, "tokens");
  auto h = call(Embedding(12, 5), tokens);
  h = call(LSTM(4), h);
  auto out = call(Dense(3, {.activation = "softmax"}), h);
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "text_lstm");
}

inline std::shared_ptr<Model> text_attention() {
  auto tokens = Input(Shape{none}, "tokens");
  auto e = call(Embedding(12, 8), tokens);
  auto a = call(MultiHeadAttention(2, 3), {e, e});
  auto h = call(LayerNormalization(), call(Add(), {e, a}));
  auto out = call(Dense(2), call(GlobalAveragePooling1D(), h));
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "text_attention");
}

inline std::shared_ptr<Model> tagger() {
  auto tokens = Input(Shape{none}, "tokens");
  auto h = call(Embedding(12, 5), tokens);
  h = call(Bidirectional(LSTM(3, {.return_sequences = true})), h);
  auto out = call(TimeDistributed(Dense(1)), h);
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "tagger");
}

inline std::shared_ptr<Model> text_cnn() {
  auto tokens = Input(Shape{none}, "tokens");
  auto h = call(Embedding(12, 6), tokens);
  h = call(Conv1D(4, 3, {.strides = 2, .activation = "relu"}), h);
  auto out = call(Dense(1, {.activation = "sigmoid"}), call(GlobalMaxPooling1D(), h));
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "text_cnn");
}

inline std::shared_ptr<Model> text_cnn_pooled() {
  auto tokens = Input(Shape{none}, "tokens");
  auto h = call(Embedding(12, 6), tokens);
  h = call(Conv1D(4, 3, {.padding = "same", .activation = "relu"}), h);
  h = call(AveragePooling1D(), call(MaxPooling1D(), h));  // pool_size 2
  auto out = call(Dense(1, {.activation = "sigmoid"}), call(GlobalAveragePooling1D(), h));
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "text_cnn_pooled");
}

inline std::shared_ptr<Model> padded_gru() {
  auto tokens = Input(Shape{none}, "tokens");
  auto h = call(ZeroPadding1D({1, 2}), call(Embedding(12, 5), tokens));
  h = call(GRU(4, {.return_sequences = true}), h);
  h = call(UpSampling1D(2), call(Cropping1D({1, 1}), h));
  auto out = call(Dense(2), call(SimpleRNN(3), h));
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "padded_gru");
}

inline std::shared_ptr<Model> masked_lstm() {
  auto tokens = Input(Shape{none}, "tokens");
  auto h = call(Embedding(12, 5, {.mask_zero = true}), tokens);
  h = call(LSTM(4, {.go_backwards = true}), h);
  auto out = call(Dense(3, {.activation = "softmax"}), h);
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "masked_lstm");
}

inline std::shared_ptr<Model> masked_bilstm_conv() {
  auto tokens = Input(Shape{none}, "tokens");
  auto h = call(Embedding(12, 5, {.mask_zero = true}), tokens);
  h = call(Bidirectional(LSTM(3, {.return_sequences = true})), h);
  h = call(Conv1D(2, 2, {.activation = "relu"}), h);  // the mask stops here, with a warning
  auto out = call(Dense(1, {.activation = "sigmoid"}), call(GlobalMaxPooling1D(), h));
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "masked_bilstm_conv");
}

inline std::shared_ptr<Model> masking_rnn_pool() {
  auto tokens = Input(Shape{none}, "tokens");
  auto h = call(Masking({.mask_value = 0.0F}), call(Embedding(12, 4), tokens));
  h = call(SimpleRNN(3, {.return_sequences = true}), h);
  h = call(Dense(3, {.activation = "tanh"}), h);
  h = call(GRU(2, {.return_sequences = true}), h);
  auto out = call(Dense(2), call(GlobalAveragePooling1D(), h));
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "masking_rnn_pool");
}

inline std::shared_ptr<Model> masked_tagger() {
  auto tokens = Input(Shape{none}, "tokens");
  auto h = call(Embedding(12, 5, {.mask_zero = true}), tokens);
  h = call(GRU(4, {.return_sequences = true}), h);
  auto out = call(Dense(3, {.activation = "softmax"}), h);  // carries the mask to the loss
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "masked_tagger");
}

inline std::shared_ptr<Model> masked_attentions() {
  auto tokens = Input(Shape{none}, "tokens");
  auto e = call(Embedding(12, 6, {.mask_zero = true}), tokens);
  auto dot = call(Attention(), {e, e});
  auto additive = call(AdditiveAttention(), {e, e});
  auto out = call(Dense(2), call(GlobalAveragePooling1D(), call(Add(), {dot, additive})));
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "masked_attentions");
}

inline std::shared_ptr<Model> masked_mha() {
  auto tokens = Input(Shape{none}, "tokens");
  auto e = call(Embedding(12, 8, {.mask_zero = true}), tokens);
  auto a = call(MultiHeadAttention(2, 3), {e, e});
  auto h = call(LayerNormalization(), call(Add(), {e, a}));
  auto out = call(Dense(2), call(GlobalAveragePooling1D(), h));
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "masked_mha");
}

inline std::shared_ptr<Model> masked_td_tagger() {
  auto tokens = Input(Shape{none}, "tokens");
  auto h = call(Embedding(12, 5, {.mask_zero = true}), tokens);
  h = call(Bidirectional(LSTM(3, {.return_sequences = true})), h);
  auto out = call(TimeDistributed(Dense(1)), h);  // keeps the mask, for the loss
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "masked_td_tagger");
}

/// Sets the reference's initial weights (in the model's order), trains one SGD step per batch of
/// the reference's lengths and checks every loss, the predictions of a batch of another length
/// and the final weights.
inline std::shared_ptr<Model> seq2seq_lstm() {
  auto tokens = Input(Shape{none}, "tokens");
  auto encoded = call(Embedding(12, 5, {.mask_zero = true}), tokens);
  // The encoder's output is read by nothing: only its states.
  const auto encoder = call_outputs(LSTM(4, {.return_state = true}), encoded);
  auto h = call(Embedding(12, 5), tokens);
  h = call(LSTM(4, {.return_sequences = true, .go_backwards = true}), {h, encoder[1], encoder[2]});
  auto out = call(Dense(3, {.activation = "softmax"}), call(GlobalAveragePooling1D(), h));
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "seq2seq_lstm");
}

inline std::shared_ptr<Model> gru_states() {
  auto tokens = Input(Shape{none}, "tokens");
  auto e = call(Embedding(12, 4, {.mask_zero = true}), tokens);
  const auto gru = call_outputs(GRU(3, {.return_sequences = true, .return_state = true}), e);
  const auto rnn = call_outputs(SimpleRNN(3, {.return_state = true}), {gru[0], gru[1]});
  auto out = call(Dense(2), call(Concatenate(), {rnn[0], rnn[1], gru[1]}));
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "gru_states");
}

inline std::shared_ptr<Model> bilstm_states() {
  auto tokens = Input(Shape{none}, "tokens");
  auto e = call(Embedding(12, 5, {.mask_zero = true}), tokens);
  // The merged output is read by nothing: only the states of both directions.
  const auto first = call_outputs(Bidirectional(LSTM(3, {.return_state = true})), e);
  auto h = call(Embedding(12, 5), tokens);
  h = call(Bidirectional(LSTM(3), MergeMode::sum), {h, first[1], first[2], first[3], first[4]});
  auto out = call(Dense(2), h);
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "bilstm_states");
}

inline std::shared_ptr<Model> bigru_separate() {
  auto tokens = Input(Shape{none}, "tokens");
  auto e = call(Embedding(12, 4, {.mask_zero = true}), tokens);
  const auto both =
      call_outputs(Bidirectional(GRU(3, {.return_sequences = true}), MergeMode::none), e);
  auto pooled = call(Concatenate(), {call(GlobalAveragePooling1D(), both[0]),
                                     call(GlobalAveragePooling1D(), both[1])});
  auto out = call(Dense(2), pooled);
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "bigru_separate");
}

inline std::shared_ptr<Model> mha_scores() {
  auto tokens = Input(Shape{5}, "tokens");
  auto e = call(Embedding(12, 6), tokens);
  const auto attended =
      call_outputs(std::make_shared<MultiHeadAttention>(
                       2, 3, MultiHeadAttentionOptions{.return_attention_scores = true}),
                   {e, e});
  auto features = call(Concatenate(),
                       {call(GlobalAveragePooling1D(), attended[0]), call(Flatten(), attended[1])});
  auto out = call(Dense(2), features);
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "mha_scores");
}

inline std::shared_ptr<Model> stateful_lstm() {
  auto tokens = Input(Shape{none}, "tokens");
  auto h = call(Embedding(12, 5, {.mask_zero = true}), tokens);
  h = call(LSTM(4, {.stateful = true}), h);
  auto out = call(Dense(3, {.activation = "softmax"}), h);
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "stateful_lstm");
}

inline std::shared_ptr<Model> stacked_cells() {
  auto tokens = Input(Shape{none}, "tokens");
  auto h = call(Embedding(12, 5, {.mask_zero = true}), tokens);
  h = call(StackedRNN({{.kind = CellKind::lstm, .units = 4}, {.kind = CellKind::gru, .units = 3}},
                      {.go_backwards = true}),
           h);
  auto out = call(Dense(2), h);
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "stacked_cells");
}

inline std::shared_ptr<Model> attention_scores() {
  auto tokens = Input(Shape{5}, "tokens");
  auto e = call(Embedding(12, 6), tokens);
  const auto dot = call_outputs(std::make_shared<Attention>(AttentionOptions{
                                    .use_scale = true, .return_attention_scores = true}),
                                {e, e});
  const auto additive = call_outputs(std::make_shared<AdditiveAttention>(
                                         AdditiveAttentionOptions{.return_attention_scores = true}),
                                     {e, e});
  auto features = call(Concatenate(), {call(GlobalAveragePooling1D(), dot[0]),
                                       call(GlobalAveragePooling1D(), additive[0]),
                                       call(Flatten(), dot[1]), call(Flatten(), additive[1])});
  auto out = call(Dense(2), features);
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "attention_scores");
}

inline void check_training(Model& model, const json& c, const std::string& loss,
                           std::shared_ptr<Backend> backend = nullptr) {
  INFO(c["name"].get<std::string>());
  std::vector<Tensor<float>> weights;
  const auto current = model.get_weights();
  REQUIRE(current.size() == c["weight_order"].size());
  for (std::size_t i = 0; i < current.size(); ++i) {
    weights.push_back(layer_cases::tensor_of(
        c["initial_weights"][c["weight_order"][i].get<std::string>()], current[i].shape()));
  }
  model.set_weights(weights);
  model.compile({.optimizer = optimizers::SGD(
                     optimizers::SGDOptions{.learning_rate = reference()["lr"].get<double>()}),
                 .loss = loss,
                 .backend = std::move(backend)});
  for (std::size_t step = 0; step < c["batches"].size(); ++step) {
    const json& batch = c["batches"][step];
    INFO("step ", step, " of length ", batch["length"].get<std::size_t>());
    const Tensor<float> x = token_batch(batch["x"], batch["length"].get<std::size_t>());
    const Tensor<float> y =
        layer_cases::tensor_of(batch["y"], layer_cases::shape_of(batch["y_shape"]));
    const double value = model.train_on_batch(x, y).get("loss").value();
    CHECK(value == doctest::Approx(c["losses"][step].get<double>()).epsilon(1e-5));
  }
  const std::size_t length = c["prediction_shape"].size() == 3
                                 ? c["prediction_shape"][1].get<std::size_t>()
                                 : c["predict_x"].size() / reference()["batch"].get<std::size_t>();
  const Tensor<float> predicted =
      model.predict(token_batch(c["predict_x"], length), {.verbose = 0});
  CHECK(predicted.shape() == layer_cases::shape_of(c["prediction_shape"]));
  layer_cases::check_close("prediction", predicted, c["prediction"]);
  const auto trained = model.get_weights();
  for (std::size_t i = 0; i < trained.size(); ++i) {
    const std::string name = c["weight_order"][i];
    layer_cases::check_close(name, trained[i], c["final_weights"][name]);
  }
}

inline std::shared_ptr<Model> masked_batch_norm() {
  auto tokens = Input(Shape{none}, "tokens");
  auto h = call(Embedding(12, 5, {.mask_zero = true}), tokens);
  h = call(Dense(4, {.activation = "tanh"}), h);
  h = call(BatchNormalization({.momentum = 0.9}), h);  // the statistics of the unmasked steps
  auto out = call(Dense(2), call(GlobalAveragePooling1D(), h));
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "masked_batch_norm");
}

inline std::shared_ptr<Model> masked_concat_time() {
  auto tokens = Input(Shape{none}, "tokens");
  auto e = call(Embedding(12, 5, {.mask_zero = true}), tokens);
  auto a = call(Dense(5, {.activation = "tanh"}), e);
  auto b = call(Conv1D(5, 3, {.padding = "same"}), e);  // the mask stops here, with a warning
  // Along the steps, of unknown length: the masks joined, the convolution's steps all counting.
  auto joined = call(Concatenate({.axis = 1}), {a, b, e});
  auto out = call(Dense(2), call(GRU(3), joined));
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "masked_concat_time");
}

/// masked_mha with its Transformer block a nested model, given the Embedding's mask (the same
/// weights in the same order).
inline std::shared_ptr<Model> nested_masked_mha() {
  auto x = Input(Shape{none, 8}, "x");
  auto attended = call(MultiHeadAttention(2, 3), {x, x});
  auto block = std::make_shared<Model>(
      std::vector{x}, std::vector{call(LayerNormalization(), call(Add(), {x, attended}))}, "block");
  auto tokens = Input(Shape{none}, "tokens");
  auto e = call(Embedding(12, 8, {.mask_zero = true}), tokens);
  auto out = call(Dense(2), call(GlobalAveragePooling1D(), call(block, e)));
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "nested_mha");
}

/// masked_lstm with its Embedding and LSTM a nested Sequential, which makes the mask inside.
inline std::shared_ptr<Model> nested_masked_lstm() {
  auto encoder = std::make_shared<Sequential>(
      std::initializer_list<SequentialItem>{Input(Shape{none}),
                                            Embedding(12, 5, {.mask_zero = true}),
                                            LSTM(4, {.go_backwards = true})},
      "encoder");
  auto tokens = Input(Shape{none}, "tokens");
  auto out = call(Dense(3, {.activation = "softmax"}), call(encoder, tokens));
  return std::make_shared<Model>(std::vector{tokens}, std::vector{out}, "nested_lstm");
}

/// Every reference case: its name, its model and its loss.
struct Case {
  const char* name;
  std::shared_ptr<Model> (*make)();
  const char* loss;
};

inline std::vector<Case> all_cases() {
  return {{"text_lstm", text_lstm, "sparse_categorical_crossentropy"},
          {"text_attention", text_attention, "mse"},
          {"tagger", tagger, "mse"},
          {"text_cnn", text_cnn, "binary_crossentropy"},
          {"text_cnn_pooled", text_cnn_pooled, "binary_crossentropy"},
          {"padded_gru", padded_gru, "mse"},
          {"masked_lstm", masked_lstm, "sparse_categorical_crossentropy"},
          {"masked_bilstm_conv", masked_bilstm_conv, "binary_crossentropy"},
          {"masking_rnn_pool", masking_rnn_pool, "mse"},
          {"masked_tagger", masked_tagger, "sparse_categorical_crossentropy"},
          {"masked_attentions", masked_attentions, "mse"},
          {"masked_mha", masked_mha, "mse"},
          {"masked_td_tagger", masked_td_tagger, "mse"},
          {"seq2seq_lstm", seq2seq_lstm, "sparse_categorical_crossentropy"},
          {"gru_states", gru_states, "mse"},
          {"bilstm_states", bilstm_states, "mse"},
          {"bigru_separate", bigru_separate, "mse"},
          {"mha_scores", mha_scores, "mse"},
          {"stateful_lstm", stateful_lstm, "sparse_categorical_crossentropy"},
          {"stacked_cells", stacked_cells, "mse"},
          {"attention_scores", attention_scores, "mse"},
          {"masked_batch_norm", masked_batch_norm, "mse"},
          {"masked_concat_time", masked_concat_time, "mse"}};
}

/// Reference cases run again with part of the model nested (a model used as a layer).
inline std::vector<Case> nested_cases() {
  return {{"masked_mha", nested_masked_mha, "mse"},
          {"masked_lstm", nested_masked_lstm, "sparse_categorical_crossentropy"}};
}

}  // namespace unknown_axes_cases

// The training workloads of bench_keras (CPU backend) and bench_keras_gpu (CUDA backend): the
// same models, optimizer, loss and synthetic data, so that the two executables and
// benchmarks/peers/keras_torch.py measure the same steps.
//
// - "mlp": the Fashion-MNIST MLP, Flatten -> Dense(128, relu) -> Dense(10);
// - "cnn": Conv2D 32 -> MaxPooling2D -> Conv2D 64 -> MaxPooling2D -> Flatten -> Dense 128 ->
//   Dense 10 on 28x28x1 images;
// - "text": Embedding 1000x32 -> Conv1D 64x5 -> MaxPooling1D 4 -> Conv1D 64x5 ->
//   GlobalMaxPooling1D -> Dense 10 on sequences of 100 token ids;
// - "transformer": a Transformer encoder block as Keras's "Text classification with Transformer"
//   example, Embedding 1000x32 -> MultiHeadAttention(2 heads, key_dim 16)(x, x) -> Add ->
//   LayerNormalization(1e-6) -> Dense 64 relu -> Dense 32 -> Add -> LayerNormalization ->
//   GlobalAveragePooling1D -> Dense 10 on the text workload's sequences of 100 token ids;
// each with Adam(1e-3) and sparse categorical cross-entropy from logits, trained on `steps`
// batches per pass of fit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <loadstar/keras.hpp>
#include <memory>
#include <string>
#include <utility>

namespace loadstar::bench {

/// Batches per pass of fit (one timed iteration).
inline constexpr std::size_t steps = 50;
/// Token ids per sequence of the text workload.
inline constexpr std::size_t text_steps = 100;

/// The workload's model, compiled with Adam(1e-3) and cross-entropy from logits on `backend`
/// (the CPU backend with `threads` threads when null).
inline std::unique_ptr<keras::Model> make_model(const std::string& workload, std::size_t threads,
                                                std::shared_ptr<keras::Backend> backend = nullptr) {
  using namespace loadstar::keras;
  using namespace loadstar::keras::layers;
  set_random_seed(1);
  const auto compile = [&](auto model) {
    model->compile({.optimizer = optimizers::Adam({.learning_rate = 1e-3}),
                    .loss = losses::SparseCategoricalCrossentropy(true),
                    .threads = threads,
                    .backend = std::move(backend)});
    return model;
  };
  if (workload == "transformer") {
    auto tokens = Input({text_steps});
    auto x = call(Embedding(1000, 32), tokens);
    auto attention = call(std::make_shared<MultiHeadAttention>(2, 16), {x, x});
    auto out1 = call(LayerNormalization({.epsilon = 1e-6F}), call(Add(), {x, attention}));
    auto ffn = call(Dense(32), call(Dense(64, {.activation = "relu"}), out1));
    auto out2 = call(LayerNormalization({.epsilon = 1e-6F}), call(Add(), {out1, ffn}));
    auto logits = call(Dense(10), call(GlobalAveragePooling1D(), out2));
    return compile(std::make_unique<Model>(tokens, logits, "transformer"));
  }
  std::unique_ptr<Sequential> model;
  if (workload == "mlp") {
    model = std::make_unique<Sequential>(std::initializer_list<SequentialItem>{
        Input({28, 28}), Flatten(), Dense(128, {.activation = "relu"}), Dense(10)});
  } else if (workload == "text") {
    model = std::make_unique<Sequential>(std::initializer_list<SequentialItem>{
        Input({text_steps}), Embedding(1000, 32), Conv1D(64, 5, {.activation = "relu"}),
        MaxPooling1D({.pool_size = 4}), Conv1D(64, 5, {.activation = "relu"}), GlobalMaxPooling1D(),
        Dense(10)});
  } else {
    model = std::make_unique<Sequential>(std::initializer_list<SequentialItem>{
        Input({28, 28}), Reshape({28, 28, 1}), Conv2D(32, 3, {.activation = "relu"}),
        MaxPooling2D(), Conv2D(64, 3, {.activation = "relu"}), MaxPooling2D(), Flatten(),
        Dense(128, {.activation = "relu"}), Dense(10)});
  }
  return compile(std::move(model));
}

/// `rows` synthetic samples of the workload on the host: pixels in [0, 1) (token ids in
/// [0, 1000) for "text" and "transformer") from a fixed linear congruential sequence, labels
/// `i % 10`.
inline std::pair<Tensor<float>, Tensor<std::int64_t>> synthetic_data(const std::string& workload,
                                                                     std::size_t rows) {
  const bool text = workload == "text" || workload == "transformer";
  Tensor<float> x(text ? Shape{rows, text_steps} : Shape{rows, 28, 28});
  Tensor<std::int64_t> y({rows});
  std::uint64_t seed = 7;
  for (auto& v : x) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    v = text ? static_cast<float>((seed >> 33) % 1000)
             : static_cast<float>(seed >> 40) / static_cast<float>(1ULL << 24);
  }
  for (std::size_t i = 0; i < rows; ++i)
    y(i) = static_cast<std::int64_t>(i % 10);
  return {std::move(x), std::move(y)};
}

}  // namespace loadstar::bench

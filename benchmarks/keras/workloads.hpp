// The training workloads of bench_keras (CPU backend) and bench_keras_gpu (CUDA backend): the
// same models, optimizer, loss and synthetic data, so that the two executables and
// benchmarks/peers/keras_torch.py measure the same steps.
//
// - "mlp": the Fashion-MNIST MLP, Flatten -> Dense(128, relu) -> Dense(10);
// - "cnn": Conv2D 32 -> MaxPooling2D -> Conv2D 64 -> MaxPooling2D -> Flatten -> Dense 128 ->
//   Dense 10 on 28x28x1 images;
// - "text": Embedding 1000x32 -> Conv1D 64x5 -> MaxPooling1D 4 -> Conv1D 64x5 ->
//   GlobalMaxPooling1D -> Dense 10 on sequences of 100 token ids;
// - "mobilenet": on 32x32x3 images, a stem Conv2D 32 3x3 stride 2 "same", then four
//   depthwise-separable blocks, each DepthwiseConv2D 3x3 "same" -> BatchNormalization -> ReLU(6)
//   -> Conv2D 1x1 -> BatchNormalization -> ReLU(6), with (filters, stride) (64, 1), (128, 2),
//   (128, 1), (256, 2) (16x16 -> 8x8 -> 4x4), then GlobalAveragePooling2D -> Dense 10; the
//   convolutions have no bias (BatchNormalization follows each), every BatchNormalization
//   Keras's defaults (momentum 0.99, epsilon 1e-3);
// - "unet": a functional encoder-decoder on 32x32x3 images to one logit per pixel: two Conv2D 3x3
//   "same" relu per level with 8, 16 and 32 filters (32x32, 16x16, 8x8), MaxPooling2D between the
//   encoder's levels, Conv2DTranspose 2x2 stride 2 (16, then 8 filters, linear) up, Concatenate
//   with the encoder's output of the same size (upsampled first), two Conv2D 3x3 "same" relu, and
//   a Conv2D 1x1 with one filter; binary cross-entropy from logits against a mask of the pixels
//   whose first channel exceeds 0.5;
// - "transformer": a Transformer encoder block as Keras's "Text classification with Transformer"
//   example, Embedding 1000x32 -> MultiHeadAttention(2 heads, key_dim 16)(x, x) -> Add ->
//   LayerNormalization(1e-6) -> Dense 64 relu -> Dense 32 -> Add -> LayerNormalization ->
//   GlobalAveragePooling1D -> Dense 10 on the text workload's sequences of 100 token ids;
// - "bilstm": the recurrent text classifier, Embedding 1000x32 -> Bidirectional(LSTM(64)) (the
//   two directions' last outputs concatenated, Keras's merge_mode "concat") -> Dense 10 on the
//   text workload's sequences of 100 token ids;
// - "resnet": the shape of ResNet-20 (He et al.'s CIFAR-10 ResNet, v1) on 32x32x3 images with
//   `resnet_blocks` residual blocks per stage (1, a ResNet-8; ResNet-20 has 3): a stem Conv2D 16
//   3x3 "same" -> BatchNormalization -> ReLU, then three stages of 16, 32 and 64 filters (32x32,
//   16x16, 8x8), each block Conv2D 3x3 (stride 2 in the first block of the second and third stages)
//   -> BatchNormalization -> ReLU -> Conv2D 3x3 -> BatchNormalization, Add with the block's input
//   (through a Conv2D 1x1 stride 2 -> BatchNormalization projection where the shape changes), ReLU;
//   then GlobalAveragePooling2D -> Dense 10; the convolutions have no bias, every
//   BatchNormalization Keras's defaults; trained in the policy `make_model` is given ("float32" or
//   "mixed_bfloat16" on the CPU, also "mixed_float16" on the GPU);
// - "grouped": grouped convolutions on 32x32x3 images (CPU only), Conv2D 32 3x3 -> Conv2D 64 3x3
//   groups 4 -> Conv2D 64 3x3 groups 8, each "same" relu with bias, then GlobalAveragePooling2D ->
//   Dense 10;
// each with Adam(1e-3) and (but "unet") sparse categorical cross-entropy from logits, trained on
// `steps_of(workload)` batches per pass of fit (50; 10 for "mobilenet" and "unet", whose steps are
// longer, and for "grouped"; 2 for "resnet", at batch 128 and 512). benchmarks/peers/keras_torch.py
// builds the same architectures (layers, sizes, strides, bias or not, activations,
// BatchNormalization's momentum and epsilon), optimizer and loss in PyTorch (and the mixed policies
// as `torch.autocast` of the policy's compute dtype).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <loadstar/keras.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace loadstar::bench {

/// Batches per pass of fit (one timed iteration) of the mlp, cnn and text workloads.
inline constexpr std::size_t steps = 50;
/// Batches per pass of fit of the mobilenet and unet workloads.
inline constexpr std::size_t image_steps = 10;
/// Batches per pass of fit of the resnet workload.
inline constexpr std::size_t resnet_steps = 2;
/// Residual blocks per stage of the resnet workload: 1 (a ResNet-8), where ResNet-20 has 3, so
/// that the CPU rows at batch 512 take seconds, not minutes, per pass.
inline constexpr std::size_t resnet_blocks = 1;
/// Token ids per sequence of the text workload.
inline constexpr std::size_t text_steps = 100;

/// Whether the workload trains on sequences of `text_steps` token ids (text, transformer, bilstm).
inline bool token_inputs(const std::string& workload) {
  return workload == "text" || workload == "transformer" || workload == "bilstm";
}

/// Whether the workload trains on 32x32x3 images (mobilenet, unet, resnet, grouped).
inline bool color_images(const std::string& workload) {
  return workload == "mobilenet" || workload == "unet" || workload == "resnet" ||
         workload == "grouped";
}

/// Conv2D (`filters`, `size`x`size`, `stride`, "same", no bias) -> BatchNormalization -> ReLU(6),
/// the mobilenet workload's convolutions.
inline keras::KerasTensor conv_bn_relu6(keras::KerasTensor x, std::size_t filters, std::size_t size,
                                        std::size_t stride) {
  using namespace loadstar::keras;
  using namespace loadstar::keras::layers;
  x = call(Conv2D(filters, size, {.strides = stride, .padding = "same", .use_bias = false}), x);
  x = call(BatchNormalization(), x);
  return call(ReLU({.max_value = 6.0F}), x);
}

/// Batches per pass of fit of the workload.
inline std::size_t steps_of(const std::string& workload) {
  if (workload == "resnet") return resnet_steps;
  return color_images(workload) ? image_steps : steps;
}

/// The mobilenet workload's model (see the file's comment).
inline std::unique_ptr<keras::Model> mobilenet_model() {
  using namespace loadstar::keras;
  using namespace loadstar::keras::layers;
  auto input = Input({32, 32, 3});
  auto x = conv_bn_relu6(input, 32, 3, 2);
  for (const auto& [filters, stride] :
       {std::pair<std::size_t, std::size_t>{64, 1}, {128, 2}, {128, 1}, {256, 2}}) {
    x = call(DepthwiseConv2D(3, {.strides = stride, .padding = "same", .use_bias = false}), x);
    x = call(BatchNormalization(), x);
    x = call(ReLU({.max_value = 6.0F}), x);
    x = conv_bn_relu6(x, filters, 1, 1);
  }
  x = call(GlobalAveragePooling2D(), x);
  return std::make_unique<Model>(std::vector{input}, std::vector{call(Dense(10), x)}, "mobilenet");
}

/// Conv2D (`filters`, `size`x`size`, `stride`, "same", no bias) -> BatchNormalization, the resnet
/// workload's convolutions.
inline keras::KerasTensor conv_bn(keras::KerasTensor x, std::size_t filters, std::size_t size,
                                  std::size_t stride) {
  using namespace loadstar::keras;
  using namespace loadstar::keras::layers;
  x = call(Conv2D(filters, size, {.strides = stride, .padding = "same", .use_bias = false}), x);
  return call(BatchNormalization(), x);
}

/// The resnet workload's model (see the file's comment), in the global policy.
inline std::unique_ptr<keras::Model> resnet_model() {
  using namespace loadstar::keras;
  using namespace loadstar::keras::layers;
  auto input = Input({32, 32, 3});
  auto x = call(ReLU(), conv_bn(input, 16, 3, 1));
  std::size_t channels = 16;
  for (const std::size_t filters : {16, 32, 64}) {
    for (std::size_t block = 0; block < resnet_blocks; ++block) {
      const std::size_t stride = block == 0 && filters != channels ? 2 : 1;
      auto y = call(ReLU(), conv_bn(x, filters, 3, stride));
      y = conv_bn(y, filters, 3, 1);
      const auto shortcut = stride == 1 ? x : conv_bn(x, filters, 1, stride);
      x = call(ReLU(), call(Add(), {shortcut, y}));
      channels = filters;
    }
  }
  x = call(GlobalAveragePooling2D(), x);
  return std::make_unique<Model>(std::vector{input}, std::vector{call(Dense(10), x)}, "resnet");
}

/// The grouped workload's model (see the file's comment).
inline std::unique_ptr<keras::Model> grouped_model() {
  using namespace loadstar::keras;
  using namespace loadstar::keras::layers;
  auto input = Input({32, 32, 3});
  auto x = call(Conv2D(32, 3, {.padding = "same", .activation = "relu"}), input);
  x = call(Conv2D(64, 3, {.padding = "same", .groups = 4, .activation = "relu"}), x);
  x = call(Conv2D(64, 3, {.padding = "same", .groups = 8, .activation = "relu"}), x);
  x = call(GlobalAveragePooling2D(), x);
  return std::make_unique<Model>(std::vector{input}, std::vector{call(Dense(10), x)}, "grouped");
}

/// The unet workload's model (see the file's comment).
inline std::unique_ptr<keras::Model> unet_model() {
  using namespace loadstar::keras;
  using namespace loadstar::keras::layers;
  const auto conv_pair = [](KerasTensor x, std::size_t filters) {
    x = call(Conv2D(filters, 3, {.padding = "same", .activation = "relu"}), x);
    return call(Conv2D(filters, 3, {.padding = "same", .activation = "relu"}), x);
  };
  const auto up = [&](KerasTensor x, const KerasTensor& skip, std::size_t filters) {
    x = call(Conv2DTranspose(filters, 2, {.strides = 2}), x);
    return conv_pair(call(Concatenate(), std::vector{x, skip}), filters);
  };
  auto input = Input({32, 32, 3});
  const auto level1 = conv_pair(input, 8);                          // 32x32x8
  const auto level2 = conv_pair(call(MaxPooling2D(), level1), 16);  // 16x16x16
  const auto bottom = conv_pair(call(MaxPooling2D(), level2), 32);  // 8x8x32
  const auto x = up(up(bottom, level2, 16), level1, 8);             // 32x32x8
  return std::make_unique<Model>(std::vector{input}, std::vector{call(Conv2D(1, 1), x)}, "unet");
}

/// The workload's model with its layers in the dtype policy `policy` ("float32",
/// "mixed_bfloat16", "mixed_float16"), compiled with Adam(1e-3) and cross-entropy from logits
/// on `backend` (the CPU backend with `threads` threads when null); under "mixed_float16"
/// compile wraps Adam in a LossScaleOptimizer, as Keras does.
inline std::unique_ptr<keras::Model> make_model(const std::string& workload, std::size_t threads,
                                                std::shared_ptr<keras::Backend> backend = nullptr,
                                                const std::string& policy = "float32") {
  using namespace loadstar::keras;
  using namespace loadstar::keras::layers;
  set_random_seed(1);
  const mixed_precision::PolicyScope scope(policy);
  const auto compile = [&](auto model) {
    model->compile({.optimizer = optimizers::Adam({.learning_rate = 1e-3}),
                    .loss = losses::SparseCategoricalCrossentropy(true),
                    .threads = threads,
                    .backend = std::move(backend)});
    return model;
  };
  if (color_images(workload)) {
    auto model = workload == "unet"      ? unet_model()
                 : workload == "resnet"  ? resnet_model()
                 : workload == "grouped" ? grouped_model()
                                         : mobilenet_model();
    const LossArg loss =
        workload == "unet" ? LossArg(std::make_shared<losses::BinaryCrossentropy>(true))
                           : LossArg(std::make_shared<losses::SparseCategoricalCrossentropy>(true));
    model->compile({.optimizer = optimizers::Adam({.learning_rate = 1e-3}),
                    .loss = loss,
                    .threads = threads,
                    .backend = std::move(backend)});
    return model;
  }
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
  } else if (workload == "bilstm") {
    model = std::make_unique<Sequential>(std::initializer_list<SequentialItem>{
        Input({text_steps}), Embedding(1000, 32), Bidirectional(LSTM(64)), Dense(10)});
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
/// [0, 1000) for the `token_inputs` workloads) from a fixed linear congruential sequence, labels
/// `i % 10` (unused by "unet", which trains on `synthetic_masks`).
inline std::pair<Tensor<float>, Tensor<std::int64_t>> synthetic_data(const std::string& workload,
                                                                     std::size_t rows) {
  const bool text = token_inputs(workload);
  Tensor<float> x(text                     ? Shape{rows, text_steps}
                  : color_images(workload) ? Shape{rows, 32, 32, 3}
                                           : Shape{rows, 28, 28});
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

/// The unet workload's targets for images `x` `(rows, 32, 32, 3)`: 1 where a pixel's first
/// channel exceeds 0.5, else 0, as `(rows, 32, 32, 1)`.
inline Tensor<float> synthetic_masks(const Tensor<float>& x) {
  const Shape& shape = x.shape();
  Tensor<float> mask({shape[0], shape[1], shape[2], 1});
  for (std::size_t i = 0; i < mask.size(); ++i)
    mask.data()[i] = x.data()[i * shape[3]] > 0.5F ? 1.0F : 0.0F;
  return mask;
}

/// One pass of fit over the workload's synthetic data (`masks`: "unet"'s targets).
template <class X, class Labels, class Masks>
void fit_pass(keras::Model& model, const std::string& workload, const X& x, const Labels& labels,
              const Masks& masks, const keras::FitOptions& options) {
  if (workload == "unet") {
    model.fit(x, masks, options);
  } else {
    model.fit(x, labels, options);
  }
}

}  // namespace loadstar::bench

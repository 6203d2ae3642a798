// Images of unknown height and width, as Keras's fully convolutional models take them
// (`Input(shape=(None, None, 3))`, the default input of keras.applications without its top): the
// 2-D convolution family, pooling and up-sampling settle their shapes per batch, against PyTorch
// (tests/keras/generate_unknown_spatial.py).
#include <doctest/doctest.h>

#include <loadstar/keras.hpp>
#include <loadstar/keras/backend/cpu_backend.hpp>
#include <sstream>
#include <string>

#include "keras/layer_cases.hpp"
#include "keras/unknown_spatial_cases.hpp"
#include "temp_dir.hpp"

using namespace loadstar;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;

TEST_SUITE("keras") {
  TEST_CASE("A fully convolutional model trains on images of any size as PyTorch computes it") {
    auto model = unknown_spatial_cases::fully_convolutional();
    CHECK(model->outputs()[0].shape() == Shape{none, none, 1});
    std::ostringstream summary;
    model->summary(summary);
    CHECK_MESSAGE(summary.str().find("[(None, None, None,") != std::string::npos, summary.str());
    unknown_spatial_cases::check_training(*model);
    // Saved and loaded in both formats, it predicts the same at any size.
    test_support::TempDir dir;
    const Tensor<float> x = layer_cases::tensor_of(
        unknown_spatial_cases::reference()["predict_x"],
        layer_cases::shape_of(unknown_spatial_cases::reference()["predict_shape"]));
    for (const char* file : {"fcn.h5", "fcn.keras"}) {
      INFO(file);
      model->save(dir / file);
      auto copy = load_model(dir / file);
      CHECK(copy->inputs()[0].shape() == Shape{none, none, 3});
      CHECK(layer_cases::same_bits(copy->predict(x, {.verbose = 0}),
                                   model->predict(x, {.verbose = 0})));
    }
  }

  TEST_CASE("Resizing and CenterCrop take images of any size, as when the size is known") {
    for (const bool crop : {false, true}) {
      const std::string kind = crop ? "CenterCrop" : "Resizing";
      INFO(kind);
      const auto layer = [crop]() -> LayerArg {
        if (crop) return CenterCrop(3, 4, "box");
        return Resizing(3, 4,
                        {.interpolation = "bicubic", .crop_to_aspect_ratio = true, .name = "box"});
      };
      auto any = Input(Shape{none, none, 2}, "any");
      Model model(std::vector{any}, std::vector{call(layer(), any)}, "any_size");
      CHECK(model.outputs()[0].shape() == Shape{3, 4, 2});
      for (const Shape& shape : {Shape{2, 7, 5, 2}, Shape{2, 4, 9, 2}}) {
        INFO(shape.str());
        Tensor<float> x(shape);
        for (std::size_t i = 0; i < x.size(); ++i)
          x.data()[i] = static_cast<float>((i * 13) % 17) / 4.0F;
        auto fixed = Input(shape.row_shape(), "fixed");
        Model known(std::vector{fixed}, std::vector{call(layer(), fixed)}, "known_size");
        CHECK(layer_cases::same_bits(model.predict(x, {.verbose = 0}),
                                     known.predict(x, {.verbose = 0})));
      }
    }
  }

  TEST_CASE("Normalization and SpatialDropout2D take images of any size, channels known") {
    const auto image_batch = [](const Shape& shape, std::size_t salt) {
      Tensor<float> x(shape);
      for (std::size_t i = 0; i < x.size(); ++i)
        x.data()[i] = static_cast<float>((i * 7 + salt) % 19) / 3.0F - 2.0F;
      return x;
    };
    // Adapted on images of one size, it normalizes images of any size per channel.
    auto adapted = std::make_shared<Normalization>(NormalizationOptions{.name = "norm"});
    adapted->adapt(image_batch(Shape{4, 5, 6, 3}, 1));
    auto any = Input(Shape{none, none, 3}, "any");
    Model model(std::vector{any}, std::vector{call(adapted, any)}, "normalized");
    auto fixed_norm = std::make_shared<Normalization>(NormalizationOptions{.name = "fixed"});
    for (const Shape& shape : {Shape{2, 3, 7, 3}, Shape{1, 8, 2, 3}}) {
      INFO(shape.str());
      const Tensor<float> x = image_batch(shape, 5);
      const Tensor<float> y = model.predict(x, {.verbose = 0});
      const auto mean = adapted->weights()[0].value, variance = adapted->weights()[1].value;
      for (std::size_t i = 0; i < x.size(); ++i) {
        const std::size_t c = i % 3;
        const float expected = (x.data()[i] - mean.data()[c]) / std::sqrt(variance.data()[c]);
        REQUIRE(y.data()[i] == doctest::Approx(expected).epsilon(1e-5));
      }
    }
    auto unknown_channels = Input(Shape{4, none}, "unknown_channels");
    CHECK_THROWS_WITH_AS(call(Normalization({.name = "n"}), unknown_channels),
                         "normalization layer 'n': the kept axes must have known lengths but the "
                         "input is (None, 4, None)",
                         ShapeError);
    // Whole channels dropped over each batch's own size, as for a layer built for that size.
    CpuBackend backend(1);
    const Tensor<float> x = image_batch(Shape{2, 3, 4, 5}, 2);
    SpatialDropout2D any_size(0.5, {.seed = 7, .name = "drop"});
    SpatialDropout2D known(0.5, {.seed = 7, .name = "drop"});
    const Shape unknown_shape[] = {Shape{none, none, 5}}, known_shape[] = {Shape{3, 4, 5}};
    any_size.set_built({unknown_shape[0]}, any_size.build(unknown_shape, 0));
    known.set_built({known_shape[0]}, known.build(known_shape, 0));
    Tensor<float> a(x.shape()), b(x.shape());
    const CallContext training{.backend = backend, .training = true, .seed = 3, .step = 1};
    any_size.forward(std::span(&x, 1), a, training);
    known.forward(std::span(&x, 1), b, training);
    CHECK(layer_cases::same_bits(a, b));
    for (std::size_t sample = 0; sample < 2; ++sample) {
      for (std::size_t c = 0; c < 5; ++c) {
        std::size_t kept = 0, dropped = 0;
        for (std::size_t p = 0; p < 12; ++p) {
          const std::size_t i = (sample * 12 + p) * 5 + c;
          kept += a.data()[i] == 2.0F * x.data()[i] ? 1 : 0;
          dropped += a.data()[i] == 0.0F ? 1 : 0;
        }
        CHECK((kept == 12 || dropped == 12));
      }
    }
  }

  TEST_CASE("Reshape and Flatten take unknown lengths; a layer built for them takes known ones") {
    const auto batch = [](const Shape& shape) {
      Tensor<float> x(shape);
      for (std::size_t i = 0; i < x.size(); ++i)
        x.data()[i] = static_cast<float>(i % 23) - 11.0F;
      return x;
    };
    auto image = Input(Shape{none, none, 4}, "image");
    auto patches = call(Reshape({-1, 4}, {.name = "patches"}), image);
    CHECK(patches.shape() == Shape{none, 4});
    Model reshaped(std::vector{image}, std::vector{patches}, "reshaped");
    const Tensor<float> x = batch(Shape{2, 3, 5, 4});
    const Tensor<float> y = reshaped.predict(x, {.verbose = 0});
    CHECK(y.shape() == Shape{2, 15, 4});
    CHECK(layer_cases::same_bits(y.reshape(x.shape()), x));
    for (const char* format : {"channels_last", "channels_first"}) {
      INFO(format);
      auto steps = Input(Shape{3, none}, "steps");
      Model flat(std::vector{steps},
                 std::vector{call(Flatten({.data_format = format, .name = "flat"}), steps)},
                 "flat");
      CHECK(flat.outputs()[0].shape() == Shape{none});
      auto fixed = Input(Shape{3, 5}, "fixed");
      Model known(std::vector{fixed},
                  std::vector{call(Flatten({.data_format = format, .name = "flat"}), fixed)},
                  "known");
      const Tensor<float> s = batch(Shape{2, 3, 5});
      CHECK(layer_cases::same_bits(flat.predict(s, {.verbose = 0}),
                                   known.predict(s, {.verbose = 0})));
    }
    // Inside TimeDistributed, each step flattened over the batch's own length.
    auto frames = Input(Shape{none, none, 4}, "frames");
    Model per_step(std::vector{frames},
                   std::vector{call(TimeDistributed(std::make_shared<Flatten>()), frames)},
                   "per_step");
    CHECK(per_step.outputs()[0].shape() == Shape{none, none});
    const Tensor<float> clip = batch(Shape{2, 3, 5, 4});
    const Tensor<float> flattened = per_step.predict(clip, {.verbose = 0});
    CHECK(flattened.shape() == Shape{2, 3, 20});
    CHECK(layer_cases::same_bits(flattened.reshape(clip.shape()), clip));
    auto sequence = Input(Shape{none, 4}, "sequence");
    CHECK_THROWS_WITH_AS(call(Reshape({4, 2}, {.name = "r"}), sequence),
                         "reshape layer 'r': target_shape (4, 2) has no -1 to take the unknown "
                         "length of inputs of shape (None, None, 4)",
                         ShapeError);
    // A convolution built for images of any size, called again on images of a known size.
    auto conv = std::make_shared<Conv2D>(2, 3, Conv2DOptions{.padding = "same", .name = "shared"});
    auto any = Input(Shape{none, none, 3}, "any");
    Model any_size(std::vector{any}, std::vector{call(conv, any)}, "any_size");
    auto six = Input(Shape{6, 6, 3}, "six");
    auto known = call(conv, six);
    CHECK(known.shape() == Shape{6, 6, 2});
    Model six_size(std::vector{six}, std::vector{known}, "six_size");
    const Tensor<float> images = batch(Shape{2, 6, 6, 3});
    CHECK(layer_cases::same_bits(six_size.predict(images, {.verbose = 0}),
                                 any_size.predict(images, {.verbose = 0})));
    CHECK_THROWS_WITH_AS(call(conv, Input(Shape{6, 6, 2}, "two")),
                         "conv2d layer 'shared': was built for inputs of shape (None, None, 3) but "
                         "is called on inputs of shape (6, 6, 2)",
                         ShapeError);
  }

  TEST_CASE("GroupNormalization and UnitNormalization train on images of any size") {
    // The same bits as the layers built for the batch's size, predicting and training.
    for (const bool group : {true, false}) {
      const std::string kind = group ? "GroupNormalization" : "UnitNormalization";
      INFO(kind);
      const auto make = [group](const Shape& sample) {
        auto image = Input(sample, "image");
        KerasTensor h = call(Conv2D(4, 3, {.padding = "same", .name = "conv"}), image);
        h = group ? call(GroupNormalization({.groups = 2, .name = "norm"}), h)
                  : call(UnitNormalization({.axis = {1, 2}, .name = "norm"}), h);
        auto model = std::make_shared<Model>(
            std::vector{image}, std::vector{call(Conv2D(1, 1, {.name = "out"}), h)}, "normalized");
        model->compile({.optimizer = optimizers::SGD(optimizers::SGDOptions{.learning_rate = 0.1}),
                        .loss = "mse"});
        return model;
      };
      auto any = make(Shape{none, none, 3});
      for (const Shape& shape : {Shape{2, 5, 4, 3}, Shape{2, 3, 6, 3}}) {
        INFO(shape.str());
        auto known = make(shape.row_shape());
        known->set_weights(any->get_weights());
        Tensor<float> x(shape), y(Shape{shape[0], shape[1], shape[2], 1});
        for (std::size_t i = 0; i < x.size(); ++i)
          x.data()[i] = static_cast<float>((i * 5) % 13) / 6.0F - 1.0F;
        for (std::size_t i = 0; i < y.size(); ++i)
          y.data()[i] = static_cast<float>(i % 3) - 1.0F;
        CHECK(layer_cases::same_bits(any->predict(x, {.verbose = 0}),
                                     known->predict(x, {.verbose = 0})));
        CHECK(any->train_on_batch(x, y).get("loss").value() ==
              known->train_on_batch(x, y).get("loss").value());
        const auto a = any->get_weights(), b = known->get_weights();
        for (std::size_t i = 0; i < a.size(); ++i)
          CHECK(layer_cases::same_bits(a[i], b[i]));
      }
    }
    CHECK_THROWS_WITH_AS(
        call(GroupNormalization({.groups = 2, .name = "g"}), Input(Shape{4, 4, none})),
        "group_normalization layer 'g': the channels axis must have a known length but the input "
        "is (None, 4, 4, None)",
        ShapeError);
  }

  TEST_CASE("The 3-D convolutions and poolings train on volumes of any size") {
    // The same bits as the layers built for the batch's size, predicting and training.
    const auto make = [](const Shape& sample) {
      set_random_seed(23);
      auto clip = Input(sample, "clip");
      auto h =
          call(Conv3D(3, {3, 3, 3}, {.padding = "same", .activation = "relu", .name = "c"}), clip);
      h = call(MaxPooling3D({.pool_size = {2, 2, 2}, .name = "p"}), h);
      h = call(
          Conv3DTranspose(2, {3, 3, 3}, {.strides = {2, 2, 2}, .padding = "same", .name = "t"}), h);
      h = call(AveragePooling3D({.pool_size = {1, 2, 2}, .padding = "same", .name = "a"}), h);
      auto model = std::make_shared<Model>(
          std::vector{clip}, std::vector{call(Conv3D(1, {1, 1, 1}, {.name = "out"}), h)}, "volume");
      model->compile({.optimizer = optimizers::SGD(optimizers::SGDOptions{.learning_rate = 0.1}),
                      .loss = "mse"});
      return model;
    };
    auto any = make(Shape{none, none, none, 2});
    CHECK(any->outputs()[0].shape() == Shape{none, none, none, 1});
    for (const Shape& shape : {Shape{2, 4, 6, 4, 2}, Shape{1, 2, 4, 8, 2}}) {
      INFO(shape.str());
      auto known = make(shape.row_shape());
      known->set_weights(any->get_weights());
      Tensor<float> x(shape);
      for (std::size_t i = 0; i < x.size(); ++i)
        x.data()[i] = static_cast<float>((i * 5) % 17) / 8.0F - 1.0F;
      const Tensor<float> predicted = known->predict(x, {.verbose = 0});
      CHECK(layer_cases::same_bits(any->predict(x, {.verbose = 0}), predicted));
      Tensor<float> y(predicted.shape());
      for (std::size_t i = 0; i < y.size(); ++i)
        y.data()[i] = static_cast<float>(i % 3) - 1.0F;
      CHECK(any->train_on_batch(x, y).get("loss").value() ==
            known->train_on_batch(x, y).get("loss").value());
      const auto a = any->get_weights(), b = known->get_weights();
      for (std::size_t i = 0; i < a.size(); ++i)
        CHECK(layer_cases::same_bits(a[i], b[i]));
    }
  }

  TEST_CASE("Unknown image sizes are refused where a layer cannot take them, naming it") {
    auto image = Input(Shape{none, none, 3}, "image");
    // A known length that a kernel does not fit, in a batch.
    auto valid = call(Conv2D(2, 3, {.name = "valid"}), image);
    Model model(std::vector{image}, std::vector{valid}, "valid_conv");
    CHECK_THROWS_WITH_AS(model.predict(Tensor<float>(Shape{1, 2, 5, 3}), {.verbose = 0}),
                         doctest::Contains("conv2d layer 'valid': a 3x3 kernel does not fit inputs "
                                           "of shape (2, 5, 3) with valid padding"),
                         ShapeError);
    // The channels must be known.
    auto channels = Input(Shape{4, 4, none}, "channels");
    CHECK_THROWS_WITH_AS(call(Conv2D(2, 3, {.name = "c"}), channels),
                         "conv2d layer 'c': the channels axis must have a known length but the "
                         "input is (None, 4, 4, None)",
                         ShapeError);
    CHECK_THROWS_WITH_AS(
        call(DepthwiseConv2D(3, {.name = "d"}), channels),
        "depthwise_conv2d layer 'd': the channels axis must have a known length but the input is "
        "(None, 4, 4, None)",
        ShapeError);
    CHECK_THROWS_WITH_AS(
        call(Conv2DTranspose(2, 3, {.name = "t"}), channels),
        "conv2d_transpose layer 't': the channels axis must have a known length but the input is "
        "(None, 4, 4, None)",
        ShapeError);
    CHECK_THROWS_WITH_AS(call(SpatialDropout2D(0.5, {.name = "s"}), channels),
                         "spatial_dropout2d layer 's': the channels axis must have a known length "
                         "but the input is (None, 4, 4, None)",
                         ShapeError);
    auto volume = Input(Shape{2, 2, 2, none}, "volume");
    CHECK_THROWS_WITH_AS(call(Conv3D(2, {1, 1, 1}, {.name = "c3"}), volume),
                         "conv3d layer 'c3': the channels axis must have a known length but the "
                         "input is (None, 2, 2, 2, None)",
                         ShapeError);
    CHECK_THROWS_WITH_AS(call(MaxPooling3D({.name = "p3"}), volume),
                         "max_pooling3d layer 'p3': the channels axis must have a known length but "
                         "the input is (None, 2, 2, 2, None)",
                         ShapeError);
  }
}

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <loadstar/error.hpp>
#include <loadstar/keras/backend/cpu_backend.hpp>
#include <loadstar/keras/layers.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "keras/layer_cases.hpp"

using loadstar::ConfigError;
using loadstar::Shape;
using loadstar::ShapeError;
using loadstar::Tensor;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;

namespace {

const nlohmann::json& reference() {
  static const nlohmann::json data = layer_cases::load("layers.json");
  return data;
}

/// Runs one reference case through CpuBackend(threads) and checks every target.
void run_case(const nlohmann::json& c, std::size_t threads) {
  CpuBackend backend(threads);
  layer_cases::run_case(c, backend);
}

std::vector<float> run_conv_dense(std::size_t threads) {
  CpuBackend backend(threads);
  Conv2D conv(8, 3, {.padding = "same", .activation = "relu", .name = "c"});
  Dense dense(5, {.activation = "softmax", .name = "d"});
  const Shape in[] = {Shape{12, 12, 3}};
  const Shape flat[] = {Shape{12 * 12 * 8}};
  conv.build(in, 1);
  dense.build(flat, 2);
  Tensor<float> x({64, 12, 12, 3});
  Initializer::random_normal(0.0, 1.0, 3).fill(x, 0);
  Tensor<float> h({64, 12, 12, 8}), y({64, 5}), dy({64, 5}, 0.25F), dh({64, 12, 12, 8}),
      dx({64, 12, 12, 3});
  const CallContext ctx{.backend = backend, .training = true};
  conv.forward(std::span(&x, 1), h, ctx);
  const Tensor<float> h_flat = h.reshape({64, 12 * 12 * 8});
  dense.forward(std::span(&h_flat, 1), y, ctx);
  const Tensor<float> dh_flat = dh.reshape({64, 12 * 12 * 8});
  dense.backward(std::span(&h_flat, 1), y, dy, std::span(&dh_flat, 1), ctx);
  conv.backward(std::span(&x, 1), h, dh, std::span(&dx, 1), ctx);
  std::vector<float> all(y.begin(), y.end());
  all.insert(all.end(), dx.begin(), dx.end());
  for (const auto* layer : {static_cast<const Layer*>(&conv), static_cast<const Layer*>(&dense)})
    for (const auto& w : layer->weights())
      all.insert(all.end(), w.gradient.begin(), w.gradient.end());
  return all;
}

}  // namespace

TEST_SUITE("keras_layers") {
  TEST_CASE("Layers match the PyTorch reference values with one thread") {
    for (const auto& c : reference()["cases"])
      run_case(c, 1);
  }

  TEST_CASE("Layers match the PyTorch reference values with three threads") {
    for (const auto& c : reference()["cases"])
      run_case(c, 3);
  }

  TEST_CASE("CpuBackend is bitwise deterministic for a thread count and close across counts") {
    const auto one = run_conv_dense(1);
    CHECK(one == run_conv_dense(1));
    const auto two = run_conv_dense(2);
    CHECK(two == run_conv_dense(2));
    REQUIRE(one.size() == two.size());
    for (std::size_t i = 0; i < one.size(); ++i) {
      if (std::abs(one[i] - two[i]) > 1e-5F + 1e-4F * std::abs(one[i])) {
        FAIL_CHECK("index " << i << " is " << two[i] << " with two threads but " << one[i]
                            << " with one");
        break;
      }
    }
    CHECK_THROWS_WITH_AS(CpuBackend(0), doctest::Contains("thread count must be at least 1"),
                         ConfigError);
  }

  TEST_CASE("Layers keep Keras's weight names and order") {
    BatchNormalization bn({.name = "bn"});
    const Shape in[] = {Shape{4}};
    bn.build(in, 1);
    std::vector<std::string> names;
    for (const auto& w : bn.weights())
      names.push_back(w.name + (w.trainable ? "" : "*"));
    CHECK(names == std::vector<std::string>{"gamma", "beta", "moving_mean*", "moving_variance*"});
    Embedding embedding(10, 3, {.name = "e"});
    const Shape ein[] = {Shape{5}};
    CHECK(embedding.build(ein, 1) == Shape{5, 3});
    CHECK(embedding.weights()[0].name == "embeddings");
    Conv2D conv(4, {3, 2}, {.use_bias = false, .name = "c"});
    const Shape cin[] = {Shape{6, 6, 2}};
    conv.build(cin, 1);
    REQUIRE(conv.weights().size() == 1);
    CHECK(conv.weights()[0].value.shape() == Shape{3, 2, 2, 4});
  }

  TEST_CASE("Dropout drops at its rate scales by the inverse keep rate and is reproducible") {
    CpuBackend backend(2);
    Dropout dropout(0.3, {.name = "drop"});
    const Shape in[] = {Shape{1000}};
    dropout.build(in, 0);
    const Tensor<float> x({100, 1000}, 1.0F);
    Tensor<float> y({100, 1000}), again({100, 1000}), other({100, 1000});
    dropout.forward(std::span(&x, 1), y,
                    {.backend = backend, .training = true, .seed = 5, .step = 3});
    std::size_t kept = 0;
    bool scaled = true;
    for (float v : y) {
      kept += v != 0.0F;
      scaled = scaled && (v == 0.0F || std::abs(v - 1.0F / 0.7F) < 1e-6F);
    }
    CHECK(scaled);
    CHECK(static_cast<double>(kept) / 100000.0 == doctest::Approx(0.7).epsilon(0.01));
    dropout.forward(std::span(&x, 1), again,
                    {.backend = backend, .training = true, .seed = 5, .step = 3});
    CHECK(y == again);
    dropout.forward(std::span(&x, 1), other,
                    {.backend = backend, .training = true, .seed = 5, .step = 4});
    CHECK_FALSE(y == other);
    // The gradient goes through the same mask.
    Tensor<float> dx({100, 1000});
    dropout.backward(std::span(&x, 1), y, x, std::span(&dx, 1),
                     {.backend = backend, .training = true, .seed = 5, .step = 3});
    CHECK(dx == y);
    dropout.forward(std::span(&x, 1), other, {.backend = backend, .training = false});
    CHECK(other == x);
    CHECK_THROWS_WITH_AS(Dropout(1.0, {.name = "d"}),
                         doctest::Contains("dropout layer 'd': rate must be in [0, 1)"),
                         ConfigError);
  }

  TEST_CASE("Initializer statistics follow Keras's fans and limits") {
    Tensor<float> kernel({300, 200});
    Initializer::glorot_uniform().fill(kernel, 11);
    const double limit = std::sqrt(6.0 / 500.0);
    double sum = 0, squares = 0, top = 0;
    for (float v : kernel) {
      sum += v;
      squares += double(v) * v;
      top = std::max(top, std::abs(double(v)));
    }
    const double n = double(kernel.size());
    CHECK(top <= limit);
    CHECK(top > 0.99 * limit);
    CHECK(std::abs(sum / n) < 2e-3);
    CHECK(squares / n == doctest::Approx(limit * limit / 3).epsilon(0.02));

    Tensor<float> conv_kernel({3, 3, 16, 32});
    Initializer::he_normal().fill(conv_kernel, 12);
    CHECK(compute_fans(conv_kernel.shape()) == std::pair<double, double>{144.0, 288.0});
    double he_squares = 0, he_top = 0;
    for (float v : conv_kernel) {
      he_squares += double(v) * v;
      he_top = std::max(he_top, std::abs(double(v)));
    }
    const double stddev = std::sqrt(2.0 / 144.0);
    // Truncated at two (untruncated) standard deviations: the variance is 2 / fan_in.
    CHECK(he_squares / double(conv_kernel.size()) ==
          doctest::Approx(stddev * stddev).epsilon(0.05));
    CHECK(he_top <= 2.0 * stddev / 0.87962566103423978 + 1e-6);

    Tensor<float> a({50}), b({50});
    Initializer::random_uniform().fill(a, 3);
    Initializer::random_uniform().fill(b, 3);
    CHECK(a == b);
    for (float v : a)
      CHECK((v >= -0.05F && v <= 0.05F));
    Initializer("ones").fill(a, 0);
    CHECK(a == Tensor<float>({50}, 1.0F));
    Initializer::constant(2.5).fill(a, 0);
    CHECK(a.data()[7] == 2.5F);
    CHECK(Initializer("glorot_uniform").to_json() ==
          nlohmann::json::parse(R"({"class_name": "GlorotUniform", "config": {"seed": null}})"));
    CHECK(Initializer::from_json(Initializer::random_normal(1.0, 2.0, 9).to_json()).to_json() ==
          Initializer::random_normal(1.0, 2.0, 9).to_json());
    CHECK_THROWS_WITH_AS(Initializer("glorot"),
                         doctest::Contains("unknown initializer 'glorot'; known: zeros"),
                         ConfigError);
  }

  TEST_CASE("activation_from_name resolves every Keras name and rejects others") {
    for (const char* name :
         {"linear",      "relu",        "sigmoid",     "tanh",        "softmax",    "elu",
          "selu",        "softplus",    "softsign",    "gelu",        "swish",      "hard_sigmoid",
          "exponential", "relu6",       "leaky_relu",  "mish",        "hard_silu",  "log_sigmoid",
          "hard_tanh",   "tanh_shrink", "soft_shrink", "hard_shrink", "squareplus", "sparse_plus"})
      CHECK(activation_name(activation_from_name(name)) == name);
    // Keras's other names: Keras 3 saves swish as silu.
    CHECK(activation_from_name("silu") == activation_from_name("swish"));
    CHECK(activation_from_name("hard_swish") == activation_from_name("hard_silu"));
    CHECK(activation_from_name("celu") == activation_from_name("elu"));
    CHECK_THROWS_WITH_AS(
        activation_from_name("rleu"),
        doctest::Contains("unknown activation 'rleu'; known: linear, relu, sigmoid"), ConfigError);
  }

  TEST_CASE("LayerRegistry creates every built-in layer and round-trips its config") {
    auto& registry = LayerRegistry::instance();
    const std::vector<std::pair<std::string, nlohmann::json>> layers = {
        {"Dense", {{"units", 4}, {"activation", "relu"}}},
        {"Conv2D", {{"filters", 2}, {"kernel_size", {3, 3}}, {"padding", "same"}}},
        {"MaxPooling2D", {{"pool_size", {2, 2}}}},
        {"AveragePooling2D", {{"pool_size", {2, 2}}, {"padding", "same"}}},
        {"GlobalAveragePooling2D", nlohmann::json::object()},
        {"GlobalMaxPooling2D", nlohmann::json::object()},
        {"BatchNormalization", {{"momentum", 0.9}}},
        {"Dropout", {{"rate", 0.25}}},
        {"Flatten", nlohmann::json::object()},
        {"Reshape", {{"target_shape", {-1}}}},
        {"Activation", {{"activation", "tanh"}}},
        {"ReLU", {{"max_value", 6.0}}},
        {"LeakyReLU", {{"alpha", 0.2}}},
        {"Softmax", {{"axis", -1}}},
        {"Embedding", {{"input_dim", 10}, {"output_dim", 3}}},
        {"Concatenate", {{"axis", -1}}},
        {"Add", nlohmann::json::object()},
        {"InputLayer", {{"batch_input_shape", {nullptr, 4, 4, 2}}}},
    };
    for (const auto& entry : layers) {
      const std::string& class_name = entry.first;  // not a structured binding: INFO captures it
      const auto& config = entry.second;
      INFO(class_name);
      auto layer = registry.create(class_name, config);
      CHECK(layer->class_name() == class_name);
      const auto full = layer->get_config();
      CHECK(registry.create(class_name, full)->get_config() == full);
    }
    CHECK(registry.create("Dense", {{"units", 3}})->get_config()["kernel_initializer"] ==
          nlohmann::json::parse(R"({"class_name": "GlorotUniform", "config": {"seed": null}})"));
    CHECK_THROWS_WITH_AS(registry.create("Dense2", {}),
                         doctest::Contains("unknown layer class 'Dense2'"), ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("Dense", {{"name", "x"}}),
                         doctest::Contains("layer 'x' (Dense): config.units: expected a positive "
                                           "integer but found nothing"),
                         ConfigError);
    registry.add("MyFlatten", [](const nlohmann::json& config) -> std::shared_ptr<Layer> {
      return std::make_shared<Flatten>(FlattenOptions{.name = config.value("name", "")});
    });
    CHECK(registry.create("MyFlatten", {{"name", "mine"}})->name() == "mine");
  }

  TEST_CASE("Layers name themselves and both shapes on wrong inputs") {
    Dense dense(10, {.name = "fc1"});
    const Shape a[] = {Shape{784}};
    dense.build(a, 0);
    const Shape b[] = {Shape{512}};
    CHECK_THROWS_WITH_AS(dense.build(b, 0),
                         doctest::Contains("dense layer 'fc1': kernel is 784x10 but the input has "
                                           "512 features"),
                         ShapeError);
    CpuBackend backend;
    const Tensor<float> x({2, 512});
    Tensor<float> y({2, 10});
    CHECK_THROWS_WITH_AS(dense.forward(std::span(&x, 1), y, {.backend = backend}),
                         doctest::Contains("dense layer 'fc1': expects inputs of shape (None, 784) "
                                           "but got (2, 512)"),
                         ShapeError);
    Conv2D conv(2, 3, {.name = "c1"});
    const Shape flat[] = {Shape{28, 28}};
    CHECK_THROWS_WITH_AS(conv.build(flat, 0),
                         doctest::Contains("conv2d layer 'c1': expects rank-3 inputs (without the "
                                           "batch axis) but got (28, 28)"),
                         ShapeError);
    const Shape tiny[] = {Shape{2, 2, 1}};
    CHECK_THROWS_WITH_AS(conv.build(tiny, 0),
                         doctest::Contains("a 3x3 kernel does not fit inputs of shape (2, 2, 1)"),
                         ShapeError);
    Concatenate concat({.name = "cat"});
    const Shape mismatched[] = {Shape{2, 3}, Shape{4, 3}};
    CHECK_THROWS_WITH_AS(
        concat.build(mismatched, 0),
        doctest::Contains("concatenate layer 'cat': inputs must match except along "
                          "axis -1 but got shapes (None, 2, 3) and (None, 4, 3)"),
        ShapeError);
    Add add({.name = "sum"});
    const Shape different[] = {Shape{3}, Shape{4}};
    CHECK_THROWS_WITH_AS(
        add.build(different, 0),
        doctest::Contains("add layer 'sum': inputs must have the same shape but got "
                          "(None, 3) and (None, 4)"),
        ShapeError);
    Reshape reshape({4, 4}, {.name = "r"});
    const Shape ten[] = {Shape{10}};
    CHECK_THROWS_WITH_AS(
        reshape.build(ten, 0),
        doctest::Contains("reshape layer 'r': cannot reshape inputs of shape (10,) "
                          "to target_shape (4, 4)"),
        ShapeError);
    CHECK_THROWS_WITH_AS(Conv2D(2, 3, {.padding = "full", .name = "c2"}),
                         doctest::Contains("conv2d layer 'c2': padding must be 'valid' or 'same' "
                                           "but is 'full'"),
                         ConfigError);
  }

  TEST_CASE("Embedding rejects indices outside input_dim naming the layer") {
    CpuBackend backend;
    Embedding embedding(5, 2, {.name = "words"});
    const Shape in[] = {Shape{3}};
    embedding.build(in, 0);
    Tensor<float> y({2, 3, 2});
    for (float bad : {5.0F, -1.0F, 12.0F}) {
      const Tensor<float> x({2, 3}, {0, 1, 2, 3, bad, 4});
      CHECK_THROWS_WITH_AS(
          embedding.forward(std::span(&x, 1), y, {.backend = backend}),
          doctest::Contains(doctest::String(
              ("embedding layer 'words': index " + std::to_string(static_cast<long long>(bad)) +
               " at position 4 is outside [0, input_dim) with input_dim 5")
                  .c_str())),
          ConfigError);
    }
  }
}

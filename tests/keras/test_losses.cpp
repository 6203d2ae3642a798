#include <doctest/doctest.h>

#include "reference_values.hpp"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <loadstar/error.hpp>
#include <loadstar/keras/losses.hpp>
#include <loadstar/tensor.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

using loadstar::ConfigError;
using loadstar::Shape;
using loadstar::ShapeError;
using loadstar::Tensor;
using loadstar::keras::get_loss;
using loadstar::keras::Loss;
namespace losses = loadstar::keras::losses;

using reference_values::check_close;
using reference_values::reference;
using reference_values::tensor_of;

namespace {

std::unique_ptr<Loss> make_loss(const nlohmann::json& c) {
  const std::string kind = c["loss"];
  const auto& args = c["args"];
  const bool from_logits = args.value("from_logits", false);
  const double smoothing = args.value("label_smoothing", 0.0);
  if (kind == "mse") return std::make_unique<losses::MeanSquaredError>();
  if (kind == "mae") return std::make_unique<losses::MeanAbsoluteError>();
  if (kind == "huber") return std::make_unique<losses::Huber>(args.value("delta", 1.0));
  if (kind == "hinge") return std::make_unique<losses::Hinge>();
  // The further losses through the registry, by Keras's function names.
  for (const char* name : {"squared_hinge", "categorical_hinge", "mape", "msle", "log_cosh",
                           "poisson", "cosine_similarity"}) {
    if (kind == name) return loadstar::keras::get_loss(name);
  }
  if (kind == "kld") return std::make_unique<losses::KLDivergence>();
  if (kind == "bce") return std::make_unique<losses::BinaryCrossentropy>(from_logits, smoothing);
  if (kind == "cce") {
    return std::make_unique<losses::CategoricalCrossentropy>(from_logits, smoothing);
  }
  return std::make_unique<losses::SparseCategoricalCrossentropy>(from_logits);
}

}  // namespace

TEST_SUITE("keras") {
  TEST_CASE("Loss values and gradients match the PyTorch reference") {
    // Float32 inputs and outputs, float64 accumulation: 1e-6 absolute plus 1e-5 relative.
    for (const auto& c : reference()["losses"]) {
      const std::string name = c["name"];
      CAPTURE(name);
      auto loss = make_loss(c);
      const Tensor<float> y_true = tensor_of(c["y_true"], c["y_true_shape"]);
      const Tensor<float> y_pred = tensor_of(c["y_pred"], c["y_pred_shape"]);
      Tensor<float> weights;
      const bool weighted = !c["sample_weight"].is_null();
      if (weighted) {
        weights = tensor_of(c["sample_weight"], nlohmann::json::array({y_pred.rows()}));
      }
      Tensor<float> gradient(y_pred.shape());
      const float value = loss->compute(y_true, y_pred, weighted ? &weights : nullptr, gradient);
      check_close(name + " value", std::span<const float>(&value, 1), {c["value"].get<double>()},
                  1e-6, 1e-5);
      check_close(name + " gradient", gradient.span(), c["gradient"].get<std::vector<double>>(),
                  1e-6, 1e-5);
      // Without a gradient buffer the value is the same.
      CHECK(loss->compute(y_true, y_pred, weighted ? &weights : nullptr, Tensor<float>()) == value);
    }
  }

  TEST_CASE("Loss reduction sum and none follow Keras") {
    Tensor<float> y_true({2, 2}, {0, 1, 1, 1});
    Tensor<float> y_pred({2, 2}, {1, 1, 3, 1});
    Tensor<float> weights({2}, {2, 0.5f});
    losses::MeanSquaredError sum(loadstar::keras::Reduction::sum);
    CHECK(sum.compute(y_true, y_pred, &weights, Tensor<float>()) ==
          doctest::Approx(0.5 * 2 + 2 * 0.5));
    losses::MeanSquaredError none(loadstar::keras::Reduction::none);
    CHECK(none.compute(y_true, y_pred, nullptr, Tensor<float>()) == doctest::Approx(1.25));
    REQUIRE(none.per_sample().size() == 2);
    CHECK(none.per_sample()[1] == doctest::Approx(2.0));
  }

  TEST_CASE("Loss rejects mismatched shapes naming the loss and both shapes") {
    Tensor<float> a({4, 3}), b({4, 2}), gradient({3, 2}), weights({3});
    CHECK_THROWS_WITH_AS(
        get_loss("mse")->compute(a, b, nullptr, Tensor<float>()),
        doctest::Contains(
            "mean_squared_error: y_true of shape (4, 3) does not match y_pred of shape (4, 2)"),
        ShapeError);
    CHECK_THROWS_WITH_AS(
        get_loss("categorical_crossentropy")->compute(a, b, nullptr, Tensor<float>()),
        doctest::Contains("categorical_crossentropy: y_true of shape (4, 3)"), ShapeError);
    CHECK_THROWS_WITH_AS(get_loss("sparse_categorical_crossentropy")
                             ->compute(Tensor<float>({4, 3}), b, nullptr, Tensor<float>()),
                         doctest::Contains("sparse_categorical_crossentropy: y_true of shape (4, "
                                           "3) does not match y_pred of shape (4, 2)"),
                         ShapeError);
    // One-hot labels (y_true shaped as y_pred) are told which loss takes them.
    CHECK_THROWS_WITH_AS(get_loss("sparse_categorical_crossentropy")
                             ->compute(Tensor<float>({4, 2}), b, nullptr, Tensor<float>()),
                         doctest::Contains("y_true of shape (4, 2) looks one-hot (the shape of "
                                           "y_pred); this loss takes one class index per row, of "
                                           "shape (4,): use categorical_crossentropy"),
                         ShapeError);
    CHECK_THROWS_WITH_AS(get_loss("mae")->compute(b, b, nullptr, gradient),
                         doctest::Contains("mean_absolute_error: the gradient buffer has shape (3, "
                                           "2) but y_pred has shape (4, 2)"),
                         ShapeError);
    CHECK_THROWS_WITH_AS(get_loss("hinge")->compute(b, b, &weights, Tensor<float>()),
                         doctest::Contains("hinge: sample_weight of shape (3,) needs one weight "
                                           "per row but y_pred has shape (4, 2)"),
                         ShapeError);
  }

  TEST_CASE("get_loss resolves Keras strings and rejects unknown names") {
    CHECK(get_loss("mse")->class_name() == "MeanSquaredError");
    CHECK(get_loss("sparse_categorical_crossentropy")->name() == "sparse_categorical_crossentropy");
    CHECK(get_loss("kld")->class_name() == "KLDivergence");
    CHECK(get_loss("MAPE")->class_name() == "MeanAbsolutePercentageError");
    CHECK(get_loss("logcosh")->name() == "log_cosh");
    CHECK(get_loss("msle")->name() == "mean_squared_logarithmic_error");
    CHECK(get_loss("CosineSimilarity")->get_config() ==
          nlohmann::json{
              {"reduction", "sum_over_batch_size"}, {"name", "cosine_similarity"}, {"axis", -1}});
    CHECK_THROWS_WITH_AS(loadstar::keras::Registry<Loss>::instance().create(
                             "CosineSimilarity", {{"axis", 0}, {"name", "cos"}}),
                         doctest::Contains("config.axis: expected -1"), ConfigError);
    CHECK_THROWS_WITH_AS(get_loss("foo"), doctest::Contains("unknown loss 'foo'; known: mse"),
                         ConfigError);
  }

  TEST_CASE("SparseCategoricalCrossentropy rejects labels outside the classes") {
    auto loss = get_loss("sparse_categorical_crossentropy");
    Tensor<float> labels({4}, {1, 2, 3, 12});
    Tensor<float> probabilities({4, 10}, 0.1f);
    Tensor<float> negative({4}, {1, -1, 3, 2});
    CHECK_THROWS_WITH_AS(loss->compute(negative, probabilities, nullptr, Tensor<float>()),
                         doctest::Contains("label -1 at row 1 is outside [0, 10)"), ConfigError);
    CHECK_THROWS_WITH_AS(
        loss->compute(labels, probabilities, nullptr, Tensor<float>()),
        doctest::Contains("sparse_categorical_crossentropy: label 12 at row 3 is outside [0, 10)"),
        ConfigError);
  }
}

namespace {

// The reference values of tests/keras/generate_losses_metrics_34.py.
const nlohmann::json& loss_reference_34() {
  static const nlohmann::json json = reference_values::load_reference("losses_metrics_34.json");
  return json;
}

}  // namespace

TEST_SUITE("keras") {
  TEST_CASE(
      "BinaryFocalCrossentropy and CategoricalFocalCrossentropy match the PyTorch reference") {
    // The loss made from its Keras config through the registry, value and gradient against
    // autograd of the same formula: 1e-6 absolute plus 1e-5 relative.
    for (const auto& c : loss_reference_34()["losses"]) {
      const std::string name = c["name"];
      CAPTURE(name);
      auto loss = loadstar::keras::Registry<Loss>::instance().create(c["loss"].get<std::string>(),
                                                                     c["args"]);
      const Tensor<float> y_true = tensor_of(c["y_true"], c["y_true_shape"]);
      const Tensor<float> y_pred = tensor_of(c["y_pred"], c["y_pred_shape"]);
      Tensor<float> weights;
      const bool weighted = !c["sample_weight"].is_null();
      if (weighted) {
        weights = tensor_of(c["sample_weight"], nlohmann::json::array({y_pred.rows()}));
      }
      Tensor<float> gradient(y_pred.shape());
      const float value = loss->compute(y_true, y_pred, weighted ? &weights : nullptr, gradient);
      check_close(name + " value", std::span<const float>(&value, 1), {c["value"].get<double>()},
                  1e-6, 1e-5);
      check_close(name + " gradient", gradient.span(), c["gradient"].get<std::vector<double>>(),
                  1e-6, 1e-5);
      CHECK(loss->compute(y_true, y_pred, weighted ? &weights : nullptr, Tensor<float>()) == value);
    }
  }

  TEST_CASE("BinaryFocalCrossentropy and CategoricalFocalCrossentropy configs round trip") {
    auto& registry = loadstar::keras::Registry<Loss>::instance();
    const auto binary = get_loss("binary_focal_crossentropy");
    CHECK(binary->class_name() == "BinaryFocalCrossentropy");
    CHECK(binary->get_config() == nlohmann::json{{"reduction", "sum_over_batch_size"},
                                                 {"name", "binary_focal_crossentropy"},
                                                 {"apply_class_balancing", false},
                                                 {"alpha", 0.25},
                                                 {"gamma", 2.0},
                                                 {"from_logits", false},
                                                 {"label_smoothing", 0.0},
                                                 {"axis", -1}});
    const nlohmann::json config = {
        {"reduction", "sum"},     {"name", "focal"}, {"apply_class_balancing", true},
        {"alpha", 0.4},           {"gamma", 3.0},    {"from_logits", true},
        {"label_smoothing", 0.1}, {"axis", -1}};
    CHECK(registry.create("BinaryFocalCrossentropy", config)->get_config() == config);
    const auto categorical = get_loss("categorical_focal_crossentropy");
    CHECK(categorical->name() == "categorical_focal_crossentropy");
    const nlohmann::json categorical_config = {
        {"reduction", "none"}, {"name", "cf"},           {"alpha", 0.5}, {"gamma", 1.0},
        {"from_logits", true}, {"label_smoothing", 0.2}, {"axis", -1}};
    CHECK(registry.create("CategoricalFocalCrossentropy", categorical_config)->get_config() ==
          categorical_config);
    // tf.keras writes "auto" for the default reduction.
    CHECK(registry.create("CategoricalFocalCrossentropy", {{"reduction", "auto"}})
              ->get_config()["reduction"] == "sum_over_batch_size");
  }

  TEST_CASE("BinaryFocalCrossentropy and CategoricalFocalCrossentropy reject bad arguments") {
    auto& registry = loadstar::keras::Registry<Loss>::instance();
    CHECK_THROWS_WITH_AS(registry.create("CategoricalFocalCrossentropy", {{"axis", 1}}),
                         doctest::Contains("loss (CategoricalFocalCrossentropy): config.axis: "
                                           "expected -1 (loadstar reduces over the last axis) "
                                           "but found 1"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("BinaryFocalCrossentropy", {{"axis", 0}}),
                         doctest::Contains("config.axis: expected -1"), ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("BinaryFocalCrossentropy", {{"gamma", -1.0}}),
                         doctest::Contains("binary_focal_crossentropy (BinaryFocalCrossentropy): "
                                           "gamma must be at least 0 but is -1.0"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(losses::CategoricalFocalCrossentropy(1.5),
                         doctest::Contains("categorical_focal_crossentropy "
                                           "(CategoricalFocalCrossentropy): alpha must be in [0, "
                                           "1] but is 1.5"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("BinaryFocalCrossentropy", {{"label_smoothing", 2.0}}),
                         doctest::Contains("label_smoothing must be in [0, 1] but is 2.0"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("BinaryFocalCrossentropy", {{"gamma", "two"}}),
                         doctest::Contains("config.gamma: expected a number but found \"two\""),
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        get_loss("categorical_focal_crossentropy")
            ->compute(Tensor<float>({4}), Tensor<float>({4, 3}), nullptr, Tensor<float>()),
        doctest::Contains("categorical_focal_crossentropy: y_true of shape (4,) does not match "
                          "y_pred of shape (4, 3)"),
        ShapeError);
  }
}

// Regularizers, constraints and the training-only layers that need them (issue 34): the penalties
// and gradients of L1, L2, L1L2 and OrthogonalRegularizer and the projections of MaxNorm,
// MinMaxNorm, NonNeg and UnitNorm against tests/keras/generate_regularizers_34.py (PyTorch
// autograd of Keras's formulas, float64), two SGD steps of a model whose loss carries weight and
// activity penalties and whose variables are constrained, Keras's config spellings, and
// AlphaDropout and Dropout's noise_shape. Tolerances: 1e-5 absolute and relative (float32 against
// float64).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <loadstar/error.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/keras/backend/cpu_backend.hpp>
#include <loadstar/keras/saving/model_config.hpp>
#include <loadstar/keras/saving/saving.hpp>
#include <loadstar/keras/warnings.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "keras/layer_cases.hpp"
#include "keras/reference_values.hpp"
#include "temp_dir.hpp"

using loadstar::ConfigError;
using loadstar::Shape;
using loadstar::ShapeError;
using loadstar::Tensor;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;
using nlohmann::json;

namespace {

const json& reference() {
  static const json data = layer_cases::load("regularizers_34.json");
  return data;
}

Tensor<float> values_of(const json& values, const json& shape) {
  return reference_values::tensor_of(values, shape);
}

void check_near(std::string_view what, const Tensor<float>& value, const json& target) {
  reference_values::check_close(what, value.span(), target.get<std::vector<double>>(), 1e-5, 1e-5);
}

bool same_bits(const Tensor<float>& a, const Tensor<float>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// The model of generate_regularizers_34.py: Dense(3, tanh) with an L2 kernel penalty, an L1
/// bias penalty, an L1L2 activity penalty and a MaxNorm kernel constraint, ActivityRegularization,
/// and Dense(2) with an orthogonal kernel penalty and a NonNeg bias constraint; its weights are the
/// reference's initial ones.
std::shared_ptr<Model> penalised_model() {
  auto input = Input({4}, "in");
  auto first = std::make_shared<Dense>(3, DenseOptions{.activation = "tanh", .name = "d1"});
  first->set_regularizer("kernel", std::make_shared<regularizers::L2>(0.05));
  first->set_regularizer("bias", std::make_shared<regularizers::L1>(0.02));
  first->set_activity_regularizer(std::make_shared<regularizers::L1L2>(0.01, 0.03));
  first->set_constraint("kernel", std::make_shared<constraints::MaxNorm>(0.8));
  auto second = std::make_shared<Dense>(2, DenseOptions{.name = "d2"});
  second->set_regularizer("kernel",
                          std::make_shared<regularizers::OrthogonalRegularizer>(0.1, "columns"));
  second->set_constraint("bias", std::make_shared<constraints::NonNeg>());
  auto h = call(first, input);
  h = call(ActivityRegularization(0.02, 0.01, "act"), h);
  auto model = std::make_shared<Model>(std::vector{input}, std::vector{call(second, h)}, "pen");
  const json& initial = reference()["training"]["initial"];
  model->set_weights({values_of(initial["k1"], {4, 3}), values_of(initial["b1"], {3}),
                      values_of(initial["k2"], {3, 2}), values_of(initial["b2"], {2})});
  return model;
}

/// Trains `model` two SGD steps on the reference batch and checks the logged loss (penalties
/// included) and the constrained weights after each, then evaluate's loss.
void check_penalised_training(Model& model) {
  const json& t = reference()["training"];
  const Tensor<float> x = values_of(t["x"], {5, 4}), y = values_of(t["y"], {5, 2});
  for (std::size_t step = 0; step < 2; ++step) {
    CAPTURE(step);
    const Logs logs = model.train_on_batch(x, y);
    CHECK(*logs.get("loss") ==
          doctest::Approx(t["steps"][step]["loss"].get<double>()).epsilon(1e-5));
    const auto weights = model.get_weights();
    const json& target = t["steps"][step]["weights"];
    check_near("k1", weights[0], target["k1"]);
    check_near("b1", weights[1], target["b1"]);
    check_near("k2", weights[2], target["k2"]);
    check_near("b2", weights[3], target["b2"]);
  }
  const Logs evaluated = model.evaluate(values_of(t["x_eval"], {3, 4}),
                                        values_of(t["y_eval"], {3, 2}), {.verbose = 0});
  CHECK(*evaluated.get("loss") == doctest::Approx(t["evaluate_loss"].get<double>()).epsilon(1e-5));
}

}  // namespace

TEST_SUITE("keras") {
  TEST_CASE("Regularizers match PyTorch's penalties and gradients") {
    CpuBackend backend;
    for (const json& c : reference()["regularizers"]) {
      const std::string name = c["name"].get<std::string>();
      CAPTURE(name);
      const auto regularizer = get_regularizer(c["regularizer"]);
      REQUIRE(regularizer != nullptr);
      CHECK(regularizer->to_json() == c["regularizer"]);
      const Tensor<float> x = values_of(c["x"], c["shape"]);
      CHECK(regularizer->penalty(x) == doctest::Approx(c["penalty"].get<double>()).epsilon(1e-6));
      CHECK(regularizer->penalty_on(backend, x) == regularizer->penalty(x));
      Tensor<float> gradient(x.shape(), 0.0F);
      regularizer->add_gradient_on(backend, x, 1.0, gradient);
      check_near(name + " gradient", gradient, c["gradient"]);
      // add_gradient adds, scaled.
      regularizer->add_gradient(x, 2.0, gradient);
      std::vector<double> tripled;
      for (const double g : c["gradient"].get<std::vector<double>>())
        tripled.push_back(3.0 * g);
      reference_values::check_close(name + " gradient added", gradient.span(), tripled, 1e-5, 1e-5);
    }
  }

  TEST_CASE("Constraints project weights as Keras's formulas") {
    CpuBackend backend;
    for (const json& c : reference()["constraints"]) {
      const std::string name = c["name"].get<std::string>();
      CAPTURE(name);
      const auto constraint = get_constraint(c["constraint"]);
      REQUIRE(constraint != nullptr);
      CHECK(constraint->to_json() == c["constraint"]);
      const Tensor<float> w = values_of(c["w"], c["shape"]);
      constraint->check_shape(w.shape(), "w");
      constraint->apply_on(backend, w);
      check_near(name, w, c["projected"]);
    }
  }

  TEST_CASE("Regularizer and constraint registries take Keras's names spellings and defaults") {
    using regularizers::L1L2;
    const auto l1 = get_regularizer("l1");
    CHECK(l1->to_json() == json{{"class_name", "L1"}, {"config", {{"l1", 0.01}}}});
    CHECK(get_regularizer("l2")->to_json() ==
          json{{"class_name", "L2"}, {"config", {{"l2", 0.01}}}});
    // Keras 3's regularizers.get("l1_l2") is L1L2(), both factors 0.
    CHECK(get_regularizer("l1_l2")->to_json() ==
          json{{"class_name", "L1L2"}, {"config", {{"l1", 0.0}, {"l2", 0.0}}}});
    CHECK(get_regularizer("orthogonal_regularizer")->get_config() ==
          json{{"factor", 0.01}, {"mode", "rows"}});
    CHECK(get_regularizer(nullptr) == nullptr);
    // Keras 3's spelling: module and registered_name.
    const auto keras3 = get_regularizer(json::parse(
        R"({"module": "keras.regularizers", "class_name": "L2", "config": {"l2": 0.25},
            "registered_name": null})"));
    CHECK(keras3->get_config() == json{{"l2", 0.25}});
    CHECK(get_constraint("non_neg")->class_name() == "NonNeg");
    CHECK(get_constraint("max_norm")->get_config() == json{{"max_value", 2.0}, {"axis", 0}});
    CHECK(get_constraint("min_max_norm")->get_config() ==
          json{{"min_value", 0.0}, {"max_value", 1.0}, {"rate", 1.0}, {"axis", 0}});
    CHECK(get_constraint("unit_norm")->get_config() == json{{"axis", 0}});
    CHECK(get_constraint(json::parse(R"({"module": "keras.constraints", "class_name": "UnitNorm",
                                         "config": {"axis": [0, 1]}, "registered_name": null})"))
              ->get_config() == json{{"axis", {0, 1}}});

    CHECK_THROWS_WITH_AS(get_regularizer("l3"), doctest::Contains("unknown regularizer 'l3'"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(get_regularizer(json{{"class_name", "L2"}, {"config", {{"l2", -1}}}}),
                         "regularizer (L2): config.l2: expected a finite number at least 0 but "
                         "found -1",
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        get_regularizer(json{{"class_name", "OrthogonalRegularizer"}, {"config", {{"mode", "x"}}}}),
        doctest::Contains("config.mode: expected \"rows\" or \"columns\""), ConfigError);
    CHECK_THROWS_WITH_AS(L1L2(-0.5), doctest::Contains("l1 must be a finite number at least 0"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(get_constraint("clip"), doctest::Contains("unknown constraint 'clip'"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        get_constraint(json{{"class_name", "MaxNorm"}, {"config", {{"axis", "rows"}}}}),
        doctest::Contains("config.axis: expected an integer or a list of integers"), ConfigError);
    CHECK_THROWS_WITH_AS(constraints::MinMaxNorm(2.0, 1.0),
                         doctest::Contains("min_value 2.000000 must be at most max_value"),
                         ConfigError);
  }

  TEST_CASE("Layer configs read and write regularizers and constraints in both Keras spellings") {
    const json config = json::parse(R"({
      "name": "fc", "units": 3,
      "kernel_regularizer": {"class_name": "L2", "config": {"l2": 0.01}},
      "bias_regularizer": {"module": "keras.regularizers", "class_name": "L1",
                           "config": {"l1": 0.5}, "registered_name": null},
      "activity_regularizer": "l1_l2",
      "kernel_constraint": {"class_name": "MaxNorm", "config": {"max_value": 3, "axis": 0}},
      "bias_constraint": {"class_name": "NonNeg", "config": {}}})");
    const auto layer = LayerRegistry::instance().create("Dense", config);
    const json written = layer->get_config();
    CHECK(written["kernel_regularizer"] == json{{"class_name", "L2"}, {"config", {{"l2", 0.01}}}});
    CHECK(written["bias_regularizer"] == json{{"class_name", "L1"}, {"config", {{"l1", 0.5}}}});
    CHECK(written["activity_regularizer"] ==
          json{{"class_name", "L1L2"}, {"config", {{"l1", 0.0}, {"l2", 0.0}}}});
    CHECK(written["kernel_constraint"] ==
          json{{"class_name", "MaxNorm"}, {"config", {{"max_value", 3.0}, {"axis", 0}}}});
    CHECK(written["bias_constraint"] == json{{"class_name", "NonNeg"}, {"config", json::object()}});
    CHECK(LayerRegistry::instance().create("Dense", written)->get_config() == written);
    // A layer without them writes nulls, as Keras.
    const json plain = Dense(2).get_config();
    CHECK(plain["kernel_regularizer"].is_null());
    CHECK(plain["bias_constraint"].is_null());
    CHECK(plain["activity_regularizer"].is_null());

    SUBCASE("and the other weights' spellings") {
      const auto norm = LayerRegistry::instance().create(
          "BatchNormalization", json{{"gamma_regularizer", "l2"}, {"beta_constraint", "non_neg"}});
      CHECK(norm->get_config()["gamma_regularizer"]["class_name"] == "L2");
      CHECK(norm->get_config()["beta_constraint"]["class_name"] == "NonNeg");
      CHECK(norm->weight_options("gamma")->regularizer != nullptr);
      const auto embedding = LayerRegistry::instance().create(
          "Embedding", json{{"input_dim", 5}, {"output_dim", 2}, {"embeddings_regularizer", "l1"}});
      CHECK(embedding->get_config()["embeddings_regularizer"]["class_name"] == "L1");
      const auto prelu =
          LayerRegistry::instance().create("PReLU", json{{"alpha_constraint", "non_neg"}});
      CHECK(prelu->get_config()["alpha_constraint"]["class_name"] == "NonNeg");
      const auto dropout = LayerRegistry::instance().create(
          "Dropout", json{{"rate", 0.5}, {"activity_regularizer", "l2"}});
      CHECK(dropout->get_config()["activity_regularizer"]["class_name"] == "L2");
    }

    SUBCASE("and name the layer the key and the class they cannot build") {
      CHECK_THROWS_WITH_AS(
          LayerRegistry::instance().create(
              "Dense", json{{"name", "fc"}, {"units", 2}, {"kernel_regularizer", "my_penalty"}}),
          doctest::Contains("layer 'fc' (Dense): config.kernel_regularizer: unknown regularizer "
                            "'my_penalty'"),
          ConfigError);
      CHECK_THROWS_WITH_AS(
          LayerRegistry::instance().create(
              "Dense", json{{"name", "fc"},
                            {"units", 2},
                            {"bias_constraint", {{"class_name", "Clip"}, {"config", {}}}}}),
          doctest::Contains(
              "layer 'fc' (Dense): config.bias_constraint: unknown constraint 'Clip'"),
          ConfigError);
      CHECK_THROWS_WITH_AS(
          LayerRegistry::instance().create(
              "Conv2D", json{{"name", "c"},
                             {"filters", 2},
                             {"kernel_size", 3},
                             {"activity_regularizer", {{"class_name", "Sparse"}, {"config", {}}}}}),
          doctest::Contains("layer 'c' (Conv2D): config.activity_regularizer: unknown regularizer "
                            "'Sparse'"),
          ConfigError);
      // An initializer loadstar cannot build only fills weights a file then replaces: the layer
      // is made, with a warning naming it.
      std::vector<std::string> warnings;
      const auto previous = loadstar::keras::set_warning_handler(
          [&](const std::string& w) { warnings.push_back(w); });
      CHECK_NOTHROW(LayerRegistry::instance().create(
          "Dense", json{{"name", "fc"}, {"units", 2}, {"kernel_initializer", "my_init"}}));
      loadstar::keras::set_warning_handler(previous);
      REQUIRE(warnings.size() == 1);
      CHECK(warnings[0].find("my_init") != std::string::npos);
    }
  }

  TEST_CASE("A model refuses a regularizer or constraint its layers cannot apply") {
    auto input = Input({4}, "in");
    SUBCASE("of a weight the layer does not have") {
      const auto dropout = LayerRegistry::instance().create(
          "Dropout", json{{"name", "drop"}, {"rate", 0.5}, {"kernel_regularizer", "l2"}});
      CHECK_THROWS_WITH_AS(Model(input, call(dropout, input)),
                           "dropout layer 'drop': has a regularizer for weight 'kernel' but its "
                           "weights are none",
                           ConfigError);
      auto dense = std::make_shared<Dense>(2, DenseOptions{.name = "fc"});
      dense->set_constraint("gamma", std::make_shared<constraints::NonNeg>());
      CHECK_THROWS_WITH_AS(Model(input, call(dense, input)),
                           "dense layer 'fc': has a constraint for weight 'gamma' but its weights "
                           "are 'kernel', 'bias'",
                           ConfigError);
    }
    SUBCASE("of a shape it does not take") {
      auto dense = std::make_shared<Dense>(2, DenseOptions{.name = "fc"});
      dense->set_regularizer("bias", std::make_shared<regularizers::OrthogonalRegularizer>());
      CHECK_THROWS_WITH_AS(Model(input, call(dense, input)),
                           "dense layer 'fc': bias_regularizer: OrthogonalRegularizer takes rank-2 "
                           "tensors but the tensor is (2,)",
                           ConfigError);
      auto other = std::make_shared<Dense>(2, DenseOptions{.name = "fc2"});
      other->set_constraint("kernel", std::make_shared<constraints::UnitNorm>(2));
      CHECK_THROWS_WITH_AS(Model(input, call(other, input)),
                           "dense layer 'fc2': kernel_constraint: UnitNorm's axis 2 is outside a "
                           "variable of shape (4, 2)",
                           ConfigError);
    }
  }

  TEST_CASE("Penalties join the training and evaluation loss and constraints follow each step") {
    const auto model = penalised_model();
    model->compile({.optimizer = std::make_shared<optimizers::SGD>(
                        optimizers::SGDOptions{.learning_rate = 0.1}),
                    .loss = "mse"});
    check_penalised_training(*model);

    SUBCASE("and the model's config and files keep them") {
      const json config = model_get_config(*model);
      const auto copy = model_from_config(config);
      CHECK(model_get_config(*copy) == config);
      const json& layers = config["config"]["layers"];
      bool seen = false;
      for (const json& layer : layers) {
        if (layer["config"]["name"] != "d1") continue;
        seen = true;
        CHECK(layer["config"]["kernel_regularizer"] ==
              json{{"class_name", "L2"}, {"config", {{"l2", 0.05}}}});
        CHECK(layer["config"]["kernel_constraint"]["class_name"] == "MaxNorm");
      }
      CHECK(seen);
      test_support::TempDir dir;
      for (const char* file : {"model.h5", "model.keras"}) {
        INFO(file);
        model->save(dir / file);
        const auto loaded = load_model(dir / file);
        CHECK(model_get_config(*loaded) == config);
      }
      // A model rebuilt from the config trains as the reference too.
      const auto rebuilt = model_from_config(config);
      const json& initial = reference()["training"]["initial"];
      rebuilt->set_weights({values_of(initial["k1"], {4, 3}), values_of(initial["b1"], {3}),
                            values_of(initial["k2"], {3, 2}), values_of(initial["b2"], {2})});
      rebuilt->compile({.optimizer = std::make_shared<optimizers::SGD>(
                            optimizers::SGDOptions{.learning_rate = 0.1}),
                        .loss = "mse"});
      check_penalised_training(*rebuilt);
    }
  }

  TEST_CASE("ActivityRegularization passes its input and round-trips its config") {
    const auto layer = LayerRegistry::instance().create(
        "ActivityRegularization", json{{"name", "a"}, {"l1", 0.1}, {"l2", 0.2}});
    CHECK(layer->get_config() ==
          json{{"name", "a"}, {"trainable", true}, {"dtype", "float32"}, {"l1", 0.1}, {"l2", 0.2}});
    CHECK(layer->activity_regularizer()->get_config() == json{{"l1", 0.1}, {"l2", 0.2}});
    CHECK_THROWS_WITH_AS(
        LayerRegistry::instance().create("ActivityRegularization", json{{"l2", -1.0}}),
        doctest::Contains("config.l2: expected a finite number at least 0"), ConfigError);
    auto input = Input({3}, "in");
    Model model(input, call(layer, input));
    const Tensor<float> x(Shape{2, 3}, 1.5F);
    CHECK(same_bits(model.predict(x, {.verbose = 0}), x));
  }

  TEST_CASE("AlphaDropout keeps SELU's affine rule in training and is the identity in predict") {
    CpuBackend backend;
    const json& r = reference()["alpha_dropout"];
    const auto a = r["a"].get<double>(), b = r["b"].get<double>();
    const auto dropped_value = r["dropped"].get<double>();
    AlphaDropout dropout(r["rate"].get<double>(), {.name = "ad"});
    const Shape in[] = {Shape{50}};
    dropout.build(in, 0);
    Tensor<float> x(Shape{200, 50});
    for (std::size_t i = 0; i < x.size(); ++i)
      x.data()[i] = std::sin(0.37F * float(i));
    const Tensor<float> inputs[] = {x};
    Tensor<float> y(x.shape()), again(x.shape());
    const CallContext train{.backend = backend, .training = true, .seed = 5, .step = 2};
    dropout.forward(inputs, y, train);
    dropout.forward(inputs, again, train);
    CHECK(same_bits(y, again));
    std::size_t dropped = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double kept = a * x.data()[i] + b;
      if (std::abs(y.data()[i] - dropped_value) < 1e-6) {
        ++dropped;
      } else {
        CHECK(y.data()[i] == doctest::Approx(kept).epsilon(1e-6));
      }
    }
    // 10000 elements at rate 0.2: 2000 expected, 4 standard deviations (160) around it.
    CHECK(dropped > 1840);
    CHECK(dropped < 2160);
    // The gradient is a where kept, 0 where dropped.
    Tensor<float> dy(x.shape(), 1.0F), dx(x.shape());
    const Tensor<float> dxs[] = {dx};
    dropout.backward(inputs, y, dy, dxs, train);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const bool was_dropped = std::abs(y.data()[i] - dropped_value) < 1e-6 &&
                               std::abs(a * x.data()[i] + b - dropped_value) > 1e-6;
      if (was_dropped) CHECK(dx.data()[i] == 0.0F);
    }
    dropout.forward(inputs, y, {.backend = backend, .training = false});
    CHECK(same_bits(y, x));

    SUBCASE("with a noise_shape shared along an axis") {
      AlphaDropout shared(0.5, {.noise_shape = json::array({nullptr, 1, 4}), .name = "ads"});
      const Shape sample[] = {Shape{3, 4}};
      shared.build(sample, 0);
      const Tensor<float> ones(Shape{20, 3, 4}, 1.0F);
      const Tensor<float> ones_in[] = {ones};
      Tensor<float> out(ones.shape());
      shared.forward(ones_in, out, train);
      for (std::size_t s = 0; s < 20; ++s)
        for (std::size_t i = 1; i < 3; ++i)
          for (std::size_t j = 0; j < 4; ++j)
            CHECK(out.data()[s * 12 + i * 4 + j] == out.data()[s * 12 + j]);
      CHECK(shared.get_config()["noise_shape"] == json::array({nullptr, 1, 4}));
    }
    SUBCASE("and refuses what Keras refuses") {
      CHECK_THROWS_WITH_AS(AlphaDropout(1.0, {.name = "x"}),
                           "alpha_dropout layer 'x': rate must be in [0, 1) but is 1.000000",
                           ConfigError);
      AlphaDropout bad(0.1, {.noise_shape = json::array({nullptr, 2}), .name = "x"});
      const Shape sample[] = {Shape{3}};
      CHECK_THROWS_WITH_AS(bad.build(sample, 0),
                           "alpha_dropout layer 'x': noise_shape [null,2] has 2 on axis 1 but the "
                           "input has 3 (the size must be 1 or the input's)",
                           ShapeError);
    }
  }

  TEST_CASE("Dropout with a noise_shape drops whole slices and round-trips its config") {
    CpuBackend backend;
    const auto layer = LayerRegistry::instance().create(
        "Dropout", json{{"name", "d"}, {"rate", 0.4}, {"noise_shape", {nullptr, 1, 5}}});
    auto& dropout = dynamic_cast<Dropout&>(*layer);
    CHECK(layer->get_config()["noise_shape"] == json::array({nullptr, 1, 5}));
    const Shape sample[] = {Shape{3, 5}};
    dropout.build(sample, 0);
    const Tensor<float> x(Shape{40, 3, 5}, 2.0F);
    const Tensor<float> inputs[] = {x};
    Tensor<float> y(x.shape());
    const CallContext train{.backend = backend, .training = true, .seed = 3, .step = 1};
    dropout.forward(inputs, y, train);
    std::size_t dropped = 0;
    for (std::size_t s = 0; s < 40; ++s) {
      for (std::size_t j = 0; j < 5; ++j) {
        const float first = y.data()[s * 15 + j];
        CHECK((first == 0.0F || first == doctest::Approx(2.0 / 0.6)));
        for (std::size_t i = 1; i < 3; ++i)
          CHECK(y.data()[s * 15 + i * 5 + j] == first);
        dropped += first == 0.0F ? 1 : 0;
      }
    }
    // 200 draws at rate 0.4: 80 expected, 4 standard deviations (28) around it.
    CHECK(dropped > 52);
    CHECK(dropped < 108);
    // The gradient takes the same mask.
    Tensor<float> dx(x.shape());
    const Tensor<float> dxs[] = {dx};
    dropout.backward(inputs, y, x, dxs, train);
    CHECK(same_bits(dx, y));
    dropout.forward(inputs, y, {.backend = backend, .training = false});
    CHECK(same_bits(y, x));

    const auto wrong = LayerRegistry::instance().create(
        "Dropout", json{{"name", "w"}, {"rate", 0.4}, {"noise_shape", {nullptr, 5}}});
    CHECK_THROWS_WITH_AS(wrong->build(sample, 0),
                         "dropout layer 'w': noise_shape [null,5] has 2 axes but the input has 3 "
                         "(batch axis included)",
                         ShapeError);
    CHECK_THROWS_WITH_AS(
        LayerRegistry::instance().create("Dropout", json{{"rate", 0.4}, {"noise_shape", "rows"}}),
        doctest::Contains("config.noise_shape: expected null or a list of null or positive "
                          "integers"),
        ConfigError);
  }
}

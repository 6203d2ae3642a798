// Mixed precision: dtype policies, the rounding kernel, training under mixed_bfloat16 and
// mixed_float16 against PyTorch (tests/keras/generate_mixed_precision.py), LossScaleOptimizer's
// scale sequence under an overflow, and its state through both file formats.
#include <doctest/doctest.h>

#include "keras/reference_values.hpp"
#include "temp_dir.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <loadstar/keras.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

using namespace loadstar;
using namespace loadstar::keras;
using mixed_precision::Policy;
using reference_values::load_reference;
using test_support::TempDir;

namespace {

const nlohmann::json& mixed_reference() {
  static const nlohmann::json json = load_reference("mixed_precision.json");
  return json;
}

/// Sets the global policy for a scope and puts float32 back after it.
struct GlobalPolicy {
  explicit GlobalPolicy(const Policy& policy) { mixed_precision::set_global_policy(policy); }
  GlobalPolicy(const GlobalPolicy&) = delete;
  GlobalPolicy& operator=(const GlobalPolicy&) = delete;
  ~GlobalPolicy() { mixed_precision::set_global_policy("float32"); }
};

Tensor<float> batch_tensor(const nlohmann::json& values, std::vector<std::size_t> shape) {
  std::vector<float> v;
  for (const auto& e : values) {
    v.push_back(e.is_string() ? std::numeric_limits<float>::infinity() : e.get<float>());
  }
  return Tensor<float>(Shape(shape), std::span<const float>(v));
}

std::vector<Tensor<float>> case_weights(const nlohmann::json& c) {
  std::vector<Tensor<float>> out;
  for (std::size_t i = 0; i < c["weights"].size(); ++i)
    out.push_back(reference_values::tensor_of(c["weights"][i], c["shapes"][i]));
  return out;
}

/// The generator's MLP under the global policy `policy`, its output Activation in float32.
std::shared_ptr<Sequential> mlp(const Policy& policy, OptimizerArg optimizer,
                                const nlohmann::json& c, bool auto_scale_loss = true) {
  const GlobalPolicy scope(policy);
  layers::Activation output("softmax");
  output.set_dtype_policy("float32");
  auto model = std::make_shared<Sequential>(std::initializer_list<SequentialItem>{
      Input({8}), layers::Dense(16, {.activation = "relu"}), layers::Dense(3), std::move(output)});
  model->compile({.optimizer = std::move(optimizer),
                  .loss = "sparse_categorical_crossentropy",
                  .auto_scale_loss = auto_scale_loss});
  model->set_weights(case_weights(c));
  return model;
}

/// The generator's CNN under `policy`.
std::shared_ptr<Sequential> cnn(const Policy& policy, const nlohmann::json& c) {
  const GlobalPolicy scope(policy);
  layers::Activation output("softmax");
  output.set_dtype_policy("float32");
  auto model = std::make_shared<Sequential>(std::initializer_list<SequentialItem>{
      Input({8, 8, 1}), layers::Conv2D(4, 3, {.activation = "relu"}), layers::MaxPooling2D(),
      layers::Flatten(), layers::Dense(3), std::move(output)});
  model->compile({.optimizer = optimizers::SGD({.learning_rate = c["lr"].get<double>()}),
                  .loss = "sparse_categorical_crossentropy"});
  model->set_weights(case_weights(c));
  return model;
}

/// The loss of each training step on the case's batches (`train_step`, which, unlike
/// `train_on_batch`, takes a non-finite loss).
std::vector<double> train_losses(Model& model, const nlohmann::json& c,
                                 std::vector<std::size_t> sample) {
  std::vector<double> losses;
  for (std::size_t b = 0; b < c["x"].size(); ++b) {
    std::vector<std::size_t> shape{c["y"][b].size()};
    shape.insert(shape.end(), sample.begin(), sample.end());
    const Tensor<float> x = batch_tensor(c["x"][b], shape);
    const Tensor<float> y = batch_tensor(c["y"][b], {c["y"][b].size()});
    model.reset_metrics();  // the loss of this step, not the running mean
    const Logs& logs = model.train_step(std::tie(x, y));
    losses.push_back(*logs.get("loss"));
  }
  return losses;
}

/// The largest |a - b| over the steps.
double largest_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double out = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    out = std::max(out, std::abs(a[i] - b[i]));
  return out;
}

void check_losses(const std::string& what, const std::vector<double>& losses,
                  const nlohmann::json& targets, double tolerance) {
  const auto expected = targets.get<std::vector<double>>();
  REQUIRE(losses.size() == expected.size());
  for (std::size_t i = 0; i < losses.size(); ++i) {
    INFO(what, " step ", i, ": loss ", losses[i], ", PyTorch ", expected[i]);
    CHECK(std::abs(losses[i] - expected[i]) <= tolerance);
  }
}

}  // namespace

TEST_SUITE("keras") {
  TEST_CASE("Policy names its compute and variable dtypes as Keras does") {
    CHECK(Policy().name() == "float32");
    CHECK(Policy("mixed_float16").compute_dtype() == DType::float16);
    CHECK(Policy("mixed_float16").variable_dtype() == DType::float32);
    CHECK(Policy("mixed_bfloat16").compute_dtype() == DType::bfloat16);
    CHECK(Policy("mixed_bfloat16").variable_dtype() == DType::float32);
    CHECK(Policy("float16").variable_dtype() == DType::float16);
    CHECK(Policy("bfloat16").compute_dtype() == DType::bfloat16);
    CHECK_FALSE(Policy("float32").is_half());
    CHECK_THROWS_WITH_AS(Policy("mixed_float64"),
                         doctest::Contains("dtype policy: expected 'float32', 'mixed_float16', "
                                           "'mixed_bfloat16', 'float16' or 'bfloat16' but found "
                                           "'mixed_float64'"),
                         ConfigError);
  }

  TEST_CASE("set_global_policy gives new layers and models their policy") {
    {
      const GlobalPolicy scope("mixed_bfloat16");
      CHECK(mixed_precision::global_policy().name() == "mixed_bfloat16");
      layers::Dense dense(4);
      CHECK(dense.dtype_policy().name() == "mixed_bfloat16");
      Sequential model{Input({2}), layers::Dense(2)};
      CHECK(model.dtype_policy().name() == "mixed_bfloat16");
    }
    CHECK(mixed_precision::global_policy().name() == "float32");
    CHECK(layers::Dense(4).dtype_policy().name() == "float32");
  }

  TEST_CASE("Policy reads the dtype of tf.keras 2 and Keras 3 layer configs") {
    const std::string owner = "layer 'd' (Dense): config.dtype";
    CHECK(Policy::from_json("mixed_float16", owner).name() == "mixed_float16");
    CHECK(Policy::from_json({{"class_name", "Policy"}, {"config", {{"name", "mixed_bfloat16"}}}},
                            owner)
              .name() == "mixed_bfloat16");
    CHECK(Policy::from_json({{"module", "keras"},
                             {"class_name", "DTypePolicy"},
                             {"config", {{"name", "bfloat16"}}},
                             {"registered_name", nullptr}},
                            owner)
              .name() == "bfloat16");
    CHECK_THROWS_WITH_AS(Policy::from_json("int8", owner),
                         doctest::Contains("layer 'd' (Dense): config.dtype: dtype policy: "
                                           "expected 'float32'"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        Policy::from_json({{"class_name", "QuantizedDTypePolicy"}, {"config", {}}}, owner),
        doctest::Contains("expected a policy name, Policy or DTypePolicy but found the class "
                          "'QuantizedDTypePolicy'"),
        ConfigError);
    CHECK_THROWS_WITH_AS(Policy::from_json(3, owner),
                         doctest::Contains("layer 'd' (Dense): config.dtype: expected a policy "
                                           "name"),
                         ConfigError);
  }

  TEST_CASE("Layer configs write and read the dtype policy") {
    layers::Dense dense(3);
    dense.set_name("d");
    CHECK(dense.get_config()["dtype"] == "float32");
    dense.set_dtype_policy("mixed_float16");
    const nlohmann::json config = dense.get_config();
    CHECK(config["dtype"] ==
          nlohmann::json({{"class_name", "Policy"}, {"config", {{"name", "mixed_float16"}}}}));
    const auto back =
        Registry<Layer>::instance().create({{"class_name", "Dense"}, {"config", config}});
    CHECK(back->dtype_policy().name() == "mixed_float16");
    nlohmann::json keras3 = config;
    keras3["dtype"] = {{"module", "keras"},
                       {"class_name", "DTypePolicy"},
                       {"config", {{"name", "mixed_bfloat16"}}},
                       {"registered_name", nullptr}};
    CHECK(Registry<Layer>::instance()
              .create({{"class_name", "Dense"}, {"config", keras3}})
              ->dtype_policy()
              .name() == "mixed_bfloat16");
    keras3["dtype"] = "float64";
    CHECK_THROWS_WITH_AS(
        Registry<Layer>::instance().create({{"class_name", "Dense"}, {"config", keras3}}),
        doctest::Contains("dtype policy: expected 'float32', 'mixed_float16', 'mixed_bfloat16', "
                          "'float16' or 'bfloat16' but found 'float64'"),
        ConfigError);
  }

  TEST_CASE("Policy round-trips through the h5 and keras model files") {
    TempDir dir;
    for (const char* name : {"model.h5", "model.keras"}) {
      CAPTURE(name);
      auto model = [] {
        const GlobalPolicy scope("mixed_bfloat16");
        layers::Activation output("softmax");
        output.set_dtype_policy("float32");
        auto m = std::make_shared<Sequential>(
            std::initializer_list<SequentialItem>{Input({4}), layers::Dense(3), std::move(output)});
        m->compile({.optimizer = "sgd", .loss = "sparse_categorical_crossentropy"});
        return m;
      }();
      model->save(dir / name);
      auto loaded = load_model(dir / name);
      REQUIRE(loaded->layers().size() == 2);
      CHECK(loaded->layers()[0]->dtype_policy().name() == "mixed_bfloat16");
      CHECK(loaded->layers()[1]->dtype_policy().name() == "float32");
    }
  }

  TEST_CASE("round_to rounds to nearest even as Eigen's half and bfloat16 do") {
    auto backend = cpu_backend(1);
    // Every 4099th float bit pattern (all exponents and many mantissas), and the edges.
    std::vector<float> values;
    for (std::uint64_t bits = 0; bits <= 0xFFFFFFFFULL; bits += 4099) {
      const auto b = static_cast<std::uint32_t>(bits);
      float v = 0;
      std::memcpy(&v, &b, sizeof v);
      if (!std::isnan(v)) values.push_back(v);
    }
    for (const float v : {65504.0F, 65519.99F, 65520.0F, -65520.0F, 5.960464477539063e-08F,
                          2.98023223876953125e-08F, 2.9802326e-08F, 6.103515625e-05F, 0.0F, -0.0F,
                          1.0009765625F, 1.00048828125F, 1.00146484375F})
      values.push_back(v);
    Tensor<float> half(Shape{values.size()}, std::span<const float>(values));
    Tensor<float> brain = half.clone();
    backend->round_to(half, DType::float16);
    backend->round_to(brain, DType::bfloat16);
    std::size_t wrong_half = 0, wrong_brain = 0;
    for (std::size_t i = 0; i < values.size(); ++i) {
      const float h = static_cast<float>(float16(values[i]));
      const float b = static_cast<float>(bfloat16(values[i]));
      if (std::memcmp(&h, &half.data()[i], sizeof h) != 0) {
        if (wrong_half++ < 5) INFO(values[i], " -> ", half.data()[i], ", Eigen ", h);
      }
      if (std::memcmp(&b, &brain.data()[i], sizeof b) != 0) {
        if (wrong_brain++ < 5) INFO(values[i], " -> ", brain.data()[i], ", Eigen ", b);
      }
    }
    CHECK(wrong_half == 0);
    CHECK(wrong_brain == 0);
    CHECK(values.size() > 1000000);
  }

  TEST_CASE("half_bits and half_float convert as Eigen's half and bfloat16 do") {
    // What a half-precision matrix product reads (the CUDA backend's operands): the bits of the
    // rounded value, and back. Every 4099th float bit pattern, with the edges and NaNs.
    using keras::detail::HalfKind;
    std::size_t checked = 0, wrong = 0;
    const auto check_one = [&](float v) {
      ++checked;
      const float16 h(v);
      const bfloat16 b(v);
      std::uint16_t eigen_h = 0, eigen_b = 0;
      std::memcpy(&eigen_h, &h, sizeof eigen_h);
      std::memcpy(&eigen_b, &b, sizeof eigen_b);
      const std::uint16_t ours_h = keras::detail::half_bits(v, HalfKind::float16);
      const std::uint16_t ours_b = keras::detail::half_bits(v, HalfKind::bfloat16);
      const float back_h = keras::detail::half_float(ours_h, HalfKind::float16);
      const float back_b = keras::detail::half_float(ours_b, HalfKind::bfloat16);
      bool same = true;
      if (std::isnan(v)) {
        // NaN stays a NaN of the same sign (payloads may differ).
        same = (ours_h & 0x7C00U) == 0x7C00U && (ours_h & 0x3FFU) != 0 &&
               (ours_b & 0x7F80U) == 0x7F80U && (ours_b & 0x7FU) != 0 &&
               (ours_h >> 15U) == (ours_b >> 15U) && std::isnan(back_h) && std::isnan(back_b);
      } else {
        const float eigen_back_h = static_cast<float>(h), eigen_back_b = static_cast<float>(b);
        same = ours_h == eigen_h && ours_b == eigen_b &&
               std::memcmp(&back_h, &eigen_back_h, sizeof back_h) == 0 &&
               std::memcmp(&back_b, &eigen_back_b, sizeof back_b) == 0;
      }
      if (!same && wrong++ < 5) {
        INFO(v, ": float16 ", ours_h, " (Eigen ", eigen_h, "), bfloat16 ", ours_b, " (Eigen ",
             eigen_b, ")");
        CHECK(same);
      }
    };
    for (std::uint64_t bits = 0; bits <= 0xFFFFFFFFULL; bits += 4099) {
      const auto b = static_cast<std::uint32_t>(bits);
      float v = 0;
      std::memcpy(&v, &b, sizeof v);
      check_one(v);
    }
    for (const float v :
         {65504.0F, 65519.99F, 65520.0F, -65520.0F, 5.960464477539063e-08F,
          2.98023223876953125e-08F, 2.9802326e-08F, 6.103515625e-05F, 6.0975551605224609375e-05F,
          0.0F, -0.0F, 1.0009765625F, 1.00048828125F, -3.0517578125e-05F,
          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
          std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()})
      check_one(v);
    CHECK(wrong == 0);
    CHECK(checked > 1000000);
  }

  TEST_CASE("Dense under mixed_bfloat16 outputs bfloat16 values from bfloat16 weights") {
    const GlobalPolicy scope("mixed_bfloat16");
    Sequential model{Input({3}), layers::Dense(2, {.use_bias = false})};
    const std::vector<float> kernel{1.00390625F + 0.001F, 0.3F, 0.7F, 0.1F, 0.2F, 0.3F};
    model.set_weights({Tensor<float>(Shape{3, 2}, std::span<const float>(kernel))});
    const std::vector<float> xs{1.001F, 2.0F, 3.0F};
    const Tensor<float> x(Shape{1, 3}, std::span<const float>(xs));
    const Tensor<float> y = model.predict(x, {.verbose = 0});
    for (std::size_t j = 0; j < 2; ++j) {
      double sum = 0;
      for (std::size_t i = 0; i < 3; ++i) {
        sum += static_cast<double>(static_cast<float>(bfloat16(xs[i]))) *
               static_cast<float>(bfloat16(kernel[i * 2 + j]));
      }
      const float expected = static_cast<float>(bfloat16(static_cast<float>(sum)));
      CHECK(y.data()[j] == doctest::Approx(expected).epsilon(1e-7));
    }
    // The variables stay float32.
    CHECK(model.get_weights()[0].data()[0] == kernel[0]);
  }

  TEST_CASE("Sequential trains under mixed_bfloat16 as PyTorch does with the same rounding") {
    const auto& c = mixed_reference()["mlp"];
    const double lr = c["lr"].get<double>();
    auto model = mlp("mixed_bfloat16", optimizers::SGD({.learning_rate = lr}), c);
    const auto losses = train_losses(*model, c, {8});
    auto plain = mlp("float32", optimizers::SGD({.learning_rate = lr}), c);
    const auto float32_losses = train_losses(*plain, c, {8});
    check_losses("float32", float32_losses, c["float32_losses"], 2e-5);
    check_losses("mixed_bfloat16", losses, c["bfloat16_losses"], 1e-4);
    // The mixed run differs from the float32 one by more than the tolerance.
    CHECK(largest_difference(losses, float32_losses) > 1e-3);
    // torch.autocast's bfloat16 rounds at other points (no rounding of the bias before the add):
    // within bfloat16's tolerance.
    check_losses("autocast", losses, c["bfloat16_autocast_losses"], 2e-2);
  }

  TEST_CASE("Sequential trains under mixed_float16 with loss scaling as PyTorch does") {
    const auto& c = mixed_reference()["mlp"];
    const double lr = c["lr"].get<double>();
    auto model = mlp("mixed_float16", optimizers::SGD({.learning_rate = lr}), c);
    auto* scaling = dynamic_cast<optimizers::LossScaleOptimizer*>(&model->optimizer());
    REQUIRE(scaling != nullptr);
    CHECK(scaling->inner_optimizer().class_name() == "SGD");
    CHECK(scaling->loss_scale() == 32768.0F);
    const auto losses = train_losses(*model, c, {8});
    check_losses("mixed_float16", losses, c["float16_losses"], 2e-5);
    CHECK(largest_difference(losses, c["float32_losses"].get<std::vector<double>>()) > 1e-4);
    CHECK(model->optimizer().iterations() == 6);
  }

  TEST_CASE(
      "compile leaves the optimizer alone without mixed_float16 or with auto_scale_loss off") {
    const auto& c = mixed_reference()["mlp"];
    CHECK(mlp("mixed_bfloat16", optimizers::SGD(), c)->optimizer().class_name() == "SGD");
    CHECK(mlp("mixed_float16", optimizers::SGD(), c, false)->optimizer().class_name() == "SGD");
    CHECK(mlp("mixed_float16", optimizers::SGD(), c)->optimizer().class_name() ==
          "LossScaleOptimizer");
  }

  TEST_CASE("Conv2D trains under mixed_bfloat16 as PyTorch does with the same rounding") {
    const auto& c = mixed_reference()["cnn"];
    auto model = cnn("mixed_bfloat16", c);
    const auto losses = train_losses(*model, c, {8, 8, 1});
    check_losses("mixed_bfloat16", losses, c["bfloat16_losses"], 2e-4);
    auto plain = cnn("float32", c);
    const auto float32_losses = train_losses(*plain, c, {8, 8, 1});
    check_losses("float32", float32_losses, c["float32_losses"], 2e-5);
    CHECK(largest_difference(losses, float32_losses) > 2e-3);
  }

  TEST_CASE("LossScaleOptimizer halves the scale and skips the step on an overflow") {
    const auto& c = mixed_reference()["loss_scale_overflow"];
    const double lr = c["lr"].get<double>();
    auto inner = std::make_shared<optimizers::SGD>(optimizers::SGDOptions{.learning_rate = lr});
    auto scaling = std::make_shared<optimizers::LossScaleOptimizer>(
        inner, 32768.0, c["growth_interval"].get<std::int64_t>());
    auto model = mlp("mixed_float16", scaling, c);
    REQUIRE(&model->optimizer() == scaling.get());
    const auto expected_scales = c["scales"].get<std::vector<double>>();
    std::int64_t skipped = 0;
    for (std::size_t b = 0; b < c["x"].size(); ++b) {
      const Tensor<float> x = batch_tensor(c["x"][b], {16, 8});
      const Tensor<float> y = batch_tensor(c["y"][b], {16});
      const double previous = scaling->loss_scale();
      model->reset_metrics();
      const double loss = *model->train_step(std::tie(x, y)).get("loss");
      INFO("step ", b, ": loss ", loss, ", scale ", scaling->loss_scale());
      CHECK(scaling->loss_scale() == expected_scales[b]);
      if (scaling->loss_scale() < previous) ++skipped;
      if (!c["losses"][b].is_null()) {
        CHECK(std::abs(loss - c["losses"][b].get<double>()) <= 2e-5);
      } else {
        CHECK_FALSE(std::isfinite(loss));
      }
    }
    CHECK(skipped == 2);
    // Skipped steps are not counted (Keras's iterations are the inner optimizer's).
    CHECK(model->optimizer().iterations() == static_cast<std::int64_t>(c["x"].size()) - skipped);
  }

  TEST_CASE("LossScaleOptimizer round-trips its config and refuses bad arguments") {
    optimizers::LossScaleOptimizer scaling(std::make_shared<optimizers::Adam>(), 1024.0, 10);
    const nlohmann::json config = scaling.get_config();
    CHECK(config["inner_optimizer"]["class_name"] == "Adam");
    CHECK(config["inner_optimizer"]["module"] == "keras.optimizers");
    CHECK(config["initial_scale"] == 1024.0);
    CHECK(config["dynamic_growth_steps"] == 10);
    auto back = Registry<Optimizer>::instance().create(
        {{"class_name", "LossScaleOptimizer"}, {"config", config}});
    auto* read = dynamic_cast<optimizers::LossScaleOptimizer*>(back.get());
    REQUIRE(read != nullptr);
    CHECK(read->loss_scale() == 1024.0F);
    CHECK(read->dynamic_growth_steps() == 10);
    CHECK(read->inner_optimizer().class_name() == "Adam");
    nlohmann::json bad = config;
    bad["dynamic"] = false;
    CHECK_THROWS_WITH_AS(Registry<Optimizer>::instance().create(
                             {{"class_name", "LossScaleOptimizer"}, {"config", bad}}),
                         doctest::Contains("config.dynamic: expected true"), ConfigError);
    bad = config;
    bad["clipnorm"] = 1.0;
    CHECK_THROWS_WITH_AS(Registry<Optimizer>::instance().create(
                             {{"class_name", "LossScaleOptimizer"}, {"config", bad}}),
                         doctest::Contains("config.clipnorm: expected null (set it on the "
                                           "inner_optimizer)"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(optimizers::LossScaleOptimizer(nullptr),
                         doctest::Contains("loss scale optimizer 'loss_scale_optimizer': the "
                                           "inner optimizer is null"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(optimizers::LossScaleOptimizer(std::make_shared<optimizers::SGD>(), 0.0),
                         doctest::Contains("initial_scale must be a positive finite number"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        optimizers::LossScaleOptimizer(std::make_shared<optimizers::SGD>(), 8.0, 0),
        doctest::Contains("dynamic_growth_steps must be at least 1 but is 0"), ConfigError);
  }

  TEST_CASE("LossScaleOptimizer state resumes bitwise through both model files") {
    const auto& c = mixed_reference()["loss_scale_overflow"];
    TempDir dir;
    for (const char* name : {"model.h5", "model.keras"}) {
      CAPTURE(name);
      const auto make = [&] {
        auto scaling = std::make_shared<optimizers::LossScaleOptimizer>(
            std::make_shared<optimizers::Adam>(optimizers::AdamOptions{.learning_rate = 0.01}),
            32768.0, 3);
        return mlp("mixed_float16", scaling, c);
      };
      auto whole = make();
      auto first = make();
      const auto run = [&](Model& model, std::size_t from, std::size_t to) {
        for (std::size_t b = from; b < to; ++b) {
          const Tensor<float> x = batch_tensor(c["x"][b], {16, 8});
          const Tensor<float> y = batch_tensor(c["y"][b], {16});
          model.train_step(std::tie(x, y));
        }
      };
      run(*whole, 0, c["x"].size());
      run(*first, 0, 6);  // past the overflow of batch 4: scale and counter changed
      first->save(dir / name);
      auto resumed = load_model(dir / name);
      auto* scaling = dynamic_cast<optimizers::LossScaleOptimizer*>(&resumed->optimizer());
      REQUIRE(scaling != nullptr);
      auto* before = dynamic_cast<optimizers::LossScaleOptimizer*>(&first->optimizer());
      CHECK(scaling->loss_scale() == before->loss_scale());
      CHECK(scaling->step_counter() == before->step_counter());
      CHECK(scaling->step_counter() == 1);
      CHECK(resumed->optimizer().iterations() == 5);
      CHECK(resumed->layers()[0]->dtype_policy().name() == "mixed_float16");
      run(*resumed, 6, c["x"].size());
      const auto expected = whole->get_weights();
      const auto got = resumed->get_weights();
      REQUIRE(expected.size() == got.size());
      for (std::size_t i = 0; i < got.size(); ++i)
        CHECK(std::memcmp(expected[i].data(), got[i].data(), got[i].size() * sizeof(float)) == 0);
      CHECK(dynamic_cast<optimizers::LossScaleOptimizer*>(&resumed->optimizer())->loss_scale() ==
            dynamic_cast<optimizers::LossScaleOptimizer*>(&whole->optimizer())->loss_scale());
    }
  }

  TEST_CASE("Model refuses a value read by layers that cast it to different dtypes") {
    KerasTensor input = Input({4}, "x");
    layers::Dense a(2);
    a.set_name("a");
    a.set_dtype_policy("mixed_float16");
    layers::Dense b(2);
    b.set_name("b");
    b.set_dtype_policy("mixed_bfloat16");
    KerasTensor ya = call(std::move(a), input);
    KerasTensor yb = call(std::move(b), input);
    Model model(input, std::vector<KerasTensor>{ya, yb});
    model.compile({.optimizer = "sgd", .loss = "mse"});
    const Tensor<float> x(Shape{2, 4});
    CHECK_THROWS_WITH_AS(model.predict_outputs(x, {.verbose = 0}),
                         doctest::Contains("the output of input 0 is read by layers that cast it "
                                           "to different dtypes (float16 and bfloat16 in layer "
                                           "'b'); loadstar rounds a value once"),
                         ConfigError);
  }

  TEST_CASE("Model rounds the variables of a bfloat16 policy after each update") {
    const GlobalPolicy scope("bfloat16");
    Sequential model{Input({2}), layers::Dense(2)};
    model.compile({.optimizer = optimizers::SGD({.learning_rate = 0.0123}), .loss = "mse"});
    const std::vector<float> xs{0.3F, -1.1F, 0.7F, 0.2F};
    const Tensor<float> x(Shape{2, 2}, std::span<const float>(xs));
    const Tensor<float> y(Shape{2, 2}, std::span<const float>(xs));
    model.train_on_batch(x, y);
    for (const auto& w : model.get_weights())
      for (const float v : w)
        CHECK(v == static_cast<float>(bfloat16(v)));
  }

  TEST_CASE("Model refuses an activity regularizer under loss scaling") {
    const GlobalPolicy scope("mixed_float16");
    auto dense = std::make_shared<layers::Dense>(2);
    dense->set_name("d");
    dense->set_activity_regularizer(std::make_shared<regularizers::L2>(0.1));
    Sequential model{Input({2}), dense};
    model.compile({.optimizer = "sgd", .loss = "mse"});
    const Tensor<float> x(Shape{2, 2});
    CHECK_THROWS_WITH_AS(model.train_on_batch(x, x),
                         doctest::Contains("layer 'd' has an activity regularizer, which loadstar "
                                           "does not combine with loss scaling "
                                           "(LossScaleOptimizer)"),
                         ConfigError);
  }
}

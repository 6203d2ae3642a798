#include <doctest/doctest.h>

#include "reference_values.hpp"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <loadstar/error.hpp>
#include <loadstar/keras/optimizers.hpp>
#include <loadstar/tensor.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

using loadstar::ConfigError;
using loadstar::Shape;
using loadstar::Tensor;
using loadstar::keras::get_optimizer;
using loadstar::keras::Variable;
namespace optimizers = loadstar::keras::optimizers;
namespace schedules = loadstar::keras::optimizers::schedules;

using reference_values::check_close;
using reference_values::reference;
using reference_values::tensor_of;

namespace {

std::shared_ptr<const schedules::LearningRateSchedule> make_schedule(const nlohmann::json& s) {
  const std::string kind = s["schedule"];
  const auto& a = s["args"];
  if (kind == "ExponentialDecay") {
    return std::make_shared<schedules::ExponentialDecay>(
        a["initial_learning_rate"], a["decay_steps"], a["decay_rate"], a["staircase"]);
  }
  if (kind == "PiecewiseConstantDecay") {
    return std::make_shared<schedules::PiecewiseConstantDecay>(
        a["boundaries"].get<std::vector<std::int64_t>>(), a["values"].get<std::vector<double>>());
  }
  return std::make_shared<schedules::CosineDecay>(a["initial_learning_rate"], a["decay_steps"],
                                                  a["alpha"]);
}

template <class Options>
void common(Options& options, const nlohmann::json& o) {
  if (o.contains("learning_rate")) {
    if (o["learning_rate"].is_object()) {
      options.learning_rate = make_schedule(o["learning_rate"]);
    } else {
      options.learning_rate = o["learning_rate"].get<double>();
    }
  }
  if (o.contains("clipnorm")) options.clipnorm = o["clipnorm"].get<double>();
  if (o.contains("global_clipnorm")) options.global_clipnorm = o["global_clipnorm"].get<double>();
  if (o.contains("clipvalue")) options.clipvalue = o["clipvalue"].get<double>();
}

std::unique_ptr<loadstar::keras::Optimizer> make_optimizer(const std::string& kind,
                                                           const nlohmann::json& o) {
  if (kind == "sgd") {
    optimizers::SGDOptions options;
    common(options, o);
    options.momentum = o.value("momentum", 0.0);
    options.nesterov = o.value("nesterov", false);
    return std::make_unique<optimizers::SGD>(options);
  }
  if (kind == "adam") {
    optimizers::AdamOptions options;
    common(options, o);
    options.beta_1 = o.value("beta_1", 0.9);
    options.beta_2 = o.value("beta_2", 0.999);
    options.epsilon = o.value("epsilon", 1e-7);
    options.amsgrad = o.value("amsgrad", false);
    return std::make_unique<optimizers::Adam>(options);
  }
  if (kind == "adamw") {
    optimizers::AdamWOptions options;
    common(options, o);
    options.weight_decay = o.value("weight_decay", 0.004);
    return std::make_unique<optimizers::AdamW>(options);
  }
  if (kind == "rmsprop") {
    optimizers::RMSpropOptions options;
    common(options, o);
    options.momentum = o.value("momentum", 0.0);
    options.centered = o.value("centered", false);
    return std::make_unique<optimizers::RMSprop>(options);
  }
  if (kind == "adagrad") {
    optimizers::AdagradOptions options;
    common(options, o);
    options.initial_accumulator_value = o.value("initial_accumulator_value", 0.1);
    return std::make_unique<optimizers::Adagrad>(options);
  }
  optimizers::AdadeltaOptions options;
  common(options, o);
  options.rho = o.value("rho", 0.95);
  return std::make_unique<optimizers::Adadelta>(options);
}

}  // namespace

TEST_SUITE("keras") {
  TEST_CASE("Optimizer steps match the PyTorch reference of Keras's formulas") {
    // Four float32 steps against float64: 1e-6 absolute plus 1e-5 relative.
    for (const auto& c : reference()["optimizers"]) {
      const std::string kind = c["optimizer"];
      const std::string options = c["options"].dump();
      CAPTURE(kind);
      CAPTURE(options);
      auto optimizer = make_optimizer(kind, c["options"]);
      std::vector<Variable> variables;
      for (std::size_t i = 0; i < c["weights"].size(); ++i) {
        variables.push_back(
            Variable{i == 0 ? "kernel" : "bias", tensor_of(c["weights"][i], c["shapes"][i]),
                     Tensor<float>(Shape(c["shapes"][i].get<std::vector<std::size_t>>())), true});
      }
      Variable frozen{"moving_mean", Tensor<float>({2}, 1.0f), Tensor<float>(), false};
      std::vector<Variable*> pointers{&variables[0], &frozen, &variables[1]};
      for (const auto& step : c["gradients"]) {
        for (std::size_t i = 0; i < variables.size(); ++i) {
          const auto g = step[i].get<std::vector<float>>();
          std::copy(g.begin(), g.end(), variables[i].gradient.begin());
        }
        optimizer->apply_gradients(pointers);
      }
      CHECK(optimizer->iterations() == static_cast<std::int64_t>(c["gradients"].size()));
      CHECK(frozen.value.data()[0] == 1.0f);
      for (std::size_t i = 0; i < variables.size(); ++i) {
        check_close(kind + " weight " + std::to_string(i), variables[i].value.span(),
                    c["expected"][i].get<std::vector<double>>(), 1e-6, 1e-5);
      }
    }
  }

  TEST_CASE("LearningRateSchedule values match the reference") {
    for (const auto& s : reference()["schedules"]) {
      const std::string kind = s["schedule"];
      auto schedule = make_schedule(s);
      std::vector<float> values;
      for (const auto& step : s["steps"])
        values.push_back(static_cast<float>((*schedule)(step.get<std::int64_t>())));
      check_close(kind, values, s["values"].get<std::vector<double>>(), 1e-9, 1e-6);
    }
  }

  TEST_CASE("Optimizer names its slots the Keras way in variable order") {
    Variable kernel{"kernel", Tensor<float>({2}), Tensor<float>({2}), true};
    Variable bias{"bias", Tensor<float>({1}), Tensor<float>({1}), true};
    std::vector<Variable*> variables{&kernel, &bias};
    auto names = [&](loadstar::keras::Optimizer& optimizer) {
      optimizer.apply_gradients(variables);
      std::vector<std::string> out;
      for (const auto& v : optimizer.variables())
        out.push_back(v.name);
      return out;
    };
    optimizers::Adam amsgrad({.amsgrad = true});
    CHECK(names(amsgrad) == std::vector<std::string>{"m/kernel", "v/kernel", "vhat/kernel",
                                                     "m/bias", "v/bias", "vhat/bias"});
    optimizers::SGD momentum({.momentum = 0.9});
    CHECK(names(momentum) == std::vector<std::string>{"momentum/kernel", "momentum/bias"});
    optimizers::SGD plain;
    CHECK(names(plain).empty());
    optimizers::RMSprop rmsprop({.momentum = 0.5, .centered = true});
    CHECK(names(rmsprop) == std::vector<std::string>{"velocity/kernel", "momentum/kernel",
                                                     "average_gradient/kernel", "velocity/bias",
                                                     "momentum/bias", "average_gradient/bias"});
    optimizers::Adagrad adagrad;
    CHECK(names(adagrad) == std::vector<std::string>{"accumulator/kernel", "accumulator/bias"});
    CHECK(adagrad.variables()[0].value.data()[0] == doctest::Approx(0.1));
    optimizers::Adadelta adadelta;
    CHECK(names(adadelta)[1] == "accumulated_delta_var/kernel");
  }

  TEST_CASE("Optimizer takes a schedule and set_learning_rate replaces it") {
    optimizers::SGD sgd({.learning_rate = schedules::ExponentialDecay(0.1, 1, 0.5)});
    CHECK(sgd.learning_rate() == doctest::Approx(0.1));
    sgd.set_iterations(2);
    CHECK(sgd.learning_rate() == doctest::Approx(0.025));
    sgd.set_learning_rate(0.3);
    CHECK(sgd.learning_rate() == doctest::Approx(0.3));
  }

  TEST_CASE("Optimizer rejects clipnorm with global_clipnorm and bad schedules") {
    CHECK_THROWS_WITH_AS(
        optimizers::Adam({.clipnorm = 1.0, .global_clipnorm = 2.0}),
        doctest::Contains(
            "Adam: at most one of clipnorm and global_clipnorm can be set but clipnorm is 1.0"),
        ConfigError);
    CHECK_THROWS_WITH_AS(
        schedules::PiecewiseConstantDecay({1, 2}, {0.1}),
        doctest::Contains("PiecewiseConstantDecay: values must have one more element than "
                          "boundaries but there are 1 values and 2 boundaries"),
        ConfigError);
    CHECK_THROWS_WITH_AS(
        schedules::ExponentialDecay(0.1, 0, 0.5),
        doctest::Contains("ExponentialDecay: decay_steps must be positive but is 0"), ConfigError);
    Variable broken{"kernel", Tensor<float>({2}), Tensor<float>({3}), true};
    std::vector<Variable*> variables{&broken};
    optimizers::SGD sgd;
    CHECK_THROWS_WITH_AS(
        sgd.apply_gradients(variables),
        doctest::Contains("SGD: variable 'kernel' has shape (2,) but its gradient has shape (3,)"),
        loadstar::ShapeError);
  }

  TEST_CASE("get_optimizer resolves names case-insensitively and rejects unknown names") {
    CHECK(get_optimizer("Adam")->class_name() == "Adam");
    CHECK(get_optimizer("sgd")->learning_rate() == doctest::Approx(0.01));
    CHECK(get_optimizer("RMSprop")->class_name() == "RMSprop");
    CHECK_THROWS_WITH_AS(get_optimizer("foo"),
                         doctest::Contains("unknown optimizer 'foo'; known: sgd"), ConfigError);
  }

  TEST_CASE("Adam creates its slots on the first step and names them the Keras way") {
    Variable kernel{"kernel", Tensor<float>({2}, {1, 2}), Tensor<float>({2}, {0.5f, -1}), true};
    std::vector<Variable*> variables{&kernel};
    optimizers::Adam adam;
    adam.apply_gradients(variables);
    REQUIRE(adam.variables().size() == 2);
    CHECK(adam.variables()[0].name == "m/kernel");
    CHECK(adam.variables()[1].name == "v/kernel");
    CHECK(kernel.value.data()[0] == doctest::Approx(1 - 0.001));
    CHECK(adam.iterations() == 1);
  }
}

namespace {

// The checked-in reference values of tests/keras/generate_optimizers_34.py.
const nlohmann::json& reference_34() {
  static const nlohmann::json json = [] {
    const char* root = std::getenv("LOADSTAR_SOURCE_DIR");
    REQUIRE_MESSAGE(root != nullptr, "LOADSTAR_SOURCE_DIR is not set");
    std::ifstream in(std::string(root) + "/tests/keras/reference/optimizers_34.json");
    REQUIRE_MESSAGE(in.good(), "cannot open tests/keras/reference/optimizers_34.json");
    return nlohmann::json::parse(in);
  }();
  return json;
}

// A reference case's optimizer, made from its Keras config through the registry (so that every
// option is read the way a model file's is), with the schedule as Keras serialises it.
std::unique_ptr<loadstar::keras::Optimizer> optimizer_from_case(const std::string& kind,
                                                                nlohmann::json options) {
  if (options.contains("learning_rate") && options["learning_rate"].is_object()) {
    const auto schedule = options["learning_rate"];
    options["learning_rate"] = {{"class_name", schedule["schedule"]}, {"config", schedule["args"]}};
  }
  return loadstar::keras::Registry<loadstar::keras::Optimizer>::instance().create(
      {{"class_name", kind}, {"config", options}});
}

// Runs a reference case's steps on `kernel`, a frozen variable and `bias`.
struct CaseRun {
  std::vector<Variable> variables;
  Variable frozen{"moving_mean", Tensor<float>({2}, 1.0f), Tensor<float>(), false};
  std::vector<Variable*> pointers;
};

void run_case(const nlohmann::json& c, loadstar::keras::Optimizer& optimizer, CaseRun& run) {
  for (std::size_t i = 0; i < c["weights"].size(); ++i) {
    run.variables.push_back(
        Variable{i == 0 ? "kernel" : "bias", tensor_of(c["weights"][i], c["shapes"][i]),
                 Tensor<float>(Shape(c["shapes"][i].get<std::vector<std::size_t>>())), true});
  }
  run.pointers = {&run.variables[0], &run.frozen, &run.variables[1]};
  if (c.contains("exclude_from_weight_decay")) {
    const auto& exclude = c["exclude_from_weight_decay"];
    std::vector<const Variable*> var_list;
    for (const auto& i : exclude.value("var_list", nlohmann::json::array()))
      var_list.push_back(&run.variables[i.get<std::size_t>()]);
    optimizer.exclude_from_weight_decay(var_list,
                                        exclude.value("var_names", std::vector<std::string>{}));
  }
  for (const auto& step : c["gradients"]) {
    for (std::size_t i = 0; i < run.variables.size(); ++i) {
      const auto g = step[i].get<std::vector<float>>();
      std::copy(g.begin(), g.end(), run.variables[i].gradient.begin());
    }
    optimizer.apply_gradients(run.pointers);
  }
}

}  // namespace

TEST_SUITE("keras") {
  TEST_CASE("Nadam Adamax Lion Ftrl and Adafactor steps match Keras 3's formulas in NumPy") {
    // Five float32 steps against float64: 1e-6 absolute plus 1e-5 relative. The cases include
    // clipping, weight decay on every optimizer (and exclude_from_weight_decay), moving averages
    // and schedules.
    for (const auto& c : reference_34()["optimizers"]) {
      const std::string kind = c["optimizer"];
      const std::string options = c["options"].dump();
      CAPTURE(kind);
      CAPTURE(options);
      auto optimizer = optimizer_from_case(kind, c["options"]);
      CaseRun run;
      run_case(c, *optimizer, run);
      CHECK(optimizer->iterations() == static_cast<std::int64_t>(c["gradients"].size()));
      CHECK(run.frozen.value.data()[0] == 1.0f);
      for (std::size_t i = 0; i < run.variables.size(); ++i) {
        check_close(kind + " weight " + std::to_string(i), run.variables[i].value.span(),
                    c["expected"][i].get<std::vector<double>>(), 1e-6, 1e-5);
      }
      if (c.contains("averages")) {
        // The moving averages are the optimizer's last variables, then finalize_variable_values
        // copies them into the weights.
        const auto slots = optimizer->variables();
        REQUIRE(slots.size() >= 2);
        for (std::size_t i = 0; i < 2; ++i) {
          const Variable& average = slots[slots.size() - 2 + i];
          CHECK(average.name == "average/" + run.variables[i].name);
          check_close(kind + " average " + std::to_string(i), average.value.span(),
                      c["averages"][i].get<std::vector<double>>(), 1e-6, 1e-5);
        }
        optimizer->finalize_variable_values(run.pointers);
        for (std::size_t i = 0; i < run.variables.size(); ++i) {
          check_close(kind + " finalized weight " + std::to_string(i),
                      run.variables[i].value.span(), c["averages"][i].get<std::vector<double>>(),
                      1e-6, 1e-5);
        }
      }
    }
  }

  TEST_CASE("CosineDecay warmup CosineDecayRestarts and PolynomialDecay match Keras 3's formulas") {
    for (const auto& s : reference_34()["schedules"]) {
      const std::string kind = s["schedule"];
      const std::string args = s["args"].dump();
      CAPTURE(args);
      const auto schedule =
          loadstar::keras::Registry<schedules::LearningRateSchedule>::instance().create(
              {{"class_name", kind}, {"config", s["args"]}});
      std::vector<float> values;
      for (const auto& step : s["steps"])
        values.push_back(static_cast<float>((*schedule)(step.get<std::int64_t>())));
      check_close(kind, values, s["values"].get<std::vector<double>>(), 1e-9, 1e-6);
      // get_config round trip: the same values again.
      const auto again =
          loadstar::keras::Registry<schedules::LearningRateSchedule>::instance().create(
              {{"class_name", kind}, {"config", schedule->get_config()}});
      for (const auto& step : s["steps"])
        CHECK((*again)(step.get<std::int64_t>()) == (*schedule)(step.get<std::int64_t>()));
    }
  }

  TEST_CASE("get_optimizer knows nadam adamax lion ftrl and adafactor with Keras's defaults") {
    const auto nadam = get_optimizer("Nadam")->get_config();
    CHECK(nadam["learning_rate"] == 0.001);
    CHECK(nadam["beta_1"] == 0.9);
    CHECK(nadam["beta_2"] == 0.999);
    CHECK(nadam["epsilon"] == 1e-7);
    CHECK(nadam["weight_decay"].is_null());
    CHECK(nadam["use_ema"] == false);
    CHECK(nadam["ema_momentum"] == 0.99);
    CHECK(nadam["loss_scale_factor"].is_null());
    CHECK(get_optimizer("adamax")->get_config()["beta_2"] == 0.999);
    CHECK(get_optimizer("lion")->get_config()["beta_2"] == 0.99);
    const auto ftrl = get_optimizer("Ftrl")->get_config();
    CHECK(ftrl["learning_rate_power"] == -0.5);
    CHECK(ftrl["initial_accumulator_value"] == 0.1);
    CHECK(ftrl["l2_shrinkage_regularization_strength"] == 0.0);
    CHECK(ftrl["beta"] == 0.0);
    const auto adafactor = get_optimizer("Adafactor")->get_config();
    CHECK(adafactor["beta_2_decay"] == -0.8);
    CHECK(adafactor["epsilon_1"] == 1e-30);
    CHECK(adafactor["epsilon_2"] == 1e-3);
    CHECK(adafactor["clip_threshold"] == 1.0);
    CHECK(adafactor["relative_step"] == true);
    for (const char* name : {"Nadam", "Adamax", "Lion", "Ftrl", "Adafactor"})
      CHECK(get_optimizer(name)->class_name() == name);
  }

  TEST_CASE("Optimizer get_config and from_config round trip every new option") {
    const std::vector<nlohmann::json> configs = {
        {{"class_name", "Nadam"},
         {"config",
          {{"learning_rate", 0.01}, {"beta_1", 0.8}, {"weight_decay", 0.1}, {"clipnorm", 2.0}}}},
        {{"class_name", "Ftrl"},
         {"config",
          {{"learning_rate_power", -0.7},
           {"initial_accumulator_value", 0.2},
           {"l1_regularization_strength", 0.05},
           {"l2_regularization_strength", 0.1},
           {"l2_shrinkage_regularization_strength", 0.02},
           {"beta", 0.3}}}},
        {{"class_name", "Adafactor"},
         {"config",
          {{"beta_2_decay", -0.5},
           {"epsilon_1", 1e-20},
           {"relative_step", false},
           {"use_ema", true},
           {"ema_momentum", 0.9},
           {"ema_overwrite_frequency", 5}}}},
        {{"class_name", "SGD"},
         {"config",
          {{"learning_rate",
            {{"class_name", "PolynomialDecay"},
             {"config", {{"initial_learning_rate", 0.1}, {"decay_steps", 10}}}}},
           {"weight_decay", 0.01}}}},
    };
    auto& registry = loadstar::keras::Registry<loadstar::keras::Optimizer>::instance();
    for (const auto& config : configs) {
      const auto first = registry.create(config);
      const auto written = first->get_config();
      CAPTURE(written.dump());
      for (const auto& [key, value] : config["config"].items())
        if (key != "learning_rate") CHECK(written[key] == value);
      const auto second =
          registry.create({{"class_name", config["class_name"]}, {"config", written}});
      CHECK(second->get_config() == written);
    }
    auto adamw = registry.create({{"class_name", "AdamW"}, {"config", nlohmann::json::object()}});
    CHECK(adamw->get_config()["weight_decay"] == 0.004);
  }

  TEST_CASE("Optimizer rejects bad values of the new options and the options loadstar lacks") {
    auto& registry = loadstar::keras::Registry<loadstar::keras::Optimizer>::instance();
    const auto make = [&](const char* kind, nlohmann::json config) {
      return registry.create({{"class_name", kind}, {"config", std::move(config)}});
    };
    CHECK_THROWS_WITH_AS(make("Adam", {{"loss_scale_factor", 128.0}}),
                         doctest::Contains("loss_scale_factor"), ConfigError);
    CHECK_THROWS_WITH_AS(make("SGD", {{"gradient_accumulation_steps", 4}}),
                         doctest::Contains("gradient_accumulation_steps"), ConfigError);
    CHECK_NOTHROW(
        make("SGD", {{"loss_scale_factor", nullptr}, {"gradient_accumulation_steps", nullptr}}));
    CHECK_THROWS_WITH_AS(
        make("AdamW", {{"weight_decay", nullptr}}),
        doctest::Contains("weight_decay: expected a number (AdamW decays weights)"), ConfigError);
    CHECK_THROWS_WITH_AS(optimizers::Lion({.beta_1 = 0.0}),
                         doctest::Contains("Lion: beta_1 must be in (0, 1] but is 0.0"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        optimizers::Ftrl({.learning_rate_power = 0.5}),
        doctest::Contains("Ftrl: learning_rate_power must be negative or zero but is 0.5"),
        ConfigError);
    CHECK_THROWS_WITH_AS(
        optimizers::Ftrl({.initial_accumulator_value = -1.0}),
        doctest::Contains("Ftrl: initial_accumulator_value must be positive or zero but is -1.0"),
        ConfigError);
    CHECK_THROWS_WITH_AS(optimizers::Ftrl({.l1_regularization_strength = -0.1}),
                         doctest::Contains("Ftrl: l1_regularization_strength must be positive"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(optimizers::Nadam({.use_ema = true, .ema_momentum = 1.5}),
                         doctest::Contains("Nadam: ema_momentum must be in [0, 1] but is 1.5"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        optimizers::SGD({.use_ema = true, .ema_overwrite_frequency = 0}),
        doctest::Contains("SGD: ema_overwrite_frequency must be at least 1 or null but is 0"),
        ConfigError);
    CHECK_THROWS_WITH_AS(schedules::CosineDecayRestarts(0.1, 0),
                         doctest::Contains("CosineDecayRestarts: first_decay_steps must be "
                                           "positive but is 0"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        schedules::PolynomialDecay(0.1, -1),
        doctest::Contains("PolynomialDecay: decay_steps must be positive but is -1"), ConfigError);
    CHECK_THROWS_WITH_AS(
        schedules::CosineDecay(0.1, 10, 0.0, 0.2, -1),
        doctest::Contains("CosineDecay: warmup_steps must be positive or zero but is -1"),
        ConfigError);
  }

  TEST_CASE("Adafactor factors the second moments of variables of rank 2 or more") {
    Variable kernel{"kernel", Tensor<float>({2, 3, 4}), Tensor<float>({2, 3, 4}, 0.5f), true};
    Variable bias{"bias", Tensor<float>({4}), Tensor<float>({4}, 0.5f), true};
    std::vector<Variable*> variables{&kernel, &bias};
    optimizers::Adafactor adafactor;
    adafactor.apply_gradients(variables);
    const auto slots = adafactor.variables();
    REQUIRE(slots.size() == 6);
    CHECK(slots[0].name == "r/kernel");
    CHECK(slots[0].value.shape() == Shape{2, 3});
    CHECK(slots[1].name == "c/kernel");
    CHECK(slots[1].value.shape() == Shape{2, 4});
    CHECK(slots[2].name == "v/kernel");
    CHECK(slots[2].value.shape() == Shape{2, 3, 4});
    CHECK(slots[3].value.shape() == Shape{});  // Keras's scalar placeholders
    CHECK(slots[4].value.shape() == Shape{});
    CHECK(slots[5].value.shape() == Shape{4});
  }

  TEST_CASE("exclude_from_weight_decay is refused once built for a bad pattern and without decay") {
    const auto variable = [](const char* name) {
      return Variable{name, Tensor<float>({2}, {1, 2}), Tensor<float>({2}, 0.0F), true};
    };
    // A LossScaleOptimizer passes the call to the optimizer it wraps: with zero gradients only
    // the weight decay moves the weights, and it skips the kernel.
    auto sgd = std::make_shared<optimizers::SGD>(
        optimizers::SGDOptions{.learning_rate = 0.1, .weight_decay = 0.5});
    optimizers::LossScaleOptimizer scaling(sgd);
    Variable kernel = variable("kernel"), bias = variable("bias");
    std::vector<Variable*> both{&kernel, &bias};
    scaling.exclude_from_weight_decay({}, {"kern"});
    scaling.apply_gradients(both);
    CHECK(kernel.value.data()[1] == 2.0F);
    CHECK(bias.value.data()[1] == doctest::Approx(2.0 * 0.95));
    CHECK_THROWS_WITH_AS(
        sgd->exclude_from_weight_decay({}, {"bias"}),
        doctest::Contains("exclude_from_weight_decay: expected to be called before the optimizer "
                          "is built but it is built (for 2 trainable variables)"),
        ConfigError);
    optimizers::Adam adam;
    CHECK_THROWS_WITH_AS(adam.exclude_from_weight_decay({}, {"bias", "(unclosed"}),
                         doctest::Contains("expected var_names to be regular expressions but "
                                           "found '(?:bias)|(?:(unclosed)'"),
                         ConfigError);
    // An optimizer of the user's own, without weight decay.
    struct Plain : loadstar::keras::Optimizer {
      Plain() : Optimizer("plain") {}
      std::string class_name() const override { return "Plain"; }
      void apply_gradients(std::span<Variable*>) override {}
      double learning_rate() const override { return 0.0; }
      void set_learning_rate(double) override {}
      std::span<Variable> variables() noexcept override { return {}; }
    } plain;
    const std::vector<const Variable*> excluded{&kernel};
    CHECK_THROWS_WITH_AS(plain.exclude_from_weight_decay(excluded),
                         "plain (Plain): exclude_from_weight_decay: expected an optimizer with a "
                         "weight_decay option but found one without",
                         ConfigError);
  }

  TEST_CASE("Nadam recomputes its momentum product when the step goes back") {
    // Its step at iteration 1 after set_iterations(1) is the step a fresh Nadam takes at
    // iteration 1 from the same slots.
    const auto variable = [] {
      return Variable{"kernel", Tensor<float>({2}, {1, 2}), Tensor<float>({2}, {0.5f, -1}), true};
    };
    Variable a = variable(), b = variable();
    std::vector<Variable*> va{&a}, vb{&b};
    optimizers::Nadam rewound, fresh;
    for (int i = 0; i < 3; ++i)
      rewound.apply_gradients(va);
    fresh.apply_gradients(vb);
    for (std::size_t k = 0; k < 2; ++k) {
      std::copy(rewound.variables()[k].value.begin(), rewound.variables()[k].value.end(),
                fresh.variables()[k].value.begin());
    }
    std::copy(a.value.begin(), a.value.end(), b.value.begin());
    rewound.set_iterations(1);
    rewound.apply_gradients(va);
    fresh.apply_gradients(vb);
    CHECK(a.value.data()[0] == b.value.data()[0]);
    CHECK(a.value.data()[1] == b.value.data()[1]);
  }
}

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

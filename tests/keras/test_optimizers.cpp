#include <doctest/doctest.h>

#include <loadstar/error.hpp>
#include <loadstar/keras/optimizers.hpp>
#include <loadstar/tensor.hpp>

using loadstar::ConfigError;
using loadstar::Tensor;
using loadstar::keras::get_optimizer;
using loadstar::keras::Variable;
namespace optimizers = loadstar::keras::optimizers;

TEST_SUITE("keras") {
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

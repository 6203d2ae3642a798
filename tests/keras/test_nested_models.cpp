// Model files as Keras users bring them: every layer class loadstar lacks named at once, an
// initializer loadstar cannot build kept with a warning, Keras's order of a functional model's
// layers, and Keras 3's module fields.
#include <doctest/doctest.h>

#include <H5Cpp.h>

#include <cstdlib>
#include <filesystem>
#include <loadstar/keras.hpp>
#include <loadstar/keras/saving/detail/formats.hpp>
#include <loadstar/keras/warnings.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "keras/saving_support.hpp"
#include "temp_dir.hpp"

using namespace loadstar;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;
using namespace saving_support;
using test_support::TempDir;

namespace {

std::optional<std::filesystem::path> nested_fixture(const std::string& name) {
  const char* shared = std::getenv("LOADSTAR_SHARED_DIR");
  if (shared == nullptr) {
    MESSAGE("skipped: LOADSTAR_SHARED_DIR is not set");
    return std::nullopt;
  }
  const auto path = std::filesystem::path(shared) / "fixtures" / "keras" / name;
  if (!std::filesystem::exists(path)) {
    MESSAGE("skipped: the Keras fixture " << path.string() << " is missing");
    return std::nullopt;
  }
  return path;
}

/// Collects the warnings raised while it lives.
class CapturedWarnings {
 public:
  CapturedWarnings()
      : previous_(set_warning_handler([this](const std::string& w) { seen.push_back(w); })) {}
  ~CapturedWarnings() { set_warning_handler(previous_); }
  CapturedWarnings(const CapturedWarnings&) = delete;
  CapturedWarnings& operator=(const CapturedWarnings&) = delete;
  std::vector<std::string> seen;

 private:
  WarningHandler previous_;
};

std::vector<std::string> config_layer_names(const Model& model) {
  std::vector<std::string> out;
  const nlohmann::json config = model.get_config();
  for (const auto& entry : config["config"]["layers"])
    out.push_back(entry["name"].get<std::string>());
  return out;
}

std::vector<std::string> layer_names(const Model& model) {
  std::vector<std::string> out;
  for (const auto& layer : model.layers())
    out.push_back(layer->name());
  return out;
}

/// A model whose call order (right, l1, l2) is not Keras's layer order (l1, l2, right).
std::unique_ptr<Model> branching_model() {
  auto a = Input({4}, "a");
  auto right = call(Dense(3, {.name = "right"}), a);
  auto l1 = call(Dense(3, {.activation = "tanh", .name = "l1"}), a);
  auto l2 = call(Dense(2, {.name = "l2"}), l1);
  auto cat = call(Concatenate({.name = "cat"}), {l2, right});
  return std::make_unique<Model>(a, cat, "branches");
}

}  // namespace

TEST_SUITE("keras") {
  TEST_CASE("model_from_json names every layer class loadstar lacks at once") {
    // Three classes loadstar lacks, one inside a nested Sequential: all three are named.
    const char* config = R"({"class_name": "Functional", "config": {"name": "f", "layers": [
        {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 3, 4]}, "name": "x",
         "inbound_nodes": []},
        {"class_name": "ConvLSTM2D", "config": {"name": "recurrent", "units": 2}, "name": "recurrent",
         "inbound_nodes": [[["x", 0, 0, {}]]]},
        {"class_name": "Dense", "config": {"name": "d", "units": 2}, "name": "d",
         "inbound_nodes": [[["recurrent", 0, 0, {}]]]},
        {"class_name": "Sequential", "config": {"name": "inner", "layers": [
            {"class_name": "Dense", "config": {"name": "inner_dense", "units": 2}},
            {"class_name": "FancyNorm", "config": {"name": "norm"}}]},
         "name": "inner", "inbound_nodes": [[["d", 0, 0, {}]]]},
        {"class_name": "ConvLSTM1D", "config": {"name": "memory", "units": 2}, "name": "memory",
         "inbound_nodes": [[["inner", 0, 0, {}]]]}],
        "input_layers": [["x", 0, 0]], "output_layers": [["memory", 0, 0]]}})";
    CHECK_THROWS_WITH_AS(
        model_from_json(config),
        "model 'f' (Functional): 3 layers have classes loadstar does not support: 'recurrent' "
        "(ConvLSTM2D, config.layers[1]), 'norm' (FancyNorm, config.layers[3].config.layers[1]), "
        "'memory' (ConvLSTM1D, config.layers[4]); pass factories for them in the custom objects",
        UnsupportedLayersError);
    try {
      model_from_json(config);
      FAIL("expected UnsupportedLayersError");
    } catch (const UnsupportedLayersError& e) {
      REQUIRE(e.layers().size() == 3);
      CHECK(e.layers()[1].class_name == "FancyNorm");
      CHECK(e.layers()[1].name == "norm");
      CHECK(e.describe(false).find("custom") == std::string::npos);
    }
    // The custom objects supply two of them: the third is named alone.
    CustomObjects custom;
    for (const char* name : {"ConvLSTM2D", "ConvLSTM1D"}) {
      custom.add<Layer>(name, [](const nlohmann::json& c) {
        return Registry<Layer>::instance().create("Dense", c);
      });
    }
    CHECK_THROWS_WITH_AS(model_from_json(config, &custom),
                         "model 'f' (Functional): layer 'norm' "
                         "(config.layers[3].config.layers[1]) has class 'FancyNorm', which "
                         "loadstar does not support; pass a factory for it in the custom objects",
                         UnsupportedLayersError);
  }

  TEST_CASE("model_from_json refuses a nested model naming it") {
    CHECK_THROWS_WITH_AS(
        model_from_json(R"({"class_name": "Sequential", "config": {"name": "outer", "layers": [
            {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 4]}},
            {"class_name": "Sequential", "config": {"name": "inner", "layers": [
              {"class_name": "Dense", "config": {"name": "d", "units": 2}}]}}]}})"),
        "model 'outer' (Sequential): config.layers[1]: layer 'inner' is a nested Sequential "
        "model, which loadstar cannot load yet",
        ConfigError);
  }

  TEST_CASE("load_model names every layer class loadstar lacks and the file") {
    TempDir dir;
    Sequential model{Input({4}), Dense(3, {.name = "a"}), Dense(2, {.name = "b"})};
    model.save(dir / "two.h5");
    {
      // Rewrite model_config as a program with two custom layers would have it.
      H5::H5File file((dir / "two.h5").string(), H5F_ACC_RDWR);
      std::string config = model.to_json();
      config.replace(config.find("\"Dense\""), 7, "\"MyDense\"");
      config.replace(config.find("\"Dense\""), 7, "\"YourDense\"");
      file.removeAttr("model_config");
      H5::StrType type(H5::PredType::C_S1, H5T_VARIABLE);
      file.createAttribute("model_config", type, H5::DataSpace(H5S_SCALAR)).write(type, config);
    }
    CHECK_THROWS_WITH_AS(load_model(dir / "two.h5"),
                         doctest::Contains("two.h5': 2 layers have classes loadstar does not "
                                           "support: 'a' (MyDense, config.layers[1]), 'b' "
                                           "(YourDense, config.layers[2])"),
                         UnsupportedLayersError);
  }

  TEST_CASE("load_model keeps an initializer loadstar cannot build and warns naming it") {
    const auto path = nested_fixture("hls4ml_conv2d_1layer.h5");
    if (!path) return;
    CapturedWarnings warnings;
    // tf.keras 2.13 wrote the kernel initializer as the Python function `random_kernel`.
    auto model = load_model(*path);
    REQUIRE(warnings.seen.size() == 1);
    CHECK(warnings.seen[0] ==
          "layer 'conv2d' (Conv2D): config.kernel_initializer: initializer the Python function "
          "'random_kernel' is not supported by loadstar; its weights start at zero until a "
          "file's weights are loaded into them");
    // Predicts with the file's kernel (numpy's cross-correlation of the image 1..25, as in
    // test_keras_files.cpp).
    Tensor<float> x({1, 5, 5, 1});
    for (std::size_t i = 0; i < 25; ++i)
      x.data()[i] = static_cast<float>(i + 1);
    check_close(model->predict(x),
                Tensor<float>({1, 3, 3, 1}, {4.322033F, 5.004921F, 5.68781F, 7.736475F, 8.419363F,
                                             9.102252F, 11.150917F, 11.833805F, 12.516694F}),
                1e-5);
    // Its config keeps the initializer as written, so that a saved copy reads as the file.
    CHECK(model->get_config()["config"]["layers"][1]["config"]["kernel_initializer"] ==
          nlohmann::json::parse(R"({"module": "builtins", "class_name": "function",
                                    "config": "random_kernel", "registered_name": "function"})"));
    std::ostringstream summary;
    model->summary(summary);
    CHECK(summary.str().find("conv2d (Conv2D)") != std::string::npos);
    // Fine-tuning trains the kernel from the file's values.
    model->compile("sgd", "mse");
    const auto before = model->get_weights();
    model->fit(x, Tensor<float>({1, 3, 3, 1}), {.epochs = 1, .verbose = 0});
    CHECK_FALSE(model->get_weights()[0] == before[0]);
    TempDir dir;
    model->save(dir / "copy.h5");
    warnings.seen.clear();
    auto copy = load_model(dir / "copy.h5");
    CHECK(warnings.seen.size() == 1);
    CHECK(copy->predict(x) == model->predict(x));
    // An initializer config that is wrong, not unknown, stays an error.
    CHECK_THROWS_WITH_AS(
        model_from_json(R"({"class_name": "Sequential", "config": {"name": "s", "layers": [
            {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 4]}},
            {"class_name": "Dense", "config": {"name": "d", "units": 2, "kernel_initializer":
              {"class_name": "RandomNormal", "config": {"stddev": "wide"}}}}]}})"),
        doctest::Contains("stddev"), ConfigError);
  }

  TEST_CASE("Model lists a functional model's layers in Keras's order") {
    // Keras walks from the output `cat` depth first: cat (0), l2 (1), l1 (2), a (3), right (4);
    // depths: cat 0, l2 and right 1, l1 2, a 3; by decreasing depth, then discovery:
    // a, l1, l2, right, cat (tf-keras functional._map_graph_network).
    auto model = branching_model();
    CHECK(layer_names(*model) == std::vector<std::string>{"l1", "l2", "right", "cat"});
    CHECK(config_layer_names(*model) == std::vector<std::string>{"a", "l1", "l2", "right", "cat"});
    // The weights follow: l1's kernel (4x3) first, then l2's (3x2), then right's (4x3).
    const auto weights = model->get_weights();
    REQUIRE(weights.size() == 6);
    CHECK(weights[0].shape() == Shape{4, 3});
    CHECK(weights[2].shape() == Shape{3, 2});
    CHECK(weights[4].shape() == Shape{4, 3});
    // Both formats keep the order and the weights' pairing.
    TempDir dir;
    const auto x = inputs(5, 4);
    for (const char* name : {"m.h5", "m.keras"}) {
      INFO(name);
      model->save(dir / name);
      auto copy = load_model(dir / name);
      CHECK(layer_names(*copy) == layer_names(*model));
      CHECK(config_layer_names(*copy) == config_layer_names(*model));
      CHECK(copy->predict(x) == model->predict(x));
    }
    // Two inputs at different depths: b feeds the output directly, so it comes after a's chain.
    auto a = Input({2}, "a");
    auto b = Input({3}, "b");
    auto h = call(Dense(3, {.name = "h"}), a);
    auto sum = call(Add({.name = "sum"}), {h, b});
    Model two({a, b}, sum, "two");
    // DFS from sum: sum, h, a, b; depths sum 0, h 1, b 1, a 2: a, h, b, sum.
    CHECK(config_layer_names(two) == std::vector<std::string>{"a", "h", "b", "sum"});
  }

  TEST_CASE("save_model writes Keras 3's module and registered_name on every object") {
    auto model = branching_model();
    CompileOptions options;
    options.optimizer = std::make_shared<optimizers::Adam>(optimizers::AdamOptions{
        .learning_rate = optimizers::schedules::ExponentialDecay(0.1, 10, 0.5)});
    options.loss = std::make_shared<losses::MeanSquaredError>();
    options.metrics = {std::make_shared<metrics::MeanAbsoluteError>()};
    model->compile(options);
    // What config.json holds (keras/src/saving/serialization_lib.py: every object a dict of
    // module, class_name, config and registered_name, None for Keras's own).
    const nlohmann::json config = keras::detail::keras3_model_config(*model, true);
    const auto has_module = [](const nlohmann::json& object, const char* module) {
      return object.is_object() && object.value("module", "") == module &&
             object.contains("registered_name");
    };
    CHECK(has_module(config, "keras.src.models.functional"));
    for (const auto& layer : config["config"]["layers"])
      CHECK(has_module(layer, "keras.layers"));
    const auto& dense = config["config"]["layers"][1]["config"];
    CHECK(has_module(dense["kernel_initializer"], "keras.initializers"));
    CHECK(has_module(dense["bias_initializer"], "keras.initializers"));
    const auto& compile = config["compile_config"];
    CHECK(has_module(compile["optimizer"], "keras.optimizers"));
    CHECK(
        has_module(compile["optimizer"]["config"]["learning_rate"], "keras.optimizers.schedules"));
    CHECK(has_module(compile["loss"], "keras.losses"));
    CHECK(has_module(compile["metrics"][0], "keras.metrics"));
    // And a file with them loads with the same optimizer and schedule.
    TempDir dir;
    model->save(dir / "m.keras");
    auto copy = load_model(dir / "m.keras");
    REQUIRE(copy->compiled());
    CHECK(copy->optimizer().get_config() == model->optimizer().get_config());
  }
}

// Model files as Keras users bring them: every layer class loadstar lacks named at once, an
// initializer loadstar cannot build kept with a warning, Keras's order of a functional model's
// layers, Keras 3's module fields, and models nested in models (ModelLayer: run, trained, frozen,
// and read and written in tf.keras 2's and Keras 3's layouts, against
// tests/keras/generate_nested_models.py).
#include <doctest/doctest.h>

#include <H5Cpp.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <loadstar/keras.hpp>
#include <loadstar/keras/saving/detail/formats.hpp>
#include <loadstar/keras/warnings.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "keras/layer_cases.hpp"
#include "keras/saving_support.hpp"
#include "keras/unknown_axes_cases.hpp"
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

/// A case of tests/keras/reference/nested_models.json (tests/keras/generate_nested_models.py).
struct NestedCase {
  nlohmann::json json;
  std::filesystem::path file;
  Tensor<float> x, y;
  std::vector<Tensor<float>> weights;
};

NestedCase nested_case(const std::string& name) {
  NestedCase c;
  c.json = layer_cases::load("nested_models.json")[name];
  const char* dir = std::getenv("LOADSTAR_SOURCE_DIR");
  REQUIRE_MESSAGE(dir != nullptr, "LOADSTAR_SOURCE_DIR is not set");
  c.file = std::filesystem::path(dir) / "tests/keras/reference" / c.json["file"].get<std::string>();
  c.x = layer_cases::tensor_of(c.json["x"], layer_cases::shape_of(c.json["x_shape"]));
  c.y = layer_cases::tensor_of(c.json["y"], layer_cases::shape_of(c.json["y_shape"]));
  for (const auto& w : c.json["weights"])
    c.weights.push_back(layer_cases::tensor_of(w["values"], layer_cases::shape_of(w["shape"])));
  return c;
}

/// The `weight_names` of layer group `layer` of a legacy `.h5` file.
std::vector<std::string> legacy_weight_names(const std::filesystem::path& path,
                                             const std::string& layer) {
  const loadstar::detail::Hdf5Lock lock;
  const keras::detail::H5Reader reader(path);
  const keras::detail::H5Id group =
      reader.open_group(reader.root(), "model_weights/" + layer, layer);
  return reader.string_list_attribute(group.get(), "weight_names", layer);
}

/// The `vars` groups of a `.keras` archive: path, `name` attribute and number of datasets.
std::vector<std::string> keras3_groups(const std::filesystem::path& path) {
  const loadstar::detail::Hdf5Lock lock;
  const keras::detail::ZipReader zip(path);
  const keras::detail::H5Reader reader(zip.read("model.weights.h5", std::uint64_t{1} << 30),
                                       "weights");
  const keras::detail::ModelFile file =
      keras::detail::read_keras3_weights(reader, keras::detail::FileLayout::keras3_archive);
  std::vector<std::string> out;
  for (const std::string& where : std::vector<std::string>{"vars"}) {
    const keras::detail::H5Id vars = reader.open_group(reader.root(), where, where);
    out.push_back(where + " " + reader.string_attribute(vars.get(), "name", where) + " " +
                  std::to_string(reader.children(vars.get(), where).size()));
  }
  for (const auto& layer : file.layers) {
    const std::string where = "layers/" + layer.name + "/vars";
    const keras::detail::H5Id vars = reader.open_group(reader.root(), where, where);
    out.push_back(where + " " + reader.string_attribute(vars.get(), "name", where) + " " +
                  std::to_string(reader.children(vars.get(), where).size()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// The inner model of the transfer-learning tests: Dense, BatchNormalization, Dense.
std::shared_ptr<Sequential> base_model(const char* name = "base") {
  set_random_seed(3);
  return std::make_shared<Sequential>(
      std::initializer_list<SequentialItem>{Input({4}),
                                            Dense(6, {.activation = "relu", .name = "dense"}),
                                            BatchNormalization({.name = "batch_normalization"}),
                                            Dense(3, {.activation = "tanh", .name = "dense_1"})},
      name);
}

/// Trains `model` three epochs of three batches with SGD and returns the losses.
std::vector<double> train(Model& model) {
  model.compile("sgd", "mse");
  const auto x = inputs(12, 4);
  const auto y = inputs(12, 2, 1.0F);
  const auto history =
      model.fit(x, y, {.epochs = 3, .batch_size = 4, .verbose = 0, .shuffle = false});
  return history.history.at("loss");
}

/// A case of tests/keras/reference/nested_multi.json (tests/keras/generate_nested_multi.py).
const nlohmann::json& multi_case(const std::string& name) {
  static const nlohmann::json data = layer_cases::load("nested_multi.json");
  for (const auto& c : data["cases"])
    if (c["name"] == name) return c;
  throw std::runtime_error("nested_multi.json has no case " + name);
}

/// The values keyed "<layer>/<variable>" in `json`, in the model's weight order.
std::vector<Tensor<float>> keyed_weights(const Model& model, const nlohmann::json& json,
                                         std::vector<std::string>* keys = nullptr) {
  std::vector<Tensor<float>> out;
  for (const auto& layer : model.layers()) {
    for (const auto& w : layer->weights()) {
      const std::string key = layer->name() + "/" + w.name;
      REQUIRE_MESSAGE(json.contains(key), "no reference weight " << key);
      const nlohmann::json& entry = json[key];
      out.push_back(layer_cases::tensor_of(entry.contains("values") ? entry["values"] : entry,
                                           w.value.shape()));
      if (keys != nullptr) keys->push_back(key);
    }
  }
  return out;
}

/// A reference case's model: its weights set, predicting (also after saving and loading in both
/// formats) and taking one SGD step (lr 0.5, mse).
void check_multi_case(Model& model, const nlohmann::json& c) {
  model.set_weights(keyed_weights(model, c["weights"]));
  std::vector<Tensor<float>> x;
  for (const auto& input : c["inputs"])
    x.push_back(layer_cases::tensor_of(input["values"], layer_cases::shape_of(input["shape"])));
  const Tensor<float> y =
      layer_cases::tensor_of(c["targets"]["values"], layer_cases::shape_of(c["targets"]["shape"]));
  layer_cases::check_close("predictions", model.predict_outputs(x, {.verbose = 0}).front(),
                           c["predictions"]);
  TempDir dir;
  for (const char* file : {"model.h5", "model.keras"}) {
    INFO(file);
    model.save(dir / file);
    layer_cases::check_close("loaded predictions",
                             load_model(dir / file)->predict_outputs(x, {.verbose = 0}).front(),
                             c["predictions"]);
  }
  model.compile(
      {.optimizer = optimizers::SGD(optimizers::SGDOptions{.learning_rate = 0.5}), .loss = "mse"});
  const double loss = model.train_on_batch(x, y).get("loss").value();
  CHECK(loss == doctest::Approx(c["loss"].get<double>()).epsilon(1e-5));
  std::vector<std::string> keys;
  const auto updated = keyed_weights(model, c["updated"], &keys);
  const auto after = model.get_weights();
  REQUIRE(after.size() == updated.size());
  for (std::size_t i = 0; i < after.size(); ++i)
    layer_cases::check_close("updated " + keys[i], after[i], c["updated"][keys[i]]);
}

/// The models of the encoder cases: tokens -> [encoder] -> (pooled sequence, state) -> head.
std::unique_ptr<Model> encoder_model(bool embedding_inside) {
  auto tokens = Input({5}, "tokens");
  auto inner_input = embedding_inside ? Input({5}, "ids") : Input({5, 3}, "features");
  KerasTensor x = inner_input;
  if (embedding_inside) x = call(Embedding(9, 3, {.mask_zero = true, .name = "words"}), x);
  auto states = call_outputs(
      LSTM(4, {.return_sequences = true, .return_state = true, .name = "enc_lstm"}), x);
  auto encoder = std::make_shared<Model>(std::vector{inner_input},
                                         std::vector{states[0], states[1]}, "encoder");
  KerasTensor outer = tokens;
  if (!embedding_inside) outer = call(Embedding(9, 3, {.mask_zero = true, .name = "words"}), outer);
  auto encoded = call_outputs(encoder, {outer});
  auto pooled = call(GlobalAveragePooling1D({.name = "pool"}), encoded[0]);
  auto joined = call(Concatenate({.name = "cat"}), {pooled, encoded[1]});
  return std::make_unique<Model>(std::vector{tokens},
                                 std::vector{call(Dense(1, {.name = "head"}), joined)},
                                 embedding_inside ? "inner_states" : "encoder_states");
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

  TEST_CASE("model_from_json runs a nested model of two inputs as Keras adds them") {
    auto pair = model_from_json(R"({"class_name": "Functional", "config": {"name": "f",
        "layers": [
          {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 4], "name": "x"},
           "name": "x", "inbound_nodes": []},
          {"class_name": "Dense", "config": {"name": "twice", "units": 4, "use_bias": false},
           "name": "twice", "inbound_nodes": [[["x", 0, 0, {}]]]},
          {"class_name": "Functional", "config": {"name": "pair", "layers": [
            {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 4],
             "name": "a"}, "name": "a", "inbound_nodes": []},
            {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 4],
             "name": "b"}, "name": "b", "inbound_nodes": []},
            {"class_name": "Add", "config": {"name": "sum"}, "name": "sum",
             "inbound_nodes": [[["a", 0, 0, {}], ["b", 0, 0, {}]]]}],
           "input_layers": [["a", 0, 0], ["b", 0, 0]],
           "output_layers": [["sum", 0, 0], ["a", 0, 0]]},
           "name": "pair", "inbound_nodes": [[["x", 0, 0, {}], ["twice", 0, 0, {}]]]},
          {"class_name": "Subtract", "config": {"name": "diff"}, "name": "diff",
           "inbound_nodes": [[["pair", 0, 0, {}], ["pair", 0, 1, {}]]]}],
        "input_layers": [["x", 0, 0]], "output_layers": [["diff", 0, 0]]}})");
    REQUIRE(pair->get_layer("pair")->output_count() == 2);
    Tensor<float> kernel(Shape{4, 4});
    for (std::size_t i = 0; i < 4; ++i)
      kernel.data()[i * 5] = 2.0F;
    pair->set_weights({kernel});
    // (x + 2x) - x = 2x.
    const Tensor<float> x = inputs(3, 4);
    Tensor<float> expected = x.clone();
    for (auto& v : expected)
      v *= 2.0F;
    check_close(pair->predict(x), expected, 1e-6);
    // Written and read again, the nested model keeps its inputs, outputs and calls.
    auto copy = model_from_config(pair->get_config());
    copy->set_weights({kernel});
    check_close(copy->predict(x), expected, 1e-6);
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
  TEST_CASE("load_model runs a nested Sequential of a tf.keras 2 file as Keras computes it") {
    const NestedCase c = nested_case("tfkeras2");
    auto model = load_model(c.file);
    REQUIRE(layer_names(*model) == std::vector<std::string>{"base", "head"});
    CHECK(model->get_layer("base")->class_name() == "Sequential");
    // The weights in layer order (the file keeps the moving statistics last).
    const auto weights = model->get_weights();
    REQUIRE(weights.size() == c.weights.size());
    for (std::size_t i = 0; i < weights.size(); ++i) {
      INFO("weight ", i);
      CHECK(weights[i] == c.weights[i]);
    }
    check_close(model->predict(c.x), c.y, 1e-5);
    // Saved in both layouts, as Keras nests them, and read back bitwise.
    TempDir dir;
    model->save(dir / "copy.h5");
    CHECK(legacy_weight_names(dir / "copy.h5", "base") ==
          c.json["base_weight_names"].get<std::vector<std::string>>());
    model->save(dir / "copy.keras");
    // Keras 3's groups: the functional model's input, the nested model's own (empty) vars and its
    // layers below it, then the head.
    std::vector<std::string> groups{"vars outer 0",
                                    "layers/input_layer/vars image 0",
                                    "layers/sequential/vars base 0",
                                    "layers/sequential/layers/dense/vars dense 2",
                                    "layers/sequential/layers/batch_normalization/vars "
                                    "batch_normalization 4",
                                    "layers/sequential/layers/dense_1/vars dense_1 2",
                                    "layers/dense/vars head 2"};
    std::sort(groups.begin(), groups.end());
    CHECK(keras3_groups(dir / "copy.keras") == groups);
    for (const char* name : {"copy.h5", "copy.keras"}) {
      INFO(name);
      auto copy = load_model(dir / name);
      CHECK(layer_names(*copy) == layer_names(*model));
      CHECK(same_weights(copy->get_weights(), weights));
      CHECK(copy->predict(c.x) == model->predict(c.x));
    }
  }

  TEST_CASE("load_model runs a frozen nested functional model of a Keras 3 archive") {
    const NestedCase c = nested_case("keras3");
    auto model = load_model(c.file);
    REQUIRE(layer_names(*model) == std::vector<std::string>{"base", "head"});
    const auto base = model->get_layer("base");
    CHECK(base->class_name() == "Functional");
    CHECK_FALSE(base->trainable());
    // Only the head trains.
    CHECK(model->trainable_variables().size() == 2);
    const auto weights = model->get_weights();
    REQUIRE(weights.size() == c.weights.size());
    for (std::size_t i = 0; i < weights.size(); ++i)
      CHECK(weights[i] == c.weights[i]);
    check_close(model->predict(c.x), c.y, 1e-5);
    // Its config is Keras 3's serialization of a model.
    const nlohmann::json config = keras::detail::keras3_model_config(*model, false);
    const auto& entry = config["config"]["layers"][1];
    CHECK(entry["module"] == "keras.src.models.functional");
    CHECK(entry["class_name"] == "Functional");
    CHECK(entry["registered_name"] == "Functional");
    CHECK(entry["config"]["name"] == "base");
    CHECK(entry["config"]["trainable"] == false);
    CHECK(entry["config"]["layers"][1]["inbound_nodes"][0].contains("args"));
    TempDir dir;
    model->save(dir / "copy.keras");
    std::vector<std::string> expected;
    for (const auto& group : c.json["groups"]) {
      expected.push_back(group["path"].get<std::string>() + " " + group["name"].get<std::string>() +
                         " " + std::to_string(group["size"].get<std::size_t>()));
    }
    std::sort(expected.begin(), expected.end());
    CHECK(keras3_groups(dir / "copy.keras") == expected);
    model->save(dir / "copy.h5");
    for (const char* name : {"copy.keras", "copy.h5"}) {
      INFO(name);
      auto copy = load_model(dir / name);
      CHECK_FALSE(copy->get_layer("base")->trainable());
      CHECK(copy->trainable_variables().size() == 2);
      CHECK(copy->predict(c.x) == model->predict(c.x));
    }
  }

  TEST_CASE("ModelLayer of a frozen model leaves its weights unchanged while the head trains") {
    auto base = base_model();
    auto layer = std::make_shared<ModelLayer>(base);
    layer->set_trainable(false);
    for (const auto& inner : base->layers())
      CHECK_FALSE(inner->trainable());
    Sequential model{Input({4}), layer, Dense(2, {.name = "head"})};
    CHECK(model.trainable_variables().size() == 2);
    const auto before = model.get_weights();
    const auto base_before = base->get_weights();
    const auto losses = train(model);
    const auto after = model.get_weights();
    // The base's 8 weights (the BatchNormalization's moving statistics included: a frozen
    // BatchNormalization normalizes with them) are bitwise unchanged; the head's changed.
    for (std::size_t i = 0; i < 8; ++i) {
      INFO("weight ", i);
      CHECK(after[i] == before[i]);
    }
    CHECK_FALSE(after[8] == before[8]);
    CHECK_FALSE(after[9] == before[9]);
    CHECK(same_weights(base->get_weights(), base_before));
    CHECK(losses.back() < losses.front());
  }

  TEST_CASE("A frozen BatchNormalization normalizes with its moving statistics in training") {
    // Keras's fine-tuning rule at the top level too: frozen, the layer is in inference mode.
    Sequential model{Input({3}), BatchNormalization({.name = "bn"}), Dense(1, {.name = "head"})};
    model.layers()[0]->set_trainable(false);
    model.compile({.optimizer = "sgd", .loss = "mse"});
    Tensor<float> x(Shape{4, 3});
    for (std::size_t i = 0; i < x.size(); ++i)
      x.data()[i] = 3.0F + float(i);
    const Tensor<float> y(Shape{4, 1}, 1.0F);
    const auto before = model.get_weights();
    // gamma 1, beta 0, moving mean 0 and variance 1: the layer passes x / sqrt(1 + 0.001), so the
    // loss of the first step is the head's on that, not on the batch-normalized x (mean 0).
    const Tensor<float> expected = model.predict(x, {.verbose = 0});
    const double loss = model.train_on_batch(x, y).get("loss").value();
    double mse = 0.0;
    for (std::size_t i = 0; i < 4; ++i)
      mse += (double(expected.data()[i]) - 1.0) * (double(expected.data()[i]) - 1.0) / 4.0;
    CHECK(loss == doctest::Approx(mse).epsilon(1e-5));
    const auto after = model.get_weights();
    for (std::size_t i = 0; i < 4; ++i) {
      INFO("weight ", i);
      CHECK(after[i] == before[i]);
    }
  }

  TEST_CASE("ModelLayer trains unfrozen as the same layers stacked flat") {
    auto base = base_model();
    Sequential nested{Input({4}), base, Dense(2, {.name = "head"})};
    set_random_seed(3);
    Sequential flat{Input({4}), Dense(6, {.activation = "relu", .name = "dense"}),
                    BatchNormalization({.name = "batch_normalization"}),
                    Dense(3, {.activation = "tanh", .name = "dense_1"}),
                    Dense(2, {.name = "head"})};
    flat.set_weights(nested.get_weights());
    CHECK(nested.trainable_variables().size() == flat.trainable_variables().size());
    const auto nested_losses = train(nested);
    const auto flat_losses = train(flat);
    REQUIRE(nested_losses.size() == flat_losses.size());
    for (std::size_t i = 0; i < flat_losses.size(); ++i)
      CHECK(nested_losses[i] == doctest::Approx(flat_losses[i]).epsilon(1e-6));
    const auto a = nested.get_weights(), b = flat.get_weights();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i)
      check_close(a[i], b[i], 1e-5);
    // The inner model sees the trained weights: it predicts as the nested layer does.
    const auto x = inputs(5, 4);
    Sequential head_only{Input({3}), nested.get_layer("head")};
    check_close(head_only.predict(base->predict(x)), nested.predict(x), 1e-6);
  }

  TEST_CASE("save_model keeps the optimizer state of a model with a nested model") {
    for (const char* name : {"m.h5", "m.keras"}) {
      INFO(name);
      auto base = base_model();
      Sequential model;
      model.add(Input({4}));
      model.add(base);
      model.add(Dense(2, {.name = "head"}));
      model.compile("adam", "mse");
      const auto x = inputs(8, 4);
      const auto y = inputs(8, 2, 1.0F);
      model.fit(x, y, {.epochs = 2, .batch_size = 4, .verbose = 0, .shuffle = false});
      TempDir dir;
      model.save(dir / name);
      auto copy = load_model(dir / name);
      REQUIRE(copy->compiled());
      CHECK(copy->optimizer().iterations() == model.optimizer().iterations());
      CHECK(same_weights(copy->get_weights(), model.get_weights()));
      // The Adam slots come back paired with their weights: one more step gives the same bits.
      const double a = *model.train_on_batch(x, y).get("loss");
      const double b = *copy->train_on_batch(x, y).get("loss");
      CHECK(a == b);
      CHECK(same_weights(copy->get_weights(), model.get_weights()));
    }
  }

  TEST_CASE("call runs a model on a tensor as a layer") {
    auto base = base_model();
    auto image = Input({4}, "image");
    auto features = call(std::shared_ptr<Model>(base), image);
    auto output = call(Dense(2, {.name = "head"}), features);
    Model model(image, output, "classifier");
    REQUIRE(layer_names(model) == std::vector<std::string>{"base", "head"});
    CHECK(model.get_layer("base")->class_name() == "Sequential");
    CHECK(model.get_weights().size() == 10);
    const auto x = inputs(3, 4);
    Sequential head_only{Input({3}), model.get_layer("head")};
    check_close(model.predict(x), head_only.predict(base->predict(x)), 1e-6);
    // Its config is the inner model's, as tf.keras 2 writes a nested model.
    const nlohmann::json config = model.get_config();
    const auto& entry = config["config"]["layers"][1];
    CHECK(entry["class_name"] == "Sequential");
    CHECK(entry["name"] == "base");
    CHECK(entry["config"]["layers"].size() == 4);
    CHECK(entry["inbound_nodes"] == nlohmann::json::parse(R"([[["image", 0, 0, {}]]])"));
    auto copy = model_from_config(config);
    copy->set_weights(model.get_weights());
    CHECK(copy->predict(x) == model.predict(x));
    // The summary shows the inner model as one row with its parameters.
    std::ostringstream summary;
    model.summary(summary);
    CHECK(summary.str().find("base (Sequential)") != std::string::npos);
    CHECK(summary.str().find("dense_1") == std::string::npos);
    CHECK(summary.str().find(std::to_string(base->count_params())) != std::string::npos);
    // A model called twice is one shared layer.
    auto other = Input({4}, "other");
    auto again = call(std::shared_ptr<Model>(base), other);
    auto both = call(Add({.name = "sum"}), {features, again});
    Model twice({image, other}, both, "twice");
    CHECK(twice.get_weights().size() == 8);
    Tensor<float> doubled = base->predict(x);
    for (auto& v : doubled)
      v *= 2.0F;
    check_close(twice.predict_outputs(std::vector<Tensor<float>>{x, x}).front(), doubled, 1e-6);
  }

  TEST_CASE("A nested model of two inputs and three outputs trains as PyTorch computes it") {
    const auto& c = multi_case("multi_io");
    auto a = Input({4}, "a");
    auto b = Input({3}, "b");
    auto ha = call(Dense(5, {.activation = "tanh", .name = "ha"}), a);
    auto gb = call(Dense(5, {.name = "gb"}), b);
    auto sum = call(Add({.name = "s"}), {ha, gb});
    auto pair = std::make_shared<Model>(
        std::vector{a, b}, std::vector{call(Dense(2, {.name = "d1"}), sum), sum, a}, "pair");
    auto x = Input({4}, "x");
    auto y = Input({3}, "y");
    auto pre = call(Dense(4, {.activation = "tanh", .name = "pre"}), x);
    auto outputs = call_outputs(pair, {pre, y});
    REQUIRE(outputs.size() == 3);
    CHECK(outputs[1].shape() == Shape{5});
    CHECK(outputs[2].shape() == Shape{4});
    auto joined = call(Concatenate({.name = "cat"}), {outputs[0], outputs[1], outputs[2]});
    Model model(std::vector{x, y}, std::vector{call(Dense(1, {.name = "head"}), joined)},
                "multi_io");
    check_multi_case(model, c);
  }

  TEST_CASE("A nested encoder returning its sequence and state carries the mask on the sequence") {
    for (const bool inside : {false, true}) {
      const std::string where = inside ? "the mask made inside" : "the mask given from outside";
      INFO(where);
      auto model = encoder_model(inside);
      const auto& layer = *model->get_layer("encoder");
      CHECK(layer.output_count() == 2);
      CHECK(layer.masked_outputs() == 1);
      CHECK(layer.mask_flow() == (inside ? MaskFlow::computes : MaskFlow::passes));
      check_multi_case(*model, multi_case(inside ? "inner_states" : "encoder_states"));
    }
  }

  TEST_CASE("Nested models on sequences of unknown length train as PyTorch computes them") {
    // tests/keras/generate_unknown_axes.py's cases, with part of each model nested (the weights
    // in the same order): batches of several lengths, one SGD step each.
    for (const auto& c : unknown_axes_cases::nested_cases()) {
      auto model = c.make();
      unknown_axes_cases::check_training(*model, unknown_axes_cases::case_named(c.name), c.loss);
    }
    // The block passes the mask it is given; the encoder makes one.
    auto model = unknown_axes_cases::nested_masked_mha();
    CHECK(model->get_layer("block")->mask_flow() == MaskFlow::passes);
    auto encoder = unknown_axes_cases::nested_masked_lstm();
    CHECK(encoder->get_layer("encoder")->mask_flow() == MaskFlow::ends);
    std::ostringstream summary;
    encoder->summary(summary);
    CHECK(summary.str().find("(None, None)") != std::string::npos);
  }

  TEST_CASE("A nested model of unknown lengths runs on inputs of a known length") {
    const auto make = [] {
      auto ids = Input({none}, "ids");
      auto h = call(Conv1D(3, 2, {.name = "conv"}), call(Embedding(12, 4, {.name = "e"}), ids));
      return std::make_shared<Model>(std::vector{ids}, std::vector{h}, "features");
    };
    auto features = make();
    auto tokens = Input({6}, "tokens");
    auto encoded = call(features, tokens);
    CHECK(encoded.shape() == Shape{5, 3});
    Model model(std::vector{tokens}, std::vector{encoded}, "fixed");
    Tensor<float> x(Shape{2, 6});
    for (std::size_t i = 0; i < x.size(); ++i)
      x.data()[i] = static_cast<float>(i % 12);
    CHECK(layer_cases::same_bits(model.predict(x, {.verbose = 0}),
                                 features->predict(x, {.verbose = 0})));
    // A known length the inner model cannot take, and an unknown one where it needs one.
    CHECK_THROWS_WITH_AS(call(make(), Input({1}, "short")),
                         doctest::Contains("conv1d layer 'conv'"), ShapeError);
    auto fixed_inner = std::make_shared<Model>(std::vector{tokens},
                                               std::vector{call(Dense(2), tokens)}, "fixed_inner");
    CHECK_THROWS_WITH_AS(call(fixed_inner, Input({none}, "any")),
                         "functional layer 'fixed_inner': takes no axis of unknown length (None) "
                         "but is called on (None, None); give the Input a fixed length",
                         ShapeError);
  }

  TEST_CASE("model_from_json takes the input of a nested model that comes first") {
    // tf.keras 2's Sequential([base, Dense(2)]) has no InputLayer of its own: its input is the
    // nested model's.
    auto base = base_model();
    nlohmann::json config = {
        {"class_name", "Sequential"},
        {"config",
         {{"name", "outer"},
          {"layers",
           {{{"class_name", "Sequential"}, {"config", ModelLayer(base).get_config()}},
            {{"class_name", "Dense"}, {"config", {{"name", "head"}, {"units", 2}}}}}}}}};
    auto model = model_from_config(config);
    REQUIRE(model->inputs().size() == 1);
    CHECK(model->inputs()[0].shape() == Shape{4});
    REQUIRE(layer_names(*model) == std::vector<std::string>{"base", "head"});
    const auto inner = dynamic_cast<const ModelLayer&>(*model->get_layer("base")).model();
    inner->set_weights(base->get_weights());
    const auto x = inputs(3, 4);
    Sequential head_only{Input({3}), model->get_layer("head")};
    check_close(model->predict(x), head_only.predict(base->predict(x)), 1e-6);
  }

  TEST_CASE("ModelLayer refuses a model it cannot run naming it") {
    CHECK_THROWS_WITH_AS(ModelLayer(std::make_shared<Sequential>(
                             std::initializer_list<SequentialItem>{Dense(2)}, "unbuilt")),
                         "sequential model 'unbuilt': used as a layer, it must be built (give it "
                         "an Input first) but it has no input shape yet",
                         ConfigError);
    CHECK_THROWS_WITH_AS(ModelLayer(nullptr), "model layer: the model is null", ConfigError);
    // A later output carrying a mask that is not the first output's.
    auto tokens = Input({5}, "tokens");
    auto words = call(Embedding(9, 3, {.mask_zero = true, .name = "words"}), tokens);
    auto pooled = call(GlobalAveragePooling1D({.name = "pool"}), words);
    auto both = std::make_shared<Model>(std::vector{tokens}, std::vector{pooled, words}, "both");
    CHECK_THROWS_WITH_AS(ModelLayer{both},
                         "functional model 'both': output 1 ('words') carries the mask made by "
                         "embedding layer 'words', which is not its first output's; used as a "
                         "layer, a model's later outputs carry the first one's mask or none",
                         ConfigError);
    // A later output carrying a mask given to the model's input: refused when one comes.
    auto features = Input({5, 3}, "features");
    auto summary = call(GlobalAveragePooling1D({.name = "mean"}), features);
    auto echo =
        std::make_shared<Model>(std::vector{features}, std::vector{summary, features}, "echo");
    auto ids = Input({5}, "ids");
    auto echoed = call_outputs(echo, {call(Embedding(9, 3, {.mask_zero = true}), ids)});
    Model echoing(std::vector{ids}, std::vector{echoed[0]}, "echoing");
    CHECK_THROWS_WITH_AS(echoing.predict(inputs(2, 5, 1.0F), {.verbose = 0}),
                         "functional model 'echo': output 1 ('features') carries the mask given "
                         "to its input 'features', which is not its first output's; "
                         "used as a layer, a model's later outputs carry the first one's mask or "
                         "none",
                         ConfigError);
    // A model of several outputs is called with call_outputs.
    auto x = Input({2}, "x");
    auto split = std::make_shared<Model>(
        std::vector{x}, std::vector{call(Dense(2, {.name = "p"}), x), call(Dense(1), x)}, "split");
    CHECK_THROWS_WITH_AS(call(split, Input({2})),
                         "functional layer 'split': returns 2 outputs; call it with call_outputs, "
                         "which returns them all",
                         ConfigError);
    auto noisy = std::make_shared<Dense>(2, DenseOptions{.name = "noisy"});
    noisy->set_activity_regularizer(std::make_shared<regularizers::L2>(0.1));
    auto regularized = std::make_shared<Sequential>(
        std::initializer_list<SequentialItem>{Input({2}), noisy}, "regularized");
    CHECK_THROWS_WITH_AS(ModelLayer{regularized},
                         "sequential model 'regularized': layer 'noisy' has an "
                         "activity_regularizer, which loadstar does not apply inside a model "
                         "used as a layer",
                         ConfigError);
    auto base = base_model();
    auto wide = Input({5}, "wide");
    CHECK_THROWS_WITH_AS(call(std::shared_ptr<Model>(base), wide),
                         "sequential model layer 'base': expects one input of shape (4,) but got "
                         "(5,)",
                         ShapeError);
    auto a = Input({2}, "a");
    auto b = Input({3}, "b");
    auto pair = std::make_shared<Model>(std::vector{a, b}, call(Concatenate(), {a, b}), "pair");
    CHECK_THROWS_WITH_AS(call(pair, Input({2})),
                         "functional model layer 'pair': expects 2 inputs of shapes (2,), (3,) "
                         "but got one input: (2,)",
                         ShapeError);
  }
}

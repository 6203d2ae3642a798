// MultiHeadAttention, Attention and AdditiveAttention: forward, input and weight gradients
// against PyTorch (tests/keras/generate_attention.py), configs, call arguments in both Keras
// node formats, .h5 and .keras files, dropout, regularizers, refusals, and a Transformer
// encoder block trained against PyTorch's losses and on a task it must learn.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <loadstar/error.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/keras/backend/cpu_backend.hpp>
#include <loadstar/keras/saving/detail/formats.hpp>
#include <loadstar/keras/saving/detail/model_file.hpp>
#include <loadstar/keras/saving/model_config.hpp>
#include <loadstar/keras/saving/saving.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "keras/layer_cases.hpp"
#include "temp_dir.hpp"

using loadstar::ConfigError;
using loadstar::Shape;
using loadstar::ShapeError;
using loadstar::Tensor;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;
using nlohmann::json;

namespace {

const json& attention_reference() {
  static const json data = layer_cases::load("attention.json");
  return data;
}

/// A functional model `mha(x, x)` (self-attention) of `config` and call kwargs `kwargs`, through
/// a tf.keras 2 config (the value among the first input's kwargs).
json legacy_mha_model(const json& config, const json& kwargs) {
  json node_kwargs = kwargs;
  node_kwargs["value"] = json::array({"x", 0, 0});
  return {{"class_name", "Functional"},
          {"config",
           {{"name", "legacy"},
            {"layers",
             {{{"class_name", "InputLayer"},
               {"name", "x"},
               {"config", {{"batch_input_shape", {nullptr, 5, 6}}, {"name", "x"}}},
               {"inbound_nodes", json::array()}},
              {{"class_name", "MultiHeadAttention"},
               {"name", "mha"},
               {"config", config},
               {"inbound_nodes", {{{"x", 0, 0, node_kwargs}}}}}}},
            {"input_layers", {{"x", 0, 0}}},
            {"output_layers", {{"mha", 0, 0}}}}}};
}

json mha_config() {
  return {{"name", "mha"}, {"num_heads", 2}, {"key_dim", 3}};
}

/// Runs a reference case of MultiHeadAttention returning its attention scores: the output and
/// the scores, then the gradients of sum(output * upstream) + sum(scores * scores_upstream).
void run_scores_case(const json& c, Backend& backend) {
  const std::string name = c["name"];
  INFO("case ", name, " with ", backend.threads(), " threads");
  json config = c["config"];
  config["name"] = name;
  auto layer = LayerRegistry::instance().create("MultiHeadAttention", config);
  dynamic_cast<loadstar::keras::detail::CallArguments&>(*layer).apply_call_kwargs(c["call_kwargs"],
                                                                                  name);
  REQUIRE(layer->output_count() == 2);
  std::vector<Shape> batch_shapes, sample_shapes;
  for (const auto& shape : c["input_shapes"]) {
    batch_shapes.push_back(layer_cases::shape_of(shape));
    sample_shapes.push_back(batch_shapes.back().row_shape());
  }
  const Shape output_shape = layer_cases::shape_of(c["output_shape"]);
  const Shape scores_shape = layer_cases::shape_of(c["scores_shape"]);
  CHECK(layer->build(sample_shapes, 7) == output_shape.row_shape());
  CHECK(layer->extra_output_shapes(sample_shapes) == std::vector<Shape>{scores_shape.row_shape()});
  for (auto& w : layer->weights()) {
    REQUIRE(c["weights"].contains(w.name));
    w.value = backend.from_host(layer_cases::tensor_of(c["weights"][w.name], w.value.shape()));
    w.gradient = backend.allocate(w.gradient.shape());
  }
  std::vector<Tensor<float>> inputs, input_gradients;
  for (std::size_t i = 0; i < batch_shapes.size(); ++i) {
    inputs.push_back(backend.from_host(layer_cases::tensor_of(c["inputs"][i], batch_shapes[i])));
    input_gradients.push_back(
        c["input_gradients"][i].is_null() ? Tensor<float>() : backend.allocate(batch_shapes[i]));
  }
  const Tensor<float> output = backend.allocate(output_shape);
  const Tensor<float> scores[] = {backend.allocate(scores_shape)};
  const Tensor<float> scores_upstream[] = {
      backend.from_host(layer_cases::tensor_of(c["scores_upstream"], scores_shape))};
  const CallContext ctx{.backend = backend,
                        .training = true,
                        .extra_outputs = scores,
                        .extra_output_gradients = scores_upstream};
  layer->forward(inputs, output, ctx);
  layer_cases::check_close("output", backend.to_host(output), c["output"]);
  layer_cases::check_close("scores", backend.to_host(scores[0]), c["scores"]);
  const Tensor<float> upstream =
      backend.from_host(layer_cases::tensor_of(c["upstream"], output_shape));
  layer->backward(inputs, output, upstream, input_gradients, ctx);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!c["input_gradients"][i].is_null())
      layer_cases::check_close("gradient of input " + std::to_string(i),
                               backend.to_host(input_gradients[i]), c["input_gradients"][i]);
  }
  for (const auto& w : layer->weights())
    layer_cases::check_close("gradient of " + w.name, backend.to_host(w.gradient),
                             c["weight_gradients"][w.name]);
}

}  // namespace

TEST_SUITE("keras_layers") {
  TEST_CASE("Attention layers match the PyTorch reference values with one and three threads") {
    REQUIRE(attention_reference()["cases"].size() >= 12);
    for (std::size_t threads : {1, 3}) {
      CpuBackend backend(threads);
      for (const auto& c : attention_reference()["cases"])
        layer_cases::run_case(c, backend);
    }
  }

  TEST_CASE("MultiHeadAttention has Keras's defaults and weight layout") {
    auto layer = LayerRegistry::instance().create("MultiHeadAttention", mha_config());
    const std::vector<Shape> shapes{Shape{5, 6}, Shape{7, 4}};
    CHECK(layer->build(shapes, 1) == Shape{5, 6});
    std::vector<std::string> names;
    std::vector<Shape> weight_shapes;
    for (const auto& w : layer->weights()) {
      names.push_back(w.name);
      weight_shapes.push_back(w.value.shape());
    }
    CHECK(names == std::vector<std::string>{"query/kernel", "query/bias", "key/kernel", "key/bias",
                                            "value/kernel", "value/bias", "attention_output/kernel",
                                            "attention_output/bias"});
    CHECK(weight_shapes == std::vector<Shape>{Shape{6, 2, 3}, Shape{2, 3}, Shape{4, 2, 3},
                                              Shape{2, 3}, Shape{4, 2, 3}, Shape{2, 3},
                                              Shape{2, 3, 6}, Shape{6}});
    const json config = layer->get_config();
    CHECK(config["value_dim"] == 3);
    CHECK(config["dropout"] == 0.0);
    CHECK(config["use_bias"] == true);
    CHECK(config["output_shape"].is_null());
    CHECK(config["attention_axes"].is_null());
    CHECK(config["kernel_initializer"]["class_name"] == "GlorotUniform");
    CHECK(config["bias_initializer"]["class_name"] == "Zeros");
    CHECK(config["kernel_regularizer"].is_null());
    // Biases start at zero, kernels do not.
    CHECK(std::all_of(layer->weights()[1].value.begin(), layer->weights()[1].value.end(),
                      [](float v) { return v == 0.0F; }));
    CHECK_FALSE(std::all_of(layer->weights()[0].value.begin(), layer->weights()[0].value.end(),
                            [](float v) { return v == 0.0F; }));

    SUBCASE("without biases") {
      auto plain = LayerRegistry::instance().create("MultiHeadAttention", {{"num_heads", 1},
                                                                           {"key_dim", 2},
                                                                           {"use_bias", false},
                                                                           {"value_dim", 5},
                                                                           {"output_shape", 4}});
      CHECK(plain->build(shapes, 1) == Shape{5, 4});
      REQUIRE(plain->weights().size() == 4);
      CHECK(plain->weights()[2].value.shape() == Shape{4, 1, 5});
      CHECK(plain->weights()[3].value.shape() == Shape{1, 5, 4});
      CHECK(plain->get_config()["output_shape"] == json::array({4}));
    }
  }

  TEST_CASE("Attention layers round trip their configs") {
    const std::vector<std::pair<std::string, json>> configs = {
        {"MultiHeadAttention",
         {{"name", "m"},
          {"num_heads", 3},
          {"key_dim", 4},
          {"value_dim", 2},
          {"dropout", 0.25},
          {"use_bias", false},
          {"output_shape", {7}},
          {"attention_axes", {1}},
          {"seed", 5},
          {"kernel_regularizer", {{"class_name", "L2"}, {"config", {{"l2", 0.01}}}}},
          {"bias_constraint", nullptr}}},
        {"Attention",
         {{"name", "a"},
          {"use_scale", true},
          {"score_mode", "concat"},
          {"dropout", 0.5},
          {"seed", 3}}},
        {"AdditiveAttention", {{"name", "b"}, {"use_scale", false}, {"dropout", 0.1}}},
    };
    for (const auto& entry : configs) {
      const std::string& class_name = entry.first;
      const json& config = entry.second;
      INFO(class_name);
      auto layer = LayerRegistry::instance().create(class_name, config);
      const json written = layer->get_config();
      for (const auto& item : config.items()) {
        const std::string key = item.key();
        const json& value = item.value();
        if (key == "kernel_regularizer") {
          CHECK(written[key]["class_name"] == "L2");
        } else if (key == "dropout") {
          CHECK(std::abs(written[key].get<double>() - value.get<double>()) < 1e-7);
        } else {
          CHECK_MESSAGE(written[key] == value, key);
        }
      }
      CHECK(LayerRegistry::instance().create(class_name, written)->get_config() == written);
    }
    // tf.keras 2 records the build shapes; Keras 3 the gate and window it has off.
    const json tf_keras2 = {{"name", "mha"},
                            {"trainable", true},
                            {"dtype", "float32"},
                            {"num_heads", 2},
                            {"key_dim", 3},
                            {"value_dim", 3},
                            {"dropout", 0.0},
                            {"use_bias", true},
                            {"output_shape", nullptr},
                            {"attention_axes", {1}},
                            {"query_shape", {nullptr, 5, 6}},
                            {"key_shape", {nullptr, 5, 6}},
                            {"value_shape", {nullptr, 5, 6}}};
    auto from_tf = LayerRegistry::instance().create("MultiHeadAttention", tf_keras2);
    const std::vector<Shape> shapes{Shape{5, 6}, Shape{5, 6}};
    CHECK(from_tf->build(shapes, 1) == Shape{5, 6});
    auto from_keras3 = LayerRegistry::instance().create(
        "MultiHeadAttention",
        {{"num_heads", 2}, {"key_dim", 3}, {"use_gate", false}, {"sliding_window", nullptr}});
    CHECK(from_keras3->get_config()["num_heads"] == 2);
    CHECK(AdditiveAttention().get_config()["use_scale"] == true);
    CHECK(Attention().get_config()["use_scale"] == false);
    CHECK(Attention().get_config()["score_mode"] == "dot");
  }

  TEST_CASE("Attention layers refuse what loadstar does not run by name") {
    const auto create = [](const std::string& class_name, json config) {
      return LayerRegistry::instance().create(class_name, config);
    };
    CHECK_THROWS_WITH_AS(
        create("MultiHeadAttention", {{"num_heads", 2}, {"key_dim", 2}, {"use_gate", true}}),
        doctest::Contains("use_gate"), ConfigError);
    CHECK_THROWS_WITH_AS(
        create("MultiHeadAttention", {{"num_heads", 2}, {"key_dim", 2}, {"sliding_window", 4}}),
        doctest::Contains("sliding_window"), ConfigError);
    CHECK_THROWS_WITH_AS(
        create("MultiHeadAttention", {{"num_heads", 2}, {"key_dim", 2}, {"output_shape", {3, 4}}}),
        doctest::Contains("output_shape"), ConfigError);
    CHECK_THROWS_WITH_AS(create("MultiHeadAttention", {{"num_heads", 0}, {"key_dim", 2}}),
                         doctest::Contains("num_heads"), ConfigError);
    CHECK_THROWS_WITH_AS(
        create("MultiHeadAttention", {{"num_heads", 1}, {"key_dim", 2}, {"dropout", 1.0}}),
        doctest::Contains("dropout"), ConfigError);
    CHECK_THROWS_WITH_AS(create("Attention", {{"score_mode", "general"}}),
                         doctest::Contains("score_mode"), ConfigError);
    const std::vector<Shape> rank3{Shape{2, 3, 4}, Shape{2, 3, 4}};
    // Axes that are no step axis of the inputs (the batch, the features, one named twice).
    for (const json& given : {json{3}, json{0}, json{-1}, json{2, -2}}) {
      INFO(given.dump());
      auto wrong =
          create("MultiHeadAttention",
                 {{"name", "axes"}, {"num_heads", 1}, {"key_dim", 2}, {"attention_axes", given}});
      CHECK_THROWS_WITH_AS(wrong->build(rank3, 1),
                           doctest::Contains(") must be distinct axes between the batch and the "
                                             "features of inputs (None, 2, 3, 4) (1 to 2, or -3 "
                                             "to -2)"),
                           ConfigError);
    }
    auto axes = create("MultiHeadAttention",
                       {{"name", "axes"}, {"num_heads", 1}, {"key_dim", 2}, {"attention_axes", 3}});
    CHECK_THROWS_WITH_AS(axes->build(rank3, 1),
                         "multi_head_attention layer 'axes': attention_axes (3) must be distinct "
                         "axes between the batch and the features of inputs (None, 2, 3, 4) (1 to "
                         "2, or -3 to -2)",
                         ConfigError);
    // The axes not attended are batch axes: the query and the value must agree on them.
    auto over_s = create("MultiHeadAttention",
                         {{"name", "s"}, {"num_heads", 1}, {"key_dim", 2}, {"attention_axes", 2}});
    const std::vector<Shape> other_t{Shape{2, 3, 4}, Shape{5, 3, 4}};
    CHECK_THROWS_WITH_AS(over_s->build(other_t, 1),
                         "multi_head_attention layer 's': expects a query and a value of the same "
                         "lengths along the axes not attended (attention_axes (2)) but got (None, "
                         "2, 3, 4) and (None, 5, 3, 4)",
                         ShapeError);
    const std::vector<Shape> other_s{Shape{2, 3, 4}, Shape{2, 5, 4}};
    CHECK(over_s->build(other_s, 1) == Shape{2, 3, 4});
    // Keras's causal mask runs along the first step axis: attention over it alone.
    for (const json& given : {json{2}, json{1, 2}, json(nullptr)}) {
      INFO(given.dump());
      auto causal =
          create("MultiHeadAttention",
                 {{"name", "c"}, {"num_heads", 1}, {"key_dim", 2}, {"attention_axes", given}});
      dynamic_cast<loadstar::keras::detail::CallArguments&>(*causal).apply_call_kwargs(
          {{"use_causal_mask", true}}, "call");
      CHECK_THROWS_WITH_AS(causal->build(rank3, 1),
                           doctest::Contains("multi_head_attention layer 'c': use_causal_mask "
                                             "expects attention over the first step axis alone "
                                             "(inputs (None, steps, features), or attention_axes "
                                             "(1)) but the query is (None, 2, 3, 4) with "),
                           ShapeError);
    }
    auto causal_t =
        create("MultiHeadAttention",
               {{"num_heads", 1}, {"key_dim", 2}, {"attention_axes", {-3}}, {"name", "t"}});
    dynamic_cast<loadstar::keras::detail::CallArguments&>(*causal_t).apply_call_kwargs(
        {{"use_causal_mask", true}}, "call");
    CHECK(causal_t->build(rank3, 1) == Shape{2, 3, 4});
    // The attention mask has the scores' shape without the heads.
    auto masked = create("MultiHeadAttention",
                         {{"name", "m"}, {"num_heads", 1}, {"key_dim", 2}, {"attention_axes", 2}});
    dynamic_cast<loadstar::keras::detail::CallArguments&>(*masked).apply_call_kwargs(
        {{"attention_mask", {"mask", 0, 0}}}, "call");
    const std::vector<Shape> wrong_mask{Shape{2, 3, 4}, Shape{2, 5, 4}, Shape{3, 5}};
    CHECK_THROWS_WITH_AS(masked->build(wrong_mask, 1),
                         "multi_head_attention layer 'm': expects an attention mask (None, 2, 3, "
                         "5) (the scores' shape without the heads: the axes not attended, the "
                         "query's attended axes, the value's) for the query (None, 2, 3, 4) and "
                         "the value (None, 2, 5, 4) with attention_axes (2) but got (None, 3, 5)",
                         ShapeError);
    // The default axes spelled out, negative ones included, are accepted.
    auto spelled = create("MultiHeadAttention",
                          {{"num_heads", 1}, {"key_dim", 2}, {"attention_axes", {-3, 2}}});
    CHECK(spelled->build(rank3, 1) == Shape{2, 3, 4});
    auto one = create("MultiHeadAttention", {{"name", "one"}, {"num_heads", 1}, {"key_dim", 2}});
    const std::vector<Shape> single{Shape{3, 4}};
    CHECK_THROWS_WITH_AS(one->build(single, 1),
                         "multi_head_attention layer 'one': expects 2 inputs (query, value) or 3 "
                         "(query, value, key) but got 1",
                         ShapeError);
    const std::vector<Shape> mismatched{Shape{3, 4}, Shape{5, 4}, Shape{6, 4}};
    CHECK_THROWS_WITH_AS(one->build(mismatched, 1), doctest::Contains("value and key alike"),
                         ShapeError);
    auto attention = create("Attention", {{"name", "att"}});
    const std::vector<Shape> wrong_key{Shape{3, 4}, Shape{5, 2}, Shape{5, 3}};
    CHECK_THROWS_WITH_AS(attention->build(wrong_key, 1),
                         "attention layer 'att': expects a query (None, Tq, dim), a value (None, "
                         "Tv, value_dim) and a key (None, Tv, dim) but got (None, 3, 4), (None, 5, "
                         "2) and (None, 5, 3)",
                         ShapeError);
    auto& arguments = dynamic_cast<loadstar::keras::detail::CallArguments&>(*one);
    CHECK_THROWS_WITH_AS(arguments.apply_call_kwargs({{"attention_mask", 3}}, "call"),
                         "call: the call argument 'attention_mask' is not supported (loadstar's "
                         "attention layers take no masks; use_causal_mask is)",
                         ConfigError);

    CHECK_THROWS_WITH_AS(arguments.apply_call_kwargs({{"return_attention_scores", "yes"}}, "call"),
                         "call: return_attention_scores: expected a boolean but found \"yes\"",
                         ConfigError);
    auto& attention_arguments = dynamic_cast<loadstar::keras::detail::CallArguments&>(*attention);
    CHECK_THROWS_WITH_AS(
        attention_arguments.apply_call_kwargs({{"attention_mask", {"m", 0, 0}}}, "call"),
        doctest::Contains("the call argument 'attention_mask' is not supported"), ConfigError);
    // return_attention_scores: the call returns the scores too, in every call of the layer.
    attention_arguments.apply_call_kwargs({{"return_attention_scores", true}}, "call");
    CHECK(attention->output_count() == 2);
    CHECK_THROWS_WITH_AS(
        attention_arguments.apply_call_kwargs({{"return_attention_scores", false}}, "call"),
        doctest::Contains("call: return_attention_scores is false but an earlier call of the "
                          "layer has true"),
        ConfigError);
    CHECK_THROWS_WITH_AS(arguments.apply_call_kwargs({{"use_causal_mask", "yes"}}, "call"),
                         doctest::Contains("use_causal_mask: expected a boolean"), ConfigError);
    CHECK_THROWS_WITH_AS(arguments.apply_call_kwargs({{"scores", 1}}, "call"),
                         "call: unknown call argument 'scores'", ConfigError);
  }

  TEST_CASE("MultiHeadAttention reads its call arguments from tf.keras 2 and Keras 3 configs") {
    const Tensor<float> x = layer_cases::wave(Shape{3, 5, 6}, 1.0F, 0.0F, 0.61F);
    // A change at the last step moves every step's output without the causal mask, and only the
    // last step's with it.
    Tensor<float> changed = x.clone();
    for (std::size_t b = 0; b < 3; ++b)
      for (std::size_t f = 0; f < 6; ++f)
        changed.data()[(b * 5 + 4) * 6 + f] += 1.0F;
    for (const bool causal : {false, true}) {
      INFO("causal ", causal);
      const json kwargs = causal ? json{{"use_causal_mask", true}} : json::object();
      auto model = model_from_config(legacy_mha_model(mha_config(), kwargs));
      REQUIRE(model->layers().size() == 1);
      CHECK(model->layers()[0]->built_input_shapes() ==
            std::vector<Shape>{Shape{5, 6}, Shape{5, 6}});
      const Tensor<float> a = model->predict(x, {.verbose = 0});
      const Tensor<float> b = model->predict(changed, {.verbose = 0});
      double first_steps = 0.0;
      for (std::size_t bi = 0; bi < 3; ++bi)
        for (std::size_t i = 0; i < 4 * 6; ++i)
          first_steps = std::max(first_steps,
                                 double(std::abs(a.data()[bi * 30 + i] - b.data()[bi * 30 + i])));
      if (causal) {
        CHECK(first_steps == 0.0);
      } else {
        CHECK(first_steps > 1e-3);
      }
      // The config the model writes records the call as tf.keras 2 does.
      const json written = model_get_config(*model);
      const json& node = written["config"]["layers"][1]["inbound_nodes"][0];
      REQUIRE(node.size() == 1);
      CHECK(node[0][3]["value"] == json::array({"x", 0, 0}));
      CHECK(node[0][3].value("use_causal_mask", false) == causal);
      CHECK(model_get_config(*model_from_config(written)) == written);
      // Keras 3's node format: {"args": [query, value], "kwargs": {...}}.
      const auto keras_tensor = [](const char* name) {
        return json{
            {"class_name", "__keras_tensor__"},
            {"config",
             {{"shape", {nullptr, 5, 6}}, {"dtype", "float32"}, {"keras_history", {name, 0, 0}}}}};
      };
      json keras3 = legacy_mha_model(mha_config(), kwargs);
      keras3["config"]["layers"][1]["inbound_nodes"] =
          json::array({{{"args", {keras_tensor("x"), keras_tensor("x")}}, {"kwargs", kwargs}}});
      const auto legacy = loadstar::keras::detail::legacy_model_config(keras3);
      auto from_keras3 = model_from_config(legacy);
      from_keras3->set_weights(model->get_weights());
      CHECK(layer_cases::same_bits(from_keras3->predict(x, {.verbose = 0}), a));
    }
    SUBCASE("a call argument loadstar does not run is refused by name") {
      // An attention mask of the wrong shape (the model's one input is (5, 6)).
      CHECK_THROWS_WITH_AS(
          model_from_config(legacy_mha_model(mha_config(), {{"attention_mask", {"x", 0, 0}}})),
          doctest::Contains("expects an attention mask (None, query steps, value steps)"),
          ShapeError);
      // return_attention_scores is run: the layer returns two tensors.
      const auto scored =
          model_from_config(legacy_mha_model(mha_config(), {{"return_attention_scores", true}}));
      bool found = false;
      for (const auto& layer : scored->layers()) {
        if (layer->class_name() != "MultiHeadAttention") continue;
        CHECK(layer->output_count() == 2);
        found = true;
      }
      CHECK(found);
    }
  }

  TEST_CASE("MultiHeadAttention waits for a value made by a layer listed after it") {
    // The value is the output of `d`, which the config lists after the attention layer; a shared
    // attention layer's second call asks for another use_causal_mask and is refused.
    const json input = {{"class_name", "InputLayer"},
                        {"name", "x"},
                        {"config", {{"batch_input_shape", {nullptr, 5, 6}}, {"name", "x"}}},
                        {"inbound_nodes", json::array()}};
    const json dense = {{"class_name", "Dense"},
                        {"name", "d"},
                        {"config", {{"name", "d"}, {"units", 6}}},
                        {"inbound_nodes", {{{"x", 0, 0, json::object()}}}}};
    const auto model_of = [&](const json& nodes, const json& outputs) {
      return json{{"class_name", "Functional"},
                  {"config",
                   {{"name", "later"},
                    {"layers",
                     {input,
                      {{"class_name", "MultiHeadAttention"},
                       {"name", "mha"},
                       {"config", mha_config()},
                       {"inbound_nodes", nodes}},
                      dense}},
                    {"input_layers", {{"x", 0, 0}}},
                    {"output_layers", outputs}}}};
    };
    // One call: [[query, node, tensor, {kwargs}]].
    const json first = json::array(
        {json::array({"x", 0, 0, {{"value", {"d", 0, 0}}, {"use_causal_mask", true}}})});
    auto model = model_from_config(
        model_of(json::array({first}), json::array({json::array({"mha", 0, 0})})));
    CHECK(model->predict(layer_cases::wave(Shape{2, 5, 6}, 1.0F, 0.0F, 0.61F), {.verbose = 0})
              .shape() == Shape{2, 5, 6});
    const json second = json::array({json::array({"d", 0, 0, {{"value", {"x", 0, 0}}}})});
    CHECK_THROWS_WITH_AS(
        model_from_config(
            model_of(json::array({first, second}),
                     json::array({json::array({"mha", 0, 0}), json::array({"mha", 1, 0})}))),
        doctest::Contains("inbound_nodes[1]: use_causal_mask is false but an earlier call of "
                          "the layer has true (loadstar applies one use_causal_mask to every "
                          "call of a layer)"),
        ConfigError);
  }

  TEST_CASE("MultiHeadAttention with a key input saves to h5 and keras files in Keras's layout") {
    auto q = Input({4, 6}, "q"), v = Input({5, 3}, "v"), k = Input({5, 2}, "k");
    auto mha = std::make_shared<MultiHeadAttention>(
        2, 3, MultiHeadAttentionOptions{.value_dim = 4, .use_causal_mask = true, .name = "mha"});
    auto y = call(mha, {q, v, k});
    auto att = call(Attention({.use_scale = true, .name = "att"}), {y, y});
    auto add = call(AdditiveAttention({.name = "add"}), {att, y, y});
    auto model = std::make_shared<Model>(std::vector{q, v, k}, std::vector{add}, "attention");
    model->compile({.optimizer = "adam", .loss = "mse"});
    const std::vector<Tensor<float>> x{layer_cases::wave(Shape{3, 4, 6}, 1.0F, 0.0F, 0.61F),
                                       layer_cases::wave(Shape{3, 5, 3}, 0.7F, 0.2F, 0.61F),
                                       layer_cases::wave(Shape{3, 5, 2}, 0.9F, 0.5F, 0.61F)};
    const Tensor<float> target = layer_cases::wave(Shape{3, 4, 6}, 0.3F, 1.0F, 0.61F);
    const auto before = model->get_weights();
    model->train_on_batch(x, target);
    model->train_on_batch(x, target);
    for (std::size_t i = 0; i < before.size(); ++i)
      CHECK_FALSE(layer_cases::same_bits(before[i], model->get_weights()[i]));
    const Tensor<float> expected = model->predict(x, {.verbose = 0});
    const json full = model_get_config(*model);
    test_support::TempDir dir;
    for (const char* file : {"model.h5", "model.keras"}) {
      INFO(file);
      model->save(dir / file);
      const auto loaded = load_model(dir / file);
      CHECK(model_get_config(*loaded) == full);
      CHECK(layer_cases::same_bits(loaded->predict(x, {.verbose = 0}), expected));
      const auto stored = loadstar::keras::detail::read_model_file(
          dir / file, loadstar::Trust::trusted, std::chrono::milliseconds(10000));
      std::vector<std::string> names, groups;
      for (const auto& layer : stored.layers) {
        if (layer.name.rfind("mha", 0) != 0 && layer.name.rfind("multi_head_attention", 0) != 0)
          continue;
        groups.push_back(layer.name);
        for (const auto& w : layer.weights)
          names.push_back(w.name);
      }
      if (std::string(file) == "model.h5") {
        CHECK(names == std::vector<std::string>{
                           "mha/query/kernel:0", "mha/query/bias:0", "mha/key/kernel:0",
                           "mha/key/bias:0", "mha/value/kernel:0", "mha/value/bias:0",
                           "mha/attention_output/kernel:0", "mha/attention_output/bias:0"});
      } else {
        std::sort(groups.begin(), groups.end());
        CHECK(groups == std::vector<std::string>{
                            "multi_head_attention", "multi_head_attention/_dropout_layer",
                            "multi_head_attention/_softmax", "multi_head_attention/key_dense",
                            "multi_head_attention/output_dense", "multi_head_attention/query_dense",
                            "multi_head_attention/value_dense"});
        const std::string at = "layers/multi_head_attention/";
        CHECK(names ==
              std::vector<std::string>{at + "key_dense/vars/0", at + "key_dense/vars/1",
                                       at + "output_dense/vars/0", at + "output_dense/vars/1",
                                       at + "query_dense/vars/0", at + "query_dense/vars/1",
                                       at + "value_dense/vars/0", at + "value_dense/vars/1"});
      }
    }
    // The configs' calls: the key among MultiHeadAttention's kwargs, use_causal_mask recorded.
    json mha_node;
    for (const auto& entry : full["config"]["layers"])
      if (entry["name"] == "mha") mha_node = entry["inbound_nodes"][0][0];
    REQUIRE(mha_node.is_array());
    CHECK(mha_node[3]["value"] == json::array({"v", 0, 0}));
    CHECK(mha_node[3]["key"] == json::array({"k", 0, 0}));
    CHECK(mha_node[3]["use_causal_mask"] == true);
  }

  TEST_CASE("Softmax takes Keras's call argument mask as its second input, in configs and files") {
    auto scores = Input({3, 4}, "scores");
    auto mask = Input({3, 4}, "mask");
    auto y = call(std::make_shared<Softmax>(SoftmaxOptions{.name = "softmax"}), {scores, mask});
    Model model({scores, mask}, {y}, "masked_softmax");
    const Tensor<float> x = layer_cases::wave(Shape{2, 3, 4}, 2.0F, 0.1F, 0.37F);
    Tensor<float> m(Shape{2, 3, 4}, 1.0F);
    for (std::size_t i = 0; i < m.size(); ++i)
      m.data()[i] = i % 3 == 1 ? 0.0F : 1.0F;
    for (std::size_t j = 0; j < 4; ++j)
      m.data()[4 + j] = 0.0F;  // sample 0, row 1: masked along the whole axis
    const auto out = model.predict_outputs(std::vector<Tensor<float>>{x, m}, {.verbose = 0})[0];
    for (std::size_t row = 0; row < 6; ++row) {
      double sum = 0.0;
      for (std::size_t j = 0; j < 4; ++j) {
        const std::size_t i = row * 4 + j;
        if (m.data()[i] == 0.0F) CHECK(out.data()[i] == 0.0F);
        sum += out.data()[i];
      }
      CHECK(sum == doctest::Approx(row == 1 ? 0.0 : 1.0));
    }
    // The call as tf.keras 2 records it, and read back.
    const json written = model_get_config(model);
    const json& node = written["config"]["layers"][2]["inbound_nodes"][0];
    CHECK(node[0][3]["mask"] == json::array({"mask", 0, 0}));
    CHECK(model_get_config(*model_from_config(written)) == written);
    // Keras 3's node: {"args": [scores], "kwargs": {"mask": <the mask tensor>}}.
    const auto keras_tensor = [](const char* name) {
      return json{
          {"class_name", "__keras_tensor__"},
          {"config",
           {{"shape", {nullptr, 3, 4}}, {"dtype", "float32"}, {"keras_history", {name, 0, 0}}}}};
    };
    json keras3 = written;
    keras3["config"]["layers"][2]["inbound_nodes"] = json::array(
        {{{"args", {keras_tensor("scores")}}, {"kwargs", {{"mask", keras_tensor("mask")}}}}});
    const auto from_keras3 =
        model_from_config(loadstar::keras::detail::legacy_model_config(keras3));
    CHECK(layer_cases::same_bits(
        from_keras3->predict_outputs(std::vector<Tensor<float>>{x, m}, {.verbose = 0})[0], out));
    test_support::TempDir dir;
    for (const char* file : {"model.h5", "model.keras"}) {
      INFO(file);
      model.save(dir / file);
      CHECK(layer_cases::same_bits(
          load_model(dir / file)
              ->predict_outputs(std::vector<Tensor<float>>{x, m}, {.verbose = 0})[0],
          out));
    }
    // A mask broadcasts from the last axis, as NumPy's (Keras 3's where): (None, 5) does not
    // meet (3, 4); (None, 4) does, its batch axis meeting the inputs' 3 rows when a batch comes.
    CHECK_THROWS_WITH_AS(
        call(std::make_shared<Softmax>(SoftmaxOptions{.name = "s"}), {scores, Input({5}, "short")}),
        "softmax layer 's': expects a mask of at most the inputs' rank whose every axis is 1 or "
        "the length of the inputs' axis it meets, counted from the last (inputs (None, 3, 4)) but "
        "got a mask of shape (None, 5)",
        ShapeError);
    CHECK_NOTHROW(call(std::make_shared<Softmax>(SoftmaxOptions{.name = "lower"}),
                       {scores, Input({4}, "lower_mask")}));
    // With steps of unknown length, a batch's mask of other lengths is refused when it comes.
    Softmax unknown({.name = "u"});
    const Shape unknown_steps[] = {Shape{loadstar::keras::none, 4},
                                   Shape{loadstar::keras::none, 4}};
    unknown.build(unknown_steps, 0);
    CpuBackend backend(1);
    const Tensor<float> scores_batch(Shape{2, 3, 4}), other_mask(Shape{2, 5, 4});
    const Tensor<float> probabilities(Shape{2, 3, 4});
    const Tensor<float> both[] = {scores_batch, other_mask};
    CHECK_THROWS_WITH_AS(unknown.forward(both, probabilities, {.backend = backend}),
                         "softmax layer 'u': expects a mask of at most the inputs' rank whose "
                         "every axis is 1 or the length of the inputs' axis it meets, counted from "
                         "the last (inputs (2, 3, 4)) but got one of shape (2, 5, 4)",
                         ShapeError);
    Softmax softmax({.name = "s"});
    CHECK_THROWS_WITH_AS(softmax.apply_call_kwargs({{"axis", 1}}, "call"),
                         "call: unknown call argument 'axis' of Softmax (its call takes the "
                         "inputs and a mask)",
                         ConfigError);
  }

  TEST_CASE("MultiHeadAttention drops attention probabilities in training only") {
    auto x = Input({6, 4}, "x");
    auto mha = std::make_shared<MultiHeadAttention>(
        2, 4, MultiHeadAttentionOptions{.dropout = 0.5F, .seed = 11, .name = "mha"});
    auto model = std::make_shared<Model>(std::vector{x}, std::vector{call(mha, {x, x})}, "drop");
    model->compile({.optimizer = "sgd", .loss = "mse"});
    const Tensor<float> data = layer_cases::wave(Shape{2, 6, 4}, 1.0F, 0.0F, 0.61F);
    const Tensor<float> a = model->predict(data, {.verbose = 0});
    CHECK(layer_cases::same_bits(model->predict(data, {.verbose = 0}), a));
    // Inference equals the same layer without dropout.
    auto plain = std::make_shared<MultiHeadAttention>(2, 4, MultiHeadAttentionOptions{.name = "p"});
    auto plain_model =
        std::make_shared<Model>(std::vector{x}, std::vector{call(plain, {x, x})}, "plain");
    plain_model->set_weights(model->get_weights());
    CHECK(layer_cases::same_bits(plain_model->predict(data, {.verbose = 0}), a));
    // A training step's loss differs from the inference loss (probabilities dropped).
    const double inference = model->test_on_batch(data, data).get("loss").value();
    const double training = model->train_on_batch(data, data).get("loss").value();
    CHECK(std::abs(training - inference) > 1e-4);
  }

  TEST_CASE("MultiHeadAttention applies its kernel regularizer to the four kernels") {
    auto x = Input({3, 4}, "x");
    auto mha = LayerRegistry::instance().create(
        "MultiHeadAttention",
        {{"name", "mha"},
         {"num_heads", 2},
         {"key_dim", 2},
         {"use_bias", false},
         {"kernel_regularizer", {{"class_name", "L2"}, {"config", {{"l2", 0.5}}}}}});
    auto model = std::make_shared<Model>(std::vector{x}, std::vector{call(mha, {x, x})}, "reg");
    model->compile({.optimizer = "sgd", .loss = "mse"});
    const Tensor<float> data = layer_cases::wave(Shape{2, 3, 4}, 1.0F, 0.0F, 0.61F);
    const Tensor<float> prediction = model->predict(data, {.verbose = 0});
    double mse = 0.0;
    for (std::size_t i = 0; i < data.size(); ++i)
      mse += std::pow(double(prediction.data()[i]) - data.data()[i], 2.0);
    mse /= double(data.size());
    double penalty = 0.0;
    for (const auto& w : model->get_weights())
      for (float v : w)
        penalty += 0.5 * double(v) * v;
    const double loss = model->test_on_batch(data, data).get("loss").value();
    CHECK(loss == doctest::Approx(mse + penalty).epsilon(1e-5));
    CHECK(mha->get_config()["kernel_regularizer"]["config"]["l2"] == doctest::Approx(0.5));
  }

  TEST_CASE("A Transformer encoder block trains as PyTorch does") {
    const json reference = layer_cases::load("attention_transformer.json");
    const auto size = [&](const char* key) { return reference[key].get<std::size_t>(); };
    const std::size_t vocab = size("vocab"), steps = size("steps"), embed = size("embed"),
                      heads = size("heads"), ff = size("ff"), batch = size("batch"),
                      classes = size("classes");
    auto tokens = Input({steps}, "tokens"), positions = Input({steps}, "positions");
    auto token_embedding = call(Embedding(vocab, embed, {.name = "token_embedding"}), tokens);
    auto position_embedding =
        call(Embedding(steps, embed, {.name = "position_embedding"}), positions);
    auto x = call(Add(), {token_embedding, position_embedding});
    auto attention = call(std::make_shared<MultiHeadAttention>(
                              heads, embed, MultiHeadAttentionOptions{.name = "mha"}),
                          {x, x});
    attention = call(Dropout(0.0), attention);
    auto out1 =
        call(LayerNormalization({.epsilon = 1e-6F, .name = "norm1"}), call(Add(), {x, attention}));
    auto ffn = call(Dense(ff, {.activation = "relu", .name = "ffn1"}), out1);
    ffn = call(Dropout(0.0), call(Dense(embed, {.name = "ffn2"}), ffn));
    auto out2 =
        call(LayerNormalization({.epsilon = 1e-6F, .name = "norm2"}), call(Add(), {out1, ffn}));
    auto pooled = call(GlobalAveragePooling1D(), out2);
    auto hidden = call(Dense(10, {.activation = "relu", .name = "hidden"}), pooled);
    auto probabilities = call(Dense(classes, {.activation = "softmax", .name = "logits"}), hidden);
    Model model({tokens, positions}, {probabilities}, "transformer");
    std::vector<Tensor<float>> weights;
    for (const auto& layer : model.layers()) {
      for (const auto& w : layer->weights()) {
        INFO(layer->name(), "/", w.name);
        REQUIRE(reference["weights"][layer->name()].contains(w.name));
        weights.push_back(
            layer_cases::tensor_of(reference["weights"][layer->name()][w.name], w.value.shape()));
      }
    }
    model.set_weights(weights);
    model.compile({.optimizer = optimizers::SGD(optimizers::SGDOptions{
                       .learning_rate = reference["learning_rate"].get<double>()}),
                   .loss = "sparse_categorical_crossentropy"});
    Tensor<float> position_batch(Shape{batch, steps});
    for (std::size_t b = 0; b < batch; ++b)
      for (std::size_t s = 0; s < steps; ++s)
        position_batch.data()[b * steps + s] = float(s);
    const auto batch_of = [&](std::size_t step) {
      std::vector<Tensor<float>> x{Tensor<float>(Shape{batch, steps}), position_batch};
      for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t s = 0; s < steps; ++s)
          x[0].data()[b * steps + s] = reference["tokens"][step][b][s].get<float>();
      return x;
    };
    for (std::size_t step = 0; step < reference["losses"].size(); ++step) {
      INFO("step ", step);
      Tensor<float> labels(Shape{batch});
      for (std::size_t b = 0; b < batch; ++b)
        labels.data()[b] = reference["labels"][step][b].get<float>();
      const double loss = model.train_on_batch(batch_of(step), labels).get("loss").value();
      CHECK(loss == doctest::Approx(reference["losses"][step].get<double>()).epsilon(1e-5));
    }
    layer_cases::check_close("predictions after training",
                             model.predict(batch_of(0), {.verbose = 0}),
                             reference["final_predictions"]);
    for (const auto& layer : model.layers())
      for (const auto& w : layer->weights())
        layer_cases::check_close(layer->name() + "/" + w.name, w.value,
                                 reference["final_weights"][layer->name()][w.name]);
  }

  TEST_CASE("A Transformer encoder block learns which token is the majority") {
    // Sequences of 9 tokens from {1, 2}: the label is the token that appears most (0 for 1).
    constexpr std::size_t steps = 9, samples = 256, embed = 16;
    Tensor<float> tokens(Shape{samples, steps}), positions(Shape{samples, steps}),
        labels(Shape{samples});
    loadstar::SplitMix64 random(2024);
    for (std::size_t n = 0; n < samples; ++n) {
      std::size_t ones = 0;
      for (std::size_t s = 0; s < steps; ++s) {
        const bool one = random.below(2) == 0;
        ones += one ? 1 : 0;
        tokens.data()[n * steps + s] = one ? 1.0F : 2.0F;
        positions.data()[n * steps + s] = float(s);
      }
      labels.data()[n] = ones * 2 > steps ? 0.0F : 1.0F;
    }
    set_random_seed(7);
    auto token_input = Input({steps}, "tokens"), position_input = Input({steps}, "positions");
    auto x = call(Add(), {call(Embedding(3, embed), token_input),
                          call(Embedding(steps, embed), position_input)});
    auto attention = call(
        std::make_shared<MultiHeadAttention>(2, embed, MultiHeadAttentionOptions{.dropout = 0.1F}),
        {x, x});
    auto out1 = call(LayerNormalization({.epsilon = 1e-6F}),
                     call(Add(), {x, call(Dropout(0.1), attention)}));
    auto ffn = call(Dense(embed), call(Dense(32, {.activation = "relu"}), out1));
    auto out2 =
        call(LayerNormalization({.epsilon = 1e-6F}), call(Add(), {out1, call(Dropout(0.1), ffn)}));
    auto pooled = call(Dropout(0.1), call(GlobalAveragePooling1D(), out2));
    auto hidden = call(Dense(20, {.activation = "relu"}), pooled);
    Model model({token_input, position_input}, {call(Dense(2, {.activation = "softmax"}), hidden)},
                "majority");
    model.compile({.optimizer = optimizers::Adam(optimizers::AdamOptions{.learning_rate = 0.005}),
                   .loss = "sparse_categorical_crossentropy",
                   .metrics = {"accuracy"}});
    const std::vector<Tensor<float>> inputs{tokens, positions};
    model.fit(inputs, labels, {.epochs = 30, .batch_size = 32, .verbose = 0});
    const double accuracy = model.evaluate(inputs, labels, {.verbose = 0}).get("accuracy").value();
    CHECK(accuracy > 0.95);
  }

  TEST_CASE("MultiHeadAttention over other attention_axes matches the PyTorch reference values") {
    // attention_axes (2) and (-3) on (None, T, S, features), (1) with the causal mask and with an
    // attention mask, (2, 3) and (3, 1) on rank-5 inputs.
    REQUIRE(attention_reference()["axes_cases"].size() >= 7);
    for (std::size_t threads : {1, 3}) {
      CpuBackend backend(threads);
      for (const auto& c : attention_reference()["axes_cases"])
        layer_cases::run_case(c, backend);
    }
  }

  TEST_CASE("MultiHeadAttention returns the scores of other attention_axes as PyTorch does") {
    REQUIRE(attention_reference()["scores_cases"].size() >= 4);
    for (std::size_t threads : {1, 3}) {
      CpuBackend backend(threads);
      for (const auto& c : attention_reference()["scores_cases"])
        run_scores_case(c, backend);
    }
  }

  TEST_CASE("MultiHeadAttention over other attention_axes saves loads and prints in Keras's way") {
    // Attention over S for each T, returning its scores, then over T for each S with the causal
    // mask (attention_axes -3, the first step axis of (None, T, S, features)).
    auto x = Input({3, 4, 5}, "x");
    auto over_s = std::make_shared<MultiHeadAttention>(
        2, 3,
        MultiHeadAttentionOptions{
            .attention_axes = {2}, .return_attention_scores = true, .name = "over_s"});
    const auto first = call_outputs(over_s, {x, x});
    auto over_t = std::make_shared<MultiHeadAttention>(
        1, 2,
        MultiHeadAttentionOptions{
            .value_dim = 3, .attention_axes = {-3}, .use_causal_mask = true, .name = "over_t"});
    auto y = call(over_t, {first[0], x});
    auto scores = call(layers::Activation("linear", {.name = "scores"}), first[1]);
    Model model({x}, {y, scores}, "axes");
    // Keras's einsum's scores: (batch, T, heads, S, S).
    CHECK(model.outputs()[1].shape() == Shape{3, 2, 4, 4});
    const Tensor<float> data = layer_cases::wave(Shape{2, 3, 4, 5}, 1.0F, 0.3F, 0.53F);
    const auto expected = model.predict_outputs(data, {.verbose = 0});
    REQUIRE(expected.size() == 2);
    CHECK(expected[1].shape() == Shape{2, 3, 2, 4, 4});
    // Each (sample, T, head, query step) row of the scores is a softmax over S.
    for (std::size_t row = 0; row < expected[1].size() / 4; ++row) {
      double sum = 0.0;
      for (std::size_t j = 0; j < 4; ++j)
        sum += expected[1].data()[row * 4 + j];
      CHECK(sum == doctest::Approx(1.0).epsilon(1e-6));
    }
    // The causal mask over T: a change at the last T leaves the earlier T's outputs alone.
    Tensor<float> changed = data.clone();
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t i = 0; i < 4 * 5; ++i)
        changed.data()[b * 60 + 2 * 20 + i] += 1.0F;
    const Tensor<float> moved = model.predict_outputs(changed, {.verbose = 0})[0];
    double earlier = 0.0, last = 0.0;
    for (std::size_t b = 0; b < 2; ++b) {
      for (std::size_t i = 0; i < 60; ++i) {
        const double d = std::abs(moved.data()[b * 60 + i] - expected[0].data()[b * 60 + i]);
        (i < 40 ? earlier : last) = std::max(i < 40 ? earlier : last, d);
      }
    }
    CHECK(earlier == 0.0);
    CHECK(last > 1e-3);
    // The configs carry the axes as given, and the calls' arguments.
    const json full = model_get_config(model);
    json configs = json::object();
    for (const auto& entry : full["config"]["layers"])
      configs[entry["name"].get<std::string>()] = entry;
    CHECK(configs["over_s"]["config"]["attention_axes"] == json::array({2}));
    CHECK(configs["over_t"]["config"]["attention_axes"] == json::array({-3}));
    CHECK(configs["over_s"]["inbound_nodes"][0][0][3]["return_attention_scores"] == true);
    CHECK(configs["over_t"]["inbound_nodes"][0][0][3]["use_causal_mask"] == true);
    const auto rebuilt = model_from_config(full);
    CHECK(model_get_config(*rebuilt) == full);
    rebuilt->set_weights(model.get_weights());
    const auto again = rebuilt->predict_outputs(data, {.verbose = 0});
    CHECK(layer_cases::same_bits(again[0], expected[0]));
    CHECK(layer_cases::same_bits(again[1], expected[1]));
    for (const char* layer_name : {"over_s", "over_t"}) {
      const json config = configs[layer_name]["config"];
      CHECK(LayerRegistry::instance().create("MultiHeadAttention", config)->get_config() == config);
    }
    test_support::TempDir dir;
    for (const char* file : {"model.h5", "model.keras"}) {
      INFO(file);
      model.save(dir / file);
      const auto loaded = load_model(dir / file);
      CHECK(model_get_config(*loaded) == full);
      const auto read = loaded->predict_outputs(data, {.verbose = 0});
      REQUIRE(read.size() == 2);
      CHECK(layer_cases::same_bits(read[0], expected[0]));
      CHECK(layer_cases::same_bits(read[1], expected[1]));
    }
    // The summary prints both outputs' shapes (cut at the column's width as Keras cuts them),
    // and the scores' shape where a layer reads them.
    std::ostringstream out;
    model.summary(out);
    INFO(out.str());
    CHECK(out.str().find(" over_s (MultiHeadAttention)    [(None, 3, 4, 5), (  143") !=
          std::string::npos);
    CHECK(out.str().find(" over_t (MultiHeadAttention)    (None, 3, 4, 5)      62") !=
          std::string::npos);
    CHECK(out.str().find(" scores (Activation)            (None, 3, 2, 4, 4)   0           "
                         "['over_s[0][1]']") != std::string::npos);
  }

  TEST_CASE("MultiHeadAttention over other attention_axes trains through its scores") {
    // A loss on the scores alone moves the query and key kernels (the value's and the output's
    // do not reach the scores).
    auto x = Input({2, 3, 4}, "x");
    const auto outputs = call_outputs(
        std::make_shared<MultiHeadAttention>(
            2, 2,
            MultiHeadAttentionOptions{
                .attention_axes = {1}, .return_attention_scores = true, .name = "mha"}),
        {x, x});
    Model model({x}, {outputs[1]}, "scores_only");
    model.compile({.optimizer = "sgd", .loss = "mse"});
    const Tensor<float> data = layer_cases::wave(Shape{4, 2, 3, 4}, 1.0F, 0.0F, 0.61F);
    // Scores (batch, S, heads, T, T): attend to the other step.
    Tensor<float> target(Shape{4, 3, 2, 2, 2});
    for (std::size_t i = 0; i < target.size(); ++i)
      target.data()[i] = (i / 2) % 2 == i % 2 ? 0.0F : 1.0F;
    const auto before = model.get_weights();
    const double first = model.train_on_batch(data, target).get("loss").value();
    for (int step = 0; step < 20; ++step)
      model.train_on_batch(data, target);
    const double later = model.test_on_batch(data, target).get("loss").value();
    CHECK(later < first);
    const auto after = model.get_weights();
    // query/kernel, query/bias, key/kernel move; key/bias does not change the softmax (a
    // constant per query row); the value and output weights get no gradient.
    CHECK_FALSE(layer_cases::same_bits(before[0], after[0]));
    CHECK_FALSE(layer_cases::same_bits(before[2], after[2]));
    for (std::size_t i = 4; i < 8; ++i)
      CHECK(layer_cases::same_bits(before[i], after[i]));
  }

  TEST_CASE("MultiHeadAttention applies the inputs' masks over the last step axis as Keras does") {
    // Masking over (None, T, S, features) gives masks (None, T, S); with attention_axes (2),
    // Keras joins the query's and the value's into (None, T, S, S), the same as this attention
    // mask given explicitly.
    auto x = Input({3, 4, 5}, "x");
    auto masked_x = call(Masking({.mask_value = 0.0F}), x);
    auto mha = std::make_shared<MultiHeadAttention>(
        2, 3, MultiHeadAttentionOptions{.attention_axes = {2}, .name = "mha"});
    Model model({x}, {call(mha, {masked_x, masked_x})}, "masked");
    auto mask = Input({3, 4, 4}, "mask");
    auto explicit_mha = std::make_shared<MultiHeadAttention>(
        2, 3,
        MultiHeadAttentionOptions{.attention_axes = {2}, .attention_mask = true, .name = "e"});
    Model explicit_model({x, mask}, {call(explicit_mha, {x, x, mask})}, "explicit");
    explicit_model.set_weights(model.get_weights());
    Tensor<float> data = layer_cases::wave(Shape{2, 3, 4, 5}, 1.0F, 0.2F, 0.37F);
    Tensor<float> steps(Shape{2, 3, 4}, 1.0F);
    for (std::size_t i = 0; i < steps.size(); ++i) {
      if (i % 5 != 3 && i != 8) continue;  // masked positions: every row keeps some
      steps.data()[i] = 0.0F;
      for (std::size_t f = 0; f < 5; ++f)
        data.data()[i * 5 + f] = 0.0F;
    }
    Tensor<float> joined(Shape{2, 3, 4, 4});
    for (std::size_t row = 0; row < 6; ++row)
      for (std::size_t i = 0; i < 4; ++i)
        for (std::size_t j = 0; j < 4; ++j)
          joined.data()[(row * 4 + i) * 4 + j] =
              steps.data()[row * 4 + i] * steps.data()[row * 4 + j];
    const Tensor<float> a = model.predict(data, {.verbose = 0});
    const Tensor<float> b =
        explicit_model.predict_outputs(std::vector<Tensor<float>>{data, joined}, {.verbose = 0})[0];
    REQUIRE(a.shape() == b.shape());
    for (std::size_t i = 0; i < a.size(); ++i)
      CHECK(a.data()[i] == doctest::Approx(b.data()[i]).epsilon(1e-6));
    // Without the masks, the output differs.
    Model unmasked({x}, {call(mha, {x, x})}, "unmasked");
    const Tensor<float> c = unmasked.predict(data, {.verbose = 0});
    double difference = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i)
      difference = std::max(difference, double(std::abs(a.data()[i] - c.data()[i])));
    CHECK(difference > 1e-3);
    // Over T for each S, Keras's join would mix T with S: refused by name.
    auto over_t = std::make_shared<MultiHeadAttention>(
        2, 3, MultiHeadAttentionOptions{.attention_axes = {1}, .name = "over_t"});
    Model refused({x}, {call(over_t, {masked_x, masked_x})}, "refused");
    CHECK_THROWS_WITH_AS(refused.predict(data, {.verbose = 0}),
                         doctest::Contains("multi_head_attention layer 'over_t': the masks of the "
                                           "query, value or key with attention_axes (1) for "
                                           "inputs (None, 3, 4, 5) are not run"),
                         ConfigError);
  }

  TEST_CASE("MultiHeadAttention over other attention_axes takes steps of unknown length") {
    // Attention over S for each T: T is a batch axis of any length, and each T's output depends
    // on that T's inputs alone.
    auto x = Input({none, 3, 4}, "x");
    auto mha = std::make_shared<MultiHeadAttention>(
        2, 3,
        MultiHeadAttentionOptions{
            .attention_axes = {2}, .return_attention_scores = true, .name = "mha"});
    const auto outputs = call_outputs(mha, {x, x});
    CHECK(outputs[1].shape() == Shape{none, 2, 3, 3});
    Model model({x}, {outputs[0], outputs[1]}, "unknown");
    const Tensor<float> long_data = layer_cases::wave(Shape{2, 5, 3, 4}, 1.0F, 0.1F, 0.43F);
    Tensor<float> short_data(Shape{2, 2, 3, 4});
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t i = 0; i < 2 * 12; ++i)
        short_data.data()[b * 24 + i] = long_data.data()[b * 60 + i];
    const auto long_out = model.predict_outputs(long_data, {.verbose = 0});
    const auto short_out = model.predict_outputs(short_data, {.verbose = 0});
    REQUIRE(long_out[0].shape() == Shape{2, 5, 3, 4});
    REQUIRE(short_out[0].shape() == Shape{2, 2, 3, 4});
    REQUIRE(long_out[1].shape() == Shape{2, 5, 2, 3, 3});
    REQUIRE(short_out[1].shape() == Shape{2, 2, 2, 3, 3});
    for (std::size_t b = 0; b < 2; ++b) {
      for (std::size_t i = 0; i < 24; ++i)
        CHECK(short_out[0].data()[b * 24 + i] ==
              doctest::Approx(long_out[0].data()[b * 60 + i]).epsilon(1e-6));
      for (std::size_t i = 0; i < 36; ++i)
        CHECK(short_out[1].data()[b * 36 + i] ==
              doctest::Approx(long_out[1].data()[b * 90 + i]).epsilon(1e-6));
    }
    // A value whose T differs from the query's is refused when the batch comes.
    auto q = Input({none, 3, 4}, "q"), v = Input({none, 3, 4}, "v");
    Model cross({q, v},
                {call(std::make_shared<MultiHeadAttention>(
                          1, 2, MultiHeadAttentionOptions{.attention_axes = {2}, .name = "cross"}),
                      {q, v})},
                "cross");
    CHECK_THROWS_WITH_AS(
        cross.predict_outputs(std::vector<Tensor<float>>{Tensor<float>(Shape{1, 2, 3, 4}),
                                                         Tensor<float>(Shape{1, 4, 3, 4})},
                              {.verbose = 0}),
        doctest::Contains("multi_head_attention layer 'cross': expects a query and a value of "
                          "the same lengths along the axes not attended (attention_axes (2)) but "
                          "got (None, 2, 3, 4) and (None, 4, 3, 4)"),
        ShapeError);
  }

  TEST_CASE("MultiHeadAttention over other attention_axes drops probabilities in training only") {
    auto x = Input({3, 4, 4}, "x");
    auto mha = std::make_shared<MultiHeadAttention>(
        2, 4,
        MultiHeadAttentionOptions{
            .dropout = 0.5F, .attention_axes = {1}, .seed = 11, .name = "mha"});
    Model model({x}, {call(mha, {x, x})}, "drop");
    model.compile({.optimizer = "sgd", .loss = "mse"});
    const Tensor<float> data = layer_cases::wave(Shape{2, 3, 4, 4}, 1.0F, 0.0F, 0.61F);
    const Tensor<float> a = model.predict(data, {.verbose = 0});
    auto plain = std::make_shared<MultiHeadAttention>(
        2, 4, MultiHeadAttentionOptions{.attention_axes = {1}, .name = "p"});
    Model plain_model({x}, {call(plain, {x, x})}, "plain");
    plain_model.set_weights(model.get_weights());
    CHECK(layer_cases::same_bits(plain_model.predict(data, {.verbose = 0}), a));
    const double inference = model.test_on_batch(data, data).get("loss").value();
    const double training = model.train_on_batch(data, data).get("loss").value();
    CHECK(std::abs(training - inference) > 1e-4);
  }
}

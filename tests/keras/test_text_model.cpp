// Models of a string input: Keras's end-to-end text model (a string Input read by a
// TextVectorization, then the layers on its output) predicting, evaluating and training on texts
// against generate_text_model.py (Keras's TextVectorization algorithm in NumPy, the layers in
// PyTorch); saved and loaded through .keras (the vocabulary as an asset) and .h5 (in the config);
// a .keras archive laid out as Keras 3 writes one; and the refusals.
#include <doctest/doctest.h>

#include <hdf5.h>
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <loadstar/error.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/keras/saving/detail/text_inputs.hpp>
#include <loadstar/keras/saving/detail/zip_io.hpp>
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
using loadstar::FormatError;
using loadstar::Shape;
using loadstar::ShapeError;
using loadstar::Tensor;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;
using nlohmann::json;
using test_support::TempDir;

namespace text_model {

const json& reference() {
  static const json data = layer_cases::load("text_model.json");
  return data;
}

std::vector<std::string> texts() {
  return reference()["texts"].get<std::vector<std::string>>();
}

Tensor<float> labels() {
  const auto l = reference()["labels"].get<std::vector<float>>();
  return Tensor<float>(Shape{l.size()}, std::span<const float>(l));
}

Tensor<float> matrix(const json& rows) {
  std::vector<float> v;
  for (const auto& r : rows)
    for (const auto& x : r)
      v.push_back(x.get<float>());
  return Tensor<float>(Shape{rows.size(), rows[0].size()}, std::span<const float>(v));
}

TextVectorizationOptions options_of(const json& o) {
  TextVectorizationOptions out;
  out.output_mode = o["output_mode"].get<std::string>();
  if (o.contains("max_tokens")) out.max_tokens = o["max_tokens"].get<std::size_t>();
  if (o.contains("output_sequence_length"))
    out.output_sequence_length = o["output_sequence_length"].get<std::size_t>();
  return out;
}

// The case's model: string input "text" -> TextVectorization -> [Embedding, mean] -> Dense, with
// the reference's weights, compiled with SGD(0.1) and sparse cross-entropy on logits.
std::unique_ptr<Model> model_of(const json& c) {
  TextVectorization vectorize(options_of(c["options"]));
  vectorize.adapt(reference()["corpus"].get<std::vector<std::string>>());
  REQUIRE(vectorize.get_vocabulary() == c["vocabulary"].get<std::vector<std::string>>());
  const Shape width = vectorize.output_sample_shape();
  auto ids = Input(width, "text");
  KerasTensor x = ids;
  std::vector<Tensor<float>> weights;
  if (!c["embedding"].is_null()) {
    x = call(
        Embedding(c["options"]["max_tokens"].get<std::size_t>(), c["width"].get<std::size_t>()), x);
    x = call(GlobalAveragePooling1D(), x);
    weights.push_back(matrix(c["embedding"]));
  }
  auto logits = call(Dense(c["classes"].get<std::size_t>(), {.name = "logits"}), x);
  auto model = std::make_unique<Model>(ids, logits, "end_to_end");
  const auto& bias = c["bias"];
  weights.push_back(matrix(c["kernel"]));
  weights.push_back(
      Tensor<float>(Shape{bias.size()}, std::span<const float>(bias.get<std::vector<float>>())));
  model->set_weights(weights);
  model->set_text_input(std::move(vectorize));
  model->compile({.optimizer = optimizers::SGD(optimizers::SGDOptions{.learning_rate = 0.1}),
                  .loss = losses::SparseCategoricalCrossentropy(true),
                  .metrics = {"accuracy"}});
  return model;
}

void check_close(const Tensor<float>& got, const json& expected) {
  const Tensor<float> want = matrix(expected);
  REQUIRE(got.shape() == want.shape());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CHECK(got.data()[i] ==
          doctest::Approx(want.data()[i]).epsilon(layer_cases::relative_tolerance));
  }
}

PredictOptions predict_options() {
  return {.batch_size = reference()["batch_size"].get<std::size_t>(), .verbose = 0};
}

}  // namespace text_model

using namespace text_model;

TEST_CASE("a model of a string input predicts, evaluates and trains on texts as PyTorch") {
  for (const auto& c : reference()["cases"]) {
    CAPTURE(c["name"].get<std::string>());
    auto model = model_of(c);
    const auto batch = reference()["batch_size"].get<std::size_t>();
    check_close(model->predict(texts(), predict_options()), c["predict"]);
    const Logs logs = model->evaluate(texts(), labels(), {.batch_size = batch, .verbose = 0});
    CHECK(logs.get("loss").value() == doctest::Approx(c["loss"].get<double>()).epsilon(1e-5));
    CHECK(logs.get("accuracy").value() ==
          doctest::Approx(c["accuracy"].get<double>()).epsilon(1e-6));
    if (c.contains("fit_predict")) {
      model->fit(texts(), labels(),
                 {.epochs = 2, .batch_size = batch, .verbose = 0, .shuffle = false});
      check_close(model->predict(texts(), predict_options()), c["fit_predict"]);
    } else {
      // Rows of the batch's longest text: each shuffled batch would need its own padding.
      CHECK_THROWS_WITH_AS(model->fit(texts(), labels(), {.verbose = 0}),
                           doctest::Contains("fit on texts needs TextVectorization "
                                             "'text_vectorization' to give rows of one length"),
                           ConfigError);
    }
  }
}

TEST_CASE("a model of a string input keeps it through .keras, .h5 and its config") {
  TempDir dir;
  for (const auto& c : reference()["cases"]) {
    const std::string name = c["name"].get<std::string>();
    CAPTURE(name);
    auto model = model_of(c);
    const Tensor<float> before = model->predict(texts(), predict_options());
    // Keras's config: the string input, the TextVectorization reading it, the Embedding or
    // Dense reading the TextVectorization.
    const json config = model->get_config();
    const auto& layers = config["config"]["layers"];
    REQUIRE(layers.size() >= 3);
    CHECK(layers[0]["class_name"] == "InputLayer");
    CHECK(layers[0]["config"]["dtype"] == "string");
    CHECK(layers[0]["config"]["batch_input_shape"] == json::array({nullptr, 1}));
    CHECK(layers[1]["class_name"] == "TextVectorization");
    CHECK(layers[1]["inbound_nodes"] == json::parse(R"([[["text", 0, 0, {}]]])"));
    CHECK(layers[1]["config"]["vocabulary"].is_null());
    CHECK(layers[2]["inbound_nodes"][0][0][0] == "text_vectorization");
    for (const char* ext : {".keras", ".h5"}) {
      CAPTURE(ext);
      const auto path = dir.path() / (name + ext);
      model->save(path);
      auto loaded = load_model(path);
      REQUIRE(loaded->text_inputs().size() == 1);
      CHECK(loaded->text_inputs()[0].layer.get_vocabulary() ==
            c["vocabulary"].get<std::vector<std::string>>());
      CHECK(loaded->text_inputs()[0].layer.idf_weights() ==
            model->text_inputs()[0].layer.idf_weights());
      const Tensor<float> after = loaded->predict(texts(), predict_options());
      CHECK(std::equal(after.begin(), after.end(), before.begin(), before.end()));
      // The loaded model writes the same config again (a .h5 file's vocabulary stays inline).
      if (std::string(ext) == ".keras") CHECK(loaded->get_config() == config);
    }
    // An adapted vocabulary is an asset of the .keras archive, as Keras's save_assets writes.
    const loadstar::keras::detail::ZipReader zip(dir.path() / (name + ".keras"));
    std::string expected;
    for (std::size_t i = 0; i < c["vocabulary"].size(); ++i)
      expected += (i == 0 ? "" : "\n") + c["vocabulary"][i].get<std::string>();
    CHECK(zip.read("assets/layers/text_vectorization/vocabulary.txt", 1 << 20) == expected);
    CHECK(zip.has("assets/layers/text_vectorization/_lookup_layer/vocabulary.txt"));
    // The config alone gives the layer without its vocabulary, which predict refuses.
    auto bare = model_from_config(config);
    CHECK_THROWS_WITH_AS(bare->predict(texts()),
                         doctest::Contains("TextVectorization 'text_vectorization' has no "
                                           "vocabulary"),
                         ConfigError);
  }
}

TEST_CASE("a .keras archive laid out as Keras 3 writes one loads and predicts") {
  const auto& c = reference()["cases"][0];
  const char* source = std::getenv("LOADSTAR_SOURCE_DIR");
  REQUIRE(source != nullptr);
  auto model = load_model(std::filesystem::path(source) / "tests" / "keras" / "reference" /
                          "text_model_keras3.keras");
  CHECK(model->name() == "end_to_end");
  REQUIRE(model->text_inputs().size() == 1);
  CHECK(model->input_names() == std::vector<std::string>{"text"});
  CHECK(model->text_inputs()[0].string_shape == Shape{1});
  check_close(model->predict(texts(), predict_options()), c["predict"]);
  std::ostringstream summary;
  model->summary(summary);
  // Keras's rows: the input of strings, then the layer (its name and class cut to the column).
  CHECK(summary.str().find(" text (InputLayer)           [(None, 1)]") != std::string::npos);
  CHECK(summary.str().find(" text_vectorization (TextVe  (None, 6)") != std::string::npos);
}

TEST_CASE("vocabulary.txt is split as Python's str.splitlines, trailing empty lines dropped") {
  using loadstar::keras::detail::vocabulary_lines;
  CHECK(vocabulary_lines("\n[UNK]\nthe\nfox") ==
        std::vector<std::string>{"", "[UNK]", "the", "fox"});
  CHECK(vocabulary_lines("a\r\nb\rc\x0b"
                         "d\x0c"
                         "e\x1c"
                         "f\xc2\x85g\xe2\x80\xa8h\xe2\x80\xa9i\n\n") ==
        std::vector<std::string>{"a", "b", "c", "d", "e", "f", "g", "h", "i"});
  CHECK(vocabulary_lines("").empty());
  CHECK(vocabulary_lines("x\xc2\xa0y") == std::vector<std::string>{"x\xc2\xa0y"});
}

TEST_CASE("string inputs refuse what they cannot take, naming the layer") {
  const auto& c = reference()["cases"][0];
  SUBCASE("arrays for a string input") {
    auto model = model_of(c);
    CHECK_THROWS_WITH_AS(model->predict(Tensor<float>(Shape{2, 6})),
                         "model 'end_to_end': input 'text' takes strings (TextVectorization "
                         "'text_vectorization' makes its values) but was given arrays; pass the "
                         "texts to predict, evaluate or fit as a std::vector<std::string>",
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        model->fit(texts(), labels(),
                   {.verbose = 0,
                    .validation_data = {Tensor<float>(Shape{1, 6}), Tensor<float>(Shape{1})}}),
        doctest::Contains("fit on texts takes no validation_data"), ConfigError);
  }
  SUBCASE("a model without a string input, and one whose layer does not fit") {
    auto ids = Input(Shape{6}, "ids");
    Model plain(ids, call(Dense(2), ids), "plain");
    CHECK_THROWS_WITH_AS(plain.predict(texts()),
                         "model 'plain': predict on texts: the model has no string input "
                         "(set_text_input makes one)",
                         ConfigError);
    TextVectorization wide({.output_mode = "int", .output_sequence_length = 7});
    CHECK_THROWS_WITH_AS(plain.set_text_input(wide),
                         "model 'plain': set_text_input: TextVectorization 'text_vectorization' "
                         "gives rows of (7,) but input 'ids' takes samples of shape (6,)",
                         ShapeError);
    TextVectorization named({.output_sequence_length = 6, .name = "ids"});
    CHECK_THROWS_WITH_AS(plain.set_text_input(named), doctest::Contains("named 'ids' already"),
                         ConfigError);
    TextVectorization ragged({.output_mode = "int"});
    CHECK_THROWS_WITH_AS(plain.set_text_input(ragged), doctest::Contains("gives rows of (None,)"),
                         ShapeError);
    auto text_model = model_of(c);
    auto outer = Input(Shape{6}, "outer");
    CHECK_THROWS_WITH_AS(call(std::shared_ptr<Model>(std::move(text_model)), outer),
                         "functional model 'end_to_end': used as a layer, its input 'text' takes "
                         "strings (TextVectorization 'text_vectorization'), which loadstar reads "
                         "only at the outer model's inputs",
                         ConfigError);
    TextVectorization fits({.output_sequence_length = 6});
    CHECK_THROWS_WITH_AS(plain.set_text_input(fits, 1), doctest::Contains("input index below 1"),
                         ConfigError);
  }
  SUBCASE("a second layer, an unbuilt model, and texts that do not fit the call") {
    auto model = model_of(c);
    TextVectorization again({.output_sequence_length = 6, .name = "again"});
    CHECK_THROWS_WITH_AS(model->set_text_input(again),
                         "model 'end_to_end': set_text_input: input 'text' takes strings already "
                         "(TextVectorization 'text_vectorization')",
                         ConfigError);
    CHECK_THROWS_WITH_AS(model->text_vectorization(1),
                         "model 'end_to_end': text_vectorization: expected an index below 1 (the "
                         "string inputs) but found 1",
                         ConfigError);
    CHECK_THROWS_WITH_AS(model->predict(std::vector<std::string>{}),
                         "model 'end_to_end': predict on texts: no texts", ShapeError);
    CHECK_THROWS_WITH_AS(model->evaluate(texts(), Tensor<float>(Shape{2}), {.verbose = 0}),
                         "model 'end_to_end': evaluate got 7 texts but y has 2 rows", ShapeError);
    CHECK_THROWS_WITH_AS(model->evaluate(texts(), labels(),
                                         {.verbose = 0, .sample_weight = Tensor<float>(Shape{3})}),
                         "model 'end_to_end': evaluate got 7 texts but sample_weight has 3 rows",
                         ShapeError);
    Sequential unbuilt("unbuilt");
    CHECK_THROWS_WITH_AS(unbuilt.set_text_input(TextVectorization(TextVectorizationOptions{})),
                         "model 'unbuilt': set_text_input: the model is not built (give it an "
                         "Input first)",
                         ConfigError);
    auto words = Input(Shape{6}, "words");
    auto numbers = Input(Shape{2}, "numbers");
    Model two({words, numbers},
              call(Dense(1), call(Concatenate(), {call(Dense(2), words), numbers})), "two");
    two.set_text_input(TextVectorization({.output_sequence_length = 6}));
    CHECK_THROWS_WITH_AS(two.predict(texts()),
                         "model 'two': predict on texts takes a model of one string input but "
                         "the model has 2 inputs",
                         ConfigError);
  }
  SUBCASE("configs whose strings go elsewhere") {
    auto model = model_of(c);
    json config = model->get_config();
    json dense_reads = config;
    auto& layers = dense_reads["config"]["layers"];
    layers.erase(layers.begin() + 1);  // the TextVectorization
    layers[1]["inbound_nodes"] = json::parse(R"([[["text", 0, 0, {}]]])");
    CHECK_THROWS_WITH_AS(model_from_config(dense_reads),
                         doctest::Contains("layers[0] ('text'): the input takes strings (dtype "
                                           "string) and must be read by one TextVectorization, "
                                           "but is read by 'embedding"),
                         ConfigError);
    json numbers_read = config;
    numbers_read["config"]["layers"][0]["config"]["dtype"] = "float32";
    CHECK_THROWS_WITH_AS(model_from_config(numbers_read),
                         doctest::Contains("a TextVectorization must read a string InputLayer"),
                         ConfigError);
    json output = config;
    output["config"]["output_layers"] = json::parse(R"([["text", 0, 0]])");
    CHECK_THROWS_WITH_AS(model_from_config(output),
                         doctest::Contains("layers[0] ('text'): the string input is an output of "
                                           "the model"),
                         ConfigError);
    json nested = json::parse(R"({"class_name": "Sequential", "config": {"name": "outer",
        "layers": [{"class_name": "InputLayer", "config": {"batch_input_shape": [null, 6]}},
                   {"class_name": "Functional", "config": {}}]}})");
    nested["config"]["layers"][1]["config"] = config["config"];
    CHECK_THROWS_WITH_AS(model_from_config(nested),
                         doctest::Contains("a nested model holds a TextVectorization; loadstar "
                                           "reads strings only at the outer model's inputs"),
                         ConfigError);
    json wide = config;
    wide["config"]["layers"][0]["config"]["batch_input_shape"] = json::array({nullptr, 2});
    CHECK_THROWS_WITH_AS(model_from_config(wide),
                         doctest::Contains("a string input's batch shape must be [null] or "
                                           "[null, 1] but is [null,2]"),
                         ConfigError);
  }
  SUBCASE("files without the vocabulary") {
    TempDir dir;
    auto model = model_of(c);
    // A .h5 file keeps a vocabulary only in the layer's config: one whose config has none (as
    // Keras 2's get_config of an adapted layer gives) is refused.
    const auto h5 = dir.path() / "model.h5";
    model->save(h5);
    const std::string config = model->get_config().dump();  // vocabulary null
    const hid_t file = H5Fopen(h5.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(file >= 0);
    REQUIRE(H5Adelete(file, "model_config") >= 0);
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, config.size());
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t attribute = H5Acreate2(file, "model_config", type, space, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(H5Awrite(attribute, type, config.data()) >= 0);
    H5Aclose(attribute);
    H5Sclose(space);
    H5Tclose(type);
    H5Fclose(file);
    CHECK_THROWS_WITH_AS(load_model(h5),
                         doctest::Contains("TextVectorization 'text_vectorization' has no "
                                           "vocabulary in its config (a .h5 file keeps one only "
                                           "as the layer's vocabulary argument; Keras keeps an "
                                           "adapted one in a .keras file's assets)"),
                         FormatError);
    // A .keras archive without the asset.
    const auto saved = dir.path() / "saved.keras";
    model->save(saved);
    const loadstar::keras::detail::ZipReader zip(saved);
    const auto stripped = dir.path() / "stripped.keras";
    {
      loadstar::keras::detail::ZipWriter out(stripped, stripped);
      for (const auto& member : zip.names()) {
        if (member.find("vocabulary.txt") == std::string::npos)
          out.add(member, zip.read(member, 1 << 30));
      }
      out.close();
    }
    CHECK_THROWS_WITH_AS(load_model(stripped),
                         doctest::Contains("TextVectorization 'text_vectorization' keeps its "
                                           "vocabulary in the member "
                                           "'assets/layers/text_vectorization/vocabulary.txt', "
                                           "which the archive lacks"),
                         FormatError);
  }
}

TEST_CASE("a Sequential model of a string input keeps it through .keras and .h5") {
  TempDir dir;
  const auto& c = reference()["cases"][2];  // multi_hot: Dense on the rows
  REQUIRE(c["name"] == "multi_hot");
  TextVectorization vectorize(options_of(c["options"]));
  vectorize.adapt(reference()["corpus"].get<std::vector<std::string>>());
  Sequential model("sequential_text");
  model.add(Input(vectorize.output_sample_shape()));
  model.add(Dense(c["classes"].get<std::size_t>()));
  const auto& bias = c["bias"];
  model.set_weights(
      {matrix(c["kernel"]),
       Tensor<float>(Shape{bias.size()}, std::span<const float>(bias.get<std::vector<float>>()))});
  model.set_text_input(std::move(vectorize), 0, Shape{});
  const json config = model.get_config();
  CHECK(config["class_name"] == "Sequential");
  CHECK(config["config"]["layers"][0]["config"]["batch_input_shape"] == json::array({nullptr}));
  CHECK(config["config"]["layers"][1]["class_name"] == "TextVectorization");
  check_close(model.predict(texts(), predict_options()), c["predict"]);
  for (const char* ext : {".keras", ".h5"}) {
    CAPTURE(ext);
    const auto path = dir.path() / (std::string("sequential") + ext);
    model.save(path);
    auto loaded = load_model(path);
    REQUIRE(loaded->text_inputs().size() == 1);
    CHECK(loaded->text_inputs()[0].string_shape == Shape{});
    check_close(loaded->predict(texts(), predict_options()), c["predict"]);
    std::ostringstream summary;
    loaded->summary(summary);
    CHECK(summary.str().find(" text_vectorization (TextVe  (None, 12)") != std::string::npos);
    CHECK(summary.str().find("InputLayer") == std::string::npos);
  }
}

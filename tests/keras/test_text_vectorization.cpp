// TextVectorization against Keras's documented examples and the values of
// tests/keras/generate_text_vectorization.py (Keras's algorithm in Python and NumPy).
#include <doctest/doctest.h>

#include "temp_dir.hpp"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <loadstar/data/dataset.hpp>
#include <loadstar/error.hpp>
#include <loadstar/keras/layers/text_vectorization.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

using loadstar::ConfigError;
using loadstar::FormatError;
using loadstar::keras::layers::TextVectorization;
using loadstar::keras::layers::TextVectorizationOptions;

namespace {

nlohmann::json text_reference() {
  const char* root = std::getenv("LOADSTAR_SOURCE_DIR");
  REQUIRE_MESSAGE(root != nullptr, "LOADSTAR_SOURCE_DIR is not set");
  std::ifstream in(std::filesystem::path(root) / "tests/keras/reference/text_vectorization.json");
  REQUIRE(in);
  return nlohmann::json::parse(in);
}

TextVectorizationOptions options_of(const nlohmann::json& o) {
  TextVectorizationOptions options;
  options.output_mode = o.at("output_mode").get<std::string>();
  options.standardize = o.at("standardize").is_null() ? "" : o.at("standardize").get<std::string>();
  options.split = o.at("split").is_null() ? "" : o.at("split").get<std::string>();
  if (!o.at("ngrams").is_null()) options.ngrams = o.at("ngrams").get<std::vector<std::size_t>>();
  if (o.contains("max_tokens")) options.max_tokens = o.at("max_tokens").get<std::size_t>();
  if (o.contains("output_sequence_length")) {
    options.output_sequence_length = o.at("output_sequence_length").get<std::size_t>();
  }
  if (o.contains("pad_to_max_tokens")) options.pad_to_max_tokens = o.at("pad_to_max_tokens");
  return options;
}

void check_output(const TextVectorization& layer, const std::vector<std::string>& queries,
                  const nlohmann::json& expected, const std::string& what) {
  const auto out = layer(queries);
  REQUIRE(out.rank() == 2);
  REQUIRE_MESSAGE(out.shape()[0] == expected.size(), what);
  REQUIRE_MESSAGE(out.shape()[1] == expected.at(0).size(), what);
  for (std::size_t r = 0; r < expected.size(); ++r) {
    for (std::size_t c = 0; c < expected[r].size(); ++c) {
      const double want = expected[r][c].get<double>();
      CHECK_MESSAGE(std::abs(out.data()[r * out.shape()[1] + c] - want) <=
                        1e-6 * std::max(1.0, std::abs(want)),
                    what << " row " << r << " column " << c);
    }
  }
}

}  // namespace

TEST_CASE("TextVectorization gives Keras's documented example outputs") {
  TextVectorization layer({.max_tokens = 5000, .output_sequence_length = 4});
  layer.adapt(std::vector<std::string>{"foo bar", "bar baz", "baz bada boom"});
  const auto out = layer.indices(std::vector<std::string>{"foo qux bar", "qux baz"});
  const std::vector<std::int64_t> expected{4, 1, 3, 0, 1, 2, 0, 0};
  REQUIRE(out.shape() == loadstar::Shape{2, 4});
  CHECK(std::vector<std::int64_t>(out.data(), out.data() + 8) == expected);

  TextVectorization given({.max_tokens = 5000,
                           .output_sequence_length = 4,
                           .vocabulary = std::vector<std::string>{"earth", "wind", "and", "fire"}});
  CHECK(given.get_vocabulary() ==
        std::vector<std::string>{"", "[UNK]", "earth", "wind", "and", "fire"});
  CHECK(given.get_vocabulary(false) == std::vector<std::string>{"earth", "wind", "and", "fire"});
  CHECK(given.vocabulary_size() == 6);
}

TEST_CASE("TextVectorization's vocabularies and outputs equal the reference's in every mode") {
  const auto ref = text_reference();
  const auto corpus = ref.at("corpus").get<std::vector<std::string>>();
  const auto queries = ref.at("queries").get<std::vector<std::string>>();
  for (const auto& c : ref.at("cases")) {
    const std::string what = c.at("options").dump();
    TextVectorization layer(options_of(c.at("options")));
    layer.adapt(corpus);
    CHECK_MESSAGE(layer.get_vocabulary() == c.at("vocabulary").get<std::vector<std::string>>(),
                  what);
    if (!c.at("idf_weights").is_null()) {
      const auto want = c.at("idf_weights").get<std::vector<float>>();
      REQUIRE_MESSAGE(layer.idf_weights().size() == want.size(), what);
      for (std::size_t i = 0; i < want.size(); ++i) {
        CHECK_MESSAGE(layer.idf_weights()[i] == doctest::Approx(want[i]).epsilon(1e-6), what);
      }
    }
    check_output(layer, queries, c.at("output"), what);

    // A layer given the learned vocabulary (and weights) computes the same outputs.
    auto given_options = options_of(c.at("options"));
    given_options.vocabulary = c.at("vocabulary").get<std::vector<std::string>>();
    if (!c.at("idf_weights").is_null()) {
      auto weights = c.at("idf_weights").get<std::vector<float>>();
      weights.resize(given_options.vocabulary->size());
      given_options.idf_weights = weights;
    }
    check_output(TextVectorization(given_options), queries, c.at("output"), what + " (given)");
  }
}

TEST_CASE("TextVectorization splits ill-formed UTF-8 into characters as a replacing decoder does") {
  const auto ref = text_reference();
  TextVectorization layer({.standardize = "", .split = "character"});
  for (const auto& c : ref.at("characters")) {
    const auto bytes = c.at("bytes").get<std::vector<unsigned char>>();
    const std::string text(bytes.begin(), bytes.end());
    std::vector<std::string> expected;
    for (const auto& ch : c.at("characters")) {
      const auto b = ch.get<std::vector<unsigned char>>();
      expected.emplace_back(b.begin(), b.end());
    }
    CHECK_MESSAGE(layer.tokenize(text) == expected, c.at("bytes").dump());
  }
}

TEST_CASE("TextVectorization adapts from a dataset of strings or of batches") {
  const std::vector<std::string> docs{"a b c", "a b", "a"};
  TextVectorization from_list;
  from_list.adapt(docs);
  const auto document = [&](std::int64_t i) { return docs[static_cast<std::size_t>(i)]; };
  TextVectorization from_strings;
  auto strings = loadstar::range(3).map(document);
  from_strings.adapt(strings);
  CHECK(from_strings.get_vocabulary() == from_list.get_vocabulary());
  CHECK(from_list.get_vocabulary() == std::vector<std::string>{"", "[UNK]", "a", "b", "c"});
  TextVectorization from_batches;
  auto batches = loadstar::range(2).map([&](std::int64_t i) {
    return i == 0 ? std::vector<std::string>{docs[0], docs[1]} : std::vector<std::string>{docs[2]};
  });
  from_batches.adapt(batches);
  CHECK(from_batches.get_vocabulary() == from_list.get_vocabulary());
  // steps: only the first document.
  TextVectorization first;
  auto again = loadstar::range(3).map(document);
  first.adapt(again, 1);
  CHECK(first.get_vocabulary() == std::vector<std::string>{"", "[UNK]", "c", "b", "a"});
}

TEST_CASE("TextVectorization's config, save and load keep the layer and its vocabulary") {
  test_support::TempDir dir;
  TextVectorization layer({.max_tokens = 10, .ngrams = {1, 2}, .output_mode = "tf_idf"});
  layer.adapt(std::vector<std::string>{"red fish blue fish", "one fish two fish", "red one"});
  const auto config = layer.get_config();
  CHECK(config.at("ngrams") == 2);
  CHECK(config.at("max_tokens") == 10);
  CHECK(config.at("output_mode") == "tf_idf");
  CHECK(config.at("vocabulary").is_null());
  layer.save(dir / "vectorize.json");
  const auto loaded = TextVectorization::load(dir / "vectorize.json");
  CHECK(loaded.get_vocabulary() == layer.get_vocabulary());
  CHECK(loaded.idf_weights() == layer.idf_weights());
  const std::vector<std::string> batch{"one red fish", "blue"};
  CHECK(loaded(batch) == layer(batch));
  CHECK(loaded.get_config() == config);
  // The rebuilt layer can be adapted again, as the saved one could.
  auto rebuilt = TextVectorization::from_config(config);
  CHECK_NOTHROW(rebuilt.adapt(std::vector<std::string>{"x"}));

  std::ofstream(dir / "bad.json") << "{\"class_name\": \"Dense\"}";
  CHECK_THROWS_WITH_AS(TextVectorization::load(dir / "bad.json"),
                       doctest::Contains("bad.json': class_name is \"Dense\""), FormatError);
  std::ofstream(dir / "cut.json") << "{\"class_name\": ";
  CHECK_THROWS_AS(TextVectorization::load(dir / "cut.json"), FormatError);
}

TEST_CASE("TextVectorization refuses what Keras refuses and what it does not implement") {
  CHECK_THROWS_WITH_AS(TextVectorization({.standardize = "upper"}),
                       doctest::Contains("standardize must be"), ConfigError);
  CHECK_THROWS_WITH_AS(TextVectorization({.split = "comma"}), doctest::Contains("split must be"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(TextVectorization({.output_mode = "one_hot"}),
                       doctest::Contains("\"one_hot\" is not implemented"), ConfigError);
  CHECK_THROWS_WITH_AS(TextVectorization({.output_mode = "count", .output_sequence_length = 3}),
                       doctest::Contains("output_sequence_length must not be set"), ConfigError);
  CHECK_THROWS_WITH_AS(TextVectorization({.sparse = true}), doctest::Contains("sparse=True"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(TextVectorization({.encoding = "latin-1"}),
                       doctest::Contains("encoding must be \"utf-8\""), ConfigError);
  CHECK_THROWS_WITH_AS(TextVectorization({.vocabulary = std::vector<std::string>{"a", "b", "a"}}),
                       doctest::Contains("repeats the term \"a\""), ConfigError);
  CHECK_THROWS_WITH_AS(TextVectorization({.vocabulary = std::vector<std::string>{"a", ""}}),
                       doctest::Contains("reserved mask token \"\" at vocabulary index 1"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(
      TextVectorization({.max_tokens = 3, .vocabulary = std::vector<std::string>{"a", "b"}}),
      doctest::Contains("size 4 is larger than max_tokens 3"), ConfigError);
  CHECK_THROWS_WITH_AS(
      TextVectorization({.output_mode = "tf_idf", .vocabulary = std::vector<std::string>{"a"}}),
      doctest::Contains("needs idf_weights"), ConfigError);
  TextVectorization given({.vocabulary = std::vector<std::string>{"a"}});
  CHECK_THROWS_WITH_AS(given.adapt(std::vector<std::string>{"b"}),
                       doctest::Contains("cannot adapt a layer given a vocabulary"), ConfigError);
  TextVectorization counting({.output_mode = "count"});
  CHECK_THROWS_WITH_AS(counting.indices(std::vector<std::string>{"a"}),
                       doctest::Contains("needs output_mode \"int\""), ConfigError);
  CHECK_THROWS_WITH_AS(TextVectorization::from_config({{"standardize", {{"class_name", "f"}}}}),
                       doctest::Contains("standardize must be a string or null"), ConfigError);
  CHECK_THROWS_WITH_AS(TextVectorization::from_config({{"max_tokenz", 3}}),
                       doctest::Contains("unknown key \"max_tokenz\""), ConfigError);
}

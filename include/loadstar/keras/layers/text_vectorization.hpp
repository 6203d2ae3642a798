/// \file
/// `TextVectorization`: Keras's text preprocessing layer (standardize, split, n-grams, a
/// vocabulary learned by `adapt`, and integer, multi-hot, count or TF-IDF output), for the input
/// pipeline.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "loadstar/data/dataset/concepts.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/callbacks/detail/files.hpp"
#include "loadstar/tensor.hpp"

namespace loadstar::keras::layers {

/// `TextVectorization`'s Keras arguments, with Keras's defaults. An empty `standardize` or
/// `split` is Keras's `None`; `ngrams` empty is `None`, `{1, 2}` is Keras's `ngrams=2` (every
/// width up to 2) and any other list is Keras's tuple of widths.
struct TextVectorizationOptions {
  /// The vocabulary's largest size, the padding and OOV tokens included.
  std::optional<std::size_t> max_tokens = std::nullopt;
  /// `"lower_and_strip_punctuation"`, `"lower"`, `"strip_punctuation"` or empty.
  std::string standardize = "lower_and_strip_punctuation";
  /// `"whitespace"`, `"character"` or empty.
  std::string split = "whitespace";
  std::vector<std::size_t> ngrams = {};
  /// `"int"`, `"multi_hot"` (or its old name `"binary"`), `"count"` or `"tf_idf"` (`"tf-idf"`).
  std::string output_mode = "int";
  /// `int` output only: every row padded with 0 or truncated to this length; without it, rows
  /// are padded to the batch's longest.
  std::optional<std::size_t> output_sequence_length = std::nullopt;
  /// Non-`int` output: rows of `max_tokens` entries rather than of the vocabulary's size.
  bool pad_to_max_tokens = false;
  /// A vocabulary given up front (with or without the leading special tokens); the layer then
  /// cannot be adapted.
  std::optional<std::vector<std::string>> vocabulary = std::nullopt;
  /// `tf_idf` with a given vocabulary: one weight per token of `vocabulary`.
  std::optional<std::vector<float>> idf_weights = std::nullopt;
  /// Keras's `sparse`, `ragged` (TensorFlow tensor kinds) and `encoding`: only their defaults.
  bool sparse = false;
  bool ragged = false;
  std::string encoding = "utf-8";
  std::string name = "text_vectorization";
};

/// Keras's `TextVectorization` as a preprocessing step of the input pipeline (where Keras's
/// guide puts it for training: `text_ds.map(vectorize_layer)`): each string is standardized
/// (ASCII lower-casing, ASCII punctuation stripped, as `tf.strings.lower` and Keras's strip
/// regex do), split on ASCII whitespace or into UTF-8 characters (invalid bytes become U+FFFD as
/// `tf.strings.unicode_split` replaces them), turned into n-grams joined by a space, and looked
/// up in the vocabulary.
///
/// `adapt` learns the vocabulary as Keras does: tokens sorted by count, high to low, ties by the
/// tokens' bytes, high to low; truncated to `max_tokens` less the special tokens; for `tf_idf`,
/// the weights `log(1 + documents / (1 + documents holding the token))`, the OOV entry their mean.
/// In `int` mode index 0 is padding (the empty token) and 1 is OOV (`[UNK]`); in the other modes
/// 0 is OOV and empty tokens are dropped.
///
/// In a model it reads a string input (`Model::set_text_input`, Keras's end-to-end model): the
/// model is then fed texts, and its files keep the layer with its vocabulary. On its own,
/// `get_config`/`from_config` and `save`/`load` keep the layer, its vocabulary and weights.
/// \code
/// keras::layers::TextVectorization vectorize({.max_tokens = 20000, .output_sequence_length =
/// 500}); vectorize.adapt(std::vector<std::string>{"foo bar", "bar baz", "baz bada boom"});
/// Tensor<float> x = vectorize(std::vector<std::string>{"foo qux bar"});  // [[4, 1, 3, 0, ...]]
/// \endcode
class TextVectorization {
 public:
  /// Throws `ConfigError` naming the argument for a value Keras refuses, and for `one_hot`,
  /// `sparse`, `ragged` and encodings other than UTF-8, which this layer does not implement.
  explicit TextVectorization(TextVectorizationOptions options = {}) : options_(std::move(options)) {
    auto& o = options_;
    const auto refuse = [&](const std::string& what) {
      throw ConfigError("TextVectorization '" + o.name + "': " + what);
    };
    if (!o.standardize.empty() && o.standardize != "lower_and_strip_punctuation" &&
        o.standardize != "lower" && o.standardize != "strip_punctuation") {
      refuse(
          "standardize must be \"lower_and_strip_punctuation\", \"lower\", "
          "\"strip_punctuation\" or None but is \"" +
          o.standardize + "\"");
    }
    if (!o.split.empty() && o.split != "whitespace" && o.split != "character") {
      refuse("split must be \"whitespace\", \"character\" or None but is \"" + o.split + "\"");
    }
    if (o.output_mode == "binary") o.output_mode = "multi_hot";
    if (o.output_mode == "tf-idf") o.output_mode = "tf_idf";
    if (o.output_mode == "one_hot") {
      refuse("output_mode \"one_hot\" is not implemented; use \"multi_hot\" or \"int\"");
    }
    if (o.output_mode != "int" && o.output_mode != "multi_hot" && o.output_mode != "count" &&
        o.output_mode != "tf_idf") {
      refuse("output_mode must be \"int\", \"multi_hot\", \"count\" or \"tf_idf\" but is \"" +
             o.output_mode + "\"");
    }
    for (std::size_t width : o.ngrams) {
      if (width == 0) refuse("ngrams must be positive widths but holds 0");
    }
    if (o.output_mode != "int" && o.output_sequence_length) {
      refuse("output_sequence_length must not be set if output_mode is not \"int\" but is " +
             std::to_string(*o.output_sequence_length));
    }
    if (o.sparse) refuse("sparse=True (a TensorFlow SparseTensor) is not implemented");
    if (o.ragged) refuse("ragged=True (a TensorFlow RaggedTensor) is not implemented");
    if (o.encoding != "utf-8") {
      refuse("encoding must be \"utf-8\" but is \"" + o.encoding + "\"");
    }
    if (o.pad_to_max_tokens && o.output_mode != "int" && !o.max_tokens) {
      refuse("pad_to_max_tokens needs max_tokens");
    }
    if (o.max_tokens && *o.max_tokens <= token_start()) {
      refuse("max_tokens must be greater than " + std::to_string(token_start()) +
             " (the special tokens) but is " + std::to_string(*o.max_tokens));
    }
    if (o.idf_weights && o.output_mode != "tf_idf") {
      refuse("idf_weights should only be set if output_mode is \"tf_idf\"");
    }
    if (o.vocabulary) {
      if (o.output_mode == "tf_idf" && !o.idf_weights) {
        refuse("a vocabulary in tf_idf output mode needs idf_weights too");
      }
      set_vocabulary(*o.vocabulary, o.idf_weights);
    }
  }

  const TextVectorizationOptions& options() const noexcept { return options_; }

  /// Learns the vocabulary (and for `tf_idf` the document frequencies) from strings, each one a
  /// document. Throws `ConfigError` when the layer was given a vocabulary.
  void adapt(std::span<const std::string> documents) {
    reset_state();
    update_state(documents);
    finalize_state();
  }
  void adapt(const std::vector<std::string>& documents) {
    adapt(std::span<const std::string>(documents));
  }

  /// Learns the vocabulary from a dataset of strings or of batches of strings
  /// (`std::vector<std::string>`), read from where it stands to the end of its epoch, or for at
  /// most `steps` elements.
  template <Dataset D>
  void adapt(D& dataset, std::optional<std::size_t> steps = std::nullopt) {
    reset_state();
    for (std::size_t step = 0; !steps || step < *steps; ++step) {
      auto element = dataset.next();
      if (!element) break;
      if constexpr (std::is_convertible_v<const element_t<D>&, std::string_view>) {
        const std::string document(*element);
        update_state(std::span<const std::string>(&document, 1));
      } else {
        update_state(std::span<const std::string>(element->data(), element->size()));
      }
    }
    finalize_state();
  }

  /// The vocabulary, index by index: in `int` mode `["", "[UNK]", tokens...]`, else
  /// `["[UNK]", tokens...]`; without the special tokens when `include_special_tokens` is false.
  std::vector<std::string> get_vocabulary(bool include_special_tokens = true) const {
    std::vector<std::string> out;
    if (include_special_tokens) {
      if (is_int()) out.emplace_back("");
      out.emplace_back("[UNK]");
    }
    out.insert(out.end(), tokens_.begin(), tokens_.end());
    return out;
  }

  /// The number of indices: the tokens and the special tokens.
  std::size_t vocabulary_size() const noexcept { return token_start() + tokens_.size(); }

  /// Whether the vocabulary holds a token besides the special ones (adapted, or given).
  bool has_tokens() const noexcept { return !tokens_.empty(); }

  /// The TF-IDF weights of every index (`tf_idf` only).
  const std::vector<float>& idf_weights() const noexcept { return idf_; }

  /// Whether the vocabulary came with the layer (the `vocabulary` argument or `set_vocabulary`):
  /// Keras's config then holds it, where a saved model keeps an adapted one as an asset.
  bool has_input_vocabulary() const noexcept { return has_input_vocabulary_; }

  /// Takes a vocabulary as `adapt` would have learned it (Keras's `load_assets`, reading a saved
  /// model's `vocabulary.txt`): as `set_vocabulary`, but the layer counts as adapted, so that its
  /// config keeps no vocabulary.
  void load_vocabulary(const std::vector<std::string>& vocabulary,
                       const std::optional<std::vector<float>>& idf_weights = std::nullopt) {
    set_vocabulary(vocabulary, idf_weights);
    has_input_vocabulary_ = false;
    options_.vocabulary.reset();
    options_.idf_weights.reset();
  }

  /// The shape of one string's output: `(output_sequence_length)` in `int` mode, or `(0)` (an
  /// axis of unknown length, `keras::none`: a batch's longest row) without it; `(depth)` in the
  /// other modes (`max_tokens` with `pad_to_max_tokens`, else the vocabulary's size).
  Shape output_sample_shape() const {
    if (is_int()) return Shape{options_.output_sequence_length.value_or(0)};
    return Shape{options_.pad_to_max_tokens ? *options_.max_tokens : vocabulary_size()};
  }

  /// Replaces the vocabulary (Keras's `set_vocabulary`): `vocabulary` with or without the
  /// leading special tokens, `idf_weights` one per entry of `vocabulary` for `tf_idf`. Throws
  /// `ConfigError` for an empty or repeated vocabulary, a misplaced empty token, one larger than
  /// `max_tokens`, and weights that are missing, unexpected or of another length.
  void set_vocabulary(const std::vector<std::string>& vocabulary,
                      const std::optional<std::vector<float>>& idf_weights = std::nullopt) {
    const std::string where = "TextVectorization '" + options_.name + "': ";
    const bool tf_idf = options_.output_mode == "tf_idf";
    if (tf_idf && !idf_weights) throw ConfigError(where + "idf_weights must be set for tf_idf");
    if (!tf_idf && idf_weights) {
      throw ConfigError(where + "idf_weights should only be set if output_mode is \"tf_idf\"");
    }
    if (vocabulary.empty()) throw ConfigError(where + "cannot set an empty vocabulary");
    std::vector<std::string> special;
    if (is_int()) special.emplace_back("");
    special.emplace_back("[UNK]");
    const bool found_special = vocabulary.size() >= special.size() &&
                               std::equal(special.begin(), special.end(), vocabulary.begin());
    std::vector<std::string> tokens(vocabulary.begin() + (found_special ? special.size() : 0),
                                    vocabulary.end());
    std::unordered_map<std::string, std::int64_t> index;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i].empty()) {
        throw ConfigError(where + "found the reserved mask token \"\" at vocabulary index " +
                          std::to_string(i + (found_special ? special.size() : 0)) +
                          ": give the special tokens only at the start, in this order, or not at "
                          "all");
      }
      if (!index.emplace(tokens[i], static_cast<std::int64_t>(token_start() + i)).second) {
        throw ConfigError(where + "the vocabulary repeats the term \"" + tokens[i] + "\"");
      }
    }
    if (options_.max_tokens && token_start() + tokens.size() > *options_.max_tokens) {
      throw ConfigError(where + "a vocabulary of size " +
                        std::to_string(token_start() + tokens.size()) +
                        " is larger than max_tokens " + std::to_string(*options_.max_tokens));
    }
    if (tf_idf) {
      if (idf_weights->size() != vocabulary.size()) {
        throw ConfigError(where + "idf_weights must be as long as the vocabulary, " +
                          std::to_string(vocabulary.size()) + ", but holds " +
                          std::to_string(idf_weights->size()));
      }
      std::vector<float> weights;
      if (!found_special) {
        float mean = 0;
        for (float w : *idf_weights)
          mean += w;
        mean /= static_cast<float>(idf_weights->size());
        weights.assign(token_start(), mean);
      }
      weights.insert(weights.end(), idf_weights->begin(), idf_weights->end());
      idf_ = pad_weights(std::move(weights));
    }
    tokens_ = std::move(tokens);
    index_ = std::move(index);
    has_input_vocabulary_ = true;
    options_.vocabulary = vocabulary;
    options_.idf_weights = idf_weights;
  }

  /// The tokens of one string after standardizing, splitting and n-grams.
  std::vector<std::string> tokenize(std::string_view text) const {
    std::string s = standardize(text);
    std::vector<std::string> tokens;
    if (options_.split == "whitespace") {
      std::size_t i = 0;
      while (i < s.size()) {
        while (i < s.size() && is_space(s[i]))
          ++i;
        const std::size_t start = i;
        while (i < s.size() && !is_space(s[i]))
          ++i;
        if (i > start) tokens.emplace_back(s.substr(start, i - start));
      }
    } else if (options_.split == "character") {
      tokens = utf8_characters(s);
    } else {
      tokens.push_back(std::move(s));
    }
    if (options_.ngrams.empty()) return tokens;
    std::vector<std::string> grams;
    for (std::size_t width : options_.ngrams) {
      for (std::size_t i = 0; i + width <= tokens.size(); ++i) {
        std::string gram = tokens[i];
        for (std::size_t k = 1; k < width; ++k)
          gram += " " + tokens[i + k];
        grams.push_back(std::move(gram));
      }
    }
    return grams;
  }

  /// Integer output (`int` mode): `(batch, length)` indices, rows padded with 0 to
  /// `output_sequence_length` (or truncated) or, without it, to the batch's longest row.
  Tensor<std::int64_t> indices(std::span<const std::string> batch) const {
    if (!is_int()) {
      throw ConfigError("TextVectorization '" + options_.name +
                        "': indices() needs output_mode \"int\" but it is \"" +
                        options_.output_mode + "\"");
    }
    std::vector<std::vector<std::int64_t>> rows;
    std::size_t longest = 0;
    for (const auto& text : batch) {
      std::vector<std::int64_t> row;
      for (const auto& token : tokenize(text))
        row.push_back(lookup(token));
      longest = std::max(longest, row.size());
      rows.push_back(std::move(row));
    }
    const std::size_t length = options_.output_sequence_length.value_or(longest);
    Tensor<std::int64_t> out(Shape{batch.size(), length});
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const std::size_t n = std::min(length, rows[r].size());
      std::copy_n(rows[r].begin(), n, out.data() + r * length);
    }
    return out;
  }

  /// The layer's output as the executor takes it: `int` indices as floats (exact below 2^24), or
  /// `(batch, depth)` multi-hot, count or TF-IDF rows.
  Tensor<float> operator()(std::span<const std::string> batch) const {
    if (is_int()) return indices(batch).template cast<float>();
    const std::size_t depth = options_.pad_to_max_tokens ? *options_.max_tokens : vocabulary_size();
    Tensor<float> out(Shape{batch.size(), depth});
    for (std::size_t r = 0; r < batch.size(); ++r) {
      float* row = out.data() + r * depth;
      for (const auto& token : tokenize(batch[r])) {
        if (token.empty()) continue;  // the mask token is dropped
        const auto index = static_cast<std::size_t>(lookup(token));
        if (index < depth) row[index] += 1;
      }
      for (std::size_t i = 0; i < depth; ++i) {
        if (options_.output_mode == "multi_hot") {
          row[i] = row[i] > 0 ? 1.0f : 0.0f;
        } else if (options_.output_mode == "tf_idf") {
          row[i] = i < idf_.size() ? row[i] * idf_[i] : 0.0f;
        }
      }
    }
    return out;
  }
  Tensor<float> operator()(const std::vector<std::string>& batch) const {
    return (*this)(std::span<const std::string>(batch));
  }
  /// One string: a row of the batch's output, as `(length,)` or `(depth,)`.
  Tensor<float> operator()(const std::string& text) const {
    Tensor<float> batch = (*this)(std::span<const std::string>(&text, 1));
    return batch.reshape(Shape{batch.shape()[1]});
  }

  /// Keras's `get_config()` (with Keras's keys; the adapted vocabulary is not part of it, as in
  /// Keras, where it is an asset of the saved model: see `save`).
  nlohmann::json get_config() const {
    using nlohmann::json;
    const auto& o = options_;
    json ngrams = nullptr;
    if (!o.ngrams.empty()) {
      bool upto = true;
      for (std::size_t i = 0; i < o.ngrams.size(); ++i)
        upto = upto && o.ngrams[i] == i + 1;
      ngrams = upto ? json(o.ngrams.size()) : json(o.ngrams);
    }
    return {{"name", o.name},
            {"trainable", true},
            {"dtype", "string"},
            {"max_tokens", o.max_tokens ? json(*o.max_tokens) : json(nullptr)},
            {"standardize", o.standardize.empty() ? json(nullptr) : json(o.standardize)},
            {"split", o.split.empty() ? json(nullptr) : json(o.split)},
            {"ngrams", ngrams},
            {"output_mode", o.output_mode},
            {"output_sequence_length",
             o.output_sequence_length ? json(*o.output_sequence_length) : json(nullptr)},
            {"pad_to_max_tokens", o.pad_to_max_tokens},
            {"sparse", o.sparse},
            {"ragged", o.ragged},
            {"vocabulary", o.vocabulary ? json(*o.vocabulary) : json(nullptr)},
            {"idf_weights", o.idf_weights ? json(*o.idf_weights) : json(nullptr)},
            {"encoding", o.encoding},
            {"vocabulary_size",
             vocabulary_size() > token_start() ? json(vocabulary_size()) : json(nullptr)}};
  }

  /// The layer from Keras's `get_config()`; throws `ConfigError` naming a key of the wrong type,
  /// an unknown key, and a callable `standardize` or `split` (Python functions).
  static TextVectorization from_config(const nlohmann::json& config) {
    TextVectorizationOptions o;
    const auto fail = [&](const std::string& key, const std::string& expected) {
      throw ConfigError("TextVectorization config: " + key + " must be " + expected + " but is " +
                        config.at(key).dump());
    };
    if (!config.is_object()) {
      throw ConfigError("TextVectorization config: expected an object but found " + config.dump());
    }
    for (const auto& item : config.items()) {
      const std::string& key = item.key();
      const nlohmann::json& value = item.value();
      const auto string_or_none = [&](std::string& out) {
        if (value.is_null()) {
          out.clear();
        } else if (value.is_string()) {
          out = value.get<std::string>();
        } else {
          fail(key, "a string or null (a Python function cannot be rebuilt here)");
        }
      };
      const auto count_or_none = [&](std::optional<std::size_t>& out) {
        if (value.is_null()) {
          out.reset();
        } else if (value.is_number_unsigned()) {
          out = value.get<std::size_t>();
        } else {
          fail(key, "a non-negative integer or null");
        }
      };
      if (key == "name") {
        if (!value.is_string()) fail(key, "a string");
        o.name = value.get<std::string>();
      } else if (key == "max_tokens") {
        count_or_none(o.max_tokens);
      } else if (key == "standardize") {
        string_or_none(o.standardize);
      } else if (key == "split") {
        string_or_none(o.split);
      } else if (key == "ngrams") {
        o.ngrams.clear();
        if (value.is_number_unsigned()) {
          for (std::size_t w = 1; w <= value.get<std::size_t>(); ++w)
            o.ngrams.push_back(w);
        } else if (value.is_array()) {
          for (const auto& w : value) {
            if (!w.is_number_unsigned()) fail(key, "null, an integer or a list of integers");
            o.ngrams.push_back(w.get<std::size_t>());
          }
        } else if (!value.is_null()) {
          fail(key, "null, an integer or a list of integers");
        }
      } else if (key == "output_mode") {
        if (!value.is_string()) fail(key, "a string");
        o.output_mode = value.get<std::string>();
      } else if (key == "output_sequence_length") {
        count_or_none(o.output_sequence_length);
      } else if (key == "pad_to_max_tokens" || key == "sparse" || key == "ragged" ||
                 key == "trainable") {
        if (!value.is_boolean()) fail(key, "a boolean");
        if (key == "pad_to_max_tokens") o.pad_to_max_tokens = value.get<bool>();
        if (key == "sparse") o.sparse = value.get<bool>();
        if (key == "ragged") o.ragged = value.get<bool>();
      } else if (key == "vocabulary") {
        if (value.is_null()) continue;
        if (!value.is_array()) fail(key, "a list of strings or null");
        std::vector<std::string> vocabulary;
        for (const auto& t : value) {
          if (!t.is_string()) fail(key, "a list of strings or null");
          vocabulary.push_back(t.get<std::string>());
        }
        o.vocabulary = std::move(vocabulary);
      } else if (key == "idf_weights") {
        if (value.is_null()) continue;
        if (!value.is_array()) fail(key, "a list of numbers or null");
        std::vector<float> weights;
        for (const auto& w : value) {
          if (!w.is_number()) fail(key, "a list of numbers or null");
          weights.push_back(w.get<float>());
        }
        o.idf_weights = std::move(weights);
      } else if (key == "encoding") {
        if (!value.is_string()) fail(key, "a string");
        o.encoding = value.get<std::string>();
      } else if (key == "dtype" || key == "vocabulary_size" || key == "has_input_vocabulary") {
        // Derived: the dtype of a string layer, and the size the vocabulary will have.
      } else {
        throw ConfigError("TextVectorization config: unknown key \"" + key + "\"");
      }
    }
    return TextVectorization(std::move(o));
  }

  /// Writes the layer to `path` as JSON: its config, and the vocabulary and TF-IDF weights it
  /// has learned (Keras keeps these in its saved model's `vocabulary.txt` asset and variables).
  /// Written under a temporary name and renamed into place.
  void save(const std::filesystem::path& path) const {
    nlohmann::json out{{"class_name", "TextVectorization"},
                       {"config", get_config()},
                       {"vocabulary", get_vocabulary(true)},
                       {"idf_weights", idf_}};
    keras::detail::write_atomically(path, out.dump(1));
  }

  /// The layer `save` wrote; throws `IoError` for a missing file and `FormatError` naming the file
  /// for one that is not such a layer.
  static TextVectorization load(const std::filesystem::path& path) {
    const std::string bytes = keras::detail::read_bytes(path);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(bytes);
      if (j.at("class_name") != "TextVectorization") {
        throw FormatError("class_name is " + j.at("class_name").dump());
      }
      TextVectorization layer = from_config(j.at("config"));
      if (!layer.has_input_vocabulary_) {
        const auto vocabulary = j.at("vocabulary").get<std::vector<std::string>>();
        const auto weights = j.at("idf_weights").get<std::vector<float>>();
        if (vocabulary.size() > layer.token_start()) {
          layer.load_vocabulary(vocabulary, layer.options_.output_mode == "tf_idf"
                                                ? std::optional<std::vector<float>>(weights)
                                                : std::nullopt);
        }
      }
      return layer;
    } catch (const nlohmann::json::exception& e) {
      throw FormatError("TextVectorization file '" + path.string() +
                        "': expected a saved layer but " + e.what());
    } catch (const FormatError& e) {
      throw FormatError("TextVectorization file '" + path.string() + "': " + e.what());
    }
  }

 private:
  bool is_int() const noexcept { return options_.output_mode == "int"; }
  std::size_t token_start() const noexcept { return is_int() ? 2 : 1; }
  static bool is_space(char c) noexcept {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
  }

  std::int64_t lookup(const std::string& token) const {
    if (token.empty()) return 0;  // int mode's padding; dropped by the other modes' callers
    const auto found = index_.find(token);
    return found == index_.end() ? static_cast<std::int64_t>(token_start() - 1) : found->second;
  }

  std::string standardize(std::string_view text) const {
    const auto& mode = options_.standardize;
    const bool lower = mode == "lower" || mode == "lower_and_strip_punctuation";
    const bool strip = mode == "strip_punctuation" || mode == "lower_and_strip_punctuation";
    std::string out;
    out.reserve(text.size());
    for (char c : text) {
      const auto u = static_cast<unsigned char>(c);
      // ASCII punctuation: the characters of Keras's strip regex, Python's string.punctuation.
      if (strip && ((u >= 33 && u <= 47) || (u >= 58 && u <= 64) || (u >= 91 && u <= 96) ||
                    (u >= 123 && u <= 126))) {
        continue;
      }
      out.push_back(lower && u >= 'A' && u <= 'Z' ? static_cast<char>(u - 'A' + 'a') : c);
    }
    return out;
  }

  /// UTF-8 characters; each maximal ill-formed subsequence becomes U+FFFD (Unicode's
  /// recommended practice, which Python's and TensorFlow's replacing decoders follow).
  static std::vector<std::string> utf8_characters(const std::string& s) {
    std::vector<std::string> out;
    const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
    std::size_t i = 0;
    while (i < s.size()) {
      const unsigned char lead = byte(i);
      std::size_t need = 0;
      unsigned char low = 0x80, high = 0xBF;
      if (lead < 0x80) {
        out.emplace_back(1, s[i++]);
        continue;
      } else if (lead >= 0xC2 && lead <= 0xDF) {
        need = 1;
      } else if (lead >= 0xE0 && lead <= 0xEF) {
        need = 2;
        if (lead == 0xE0) low = 0xA0;
        if (lead == 0xED) high = 0x9F;
      } else if (lead >= 0xF0 && lead <= 0xF4) {
        need = 3;
        if (lead == 0xF0) low = 0x90;
        if (lead == 0xF4) high = 0x8F;
      } else {
        out.emplace_back("\xEF\xBF\xBD");
        ++i;
        continue;
      }
      std::size_t j = 1;
      for (; j <= need && i + j < s.size(); ++j) {
        const unsigned char c = byte(i + j);
        const unsigned char lo = j == 1 ? low : 0x80, hi = j == 1 ? high : 0xBF;
        if (c < lo || c > hi) break;
      }
      if (j == need + 1) {
        out.emplace_back(s.substr(i, need + 1));
      } else {
        out.emplace_back("\xEF\xBF\xBD");
      }
      i += j;
    }
    return out;
  }

  void reset_state() {
    if (has_input_vocabulary_) {
      throw ConfigError("TextVectorization '" + options_.name +
                        "': cannot adapt a layer given a vocabulary (the vocabulary argument or "
                        "set_vocabulary)");
    }
    counts_.clear();
    document_counts_.clear();
    documents_ = 0;
  }

  void update_state(std::span<const std::string> documents) {
    const bool tf_idf = options_.output_mode == "tf_idf";
    for (const auto& document : documents) {
      auto tokens = tokenize(document);
      for (const auto& token : tokens)
        ++counts_[token];
      if (tf_idf) {
        std::sort(tokens.begin(), tokens.end());
        tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
        for (const auto& token : tokens)
          ++document_counts_[token];
        ++documents_;
      }
    }
  }

  void finalize_state() {
    counts_.erase("");
    counts_.erase("[UNK]");
    std::vector<std::pair<std::string, std::int64_t>> sorted(counts_.begin(), counts_.end());
    std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
      return a.second != b.second ? a.second > b.second : a.first > b.first;
    });
    if (options_.max_tokens && sorted.size() > *options_.max_tokens - token_start()) {
      sorted.resize(*options_.max_tokens - token_start());
    }
    tokens_.clear();
    index_.clear();
    for (std::size_t i = 0; i < sorted.size(); ++i) {
      tokens_.push_back(sorted[i].first);
      index_.emplace(sorted[i].first, static_cast<std::int64_t>(token_start() + i));
    }
    if (options_.output_mode == "tf_idf") {
      std::vector<float> weights;
      float sum = 0;
      for (const auto& token : tokens_) {
        const double df = static_cast<double>(document_counts_[token]);
        weights.push_back(
            static_cast<float>(std::log(1.0 + static_cast<double>(documents_) / (1.0 + df))));
        sum += weights.back();
      }
      const float mean = weights.empty() ? 0.0f : sum / static_cast<float>(weights.size());
      weights.insert(weights.begin(), token_start(), mean);
      idf_ = pad_weights(std::move(weights));
    }
    counts_.clear();
    document_counts_.clear();
  }

  std::vector<float> pad_weights(std::vector<float> weights) const {
    if (options_.pad_to_max_tokens && options_.max_tokens &&
        weights.size() < *options_.max_tokens) {
      weights.resize(*options_.max_tokens, 0.0f);
    }
    return weights;
  }

  TextVectorizationOptions options_;
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, std::int64_t> index_;
  std::vector<float> idf_;
  bool has_input_vocabulary_ = false;
  std::unordered_map<std::string, std::int64_t> counts_, document_counts_;
  std::int64_t documents_ = 0;
};

}  // namespace loadstar::keras::layers

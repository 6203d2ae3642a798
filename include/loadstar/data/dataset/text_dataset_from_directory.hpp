/// \file
/// `text_dataset_from_directory`: Keras's `keras.utils.text_dataset_from_directory` as a
/// resumable dataset of `(texts, labels)` batches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/index_directory.hpp"
#include "loadstar/data/dataset/detail/stack.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/data/dataset/from_tensor_slices.hpp"
#include "loadstar/data/dataset/shuffle.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// The options of `text_dataset_from_directory`, named and defaulted as Keras's arguments.
struct TextDatasetOptions {
  /// `"inferred"` (from the sub-folders), `nullptr` (texts only) or one label per file.
  DirectoryLabels labels = std::string("inferred");
  /// `"int"`, `"categorical"`, `"binary"` or `"none"`; labels are float32.
  std::string label_mode = "int";
  /// The classes to use and their order; all sub-folders, sorted, by default.
  std::optional<std::vector<std::string>> class_names = {};
  /// Texts per batch; `std::nullopt` yields one text at a time (Keras's `batch_size=None`).
  std::optional<std::size_t> batch_size = 32;
  /// Keep at most this many bytes of each text (`tf.strings.substr(text, 0, max_length)`).
  std::optional<std::size_t> max_length = {};
  /// Shuffle the files (and, each epoch, the texts through a buffer of `8 * batch_size`).
  bool shuffle = true;
  /// The seed of the shuffles; drawn at random when absent (required with `validation_split`).
  std::optional<std::uint64_t> seed = {};
  /// The fraction of the files reserved for validation (0: no split).
  double validation_split = 0.0;
  /// `"training"` or `"validation"` (empty without a split); `"both"` throws `ConfigError`.
  std::string subset = "";
  /// Descend into symbolic links to folders.
  bool follow_links = false;
  /// Print "Found N files belonging to K classes." and the subset size, as Keras does.
  bool verbose = true;
};

/// The `.txt` files of a folder tree as a dataset of `(texts, labels)`, as Keras's
/// `text_dataset_from_directory`: the files in Keras's order (`image_dataset_from_directory`'s:
/// sorted class sub-folders, NumPy's `RandomState(seed)` shuffle, the validation subset at the
/// tail), each epoch shuffled through a buffer of `8 * batch_size` by loadstar's generator. An
/// element is the batch's file contents (bytes, cut to `max_length`) and its labels (float32,
/// shaped as `ImageDirectoryDataset`'s); without a batch size, one text and its label. The state
/// is the position in the shuffled file list.
class TextDirectoryDataset : public DatasetBase<TextDirectoryDataset> {
  using Files = ShuffleDataset<TensorSlices<Tensor<std::int64_t>>>;

 public:
  using element_type = std::pair<std::vector<std::string>, Tensor<float>>;

  /// Built by `text_dataset_from_directory`.
  TextDirectoryDataset(std::shared_ptr<const detail::DirectoryIndex> index,
                       const TextDatasetOptions& options, std::uint64_t seed, bool shuffle)
      : index_(std::move(index)),
        options_(options),
        seed_(seed),
        files_(TensorSlices<Tensor<std::int64_t>>(numbered(index_->paths.size())),
               shuffle ? (options.batch_size ? 8 * *options.batch_size : 1024) : 1, seed, true) {}

  std::optional<element_type> next() {
    const std::size_t n = options_.batch_size.value_or(1);
    element_type out;
    std::vector<Tensor<float>> labels;
    while (out.first.size() < n) {
      auto file = files_.next();
      if (!file) break;
      const auto i = static_cast<std::size_t>(file->data()[0]);
      out.first.push_back(read(index_->paths[i]));
      labels.push_back(label(i));
    }
    if (out.first.empty()) return std::nullopt;
    out.second = options_.batch_size ? detail::Stacker<Tensor<float>>::stack(labels)
                                     : std::move(labels.front());
    return out;
  }
  void reset() { files_.reset(); }
  nlohmann::json state() const {
    return {{"op", "text_dataset_from_directory"},
            {"files", index_->paths.size()},
            {"seed", seed_},
            {"upstream", files_.state()}};
  }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "text_dataset_from_directory");
    if (s["files"] != index_->paths.size() || s["seed"] != seed_) {
      throw CheckpointError("text_dataset_from_directory: state is of " + s["files"].dump() +
                            " files with seed " + s["seed"].dump() + " but this dataset has " +
                            std::to_string(index_->paths.size()) + " files with seed " +
                            std::to_string(seed_));
    }
    files_.restore(s["upstream"]);
  }

  /// The class names (Keras's `dataset.class_names`); empty without labels.
  const std::vector<std::string>& class_names() const noexcept { return index_->class_names; }
  /// The files in the order of the first shuffle.
  const std::vector<std::string>& file_paths() const noexcept { return index_->paths; }
  /// Each file's class index, in the order of `file_paths()`.
  const std::vector<std::int64_t>& labels() const noexcept { return index_->labels; }

 private:
  static Tensor<std::int64_t> numbered(std::size_t n) {
    Tensor<std::int64_t> t(Shape{n});
    for (std::size_t i = 0; i < n; ++i)
      t.data()[i] = static_cast<std::int64_t>(i);
    return t;
  }
  std::string read(const std::string& path) const {
    std::ifstream file(path, std::ios::binary);
    if (!file) throw IoError("text_dataset_from_directory: cannot open '" + path + "'");
    std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    if (options_.max_length && text.size() > *options_.max_length) {
      text.resize(*options_.max_length);
    }
    return text;
  }
  Tensor<float> label(std::size_t i) const {
    const std::string& mode = options_.label_mode;
    if (mode == "int") return Tensor<float>(Shape{}, static_cast<float>(index_->labels[i]));
    if (mode == "binary") return Tensor<float>(Shape{1}, static_cast<float>(index_->labels[i]));
    if (mode == "categorical") {
      Tensor<float> one_hot(Shape{index_->class_names.size()});
      one_hot.data()[index_->labels[i]] = 1.0f;
      return one_hot;
    }
    return Tensor<float>(Shape{0});
  }

  std::shared_ptr<const detail::DirectoryIndex> index_;
  TextDatasetOptions options_;
  std::uint64_t seed_;
  Files files_;
};

/// Keras's `text_dataset_from_directory(directory, ...)`. Throws `ConfigError` for options outside
/// Keras's values, for subset `"both"` (not implemented: call it twice with "training" and
/// "validation" and the same seed), and for an empty result; `IoError` for a missing directory.
/// \code
/// auto train = text_dataset_from_directory("aclImdb/train", {.seed = 42,
///                                                            .validation_split = 0.2,
///                                                            .subset = "training"});
/// \endcode
inline TextDirectoryDataset text_dataset_from_directory(const std::string& directory,
                                                        const TextDatasetOptions& options = {}) {
  const std::string utility = "text_dataset_from_directory";
  const std::string& mode = options.label_mode;
  if (mode != "int" && mode != "categorical" && mode != "binary" && mode != "none") {
    throw ConfigError(utility +
                      ": label_mode must be 'int', 'categorical', 'binary' or 'none' "
                      "but is '" +
                      mode + "'");
  }
  if (options.subset == "both") {
    throw ConfigError(utility +
                      ": subset 'both' is not implemented (build the 'training' and the "
                      "'validation' subsets with the same seed)");
  }
  if (options.batch_size && *options.batch_size == 0) {
    throw ConfigError(utility + ": batch_size must be positive (or nullopt) but is 0");
  }
  detail::check_validation_split(utility, options.validation_split, options.subset, options.shuffle,
                                 options.seed.has_value());
  const bool labelled = !std::holds_alternative<std::nullptr_t>(options.labels) && mode != "none";
  const std::uint64_t seed = options.seed ? *options.seed : std::random_device{}() % 1000000;
  auto index = detail::index_directory(
      utility, directory, labelled ? options.labels : DirectoryLabels(nullptr), {".txt"},
      options.class_names, options.shuffle, seed, options.follow_links, options.verbose);
  if (mode == "binary" && index.class_names.size() != 2) {
    throw ConfigError(utility + ": label_mode 'binary' needs exactly 2 classes but there are " +
                      std::to_string(index.class_names.size()) + ": " +
                      detail::join_list(index.class_names));
  }
  for (auto label : index.labels) {
    if (label < 0 || static_cast<std::size_t>(label) >= index.class_names.size()) {
      throw ConfigError(utility + ": label " + std::to_string(label) + " is outside [0, " +
                        std::to_string(index.class_names.size()) + ")");
    }
  }
  auto part = std::make_shared<detail::DirectoryIndex>(
      detail::split_subset(index, options.validation_split,
                           options.subset.empty() ? "training" : options.subset, options.verbose));
  if (part->paths.empty()) {
    throw ConfigError(utility + ": no text files found in directory '" + directory +
                      "' (allowed format: .txt)");
  }
  TextDatasetOptions effective = options;
  effective.label_mode = labelled ? mode : "none";
  return TextDirectoryDataset(std::move(part), effective, seed, options.shuffle);
}

}  // namespace loadstar

/// \file
/// `image_dataset_from_directory`: Keras's `keras.utils.image_dataset_from_directory` as a
/// resumable dataset of `(images, labels)` batches.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "loadstar/data/dataset/batch.hpp"
#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/index_directory.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/data/dataset/from_tensor_slices.hpp"
#include "loadstar/data/dataset/map.hpp"
#include "loadstar/data/dataset/shuffle.hpp"
#include "loadstar/data/image/decode.hpp"
#include "loadstar/data/image/ops.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// The options of `image_dataset_from_directory`, named and defaulted as Keras's arguments.
struct ImageDatasetOptions {
  /// `"inferred"` (from the sub-folders), `nullptr` (images only) or one label per file.
  DirectoryLabels labels = std::string("inferred");
  /// `"int"` (the class index), `"categorical"` (one-hot), `"binary"` (0 or 1, two classes only)
  /// or `"none"` (Keras's None: no labels). Labels are float32, as loadstar's losses read them.
  std::string label_mode = "int";
  /// The classes to use and their order (sub-folder names); all sub-folders, sorted, by default.
  std::optional<std::vector<std::string>> class_names = {};
  /// `"rgb"` (3 channels), `"rgba"` (4) or `"grayscale"` (1).
  std::string color_mode = "rgb";
  /// Images per batch; `std::nullopt` yields single images (Keras's `batch_size=None`).
  std::optional<std::size_t> batch_size = 32;
  /// `(height, width)` every image is resized to.
  std::array<std::size_t, 2> image_size = {256, 256};
  /// Shuffle the files (and, each epoch, the images through a buffer of `8 * batch_size`).
  bool shuffle = true;
  /// The seed of the shuffles; drawn at random when absent (required with `validation_split`).
  std::optional<std::uint64_t> seed = {};
  /// The fraction of the files reserved for validation (0: no split).
  double validation_split = 0.0;
  /// `"training"`, `"validation"` or `"both"` (`image_dataset_from_directory_both`); empty when
  /// there is no split.
  std::string subset = "";
  /// `"bilinear"`, `"nearest"` or `"area"` (tf's other methods throw `ConfigError`).
  std::string interpolation = "bilinear";
  /// Descend into symbolic links to folders.
  bool follow_links = false;
  /// Crop each image at the centre to the target aspect ratio before resizing (Keras's
  /// `smart_resize`).
  bool crop_to_aspect_ratio = false;
  /// Resize each image to fit and pad it with zeros (tf's `resize_with_pad`).
  bool pad_to_aspect_ratio = false;
  /// `"channels_last"` only: `"channels_first"` throws `ConfigError`.
  std::string data_format = "channels_last";
  /// Print "Found N files belonging to K classes." and the subset sizes, as Keras does.
  bool verbose = true;
  /// Images decoded in parallel (Keras uses tf.data's AUTOTUNE): threads of the `map`.
  std::size_t num_parallel_calls = 1;
};

namespace detail {

// Loads file `i` of the index: decode, resize as Keras's `load_image`, and its label.
struct DirectoryImageLoader {
  std::shared_ptr<const DirectoryIndex> index;
  std::size_t height = 0, width = 0;
  int channels = 3;
  image::ResizeMethod method = image::ResizeMethod::bilinear;
  bool crop = false, pad = false;
  std::string label_mode;

  std::pair<Tensor<float>, Tensor<float>> operator()(const Tensor<std::int64_t>& row) const {
    const auto i = static_cast<std::size_t>(row.data()[0]);
    const std::string& path = index->paths[i];
    const auto decoded = image::decode_image(image::read_file(path), channels, path);
    Tensor<float> image = crop  ? image::smart_resize(decoded, height, width, method)
                          : pad ? image::resize_with_pad(decoded, height, width, method)
                                : image::resize(decoded, height, width, method);
    Tensor<float> label;
    if (label_mode == "int") {
      label = Tensor<float>(Shape{}, static_cast<float>(index->labels[i]));
    } else if (label_mode == "binary") {
      label = Tensor<float>(Shape{1}, static_cast<float>(index->labels[i]));
    } else if (label_mode == "categorical") {
      label = Tensor<float>(Shape{index->class_names.size()});
      label.data()[index->labels[i]] = 1.0f;
    } else {
      label = Tensor<float>(Shape{0});
    }
    return {std::move(image), std::move(label)};
  }
};

using DirectoryImageStream =
    MapDataset<ShuffleDataset<TensorSlices<Tensor<std::int64_t>>>, DirectoryImageLoader, false>;

}  // namespace detail

/// The images of a folder tree as a dataset of `(images, labels)`, as Keras's
/// `image_dataset_from_directory`: files with a `.bmp`, `.gif`, `.jpeg`, `.jpg` or `.png` suffix
/// (any case; a GIF gives its first frame, as Keras's `expand_animations=False`), in Keras's order:
/// class sub-folders sorted, files sorted by folder and name, then, with `shuffle`, the paths
/// shuffled by NumPy's `RandomState(seed)` exactly as Keras does (`NumpyRandomState`), so a seed
/// puts the same files in the same subset as Keras. Each epoch then shuffles through a buffer of `8
/// * batch_size` (Keras's tf.data shuffle; loadstar's generator, not tf's), decodes
/// (`decode_image`), resizes
/// (`resize`, `smart_resize` or `resize_with_pad`) and batches.
///
/// Elements: images `(batch, height, width, channels)` float32 in [0, 255], labels float32 of
/// shape `(batch,)` for `"int"`, `(batch, classes)` for `"categorical"`, `(batch, 1)` for
/// `"binary"` and `(batch, 0)` for `"none"` (Keras yields the images alone). The state is the
/// pipeline's, restored exactly; `.shard(n, i)` splits batches between ranks.
class ImageDirectoryDataset : public DatasetBase<ImageDirectoryDataset> {
  using Batched = BatchDataset<detail::DirectoryImageStream>;
  using Single = detail::DirectoryImageStream;

 public:
  using element_type = std::pair<Tensor<float>, Tensor<float>>;

  /// Built by `image_dataset_from_directory`.
  ImageDirectoryDataset(std::shared_ptr<const detail::DirectoryIndex> index,
                        const ImageDatasetOptions& options, std::uint64_t seed, bool shuffle,
                        int channels)
      : index_(std::move(index)), seed_(seed), stream_(make(options, seed, shuffle, channels)) {}

  std::optional<element_type> next() {
    return std::visit([](auto& s) { return s.next(); }, stream_);
  }
  void reset() {
    std::visit([](auto& s) { s.reset(); }, stream_);
  }
  nlohmann::json state() const {
    return {{"op", "image_dataset_from_directory"},
            {"files", index_->paths.size()},
            {"seed", seed_},
            {"upstream", std::visit([](const auto& s) { return s.state(); }, stream_)}};
  }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "image_dataset_from_directory");
    if (s["files"] != index_->paths.size() || s["seed"] != seed_) {
      throw CheckpointError("image_dataset_from_directory: state is of " + s["files"].dump() +
                            " files with seed " + s["seed"].dump() + " but this dataset has " +
                            std::to_string(index_->paths.size()) + " files with seed " +
                            std::to_string(seed_));
    }
    std::visit([&](auto& stream) { stream.restore(s["upstream"]); }, stream_);
  }

  /// The class names (Keras's `dataset.class_names`); empty without labels.
  const std::vector<std::string>& class_names() const noexcept { return index_->class_names; }
  /// The files in the order of the first shuffle (Keras's `dataset.file_paths`).
  const std::vector<std::string>& file_paths() const noexcept { return index_->paths; }
  /// Each file's class index, in the order of `file_paths()`.
  const std::vector<std::int64_t>& labels() const noexcept { return index_->labels; }
  /// The seed of the shuffles (the drawn one when none was given).
  std::uint64_t seed() const noexcept { return seed_; }

 private:
  std::variant<Batched, Single> make(const ImageDatasetOptions& options, std::uint64_t seed,
                                     bool shuffle, int channels) {
    const auto n = index_->paths.size();
    Tensor<std::int64_t> files(Shape{n});
    for (std::size_t i = 0; i < n; ++i)
      files.data()[i] = static_cast<std::int64_t>(i);
    detail::DirectoryImageLoader loader{index_,
                                        options.image_size[0],
                                        options.image_size[1],
                                        channels,
                                        image::resize_method(options.interpolation),
                                        options.crop_to_aspect_ratio,
                                        options.pad_to_aspect_ratio,
                                        options.label_mode};
    const std::size_t buffer = shuffle ? (options.batch_size ? 8 * *options.batch_size : 1024) : 1;
    Single single(ShuffleDataset<TensorSlices<Tensor<std::int64_t>>>(
                      TensorSlices<Tensor<std::int64_t>>(std::move(files)), buffer, seed, true),
                  std::move(loader), 0,
                  MapOptions{.num_parallel_calls = options.num_parallel_calls});
    if (options.batch_size) return Batched(std::move(single), *options.batch_size, false);
    return single;
  }

  std::shared_ptr<const detail::DirectoryIndex> index_;
  std::uint64_t seed_;
  std::variant<Batched, Single> stream_;
};

namespace detail {

inline std::vector<ImageDirectoryDataset> image_datasets(const std::string& directory,
                                                         const ImageDatasetOptions& options,
                                                         bool both) {
  const std::string utility = "image_dataset_from_directory";
  const std::string& mode = options.label_mode;
  if (mode != "int" && mode != "categorical" && mode != "binary" && mode != "none") {
    throw ConfigError(utility +
                      ": label_mode must be 'int', 'categorical', 'binary' or 'none' "
                      "but is '" +
                      mode + "'");
  }
  const bool labelled = !std::holds_alternative<std::nullptr_t>(options.labels) && mode != "none";
  int channels = 0;
  if (options.color_mode == "rgb") {
    channels = 3;
  } else if (options.color_mode == "rgba") {
    channels = 4;
  } else if (options.color_mode == "grayscale") {
    channels = 1;
  } else {
    throw ConfigError(utility + ": color_mode must be 'rgb', 'rgba' or 'grayscale' but is '" +
                      options.color_mode + "'");
  }
  if (options.image_size[0] == 0 || options.image_size[1] == 0) {
    throw ConfigError(utility + ": image_size must be positive but is (" +
                      std::to_string(options.image_size[0]) + ", " +
                      std::to_string(options.image_size[1]) + ")");
  }
  image::resize_method(options.interpolation);
  if (options.crop_to_aspect_ratio && options.pad_to_aspect_ratio) {
    throw ConfigError(utility +
                      ": only one of pad_to_aspect_ratio and crop_to_aspect_ratio can "
                      "be true");
  }
  if (options.data_format != "channels_last") {
    throw ConfigError(utility + ": data_format '" + options.data_format +
                      "' is not implemented (channels_last is)");
  }
  if (options.batch_size && *options.batch_size == 0) {
    throw ConfigError(utility + ": batch_size must be positive (or nullopt) but is 0");
  }
  if (both != (options.subset == "both")) {
    throw ConfigError(utility +
                      (both ? ": image_dataset_from_directory_both needs subset 'both'"
                            : ": subset 'both' gives two datasets: call "
                              "image_dataset_from_directory_both") +
                      " (subset is '" + options.subset + "')");
  }
  check_validation_split(utility, options.validation_split, options.subset, options.shuffle,
                         options.seed.has_value());
  const std::uint64_t seed =
      options.seed ? *options.seed : std::random_device{}() % 1000000;  // np.random.randint(1e6)
  DirectoryLabels labels = labelled ? options.labels : DirectoryLabels(nullptr);
  auto index = index_directory(utility, directory, labels,
                               {".bmp", ".gif", ".jpeg", ".jpg", ".png"}, options.class_names,
                               options.shuffle, seed, options.follow_links, options.verbose);
  if (mode == "binary" && index.class_names.size() != 2) {
    throw ConfigError(utility + ": label_mode 'binary' needs exactly 2 classes but there are " +
                      std::to_string(index.class_names.size()) + ": " +
                      join_list(index.class_names));
  }
  if (labelled) {
    for (auto label : index.labels) {
      if (label < 0 || static_cast<std::size_t>(label) >= index.class_names.size()) {
        throw ConfigError(utility + ": label " + std::to_string(label) + " is outside [0, " +
                          std::to_string(index.class_names.size()) + ")");
      }
    }
  }
  ImageDatasetOptions effective = options;
  effective.label_mode = labelled ? mode : "none";
  std::vector<ImageDirectoryDataset> out;
  const std::vector<std::string> subsets =
      both ? std::vector<std::string>{"training", "validation"}
           : std::vector<std::string>{options.subset.empty() ? "training" : options.subset};
  for (const auto& subset : subsets) {
    auto part = std::make_shared<DirectoryIndex>(
        split_subset(index, options.validation_split, subset, options.verbose));
    if (part->paths.empty()) {
      throw ConfigError(utility + ": no " +
                        (options.validation_split != 0 ? subset + " " : std::string()) +
                        "images found in directory '" + directory +
                        "' (allowed formats: .bmp, .gif, .jpeg, .jpg, .png)");
    }
    // Keras shuffles the validation subset of "both" per epoch neither.
    const bool shuffle = options.shuffle && !(both && subset == "validation");
    out.emplace_back(std::move(part), effective, seed, shuffle, channels);
  }
  return out;
}

}  // namespace detail

/// Keras's `image_dataset_from_directory(directory, ...)` for no split or `subset` `"training"` or
/// `"validation"`. Throws `ConfigError` for any option outside Keras's values or not implemented
/// (interpolations other than bilinear, nearest, area and bicubic;
/// `data_format="channels_first"`), for subset `"both"` (see `image_dataset_from_directory_both`),
/// for an empty result; `IoError` for a missing directory.
/// \code
/// auto train = image_dataset_from_directory("flowers", {.image_size = {180, 180}, .seed = 123,
///                                                       .validation_split = 0.2,
///                                                       .subset = "training"});
/// while (auto batch = train.next()) { auto& [images, labels] = *batch; ... }
/// \endcode
inline ImageDirectoryDataset image_dataset_from_directory(const std::string& directory,
                                                          const ImageDatasetOptions& options = {}) {
  return std::move(detail::image_datasets(directory, options, false).front());
}

/// Keras's `image_dataset_from_directory` with `subset="both"`: the training and the validation
/// dataset (the latter not shuffled, as in Keras).
inline std::pair<ImageDirectoryDataset, ImageDirectoryDataset> image_dataset_from_directory_both(
    const std::string& directory, const ImageDatasetOptions& options) {
  auto both = detail::image_datasets(directory, options, true);
  return {std::move(both[0]), std::move(both[1])};
}

}  // namespace loadstar

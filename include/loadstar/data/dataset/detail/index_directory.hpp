/// \file
/// Keras's `dataset_utils.index_directory` and `get_training_or_validation_split`: the file list,
/// labels and class names that the `*_dataset_from_directory` utilities read.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <variant>
#include <vector>

#include "loadstar/data/numpy_random_state.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// Where the labels of a `*_dataset_from_directory` come from, as Keras's `labels` argument:
/// `"inferred"` (the sorted sub-folder names, or `class_names`), `nullptr` (no labels), or one
/// integer label per file in the sorted order of the files found under the directory.
using DirectoryLabels = std::variant<std::string, std::nullptr_t, std::vector<std::int64_t>>;

namespace detail {

/// The files of a directory utility, in Keras's order, with their labels and class names.
struct DirectoryIndex {
  std::vector<std::string> paths;
  std::vector<std::int64_t> labels;  // empty without labels
  std::vector<std::string> class_names;
  bool labelled = true;
};

inline std::string join_list(const std::vector<std::string>& names) {
  std::string out = "[";
  for (std::size_t i = 0; i < names.size(); ++i)
    out += (i ? ", '" : "'") + names[i] + "'";
  return out + "]";
}

// os.walk(top, followlinks): every directory's path and its non-directory entries; a symbolic link
// to a directory is descended only with `follow_links` (each real directory once).
inline void walk(const std::filesystem::path& top, bool follow_links,
                 std::vector<std::pair<std::string, std::vector<std::string>>>& out,
                 std::set<std::filesystem::path>& seen) {
  std::error_code error;
  const auto canonical = std::filesystem::canonical(top, error);
  if (!error && !seen.insert(canonical).second) return;
  std::vector<std::string> files;
  std::vector<std::filesystem::path> subdirectories;
  std::filesystem::directory_iterator it(top, error);
  if (error) {
    throw IoError("cannot list directory '" + top.string() + "': " + error.message());
  }
  for (const auto& entry : it) {
    std::error_code entry_error;
    if (entry.is_directory(entry_error)) {
      if (follow_links || !entry.is_symlink(entry_error)) subdirectories.push_back(entry.path());
    } else {
      files.push_back(entry.path().filename().string());
    }
  }
  out.emplace_back(top.string(), std::move(files));
  for (const auto& sub : subdirectories)
    walk(sub, follow_links, out, seen);
}

inline bool has_format(const std::string& name, const std::vector<std::string>& formats) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) {
    return static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
  });
  return std::any_of(formats.begin(), formats.end(), [&](const std::string& f) {
    return lower.size() >= f.size() && lower.compare(lower.size() - f.size(), f.size(), f) == 0;
  });
}

/// Keras's `index_directory`: class sub-folders (sorted, hidden ones skipped) or the whole tree,
/// files with one of `formats` (lower-cased suffixes) in `os.walk` order sorted by folder then
/// name, and, with `shuffle`, paths and labels shuffled by `np.random.RandomState(seed)`.
inline DirectoryIndex index_directory(const std::string& utility, const std::string& directory,
                                      const DirectoryLabels& labels,
                                      const std::vector<std::string>& formats,
                                      const std::optional<std::vector<std::string>>& class_names,
                                      bool shuffle, std::uint64_t seed, bool follow_links,
                                      bool verbose) {
  std::error_code error;
  if (!std::filesystem::is_directory(directory, error)) {
    throw IoError(utility + ": directory '" + directory + "' does not exist or is not a folder");
  }
  DirectoryIndex index;
  std::vector<std::string> subdirs;
  const bool inferred = std::holds_alternative<std::string>(labels);
  if (inferred) {
    if (std::get<std::string>(labels) != "inferred") {
      throw ConfigError(utility +
                        ": labels must be 'inferred', nullptr or a list of integers "
                        "but is '" +
                        std::get<std::string>(labels) + "'");
    }
    for (const auto& entry : std::filesystem::directory_iterator(directory)) {
      std::error_code entry_error;
      const std::string name = entry.path().filename().string();
      if (entry.is_directory(entry_error) && !name.starts_with(".")) subdirs.push_back(name);
    }
    std::sort(subdirs.begin(), subdirs.end());
    if (class_names) {
      for (const auto& name : *class_names) {
        if (std::find(subdirs.begin(), subdirs.end(), name) == subdirs.end()) {
          throw ConfigError(utility + ": class_names " + join_list(*class_names) +
                            " do not match the sub-folders of '" + directory + "': expected " +
                            join_list(subdirs) + " (or a subset of it)");
        }
      }
      subdirs = *class_names;
    }
  } else {
    subdirs = {""};
    if (class_names) {
      throw ConfigError(utility + ": class_names cannot be given with " +
                        (std::holds_alternative<std::nullptr_t>(labels)
                             ? "labels=None (no labels)"
                             : "a list of labels (the class names are the sorted labels)"));
    }
  }
  std::vector<std::int64_t> inferred_labels;
  for (std::size_t k = 0; k < subdirs.size(); ++k) {
    const std::filesystem::path root = std::filesystem::path(directory) / subdirs[k];
    std::vector<std::pair<std::string, std::vector<std::string>>> folders;
    std::set<std::filesystem::path> seen;
    walk(root, follow_links, folders, seen);
    std::sort(folders.begin(), folders.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [folder, files] : folders) {
      std::sort(files.begin(), files.end());
      for (const auto& name : files) {
        if (!has_format(name, formats)) continue;
        index.paths.push_back((std::filesystem::path(folder) / name).string());
        inferred_labels.push_back(static_cast<std::int64_t>(k));
      }
    }
  }
  if (inferred) {
    index.labels = std::move(inferred_labels);
    index.class_names = subdirs;
  } else if (std::holds_alternative<std::nullptr_t>(labels)) {
    index.labelled = false;
  } else {
    index.labels = std::get<std::vector<std::int64_t>>(labels);
    if (index.labels.size() != index.paths.size()) {
      throw ConfigError(utility +
                        ": expected the length of labels to match the number of files "
                        "in the target directory: labels has " +
                        std::to_string(index.labels.size()) + " values while " +
                        std::to_string(index.paths.size()) + " files were found in '" + directory +
                        "'");
    }
    std::set<std::int64_t> distinct(index.labels.begin(), index.labels.end());
    for (auto label : distinct)
      index.class_names.push_back(std::to_string(label));
  }
  if (verbose) {
    std::cout << "Found " << index.paths.size() << " files";
    if (index.labelled) std::cout << " belonging to " << index.class_names.size() << " classes";
    std::cout << ".\n";
  }
  if (shuffle) {
    NumpyRandomState(seed).shuffle(index.paths);
    if (index.labelled) NumpyRandomState(seed).shuffle(index.labels);
  }
  return index;
}

/// Keras's `get_training_or_validation_split`: the last `int(validation_split * n)` files are the
/// validation subset, the others the training subset (so a split that rounds to 0 files gives
/// Keras's empty training subset, which the utilities then refuse).
inline DirectoryIndex split_subset(const DirectoryIndex& index, double validation_split,
                                   const std::string& subset, bool verbose) {
  if (validation_split == 0) return index;
  const auto n = index.paths.size();
  const auto n_val = static_cast<std::size_t>(validation_split * static_cast<double>(n));
  // Python's samples[:-0] is empty and samples[-0:] is everything.
  const std::size_t begin = subset == "training" ? 0 : (n_val == 0 ? 0 : n - n_val);
  const std::size_t end = subset == "training" ? (n_val == 0 ? 0 : n - n_val) : n;
  DirectoryIndex out;
  out.class_names = index.class_names;
  out.labelled = index.labelled;
  out.paths.assign(index.paths.begin() + static_cast<std::ptrdiff_t>(begin),
                   index.paths.begin() + static_cast<std::ptrdiff_t>(end));
  if (index.labelled) {
    out.labels.assign(index.labels.begin() + static_cast<std::ptrdiff_t>(begin),
                      index.labels.begin() + static_cast<std::ptrdiff_t>(end));
  }
  if (verbose) {
    std::cout << "Using " << out.paths.size() << " files for " << subset << ".\n";
  }
  return out;
}

/// Keras's `check_validation_split_arg`.
inline void check_validation_split(const std::string& utility, double validation_split,
                                   const std::string& subset, bool shuffle, bool seeded) {
  if (validation_split != 0 && !(validation_split > 0 && validation_split < 1)) {
    throw ConfigError(utility + ": validation_split must be between 0 and 1 but is " +
                      std::to_string(validation_split));
  }
  if ((validation_split != 0) != !subset.empty()) {
    throw ConfigError(utility +
                      ": if subset is set, validation_split must be set, and inversely "
                      "(validation_split is " +
                      std::to_string(validation_split) + ", subset is '" + subset + "')");
  }
  if (!subset.empty() && subset != "training" && subset != "validation" && subset != "both") {
    throw ConfigError(utility + ": subset must be 'training', 'validation' or 'both' but is '" +
                      subset + "'");
  }
  if (validation_split != 0 && shuffle && !seeded) {
    throw ConfigError(utility +
                      ": a seed is required with validation_split and shuffle, so that "
                      "the training and validation subsets do not overlap");
  }
}

}  // namespace detail
}  // namespace loadstar

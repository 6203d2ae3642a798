/// \file
/// `list_files`: the files a glob pattern matches, as a dataset of paths
/// (`tf.data.Dataset.list_files`).
#pragma once

#include <fnmatch.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/random.hpp"

namespace loadstar {

namespace detail {

/// Whether a path component holds one of the glob's special characters.
inline bool glob_has_wildcard(std::string_view component) {
  return component.find_first_of("*?[\\") != std::string_view::npos;
}

/// The paths that `pattern` matches, sorted, as TensorFlow's `GetMatchingPaths`
/// (tensorflow/tsl/platform/file_system_helper.cc): the pattern is split at `/`; the components
/// before the first one with a wildcard are taken literally, and every later component is matched
/// against the names in the directories reached so far with `fnmatch` (`*`, `?`, `[...]`, `\`
/// escapes; `*` matches names starting with a dot, as TensorFlow's matcher does), so wildcards in
/// directory parts expand too. Directories that match are listed as well as files.
inline std::vector<std::string> glob_paths(const std::string& pattern) {
  namespace fs = std::filesystem;
  std::vector<std::string> components;
  std::size_t start = 0;
  const bool absolute = !pattern.empty() && pattern.front() == '/';
  while (start <= pattern.size()) {
    const std::size_t slash = pattern.find('/', start);
    const std::size_t end = slash == std::string::npos ? pattern.size() : slash;
    if (end > start) components.push_back(pattern.substr(start, end - start));
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  std::vector<std::string> current{absolute ? "/" : ""};
  for (std::size_t c = 0; c < components.size(); ++c) {
    const std::string& component = components[c];
    const bool last = c + 1 == components.size();
    std::vector<std::string> next;
    for (const std::string& base : current) {
      const auto join = [&](const std::string& name) {
        return base.empty() ? name : base.back() == '/' ? base + name : base + "/" + name;
      };
      if (!glob_has_wildcard(component)) {
        std::error_code error;
        const fs::path candidate = join(component);
        if (last ? fs::exists(candidate, error) : fs::is_directory(candidate, error)) {
          next.push_back(candidate.string());
        }
        continue;
      }
      std::error_code error;
      fs::directory_iterator it(base.empty() ? fs::path(".") : fs::path(base), error);
      if (error) continue;  // Not a directory, or unreadable: matches nothing, as in TensorFlow.
      for (const auto& entry : it) {
        const std::string name = entry.path().filename().string();
        if (::fnmatch(component.c_str(), name.c_str(), 0) != 0) continue;
        std::error_code kind_error;
        if (!last && !entry.is_directory(kind_error)) continue;
        next.push_back(join(name));
      }
    }
    current = std::move(next);
    if (current.empty()) break;
  }
  if (components.empty()) current.clear();
  std::sort(current.begin(), current.end());
  current.erase(std::unique(current.begin(), current.end()), current.end());
  return current;
}

}  // namespace detail

/// The paths a glob pattern matched when the dataset was made, one element each: sorted, or in a
/// new order every epoch when shuffled (tf.data's `list_files` shuffles with a buffer holding all
/// the names and reshuffles each iteration). The order of epoch `e` is `epoch_permutation(n,
/// seed, e)`: a pure function of the seed and the epoch, so the state is `(epoch, index)` and a
/// restore costs O(1).
/// \code
/// auto records = list_files("data/train-*.tfrecord", true, 42)
///                    .shard(size, rank)
///                    .interleave([](std::string f) { return TFRecordDataset({f}); }, 4);
/// \endcode
class ListFilesDataset : public DatasetBase<ListFilesDataset> {
 public:
  using element_type = std::string;

  /// Throws `IoError` naming the pattern when it matches nothing (tf.data's "No files matched
  /// pattern").
  ListFilesDataset(std::string pattern, bool shuffle, std::uint64_t seed)
      : ListFilesDataset(std::vector<std::string>{std::move(pattern)}, shuffle, seed) {}

  /// The files matching any of `patterns` (tf.data's list of patterns): every pattern's matches,
  /// sorted together, a file matched twice listed twice as TensorFlow's `MatchingFiles` does.
  /// Throws `ConfigError` for no pattern, `IoError` when none matches anything.
  ListFilesDataset(const std::vector<std::string>& patterns, bool shuffle, std::uint64_t seed)
      : shuffle_(shuffle), seed_(seed) {
    if (patterns.empty()) throw ConfigError("list_files: expected a pattern but the list is empty");
    for (const auto& pattern : patterns) {
      pattern_ += (pattern_.empty() ? "'" : ", '") + pattern + "'";
      auto matched = detail::glob_paths(pattern);
      files_.insert(files_.end(), matched.begin(), matched.end());
    }
    std::sort(files_.begin(), files_.end());
    if (files_.empty()) throw IoError("list_files: no files matched pattern " + pattern_);
    order_ = epoch_permutation(files_.size(), seed_, epoch_, shuffle_);
  }

  std::optional<element_type> next() {
    if (index_ >= files_.size()) return std::nullopt;
    return files_[order_[index_++]];
  }
  void reset() {
    ++epoch_;
    index_ = 0;
    order_ = epoch_permutation(files_.size(), seed_, epoch_, shuffle_);
  }
  nlohmann::json state() const {
    return {{"op", "list_files"}, {"epoch", epoch_}, {"index", index_}, {"files", files_.size()}};
  }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "list_files");
    const std::size_t files = s["files"];
    const std::size_t index = s["index"];
    if (files != files_.size()) {
      throw CheckpointError("list_files: state was taken with " + std::to_string(files) +
                            " files matching " + pattern_ + " but " +
                            std::to_string(files_.size()) + " match now");
    }
    if (index > files) {
      throw CheckpointError("list_files: state is at file " + std::to_string(index) +
                            " but the pattern matched " + std::to_string(files));
    }
    epoch_ = s["epoch"];
    index_ = index;
    order_ = epoch_permutation(files_.size(), seed_, epoch_, shuffle_);
  }

  /// The matched paths, sorted.
  const std::vector<std::string>& files() const noexcept { return files_; }

 private:
  std::string pattern_;
  std::vector<std::string> files_;
  bool shuffle_;
  std::uint64_t seed_;
  std::uint64_t epoch_ = 0;
  std::size_t index_ = 0;
  std::vector<std::size_t> order_;
};

/// The files matching `pattern` (see `ListFilesDataset`); tf.data shuffles unless told not to.
inline ListFilesDataset list_files(std::string pattern, bool shuffle = true,
                                   std::uint64_t seed = 0) {
  return ListFilesDataset(std::move(pattern), shuffle, seed);
}
/// The files matching any of `patterns` (see `ListFilesDataset`).
inline ListFilesDataset list_files(const std::vector<std::string>& patterns, bool shuffle = true,
                                   std::uint64_t seed = 0) {
  return ListFilesDataset(patterns, shuffle, seed);
}

}  // namespace loadstar

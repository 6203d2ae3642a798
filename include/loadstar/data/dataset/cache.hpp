/// \file
/// `cache()` and `cache(path)`: the first complete epoch kept in memory or in a file.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/cache_file.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/data/serialize.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

namespace detail {

/// Cache storage in memory: elements are kept as they are (tensors shared, not copied).
template <class E>
class MemoryStore {
 public:
  bool complete() const noexcept { return complete_; }
  bool open_finished() const noexcept { return complete_; }
  bool begin_fill(bool /*wait*/) {
    elements_.clear();
    return true;
  }
  void append(const E& element) { elements_.push_back(element); }
  void finish() { complete_ = true; }
  void abandon() noexcept {
    if (!complete_) elements_.clear();
  }
  std::size_t size() const noexcept { return elements_.size(); }
  E get(std::size_t index) { return elements_[index]; }

 private:
  std::vector<E> elements_;
  bool complete_ = false;
};

/// Cache storage in a file of the record format of `cache_file.hpp`, shared between runs and
/// processes: one process at a time writes it (under a non-blocking `flock`; the others pass
/// the upstream through), and a finished file is read by every later epoch and run.
template <class E>
class FileStore {
  static_assert(Serializable<E>,
                "cache(path): elements must be serialisable (see loadstar/data/serialize.hpp)");

 public:
  explicit FileStore(std::filesystem::path path) : path_(std::move(path)) {}

  bool complete() const noexcept { return reader_.has_value(); }
  /// Opens the finished file if there is one; throws `FormatError` for a corrupt one.
  bool open_finished() {
    if (reader_) return true;
    std::error_code error;
    if (!std::filesystem::exists(path_, error)) return false;
    reader_.emplace(path_);
    return true;
  }
  /// Takes the builder's lock and starts a temporary file; false when another process holds the
  /// lock (and `wait` is false) or finished the file meanwhile.
  bool begin_fill(bool wait) {
    abandon();
    lock_ = std::make_unique<CacheLock>(path_, wait);
    if (!lock_->locked()) {
      lock_.reset();
      return false;
    }
    // Another process may have finished the cache while we waited for the lock.
    if (open_finished()) {
      lock_.reset();
      return false;
    }
    writer_ = std::make_unique<CacheWriter>(path_);
    return true;
  }
  void append(const E& element) { writer_->append(element); }
  void finish() {
    writer_->finish();
    writer_.reset();
    lock_.reset();
    reader_.emplace(path_);
  }
  void abandon() noexcept {
    writer_.reset();
    lock_.reset();
  }
  std::size_t size() const noexcept { return reader_->size(); }
  E get(std::size_t index) { return reader_->template read<E>(index, buffer_); }

 private:
  std::filesystem::path path_;
  std::unique_ptr<CacheLock> lock_;
  std::unique_ptr<CacheWriter> writer_;  // Not movable: it owns a temporary file.
  std::optional<CacheReader> reader_;
  std::vector<std::byte> buffer_;
};

}  // namespace detail

/// The elements of `D`, stored while the first epoch passes through and served from the store
/// in every later epoch (the upstream is then never touched again), as `tf.data`'s `cache()`.
/// An epoch that is not read to its end does not finish the cache; the next epoch starts again.
///
/// With `cache(path)`, the store is a file: written to `<path>.tmp.<pid>` and renamed to `path`
/// when complete, so a partial file is never taken for a finished one, and later runs read it
/// without building the upstream. While one process writes it (holding an advisory lock that
/// dies with the process), others pass the upstream through without writing. A file that cannot
/// be written throws `IoError`; a corrupt file throws `FormatError`.
///
/// State: the mode (filling or serving), the position and the upstream's state at the start of
/// the filling epoch. Serving from a finished file restores in O(1). A memory cache lives in one
/// process, so restoring into a fresh one replays the upstream from the start of the filling
/// epoch to refill it (up to one epoch of upstream elements), as does restoring mid-fill.
/// \code
/// auto ds = from_tensor_slices(paths).map(decode).cache("/tmp/decoded.cache").shuffle(1000, 1);
/// \endcode
template <Dataset D, class Store>
class CacheDataset : public DatasetBase<CacheDataset<D, Store>> {
 public:
  using element_type = element_t<D>;

  CacheDataset(D upstream, Store store)
      : upstream_(std::move(upstream)), store_(std::move(store)) {}

  std::optional<element_type> next() {
    if (mode_ == Mode::unprepared) prepare();
    if (mode_ == Mode::serve) {
      if (index_ >= store_.size()) return std::nullopt;
      return store_.get(index_++);
    }
    auto element = upstream_.next();
    if (!element) {
      if (filling_) {
        filling_ = false;
        store_.finish();
      }
      return std::nullopt;
    }
    if (filling_) store_.append(*element);
    ++index_;
    return element;
  }

  void reset() {
    if (store_.complete() || (mode_ != Mode::unprepared && store_.open_finished())) {
      mode_ = Mode::serve;
      index_ = 0;
      return;
    }
    store_.abandon();
    filling_ = false;
    upstream_.reset();
    mode_ = Mode::unprepared;
  }

  nlohmann::json state() const {
    switch (mode_) {
      case Mode::unprepared:
        return {{"op", "cache"}, {"mode", "unprepared"}, {"upstream", upstream_.state()}};
      case Mode::fill:
        return {{"op", "cache"},       {"mode", "fill"},
                {"index", index_},     {"fill_start", fill_start_},
                {"filling", filling_}, {"upstream", upstream_.state()}};
      case Mode::serve:
        break;
    }
    return {{"op", "cache"}, {"mode", "serve"}, {"index", index_}, {"fill_start", fill_start_}};
  }

  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "cache");
    const std::string mode = s["mode"];
    store_.abandon();
    filling_ = false;
    if (mode == "unprepared") {
      upstream_.restore(s["upstream"]);
      mode_ = Mode::unprepared;
      return;
    }
    detail::require_same_shards(s["fill_start"], upstream_.state(), "cache");
    const std::size_t index = s["index"];
    fill_start_ = s["fill_start"];
    if (store_.complete() || store_.open_finished()) {
      // The finished store holds the same elements the filling epoch streams.
      mode_ = Mode::serve;
      index_ = index;
      return;
    }
    upstream_.restore(fill_start_);
    mode_ = Mode::fill;
    index_ = 0;
    if (mode == "fill") {
      filling_ = store_.begin_fill(false);
      if (!filling_) {
        upstream_.restore(s["upstream"]);
        index_ = index;
        if (store_.complete()) mode_ = Mode::serve;
        return;
      }
      replay(index);
      return;
    }
    // Serving, but the store is gone (a memory cache in a new process): refill it.
    filling_ = store_.begin_fill(true);
    if (filling_) {
      while (next()) {
      }
    }
    mode_ = Mode::serve;
    index_ = index;
  }

 private:
  enum class Mode { unprepared, fill, serve };

  void prepare() {
    index_ = 0;
    if (store_.open_finished()) {
      mode_ = Mode::serve;
      return;
    }
    fill_start_ = upstream_.state();
    filling_ = store_.begin_fill(false);
    mode_ = !filling_ && store_.complete() ? Mode::serve : Mode::fill;
  }

  void replay(std::size_t count) {
    while (index_ < count) {
      if (!next()) {
        throw CheckpointError("cache: state is at element " + std::to_string(count) +
                              " but the upstream ended after " + std::to_string(index_));
      }
    }
  }

  D upstream_;
  Store store_;
  Mode mode_ = Mode::unprepared;
  bool filling_ = false;
  std::size_t index_ = 0;
  nlohmann::json fill_start_;
};

}  // namespace loadstar

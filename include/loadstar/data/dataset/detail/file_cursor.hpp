/// \file
/// `FileCursor`: where a dataset of the records of a list of files stands (`TextLineDataset`,
/// `CsvDataset`): the file being read and its reader, and how that position is saved and restored.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "loadstar/data/detail/input_stream.hpp"
#include "loadstar/error.hpp"

namespace loadstar::detail {

/// The index of the file being read and its reader, opened when first read. The position is the
/// file's index and the (uncompressed) byte offset of the next unread byte: a plain file restores
/// with a seek, a compressed one by inflating up to the offset. A copy reads on from the same
/// position with a reader of its own.
class FileCursor {
 public:
  /// `dataset` names the owner in messages (`"CsvDataset"`), `kind` the files (`"csv file"`).
  FileCursor(std::vector<std::string> filenames, Compression compression, std::size_t buffer_size,
             std::string dataset, std::string kind)
      : filenames_(std::move(filenames)),
        compression_(compression),
        buffer_size_(buffer_size),
        dataset_(std::move(dataset)),
        kind_(std::move(kind)) {}

  FileCursor(const FileCursor& other)
      : filenames_(other.filenames_),
        compression_(other.compression_),
        buffer_size_(other.buffer_size_),
        dataset_(other.dataset_),
        kind_(other.kind_),
        file_(other.file_) {
    if (other.reader_) open(other.reader_->offset());
  }
  FileCursor(FileCursor&&) noexcept = default;
  FileCursor& operator=(FileCursor&&) noexcept = default;

  /// Whether every file has been read.
  bool done() const noexcept { return file_ >= filenames_.size(); }

  /// Opens the current file at its start when no reader is open; returns whether it did.
  bool open_if_closed() {
    if (reader_) return false;
    open(0);
    return true;
  }

  /// The current file's reader (open).
  CharReader& reader() noexcept { return *reader_; }
  const CharReader& reader() const noexcept { return *reader_; }

  /// Closes the current file and moves to the next.
  void next_file() {
    reader_.reset();
    ++file_;
  }

  /// Back to the start of the first file.
  void reset() {
    reader_.reset();
    file_ = 0;
  }

  /// The position, as `"files"`, `"file"` and `"offset"` (null when no file is open) of `state`.
  void save(nlohmann::json& state) const {
    state["files"] = filenames_.size();
    state["file"] = file_;
    state["offset"] = reader_ ? nlohmann::json(reader_->offset()) : nlohmann::json(nullptr);
  }

  /// Moves to the position `save` wrote into `state`; returns whether a file is open there.
  /// Throws `CheckpointError` when the state was taken with another number of files or lies past
  /// the end of its file.
  bool restore(const nlohmann::json& state) {
    const std::size_t files = state["files"];
    const std::size_t file = state["file"];
    if (files != filenames_.size() || file > files) {
      throw CheckpointError(dataset_ + ": state was taken with " + std::to_string(files) +
                            " files, at file " + std::to_string(file) + ", but the dataset has " +
                            std::to_string(filenames_.size()));
    }
    reset();
    file_ = file;
    if (state["offset"].is_null()) return false;
    open(state["offset"].get<std::uint64_t>());
    return true;
  }

 private:
  void open(std::uint64_t offset) {
    const std::string& name = filenames_[file_];
    reader_ =
        std::make_unique<CharReader>(name, compression_, buffer_size_, kind_ + " '" + name + "'");
    if (offset > 0 && !reader_->skip(offset)) {
      throw CheckpointError(dataset_ + ": state is at byte offset " + std::to_string(offset) +
                            " of '" + name + "' but the data end before it");
    }
  }

  std::vector<std::string> filenames_;
  Compression compression_;
  std::size_t buffer_size_;
  std::string dataset_;
  std::string kind_;
  std::size_t file_ = 0;
  std::unique_ptr<CharReader> reader_;
};

}  // namespace loadstar::detail

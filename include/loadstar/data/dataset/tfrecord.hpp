/// \file
/// `TFRecordDataset`: the records of TFRecord files, as `tf.data.TFRecordDataset`.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/mapped_file.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/data/detail/input_stream.hpp"
#include "loadstar/detail/crc32c.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

namespace detail {

inline std::string hex32(std::uint32_t value) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out = "0x00000000";
  for (int i = 0; i < 8; ++i)
    out[9 - i] = digits[(value >> (4 * i)) & 0xFU];
  return out;
}

inline std::uint64_t load_le(const char* bytes, int count) {
  std::uint64_t value = 0;
  for (int i = count - 1; i >= 0; --i)
    value = (value << 8) | static_cast<unsigned char>(bytes[i]);
  return value;
}

/// The records of one TFRecord file, in order. A record is framed as TensorFlow's
/// `RecordWriter` writes it (tensorflow/core/lib/io/record_writer.cc): the data's length as a
/// little-endian uint64, the masked CRC-32C of those 8 bytes, the data, the masked CRC-32C of the
/// data; both CRCs are checked.
///
/// An uncompressed file is mapped (`MappedFile`) where it can be: each record is copied from the
/// page cache into the string returned, a piece at a time, and each piece's CRC taken while it is
/// still in the CPU's cache, so that the bytes cross memory once. A compressed file, or one that
/// cannot be mapped, is read through `InputStream`. Both give the same records, offsets and
/// errors; a mapped file is read as it was when opened (its size then), and one that shrinks
/// while being read throws `FormatError` (see `MappedFile` for the window in which it cannot).
class RecordReader {
 public:
  RecordReader(const std::string& path, Compression compression, std::size_t buffer_size)
      : where_("tfrecord file '" + path + "'") {
    if (compression == Compression::none) map_ = MappedFile::open(path);
    if (!map_) stream_ = std::make_unique<InputStream>(path, compression, buffer_size, where_);
  }

  /// Moves to the record starting at (uncompressed) byte `offset`: a seek for a plain file,
  /// reading up to it for a compressed one.
  void seek(std::uint64_t offset) {
    if (map_) {
      if (offset > map_->size()) throw past_end(offset, map_->size());
      offset_ = offset;
      return;
    }
    if (stream_->skip(offset) != offset) throw past_end(offset, stream_->offset());
  }

  /// The next record, or nothing at the end of the file. Throws `FormatError` naming the file and
  /// the byte offset of the record for a truncated record or a CRC mismatch.
  std::optional<std::string> read() { return map_ ? read_mapped() : read_stream(); }

  /// The (uncompressed) byte offset of the next record.
  std::uint64_t offset() const noexcept { return map_ ? offset_ : stream_->offset(); }

 private:
  static constexpr std::uint64_t header_bytes = 12;
  static constexpr std::uint64_t footer_bytes = 4;

  std::optional<std::string> read_mapped() {
    const std::uint64_t at = offset_;
    const std::uint64_t left = map_->size() - at;
    if (left == 0) return std::nullopt;
    if (left < header_bytes) throw short_header(at, left);
    require(at, at + header_bytes);
    const char* header = map_->data() + at;
    check_length(at, header);
    const std::uint64_t length = load_le(header, 8);
    if (length > left - header_bytes) throw short_data(at, length, left - header_bytes);
    if (left - header_bytes - length < footer_bytes) {
      throw short_footer(at, length, left - header_bytes - length);
    }
    const std::uint64_t end = at + header_bytes + length + footer_bytes;
    require(at, end);
    // Copied and checked in one pass over the bytes (`crc32c_update_copy`); the string's
    // zero-filling by `resize` writes to memory the allocator just freed, in the CPU's cache.
    const char* in = header + header_bytes;
    const auto size = static_cast<std::size_t>(length);
    std::string data(size, '\0');
    const std::uint32_t crc =
        crc32c_update_copy(0xFFFFFFFFU, std::string_view(in, size), data.data());
    check_data(at, in + size, mask_crc32c(crc ^ 0xFFFFFFFFU), length);
    offset_ = end;
    return data;
  }

  std::optional<std::string> read_stream() {
    const std::uint64_t at = stream_->offset();
    char header[header_bytes];
    const std::size_t got = stream_->read(header, sizeof header);
    if (got == 0) return std::nullopt;
    if (got < sizeof header) throw short_header(at, got);
    check_length(at, header);
    const std::uint64_t length = load_le(header, 8);
    const auto size = stream_->data_bytes();
    if (size && length > *size - stream_->offset()) {
      throw short_data(at, length, *size - stream_->offset());
    }
    // A plain file holds the length (checked above): one allocation. A compressed stream's data
    // are appended as they arrive, so that a length that passes its CRC but exceeds the stream
    // allocates no more than the stream holds.
    std::string data;
    if (size) data.reserve(static_cast<std::size_t>(length));
    constexpr std::uint64_t chunk = 1 << 20;
    while (data.size() < length) {
      const std::size_t old = data.size();
      const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, length - old));
      const std::size_t read = stream_->read_append(data, want);
      if (read < want) {
        throw FormatError(where_ + ": truncated record at byte offset " + std::to_string(at) +
                          ": the header gives " + std::to_string(length) +
                          " bytes of data but the data end after " + std::to_string(old + read));
      }
    }
    char footer[footer_bytes];
    const std::size_t footer_got = stream_->read(footer, sizeof footer);
    if (footer_got < sizeof footer) throw short_footer(at, length, footer_got);
    check_data(at, footer, masked_crc32c(data), length);
    return data;
  }

  /// Throws unless the mapped file still holds its first `end` bytes.
  void require(std::uint64_t at, std::uint64_t end) {
    if (!map_->holds(end)) {
      throw FormatError(where_ + ": truncated record at byte offset " + std::to_string(at) +
                        ": the file had " + std::to_string(map_->size()) +
                        " bytes when opened but has " + std::to_string(map_->seen_size()) +
                        " now, short of the record's end at " + std::to_string(end));
    }
  }

  void check_length(std::uint64_t at, const char* header) const {
    const auto length_crc = static_cast<std::uint32_t>(load_le(header + 8, 4));
    const std::uint32_t expected = masked_crc32c(std::string_view(header, 8));
    if (length_crc != expected) {
      throw FormatError(where_ + ": corrupt record at byte offset " + std::to_string(at) +
                        ": the length's masked CRC-32C is " + hex32(length_crc) +
                        " but the length bytes give " + hex32(expected));
    }
  }
  void check_data(std::uint64_t at, const char* footer, std::uint32_t expected,
                  std::uint64_t length) const {
    const auto data_crc = static_cast<std::uint32_t>(load_le(footer, 4));
    if (data_crc != expected) {
      throw FormatError(where_ + ": corrupt record at byte offset " + std::to_string(at) +
                        ": the data's masked CRC-32C is " + hex32(data_crc) + " but the " +
                        std::to_string(length) + " data bytes give " + hex32(expected));
    }
  }

  FormatError short_header(std::uint64_t at, std::uint64_t got) const {
    return FormatError(where_ + ": truncated record at byte offset " + std::to_string(at) +
                       ": expected a 12-byte header but the data end after " + std::to_string(got) +
                       " bytes");
  }
  FormatError short_data(std::uint64_t at, std::uint64_t length, std::uint64_t left) const {
    return FormatError(where_ + ": truncated record at byte offset " + std::to_string(at) +
                       ": the header gives " + std::to_string(length) +
                       " bytes of data but the file has " + std::to_string(left) + " left");
  }
  FormatError short_footer(std::uint64_t at, std::uint64_t length, std::uint64_t got) const {
    return FormatError(where_ + ": truncated record at byte offset " + std::to_string(at) +
                       ": expected the data's 4-byte CRC after " + std::to_string(length) +
                       " bytes of data but found " + std::to_string(got) + " bytes");
  }
  CheckpointError past_end(std::uint64_t offset, std::uint64_t end) const {
    return CheckpointError(where_ + ": state is at byte offset " + std::to_string(offset) +
                           " but the data end at " + std::to_string(end));
  }

  std::string where_;
  std::optional<MappedFile> map_;
  std::uint64_t offset_ = 0;             // Mapped: the offset of the next record.
  std::unique_ptr<InputStream> stream_;  // Otherwise.
};

}  // namespace detail

/// The records of TFRecord files, each a `std::string` of the record's bytes (a serialized
/// `tf.train.Example`, say: see `parse_single_example`), as `tf.data.TFRecordDataset`.
///
/// - `compression_type`: `""`, `"GZIP"` or `"ZLIB"`, for every file;
/// - `buffer_size`: the read buffer in bytes (tf.data's default, 256 KiB; 0 reads straight from
///   the file) of a compressed file; an uncompressed one is mapped into memory and needs none
///   (one that cannot be mapped is read through the buffer);
/// - `num_parallel_reads`: how many files are read at once, their records interleaved one at a
///   time in a fixed order, as tf.data's `filenames.interleave(TFRecordDataset,
///   cycle_length=num_parallel_reads, block_length=1)` with deterministic order: a slot whose
///   file ended takes the next file when the cycle comes back to it. (The reads happen on the
///   consuming thread; `prefetch` or `map` with `num_parallel_calls` moves work off it.)
///
/// Every record's length and data CRC-32C are checked: a corrupt or truncated file throws
/// `FormatError` naming the file and the record's byte offset; an uncompressed file is read as it
/// was when opened, and one that shrinks while being read throws too. The state is, for every open
/// file, its index and the (uncompressed) byte offset of its next record, plus the cycle position:
/// a plain file restores with a seek, a compressed one by inflating up to the offset. \code auto
/// examples = TFRecordDataset({"train-0.tfrecord", "train-1.tfrecord"}, "GZIP")
///                     .shard(size, rank)
///                     .map([&](std::string r) { return parse_single_example(r, features); });
/// \endcode
class TFRecordDataset : public DatasetBase<TFRecordDataset> {
 public:
  using element_type = std::string;

  /// Throws `ConfigError` for an unknown `compression_type` or a `num_parallel_reads` of 0.
  explicit TFRecordDataset(std::vector<std::string> filenames, std::string compression_type = "",
                           std::size_t buffer_size = 256 * 1024, std::size_t num_parallel_reads = 1)
      : filenames_(std::move(filenames)),
        compression_(detail::parse_compression(compression_type, "TFRecordDataset")),
        buffer_size_(buffer_size) {
    if (num_parallel_reads == 0) {
      throw ConfigError("TFRecordDataset: num_parallel_reads must be positive but is 0");
    }
    slots_.resize(num_parallel_reads);
  }

  TFRecordDataset(const TFRecordDataset& other)
      : filenames_(other.filenames_),
        compression_(other.compression_),
        buffer_size_(other.buffer_size_),
        slots_(other.slots_.size()) {
    restore(other.state());
  }
  TFRecordDataset(TFRecordDataset&&) noexcept = default;
  TFRecordDataset& operator=(TFRecordDataset&&) noexcept = default;

  std::optional<element_type> next() {
    while (next_file_ < filenames_.size() || open_ > 0) {
      Slot& slot = slots_[current_];
      if (slot.reader) {
        auto record = slot.reader->read();
        if (record) {
          advance();
          return record;
        }
        slot.reader.reset();
        --open_;
        advance();
      } else if (next_file_ < filenames_.size()) {
        open(slot, next_file_++, 0);
      } else {
        advance();
      }
    }
    return std::nullopt;
  }

  void reset() {
    for (auto& slot : slots_)
      slot = Slot{};
    next_file_ = current_ = open_ = 0;
  }

  nlohmann::json state() const {
    nlohmann::json slots = nlohmann::json::array();
    for (const auto& slot : slots_) {
      if (slot.reader) {
        slots.push_back({{"file", slot.file}, {"offset", slot.reader->offset()}});
      } else {
        slots.push_back(nullptr);
      }
    }
    return {{"op", "tfrecord"},
            {"files", filenames_.size()},
            {"next_file", next_file_},
            {"current", current_},
            {"slots", std::move(slots)}};
  }

  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "tfrecord");
    const std::size_t files = s["files"];
    if (files != filenames_.size()) {
      throw CheckpointError("TFRecordDataset: state was taken with " + std::to_string(files) +
                            " files but the dataset has " + std::to_string(filenames_.size()));
    }
    const auto& slots = s["slots"];
    if (!slots.is_array() || slots.size() != slots_.size()) {
      throw CheckpointError("TFRecordDataset: state has " + std::to_string(slots.size()) +
                            " parallel reads but the dataset has num_parallel_reads " +
                            std::to_string(slots_.size()));
    }
    reset();
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (slots[i].is_null()) continue;
      const std::size_t file = slots[i]["file"];
      if (file >= filenames_.size()) {
        throw CheckpointError("TFRecordDataset: state reads file " + std::to_string(file) +
                              " but the dataset has " + std::to_string(filenames_.size()));
      }
      open(slots_[i], file, slots[i]["offset"].get<std::uint64_t>());
    }
    next_file_ = s["next_file"];
    current_ = s["current"];
    if (current_ >= slots_.size() || next_file_ > filenames_.size()) {
      throw CheckpointError("TFRecordDataset: state " + state.dump() + " is out of range");
    }
  }

  const std::vector<std::string>& filenames() const noexcept { return filenames_; }

 private:
  struct Slot {
    std::size_t file = 0;
    std::unique_ptr<detail::RecordReader> reader;
  };

  void open(Slot& slot, std::size_t file, std::uint64_t offset) {
    slot.file = file;
    slot.reader =
        std::make_unique<detail::RecordReader>(filenames_[file], compression_, buffer_size_);
    if (offset > 0) slot.reader->seek(offset);
    ++open_;
  }
  void advance() noexcept { current_ = (current_ + 1) % slots_.size(); }

  std::vector<std::string> filenames_;
  detail::Compression compression_;
  std::size_t buffer_size_;
  std::vector<Slot> slots_;
  std::size_t next_file_ = 0;
  std::size_t current_ = 0;
  std::size_t open_ = 0;
};

}  // namespace loadstar

/// \file
/// `NpzFile` and `read_npz`: NumPy `.npz` archives (`numpy.savez`, `numpy.savez_compressed`), a
/// zip of `.npy` members read through libzip and the `.npy` reader.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

// libzip's header annotates pointers with Clang's nullability extension, which -Wpedantic reports.
#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wnullability-extension"
#pragma clang diagnostic ignored "-Wnullability-completeness"
#endif
#include <zip.h>
#if defined(__clang__)
#pragma clang diagnostic pop
#endif

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "loadstar/data/npy.hpp"
#include "loadstar/error.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar {

/// An open `.npz` archive: its arrays by name, as `numpy.load(path)` gives them (the member
/// `x.npy` is the array `"x"`; `savez`'s positional arrays are `"arr_0"`, `"arr_1"`, ...).
/// Members stored or deflated (`savez_compressed`) are read; each member's CRC-32 is checked.
/// \code
/// NpzFile npz("mnist.npz");
/// auto x = npz.read<float>("x_train");
/// auto y = npz.read<std::int64_t>("y_train");
/// \endcode
class NpzFile {
 public:
  /// Throws `IoError` when the file cannot be opened, `FormatError` when it is not a zip archive.
  explicit NpzFile(const std::filesystem::path& path)
      : where_("npz archive '" + path.string() + "'") {
    int error = 0;
    zip_ = zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &error);
    if (zip_ == nullptr) {
      zip_error_t details;
      zip_error_init_with_code(&details, error);
      const std::string reason = zip_error_strerror(&details);
      zip_error_fini(&details);
      if (error == ZIP_ER_OPEN || error == ZIP_ER_READ || error == ZIP_ER_NOENT) {
        throw IoError(where_ + ": cannot open (" + reason + ")");
      }
      throw FormatError(where_ + ": expected a zip archive but found none (" + reason + ")");
    }
    const zip_int64_t count = zip_get_num_entries(zip_, 0);
    for (zip_int64_t i = 0; i < count; ++i) {
      const char* name = zip_get_name(zip_, static_cast<zip_uint64_t>(i), 0);
      if (name == nullptr) continue;
      std::string key = name;
      // numpy.lib.npyio.NpzFile: a member ending in .npy is the array named without it.
      if (key.size() > 4 && key.compare(key.size() - 4, 4, ".npy") == 0) key.resize(key.size() - 4);
      members_.emplace(std::move(key), name);
    }
  }
  NpzFile(const NpzFile&) = delete;
  NpzFile& operator=(const NpzFile&) = delete;
  ~NpzFile() {
    if (zip_ != nullptr) zip_discard(zip_);
  }

  /// The array names, sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [key, member] : members_)
      out.push_back(key);
    return out;
  }
  bool contains(const std::string& name) const { return members_.count(name) != 0; }

  /// The header of array `name` (its dtype and shape), checked as `read_npy_header` checks.
  NpyHeader header(const std::string& name) const {
    Member m = extract(name);
    return detail::read_npy_header(m.fd, m.size, m.where);
  }

  /// Array `name`, converted to `T` as `read_npy` converts. Throws `FormatError` naming the
  /// archive and the member when it is missing, fails its CRC-32 or is not a `.npy` file
  /// `read_npy` accepts, `ShapeError` as `read_npy`.
  template <TensorElement T>
  Tensor<T> read(const std::string& name) const {
    Member m = extract(name);
    return detail::read_npy_fd<T>(m.fd, m.size, m.where);
  }

 private:
  /// A member's bytes in an anonymous file, so that the `.npy` reader reads them as a file.
  struct Member {
    int fd = -1;
    std::uint64_t size = 0;
    std::string where;
    Member() = default;
    Member(const Member&) = delete;
    Member& operator=(const Member&) = delete;
    Member(Member&& other) noexcept
        : fd(std::exchange(other.fd, -1)), size(other.size), where(std::move(other.where)) {}
    ~Member() {
      if (fd >= 0) ::close(fd);
    }
  };

  Member extract(const std::string& name) const {
    const auto it = members_.find(name);
    if (it == members_.end()) {
      throw FormatError(where_ + ": expected an array '" + name + "' but the archive has " +
                        (members_.empty() ? std::string("none") : "'" + joined_names() + "'"));
    }
    Member m;
    m.where = where_ + ": member '" + it->second + "'";
    const zip_int64_t index = zip_name_locate(zip_, it->second.c_str(), 0);
    zip_file_t* file =
        index < 0 ? nullptr : zip_fopen_index(zip_, static_cast<zip_uint64_t>(index), 0);
    if (file == nullptr)
      throw FormatError("cannot open " + m.where + " (" + zip_strerror(zip_) + ")");
    m.fd = ::memfd_create("loadstar-npz-member", MFD_CLOEXEC);
    if (m.fd < 0) {
      zip_fclose(file);
      throw IoError(m.where + ": cannot create a memory file (" + std::strerror(errno) + ")");
    }
    // Copied in chunks as they decompress: memory grows with the data, never to a declared size.
    std::vector<char> chunk(1 << 20);
    zip_int64_t got = 0;
    while ((got = zip_fread(file, chunk.data(), chunk.size())) > 0) {
      std::size_t done = 0;
      while (done < static_cast<std::size_t>(got)) {
        const ssize_t put =
            ::write(m.fd, chunk.data() + done, static_cast<std::size_t>(got) - done);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0) {
          zip_fclose(file);
          throw IoError(m.where + ": cannot write a memory file (" + std::strerror(errno) + ")");
        }
        done += static_cast<std::size_t>(put);
      }
      m.size += static_cast<std::uint64_t>(got);
    }
    const std::string reason = zip_file_strerror(file);
    zip_fclose(file);
    if (got < 0) throw FormatError(m.where + " cannot be read (" + reason + ")");
    return m;
  }

  std::string joined_names() const {
    std::string out;
    for (const auto& [key, member] : members_)
      out += (out.empty() ? "" : "', '") + key;
    return out;
  }

  std::string where_;
  zip_t* zip_ = nullptr;
  std::map<std::string, std::string> members_;  // Array name -> member name.
};

/// Every array of the `.npz` archive `path`, converted to `T` (`numpy.load(path)` as a dict).
template <TensorElement T>
std::map<std::string, Tensor<T>> read_npz(const std::filesystem::path& path) {
  NpzFile npz(path);
  std::map<std::string, Tensor<T>> out;
  for (const auto& name : npz.names())
    out.emplace(name, npz.read<T>(name));
  return out;
}

}  // namespace loadstar

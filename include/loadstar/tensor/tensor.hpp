/// \file
/// `Tensor<T>`: a dynamic-shape, contiguous, row-major, 64-byte aligned array with shared storage.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "loadstar/config.hpp"
#include "loadstar/error.hpp"
#include "loadstar/tensor/detail/storage_cache.hpp"
#include "loadstar/tensor/dtype.hpp"
#include "loadstar/tensor/shape.hpp"

namespace loadstar {

/// Where a tensor's memory lives: the host (`Device::host()`, the default) or the memory of a
/// backend's device (`Device{"cuda", 0}`), which only that backend's kernels and copies may read.
/// \code
/// Device gpu{"cuda", 1};
/// gpu.str();      // "cuda:1"
/// gpu.is_host();  // false
/// \endcode
struct Device {
  /// The kind of memory (a string with static storage duration); `"cpu"` is host memory.
  const char* kind = "cpu";
  /// Which device of that kind.
  int index = 0;

  /// Host memory, readable by any code.
  static constexpr Device host() noexcept { return {}; }
  constexpr bool is_host() const noexcept {
    return kind[0] == 'c' && std::string_view(kind) == "cpu";
  }
  /// `"cpu"` or `"<kind>:<index>"`.
  std::string str() const {
    return is_host() ? std::string(kind) : kind + (":" + std::to_string(index));
  }
  friend bool operator==(const Device& a, const Device& b) noexcept {
    return a.index == b.index && std::string_view(a.kind) == std::string_view(b.kind);
  }
};

/// A contiguous row-major array of `T` with a run-time shape.
///
/// A `Tensor` is a handle, as in PyTorch: copying it shares the storage, and `slice_rows` returns
/// a view of the same storage, so cutting a batch out of a data set costs no copy. `clone()`
/// makes an independent copy. Storage is aligned to `LOADSTAR_TENSOR_ALIGNMENT` (64) bytes.
/// The math belongs to Eigen: `<loadstar/tensor/eigen.hpp>` maps a tensor as a matrix or vector.
/// A tensor knows where its memory lives (`device()`): the constructors make host tensors, and a
/// backend's `allocate` makes tensors in its device memory. The element accessors (`begin`,
/// `span`, `operator()`, `clone`, `cast`, `gather_rows`, `==`) need host memory and throw
/// `DeviceError` otherwise; `data()` is the raw pointer that kernels of the owning backend use.
/// \code
/// Tensor<float> x({60000, 28, 28});          // zero-filled
/// Tensor<float> batch = x.slice_rows(0, 32); // shape (32, 28, 28), shares x's storage
/// Tensor<float> picked = x.gather_rows(std::vector<std::size_t>{5, 1, 7}); // a copy
/// \endcode
template <TensorElement T>
class Tensor {
 public:
  using value_type = T;

  /// An empty rank-1 tensor of shape `(0,)`.
  Tensor() : shape_{0} {}

  /// A zero-filled tensor of the given shape.
  explicit Tensor(const Shape& shape) : Tensor(shape, T{}) {}

  /// A tensor of the given shape with every element set to `value`.
  Tensor(const Shape& shape, T value) : shape_(shape) {
    allocate();
    std::fill_n(data_, size(), value);
  }

  /// A tensor of the given shape holding `values` in row-major order; throws `ShapeError` when
  /// the number of values differs from the number of elements of `shape`.
  Tensor(const Shape& shape, std::initializer_list<T> values)
      : Tensor(shape, std::span<const T>(values.begin(), values.size())) {}

  /// A tensor of the given shape holding a copy of `values` in row-major order.
  Tensor(const Shape& shape, std::span<const T> values) : shape_(shape) {
    if (values.size() != shape.elements()) {
      throw ShapeError("tensor of shape " + shape.str() + ": expected " +
                       std::to_string(shape.elements()) + " values but " +
                       std::to_string(values.size()) + " were given");
    }
    allocate();
    if (!values.empty()) std::memcpy(data_, values.data(), values.size_bytes());
  }

  /// A tensor of the given shape whose elements are left uninitialised (for buffers that are
  /// about to be overwritten).
  static Tensor uninitialized(const Shape& shape) {
    Tensor t(shape, Uninitialized{});
    return t;
  }

  /// A tensor viewing `elements` of memory owned by `owner` (kept alive as long as any view of
  /// it lives), for example a shared-memory slot, a buffer of another library or, with `device`,
  /// memory a backend allocated on its device.
  static Tensor wrap(T* data, const Shape& shape, std::shared_ptr<void> owner,
                     Device device = Device::host()) {
    Tensor t;
    t.shape_ = shape;
    t.data_ = data;
    t.owner_ = std::move(owner);
    t.device_ = device;
    return t;
  }

  /// The shape; `shape()[0]` is the number of rows.
  const Shape& shape() const noexcept { return shape_; }
  std::size_t rank() const noexcept { return shape_.rank(); }
  /// The size of axis `axis`; requires `axis < rank()`.
  std::size_t dim(std::size_t axis) const noexcept {
    LOADSTAR_ASSERT(axis < rank(), "axis out of range");
    return shape_[axis];
  }
  /// The number of elements.
  std::size_t size() const noexcept { return shape_.elements(); }
  /// The size in bytes of the elements.
  std::size_t bytes() const noexcept { return size() * sizeof(T); }
  /// The number of rows (the size of axis 0); 1 for a scalar.
  std::size_t rows() const noexcept { return rank() == 0 ? 1 : shape_[0]; }
  /// The number of elements in one row.
  std::size_t row_size() const noexcept { return shape_.row_elements(); }
  bool empty() const noexcept { return size() == 0; }
  static constexpr DType dtype() noexcept { return dtype_of<T>; }

  /// Where the elements live.
  const Device& device() const noexcept { return device_; }
  /// Whether the elements live in host memory (then every accessor works).
  bool is_host() const noexcept { return device_.is_host(); }
  /// Throws `DeviceError` naming the tensor, its device and `what` unless it is a host tensor.
  void require_host(const char* what) const {
    if (!is_host()) {
      throw DeviceError(description() + ": " + what +
                        " needs host memory but the tensor lives on " + device_.str() +
                        " (copy it to the host through its backend first)");
    }
  }

  /// The first element: the raw pointer, for the kernels of the backend that owns the memory. A
  /// `Tensor` is a handle: a const handle still gives access to the elements, as a
  /// `const std::shared_ptr<T>` does.
  T* data() const noexcept { return data_; }
  /// The elements as a host range; throw `DeviceError` for a tensor in device memory.
  T* begin() const {
    require_host("begin()");
    return data_;
  }
  T* end() const {
    require_host("end()");
    return data_ + size();
  }
  std::span<T> span() const {
    require_host("span()");
    return {data_, size()};
  }

  /// The element at the given indices, one per axis (checked only by `LOADSTAR_ASSERT`); throws
  /// `DeviceError` for a tensor in device memory.
  template <std::integral... I>
  T& operator()(I... indices) const {
    require_host("operator()");
    LOADSTAR_ASSERT(sizeof...(I) == rank(), "one index per axis is required");
    std::size_t offset = 0;
    std::size_t axis = 0;
    ((LOADSTAR_ASSERT(static_cast<std::size_t>(indices) < shape_[axis], "index out of range"),
      offset = offset * shape_[axis++] + static_cast<std::size_t>(indices)),
     ...);
    return data_[offset];
  }

  /// A view of rows `[begin, end)` along axis 0 sharing this tensor's storage; throws
  /// `ShapeError` when the range is not within the rows.
  Tensor slice_rows(std::size_t begin, std::size_t end) const {
    if (rank() == 0 || begin > end || end > shape_[0]) {
      throw ShapeError(description() + ": cannot slice rows [" + std::to_string(begin) + ", " +
                       std::to_string(end) + ")");
    }
    return wrap(data_ + begin * row_size(), shape_.with_rows(end - begin), owner_, device_);
  }

  /// A view of row `index` (one rank lower) sharing this tensor's storage.
  Tensor row(std::size_t index) const {
    if (rank() == 0 || index >= shape_[0]) {
      throw ShapeError(description() + ": row " + std::to_string(index) + " is out of range");
    }
    return wrap(data_ + index * row_size(), shape_.row_shape(), owner_, device_);
  }

  /// A new tensor holding the rows named by `indices`, in that order (a copy); throws
  /// `ShapeError` for an index outside the rows.
  template <std::integral I>
  Tensor gather_rows(std::span<const I> indices) const {
    if (rank() == 0) throw ShapeError(description() + ": a scalar has no rows to gather");
    Tensor out = uninitialized(shape_.with_rows(indices.size()));
    gather_rows_into(indices, out);
    return out;
  }

  template <std::integral I>
  Tensor gather_rows(const std::vector<I>& indices) const {
    return gather_rows(std::span<const I>(indices));
  }

  /// Copies the rows named by `indices` into `out`, whose shape must be this shape with
  /// `indices.size()` rows (no allocation; for loaders that reuse batch buffers).
  template <std::integral I>
  void gather_rows_into(std::span<const I> indices, const Tensor& out) const {
    require_host("gather_rows");
    out.require_host("gather_rows (output)");
    if (rank() == 0 || out.shape() != shape_.with_rows(indices.size())) {
      throw ShapeError(description() + ": gathering " + std::to_string(indices.size()) +
                       " rows needs an output of shape " +
                       (rank() == 0 ? std::string("(?)") : shape_.with_rows(indices.size()).str()) +
                       " but it has shape " + out.shape().str());
    }
    const std::size_t stride = row_size();
    for (std::size_t i = 0; i < indices.size(); ++i) {
      const auto index = indices[i];
      bool negative = false;
      if constexpr (std::is_signed_v<I>) negative = index < 0;
      if (negative || static_cast<std::size_t>(index) >= shape_[0]) {
        throw ShapeError(description() + ": row index " + std::to_string(index) + " at position " +
                         std::to_string(i) + " is out of range");
      }
      if (stride != 0) {
        std::memcpy(out.data_ + i * stride, data_ + static_cast<std::size_t>(index) * stride,
                    stride * sizeof(T));
      }
    }
  }

  /// A view with another shape of the same number of elements; throws `ShapeError` otherwise.
  Tensor reshape(const Shape& shape) const {
    if (shape.elements() != size()) {
      throw ShapeError(description() + ": cannot reshape to " + shape.str() + " (" +
                       std::to_string(shape.elements()) + " elements)");
    }
    return wrap(data_, shape, owner_, device_);
  }

  /// An independent host copy with its own storage; throws `DeviceError` for a tensor in device
  /// memory (its backend's `copy_to_host` copies those).
  Tensor clone() const {
    require_host("clone()");
    return Tensor(shape_, std::span<const T>(data_, size()));
  }

  /// A copy converted element-wise to `U` with `static_cast`.
  template <TensorElement U>
  Tensor<U> cast() const {
    auto out = Tensor<U>::uninitialized(shape_);
    std::transform(begin(), end(), out.begin(), [](T v) { return static_cast<U>(v); });
    return out;
  }

  /// Whether both tensors view the same allocation.
  bool shares_storage_with(const Tensor& other) const noexcept {
    return owner_ != nullptr && owner_ == other.owner_;
  }

  /// Element-wise equality of shapes and values of host tensors (`DeviceError` otherwise).
  friend bool operator==(const Tensor& a, const Tensor& b) {
    return a.shape_ == b.shape_ && std::equal(a.begin(), a.end(), b.begin());
  }

  /// `"float32 tensor of shape (32, 784)"`: how error messages name a tensor.
  std::string description() const {
    return std::string(dtype_name<T>()) + " tensor of shape " + shape_.str();
  }

 private:
  struct Uninitialized {};
  Tensor(const Shape& shape, Uninitialized) : shape_(shape) { allocate(); }

  void allocate() {
    // One allocation per tensor, aligned for vector loads; large blocks are recycled (see
    // `StorageCache`). Overflow-checked: a shape read from a file may have more bytes than memory
    // can address.
    const std::size_t bytes = std::max<std::size_t>(shape_.bytes(sizeof(T)), 1);
    void* memory = detail::StorageCache::instance().allocate(bytes);
    if (memory == nullptr) {
      throw MemoryError(description() + ": cannot allocate " + std::to_string(bytes) + " bytes");
    }
    // When the control block cannot be allocated, shared_ptr gives the block back itself.
    owner_ = std::shared_ptr<void>(
        memory, [bytes](void* p) { detail::StorageCache::instance().release(p, bytes); });
    data_ = static_cast<T*>(memory);
  }

  Shape shape_;
  T* data_ = nullptr;
  std::shared_ptr<void> owner_;
  Device device_;
};

/// Whether `T` is a `Tensor<U>` for some element type `U`.
template <class T>
inline constexpr bool is_tensor_v = false;
template <TensorElement T>
inline constexpr bool is_tensor_v<Tensor<T>> = true;

/// A `Tensor` of any element type.
template <class T>
concept AnyTensor = is_tensor_v<std::remove_cvref_t<T>>;

}  // namespace loadstar

/// \file
/// `ProtectedBackend`: a test backend whose "device" memory can be read only inside its own kernel
/// calls, so that any host access that bypasses the `Backend` crashes instead of hiding.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <loadstar/error.hpp>
#include <loadstar/keras/backend/cpu_backend.hpp>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

namespace loadstar::test {

/// A `Backend` that computes with a `CpuBackend` but keeps its memory out of reach.
///
/// Every allocation is its own page-aligned `mmap` region, tagged `Device{"protected", 0}` and
/// kept `PROT_NONE` except while one of the backend's own kernels, copies or host kernels runs
/// (then every region is readable and writable). A host read of a tensor of this backend outside
/// those calls is a segmentation fault; a host accessor (`begin`, `clone`, ...) throws
/// `DeviceError`; a kernel given a host tensor throws `DeviceError` naming the kernel, as a real
/// device backend could not read it.
/// \code
/// auto backend = std::make_shared<ProtectedBackend>(1);
/// model.compile({.optimizer = "adam", .loss = "mse", .backend = backend});
/// \endcode
class ProtectedBackend final : public keras::Backend {
 public:
  explicit ProtectedBackend(std::size_t threads = 1) : inner_(threads) {}

  /// Whether `dense_forward_relu_mask`, `dense_input_gradient_relu` and `max_pool_backward_relu`
  /// run (a device backend's fused kernels, here the CPU backend's kernels in the order the
  /// layers call them, so that the results stay bit for bit those of the unfused calls), and how
  /// often they ran.
  bool fuse_relu_gradients = false;
  std::size_t relu_masks_written = 0, relu_gradients_carried = 0, relu_pool_gradients = 0;

  /// The number of regions currently allocated.
  std::size_t allocations() const {
    std::lock_guard lock(regions_->mutex);
    return regions_->sizes.size();
  }

  // --- Memory ---------------------------------------------------------------------------------

  Device device() const noexcept override { return {"protected", 0}; }

  Tensor<float> allocate(const Shape& shape) override {
    static const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t bytes =
        (std::max<std::size_t>(shape.elements() * sizeof(float), 1) + page - 1) / page * page;
    void* memory = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
                          0);  // zero-filled
    if (memory == MAP_FAILED) throw std::bad_alloc();
    {
      std::lock_guard lock(regions_->mutex);
      regions_->sizes.emplace(memory, bytes);
      if (regions_->open == 0) ::mprotect(memory, bytes, PROT_NONE);
    }
    std::shared_ptr<void> owner(memory, [regions = regions_, bytes](void* p) {
      {
        std::lock_guard lock(regions->mutex);
        regions->sizes.erase(p);
      }
      ::munmap(p, bytes);
    });
    return Tensor<float>::wrap(static_cast<float*>(memory), shape, std::move(owner), device());
  }

  void copy_from_host(const Tensor<float>& host, const Tensor<float>& tensor) override {
    expect_host("copy_from_host", host);
    run("copy_from_host", {tensor}, [&] { copy_bytes(host, tensor); });
  }

  void copy_to_host(const Tensor<float>& tensor, const Tensor<float>& host) override {
    expect_host("copy_to_host", host);
    run("copy_to_host", {tensor}, [&] { copy_bytes(tensor, host); });
  }

  void synchronize() override {}

  void host_kernel(std::span<const Tensor<float>> tensors, keras::HostKernelRef kernel) override {
    const Open open(*regions_);
    // Host views of the same memory, readable for the duration of the call.
    std::vector<Tensor<float>> views;
    views.reserve(tensors.size());
    for (const auto& t : tensors) {
      views.push_back(t.is_host() ? t : Tensor<float>::wrap(t.data(), t.shape(), nullptr));
    }
    kernel(views);
  }

  std::size_t threads() const noexcept override { return inner_.threads(); }

  // --- Kernels: the CPU backend's, with the memory open ------------------------------------------

  void gemm(const Tensor<float>& a, bool transpose_a, const Tensor<float>& b, bool transpose_b,
            const Tensor<float>& c, float alpha, float beta) override {
    run("gemm", {a, b, c}, [&] { inner_.gemm(a, transpose_a, b, transpose_b, c, alpha, beta); });
  }
  void bias_add(const Tensor<float>& x, const Tensor<float>& bias) override {
    run("bias_add", {x, bias}, [&] { inner_.bias_add(x, bias); });
  }
  /// The mask of a `rows x units` output: bit `u` of row `r` is bit `u % 32` of the row's word
  /// `u / 32`, in memory of this backend kept for the largest batch (`storage`); `bits` is this
  /// step's rows.
  struct Mask final : ReluMask {
    Tensor<float> storage, bits;
  };
  bool dense_forward_relu_mask(const Tensor<float>& x, const Tensor<float>& kernel,
                               const Tensor<float>& bias, const Tensor<float>& y,
                               std::unique_ptr<ReluMask>& mask) override {
    if (!fuse_relu_gradients) return false;
    const std::size_t words = (y.row_size() + 127) / 128 * 4;
    auto* own = dynamic_cast<Mask*>(mask.get());
    if (own == nullptr || own->storage.rows() < y.rows() || own->storage.row_size() != words) {
      auto fresh = std::make_unique<Mask>();
      fresh->storage = allocate({y.rows(), words});
      own = fresh.get();
      mask = std::move(fresh);
    }
    own->bits = own->storage.slice_rows(0, y.rows());
    const Tensor<float>& bits = own->bits;
    run("dense_forward_relu_mask", {x, kernel, bias, y, bits}, [&] {
      inner_.gemm(x, false, kernel, false, y, 1.0F, 0.0F);
      inner_.bias_add(y, bias);
      inner_.activation_forward(keras::Activation::relu, y, y);
      for (std::size_t r = 0; r < y.rows(); ++r) {
        auto* words = reinterpret_cast<std::uint32_t*>(bits.data() + r * bits.row_size());
        std::fill_n(words, bits.row_size(), 0U);
        for (std::size_t u = 0; u < y.row_size(); ++u)
          if (y.data()[r * y.row_size() + u] > 0.0F) words[u / 32] |= 1U << (u % 32);
      }
    });
    ++relu_masks_written;
    return true;
  }
  bool dense_input_gradient_relu(const Tensor<float>& dz, const Tensor<float>& kernel,
                                 const ReluMask& mask, const Tensor<float>& dx,
                                 const Tensor<float>& dbias) override {
    if (!fuse_relu_gradients) return false;
    const auto* own = dynamic_cast<const Mask*>(&mask);
    REQUIRE(own != nullptr);
    const Tensor<float>& bits = own->bits;
    REQUIRE(bits.shape() == Shape{dx.rows(), (dx.row_size() + 127) / 128 * 4});
    run("dense_input_gradient_relu", {dz, kernel, bits, dx, dbias}, [&] {
      inner_.gemm(dz, false, kernel, true, dx, 1.0F, 0.0F);
      for (std::size_t r = 0; r < dx.rows(); ++r) {
        const auto* words =
            reinterpret_cast<const std::uint32_t*>(bits.data() + r * bits.row_size());
        for (std::size_t u = 0; u < dx.row_size(); ++u)
          if ((words[u / 32] >> (u % 32) & 1U) == 0) dx.data()[r * dx.row_size() + u] = 0.0F;
      }
      inner_.column_sums(dx, dbias, 0.0F);
    });
    ++relu_gradients_carried;
    return true;
  }
  void column_sums(const Tensor<float>& x, const Tensor<float>& out, float beta) override {
    run("column_sums", {x, out}, [&] { inner_.column_sums(x, out, beta); });
  }
  void fill(const Tensor<float>& x, float value) override {
    run("fill", {x}, [&] { inner_.fill(x, value); });
  }
  void copy(const Tensor<float>& x, const Tensor<float>& y) override {
    run("copy", {x, y}, [&] { inner_.copy(x, y); });
  }
  void scale(const Tensor<float>& x, float alpha) override {
    run("scale", {x}, [&] { inner_.scale(x, alpha); });
  }
  void axpy(float alpha, const Tensor<float>& x, const Tensor<float>& y) override {
    run("axpy", {x, y}, [&] { inner_.axpy(alpha, x, y); });
  }
  void add(const Tensor<float>& a, const Tensor<float>& b, const Tensor<float>& out) override {
    run("add", {a, b, out}, [&] { inner_.add(a, b, out); });
  }
  void activation_forward(keras::Activation kind, const Tensor<float>& x,
                          const Tensor<float>& y) override {
    run("activation_forward", {x, y}, [&] { inner_.activation_forward(kind, x, y); });
  }
  void activation_backward(keras::Activation kind, const Tensor<float>& x, const Tensor<float>& y,
                           const Tensor<float>& dy, const Tensor<float>& dx) override {
    run("activation_backward", {x, y, dy, dx},
        [&] { inner_.activation_backward(kind, x, y, dy, dx); });
  }
  void relu_forward(const Tensor<float>& x, const Tensor<float>& y, std::optional<float> max_value,
                    float negative_slope, float threshold) override {
    run("relu_forward", {x, y},
        [&] { inner_.relu_forward(x, y, max_value, negative_slope, threshold); });
  }
  void relu_backward(const Tensor<float>& x, const Tensor<float>& dy, const Tensor<float>& dx,
                     std::optional<float> max_value, float negative_slope,
                     float threshold) override {
    run("relu_backward", {x, dy, dx},
        [&] { inner_.relu_backward(x, dy, dx, max_value, negative_slope, threshold); });
  }
  void softmax_forward(const Tensor<float>& x, const Tensor<float>& y, std::size_t axis) override {
    run("softmax_forward", {x, y}, [&] { inner_.softmax_forward(x, y, axis); });
  }
  void softmax_backward(const Tensor<float>& y, const Tensor<float>& dy, const Tensor<float>& dx,
                        std::size_t axis) override {
    run("softmax_backward", {y, dy, dx}, [&] { inner_.softmax_backward(y, dy, dx, axis); });
  }
  void dropout(const Tensor<float>& x, const Tensor<float>& y, float rate,
               std::uint64_t key) override {
    run("dropout", {x, y}, [&] { inner_.dropout(x, y, rate, key); });
  }
  void conv2d_forward(const Tensor<float>& x, const keras::Conv2DGeometry& g,
                      const Tensor<float>& kernel, const Tensor<float>& bias,
                      keras::Activation activation, const Tensor<float>& y) override {
    run("conv2d_forward", {x, kernel, bias, y},
        [&] { inner_.conv2d_forward(x, g, kernel, bias, activation, y); });
  }
  void conv2d_backward(const Tensor<float>& x, const keras::Conv2DGeometry& g,
                       const Tensor<float>& kernel, const Tensor<float>& bias,
                       keras::Activation activation, const Tensor<float>& y,
                       const Tensor<float>& dy, const Tensor<float>& dkernel,
                       const Tensor<float>& dbias, const Tensor<float>& dx,
                       bool accumulate) override {
    run("conv2d_backward", {x, kernel, bias, y, dy, dkernel, dbias, dx}, [&] {
      inner_.conv2d_backward(x, g, kernel, bias, activation, y, dy, dkernel, dbias, dx, accumulate);
    });
  }
  void im2col(const Tensor<float>& x, const keras::Conv2DGeometry& g,
              const Tensor<float>& columns) override {
    run("im2col", {x, columns}, [&] { inner_.im2col(x, g, columns); });
  }
  void col2im(const Tensor<float>& columns, const keras::Conv2DGeometry& g,
              const Tensor<float>& dx) override {
    run("col2im", {columns, dx}, [&] { inner_.col2im(columns, g, dx); });
  }
  void max_pool_forward(const Tensor<float>& x, const keras::Pool2DGeometry& g,
                        const Tensor<float>& y) override {
    run("max_pool_forward", {x, y}, [&] { inner_.max_pool_forward(x, g, y); });
  }
  void max_pool_backward(const Tensor<float>& x, const keras::Pool2DGeometry& g,
                         const Tensor<float>& dy, const Tensor<float>& dx) override {
    run("max_pool_backward", {x, dy, dx}, [&] { inner_.max_pool_backward(x, g, dy, dx); });
  }
  bool max_pool_backward_relu(const Tensor<float>& x, const keras::Pool2DGeometry& g,
                              const Tensor<float>& dy, const Tensor<float>& dx) override {
    if (!fuse_relu_gradients) return false;
    run("max_pool_backward_relu", {x, dy, dx}, [&] {
      inner_.max_pool_backward(x, g, dy, dx);
      inner_.activation_backward(keras::Activation::relu, Tensor<float>(), x, dx, dx);
    });
    ++relu_pool_gradients;
    return true;
  }
  void avg_pool_forward(const Tensor<float>& x, const keras::Pool2DGeometry& g,
                        const Tensor<float>& y) override {
    run("avg_pool_forward", {x, y}, [&] { inner_.avg_pool_forward(x, g, y); });
  }
  void avg_pool_backward(const keras::Pool2DGeometry& g, const Tensor<float>& dy,
                         const Tensor<float>& dx) override {
    run("avg_pool_backward", {dy, dx}, [&] { inner_.avg_pool_backward(g, dy, dx); });
  }
  void global_pool_forward(const Tensor<float>& x, bool max, const Tensor<float>& y) override {
    run("global_pool_forward", {x, y}, [&] { inner_.global_pool_forward(x, max, y); });
  }
  void global_pool_backward(const Tensor<float>& x, bool max, const Tensor<float>& dy,
                            const Tensor<float>& dx) override {
    run("global_pool_backward", {x, dy, dx}, [&] { inner_.global_pool_backward(x, max, dy, dx); });
  }
  void moments(const Tensor<float>& x, const Tensor<float>& mean,
               const Tensor<float>& variance) override {
    run("moments", {x, mean, variance}, [&] { inner_.moments(x, mean, variance); });
  }
  void batch_norm_forward(const Tensor<float>& x, const Tensor<float>& mean,
                          const Tensor<float>& variance, const Tensor<float>& gamma,
                          const Tensor<float>& beta, float epsilon,
                          const Tensor<float>& y) override {
    run("batch_norm_forward", {x, mean, variance, gamma, beta, y},
        [&] { inner_.batch_norm_forward(x, mean, variance, gamma, beta, epsilon, y); });
  }
  void batch_norm_backward(const Tensor<float>& x, const Tensor<float>& mean,
                           const Tensor<float>& variance, const Tensor<float>& gamma, float epsilon,
                           bool training, const Tensor<float>& dy, const Tensor<float>& dx,
                           const Tensor<float>& dgamma, const Tensor<float>& dbeta) override {
    run("batch_norm_backward", {x, mean, variance, gamma, dy, dx, dgamma, dbeta}, [&] {
      inner_.batch_norm_backward(x, mean, variance, gamma, epsilon, training, dy, dx, dgamma,
                                 dbeta);
    });
  }
  void moving_average(const Tensor<float>& moving, const Tensor<float>& value,
                      float momentum) override {
    run("moving_average", {moving, value}, [&] { inner_.moving_average(moving, value, momentum); });
  }
  std::optional<keras::BadIndex> gather(const Tensor<float>& indices, const Tensor<float>& table,
                                        const Tensor<float>& out) override {
    std::optional<keras::BadIndex> bad;
    run("gather", {indices, table, out}, [&] { bad = inner_.gather(indices, table, out); });
    return bad;
  }
  void scatter_add(const Tensor<float>& indices, const Tensor<float>& dy,
                   const Tensor<float>& table_gradient) override {
    run("scatter_add", {indices, dy, table_gradient},
        [&] { inner_.scatter_add(indices, dy, table_gradient); });
  }
  void concatenate(std::span<const Tensor<float>> parts, std::size_t axis,
                   const Tensor<float>& out) override {
    for (const auto& part : parts)
      expect_own("concatenate", part);
    run("concatenate", {out}, [&] { inner_.concatenate(parts, axis, out); });
  }
  void split(const Tensor<float>& x, std::size_t axis, std::span<const std::size_t> extents,
             std::span<const Tensor<float>> parts) override {
    for (const auto& part : parts)
      expect_own("split", part);
    run("split", {x}, [&] { inner_.split(x, axis, extents, parts); });
  }

 private:
  /// Every region, and how many calls have them open.
  struct Regions {
    mutable std::mutex mutex;
    std::unordered_map<void*, std::size_t> sizes;
    int open = 0;

    void protect(int protection) {
      for (const auto& [memory, bytes] : sizes)
        ::mprotect(memory, bytes, protection);
    }
  };

  /// Opens every region for reading and writing while it lives (nested calls stay open).
  class Open {
   public:
    explicit Open(Regions& regions) : regions_(regions) {
      std::lock_guard lock(regions_.mutex);
      if (regions_.open++ == 0) regions_.protect(PROT_READ | PROT_WRITE);
    }
    ~Open() {
      std::lock_guard lock(regions_.mutex);
      if (--regions_.open == 0) regions_.protect(PROT_NONE);
    }
    Open(const Open&) = delete;
    Open& operator=(const Open&) = delete;

   private:
    Regions& regions_;
  };

  template <class F>
  void run(const char* kernel, std::initializer_list<Tensor<float>> tensors, F&& f) {
    for (const auto& t : tensors)
      expect_own(kernel, t);
    const Open open(*regions_);
    f();
  }

  /// A kernel's tensor must be empty or in this backend's memory.
  void expect_own(const char* kernel, const Tensor<float>& t) const {
    if (!t.empty() && t.device() != device()) {
      throw DeviceError(std::string("protected backend: ") + kernel + " was given a " +
                        t.description() + " on " + t.device().str() + " but expects " +
                        device().str() + " memory");
    }
  }

  static void expect_host(const char* copy, const Tensor<float>& t) {
    if (!t.is_host()) {
      throw DeviceError(std::string("protected backend: ") + copy +
                        " needs a host tensor but got a " + t.description() + " on " +
                        t.device().str());
    }
  }

  static void copy_bytes(const Tensor<float>& from, const Tensor<float>& to) {
    LOADSTAR_ASSERT(from.size() == to.size(), "copy: sizes differ");
    if (from.size() != 0) std::memcpy(to.data(), from.data(), from.bytes());
  }

  keras::CpuBackend inner_;
  std::shared_ptr<Regions> regions_ = std::make_shared<Regions>();
};

}  // namespace loadstar::test

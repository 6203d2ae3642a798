/// \file
/// `CpuBackend`: the `Backend` on the CPU, with Eigen for the matrix work and oneTBB for threads.
///
/// Over 800 lines as one class: the CPU's implementation of each `Backend` call, a few lines each
/// around Eigen and oneTBB, in `Backend`'s order, so that a call and its CUDA counterpart
/// (src/cuda/cuda_backend.cpp) are found by the same name.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#if LOADSTAR_WITH_DNNL
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#endif

#include "loadstar/error.hpp"
#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/keras/detail/activation_formulas.hpp"
#include "loadstar/keras/detail/flush_denormal.hpp"
#include "loadstar/keras/detail/layer_formulas.hpp"
#include "loadstar/keras/initializers.hpp"
#include "loadstar/tensor/eigen.hpp"

namespace loadstar::keras {

namespace detail {

/// Calls `f(std::integral_constant<Activation, kind>{})`: the kernels below are compiled once per
/// kind, with `activate` and `activation_gradient` folded to that kind's formula, so that the
/// loops vectorize instead of switching on every element.
template <class F>
void with_activation(Activation kind, F&& f) {
  using A = Activation;
  switch (kind) {
    case A::linear:
      return f(std::integral_constant<A, A::linear>{});
    case A::relu:
      return f(std::integral_constant<A, A::relu>{});
    case A::sigmoid:
      return f(std::integral_constant<A, A::sigmoid>{});
    case A::tanh:
      return f(std::integral_constant<A, A::tanh>{});
    case A::softmax:
      return f(std::integral_constant<A, A::softmax>{});
    case A::elu:
      return f(std::integral_constant<A, A::elu>{});
    case A::selu:
      return f(std::integral_constant<A, A::selu>{});
    case A::softplus:
      return f(std::integral_constant<A, A::softplus>{});
    case A::softsign:
      return f(std::integral_constant<A, A::softsign>{});
    case A::gelu:
      return f(std::integral_constant<A, A::gelu>{});
    case A::swish:
      return f(std::integral_constant<A, A::swish>{});
    case A::hard_sigmoid:
      return f(std::integral_constant<A, A::hard_sigmoid>{});
    case A::exponential:
      return f(std::integral_constant<A, A::exponential>{});
    case A::relu6:
      return f(std::integral_constant<A, A::relu6>{});
    case A::leaky_relu:
      return f(std::integral_constant<A, A::leaky_relu>{});
    case A::mish:
      return f(std::integral_constant<A, A::mish>{});
    case A::hard_silu:
      return f(std::integral_constant<A, A::hard_silu>{});
    case A::log_sigmoid:
      return f(std::integral_constant<A, A::log_sigmoid>{});
    case A::hard_tanh:
      return f(std::integral_constant<A, A::hard_tanh>{});
    case A::tanh_shrink:
      return f(std::integral_constant<A, A::tanh_shrink>{});
    case A::soft_shrink:
      return f(std::integral_constant<A, A::soft_shrink>{});
    case A::hard_shrink:
      return f(std::integral_constant<A, A::hard_shrink>{});
    case A::squareplus:
      return f(std::integral_constant<A, A::squareplus>{});
    case A::sparse_plus:
      return f(std::integral_constant<A, A::sparse_plus>{});
  }
}

/// GCC's vector types (GCC and Clang): sixteen floats or lanes. The max pooling kernels below
/// use them for plain loads, compares and blends, where the autovectorizer emits gathers or
/// scalar code. They are never passed or returned by value (whose ABI depends on the
/// instruction set, which GCC warns about), and are moved through memory with `memcpy`.
using Floats16 = float __attribute__((vector_size(64)));
using Lanes16 = std::int32_t __attribute__((vector_size(64)));

/// Max pooling over one window for the channels `[0, lanes)`: `out[c]` is the largest of the
/// window's values (`std::max`'s rule from -infinity: a NaN never replaces a number). `x` points
/// at the channels' first element in the image, `offsets[i]` is window position `i`'s offset.
inline void max_pool_window(const float* x, const std::size_t* offsets, std::size_t size,
                            float* out, std::size_t lanes) noexcept {
  constexpr std::size_t width = 16;
  std::size_t c0 = 0;
  for (; c0 + width <= lanes; c0 += width) {
    Floats16 top, in;
    for (std::size_t c = 0; c < width; ++c)
      top[c] = -std::numeric_limits<float>::infinity();
    for (std::size_t i = 0; i < size; ++i) {
      std::memcpy(&in, x + offsets[i] + c0, sizeof in);
      const Lanes16 above = top < in;
      top = __builtin_bit_cast(Floats16, (__builtin_bit_cast(Lanes16, in) & above) |
                                             (__builtin_bit_cast(Lanes16, top) & ~above));
    }
    std::memcpy(out + c0, &top, sizeof top);
  }
  for (std::size_t c = c0; c < lanes; ++c) {
    float top = -std::numeric_limits<float>::infinity();
    for (std::size_t i = 0; i < size; ++i)
      top = std::max(top, x[offsets[i] + c]);
    out[c] = top;
  }
}

/// Max pooling's gradient for the channels `[0, lanes)` of one window: each channel's gradient
/// goes to the first maximum in window order (`>` keeps the first of equal values, and a NaN
/// first pixel keeps the gradient). `x` and `dx` point at the channels' first element in the
/// image, `offsets[i]` is the offset of window position `i`.
inline void max_pool_route(const float* x, const std::size_t* offsets, std::size_t size,
                           const float* gradient, float* dx, std::size_t lanes) noexcept {
  constexpr std::size_t width = 16;
  std::size_t c0 = 0;
  for (; c0 + width <= lanes; c0 += width) {
    Floats16 top, in;
    std::memcpy(&top, x + offsets[0] + c0, sizeof top);
    Lanes16 arg = {};
    for (std::size_t i = 1; i < size; ++i) {
      std::memcpy(&in, x + offsets[i] + c0, sizeof in);
      const Lanes16 above = in > top;
      top = __builtin_bit_cast(Floats16, (__builtin_bit_cast(Lanes16, in) & above) |
                                             (__builtin_bit_cast(Lanes16, top) & ~above));
      arg = (static_cast<std::int32_t>(i) & above) | (arg & ~above);
    }
    Lanes16 g;
    Floats16 sum;
    std::memcpy(&g, gradient + c0, sizeof g);
    for (std::size_t i = 0; i < size; ++i) {
      float* to = dx + offsets[i] + c0;
      const Lanes16 hit = arg == static_cast<std::int32_t>(i);
      std::memcpy(&sum, to, sizeof sum);
      sum += __builtin_bit_cast(Floats16, g & hit);
      std::memcpy(to, &sum, sizeof sum);
    }
  }
  for (std::size_t c = c0; c < lanes; ++c) {
    float top = x[offsets[0] + c];
    std::size_t arg = 0;
    for (std::size_t i = 1; i < size; ++i) {
      if (x[offsets[i] + c] > top) {
        top = x[offsets[i] + c];
        arg = i;
      }
    }
    dx[offsets[arg] + c] += gradient[c];
  }
}

/// A grow-only, 64-byte aligned buffer of `T` (floats; bfloat16 bits for the bfloat16 GEMM).
template <class T = float>
class GrowBuffer {
 public:
  T* get(std::size_t size) {
    if (size > size_) {
      data_.reset(new (std::align_val_t{64}) T[size]);
      size_ = size;
    }
    return data_.get();
  }

 private:
  struct Delete {
    void operator()(T* p) const noexcept { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<T[], Delete> data_;
  std::size_t size_ = 0;
};

/// Buffer `slot` (0 to 3) of the calling thread, of at least `size` floats: the tiles the
/// convolution kernels unfold into, kept across calls.
inline float* thread_buffer(std::size_t slot, std::size_t size) {
  thread_local GrowBuffer<> buffers[4];
  return buffers[slot].get(size);
}

/// The packing buffers of Eigen's GEMM kernel, kept by each thread across calls. Eigen's product
/// expressions allocate them on every product, on the heap once they pass 128 KiB; glibc then
/// maps and unmaps fresh pages each time, and the page faults cost up to three quarters of a
/// 256 x 256 x 256 product. A thread's buffers only grow.
class GemmBlocking : public Eigen::internal::level3_blocking<float, float> {
 public:
  /// The blocking of a column-major `(m x n) += (m x k) * (k x n)` product on one thread, with
  /// the blocks in this thread's buffers.
  GemmBlocking(Eigen::Index m, Eigen::Index n, Eigen::Index k) {
    m_mc = m;
    m_nc = n;
    m_kc = k;
    Eigen::internal::computeProductBlockingSizes<float, float, 1>(m_kc, m_mc, m_nc,
                                                                  Eigen::Index{1});
    thread_local GrowBuffer<> a, b;
    m_blockA = a.get(static_cast<std::size_t>(m_kc * m_mc));
    m_blockB = b.get(static_cast<std::size_t>(m_kc * m_nc));
  }
};

#if LOADSTAR_WITH_DNNL
/// Runs oneDNN's calls made by this thread on this thread alone: oneDNN (Debian's build) runs
/// on OpenMP, whose team would otherwise take every core for each call, inside threads the
/// backend already splits the work over. The thread's OpenMP setting is restored afterwards.
class OneOpenMpThread {
 public:
  OneOpenMpThread() : saved_(omp_get_max_threads()) {
    if (saved_ != 1) omp_set_num_threads(1);
  }
  ~OneOpenMpThread() {
    if (saved_ != 1) omp_set_num_threads(saved_);
  }
  OneOpenMpThread(const OneOpenMpThread&) = delete;
  OneOpenMpThread& operator=(const OneOpenMpThread&) = delete;

 private:
  int saved_;
};

/// Whether oneDNN computes bfloat16 products with this processor's own instructions (AVX-512 BF16
/// or AMX), which `bfloat16_gemm` needs; decided once, from the instruction set oneDNN uses.
inline bool native_bfloat16_products() noexcept {
  static const bool native = [] {
    const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
    const auto bf16 = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
    return (isa & bf16) == bf16;
  }();
  return native;
}

/// The number of products `bfloat16_gemm` computed in this process (tests read it to see which
/// path a model took).
inline std::atomic<std::uint64_t>& bfloat16_gemm_count() noexcept {
  static std::atomic<std::uint64_t> count{0};
  return count;
}

/// Copies the `rows` x `columns` matrix at `from` (row stride `ld`) densely into `to` as
/// bfloat16, the upper halves of the floats; false as soon as a row holds a float that is not a
/// bfloat16 value (its lower half is not zero), `to` then partly written.
inline bool pack_bfloat16(const float* from, std::size_t rows, std::size_t columns, std::size_t ld,
                          std::uint16_t* to) noexcept {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = from + r * ld;
    std::uint16_t* out = to + r * columns;
    std::uint32_t lower = 0;
    for (std::size_t j = 0; j < columns; ++j) {
      const auto bits = std::bit_cast<std::uint32_t>(row[j]);
      lower |= bits & 0xFFFFU;
      out[j] = static_cast<std::uint16_t>(bits >> 16);
    }
    if (lower != 0) return false;
  }
  return true;
}

/// Throws the error of a failed oneDNN call `what` made for an `m` x `n` x `k` bfloat16 product.
inline void check_bfloat16_gemm(dnnl_status_t status, const char* what, std::size_t m,
                                std::size_t n, std::size_t k) {
  if (status == dnnl_success) return;
  throw Error("cpu backend: oneDNN's " + std::string(what) + " for a " + std::to_string(m) + " x " +
              std::to_string(n) + " x " + std::to_string(k) +
              " bfloat16 product failed: " + dnnl_status2str(status));
}

/// `c = alpha * op(a) * op(b) + beta * c` as `sgemm`, on oneDNN's bfloat16 matmul (bfloat16
/// operands, products and sums in float32, a float32 result) when every element of `op(a)` and
/// `op(b)` is a bfloat16 value, as a mixed_bfloat16 layer's inputs, weights and output gradients
/// are (keras/mixed_precision/detail/mixed_plan.hpp rounds them), and the processor has
/// `native_bfloat16_products`. A product of two bfloat16 values is exact in float32, so the
/// result is float32's but for the order of the sums, as between thread counts. Returns false,
/// `c` untouched, where either condition fails (then `sgemm` computes in float32).
inline bool bfloat16_gemm(bool transpose_a, bool transpose_b, std::size_t m, std::size_t n,
                          std::size_t k, float alpha, const float* a, std::size_t lda,
                          const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  if (!native_bfloat16_products()) return false;
  // Packed densely as stored: op(a) is m x k (stored k x m when transposed), op(b) k x n.
  thread_local GrowBuffer<std::uint16_t> a_buffer, b_buffer;
  std::uint16_t* packed_b = b_buffer.get(k * n);
  if (!pack_bfloat16(b, transpose_b ? n : k, transpose_b ? k : n, ldb, packed_b)) return false;
  std::uint16_t* packed_a = a_buffer.get(m * k);
  if (!pack_bfloat16(a, transpose_a ? k : m, transpose_a ? m : k, lda, packed_a)) return false;
  const auto dim = [](std::size_t v) { return static_cast<dnnl_dim_t>(v); };
  const auto check = [&](dnnl_status_t status, const char* what) {
    check_bfloat16_gemm(status, what, m, n, k);
  };
  static const dnnl_engine_t engine = [&] {
    dnnl_engine_t made = nullptr;
    check(dnnl_engine_create(&made, dnnl_cpu, 0), "dnnl_engine_create");
    return made;
  }();
  thread_local const std::unique_ptr<dnnl_stream, dnnl_status_t (*)(dnnl_stream_t)> stream(
      [&] {
        dnnl_stream_t made = nullptr;
        check(dnnl_stream_create(&made, engine, dnnl_stream_default_flags), "dnnl_stream_create");
        return made;
      }(),
      dnnl_stream_destroy);
  dnnl_memory_desc_t a_desc, b_desc, c_desc;
  dnnl_dims_t a_dims{dim(m), dim(k)}, b_dims{dim(k), dim(n)}, c_dims{dim(m), dim(n)};
  dnnl_dims_t a_strides{transpose_a ? 1 : dim(k), transpose_a ? dim(m) : 1};
  dnnl_dims_t b_strides{transpose_b ? 1 : dim(n), transpose_b ? dim(k) : 1};
  dnnl_dims_t c_strides{dim(ldc), 1};
  check(dnnl_memory_desc_init_by_strides(&a_desc, 2, a_dims, dnnl_bf16, a_strides),
        "dnnl_memory_desc_init_by_strides");
  check(dnnl_memory_desc_init_by_strides(&b_desc, 2, b_dims, dnnl_bf16, b_strides),
        "dnnl_memory_desc_init_by_strides");
  check(dnnl_memory_desc_init_by_strides(&c_desc, 2, c_dims, dnnl_f32, c_strides),
        "dnnl_memory_desc_init_by_strides");
  dnnl_matmul_desc_t desc;
  check(dnnl_matmul_desc_init(&desc, &a_desc, &b_desc, nullptr, &c_desc), "dnnl_matmul_desc_init");
  // alpha as the output scale, beta * c as a sum post-op; oneDNN's primitive cache keeps the
  // kernels of the shapes seen, so that making the primitive again costs microseconds.
  std::unique_ptr<dnnl_primitive_attr, dnnl_status_t (*)(dnnl_primitive_attr_t)> attr(
      nullptr, dnnl_primitive_attr_destroy);
  if (alpha != 1.0F || beta != 0.0F) {
    dnnl_primitive_attr_t made = nullptr;
    check(dnnl_primitive_attr_create(&made), "dnnl_primitive_attr_create");
    attr.reset(made);
    if (alpha != 1.0F)
      check(dnnl_primitive_attr_set_output_scales(made, 1, 0, &alpha),
            "dnnl_primitive_attr_set_output_scales");
    if (beta != 0.0F) {
      dnnl_post_ops_t post_ops = nullptr;
      check(dnnl_post_ops_create(&post_ops), "dnnl_post_ops_create");
      const std::unique_ptr<dnnl_post_ops, dnnl_status_t (*)(dnnl_post_ops_t)> owned(
          post_ops, dnnl_post_ops_destroy);
      check(dnnl_post_ops_append_sum(post_ops, beta), "dnnl_post_ops_append_sum");
      check(dnnl_primitive_attr_set_post_ops(made, post_ops), "dnnl_primitive_attr_set_post_ops");
    }
  }
  const OneOpenMpThread one_thread;
  dnnl_primitive_desc_t made_desc = nullptr;
  check(dnnl_primitive_desc_create(&made_desc, &desc, attr.get(), engine, nullptr),
        "dnnl_primitive_desc_create");
  const std::unique_ptr<dnnl_primitive_desc, dnnl_status_t (*)(dnnl_primitive_desc_t)>
      primitive_desc(made_desc, dnnl_primitive_desc_destroy);
  dnnl_primitive_t made_primitive = nullptr;
  check(dnnl_primitive_create(&made_primitive, made_desc), "dnnl_primitive_create");
  const std::unique_ptr<dnnl_primitive, dnnl_status_t (*)(dnnl_primitive_t)> primitive(
      made_primitive, dnnl_primitive_destroy);
  using Memory = std::unique_ptr<dnnl_memory, dnnl_status_t (*)(dnnl_memory_t)>;
  const auto memory = [&](const dnnl_memory_desc_t& memory_desc, void* data) {
    dnnl_memory_t made = nullptr;
    check(dnnl_memory_create(&made, &memory_desc, engine, data), "dnnl_memory_create");
    return Memory(made, dnnl_memory_destroy);
  };
  const Memory a_memory = memory(a_desc, packed_a), b_memory = memory(b_desc, packed_b),
               c_memory = memory(c_desc, c);
  const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, a_memory.get()},
                                  {DNNL_ARG_WEIGHTS, b_memory.get()},
                                  {DNNL_ARG_DST, c_memory.get()}};
  check(dnnl_primitive_execute(primitive.get(), stream.get(), 3, args), "dnnl_primitive_execute");
  bfloat16_gemm_count().fetch_add(1, std::memory_order_relaxed);
  return true;
}
#endif

/// `c += alpha * op(a) * op(b)` on row-major matrices given by pointer and row stride, for rows
/// `[0, m)` of `c`: Eigen's GEMM kernel (`general_matrix_matrix_product`, what its product
/// expressions call) on the column-major `c^T = op(b)^T * op(a)^T`, with `GemmBlocking`'s
/// buffers. `a` points at the first row of `op(a)` (its first column when `transpose_a`).
template <bool TransposeA, bool TransposeB>
void gemm_accumulate(std::size_t m, std::size_t n, std::size_t k, const float* a, std::size_t lda,
                     const float* b, std::size_t ldb, float* c, std::size_t ldc, float alpha) {
  using Eigen::Index;
  constexpr int lhs_order = TransposeB ? Eigen::RowMajor : Eigen::ColMajor;
  constexpr int rhs_order = TransposeA ? Eigen::RowMajor : Eigen::ColMajor;
  GemmBlocking blocking(static_cast<Index>(n), static_cast<Index>(m), static_cast<Index>(k));
  Eigen::internal::general_matrix_matrix_product<
      Index, float, lhs_order, false, float, rhs_order, false, Eigen::ColMajor,
      1>::run(static_cast<Index>(n), static_cast<Index>(m), static_cast<Index>(k), b,
              static_cast<Index>(ldb), a, static_cast<Index>(lda), c, 1, static_cast<Index>(ldc),
              alpha, blocking);
}

/// `c = alpha * op(a) * op(b) + beta * c` on row-major matrices given by pointer and row stride,
/// on the calling thread: where the build has oneDNN, its bfloat16 matmul when the operands are
/// bfloat16 values and the processor computes bfloat16 natively (`bfloat16_gemm`), else its SGEMM;
/// else Eigen's kernel. With `beta == 0`, `c` is not read.
inline void sgemm(bool transpose_a, bool transpose_b, std::size_t m, std::size_t n, std::size_t k,
                  float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb,
                  float beta, float* c, std::size_t ldc) {
  if (m == 0 || n == 0) return;
#if LOADSTAR_WITH_DNNL
  // oneDNN leaves c alone when k is 0 (BLAS would scale it), which the code below handles.
  if (k != 0) {
    if (bfloat16_gemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
      return;
    const OneOpenMpThread one_thread;
    const auto dim = [](std::size_t v) { return static_cast<dnnl_dim_t>(v); };
    const dnnl_status_t status =
        dnnl_sgemm(transpose_a ? 'T' : 'N', transpose_b ? 'T' : 'N', dim(m), dim(n), dim(k), alpha,
                   a, dim(lda), b, dim(ldb), beta, c, dim(ldc));
    if (status != dnnl_success) {
      throw Error("cpu backend: oneDNN's dnnl_sgemm for a " + std::to_string(m) + " x " +
                  std::to_string(n) + " x " + std::to_string(k) +
                  " product failed: " + dnnl_status2str(status));
    }
    return;
  }
#endif
  for (std::size_t r = 0; r < m; ++r) {
    float* row = c + r * ldc;
    if (beta == 0.0F) {
      std::fill(row, row + n, 0.0F);
    } else if (beta != 1.0F) {
      for (std::size_t j = 0; j < n; ++j)
        row[j] *= beta;
    }
  }
  if (k == 0) return;
  const auto kernel =
      transpose_a ? (transpose_b ? gemm_accumulate<true, true> : gemm_accumulate<true, false>)
                  : (transpose_b ? gemm_accumulate<false, true> : gemm_accumulate<false, false>);
  kernel(m, n, k, a, lda, b, ldb, c, ldc, alpha);
}

/// `out = f(in)` for an elementwise activation (not softmax) over `n` elements; `out` may be
/// `in`.
inline void activate_range(Activation kind, const float* in, float* out, std::size_t n) {
  with_activation(kind, [&](auto k) {
    if constexpr (k() == Activation::relu) {
      // activate's relu, written out: GCC does not always inline `activate` (a switch over every
      // kind), and a call per element keeps the loop from vectorizing.
      for (std::size_t i = 0; i < n; ++i)
        out[i] = in[i] > 0.0F ? in[i] : 0.0F;
    } else {
      for (std::size_t i = 0; i < n; ++i)
        out[i] = activate(k(), in[i]);
    }
  });
}

/// `dx = f'(x) * dy` for an elementwise activation (not softmax) over `n` elements, from the
/// output `y` (and the input `x` for the kinds whose gradient needs it); `dx` may be `dy`.
inline void activation_gradient_range(Activation kind, const float* x, const float* y,
                                      const float* dy, float* dx, std::size_t n) {
  with_activation(kind, [&](auto k) {
    if constexpr (activation_gradient_needs_input(k())) {
      for (std::size_t i = 0; i < n; ++i)
        dx[i] = activation_gradient(k(), x[i], y[i], dy[i]);
    } else {
      for (std::size_t i = 0; i < n; ++i)
        dx[i] = activation_gradient(k(), 0.0F, y[i], dy[i]);
    }
  });
}
}  // namespace detail

/// The CPU backend: Eigen for GEMM (through `as_matrix` maps with `.noalias()`), hand-written
/// kernels for the rest, and a `tbb::task_arena` of the user's thread count.
///
/// Work is cut into a fixed number of chunks that depends only on the sizes and the thread count,
/// never on scheduling, so that the same thread count gives bitwise identical results. Reductions
/// (bias gradients, batch statistics, pooling) keep one thread per output element and so give the
/// same bits for any thread count; GEMM is split by rows and may differ in the last bits between
/// thread counts, as Eigen's blocking depends on the block sizes.
/// \code
/// CpuBackend backend(4);  // four threads
/// CallContext ctx{.backend = backend, .training = true};
/// \endcode
class CpuBackend final : public Backend {
 public:
  /// A backend computing with `threads` threads (at least 1; throws `ConfigError` for 0).
  explicit CpuBackend(std::size_t threads = 1)
      : threads_(threads), arena_(static_cast<int>(std::max<std::size_t>(threads, 1))) {
    if (threads == 0)
      throw ConfigError("cpu backend: the thread count must be at least 1 but is 0");
  }

  std::size_t threads() const noexcept override { return threads_; }

  /// Whether the matrix products of mixed_bfloat16 layers (those of Dense, Conv2D and every other
  /// GEMM whose operands are all bfloat16 values) run on oneDNN's bfloat16 matmul, bfloat16
  /// operands with float32 sums and result: where the build has oneDNN and the processor has
  /// AVX-512 BF16 or AMX. Elsewhere they run in float32 on the same bfloat16 values, which gives
  /// the same result but for the order of the sums.
  static bool bfloat16_products() noexcept {
#if LOADSTAR_WITH_DNNL
    return detail::native_bfloat16_products();
#else
    return false;
#endif
  }

  /// Host memory: every tensor of this backend is an ordinary host tensor.
  Device device() const noexcept override {
    return Device::host();
  }
  Tensor<float> allocate(const Shape& shape) override {
    return Tensor<float>(shape);
  }
  void copy_from_host(const Tensor<float>& host, const Tensor<float>& tensor) override {
    copy(host, tensor);
  }
  void copy_to_host(const Tensor<float>& tensor, const Tensor<float>& host) override {
    copy(tensor, host);
  }
  void synchronize() override {}
  void host_kernel(std::span<const Tensor<float>> tensors, HostKernelRef kernel) override {
    kernel(tensors);
  }

  void gemm(const Tensor<float>& a, bool transpose_a, const Tensor<float>& b, bool transpose_b,
            const Tensor<float>& c, float alpha, float beta) override {
    const std::size_t m = transpose_a ? a.row_size() : a.rows();
    const std::size_t k = transpose_a ? a.rows() : a.row_size();
    const std::size_t n = c.row_size();
    LOADSTAR_ASSERT(m == c.rows(), "gemm: rows of op(a) and c differ");
    LOADSTAR_ASSERT(k == (transpose_b ? b.row_size() : b.rows()), "gemm: inner dimensions differ");
    LOADSTAR_ASSERT((transpose_b ? b.rows() : b.row_size()) == n, "gemm: columns differ");
    // At least 32 rows and 2^18 multiply-adds per chunk: smaller blocks cost more in packing
    // and in waking a thread than they gain.
    const std::size_t row_work = std::max<std::size_t>(n * k, 1);
    const std::size_t min_rows =
        std::max<std::size_t>(32, ((std::size_t{1} << 18) + row_work - 1) / row_work);
    parallel(m, min_rows, [&](std::size_t r0, std::size_t r1) {
      const float* first = a.data() + (transpose_a ? r0 : r0 * a.row_size());
      detail::sgemm(transpose_a, transpose_b, r1 - r0, n, k, alpha, first, a.row_size(), b.data(),
                    b.row_size(), beta, c.data() + r0 * n, n);
    });
  }

  void bias_add(const Tensor<float>& x, const Tensor<float>& bias) override {
    const std::size_t n = bias.size();
    LOADSTAR_ASSERT(n > 0 && x.size() % n == 0, "bias_add: sizes do not fit");
    const std::size_t rows = x.size() / n;
    parallel(rows, 64, [&](std::size_t r0, std::size_t r1) {
      for (std::size_t r = r0; r < r1; ++r) {
        float* row = x.data() + r * n;
        for (std::size_t j = 0; j < n; ++j)
          row[j] += bias.data()[j];
      }
    });
  }

  void column_sums(const Tensor<float>& x, const Tensor<float>& out, float beta) override {
    const std::size_t n = out.size();
    LOADSTAR_ASSERT(n > 0 && x.size() % n == 0, "column_sums: sizes do not fit");
    const std::size_t rows = x.size() / n;
    // Each column is summed in double, row after row, whatever the thread count; the rows are
    // walked once for a block of columns, so that the additions run side by side in vectors.
    // A chunk holds at least 16 columns and 2^15 elements.
    const std::size_t min_columns = std::max<std::size_t>(
        16, ((std::size_t{1} << 15) + rows - 1) / std::max<std::size_t>(rows, 1));
    parallel(n, min_columns, [&](std::size_t c0, std::size_t c1) {
      constexpr std::size_t block = 256;
      for (std::size_t b0 = c0; b0 < c1; b0 += block) {
        const std::size_t width = std::min(block, c1 - b0);
        double sums[block] = {};
        for (std::size_t r = 0; r < rows; ++r) {
          const float* row = x.data() + r * n + b0;
          for (std::size_t j = 0; j < width; ++j)
            sums[j] += row[j];
        }
        for (std::size_t j = 0; j < width; ++j) {
          const std::size_t c = b0 + j;
          out.data()[c] = detail::column_sum_value(sums[j], beta, out.data()[c]);
        }
      }
    });
  }

  void fill(const Tensor<float>& x, float value) override {
    elementwise(x.size(), [&](std::size_t i) { x.data()[i] = value; });
  }
  void copy(const Tensor<float>& x, const Tensor<float>& y) override {
    LOADSTAR_ASSERT(x.size() == y.size(), "copy: sizes differ");
    if (x.data() == y.data()) return;
    parallel(x.size(), elementwise_chunk, [&](std::size_t i0, std::size_t i1) {
      std::memcpy(y.data() + i0, x.data() + i0, (i1 - i0) * sizeof(float));
    });
  }
  void scale(const Tensor<float>& x, float alpha) override {
    elementwise(x.size(), [&](std::size_t i) { x.data()[i] *= alpha; });
  }
  void axpy(float alpha, const Tensor<float>& x, const Tensor<float>& y) override {
    LOADSTAR_ASSERT(x.size() == y.size(), "axpy: sizes differ");
    elementwise(x.size(), [&](std::size_t i) { y.data()[i] += alpha * x.data()[i]; });
  }
  void add(const Tensor<float>& a, const Tensor<float>& b, const Tensor<float>& out) override {
    LOADSTAR_ASSERT(a.size() == b.size() && a.size() == out.size(), "add: sizes differ");
    elementwise(a.size(), [&](std::size_t i) { out.data()[i] = a.data()[i] + b.data()[i]; });
  }

  void activation_forward(Activation kind, const Tensor<float>& x,
                          const Tensor<float>& y) override {
    LOADSTAR_ASSERT(x.size() == y.size(), "activation_forward: sizes differ");
    if (kind == Activation::softmax) {
      softmax_forward(x, y, x.rank() == 0 ? 0 : x.rank() - 1);
      return;
    }
    parallel(x.size(), elementwise_chunk, [&](std::size_t i0, std::size_t i1) {
      detail::activate_range(kind, x.data() + i0, y.data() + i0, i1 - i0);
    });
  }

  void activation_backward(Activation kind, const Tensor<float>& x, const Tensor<float>& y,
                           const Tensor<float>& dy, const Tensor<float>& dx) override {
    LOADSTAR_ASSERT(y.size() == dy.size() && dy.size() == dx.size(), "activation: sizes differ");
    if (kind == Activation::softmax) {
      softmax_backward(y, dy, dx, y.rank() == 0 ? 0 : y.rank() - 1);
      return;
    }
    [[maybe_unused]] const bool needs_x = activation_gradient_needs_input(kind);
    LOADSTAR_ASSERT(!needs_x || x.size() == y.size(), "activation: the input is needed");
    parallel(y.size(), elementwise_chunk, [&](std::size_t i0, std::size_t i1) {
      detail::activation_gradient_range(kind, needs_x ? x.data() + i0 : nullptr, y.data() + i0,
                                        dy.data() + i0, dx.data() + i0, i1 - i0);
    });
  }

  void relu_forward(const Tensor<float>& x, const Tensor<float>& y, std::optional<float> max_value,
                    float negative_slope, float threshold) override {
    const float top = max_value.value_or(std::numeric_limits<float>::infinity());
    // Over plain pointers and locals, so that the loop is vectorized (selects, no branches).
    parallel(x.size(), elementwise_chunk,
             [&, in = x.data(), out = y.data()](std::size_t i0, std::size_t i1) {
               const float t = top, slope = negative_slope, from = threshold;
               for (std::size_t i = i0; i < i1; ++i)
                 out[i] = detail::relu_value(in[i], t, slope, from);
             });
  }

  void relu_backward(const Tensor<float>& x, const Tensor<float>& dy, const Tensor<float>& dx,
                     std::optional<float> max_value, float negative_slope,
                     float threshold) override {
    const float top = max_value.value_or(std::numeric_limits<float>::infinity());
    parallel(x.size(), elementwise_chunk,
             [&, in = x.data(), d = dy.data(), out = dx.data()](std::size_t i0, std::size_t i1) {
               const float t = top, slope = negative_slope, from = threshold;
               for (std::size_t i = i0; i < i1; ++i)
                 out[i] = detail::relu_gradient(in[i], d[i], t, slope, from);
             });
  }

  void softmax_forward(const Tensor<float>& x, const Tensor<float>& y, std::size_t axis) override {
    const auto v = detail::axis_view(x.shape(), axis);
    parallel(v.outer * v.inner, 16, [&](std::size_t l0, std::size_t l1) {
      for (std::size_t line = l0; line < l1; ++line)
        detail::softmax_forward_line(x.data(), y.data(), v.length, v.inner, line);
    });
  }

  void softmax_backward(const Tensor<float>& y, const Tensor<float>& dy, const Tensor<float>& dx,
                        std::size_t axis) override {
    const auto v = detail::axis_view(y.shape(), axis);
    parallel(v.outer * v.inner, 16, [&](std::size_t l0, std::size_t l1) {
      for (std::size_t line = l0; line < l1; ++line)
        detail::softmax_backward_line(y.data(), dy.data(), dx.data(), v.length, v.inner, line);
    });
  }

  void dropout(const Tensor<float>& x, const Tensor<float>& y, float rate,
               std::uint64_t key) override {
    if (rate <= 0.0F) {
      copy(x, y);
      return;
    }
    const float keep_scale = rate < 1.0F ? 1.0F / (1.0F - rate) : 0.0F;
    const double threshold = rate;
    // A counter-based mask: element i depends on (key, i) only, whatever the thread split.
    elementwise(x.size(), [&](std::size_t i) {
      y.data()[i] = detail::dropout_value(x.data()[i], key, i, threshold, keep_scale);
    });
  }

  void im2col(const Tensor<float>& x, const Conv2DGeometry& g,
              const Tensor<float>& columns) override {
    LOADSTAR_ASSERT(columns.size() == g.batch * g.out_h * g.out_w * g.patch_size(),
                    "im2col: columns have the wrong size");
    const std::size_t line = g.out_w * g.patch_size();
    parallel(g.batch * g.out_h, 2, [&](std::size_t l0, std::size_t l1) {
      im2col_lines(x.data(), g, l0, l1, columns.data() + l0 * line);
    });
  }

  void col2im(const Tensor<float>& columns, const Conv2DGeometry& g,
              const Tensor<float>& dx) override {
    const std::size_t image = g.out_h * g.out_w * g.patch_size();
    // One chunk per image range: an image's pixels receive only its own rows, in a fixed order.
    parallel(g.batch, 1, [&](std::size_t b0, std::size_t b1) {
      col2im_images(columns.data() + b0 * image, g, b0, b1, dx.data());
    });
  }

  /// Tiled: each thread unfolds a few images at a time into its own buffer (kept in cache) and
  /// multiplies, adds the bias and applies the activation there; the whole batch is never
  /// unfolded. Tiles depend on the sizes only.
  void conv2d_forward(const Tensor<float>& x, const Conv2DGeometry& g, const Tensor<float>& kernel,
                      const Tensor<float>& bias, Activation activation,
                      const Tensor<float>& y) override {
    convolution_forward(x, g, 1, kernel, bias, activation, y);
  }

  /// Tiled as `conv2d_forward`: per tile, the activation's gradient, the kernel's gradient into
  /// the thread's partial sum, the bias's into the tile's (in double), and the input's gradient
  /// unfolded and folded back into the tile's images. The partial sums are added in a fixed
  /// order: the bias gradient does not depend on the thread count, the kernel's may in the last
  /// bits (as `gemm`'s).
  void conv2d_backward(const Tensor<float>& x, const Conv2DGeometry& g, const Tensor<float>& kernel,
                       const Tensor<float>& bias, Activation activation, const Tensor<float>& y,
                       const Tensor<float>& dy, const Tensor<float>& dkernel,
                       const Tensor<float>& dbias, const Tensor<float>& dx,
                       bool accumulate) override {
    if (activation == Activation::softmax) {
      Backend::conv2d_backward(x, g, kernel, bias, activation, y, dy, dkernel, dbias, dx,
                               accumulate);
      return;
    }
    convolution_backward(x, g, 1, kernel, bias, activation, y, dy, dkernel, dbias, dx, accumulate);
  }

  /// `conv2d_forward`'s tiles, each group of a tile its own piece of work: a group's channels
  /// unfolded alone and multiplied by its own columns of the kernel (`groups` products of
  /// `1 / groups` the size each), the pieces split over the threads.
  bool grouped_conv2d_forward(const Tensor<float>& x, const Conv2DGeometry& g, std::size_t groups,
                              const Tensor<float>& kernel, const Tensor<float>& bias,
                              Activation activation, const Tensor<float>& y) override {
    convolution_forward(x, g, groups, kernel, bias, activation, y);
    return true;
  }

  /// `conv2d_backward`'s chunks of tiles, each group of a chunk its own piece of work (its own
  /// columns of the chunk's partial kernel gradient, of the tiles' bias sums and its own channels
  /// of the input gradient); with a softmax, `false` (the layer's per-group path then).
  bool grouped_conv2d_backward(const Tensor<float>& x, const Conv2DGeometry& g, std::size_t groups,
                               const Tensor<float>& kernel, const Tensor<float>& bias,
                               Activation activation, const Tensor<float>& y,
                               const Tensor<float>& dy, const Tensor<float>& dkernel,
                               const Tensor<float>& dbias, const Tensor<float>& dx,
                               bool accumulate) override {
    if (activation == Activation::softmax) return false;
    convolution_backward(x, g, groups, kernel, bias, activation, y, dy, dkernel, dbias, dx,
                         accumulate);
    return true;
  }

  /// Split by output rows (each thread writes its own rows), at least about 2^15 multiply-adds a
  /// chunk.
  void depthwise_forward(const Tensor<float>& x, const Conv2DGeometry& g,
                         const Tensor<float>& kernel, const Tensor<float>& bias,
                         const Tensor<float>& z) override {
    LOADSTAR_ASSERT(x.size() == g.batch * g.in_h * g.in_w * g.in_c &&
                        z.size() == g.batch * g.out_h * g.out_w * g.out_c &&
                        kernel.size() == g.kernel_h * g.kernel_w * g.out_c,
                    "depthwise_forward: shapes do not fit");
    const std::size_t row_work =
        std::max<std::size_t>(g.out_w * g.out_c * g.kernel_h * g.kernel_w, 1);
    const float* b = bias.empty() ? nullptr : bias.data();
    parallel(g.batch * g.out_h, std::max<std::size_t>(1, (std::size_t{1} << 15) / row_work),
             [&](std::size_t r0, std::size_t r1) {
               detail::depthwise_forward_rows(x.data(), g, kernel.data(), b, z.data(), r0, r1);
             });
  }

  /// Split by images: `depthwise_parts(batch)` fixed groups of images, each writing its images'
  /// `dx` and its own partial sums of the kernel's and the bias's gradients, which are then added
  /// in group order: the results do not depend on the thread count.
  void depthwise_backward(const Tensor<float>& x, const Conv2DGeometry& g,
                          const Tensor<float>& kernel, const Tensor<float>& dz,
                          const Tensor<float>& dx, const Tensor<float>& dkernel,
                          const Tensor<float>& dbias) override {
    const std::size_t taps = g.kernel_h * g.kernel_w * g.out_c;
    LOADSTAR_ASSERT(x.size() == g.batch * g.in_h * g.in_w * g.in_c &&
                        dz.size() == g.batch * g.out_h * g.out_w * g.out_c &&
                        kernel.size() == taps && (dx.empty() || dx.size() == x.size()) &&
                        (dkernel.empty() || dkernel.size() == taps) &&
                        (dbias.empty() || dbias.size() == g.out_c),
                    "depthwise_backward: shapes do not fit");
    const std::size_t parts = std::min<std::size_t>(g.batch, 16);
    const std::size_t part_size = taps + g.out_c;
    if (!dkernel.empty() || !dbias.empty()) depthwise_partials_.resize(parts * part_size);
    parallel(parts, 1, [&](std::size_t p0, std::size_t p1) {
      for (std::size_t p = p0; p < p1; ++p) {
        float* partial = depthwise_partials_.data() + p * part_size;
        detail::depthwise_backward_images(
            x.data(), g, kernel.data(), dz.data(), dx.empty() ? nullptr : dx.data(),
            dkernel.empty() ? nullptr : partial, dbias.empty() ? nullptr : partial + taps,
            g.batch * p / parts, g.batch * (p + 1) / parts, false);
      }
    });
    const auto add_parts = [&](float* out, std::size_t offset, std::size_t n) {
      for (std::size_t p = 0; p < parts; ++p) {
        const float* partial = depthwise_partials_.data() + p * part_size + offset;
        for (std::size_t i = 0; i < n; ++i)
          out[i] += partial[i];
      }
    };
    if (!dkernel.empty()) add_parts(dkernel.data(), 0, taps);
    if (!dbias.empty()) add_parts(dbias.data(), taps, g.out_c);
  }

  void max_pool_forward(const Tensor<float>& x, const Pool2DGeometry& g,
                        const Tensor<float>& y) override {
    pool_pixels(g, false, [&](const PoolWindow& w) {
      const WindowOffsets offsets(w);
      detail::max_pool_window(x.data(), offsets.data(), offsets.size(), y.data() + w.out,
                              g.channels);
    });
  }

  void max_pool_backward(const Tensor<float>& x, const Pool2DGeometry& g, const Tensor<float>& dy,
                         const Tensor<float>& dx) override {
    zero_images(dx, g.batch);
    pool_pixels(g, /*by_image=*/true, [&](const PoolWindow& w) {
      const WindowOffsets offsets(w);
      if (offsets.size() == 0) return;
      detail::max_pool_route(x.data(), offsets.data(), offsets.size(), dy.data() + w.out, dx.data(),
                             g.channels);
    });
  }

  void avg_pool_forward(const Tensor<float>& x, const Pool2DGeometry& g,
                        const Tensor<float>& y) override {
    pool_windows(g, [&](std::size_t out_index, std::size_t c, auto&& window) {
      float sum = 0.0F;
      std::size_t count = 0;
      window([&](std::size_t in_index) {
        sum += x.data()[in_index + c];
        ++count;
      });
      y.data()[out_index + c] = sum / static_cast<float>(count);
    });
  }

  void avg_pool_backward(const Pool2DGeometry& g, const Tensor<float>& dy,
                         const Tensor<float>& dx) override {
    zero_images(dx, g.batch);
    pool_windows(
        g,
        [&](std::size_t out_index, std::size_t c, auto&& window) {
          std::size_t count = 0;
          window([&](std::size_t) { ++count; });
          const float share = dy.data()[out_index + c] / static_cast<float>(count);
          window([&](std::size_t in_index) { dx.data()[in_index + c] += share; });
        },
        /*by_image=*/true);
  }

  void global_pool_forward(const Tensor<float>& x, bool max, const Tensor<float>& y) override {
    const std::size_t batch = x.rows();
    const std::size_t channels = x.shape()[x.rank() - 1];
    const std::size_t pixels = x.row_size() / channels;
    parallel(batch * channels, 16, [&](std::size_t i0, std::size_t i1) {
      for (std::size_t i = i0; i < i1; ++i) {
        const float* in = x.data() + (i / channels) * pixels * channels + i % channels;
        float acc = max ? -std::numeric_limits<float>::infinity() : 0.0F;
        for (std::size_t p = 0; p < pixels; ++p)
          acc = max ? std::max(acc, in[p * channels]) : acc + in[p * channels];
        y.data()[i] = max ? acc : acc / static_cast<float>(pixels);
      }
    });
  }

  void global_pool_backward(const Tensor<float>& x, bool max, const Tensor<float>& dy,
                            const Tensor<float>& dx) override {
    const std::size_t batch = x.rows();
    const std::size_t channels = x.shape()[x.rank() - 1];
    const std::size_t pixels = x.row_size() / channels;
    parallel(batch * channels, 16, [&](std::size_t i0, std::size_t i1) {
      for (std::size_t i = i0; i < i1; ++i) {
        const std::size_t base = (i / channels) * pixels * channels + i % channels;
        if (max) {
          std::size_t arg = 0;
          for (std::size_t p = 0; p < pixels; ++p) {
            dx.data()[base + p * channels] = 0.0F;
            if (x.data()[base + p * channels] > x.data()[base + arg * channels]) arg = p;
          }
          dx.data()[base + arg * channels] = dy.data()[i];
        } else {
          const float share = dy.data()[i] / static_cast<float>(pixels);
          for (std::size_t p = 0; p < pixels; ++p)
            dx.data()[base + p * channels] = share;
        }
      }
    });
  }

  void moments(const Tensor<float>& x, const Tensor<float>& mean,
               const Tensor<float>& variance) override {
    const std::size_t c = mean.size();
    const std::size_t n = x.size() / c;
    // Each channel is summed row after row (the same order on any thread count), a block of
    // channels at a time, so that the rows are read along their contiguous channels.
    channel_blocks(c, [&](std::size_t j0, std::size_t j1) {
      double sums[channel_block] = {}, squares[channel_block] = {}, means[channel_block];
      const std::size_t width = j1 - j0;
      for (std::size_t r = 0; r < n; ++r) {
        const float* row = x.data() + r * c + j0;
        for (std::size_t j = 0; j < width; ++j)
          sums[j] += row[j];
      }
      for (std::size_t j = 0; j < width; ++j)
        means[j] = sums[j] / static_cast<double>(n);
      for (std::size_t r = 0; r < n; ++r) {
        const float* row = x.data() + r * c + j0;
        for (std::size_t j = 0; j < width; ++j)
          squares[j] += detail::squared_deviation(row[j], means[j]);
      }
      for (std::size_t j = 0; j < width; ++j) {
        mean.data()[j0 + j] = static_cast<float>(means[j]);
        variance.data()[j0 + j] = static_cast<float>(squares[j] / static_cast<double>(n));
      }
    });
  }

  void batch_norm_forward(const Tensor<float>& x, const Tensor<float>& mean,
                          const Tensor<float>& variance, const Tensor<float>& gamma,
                          const Tensor<float>& beta, float epsilon,
                          const Tensor<float>& y) override {
    const std::size_t c = mean.size();
    const std::size_t n = x.size() / c;
    // detail::batch_norm_value with its per-channel scale computed once per block of channels
    // (the same operations, so the same bits), vectorized along the channels.
    parallel(n, 64, [&](std::size_t r0, std::size_t r1) {
      for (std::size_t j0 = 0; j0 < c; j0 += channel_block) {
        const std::size_t width = std::min(c - j0, channel_block);
        float m[channel_block], inv[channel_block], g[channel_block], b[channel_block];
        for (std::size_t j = 0; j < width; ++j) {
          m[j] = mean.data()[j0 + j];
          inv[j] = 1.0F / ::sqrtf(variance.data()[j0 + j] + epsilon);
          g[j] = gamma.empty() ? 1.0F : gamma.data()[j0 + j];
          b[j] = beta.empty() ? 0.0F : beta.data()[j0 + j];
        }
        for (std::size_t r = r0; r < r1; ++r) {
          const float* in = x.data() + r * c + j0;
          float* out = y.data() + r * c + j0;
          for (std::size_t j = 0; j < width; ++j)
            out[j] = (in[j] - m[j]) * inv[j] * g[j] + b[j];
        }
      }
    });
  }

  void batch_norm_backward(const Tensor<float>& x, const Tensor<float>& mean,
                           const Tensor<float>& variance, const Tensor<float>& gamma, float epsilon,
                           bool training, const Tensor<float>& dy, const Tensor<float>& dx,
                           const Tensor<float>& dgamma, const Tensor<float>& dbeta) override {
    const std::size_t c = mean.size();
    const std::size_t n = x.size() / c;
    if (sums_.size() < 2 * c) sums_.resize(2 * c);  // grows once, then reused
    double* sum_dy = sums_.data();
    double* sum_dy_xhat = sums_.data() + c;
    // Row after row for each channel, a block of channels at a time (as `moments`).
    channel_blocks(c, [&](std::size_t j0, std::size_t j1) {
      double a[channel_block] = {}, b[channel_block] = {}, inv[channel_block];
      const std::size_t width = j1 - j0;
      const float* m = mean.data() + j0;
      for (std::size_t j = 0; j < width; ++j)
        inv[j] = detail::batch_norm_inverse_std(variance.data()[j0 + j], epsilon);
      for (std::size_t r = 0; r < n; ++r) {
        const float* d = dy.data() + r * c + j0;
        const float* row = x.data() + r * c + j0;
        for (std::size_t j = 0; j < width; ++j) {
          a[j] += d[j];
          b[j] += detail::batch_norm_dy_xhat(row[j], m[j], d[j], inv[j]);
        }
      }
      for (std::size_t j = 0; j < width; ++j) {
        sum_dy[j0 + j] = a[j];
        sum_dy_xhat[j0 + j] = b[j];
        if (!dbeta.empty()) dbeta.data()[j0 + j] += static_cast<float>(a[j]);
        if (!dgamma.empty()) dgamma.data()[j0 + j] += static_cast<float>(b[j]);
      }
    });
    if (dx.empty()) return;
    // detail::batch_norm_gradient with its per-channel terms computed once per block of channels
    // (the same operations, so the same bits), vectorized along the channels.
    const double count = static_cast<double>(n);
    parallel(n, 64, [&](std::size_t r0, std::size_t r1) {
      for (std::size_t j0 = 0; j0 < c; j0 += channel_block) {
        const std::size_t width = std::min(c - j0, channel_block);
        float m[channel_block];
        double inv[channel_block], scale[channel_block], mean_dy[channel_block],
            sums[channel_block];
        for (std::size_t j = 0; j < width; ++j) {
          m[j] = mean.data()[j0 + j];
          inv[j] = detail::batch_norm_inverse_std(variance.data()[j0 + j], epsilon);
          scale[j] = (gamma.empty() ? 1.0 : double(gamma.data()[j0 + j])) * inv[j];
          mean_dy[j] = sum_dy[j0 + j] / count;
          sums[j] = sum_dy_xhat[j0 + j];
        }
        for (std::size_t r = r0; r < r1; ++r) {
          const float* in = x.data() + r * c + j0;
          const float* d = dy.data() + r * c + j0;
          float* out = dx.data() + r * c + j0;
          if (!training) {
            for (std::size_t j = 0; j < width; ++j)
              out[j] = static_cast<float>(scale[j] * double(d[j]));
            continue;
          }
          for (std::size_t j = 0; j < width; ++j) {
            const double xhat = (in[j] - m[j]) * inv[j];
            out[j] =
                static_cast<float>(scale[j] * (double(d[j]) - mean_dy[j] - xhat * sums[j] / count));
          }
        }
      }
    });
  }

  void moving_average(const Tensor<float>& moving, const Tensor<float>& value,
                      float momentum) override {
    elementwise(moving.size(), [&](std::size_t i) {
      moving.data()[i] = detail::moving_average_value(moving.data()[i], value.data()[i], momentum);
    });
  }

  std::optional<BadIndex> gather(const Tensor<float>& indices, const Tensor<float>& table,
                                 const Tensor<float>& out) override {
    const std::size_t rows = table.rows();
    const std::size_t width = table.row_size();
    for (std::size_t i = 0; i < indices.size(); ++i) {
      const float v = indices.data()[i];
      // tf.cast truncates toward zero; NaN and anything outside [0, rows) is rejected.
      if (!detail::index_in_range(v, rows)) return BadIndex{i, v};
    }
    parallel(indices.size(), 64, [&](std::size_t i0, std::size_t i1) {
      for (std::size_t i = i0; i < i1; ++i) {
        const auto row = static_cast<std::size_t>(indices.data()[i]);
        std::memcpy(out.data() + i * width, table.data() + row * width, width * sizeof(float));
      }
    });
    return std::nullopt;
  }

  void scatter_add(const Tensor<float>& indices, const Tensor<float>& dy,
                   const Tensor<float>& table_gradient) override {
    const std::size_t width = table_gradient.row_size();
    // Split by columns: every element's sum runs over the indices in order, on any thread count.
    parallel(width, 8, [&](std::size_t c0, std::size_t c1) {
      for (std::size_t i = 0; i < indices.size(); ++i) {
        const auto row = static_cast<std::size_t>(indices.data()[i]);
        for (std::size_t c = c0; c < c1; ++c)
          table_gradient.data()[row * width + c] += dy.data()[i * width + c];
      }
    });
  }

  void concatenate(std::span<const Tensor<float>> parts, std::size_t axis,
                   const Tensor<float>& out) override {
    const std::size_t outer = detail::axis_view(out.shape(), axis).outer;
    const std::size_t out_inner = out.size() / std::max<std::size_t>(outer, 1);
    parallel(outer, 16, [&](std::size_t o0, std::size_t o1) {
      for (std::size_t o = o0; o < o1; ++o) {
        std::size_t offset = 0;
        for (const auto& part : parts) {
          const std::size_t inner = part.size() / outer;
          std::memcpy(out.data() + o * out_inner + offset, part.data() + o * inner,
                      inner * sizeof(float));
          offset += inner;
        }
      }
    });
  }

  void split(const Tensor<float>& x, std::size_t axis, std::span<const std::size_t> extents,
             std::span<const Tensor<float>> parts) override {
    const auto v = detail::axis_view(x.shape(), axis);
    const std::size_t x_inner = v.length * v.inner;
    parallel(v.outer, 16, [&](std::size_t o0, std::size_t o1) {
      for (std::size_t o = o0; o < o1; ++o) {
        std::size_t offset = 0;
        for (std::size_t p = 0; p < parts.size(); ++p) {
          const std::size_t inner = extents[p] * v.inner;
          if (!parts[p].empty()) {
            std::memcpy(parts[p].data() + o * inner, x.data() + o * x_inner + offset,
                        inner * sizeof(float));
          }
          offset += inner;
        }
      }
    });
  }

  void permute(const Tensor<float>& x, std::span<const std::size_t> axes,
               const Tensor<float>& y) override {
    LOADSTAR_ASSERT(axes.size() == x.rank() && x.rank() == y.rank() && x.size() == y.size(),
                    "permute: shapes and axes do not fit");
    const std::size_t rows = y.rank() == 0 ? 0 : y.shape()[0];
    const std::size_t row = rows == 0 ? 0 : y.size() / rows;
    parallel(rows, std::max<std::size_t>(1, 4096 / std::max<std::size_t>(row, 1)),
             [&](std::size_t r0, std::size_t r1) { detail::permute_rows(x, axes, y, r0, r1); });
  }

 private:
  /// The convolution kernels' tiles: `count` tiles of `images` images (the last may hold
  /// fewer), each unfolding to about 128 KiB at most (one image at least).
  struct ConvTiles {
    std::size_t images = 1, count = 0;
  };
  static ConvTiles conv_tiles(const Conv2DGeometry& g) noexcept {
    const std::size_t image = std::max<std::size_t>(g.out_h * g.out_w * g.patch_size(), 1);
    ConvTiles tiles;
    tiles.images = std::clamp<std::size_t>((std::size_t{1} << 15) / image, 1,
                                           std::max<std::size_t>(g.batch, 1));
    tiles.count = (g.batch + tiles.images - 1) / tiles.images;
    return tiles;
  }

  /// `conv2d_forward` of a convolution in `groups` groups (1: an ordinary one): the pieces of
  /// work are `(tile, group)` pairs, each a group's `in_c / groups` channels of the tile's images
  /// unfolded and multiplied by the group's `filters / groups` columns of `kernel` into its
  /// columns of `y`.
  void convolution_forward(const Tensor<float>& x, const Conv2DGeometry& g, std::size_t groups,
                           const Tensor<float>& kernel, const Tensor<float>& bias,
                           Activation activation, const Tensor<float>& y) {
    const std::size_t channels = g.in_c / groups;
    const std::size_t filters = kernel.row_size();
    const std::size_t group_filters = filters / groups;
    Conv2DGeometry group = g;
    group.in_c = channels;
    const std::size_t patch = group.patch_size();
    const std::size_t per_image = g.out_h * g.out_w;
    LOADSTAR_ASSERT(groups > 0 && channels * groups == g.in_c &&
                        group_filters * groups == filters && kernel.rows() == patch &&
                        y.size() == g.batch * per_image * filters,
                    "conv2d_forward: shapes do not fit");
    const ConvTiles tiles = conv_tiles(group);
    const bool pointwise = is_pointwise(g);
    const std::size_t ld_columns = pointwise ? g.in_c : patch;
    parallel(tiles.count * groups, 1, [&](std::size_t i0, std::size_t i1) {
      float* buffer =
          pointwise ? nullptr : detail::thread_buffer(0, tiles.images * per_image * patch);
      for (std::size_t item = i0; item < i1; ++item) {
        const std::size_t t = item / groups;
        const std::size_t first_channel = item % groups * channels;
        const std::size_t first_filter = item % groups * group_filters;
        const std::size_t b0 = t * tiles.images;
        const std::size_t b1 = std::min(g.batch, b0 + tiles.images);
        const std::size_t rows = (b1 - b0) * per_image;
        // A pointwise convolution's unfolded rows are the input's pixels themselves.
        const float* columns =
            pointwise ? x.data() + b0 * per_image * g.in_c + first_channel : buffer;
        if (!pointwise)
          im2col_lines(x.data(), g, b0 * g.out_h, b1 * g.out_h, buffer, first_channel, channels);
        float* z = y.data() + b0 * per_image * filters + first_filter;
        pre_activation(columns, ld_columns, rows, kernel.data() + first_filter, patch,
                       group_filters, filters, bias.empty() ? nullptr : bias.data() + first_filter,
                       z, filters);
        if (activation == Activation::linear || activation == Activation::softmax) continue;
        if (groups == 1) {
          detail::activate_range(activation, z, z, rows * filters);
        } else {
          for (std::size_t r = 0; r < rows; ++r)
            detail::activate_range(activation, z + r * filters, z + r * filters, group_filters);
        }
      }
    });
    if (activation == Activation::softmax) activation_forward(activation, y, y);
  }

  /// `conv2d_backward` of a convolution in `groups` groups (1: an ordinary one), not a softmax:
  /// the pieces of work are `(chunk of tiles, group)` pairs, each adding into the group's columns
  /// of the chunk's partial kernel gradient and of its tiles' bias sums, and writing the group's
  /// channels of its tiles' input gradient.
  void convolution_backward(const Tensor<float>& x, const Conv2DGeometry& g, std::size_t groups,
                            const Tensor<float>& kernel, const Tensor<float>& bias,
                            Activation activation, const Tensor<float>& y, const Tensor<float>& dy,
                            const Tensor<float>& dkernel, const Tensor<float>& dbias,
                            const Tensor<float>& dx, bool accumulate) {
    const std::size_t channels = g.in_c / groups;
    const std::size_t filters = kernel.row_size();
    const std::size_t group_filters = filters / groups;
    Conv2DGeometry group = g;
    group.in_c = channels;
    const std::size_t patch = group.patch_size();
    const std::size_t per_image = g.out_h * g.out_w;
    LOADSTAR_ASSERT(groups > 0 && channels * groups == g.in_c &&
                        group_filters * groups == filters && kernel.rows() == patch &&
                        dy.size() == g.batch * per_image * filters &&
                        dkernel.size() == kernel.size(),
                    "conv2d_backward: shapes do not fit");
    const bool needs_z = activation_gradient_needs_input(activation);
    const ConvTiles tiles = conv_tiles(group);
    const std::size_t chunks = std::min(threads_, tiles.count);
    kernel_partials_.assign(chunks * patch * filters, 0.0F);
    tile_sums_.assign(dbias.empty() ? 0 : tiles.count * filters, 0.0);
    const std::size_t tile_rows = tiles.images * per_image;
    const bool pointwise = is_pointwise(g);
    const std::size_t ld_columns = pointwise ? g.in_c : patch;
    parallel(chunks * groups, 1, [&](std::size_t i0, std::size_t i1) {
      float* buffer = pointwise ? nullptr : detail::thread_buffer(0, tile_rows * patch);
      float* gradient = detail::thread_buffer(1, tile_rows * group_filters);
      float* z = needs_z ? detail::thread_buffer(2, tile_rows * group_filters) : nullptr;
      for (std::size_t item = i0; item < i1; ++item) {
        const std::size_t chunk = item / groups;
        const std::size_t first_channel = item % groups * channels;
        const std::size_t first_filter = item % groups * group_filters;
        const float* group_kernel = kernel.data() + first_filter;
        float* partial = kernel_partials_.data() + chunk * patch * filters + first_filter;
        for (std::size_t t = tiles.count * chunk / chunks; t < tiles.count * (chunk + 1) / chunks;
             ++t) {
          const std::size_t b0 = t * tiles.images;
          const std::size_t b1 = std::min(g.batch, b0 + tiles.images);
          const std::size_t rows = (b1 - b0) * per_image;
          const std::size_t offset = b0 * per_image * filters + first_filter;
          // A pointwise convolution's unfolded rows are the input's pixels, and the input's
          // gradient is written in place.
          const float* columns =
              pointwise ? x.data() + b0 * per_image * g.in_c + first_channel : buffer;
          if (!pointwise)
            im2col_lines(x.data(), g, b0 * g.out_h, b1 * g.out_h, buffer, first_channel, channels);
          const float* dz = dy.data() + offset;
          std::size_t ld_dz = filters;
          if (activation != Activation::linear) {
            if (needs_z)
              pre_activation(columns, ld_columns, rows, group_kernel, patch, group_filters, filters,
                             bias.empty() ? nullptr : bias.data() + first_filter, z, group_filters);
            if (groups == 1) {
              detail::activation_gradient_range(activation, z, y.data() + offset, dz, gradient,
                                                rows * filters);
            } else {
              for (std::size_t r = 0; r < rows; ++r)
                detail::activation_gradient_range(activation,
                                                  needs_z ? z + r * group_filters : nullptr,
                                                  y.data() + offset + r * filters, dz + r * filters,
                                                  gradient + r * group_filters, group_filters);
            }
            dz = gradient;
            ld_dz = group_filters;
          }
          detail::sgemm(true, false, patch, group_filters, rows, 1.0F, columns, ld_columns, dz,
                        ld_dz, 1.0F, partial, filters);
          if (!dbias.empty()) {
            double* sums = tile_sums_.data() + t * filters + first_filter;
            for (std::size_t r = 0; r < rows; ++r)
              for (std::size_t j = 0; j < group_filters; ++j)
                sums[j] += dz[r * ld_dz + j];
          }
          if (!dx.empty() && pointwise) {
            detail::sgemm(false, true, rows, patch, group_filters, 1.0F, dz, ld_dz, group_kernel,
                          filters, 0.0F, dx.data() + b0 * per_image * g.in_c + first_channel,
                          g.in_c);
          } else if (!dx.empty()) {
            detail::sgemm(false, true, rows, patch, group_filters, 1.0F, dz, ld_dz, group_kernel,
                          filters, 0.0F, buffer, patch);
            col2im_images(buffer, g, b0, b1, dx.data(), first_channel, channels);
          }
        }
      }
    });
    // Written: the first partial sum is copied (the bits of adding it to zeros).
    if (!accumulate) {
      if (chunks == 0)
        std::fill_n(dkernel.data(), patch * filters, 0.0F);
      else
        std::copy_n(kernel_partials_.data(), patch * filters, dkernel.data());
    }
    for (std::size_t chunk = accumulate ? 0 : 1; chunk < chunks; ++chunk) {
      const float* partial = kernel_partials_.data() + chunk * patch * filters;
      for (std::size_t i = 0; i < patch * filters; ++i)
        dkernel.data()[i] += partial[i];
    }
    if (!dbias.empty()) {
      for (std::size_t j = 0; j < filters; ++j) {
        double sum = 0.0;
        for (std::size_t t = 0; t < tiles.count; ++t)
          sum += tile_sums_[t * filters + j];
        dbias.data()[j] = static_cast<float>(accumulate ? dbias.data()[j] + sum : sum);
      }
    }
  }

  /// The channels a block of `channel_blocks` holds.
  static constexpr std::size_t channel_block = 64;

  /// Calls `f(j0, j1)` on blocks of at most `channel_block` of `[0, c)` channels, split over the
  /// threads (at least 4 channels a chunk) as `parallel` splits them: a reduction over the rows
  /// of each channel in a block reads each row's channels `[j0, j1)` together.
  template <class F>
  void channel_blocks(std::size_t c, F&& f) {
    parallel(c, 4, [&](std::size_t c0, std::size_t c1) {
      for (std::size_t j0 = c0; j0 < c1; j0 += channel_block)
        f(j0, std::min(c1, j0 + channel_block));
    });
  }

  /// Whether `g` is a pointwise convolution (1x1, stride 1, no padding), whose im2col is the
  /// input itself.
  static bool is_pointwise(const Conv2DGeometry& g) noexcept {
    return g.kernel_h == 1 && g.kernel_w == 1 && g.stride_h == 1 && g.stride_w == 1 &&
           g.pad_top == 0 && g.pad_left == 0 && g.out_h == g.in_h && g.out_w == g.in_w;
  }

  /// A tile's pre-activation: `z = columns * kernel + bias` for `rows` unfolded rows of `patch`
  /// values (row stride `ld_columns`) and `filters` columns of the kernel (row stride
  /// `ld_kernel`) and of `z` (row stride `ld_z`); a null `bias` adds nothing.
  static void pre_activation(const float* columns, std::size_t ld_columns, std::size_t rows,
                             const float* kernel, std::size_t patch, std::size_t filters,
                             std::size_t ld_kernel, const float* bias, float* z, std::size_t ld_z) {
    detail::sgemm(false, false, rows, filters, patch, 1.0F, columns, ld_columns, kernel, ld_kernel,
                  0.0F, z, ld_z);
    if (bias == nullptr) return;
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t j = 0; j < filters; ++j)
        z[r * ld_z + j] += bias[j];
  }

  /// im2col of output lines `[l0, l1)` (a line is `(b, oh)`) into `columns`, which points at
  /// line `l0`'s first row, of the input channels `[first_channel, first_channel + channels)`
  /// (a group's; every channel by default): rows of `kernel_h * kernel_w * channels` values. For
  /// each kernel tap (kh, kw), the pixels of a line's out_w rows are consecutive in the input row
  /// (stride_w apart), so the copies are loops over (ow, c) rather than a call per pixel; taps in
  /// the padding are zeros.
  static void im2col_lines(const float* x, const Conv2DGeometry& g, std::size_t l0, std::size_t l1,
                           float* columns, std::size_t first_channel = 0,
                           std::size_t channels = 0) {
    if (channels == 0) channels = g.in_c;
    const std::size_t patch = g.kernel_h * g.kernel_w * channels;
    for (std::size_t line = l0; line < l1; ++line) {
      const std::size_t b = line / g.out_h;
      const std::size_t oh = line % g.out_h;
      float* block = columns + (line - l0) * g.out_w * patch;
      for (std::size_t kh = 0; kh < g.kernel_h; ++kh) {
        const auto ih = static_cast<std::ptrdiff_t>(oh * g.stride_h + kh * g.dilation_h) -
                        static_cast<std::ptrdiff_t>(g.pad_top);
        const bool row_inside = ih >= 0 && std::size_t(ih) < g.in_h;
        const float* in_row =
            row_inside ? x + (b * g.in_h + std::size_t(ih)) * g.in_w * g.in_c + first_channel
                       : nullptr;
        for (std::size_t kw = 0; kw < g.kernel_w; ++kw) {
          float* out = block + (kh * g.kernel_w + kw) * channels;
          // The columns ow with iw = ow * stride_w + kw * dilation_w - pad_left inside the row.
          const auto shift = static_cast<std::ptrdiff_t>(kw * g.dilation_w) -
                             static_cast<std::ptrdiff_t>(g.pad_left);
          std::size_t first = 0, last = 0;
          if (row_inside) {
            const auto sw = static_cast<std::ptrdiff_t>(g.stride_w);
            const auto in_w = static_cast<std::ptrdiff_t>(g.in_w);
            const std::ptrdiff_t lo = shift >= 0 ? 0 : (-shift + sw - 1) / sw;
            const std::ptrdiff_t hi = in_w - shift <= 0 ? 0 : (in_w - shift + sw - 1) / sw;
            first = static_cast<std::size_t>(
                std::min<std::ptrdiff_t>(lo, static_cast<std::ptrdiff_t>(g.out_w)));
            last = std::clamp<std::size_t>(
                static_cast<std::size_t>(std::max<std::ptrdiff_t>(hi, 0)), first, g.out_w);
          }
          for (std::size_t ow = 0; ow < first; ++ow)
            std::fill_n(out + ow * patch, channels, 0.0F);
          for (std::size_t ow = first; ow < last; ++ow) {
            const float* in = in_row + static_cast<std::size_t>(
                                           static_cast<std::ptrdiff_t>(ow * g.stride_w) + shift) *
                                           g.in_c;
            float* to = out + ow * patch;
            for (std::size_t c = 0; c < channels; ++c)
              to[c] = in[c];
          }
          for (std::size_t ow = last; ow < g.out_w; ++ow)
            std::fill_n(out + ow * patch, channels, 0.0F);
        }
      }
    }
  }

  /// col2im of images `[b0, b1)` for the input channels `[first_channel, first_channel +
  /// channels)` (a group's; every channel by default): those channels of `dx`'s images are zeroed,
  /// then every element of `columns` (pointing at image `b0`'s first row, rows of
  /// `kernel_h * kernel_w * channels` values) is added to its pixel, rows in order.
  static void col2im_images(const float* columns, const Conv2DGeometry& g, std::size_t b0,
                            std::size_t b1, float* dx, std::size_t first_channel = 0,
                            std::size_t channels = 0) {
    if (channels == 0) channels = g.in_c;
    const std::size_t patch = g.kernel_h * g.kernel_w * channels;
    const std::size_t per_image = g.out_h * g.out_w;
    if (channels == g.in_c) {
      std::fill(dx + b0 * g.in_h * g.in_w * g.in_c, dx + b1 * g.in_h * g.in_w * g.in_c, 0.0F);
    } else {
      for (std::size_t p = b0 * g.in_h * g.in_w; p < b1 * g.in_h * g.in_w; ++p)
        std::fill_n(dx + p * g.in_c + first_channel, channels, 0.0F);
    }
    for (std::size_t r = b0 * per_image; r < b1 * per_image; ++r) {
      const std::size_t b = r / per_image;
      const std::size_t oh = (r / g.out_w) % g.out_h;
      const std::size_t ow = r % g.out_w;
      const float* in = columns + (r - b0 * per_image) * patch;
      for (std::size_t kh = 0; kh < g.kernel_h; ++kh) {
        const auto ih = static_cast<std::ptrdiff_t>(oh * g.stride_h + kh * g.dilation_h) -
                        static_cast<std::ptrdiff_t>(g.pad_top);
        for (std::size_t kw = 0; kw < g.kernel_w; ++kw, in += channels) {
          const auto iw = static_cast<std::ptrdiff_t>(ow * g.stride_w + kw * g.dilation_w) -
                          static_cast<std::ptrdiff_t>(g.pad_left);
          if (ih < 0 || iw < 0 || std::size_t(ih) >= g.in_h || std::size_t(iw) >= g.in_w) continue;
          float* out = dx + ((b * g.in_h + std::size_t(ih)) * g.in_w + std::size_t(iw)) * g.in_c +
                       first_channel;
          for (std::size_t c = 0; c < channels; ++c)
            out[c] += in[c];
        }
      }
    }
  }

  /// The fewest elements an elementwise kernel gives a thread: waking a thread costs about as
  /// much as streaming this many floats through memory (tens of microseconds in a virtual
  /// machine), so smaller kernels run on the calling thread.
  static constexpr std::size_t elementwise_chunk = std::size_t{1} << 17;

  /// Calls `f(begin, end)` on a fixed split of `[0, n)` into at most `threads_` chunks of at
  /// least `min_chunk` elements; the split depends only on `n`, `min_chunk` and `threads_`.
  template <class F>
  void parallel(std::size_t n, std::size_t min_chunk, F&& f) {
    const std::size_t chunks = std::min(threads_, std::max<std::size_t>(1, n / min_chunk));
    if (chunks <= 1) {
      if (n > 0) f(std::size_t{0}, n);
      return;
    }
    arena_.execute([&] {
      tbb::parallel_for(
          tbb::blocked_range<std::size_t>(0, chunks, 1),
          [&](const tbb::blocked_range<std::size_t>& range) {
            // The worker threads compute as the caller does (see ScopedFlushDenormal).
            const detail::ScopedFlushDenormal flush_denormal;
            for (std::size_t i = range.begin(); i != range.end(); ++i)
              f(n * i / chunks, n * (i + 1) / chunks);
          },
          tbb::simple_partitioner());
    });
  }

  template <class F>
  void elementwise(std::size_t n, F&& f) {
    parallel(n, elementwise_chunk, [&](std::size_t i0, std::size_t i1) {
      for (std::size_t i = i0; i < i1; ++i)
        f(i);
    });
  }

  void zero_images(const Tensor<float>& dx, std::size_t batch) {
    const std::size_t per_image = batch == 0 ? 0 : dx.size() / batch;
    parallel(batch, 1, [&](std::size_t b0, std::size_t b1) {
      std::fill(dx.data() + b0 * per_image, dx.data() + b1 * per_image, 0.0F);
    });
  }

  /// One output pixel of a pooling: `out` indexes its channel 0 in the output, and the window's
  /// pixels inside the input are rows `[h_begin, h_end)` and columns `[w_begin, w_end)` of image
  /// `b`.
  struct PoolWindow {
    std::size_t out, b, h_begin, h_end, w_begin, w_end;
    const Pool2DGeometry* g;
    /// The input index of channel 0 of pixel `(ih, iw)` of image `b`.
    std::size_t pixel(std::size_t ih, std::size_t iw) const noexcept {
      return ((b * g->in_h + ih) * g->in_w + iw) * g->channels;
    }
  };

  /// The input offset of each position of a window, in window order (row by row).
  class WindowOffsets {
   public:
    explicit WindowOffsets(const PoolWindow& w) {
      const std::size_t width = w.w_end - w.w_begin;
      size_ = (w.h_end - w.h_begin) * width;
      if (size_ > std::size(small_)) {
        large_.resize(size_);
        data_ = large_.data();
      }
      for (std::size_t i = 0; i < size_; ++i)
        data_[i] = w.pixel(w.h_begin + i / width, w.w_begin + i % width);
    }
    WindowOffsets(const WindowOffsets&) = delete;
    WindowOffsets& operator=(const WindowOffsets&) = delete;
    const std::size_t* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return size_; }

   private:
    std::size_t small_[16];  // windows rarely hold more than a few pixels
    std::vector<std::size_t> large_;
    std::size_t* data_ = small_;
    std::size_t size_ = 0;
  };

  /// Calls `f(window)` for every output pixel; the kernel loops over the channels (contiguous in
  /// both tensors). With `by_image`, chunks are whole images, so that scattering into an image
  /// stays in one thread.
  template <class F>
  void pool_pixels(const Pool2DGeometry& g, bool by_image, F&& f) {
    auto rows = [&](std::size_t r0, std::size_t r1) {
      for (std::size_t r = r0; r < r1; ++r) {  // r = (b, oh)
        PoolWindow w{};
        w.g = &g;
        w.b = r / g.out_h;
        const std::size_t oh = r % g.out_h;
        const auto h0 =
            static_cast<std::ptrdiff_t>(oh * g.stride_h) - static_cast<std::ptrdiff_t>(g.pad_top);
        w.h_begin = static_cast<std::size_t>(std::max<std::ptrdiff_t>(h0, 0));
        w.h_end = static_cast<std::size_t>(std::clamp<std::ptrdiff_t>(
            h0 + static_cast<std::ptrdiff_t>(g.pool_h), 0, static_cast<std::ptrdiff_t>(g.in_h)));
        for (std::size_t ow = 0; ow < g.out_w; ++ow) {
          const auto w0 = static_cast<std::ptrdiff_t>(ow * g.stride_w) -
                          static_cast<std::ptrdiff_t>(g.pad_left);
          w.w_begin = static_cast<std::size_t>(std::max<std::ptrdiff_t>(w0, 0));
          w.w_end = static_cast<std::size_t>(std::clamp<std::ptrdiff_t>(
              w0 + static_cast<std::ptrdiff_t>(g.pool_w), 0, static_cast<std::ptrdiff_t>(g.in_w)));
          w.out = (r * g.out_w + ow) * g.channels;
          f(std::as_const(w));
        }
      }
    };
    if (by_image) {
      parallel(g.batch, 1,
               [&](std::size_t b0, std::size_t b1) { rows(b0 * g.out_h, b1 * g.out_h); });
    } else {
      parallel(g.batch * g.out_h, 4, rows);
    }
  }

  /// Visits every output element `(b, oh, ow, c)` with a `window(visit)` that calls
  /// `visit(in_index)` for the window's pixels inside the input (`in_index` of channel 0). With
  /// `by_image`, chunks are whole images, so that scattering into an image stays in one thread.
  template <class F>
  void pool_windows(const Pool2DGeometry& g, F&& f, bool by_image = false) {
    auto rows = [&](std::size_t r0, std::size_t r1) {
      for (std::size_t r = r0; r < r1; ++r) {  // r = (b, oh)
        const std::size_t b = r / g.out_h;
        const std::size_t oh = r % g.out_h;
        const auto h0 =
            static_cast<std::ptrdiff_t>(oh * g.stride_h) - static_cast<std::ptrdiff_t>(g.pad_top);
        const std::size_t h_begin = static_cast<std::size_t>(std::max<std::ptrdiff_t>(h0, 0));
        const std::size_t h_end = static_cast<std::size_t>(std::clamp<std::ptrdiff_t>(
            h0 + static_cast<std::ptrdiff_t>(g.pool_h), 0, static_cast<std::ptrdiff_t>(g.in_h)));
        for (std::size_t ow = 0; ow < g.out_w; ++ow) {
          const auto w0 = static_cast<std::ptrdiff_t>(ow * g.stride_w) -
                          static_cast<std::ptrdiff_t>(g.pad_left);
          const std::size_t w_begin = static_cast<std::size_t>(std::max<std::ptrdiff_t>(w0, 0));
          const std::size_t w_end = static_cast<std::size_t>(std::clamp<std::ptrdiff_t>(
              w0 + static_cast<std::ptrdiff_t>(g.pool_w), 0, static_cast<std::ptrdiff_t>(g.in_w)));
          const std::size_t out_index = ((b * g.out_h + oh) * g.out_w + ow) * g.channels;
          for (std::size_t c = 0; c < g.channels; ++c) {
            auto window = [&](auto&& visit) {
              for (std::size_t ih = h_begin; ih < h_end; ++ih)
                for (std::size_t iw = w_begin; iw < w_end; ++iw)
                  visit(((b * g.in_h + ih) * g.in_w + iw) * g.channels);
            };
            f(out_index, c, window);
          }
        }
      }
    };
    if (by_image) {
      parallel(g.batch, 1,
               [&](std::size_t b0, std::size_t b1) { rows(b0 * g.out_h, b1 * g.out_h); });
    } else {
      parallel(g.batch * g.out_h, 4, rows);
    }
  }

  std::size_t threads_;
  tbb::task_arena arena_;
  std::vector<double> sums_;
  /// conv2d_backward's partial sums: the kernel gradient per chunk, the bias gradient per tile.
  std::vector<float> kernel_partials_;
  /// `depthwise_backward`'s partial sums of each group of images (kernel, then bias).
  std::vector<float> depthwise_partials_;
  std::vector<double> tile_sums_;
};

#if LOADSTAR_KERAS_BODIES
std::shared_ptr<Backend> cpu_backend(std::size_t threads) {
  return std::make_shared<CpuBackend>(threads);
}

Backend& detail::host_backend() {
  static CpuBackend backend(1);
  return backend;
}
#endif

}  // namespace loadstar::keras

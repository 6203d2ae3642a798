/// \file
/// The kernels' operands made from the executor's types (optimizer steps, loss rows, activations,
/// convolution, pooling and permutation geometry), and how `host_kernel` stages device tensors
/// through the host. Internal to the CUDA backend.
#pragma once

#include "loadstar/config.hpp"  // first: says at once when the standard is older than C++20

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "loadstar/cuda/detail/kernels.hpp"
#include "loadstar/cuda/detail/math.hpp"
#include "loadstar/keras/activations.hpp"
#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::cuda::detail {

/// The kernels' operands of an optimizer step.
inline UpdateParams update_params(const keras::OptimizerStep& step) noexcept {
  UpdateParams p;
  static_cast<keras::UpdateOperands&>(p) = step;
  p.clip_value = step.clipping == keras::GradientClipping::by_value
                     ? static_cast<float>(step.clip_threshold)
                     : 0.0F;
  return p;
}

/// The rows of a row loss or a mean metric: one per last-axis row of `y_pred` (one per element
/// when `elementwise`), `true_size` labels each (`classes` unless `sparse`).
inline RowDims row_dims(const Tensor<float>& y_pred, bool sparse, bool elementwise) noexcept {
  RowDims d;
  d.classes = elementwise || y_pred.rank() < 2 ? 1 : y_pred.shape()[y_pred.rank() - 1];
  d.values = d.classes == 0 ? 0 : y_pred.size() / d.classes;
  d.true_size = sparse ? 1 : d.classes;
  d.per_row = y_pred.rows() == 0 ? 1 : d.values / y_pred.rows();
  if (d.per_row == 0) d.per_row = 1;
  return d;
}

static_assert(Shape::max_rank <= PermuteDims::max_rank,
              "PermuteDims must hold a tensor of the highest rank");

/// The kernels' view of `y = transpose(x, axes)`: for each axis of `y`, its size and the stride
/// of the axis of `x` it walks.
inline PermuteDims permute_dims(const Shape& x, std::span<const std::size_t> axes,
                                const Shape& y) noexcept {
  PermuteDims d;
  d.rank = x.rank();
  std::size_t x_strides[PermuteDims::max_rank] = {};
  std::size_t stride = 1;
  for (std::size_t i = d.rank; i-- > 0;) {
    x_strides[i] = stride;
    stride *= x[i];
  }
  for (std::size_t i = 0; i < d.rank; ++i) {
    d.out_dims[i] = y[i];
    d.in_strides[i] = x_strides[axes[i]];
  }
  return d;
}

/// A run of device memory staged through the host as one piece.
struct StagedBlock {
  float* begin;
  float* end;
  std::size_t offset;  // in floats, into the staging memory
  std::size_t floats() const noexcept { return static_cast<std::size_t>(end - begin); }
};

/// How `host_kernel` stages device tensors: the memory they cover, with overlapping tensors (a
/// tensor and a view of it) merged into one block, so that their host views overlap as the
/// tensors do and writes through one are seen through the other. Each staged address has the
/// device address's offset from a `LOADSTAR_TENSOR_ALIGNMENT` boundary (the staging memory is
/// page-aligned), so a tensor that starts a device allocation is as aligned on the host as a host
/// tensor is, for the Eigen maps that assume it (`as_matrix`).
struct StagingPlan {
  std::vector<StagedBlock> blocks;  // by address
  std::size_t floats = 0;           // the staging memory needed

  /// Where device address `p` (inside a block) lands in the staging memory.
  std::size_t offset_of(const float* p) const noexcept {
    const auto after =
        std::upper_bound(blocks.begin(), blocks.end(), p,
                         [](const float* q, const StagedBlock& b) { return q < b.begin; });
    LOADSTAR_ASSERT(after != blocks.begin(), "host_kernel: a tensor outside the staged blocks");
    const StagedBlock& block = *(after - 1);
    return block.offset + static_cast<std::size_t>(p - block.begin);
  }
};

/// The staging plan of the non-empty device tensors among `tensors` (host tensors are used as
/// they are).
inline StagingPlan plan_staging(std::span<const Tensor<float>> tensors) {
  StagingPlan plan;
  std::vector<StagedBlock> spans;
  for (const auto& t : tensors)
    if (!t.empty() && !t.is_host()) spans.push_back({t.data(), t.data() + t.size(), 0});
  std::sort(spans.begin(), spans.end(),
            [](const StagedBlock& a, const StagedBlock& b) { return a.begin < b.begin; });
  for (const auto& b : spans) {
    if (!plan.blocks.empty() && b.begin < plan.blocks.back().end) {
      plan.blocks.back().end = std::max(plan.blocks.back().end, b.end);
    } else {
      plan.blocks.push_back(b);
    }
  }
  constexpr std::size_t align = LOADSTAR_TENSOR_ALIGNMENT / sizeof(float);
  for (auto& b : plan.blocks) {
    const std::size_t skew =
        reinterpret_cast<std::uintptr_t>(b.begin) % LOADSTAR_TENSOR_ALIGNMENT / sizeof(float);
    b.offset = plan.floats + skew;
    plan.floats += (skew + b.floats() + align - 1) / align * align;
  }
  return plan;
}

}  // namespace loadstar::cuda::detail

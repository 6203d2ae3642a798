/// \file
/// Eigen views of tensors: the math on a `Tensor` is Eigen's, over its storage, without copies.
#pragma once

#include "loadstar/detail/eigen.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar {

/// A row-major dynamic Eigen matrix of `T`.
template <TensorElement T>
using RowMajorMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// The tensor as a `rows() x row_size()` row-major matrix over its storage (64-byte aligned).
/// \code
/// Tensor<float> x({32, 784}), w({784, 10});
/// Tensor<float> y({32, 10});
/// as_matrix(y).noalias() = as_matrix(x) * as_matrix(w);
/// \endcode
template <TensorElement T>
Eigen::Map<RowMajorMatrix<T>, Eigen::Aligned64> as_matrix(const Tensor<T>& t) {
  return {t.data(), static_cast<Eigen::Index>(t.rows()), static_cast<Eigen::Index>(t.row_size())};
}

/// The tensor's elements as a column vector over its storage.
template <TensorElement T>
Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, 1>, Eigen::Aligned64> as_vector(const Tensor<T>& t) {
  return {t.data(), static_cast<Eigen::Index>(t.size())};
}

}  // namespace loadstar

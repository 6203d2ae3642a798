/// \file
/// Keras's `noise_shape` of `Dropout` and `AlphaDropout`: the shape of the random mask, broadcast
/// along the axes where it is 1.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/keras/detail/layer_kernels.hpp"
#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers::detail {

/// A mask's `noise_shape` (batch axis first; `null` entries take the input's size): one draw per
/// element of the noise shape, shared by the input elements it broadcasts to.
/// \code
/// NoiseShape noise{nlohmann::json::parse("[null, 1, 8]")};  // one mask per sample and feature
/// \endcode
class NoiseShape {
 public:
  NoiseShape() = default;
  /// `json` as the config writes it: null (a draw per element) or a list.
  explicit NoiseShape(nlohmann::json json) : json_(std::move(json)) {}

  /// Reads `noise_shape`: null, or a list of null or positive integers.
  LOADSTAR_DECL static NoiseShape read(const ConfigReader& read);

  /// Whether there is a noise shape (else each element has its own draw).
  bool active() const noexcept { return !json_.is_null(); }
  const nlohmann::json& json() const noexcept { return json_; }

  /// Fits the noise shape to samples of `sample` (without the batch axis); throws `ShapeError`
  /// naming `label` when its length is not the input's rank or a size is neither 1 nor the
  /// input's.
  LOADSTAR_DECL void build(const Shape& sample, const std::string& label);
  /// Throws `ShapeError` naming `label` when a fixed batch size of the noise shape is not `rows`.
  LOADSTAR_DECL void check_rows(std::size_t rows, const std::string& label) const;

  /// `index` as a kernel's map (keras/detail/layer_kernels.hpp): the identity without a noise
  /// shape.
  keras::detail::BroadcastMap map() const {
    if (shared_.empty()) return {};
    std::vector<std::size_t> dims{0}, strides{per_sample_ ? noise_size_ : 0};
    for (std::size_t d = 0; d < dims_.size(); ++d) {
      dims.push_back(dims_[d]);
      strides.push_back(shared_[d] ? 0 : strides_[d]);
    }
    return keras::detail::broadcast_map(dims.data(), strides.data(), dims.size());
  }

 private:
  nlohmann::json json_;
  std::vector<std::size_t> dims_, strides_;
  std::vector<bool> shared_;
  std::size_t noise_size_ = 1;
  bool per_sample_ = true;
};

}  // namespace loadstar::keras::layers::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers::detail {

NoiseShape NoiseShape::read(const ConfigReader& read) {
  const nlohmann::json* value = read.find("noise_shape");
  if (value == nullptr || value->is_null()) return {};
  const auto fits = [](const nlohmann::json& d) {
    return d.is_null() || (d.is_number_integer() && d.get<std::int64_t>() > 0);
  };
  if (!value->is_array() || value->empty() || !std::all_of(value->begin(), value->end(), fits))
    read.fail("noise_shape", "null or a list of null or positive integers");
  return NoiseShape(*value);
}

void NoiseShape::build(const Shape& sample, const std::string& label) {
  dims_.assign(sample.begin(), sample.end());
  if (!active()) return;
  if (json_.size() != sample.rank() + 1) {
    throw ShapeError(label + ": noise_shape " + json_.dump() + " has " +
                     std::to_string(json_.size()) + " axes but the input has " +
                     std::to_string(sample.rank() + 1) + " (batch axis included)");
  }
  per_sample_ = json_[0].is_null() || json_[0].get<std::size_t>() != 1;
  shared_.assign(dims_.size(), false);
  strides_.assign(dims_.size(), 0);
  noise_size_ = 1;
  for (std::size_t d = dims_.size(); d-- > 0;) {
    const nlohmann::json& n = json_[d + 1];
    if (!n.is_null() && n.get<std::size_t>() != dims_[d]) {
      if (n.get<std::size_t>() != 1) {
        throw ShapeError(label + ": noise_shape " + json_.dump() + " has " + n.dump() +
                         " on axis " + std::to_string(d + 1) + " but the input has " +
                         std::to_string(dims_[d]) + " (the size must be 1 or the input's)");
      }
      shared_[d] = true;
      continue;
    }
    strides_[d] = noise_size_;
    noise_size_ *= dims_[d];
  }
}

void NoiseShape::check_rows(std::size_t rows, const std::string& label) const {
  if (!active() || json_[0].is_null()) return;
  const auto batch = json_[0].get<std::size_t>();
  if (batch != 1 && batch != rows) {
    throw ShapeError(label + ": noise_shape " + json_.dump() + " has a batch size of " +
                     std::to_string(batch) + " but the batch has " + std::to_string(rows) +
                     " rows");
  }
}

}  // namespace loadstar::keras::layers::detail
#endif

/// \file
/// `Constraint`: the base of Keras's weight constraints, and the norms along axes they share.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/keras/detail/config_reader.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::keras {

/// The base of every weight constraint (Keras's `keras.constraints.Constraint`): a projection
/// of a trainable variable applied after each optimizer step, as Keras 3's `optimizer.apply`
/// assigns `variable.constraint(variable)` after the update.
///
/// `apply` projects a host tensor in place; `apply_on` runs it on a backend's tensor through
/// `Backend::host_kernel`.
/// \code
/// auto dense = std::make_shared<Dense>(10);
/// dense->set_constraint("kernel", std::make_shared<constraints::MaxNorm>(2.0));
/// \endcode
class Constraint {
 public:
  Constraint() = default;
  virtual ~Constraint() = default;
  Constraint(const Constraint&) = default;
  Constraint& operator=(const Constraint&) = default;
  Constraint(Constraint&&) noexcept = default;
  Constraint& operator=(Constraint&&) noexcept = default;

  /// Keras's class name (`"MaxNorm"`): the key of the constraint registry.
  virtual std::string class_name() const = 0;
  /// Keras's `get_config()` (`{"max_value": 2, "axis": 0}`).
  virtual nlohmann::json get_config() const = 0;

  /// Projects `w` (host memory) in place.
  virtual void apply(const Tensor<float>& w) const = 0;
  /// Throws `ConfigError` naming `owner` when the constraint does not apply to a variable of
  /// `shape` (an axis out of range); every shape by default.
  virtual void check_shape(const Shape& /*shape*/, const std::string& /*owner*/) const {}

  /// `{"class_name": ..., "config": ...}`, as tf.keras serialises it.
  nlohmann::json to_json() const {
    return {{"class_name", class_name()}, {"config", get_config()}};
  }

  /// `apply` on a tensor in `backend`'s memory.
  LOADSTAR_DECL void apply_on(Backend& backend, const Tensor<float>& w) const;
};

namespace constraints::detail {

/// Keras's `axis` of a norm constraint: an integer or a list of integers (negative ones count
/// from the end), kept as the config wrote it.
struct NormAxes {
  nlohmann::json json = 0;

  /// Reads `axis` from a constraint's config (`0` when absent).
  LOADSTAR_DECL static NormAxes read(const keras::detail::ConfigReader& read);
  /// Throws `ConfigError` naming `owner` when an axis is outside a tensor of `shape`.
  LOADSTAR_DECL void check(const Shape& shape, const std::string& owner,
                           const std::string& constraint) const;
  /// Multiplies each element of `w` by `factor(norm)`, the norm being that of its slice along
  /// the axes (`sqrt(sum(w^2, axis, keepdims=True))`, computed in float as Keras does).
  LOADSTAR_DECL void rescale(const Tensor<float>& w,
                             const std::function<float(float)>& factor) const;
};

/// The axes of `json` within a tensor of rank `rank` (negative ones counted from the end), or an
/// empty list when one is outside it.
LOADSTAR_DECL std::vector<std::size_t> resolve_axes(const nlohmann::json& json, std::size_t rank);

/// Keras's `backend.epsilon()`, added to the norms the constraints divide by.
inline constexpr float epsilon = 1e-7F;

}  // namespace constraints::detail
}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

void Constraint::apply_on(Backend& backend, const Tensor<float>& w) const {
  const Tensor<float> tensors[] = {w};
  backend.host_kernel(tensors, [&](std::span<const Tensor<float>> t) { apply(t[0]); });
}

}  // namespace loadstar::keras
namespace loadstar::keras::constraints::detail {

NormAxes NormAxes::read(const keras::detail::ConfigReader& read) {
  const nlohmann::json* value = read.find("axis");
  if (value == nullptr || value->is_null()) return {};
  const auto integer = [](const nlohmann::json& v) { return v.is_number_integer(); };
  if (integer(*value)) return {*value};
  if (value->is_array() && !value->empty() && std::all_of(value->begin(), value->end(), integer))
    return {*value};
  read.fail("axis", "an integer or a list of integers");
}

std::vector<std::size_t> resolve_axes(const nlohmann::json& json, std::size_t rank) {
  std::vector<std::size_t> axes;
  const auto add = [&](std::int64_t axis) {
    const std::int64_t r = static_cast<std::int64_t>(rank);
    if (axis < -r || axis >= r) return false;
    axes.push_back(static_cast<std::size_t>(axis < 0 ? axis + r : axis));
    return true;
  };
  if (json.is_array()) {
    for (const auto& a : json)
      if (!add(a.get<std::int64_t>())) return {};
  } else if (!add(json.get<std::int64_t>())) {
    return {};
  }
  return axes;
}

void NormAxes::check(const Shape& shape, const std::string& owner,
                     const std::string& constraint) const {
  if (resolve_axes(json, shape.rank()).empty()) {
    throw ConfigError(owner + ": " + constraint + "'s axis " + json.dump() +
                      " is outside a variable of shape " + shape.str());
  }
}

void NormAxes::rescale(const Tensor<float>& w, const std::function<float(float)>& factor) const {
  const Shape& shape = w.shape();
  const std::vector<std::size_t> axes = resolve_axes(json, shape.rank());
  std::vector<bool> reduced(shape.rank(), false);
  for (const std::size_t a : axes)
    reduced[a] = true;
  // Element i's slice: its index with the reduced axes dropped, row-major over the others.
  std::vector<std::size_t> slice_of(w.size());
  std::size_t slices = 1;
  for (std::size_t d = 0; d < shape.rank(); ++d)
    if (!reduced[d]) slices *= shape[d];
  for (std::size_t i = 0; i < w.size(); ++i) {
    std::size_t rest = i, slice = 0, stride = 1;
    for (std::size_t d = shape.rank(); d-- > 0;) {
      const std::size_t index = rest % shape[d];
      rest /= shape[d];
      if (!reduced[d]) {
        slice += index * stride;
        stride *= shape[d];
      }
    }
    slice_of[i] = slice;
  }
  std::vector<float> sums(slices, 0.0F);
  for (std::size_t i = 0; i < w.size(); ++i)
    sums[slice_of[i]] += w.data()[i] * w.data()[i];
  for (auto& s : sums)
    s = factor(std::sqrt(s));
  for (std::size_t i = 0; i < w.size(); ++i)
    w.data()[i] *= sums[slice_of[i]];
}

}  // namespace loadstar::keras::constraints::detail
#endif

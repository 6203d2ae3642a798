/// \file
/// The one printer of shapes with a free batch axis, as Keras prints them: `(None, 28, 28)`.
#pragma once

#include "loadstar/config.hpp"

#include <string>

#include <nlohmann/json.hpp>

#include "loadstar/tensor/shape.hpp"

namespace loadstar::keras::detail {

/// `"(None, 28, 28)"`: `shape` (one sample's) behind a free batch axis; an axis of unknown
/// length (`keras::none`) prints as `None` too.
LOADSTAR_DECL std::string batch_shape_str(const Shape& shape);

/// `"(None, 16)"`: one sample's shape, an axis of unknown length (`keras::none`) as `None`.
LOADSTAR_DECL std::string sample_shape_str(const Shape& shape);

/// `[null, 28, 28]`: `shape` (one sample's) as Keras's `batch_input_shape`, with `null` for the
/// batch axis and for each axis of unknown length.
LOADSTAR_DECL nlohmann::json batch_shape_json(const Shape& shape);

/// Whether `shape` has an axis of unknown length (`keras::none`, 0).
inline bool has_unknown_axis(const Shape& shape) noexcept {
  for (std::size_t d : shape)
    if (d == 0) return true;
  return false;
}

/// Whether `concrete` (a batch's) fits `declared`: the same rank, the same lengths where
/// `declared` knows them and positive ones where it does not.
inline bool fits_declared(const Shape& declared, const Shape& concrete) noexcept {
  if (declared.rank() != concrete.rank()) return false;
  for (std::size_t i = 0; i < declared.rank(); ++i) {
    if (declared[i] == 0 ? concrete[i] == 0 : concrete[i] != declared[i]) return false;
  }
  return true;
}

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

nlohmann::json batch_shape_json(const Shape& shape) {
  nlohmann::json out = nlohmann::json::array({nullptr});
  for (std::size_t d : shape)
    out.push_back(d == 0 ? nlohmann::json(nullptr) : nlohmann::json(d));
  return out;
}

std::string sample_shape_str(const Shape& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.rank(); ++i)
    s += (i ? ", " : "") + (shape[i] == 0 ? std::string("None") : std::to_string(shape[i]));
  return s + (shape.rank() == 1 ? ",)" : ")");
}

std::string batch_shape_str(const Shape& shape) {
  std::string s = "(None";
  for (std::size_t d : shape)
    s += d == 0 ? std::string(", None") : ", " + std::to_string(d);
  return s + ")";
}

}  // namespace loadstar::keras::detail
#endif

/// \file
/// The one printer of shapes with a free batch axis, as Keras prints them: `(None, 28, 28)`.
#pragma once

#include "loadstar/config.hpp"

#include <string>

#include "loadstar/tensor/shape.hpp"

namespace loadstar::keras::detail {

/// `"(None, 28, 28)"`: `shape` (one sample's) behind a free batch axis.
LOADSTAR_DECL std::string batch_shape_str(const Shape& shape);

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

std::string batch_shape_str(const Shape& shape) {
  std::string s = "(None";
  for (std::size_t d : shape)
    s += ", " + std::to_string(d);
  return s + ")";
}

}  // namespace loadstar::keras::detail
#endif

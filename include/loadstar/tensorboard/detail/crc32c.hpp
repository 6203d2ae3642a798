/// \file
/// CRC-32C for the framing of TensorBoard event files: the library's one implementation.
#pragma once

#include "loadstar/detail/crc32c.hpp"

namespace loadstar::tensorboard::detail {

using loadstar::detail::crc32c;
using loadstar::detail::masked_crc32c;

}  // namespace loadstar::tensorboard::detail

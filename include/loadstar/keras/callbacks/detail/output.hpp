/// \file
/// Helpers for what callbacks write and keep: Keras's number and epoch formats, the names of
/// logs, and the checkpoint state reader.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <cstdio>
#include <string>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/detail/strings.hpp"
#include "loadstar/keras/callbacks/logs.hpp"

namespace loadstar::keras::detail {

using loadstar::detail::StateReader;

/// Keras's `Epoch 00003` label of the zero-based `epoch` (`%05d` of `epoch + 1`).
LOADSTAR_DECL std::string epoch_label(std::size_t epoch);

/// A number as Python's `%g` prints it (learning rates in messages).
LOADSTAR_DECL std::string general(double value);

/// The names of `logs`, comma-separated.
LOADSTAR_DECL std::string joined_names(const Logs& logs);

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

std::string epoch_label(std::size_t epoch) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%05zu", epoch + 1);
  return buffer;
}

std::string general(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%g", value);
  return buffer;
}

std::string joined_names(const Logs& logs) {
  return loadstar::detail::join(logs, ", ", "", [](const auto& entry) { return entry.first; });
}

}  // namespace loadstar::keras::detail
#endif

/// \file
/// Warnings of the executor: what it does that its user should know but that is no error (a file
/// naming an initializer loadstar cannot build, loaded all the same), as Keras's Python warnings.
#pragma once

#include "loadstar/config.hpp"

#include <functional>
#include <string>

namespace loadstar::keras {

/// Receives each warning's text (lower case, naming the object, as error messages do).
using WarningHandler = std::function<void(const std::string&)>;

/// Replaces the warning handler for the whole process and returns the previous one; an empty
/// handler restores the default, which writes `loadstar: warning: <text>` to standard error.
/// \code
/// std::vector<std::string> seen;
/// auto previous = set_warning_handler([&](const std::string& w) { seen.push_back(w); });
/// auto model = load_model("model.h5");
/// set_warning_handler(previous);
/// \endcode
LOADSTAR_DECL WarningHandler set_warning_handler(WarningHandler handler);

/// Sends `text` to the warning handler.
LOADSTAR_DECL void warn(const std::string& text);

}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
#include <iostream>
#include <mutex>
#include <utility>

namespace loadstar::keras {

namespace detail {
struct WarningSink {
  std::mutex mutex;
  WarningHandler handler;
};
inline WarningSink& warning_sink() {
  static WarningSink sink;
  return sink;
}
}  // namespace detail

WarningHandler set_warning_handler(WarningHandler handler) {
  auto& sink = detail::warning_sink();
  const std::lock_guard lock(sink.mutex);
  return std::exchange(sink.handler, std::move(handler));
}

void warn(const std::string& text) {
  auto& sink = detail::warning_sink();
  WarningHandler handler;
  {
    const std::lock_guard lock(sink.mutex);
    handler = sink.handler;
  }
  if (handler) {
    handler(text);
  } else {
    std::cerr << "loadstar: warning: " << text << '\n';
  }
}

}  // namespace loadstar::keras
#endif

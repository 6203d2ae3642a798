/// \file
/// `LambdaCallback`: a callback made of functions.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <functional>
#include <memory>
#include <utility>

#include "loadstar/error.hpp"
#include "loadstar/keras/callbacks/callback.hpp"

namespace loadstar::keras::callbacks {

/// The functions of a `LambdaCallback`, one per Keras hook; empty ones are not called.
struct LambdaCallbackOptions {
  std::function<void(std::size_t, const Logs&)> on_epoch_begin = {};
  std::function<void(std::size_t, const Logs&)> on_epoch_end = {};
  /// Keras's `on_batch_begin` and `on_batch_end`: the training batches.
  std::function<void(std::size_t, const Logs&)> on_batch_begin = {};
  std::function<void(std::size_t, const Logs&)> on_batch_end = {};
  std::function<void(const Logs&)> on_train_begin = {};
  std::function<void(const Logs&)> on_train_end = {};
  std::function<void(const Logs&)> on_test_begin = {};
  std::function<void(const Logs&)> on_test_end = {};
  std::function<void(std::size_t, const Logs&)> on_test_batch_begin = {};
  std::function<void(std::size_t, const Logs&)> on_test_batch_end = {};
  std::function<void(const Logs&)> on_predict_begin = {};
  std::function<void(const Logs&)> on_predict_end = {};
  std::function<void(std::size_t, const Logs&)> on_predict_batch_begin = {};
  std::function<void(std::size_t, const Logs&)> on_predict_batch_end = {};
};

/// Keras's `LambdaCallback`: calls the given functions from the hooks.
/// \code
/// auto print = std::make_shared<LambdaCallback>(LambdaCallbackOptions{
///     .on_epoch_end = [](std::size_t epoch, const Logs& logs) {
///       std::printf("%zu %f\n", epoch, *logs.get("loss"));
///     }});
/// \endcode
class LambdaCallback : public Callback {
 public:
  explicit LambdaCallback(LambdaCallbackOptions options) : f_(std::move(options)) {}

  std::string class_name() const override { return "LambdaCallback"; }
  /// Throws `ConfigError`: the hooks are functions, which a config cannot hold.
  LOADSTAR_DECL static std::shared_ptr<Callback> from_config(const nlohmann::json&);

  void on_epoch_begin(std::size_t e, const Logs& l) override { call(f_.on_epoch_begin, e, l); }
  void on_epoch_end(std::size_t e, const Logs& l) override { call(f_.on_epoch_end, e, l); }
  void on_train_batch_begin(std::size_t b, const Logs& l) override {
    call(f_.on_batch_begin, b, l);
  }
  void on_train_batch_end(std::size_t b, const Logs& l) override { call(f_.on_batch_end, b, l); }
  void on_train_begin(const Logs& l) override { call(f_.on_train_begin, l); }
  void on_train_end(const Logs& l) override { call(f_.on_train_end, l); }
  void on_test_begin(const Logs& l) override { call(f_.on_test_begin, l); }
  void on_test_end(const Logs& l) override { call(f_.on_test_end, l); }
  void on_test_batch_begin(std::size_t b, const Logs& l) override {
    call(f_.on_test_batch_begin, b, l);
  }
  void on_test_batch_end(std::size_t b, const Logs& l) override {
    call(f_.on_test_batch_end, b, l);
  }
  void on_predict_begin(const Logs& l) override { call(f_.on_predict_begin, l); }
  void on_predict_end(const Logs& l) override { call(f_.on_predict_end, l); }
  void on_predict_batch_begin(std::size_t b, const Logs& l) override {
    call(f_.on_predict_batch_begin, b, l);
  }
  void on_predict_batch_end(std::size_t b, const Logs& l) override {
    call(f_.on_predict_batch_end, b, l);
  }

 private:
  template <class F, class... A>
  static void call(const F& f, A&&... args) {
    if (f) f(std::forward<A>(args)...);
  }

  LambdaCallbackOptions f_;
};

}  // namespace loadstar::keras::callbacks

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::callbacks {

std::shared_ptr<Callback> LambdaCallback::from_config(const nlohmann::json&) {
  throw ConfigError(
      "callback (LambdaCallback): holds functions (its hooks) and cannot be built from a "
      "config; construct it in code, or pass a factory in the custom objects");
}

}  // namespace loadstar::keras::callbacks
#endif

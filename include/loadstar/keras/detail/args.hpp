/// \file
/// The arguments `compile` takes by name or as objects: optimizers, losses and metrics.
#pragma once

#include "loadstar/config.hpp"

#include <concepts>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "loadstar/keras/losses/loss.hpp"
#include "loadstar/keras/metrics/metric.hpp"
#include "loadstar/keras/optimizers/optimizer.hpp"

namespace loadstar::keras {

/// An optimizer, loss or metric given to `compile` as Keras accepts it: by name (`"adam"`), as a
/// `std::shared_ptr` to an object (shared with the caller), or as an object by value (moved into
/// a new shared pointer).
template <class Base>
class ObjectArg {
 public:
  ObjectArg(const char* name) : name_(name) {}             // NOLINT: implicit on purpose
  ObjectArg(std::string name) : name_(std::move(name)) {}  // NOLINT: implicit on purpose
  template <std::derived_from<Base> T>
  ObjectArg(std::shared_ptr<T> object) : object_(std::move(object)) {}  // NOLINT: implicit
  template <std::derived_from<Base> T>
  ObjectArg(T object)  // NOLINT: implicit on purpose
      : object_(std::make_shared<T>(std::move(object))) {}

  /// The object, or null when given by name.
  const std::shared_ptr<Base>& object() const noexcept { return object_; }
  /// The name, when given by name.
  const std::string& name() const noexcept { return name_; }

 private:
  std::string name_;
  std::shared_ptr<Base> object_;
};

using OptimizerArg = ObjectArg<Optimizer>;
using LossArg = ObjectArg<Loss>;
using MetricArg = ObjectArg<Metric>;

/// The `loss` of `compile`: one loss for every output, a list by output position, or a map by
/// output name, as Keras accepts.
/// \code
/// model.compile("adam", "mse");                                   // every output
/// model.compile("adam", {"mse", "sparse_categorical_crossentropy"}); // by position
/// model.compile("adam", Losses::by_name({{"price", "mse"}, {"kind", "binary_crossentropy"}}));
/// \endcode
class Losses {
 public:
  Losses() = default;
  template <class T>
  requires std::constructible_from<LossArg, T> Losses(T&& loss)  // NOLINT: implicit on purpose
      : list_{LossArg(std::forward<T>(loss))}, single_(true) {}
  Losses(std::initializer_list<LossArg> losses) : list_(losses) {}
  Losses(std::vector<LossArg> losses) : list_(std::move(losses)) {}  // NOLINT: implicit

  /// Losses by output name.
  LOADSTAR_DECL static Losses by_name(std::map<std::string, LossArg> losses);

  const std::vector<LossArg>& list() const noexcept { return list_; }
  const std::map<std::string, LossArg>& map() const noexcept { return map_; }
  /// Whether one loss was given for every output.
  bool single() const noexcept { return single_; }
  bool empty() const noexcept { return list_.empty() && map_.empty(); }

 private:
  std::vector<LossArg> list_;
  std::map<std::string, LossArg> map_;
  bool single_ = false;
};

}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

Losses Losses::by_name(std::map<std::string, LossArg> losses) {
  Losses out;
  out.map_ = std::move(losses);
  return out;
}

}  // namespace loadstar::keras
#endif

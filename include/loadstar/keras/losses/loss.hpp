/// \file
/// `Loss`: the base of Keras's losses, with Keras's reductions and sample weighting.
#pragma once

#include "loadstar/config.hpp"

#include <string>

#include <string_view>

#include <nlohmann/json.hpp>

#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/keras/detail/config_reader.hpp"

#include "loadstar/tensor/tensor.hpp"

namespace loadstar::keras {

/// How per-sample losses become one number, as `tf.keras.losses.Reduction`.
enum class Reduction {
  /// The weighted sum divided by the number of per-sample values (Keras's default).
  sum_over_batch_size,
  /// The weighted sum.
  sum,
  /// No reduction: `compute` returns the mean, `per_sample` holds the values.
  none,
};

/// The base of every loss.
///
/// `compute` takes `y_true` and `y_pred` with the batch axis first (`y_true` as float: class
/// indices for the sparse losses), an optional sample weight per row, and returns the reduced
/// loss; when `gradient` has elements it receives d(loss)/d(y_pred) of the reduced loss, with the
/// shape of `y_pred`. Buffers are the caller's: a training step allocates nothing. The tensors
/// live in the memory of the backend given to `compute`, which computes the loss (the reduced
/// value comes back to the host).
class Loss {
 public:
  explicit Loss(std::string name, Reduction reduction = Reduction::sum_over_batch_size)
      : name_(std::move(name)), reduction_(reduction) {}
  virtual ~Loss() = default;
  Loss(const Loss&) = default;
  Loss(Loss&&) noexcept = default;
  Loss& operator=(const Loss&) = default;
  Loss& operator=(Loss&&) noexcept = default;

  /// Keras's class name (`"SparseCategoricalCrossentropy"`).
  virtual std::string class_name() const = 0;

  /// The reduced loss of a batch; see the class comment. Throws `ShapeError` naming the loss when
  /// the shapes of `y_true` and `y_pred` do not fit, and `ConfigError` for a class index outside
  /// `[0, classes)` in a sparse loss.
  virtual float compute(Backend& backend, const Tensor<float>& y_true, const Tensor<float>& y_pred,
                        const Tensor<float>* sample_weight, const Tensor<float>& gradient) = 0;

  /// `compute`, with a value that a device backend may still be computing when this returns:
  /// reading it (`get()`) waits for the device and throws what `compute` would have thrown for
  /// the batch's values (a label out of range). Shapes are checked here. A training step uses
  /// this, so that it waits for the device only when the logs are read. The default computes at
  /// once.
  virtual Deferred<double> compute_deferred(Backend& backend, const Tensor<float>& y_true,
                                            const Tensor<float>& y_pred,
                                            const Tensor<float>* sample_weight,
                                            const Tensor<float>& gradient) {
    return static_cast<double>(compute(backend, y_true, y_pred, sample_weight, gradient));
  }

  /// `compute` on host tensors, with the CPU backend.
  float compute(const Tensor<float>& y_true, const Tensor<float>& y_pred,
                const Tensor<float>* sample_weight, const Tensor<float>& gradient) {
    return compute(detail::host_backend(), y_true, y_pred, sample_weight, gradient);
  }

  /// Keras's `get_config()`: `{"reduction": "sum_over_batch_size", "name": ...}` and the loss's
  /// own arguments.
  LOADSTAR_DECL virtual nlohmann::json get_config() const;

  /// The name Keras logs the loss under (`"sparse_categorical_crossentropy"`).
  const std::string& name() const noexcept { return name_; }
  Reduction reduction() const noexcept { return reduction_; }

 private:
  std::string name_;
  Reduction reduction_;
};

namespace detail {

/// A reader of a loss's Keras config whose errors name the loss (`loss 'huber_loss' (Huber)`).
inline ConfigReader loss_config(const nlohmann::json& config, std::string_view class_name) {
  return ConfigReader::of(config, "loss", class_name);
}

/// A loss config's `reduction`: Keras's `"auto"` and `"sum_over_batch_size"` (the default),
/// `"sum"`, `"none"`.
LOADSTAR_DECL Reduction config_reduction(const ConfigReader& read);

}  // namespace detail
}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

nlohmann::json Loss::get_config() const {
  const char* reductions[] = {"sum_over_batch_size", "sum", "none"};
  return {{"reduction", reductions[static_cast<int>(reduction_)]}, {"name", name_}};
}

}  // namespace loadstar::keras

namespace loadstar::keras::detail {

Reduction config_reduction(const ConfigReader& read) {
  const std::string reduction = read.get("reduction", "auto");
  if (reduction == "auto" || reduction == "sum_over_batch_size") {
    return Reduction::sum_over_batch_size;
  }
  if (reduction == "sum") return Reduction::sum;
  if (reduction == "none") return Reduction::none;
  read.fail("reduction", "\"auto\", \"sum_over_batch_size\", \"sum\" or \"none\"");
}

}  // namespace loadstar::keras::detail
#endif

/// \file
/// `DistributedOptimizer`: Horovod's `DistributedOptimizer` on a `Collective`: the gradients of
/// every rank are combined before the wrapped optimizer steps, so that every rank takes the same
/// step and the weights stay the same everywhere.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/dist/collective.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/optimizers/optimizer.hpp"
#include "loadstar/keras/variable.hpp"

namespace loadstar::dist {

/// The options of a `DistributedOptimizer`, with Determined's defaults.
struct DistributedOptions {
  /// The most bytes of gradients summed by one collective (Horovod's fusion buffer; Determined's
  /// `optimizations.tensor_fusion_threshold`, 64 MB). All gradients are packed into one buffer
  /// and summed in pieces of at most this size; 0 sums each variable on its own.
  std::size_t fusion_threshold_bytes = std::size_t{64} << 20U;
  /// Local accumulation: the gradients of this many batches are added up on each rank before
  /// they are combined and the wrapped optimizer steps (Determined's
  /// `optimizations.aggregation_frequency`); the batches in between only count an iteration, as
  /// in Horovod.
  std::size_t aggregation_frequency = 1;
  /// With `aggregation_frequency` above 1: the step takes the mean of the aggregated batches'
  /// gradients (Determined's `optimizations.average_aggregated_gradients`, true), or their sum
  /// (false: `aggregation_frequency` times the mean).
  bool average_aggregated_gradients = true;
};

/// Wraps an optimizer for data-parallel training: every `aggregation_frequency`-th batch, the
/// gradients of all ranks are combined into the gradient of the mean loss over every row of
/// every rank's batches (each rank's gradients weighted by its rows, so that a rank with a short
/// last batch counts for what it holds, and N ranks at global batch B take the step one process
/// takes at batch B, up to rounding), then the wrapped optimizer steps on every rank alike. The
/// sum is the collective's, in rank order, so runs are bitwise reproducible for a given number
/// of ranks.
///
/// To Keras it is the wrapped optimizer: `class_name`, `get_config`, the learning rate, the slot
/// variables and the iterations are the wrapped optimizer's, so models save and load as without
/// it.
/// \code
/// auto world = loadstar::dist::mpi_world();
/// model.compile({.optimizer = std::make_shared<DistributedOptimizer>(
///                    std::make_shared<keras::optimizers::Adam>(1e-3), world),
///                .loss = "sparse_categorical_crossentropy"});
/// \endcode
class DistributedOptimizer final : public keras::Optimizer {
 public:
  DistributedOptimizer(std::shared_ptr<keras::Optimizer> optimizer,
                       std::shared_ptr<Collective> collective, DistributedOptions options = {})
      : keras::Optimizer(optimizer ? optimizer->name() : std::string("distributed")),
        inner_(std::move(optimizer)),
        collective_(std::move(collective)),
        options_(options) {
    if (!inner_) throw ConfigError("distributed optimizer: the wrapped optimizer is null");
    if (!collective_) throw ConfigError("distributed optimizer: the collective is null");
    if (dynamic_cast<DistributedOptimizer*>(inner_.get()) != nullptr) {
      throw ConfigError("distributed optimizer: the optimizer '" + inner_->name() +
                        "' is already distributed");
    }
    if (options_.aggregation_frequency == 0) {
      throw ConfigError("distributed optimizer: aggregation_frequency must be at least 1 but is 0");
    }
    iterations_ = inner_->iterations();
  }

  std::string class_name() const override { return inner_->class_name(); }
  nlohmann::json get_config() const override { return inner_->get_config(); }
  double learning_rate() const override { return inner_->learning_rate(); }
  void set_learning_rate(double learning_rate) override {
    inner_->set_learning_rate(learning_rate);
  }
  void set_backend(std::shared_ptr<keras::Backend> backend) override {
    inner_->set_backend(backend);
    keras::Optimizer::set_backend(std::move(backend));
  }
  void set_iterations(std::int64_t iterations) noexcept override {
    inner_->set_iterations(iterations);
    iterations_ = iterations;
  }
  float loss_scale() const noexcept override { return inner_->loss_scale(); }
  keras::Optimizer* wrapped_optimizer() const noexcept override { return inner_.get(); }
  std::span<keras::Variable> variables() noexcept override { return inner_->variables(); }
  void build(std::span<keras::Variable*> variables) override { inner_->build(variables); }
  bool built() const noexcept override { return inner_->built(); }
  void finalize_variable_values(std::span<keras::Variable*> variables) override {
    inner_->finalize_variable_values(variables);
  }

  /// The wrapped optimizer.
  keras::Optimizer& wrapped() const noexcept { return *inner_; }
  const std::shared_ptr<Collective>& collective() const noexcept { return collective_; }
  const DistributedOptions& options() const noexcept { return options_; }

  /// Gradients of unknown rows count as one row each.
  void apply_gradients(std::span<keras::Variable*> variables) override {
    apply_batch_gradients(variables, 1);
  }

  void apply_batch_gradients(std::span<keras::Variable*> variables, std::size_t rows) override {
    if (layout_.empty()) plan(variables);
    std::size_t k = 0;
    for (keras::Variable* v : variables) {
      if (!v->trainable) continue;
      check_variable(*v, k);
      const float* g = v->gradient.data();
      float* a = buffer_.data() + layout_[k].offset;
      const auto weight = static_cast<float>(rows);
      for (std::size_t i = 0; i < layout_[k].size; ++i)
        a[i] += weight * g[i];
      ++k;
    }
    buffer_.back() += static_cast<float>(rows);
    if (++pending_ < options_.aggregation_frequency) {
      // Horovod's local aggregation: no step, one more iteration.
      inner_->set_iterations(inner_->iterations() + 1);
      iterations_ = inner_->iterations();
      return;
    }
    pending_ = 0;
    reduce();
    const float total = buffer_.back();
    if (!(total > 0.0F)) {
      throw DistributedError(collective_->describe() +
                             ": a training step of 0 rows on every rank (expected at least one "
                             "row in every global batch)");
    }
    const float inverse = (options_.average_aggregated_gradients
                               ? 1.0F
                               : static_cast<float>(options_.aggregation_frequency)) /
                          total;
    k = 0;
    for (keras::Variable* v : variables) {
      if (!v->trainable) continue;
      float* g = v->gradient.data();
      const float* a = buffer_.data() + layout_[k].offset;
      for (std::size_t i = 0; i < layout_[k].size; ++i)
        g[i] = a[i] * inverse;
      ++k;
    }
    std::fill(buffer_.begin(), buffer_.end(), 0.0F);
    inner_->apply_gradients(variables);
    iterations_ = inner_->iterations();
  }

  /// The collectives one step makes (for benchmarks and tests).
  std::size_t collectives_per_step() const noexcept { return pieces_.size(); }

 private:
  struct Slice {
    std::size_t offset = 0;
    std::size_t size = 0;
  };

  /// Lays the trainable gradients out in one buffer (plus one element: the rows), cut into
  /// pieces of at most the fusion threshold, and checks that every rank has the same layout.
  void plan(std::span<keras::Variable*> variables) {
    std::size_t offset = 0;
    detail::ShapeFingerprint shapes;
    for (keras::Variable* v : variables) {
      if (!v->trainable) continue;
      const std::size_t n = v->gradient.size();
      layout_.push_back({offset, n});
      offset += n;
      shapes.add(v->gradient.shape());
    }
    buffer_.assign(offset + 1, 0.0F);
    collective_->require_same(layout_.size(), "the number of trainable variables");
    collective_->require_same(shapes.value(), "the shapes of the trainable variables (a hash)");
    const std::size_t per_piece =
        options_.fusion_threshold_bytes == 0
            ? 0
            : std::max<std::size_t>(options_.fusion_threshold_bytes / sizeof(float), 1);
    if (per_piece == 0) {
      for (const auto& slice : layout_)
        pieces_.push_back(slice);
      pieces_.back().size += 1;  // the rows ride with the last variable
    } else {
      for (std::size_t start = 0; start < buffer_.size(); start += per_piece)
        pieces_.push_back({start, std::min(per_piece, buffer_.size() - start)});
    }
  }

  void check_variable(const keras::Variable& v, std::size_t k) const {
    if (k >= layout_.size() || v.gradient.size() != layout_[k].size) {
      throw DistributedError(collective_->describe() +
                             ": distributed optimizer: the trainable variables changed after the "
                             "first step (variable '" +
                             v.name + "')");
    }
    if (!v.gradient.is_host()) {
      throw DeviceError("distributed optimizer: the gradient of '" + v.name + "' is in " +
                        v.gradient.device().str() + " memory; the collectives take host memory");
    }
  }

  void reduce() {
    for (const auto& piece : pieces_)
      collective_->allreduce_sum(std::span<float>(buffer_.data() + piece.offset, piece.size));
  }

  std::shared_ptr<keras::Optimizer> inner_;
  std::shared_ptr<Collective> collective_;
  DistributedOptions options_;
  std::vector<Slice> layout_;
  std::vector<Slice> pieces_;
  std::vector<float> buffer_;
  std::size_t pending_ = 0;
};

}  // namespace loadstar::dist

// The training that the resume tests interrupt and resume: an MLP with dropout trained with Adam,
// shuffling, accuracy, a validation split, EarlyStopping and ReduceLROnPlateau (whose learning
// rate changes must survive a resume) and BackupAndRestore, shared by the in-process tests and
// the helper process that the kill test kills.
#pragma once

#include "keras/blobs.hpp"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <loadstar/keras.hpp>
#include <loadstar/keras/callbacks/backup_and_restore.hpp>
#include <memory>
#include <string>
#include <vector>

namespace resume_support {

using namespace loadstar;
using namespace loadstar::keras;

/// The model, its initial weights drawn from `seed`.
inline std::shared_ptr<Model> model(std::uint64_t seed = 11) {
  set_random_seed(seed);
  auto m = std::make_shared<Sequential>(
      std::initializer_list<SequentialItem>{Input({2}), layers::Dense(16, {.activation = "relu"}),
                                            layers::Dropout(0.25), layers::Dense(2)});
  m->compile({.optimizer = optimizers::Adam({.learning_rate = 0.02}),
              .loss = losses::SparseCategoricalCrossentropy(true),
              .metrics = {"accuracy"}});
  set_random_seed(7);  // dropout and shuffling draw from this seed, whatever the initial weights
  return m;
}

/// The callbacks besides BackupAndRestore, made afresh for every run.
inline std::vector<std::shared_ptr<callbacks::Callback>> others() {
  return {std::make_shared<callbacks::EarlyStopping>(callbacks::EarlyStoppingOptions{
              .monitor = "val_loss", .min_delta = 1e-3, .patience = 3}),
          std::make_shared<callbacks::ReduceLROnPlateau>(callbacks::ReduceLROnPlateauOptions{
              .monitor = "loss", .factor = 0.5, .patience = 1, .min_delta = 1e-2})};
}

inline constexpr std::size_t epochs = 8;
inline constexpr std::size_t rows = 400;  // 320 training rows: 20 batches of 16 an epoch

/// One `fit` of the shared problem with `callbacks`.
inline callbacks::History fit(Model& m,
                              std::vector<std::shared_ptr<callbacks::Callback>> callbacks) {
  static const Blobs data = blobs(rows, 5);
  return m.fit(data.x, data.y,
               {.epochs = epochs,
                .batch_size = 16,
                .verbose = 0,
                .callbacks = std::move(callbacks),
                .validation_split = 0.2,
                .shuffle = true});
}

/// The weights as bytes, for bitwise comparisons and for the helper's output file.
inline std::string weight_bytes(const std::vector<Tensor<float>>& weights) {
  std::string out;
  for (const auto& w : weights)
    out.append(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(float));
  return out;
}

}  // namespace resume_support

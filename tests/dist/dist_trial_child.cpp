// A data-parallel trial that test_dist_jobs.cpp runs under mpirun:
//   dist_trial_child DIR BATCHES [KIND]   runs the trial in DIR (resuming from its latest
//       checkpoint) until BATCHES batches, then rank 0 prints the final weights as one line of
//       JSON.
// The trial: an MLP on 125 rows of two features, global batch 12, a checkpoint every 10 batches;
// its data are arrays (KIND blobs, the default), a Sequence on worker threads (sequence) or
// Datasets sharded with wrap_dataset (dataset) or not (dataset-unwrapped, which a trial of several
// ranks refuses), Datasets cached by the data layer in DIR/cache (cached: every rank asks for the
// cache at once, one builds it, and each process that calls the dataset maker appends a line to
// DIR/maker_calls), or a trial that throws InvalidHP (invalid).
#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include <loadstar/data/array_sequence.hpp>
#include <loadstar/data/dataset.hpp>
#include <loadstar/dist/mpi.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/trial.hpp>
#include <nlohmann/json.hpp>

#include "keras/blobs.hpp"

using namespace loadstar;

namespace {

class BlobsTrial : public trial::KerasTrial {
 public:
  using KerasTrial::KerasTrial;
  std::shared_ptr<keras::Model> build_model() override {
    auto model = std::make_shared<keras::Sequential>(std::initializer_list<keras::SequentialItem>{
        keras::Input({2}), keras::layers::Dense(16, {.activation = "relu"}),
        keras::layers::Dense(2)});
    model->compile({.optimizer = keras::optimizers::Adam({.learning_rate = 0.01}),
                    .loss = keras::losses::SparseCategoricalCrossentropy(true),
                    .metrics = {"accuracy"}});
    return model;
  }
  trial::DataLoader build_training_data_loader() override {
    auto data = blobs(125);
    return {data.x, data.y};
  }
  trial::DataLoader build_validation_data_loader() override {
    auto data = blobs(50, 7);
    return {data.x, data.y};
  }
};
LOADSTAR_REGISTER_TRIAL(BlobsTrial, "dist:blobs");

/// The same data as Datasets, sharded with `wrap_dataset` (or, with `wrap` false, not).
template <bool wrap>
class DatasetTrial : public BlobsTrial {
 public:
  using BlobsTrial::BlobsTrial;
  trial::DataLoader build_training_data_loader() override { return dataset(blobs(125), true); }
  trial::DataLoader build_validation_data_loader() override { return dataset(blobs(50, 7), false); }

 private:
  trial::DataLoader dataset(const Blobs& data, bool repeat) {
    const auto batch = static_cast<std::size_t>(context.get_per_slot_batch_size());
    auto slices = from_tensor_slices(data.x, data.y);
    if constexpr (wrap) {
      // Sharded after the repeat: one global stream on any number of ranks.
      if (repeat) return context.wrap_dataset(std::move(slices).repeat()).batch(batch);
      return context.wrap_dataset(std::move(slices)).batch(batch);
    } else {
      return slices.batch(batch);
    }
  }
};
LOADSTAR_REGISTER_TRIAL(DatasetTrial<true>, "dist:dataset");

/// The same data through the data layer's cache, shuffled with the trial seed and sharded by it.
class CachedTrial : public BlobsTrial {
 public:
  using BlobsTrial::BlobsTrial;
  trial::DataLoader build_training_data_loader() override {
    const auto batch = static_cast<std::size_t>(context.get_per_slot_batch_size());
    return context.experimental
        .cache_train_dataset("blobs", "v1", true)([this] {
          std::ofstream(context.get_data_config().at("maker_calls").get<std::string>(),
                        std::ios::app)
              << context.distributed.rank << "\n";
          const Blobs data = blobs(125);
          return from_tensor_slices(data.x, data.y);
        })
        .batch(batch);
  }
  trial::DataLoader build_validation_data_loader() override {
    const auto batch = static_cast<std::size_t>(context.get_per_slot_batch_size());
    return context.experimental
        .cache_validation_dataset("blobs", "v1")([] {
          const Blobs data = blobs(50, 7);
          return from_tensor_slices(data.x, data.y);
        })
        .batch(batch);
  }
};
LOADSTAR_REGISTER_TRIAL(CachedTrial, "dist:cached");

/// The same data as a `Sequence` of 6 rows a batch, read by 3 worker threads with shuffling.
class SequenceTrial : public BlobsTrial {
 public:
  using BlobsTrial::BlobsTrial;
  trial::DataLoader build_training_data_loader() override {
    context.configure_fit({.workers = 3, .shuffle = true});
    auto data = blobs(125);
    return ArraySequence(data.x, data.y, 6);
  }
};
LOADSTAR_REGISTER_TRIAL(SequenceTrial, "dist:sequence");
LOADSTAR_REGISTER_TRIAL(DatasetTrial<false>, "dist:dataset-unwrapped");

/// Hyperparameters that cannot work: every rank throws InvalidHP from build_model.
class InvalidTrial : public BlobsTrial {
 public:
  using BlobsTrial::BlobsTrial;
  std::shared_ptr<keras::Model> build_model() override {
    throw trial::InvalidHP("the model does not fit these ranks");
  }
};
LOADSTAR_REGISTER_TRIAL(InvalidTrial, "dist:invalid");

}  // namespace

int main(int argc, char** argv) {
  auto world = dist::mpi_world(&argc, &argv);
  if (argc != 3 && argc != 4) {
    std::cerr << "usage: dist_trial_child DIR BATCHES "
                 "[blobs|sequence|dataset|dataset-unwrapped|cached|invalid]\n";
    return 2;
  }
  const std::string dir = argv[1];
  const auto batches = std::stoull(argv[2]);
  const std::string kind = argc == 4 ? argv[3] : "blobs";
  return dist::run_or_abort(*world, [&] {
    const auto config = trial::parse_experiment_config("entrypoint: dist:" + kind + R"(
hyperparameters: {global_batch_size: 12}
records_per_epoch: 125
scheduling_unit: 5
min_validation_period: {batches: 10}
min_checkpoint_period: {batches: 10}
searcher: {name: single, metric: val_loss, max_length: {batches: 60}}
reproducibility: {experiment_seed: 3}
data_layer: {host_storage_path: )" + dir + R"(/cache}
data: {maker_calls: )" + dir + R"(/maker_calls}
)",
                                                       "dist_trial_child.yaml");
    const auto result =
        trial::run_trial({.config = config,
                          .hparams = {{"global_batch_size", 12}},
                          .trial_seed = 17,
                          .trial_dir = dir + "/trial",
                          .checkpoint_dir = dir + "/checkpoints",
                          .collective = world},
                         {.until = trial::Length{trial::Unit::batches, batches}, .verbose = false});
    if (world->rank() == 0) {
      const auto model = keras::load_model(std::filesystem::path(dir) / "checkpoints" /
                                           result.latest_checkpoint / trial::checkpoint_model_file);
      nlohmann::json weights = nlohmann::json::array();
      for (const auto& w : model->get_weights())
        weights.push_back(std::vector<float>(w.data(), w.data() + w.size()));
      std::cout << nlohmann::json{{"batches", result.total_batches}, {"weights", weights}}.dump()
                << std::endl;
    }
    return 0;
  });
}

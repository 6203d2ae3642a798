// ModelCheckpoint: file path templates formatted as CPython formats them (reference file from
// tests/keras/generate_checkpoint_paths.py), best-only saving with min, max and auto, saving every
// few batches, Keras's messages, and files that load back.
#include <doctest/doctest.h>

#include "keras/blobs.hpp"
#include "temp_dir.hpp"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <loadstar/keras.hpp>
#include <loadstar/keras/callbacks/model_checkpoint.hpp>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using namespace loadstar;
using namespace loadstar::keras;
using callbacks::ModelCheckpoint;
using callbacks::ModelCheckpointOptions;
using test_support::TempDir;

namespace {

const nlohmann::json& reference() {
  static const nlohmann::json json = [] {
    const char* root = std::getenv("LOADSTAR_SOURCE_DIR");
    REQUIRE_MESSAGE(root != nullptr, "LOADSTAR_SOURCE_DIR is not set");
    std::ifstream in(std::string(root) + "/tests/keras/reference/checkpoint_paths.json");
    REQUIRE_MESSAGE(in.good(), "cannot open the reference file paths");
    return nlohmann::json::parse(in);
  }();
  return json;
}

std::shared_ptr<Model> classifier(std::uint64_t seed = 3) {
  set_random_seed(seed);
  auto model = std::make_shared<Sequential>(std::initializer_list<SequentialItem>{
      Input({2}), layers::Dense(8, {.activation = "relu"}), layers::Dense(2)});
  model->compile({.optimizer = optimizers::Adam({.learning_rate = 0.01}),
                  .loss = losses::SparseCategoricalCrossentropy(true),
                  .metrics = {"accuracy"}});
  return model;
}

/// The files of `dir`, by name.
std::set<std::string> files_in(const std::filesystem::path& dir) {
  std::set<std::string> names;
  if (!std::filesystem::exists(dir)) return names;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    names.insert(entry.path().filename().string());
  return names;
}

/// Drives `checkpoint` through epochs whose logs hold `monitor` = each of `values`, as fit would.
std::string drive(ModelCheckpoint& checkpoint, Model& model, const std::string& monitor,
                  const std::vector<double>& values) {
  std::ostringstream out;
  checkpoint.set_model(model);
  checkpoint.set_params({.verbose = 0, .epochs = values.size(), .steps = 1, .output = &out});
  checkpoint.on_train_begin({});
  for (std::size_t epoch = 0; epoch < values.size(); ++epoch) {
    Logs logs;
    logs.set("loss", 1.0);
    logs.set(monitor, values[epoch]);
    checkpoint.on_epoch_begin(epoch, {});
    checkpoint.on_epoch_end(epoch, logs);
  }
  checkpoint.on_train_end({});
  return out.str();
}

}  // namespace

TEST_SUITE("keras") {
  TEST_CASE("ModelCheckpoint formats file paths as Python's str.format") {
    // epoch 3 and batch 12 (1-based, as the template sees them), the rest logs.
    const auto& ref = reference();
    Logs logs;
    for (const auto& [name, value] : ref["values"].items()) {
      if (name == "epoch" || name == "batch") continue;
      logs.set(name,
               value.is_string() ? std::numeric_limits<double>::infinity() : value.get<double>());
    }
    REQUIRE(ref["values"]["epoch"] == 3);
    REQUIRE(ref["values"]["batch"] == 12);
    for (const auto& c : ref["cases"]) {
      const std::string text = c["template"].get<std::string>();
      CAPTURE(text);
      if (c.contains("expected")) {
        CHECK(ModelCheckpoint(text).file_path(2, 11, logs).string() ==
              c["expected"].get<std::string>());
      } else {
        const std::string message = "model checkpoint: file path template '" + text + "'";
        CHECK_THROWS_WITH_AS(ModelCheckpoint(text).file_path(2, 11, logs),
                             doctest::Contains(message.c_str()), ConfigError);
      }
    }
  }

  TEST_CASE("ModelCheckpoint names the template and the field in its errors") {
    Logs logs;
    logs.set("loss", 0.5);
    CHECK_THROWS_WITH_AS(ModelCheckpoint("m-{val_loss:.2f}.h5").file_path(2, std::nullopt, logs),
                         "model checkpoint: file path template 'm-{val_loss:.2f}.h5': the field "
                         "'val_loss' is not among the values (epoch, loss)",
                         ConfigError);
    CHECK_THROWS_WITH_AS(ModelCheckpoint("m-{batch}.h5").file_path(2, std::nullopt, logs),
                         doctest::Contains("the field 'batch' is not among the values"),
                         ConfigError);
    CHECK(ModelCheckpoint("m-{batch}.h5").file_path(2, 4, logs) == "m-5.h5");
    CHECK_THROWS_WITH_AS(ModelCheckpoint("m-{loss:d}.h5").file_path(2, std::nullopt, logs),
                         "model checkpoint: file path template 'm-{loss:d}.h5': the field 'loss' "
                         "has the format spec 'd': unknown format code 'd' for object of type "
                         "'float'",
                         ConfigError);
    CHECK_THROWS_WITH_AS(ModelCheckpoint("m-{epoch:02x}.h5"),
                         doctest::Contains("the field 'epoch' has the format spec '02x': the type "
                                           "'x' is not supported"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(ModelCheckpoint("m-{epoch}.txt"),
                         "model checkpoint: file path template 'm-{epoch}.txt' should end in "
                         "'.h5', '.hdf5' or '.keras'",
                         ConfigError);
    CHECK_THROWS_WITH_AS(ModelCheckpoint("m.keras", {.save_weights_only = true}),
                         doctest::Contains("should end in '.h5', '.hdf5' or '.weights.h5'"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(ModelCheckpoint("m.h5", {.mode = "up"}),
                         "model checkpoint: mode must be 'auto', 'min' or 'max' but is 'up'",
                         ConfigError);
    // A field missing from the logs fails at the save that needs it, in fit.
    TempDir dir;
    const Blobs data = blobs(64);
    auto model = classifier();
    auto checkpoint = std::make_shared<ModelCheckpoint>((dir / "m-{val_loss:.2f}.h5").string());
    CHECK_THROWS_WITH_AS(
        model->fit(data.x, data.y, {.epochs = 1, .verbose = 0, .callbacks = {checkpoint}}),
        doctest::Contains("the field 'val_loss' is not among the values (accuracy, epoch, loss)"),
        ConfigError);
  }

  TEST_CASE("ModelCheckpoint saves every epoch under the formatted names") {
    TempDir dir;
    const Blobs data = blobs(96);
    auto model = classifier();
    auto checkpoint =
        std::make_shared<ModelCheckpoint>((dir / "ckpt" / "w-{epoch:02d}.weights.h5").string(),
                                          ModelCheckpointOptions{.save_weights_only = true});
    model->fit(data.x, data.y, {.epochs = 3, .verbose = 0, .callbacks = {checkpoint}});
    CHECK(files_in(dir / "ckpt") ==
          std::set<std::string>{"w-01.weights.h5", "w-02.weights.h5", "w-03.weights.h5"});
    CHECK(checkpoint->last_saved() == dir / "ckpt" / "w-03.weights.h5");
    // The last file holds the final weights.
    auto fresh = classifier(99);
    fresh->load_weights(dir / "ckpt" / "w-03.weights.h5");
    const auto a = fresh->get_weights();
    const auto b = model->get_weights();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i)
      CHECK(a[i] == b[i]);
  }

  TEST_CASE("ModelCheckpoint saves the whole model with its optimizer") {
    TempDir dir;
    const Blobs data = blobs(96);
    auto model = classifier();
    auto checkpoint = std::make_shared<ModelCheckpoint>((dir / "model.h5").string());
    model->fit(data.x, data.y, {.epochs = 2, .verbose = 0, .callbacks = {checkpoint}});
    const auto loaded = load_model(dir / "model.h5");
    const auto a = loaded->get_weights();
    const auto b = model->get_weights();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i)
      CHECK(a[i] == b[i]);
    CHECK(loaded->optimizer().iterations() == model->optimizer().iterations());
  }

  TEST_CASE("ModelCheckpoint with save_best_only saves only improvements") {
    TempDir dir;
    auto model = classifier();
    const std::string path = (dir / "m-{epoch:02d}.weights.h5").string();
    SUBCASE("min on a loss in auto mode") {
      ModelCheckpoint checkpoint(
          path,
          {.monitor = "val_loss", .verbose = 1, .save_best_only = true, .save_weights_only = true});
      const std::string out = drive(checkpoint, *model, "val_loss", {0.5, 0.7, 0.25, 0.25});
      CHECK(files_in(dir.path()) == std::set<std::string>{"m-01.weights.h5", "m-03.weights.h5"});
      CHECK(checkpoint.best() == 0.25);
      CHECK(out == "\nEpoch 1: val_loss improved from inf to 0.50000, saving model to " +
                       (dir / "m-01.weights.h5").string() +
                       "\n\nEpoch 2: val_loss did not improve from 0.50000\n"
                       "\nEpoch 3: val_loss improved from 0.50000 to 0.25000, saving model to " +
                       (dir / "m-03.weights.h5").string() +
                       "\n\nEpoch 4: val_loss did not improve from 0.25000\n");
    }
    SUBCASE("max on an accuracy in auto mode") {
      ModelCheckpoint checkpoint(
          path, {.monitor = "val_accuracy", .save_best_only = true, .save_weights_only = true});
      CHECK(drive(checkpoint, *model, "val_accuracy", {0.5, 0.7, 0.6, 0.9}).empty());
      CHECK(files_in(dir.path()) ==
            std::set<std::string>{"m-01.weights.h5", "m-02.weights.h5", "m-04.weights.h5"});
    }
    SUBCASE("max in auto mode for any name containing acc") {
      ModelCheckpoint checkpoint(
          path, {.monitor = "val_my_acc_score", .save_best_only = true, .save_weights_only = true});
      drive(checkpoint, *model, "val_my_acc_score", {0.5, 0.4, 0.6});
      CHECK(files_in(dir.path()) == std::set<std::string>{"m-01.weights.h5", "m-03.weights.h5"});
    }
    SUBCASE("explicit min on an accuracy") {
      ModelCheckpoint checkpoint(path, {.monitor = "accuracy",
                                        .save_best_only = true,
                                        .save_weights_only = true,
                                        .mode = "min"});
      drive(checkpoint, *model, "accuracy", {0.5, 0.7, 0.4});
      CHECK(files_in(dir.path()) == std::set<std::string>{"m-01.weights.h5", "m-03.weights.h5"});
    }
    SUBCASE("explicit max on a loss") {
      ModelCheckpoint checkpoint(
          path,
          {.monitor = "loss2", .save_best_only = true, .save_weights_only = true, .mode = "max"});
      drive(checkpoint, *model, "loss2", {0.5, 0.7, 0.4});
      CHECK(files_in(dir.path()) == std::set<std::string>{"m-01.weights.h5", "m-02.weights.h5"});
    }
    SUBCASE("an initial value threshold") {
      ModelCheckpoint checkpoint(path, {.monitor = "val_loss",
                                        .verbose = 1,
                                        .save_best_only = true,
                                        .save_weights_only = true,
                                        .initial_value_threshold = 0.3});
      const std::string out = drive(checkpoint, *model, "val_loss", {0.5, 0.2});
      CHECK(files_in(dir.path()) == std::set<std::string>{"m-02.weights.h5"});
      CHECK(out ==
            "\nEpoch 1: val_loss did not improve from 0.30000\n"
            "\nEpoch 2: val_loss improved from 0.30000 to 0.20000, saving model to " +
                (dir / "m-02.weights.h5").string() + "\n");
    }
    SUBCASE("a monitor missing from the logs") {
      ModelCheckpoint checkpoint(
          path, {.monitor = "val_auc", .save_best_only = true, .save_weights_only = true});
      CHECK(drive(checkpoint, *model, "val_loss", {0.5}) ==
            "Can save best model only with val_auc available, skipping.\n");
      CHECK(files_in(dir.path()).empty());
    }
  }

  TEST_CASE("ModelCheckpoint prints every save with verbose") {
    TempDir dir;
    auto model = classifier();
    ModelCheckpoint checkpoint((dir / "m.weights.h5").string(),
                               {.verbose = 1, .save_weights_only = true});
    CHECK(drive(checkpoint, *model, "val_loss", {0.5, 0.7}) ==
          "\nEpoch 1: saving model to " + (dir / "m.weights.h5").string() +
              "\n\nEpoch 2: saving model to " + (dir / "m.weights.h5").string() + "\n");
  }

  TEST_CASE("ModelCheckpoint with an integer save_freq saves every few batches") {
    TempDir dir;
    const Blobs data = blobs(320);  // 10 batches of 32 an epoch
    auto model = classifier();
    auto checkpoint = std::make_shared<ModelCheckpoint>(
        (dir / "w-{epoch}-{batch}.weights.h5").string(),
        ModelCheckpointOptions{.save_weights_only = true, .save_freq = 7});
    model->fit(data.x, data.y, {.epochs = 3, .verbose = 0, .callbacks = {checkpoint}});
    // Batches 7, 14, 21 and 28 of the run: Keras counts across epochs, names are 1-based.
    CHECK(files_in(dir.path()) == std::set<std::string>{"w-1-7.weights.h5", "w-2-4.weights.h5",
                                                        "w-3-1.weights.h5", "w-3-8.weights.h5"});
    const auto state = checkpoint->get_state();
    CHECK(state["batches_since_last_save"] == 2);
    CHECK(state["last_batch_seen"] == 9);
  }

  TEST_CASE("ModelCheckpoint state and config round-trip") {
    ModelCheckpoint checkpoint("m-{epoch}.h5", {.monitor = "val_accuracy",
                                                .save_best_only = true,
                                                .save_freq = 3,
                                                .initial_value_threshold = 0.5});
    CHECK(checkpoint.best() == 0.5);
    const auto config = checkpoint.get_config();
    CHECK(config["save_freq"] == 3);
    const auto made = Registry<callbacks::Callback>::instance().create("ModelCheckpoint", config);
    CHECK(made->get_config() == config);
    nlohmann::json state = {
        {"best", 0.75}, {"batches_since_last_save", 2}, {"last_batch_seen", 4}, {"epoch", 6}};
    ModelCheckpoint restored("m-{epoch}.h5", {.monitor = "val_accuracy", .save_best_only = true});
    restored.load_state(state);
    CHECK(restored.get_state() == state);
    CHECK(restored.best() == 0.75);
    state.erase("best");
    CHECK_THROWS_WITH_AS(restored.load_state(state),
                         doctest::Contains("model checkpoint state: the field 'best' is missing"),
                         CheckpointError);
  }
}

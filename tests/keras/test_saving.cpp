// save_model, load_model, save_weights and load_weights: round trips through both formats,
// training that continues bitwise after a save and a load in a fresh process, weights files by
// position and by name, and the errors.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>
#include <loadstar/keras/callbacks/detail/files.hpp>

#include <H5Cpp.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <loadstar/keras.hpp>
#include <memory>
#include <string>
#include <vector>

#include "keras/saving_support.hpp"
#include "temp_dir.hpp"

using namespace loadstar;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;
using namespace saving_support;
using test_support::TempDir;

namespace {

std::vector<std::string> files_in(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    out.push_back(entry.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

using loadstar::keras::detail::read_bytes;

/// Trains `model` on batch `k` of a fixed stream of batches, for k in [first, last).
void train(Model& model, std::size_t first, std::size_t last) {
  for (std::size_t k = first; k < last; ++k) {
    const auto x = inputs(8, 6, static_cast<float>(k));
    const auto y = labels(8, 3);
    model.train_on_batch(x, y);
  }
}

/// Runs `body` in a forked child (a fresh process for what it loads); returns its exit status.
int in_child(const std::function<void()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int status = 0;
    try {
      body();
    } catch (...) {
      status = 1;
    }
    ::_exit(status);
  }
  int status = -1;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void compile_with(Model& model, const std::string& optimizer) {
  if (optimizer == "adam") {
    model.compile(optimizers::Adam({.learning_rate = 0.01}), "sparse_categorical_crossentropy",
                  {"accuracy"});
  } else {
    model.compile(optimizers::SGD({.learning_rate = 0.05, .momentum = 0.9}),
                  "sparse_categorical_crossentropy", {"accuracy"});
  }
}

}  // namespace

TEST_SUITE("keras") {
  TEST_CASE("save_model round-trips a Sequential model through both formats") {
    TempDir dir;
    auto model = sequential_mlp();
    compile_with(*model, "adam");
    train(*model, 0, 2);
    const auto x = inputs(5, 6, 0.5F);
    for (const char* name : {"mlp.h5", "mlp.hdf5", "mlp.keras"}) {
      INFO(std::string(name));
      model->save(dir / name);
      auto loaded = load_model(dir / name);
      CHECK(same_weights(loaded->get_weights(), model->get_weights()));
      CHECK(loaded->predict(x) == model->predict(x));
      CHECK(model_get_config(*loaded) == model_get_config(*model));
      REQUIRE(loaded->compiled());
      CHECK(loaded->optimizer().class_name() == "Adam");
      CHECK(loaded->optimizer().iterations() == 2);
      CHECK(loaded->optimizer().get_config() == model->optimizer().get_config());
      REQUIRE(loaded->compile_options().metrics.size() == 1);
      CHECK(loaded->compile_options().metrics[0].name() == "accuracy");
      CHECK(loaded->compile_options().loss.list().front().name() ==
            "sparse_categorical_crossentropy");
    }
    CHECK(files_in(dir.path()) == std::vector<std::string>{"mlp.h5", "mlp.hdf5", "mlp.keras"});
  }

  TEST_CASE("save_model round-trips a functional model through both formats") {
    TempDir dir;
    auto model = functional_model();
    const auto x = inputs(4, 6, 1.5F);
    for (const char* name : {"branches.h5", "branches.keras"}) {
      INFO(std::string(name));
      save_model(*model, dir / name);
      auto loaded = load_model(dir / name, {}, {.trust = Trust::trusted});
      CHECK(same_weights(loaded->get_weights(), model->get_weights()));
      CHECK(loaded->predict(x) == model->predict(x));
      CHECK(model_get_config(*loaded) == model_get_config(*model));
      CHECK(loaded->input_names() == std::vector<std::string>{"features"});
      CHECK_FALSE(loaded->compiled());
    }
  }

  TEST_CASE("save_model without the optimizer writes no training state") {
    TempDir dir;
    auto model = sequential_mlp();
    compile_with(*model, "sgd");
    train(*model, 0, 1);
    for (const char* name : {"plain.h5", "plain.keras"}) {
      save_model(*model, dir / name, {.include_optimizer = false});
      auto loaded = load_model(dir / name);
      CHECK_FALSE(loaded->compiled());
      CHECK(same_weights(loaded->get_weights(), model->get_weights()));
      // And a compiled file loads uncompiled on request.
      save_model(*model, dir / name);
      CHECK_FALSE(load_model(dir / name, {}, {.compile = false})->compiled());
    }
  }

  TEST_CASE("load_model continues training bitwise in a fresh process") {
    for (const std::string optimizer : {"adam", "sgd"}) {
      for (const std::string name : {"resume.h5", "resume.keras"}) {
        const std::string label = optimizer + " " + name;
        INFO(label);
        TempDir dir;
        auto uninterrupted = sequential_mlp();
        compile_with(*uninterrupted, optimizer);
        train(*uninterrupted, 0, 6);

        auto first = sequential_mlp();
        compile_with(*first, optimizer);
        train(*first, 0, 3);
        first->save(dir / name);
        // A fresh process loads the file, trains on and saves the result.
        const int status = in_child([&] {
          auto resumed = load_model(dir / name);
          train(*resumed, 3, 6);
          resumed->save(dir / ("final-" + name));
        });
        REQUIRE(status == 0);
        auto final_model = load_model(dir / ("final-" + name));
        CHECK(same_weights(final_model->get_weights(), uninterrupted->get_weights()));
        CHECK(final_model->optimizer().iterations() == 6);
        // In this process too.
        auto resumed = load_model(dir / name);
        train(*resumed, 3, 6);
        CHECK(same_weights(resumed->get_weights(), uninterrupted->get_weights()));
        for (std::size_t i = 0; i < resumed->optimizer().variables().size(); ++i) {
          CHECK(resumed->optimizer().variables()[i].value ==
                uninterrupted->optimizer().variables()[i].value);
        }
      }
    }
  }

  TEST_CASE("load_weights with optimizer restores the optimizer of a whole-model file") {
    TempDir dir;
    auto uninterrupted = sequential_mlp();
    compile_with(*uninterrupted, "adam");
    train(*uninterrupted, 0, 4);
    auto first = sequential_mlp();
    compile_with(*first, "adam");
    train(*first, 0, 2);
    for (const char* name : {"state.h5", "state.keras"}) {
      INFO(std::string(name));
      first->save(dir / name);
      auto other = sequential_mlp();
      compile_with(*other, "adam");
      other->load_weights(dir / name, {.optimizer = true});
      CHECK(other->optimizer().iterations() == 2);
      train(*other, 2, 4);
      CHECK(same_weights(other->get_weights(), uninterrupted->get_weights()));
    }
  }

  TEST_CASE("save_weights and load_weights round-trip both weights layouts") {
    TempDir dir;
    auto model = functional_model();
    const auto x = inputs(3, 6);
    for (const char* name : {"w.h5", "w.weights.h5"}) {
      INFO(std::string(name));
      model->save_weights(dir / name);
      auto other = model_from_json(model->to_json());
      CHECK_FALSE(same_weights(other->get_weights(), model->get_weights()));
      other->load_weights(dir / name);
      CHECK(same_weights(other->get_weights(), model->get_weights()));
      CHECK(other->predict(x) == model->predict(x));
      CHECK_THROWS_WITH_AS(load_model(dir / name), doctest::Contains("holds weights only"),
                           FormatError);
    }
    // Whole-model files are weights files too.
    model->save(dir / "whole.keras");
    auto other = model_from_json(model->to_json());
    other->load_weights(dir / "whole.keras");
    CHECK(same_weights(other->get_weights(), model->get_weights()));
    CHECK_THROWS_WITH_AS(model->save_weights(dir / "w.keras"),
                         doctest::Contains("expected a path ending in .h5, .hdf5 or .weights.h5"),
                         ConfigError);
  }

  TEST_CASE("load_weights by_name matches layers by name and skip_mismatch skips misfits") {
    TempDir dir;
    set_random_seed(3);
    Sequential source{Input({4}), Dense(5, {.name = "a"}), Dense(2, {.name = "b"})};
    source.save_weights(dir / "ab.h5");
    // Another order, an extra layer, and a layer of another shape.
    set_random_seed(4);
    Sequential target{Input({4}), Dense(5, {.name = "a"}), Dense(5, {.name = "extra"}),
                      Dense(3, {.name = "b"})};
    const auto before = target.get_weights();
    CHECK_THROWS_WITH_AS(
        target.load_weights(dir / "ab.h5", {.by_name = true}),
        doctest::Contains("layer 'b' weight 'kernel' has shape (5, 3) but the file's "
                          "'b/kernel:0' has shape (5, 2)"),
        ShapeError);
    target.load_weights(dir / "ab.h5", {.by_name = true, .skip_mismatch = true});
    const auto after = target.get_weights();
    CHECK(after[0] == source.get_weights()[0]);  // a: loaded
    CHECK(after[1] == source.get_weights()[1]);
    CHECK(after[2] == before[2]);  // extra: not in the file
    CHECK(after[4] == before[4]);  // b: skipped
    // By position the layer counts differ.
    CHECK_THROWS_WITH_AS(target.load_weights(dir / "ab.h5"),
                         doctest::Contains("holds weights for 2 layers ('a', 'b') but model "
                                           "'sequential' has 3 layers with weights"),
                         FormatError);
    // The right count and the wrong shape.
    Sequential wide{Input({4}), Dense(6, {.name = "a"}), Dense(2, {.name = "b"})};
    CHECK_THROWS_WITH_AS(wide.load_weights(dir / "ab.h5"),
                         doctest::Contains("ab.h5': layer 'a' weight 'kernel' has shape (4, 6) "
                                           "but the file's 'a/kernel:0' has shape (4, 5)"),
                         ShapeError);
    // Keras 3 layout: a missing layer group.
    source.save_weights(dir / "ab.weights.h5");
    Sequential longer{Input({4}), Dense(5), Dense(2), Dense(2)};
    CHECK_THROWS_WITH_AS(longer.load_weights(dir / "ab.weights.h5"),
                         doctest::Contains("has no group 'layers/dense_2/vars'"), FormatError);
  }

  TEST_CASE("load_model names the layer and class a file lists but loadstar lacks") {
    TempDir dir;
    Sequential model{Input({4}), Dense(2, {.name = "scores"})};
    model.save(dir / "custom.h5");
    {
      // Rewrite model_config as a file from a program with a custom layer would have it.
      H5::H5File file((dir / "custom.h5").string(), H5F_ACC_RDWR);
      std::string config = model.to_json();
      config.replace(config.find("\"Dense\""), 7, "\"MyDense\"");
      file.removeAttr("model_config");
      H5::StrType type(H5::PredType::C_S1, H5T_VARIABLE);
      file.createAttribute("model_config", type, H5::DataSpace(H5S_SCALAR)).write(type, config);
    }
    CHECK_THROWS_WITH_AS(
        load_model(dir / "custom.h5"),
        doctest::Contains("custom.h5': layer 'scores' (config.layers[1]) has class "
                          "'MyDense', which loadstar does not support"),
        ConfigError);
    CustomObjects custom;
    custom.add<Layer>("MyDense", [](const nlohmann::json& config) {
      return Registry<Layer>::instance().create("Dense", config);
    });
    CHECK(load_model(dir / "custom.h5", custom)->layers().front()->class_name() == "Dense");
  }

  TEST_CASE("save_model leaves no file behind when a write fails") {
    TempDir dir;
    Sequential good{Input({3}), Dense(2)};
    good.save(dir / "model.h5");
    good.save(dir / "model.keras");
    const std::string before = read_bytes(dir / "model.h5");
    // A layer name HDF5 cannot create a group for: the write fails after it has begun.
    Sequential bad{Input({3}), Dense(2, {.name = "bad/."})};
    CHECK_THROWS_WITH_AS(bad.save(dir / "model.h5"),
                         doctest::Contains("model.h5': cannot create group 'bad/.'"), IoError);
    CHECK(read_bytes(dir / "model.h5") == before);
    CHECK_THROWS_AS(save_weights(bad, dir / "weights.h5"), IoError);
    CHECK(files_in(dir.path()) == std::vector<std::string>{"model.h5", "model.keras"});
    // overwrite = false.
    CHECK_THROWS_WITH_AS(good.save(dir / "model.keras", {.overwrite = false}),
                         doctest::Contains("model.keras': exists and overwrite is false"), IoError);
    // A directory that does not exist.
    for (const char* name : {"missing/model.h5", "missing/model.keras"}) {
      CHECK_THROWS_AS(good.save(dir / name), IoError);
    }
    CHECK_THROWS_WITH_AS(good.save(dir / "model.json"),
                         doctest::Contains("expected a path ending in .h5, .hdf5 or .keras"),
                         ConfigError);
    // A read-only directory (root writes anyway, so only checked for other users).
    if (::geteuid() != 0) {
      const auto locked = dir / "locked";
      std::filesystem::create_directory(locked);
      std::filesystem::permissions(
          locked, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
      CHECK_THROWS_AS(good.save(locked / "model.h5"), IoError);
      CHECK_THROWS_AS(good.save(locked / "model.keras"), IoError);
      CHECK(files_in(locked).empty());
      std::filesystem::permissions(locked, std::filesystem::perms::owner_all);
    }
    CHECK(files_in(dir.path()) == std::vector<std::string>{"model.h5", "model.keras"});
    CHECK_THROWS_WITH_AS(load_model(dir / "absent.h5"), doctest::Contains("cannot open"), IoError);
  }

  TEST_CASE("save_model writes the files compare_h5_structure.py compares") {
    // The structure script runs this case with LOADSTAR_STRUCTURE_DIR set; alone it checks that
    // they are written.
    TempDir temp;
    const char* env = std::getenv("LOADSTAR_STRUCTURE_DIR");
    const std::filesystem::path dir = env != nullptr ? std::filesystem::path(env) : temp.path();
    set_random_seed(5);
    Sequential cnn{Input({6, 6, 1}), Conv2D(4, 3, {.activation = "relu"}), MaxPooling2D(),
                   Flatten(),        Dense(8, {.activation = "relu"}),     Dense(3)};
    cnn.compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
    Tensor<float> x({4, 6, 6, 1});
    for (std::size_t i = 0; i < x.size(); ++i)
      x.data()[i] = static_cast<float>(i % 5) * 0.2F;
    cnn.train_on_batch(x, labels(4, 3));
    cnn.save(dir / "ours_model.h5");
    cnn.save_weights(dir / "ours_weights.h5");
    cnn.save(dir / "ours_model.keras");
    cnn.save_weights(dir / "ours.weights.h5");
    for (const char* name :
         {"ours_model.h5", "ours_weights.h5", "ours_model.keras", "ours.weights.h5"}) {
      CHECK(std::filesystem::file_size(dir / name) > 0);
    }
  }
}

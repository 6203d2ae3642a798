// SimpleRNN, LSTM, GRU and Bidirectional: forward, input and weight gradients against PyTorch
// (tests/keras/generate_recurrent.py), configs, files, training, refusals, and the orthogonal
// initializer.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <loadstar/error.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/keras/backend/cpu_backend.hpp>
#include <loadstar/keras/saving/detail/model_file.hpp>
#include <loadstar/keras/saving/model_config.hpp>
#include <loadstar/keras/saving/saving.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "keras/layer_cases.hpp"
#include "keras/protected_backend.hpp"
#include "temp_dir.hpp"

using loadstar::ConfigError;
using loadstar::FormatError;
using loadstar::Shape;
using loadstar::ShapeError;
using loadstar::Tensor;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;
using nlohmann::json;

namespace {

const json& recurrent_reference() {
  static const json data = layer_cases::load("recurrent.json");
  return data;
}

Tensor<float> recurrent_wave(const Shape& shape, float scale, float phase = 0.0F) {
  Tensor<float> t(shape);
  float v = phase;
  for (float& x : t) {
    x = scale * std::sin(v);
    v += 0.37F;
  }
  return t;
}

bool recurrent_same_bits(const Tensor<float>& a, const Tensor<float>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// A model of one recurrent layer trained two SGD steps: its config rebuilds it, and its .h5 and
/// .keras files load with the same config, weights and predictions, bit for bit.
void check_recurrent_round_trip(const std::string& class_name, const json& config,
                                const Shape& shape) {
  INFO(class_name, " ", config.dump());
  auto input = Input(shape, "in");
  auto out = call(LayerRegistry::instance().create(class_name, config), input);
  auto model = std::make_shared<Model>(std::vector{input}, std::vector{out}, "round_trip");
  const Tensor<float> x = recurrent_wave(shape.prepend(4), 1.5F);
  const Tensor<float> y = recurrent_wave(out.shape().prepend(4), 0.5F, 1.0F);
  model->compile({.optimizer = "sgd", .loss = "mse"});
  const auto before = model->get_weights();
  model->train_on_batch(x, y);
  model->train_on_batch(x, y);
  CHECK_FALSE(recurrent_same_bits(before.at(0), model->get_weights().at(0)));
  const json full = model_get_config(*model);
  const auto copy = model_from_config(full);
  CHECK(model_get_config(*copy) == full);
  copy->set_weights(model->get_weights());
  const Tensor<float> expected = model->predict(x, {.verbose = 0});
  CHECK(recurrent_same_bits(copy->predict(x, {.verbose = 0}), expected));
  test_support::TempDir dir;
  for (const char* file : {"model.h5", "model.keras"}) {
    INFO(file);
    model->save(dir / file);
    const auto loaded = load_model(dir / file);
    CHECK(model_get_config(*loaded) == full);
    const auto weights = loaded->get_weights();
    REQUIRE(weights.size() == model->get_weights().size());
    for (std::size_t i = 0; i < weights.size(); ++i)
      CHECK(recurrent_same_bits(weights[i], model->get_weights()[i]));
    CHECK(recurrent_same_bits(loaded->predict(x, {.verbose = 0}), expected));
  }
}

/// tests/keras/reference/recurrent_keras3.keras, written in Keras 3's layout by
/// tests/keras/generate_recurrent_keras3.py, which lists its groups and weights in
/// recurrent_keras3.json.
std::filesystem::path keras3_recurrent_file() {
  const char* dir = std::getenv("LOADSTAR_SOURCE_DIR");
  REQUIRE_MESSAGE(dir != nullptr, "LOADSTAR_SOURCE_DIR is not set");
  return std::filesystem::path(dir) / "tests/keras/reference/recurrent_keras3.keras";
}

/// Checks that `.keras` archive `path` holds exactly the `vars` groups the generator lists, with
/// their `name` attributes and number of datasets.
void check_keras3_groups(const std::filesystem::path& path, const json& groups) {
  const loadstar::detail::Hdf5Lock lock;
  const loadstar::keras::detail::ZipReader zip(path);
  const loadstar::keras::detail::H5Reader reader(
      zip.read("model.weights.h5", std::uint64_t{1} << 30), "weights");
  std::vector<std::string> expected;
  for (const auto& group : groups) {
    const std::string where = group["path"].get<std::string>();
    INFO(path.filename().string(), ": ", where);
    expected.push_back(where);
    REQUIRE(reader.is_group(reader.root(), where));
    const loadstar::keras::detail::H5Id vars = reader.open_group(reader.root(), where, where);
    CHECK(reader.string_attribute(vars.get(), "name", where) == group["name"]);
    CHECK(reader.children(vars.get(), where).size() == group["size"].get<std::size_t>());
  }
  // No other layer groups: every `vars` group below `layers/` is one of the generator's.
  const loadstar::keras::detail::ModelFile file = loadstar::keras::detail::read_keras3_weights(
      reader, loadstar::keras::detail::FileLayout::keras3_archive);
  std::vector<std::string> found{"vars"};
  for (const auto& layer : file.layers)
    found.push_back("layers/" + layer.name + "/vars");
  std::sort(expected.begin(), expected.end());
  std::sort(found.begin(), found.end());
  CHECK(found == expected);
}

/// 256 sequences of 6 numbers in [-1, 1] `(256, 6, 1)`, and their sums `(256, 1)`.
std::pair<Tensor<float>, Tensor<float>> sum_task() {
  const std::size_t n = 256, steps = 6;
  Tensor<float> x(Shape{n, steps, 1}), y(Shape{n, 1});
  loadstar::SplitMix64 rng(5);
  for (std::size_t i = 0; i < n; ++i) {
    float sum = 0.0F;
    for (std::size_t s = 0; s < steps; ++s) {
      const float v = float(rng.uniform() * 2.0 - 1.0);
      x.data()[i * steps + s] = v;
      sum += v;
    }
    y.data()[i] = sum;
  }
  return {x, y};
}

std::shared_ptr<Layer> make_layer(const std::string& class_name, const json& config) {
  return LayerRegistry::instance().create(class_name, config);
}

}  // namespace

TEST_SUITE("keras_layers") {
  TEST_CASE("Recurrent layers match the PyTorch reference values with one and three threads") {
    REQUIRE(recurrent_reference()["cases"].size() > 60);
    for (std::size_t threads : {1, 3}) {
      CpuBackend backend(threads);
      for (const auto& c : recurrent_reference()["cases"])
        layer_cases::run_case(c, backend);
    }
  }

  TEST_CASE("Recurrent layers compute only through the backend") {
    loadstar::test::ProtectedBackend backend(2);
    for (const auto& c : recurrent_reference()["cases"])
      layer_cases::run_case(c, backend);
  }

  TEST_CASE("Recurrent layers round-trip configs h5 and keras files") {
    check_recurrent_round_trip("LSTM", {{"units", 3}}, Shape{4, 2});
    check_recurrent_round_trip(
        "LSTM", {{"units", 3}, {"return_sequences", true}, {"go_backwards", true}}, Shape{3, 2});
    check_recurrent_round_trip("GRU", {{"units", 2}, {"return_sequences", true}}, Shape{3, 2});
    check_recurrent_round_trip("GRU", {{"units", 2}, {"reset_after", false}, {"use_bias", false}},
                               Shape{3, 2});
    check_recurrent_round_trip("SimpleRNN", {{"units", 3}, {"activation", "relu"}}, Shape{2, 2});
    check_recurrent_round_trip(
        "Bidirectional",
        {{"layer",
          {{"class_name", "LSTM"}, {"config", {{"units", 2}, {"return_sequences", true}}}}},
         {"merge_mode", "sum"}},
        Shape{3, 2});
    check_recurrent_round_trip("Bidirectional",
                               {{"layer", {{"class_name", "GRU"}, {"config", {{"units", 2}}}}}},
                               Shape{3, 2});
  }

  TEST_CASE("RNN of StackedRNNCells round-trips configs h5 and keras files") {
    const auto stack = [](json cells, json extra) {
      json config = {{"cell", {{"class_name", "StackedRNNCells"}, {"config", {{"cells", cells}}}}}};
      config.update(extra);
      return config;
    };
    const json lstm_gru = json::array(
        {{{"class_name", "LSTMCell"}, {"config", {{"units", 3}}}},
         {{"class_name", "GRUCell"}, {"config", {{"units", 2}, {"reset_after", false}}}}});
    check_recurrent_round_trip("RNN", stack(lstm_gru, json::object()), Shape{4, 2});
    check_recurrent_round_trip(
        "RNN", stack(lstm_gru, {{"return_sequences", true}, {"go_backwards", true}}), Shape{3, 2});
    const json two_lstm =
        json::array({{{"class_name", "LSTMCell"}, {"config", {{"units", 2}}}},
                     {{"class_name", "LSTMCell"}, {"config", {{"units", 3}, {"use_bias", false}}}},
                     {{"class_name", "SimpleRNNCell"}, {"config", {{"units", 2}}}}});
    check_recurrent_round_trip("RNN", stack(two_lstm, json::object()), Shape{3, 2});
    // A stack of another name keeps it, in its config and as its weights' scope.
    json named = stack(two_lstm, {{"name", "rnn"}});
    named["cell"]["config"]["name"] = "my_cells";
    check_recurrent_round_trip("RNN", named, Shape{3, 2});
    CHECK(make_layer("RNN", named)->get_config()["cell"]["config"]["name"] == "my_cells");
    // Keras's automatic cell names, and the weight names tf.keras gives them.
    const auto layer = make_layer("RNN", stack(two_lstm, {{"name", "rnn"}}));
    static_cast<void>(call(layer, Input(Shape{3, 2})));
    const json config = layer->get_config();
    CHECK(config["cell"]["config"]["cells"][1]["config"]["name"] == "lstm_cell_1");
    CHECK(config["cell"]["config"]["cells"][2]["config"]["name"] == "simple_rnn_cell");
    CHECK(layer->weights().size() == 8);
    CHECK(layer->weights()[3].name == "stacked_rnn_cells/lstm_cell_1/kernel");
    CHECK(layer->weights()[5].name == "stacked_rnn_cells/simple_rnn_cell/kernel");
  }

  TEST_CASE("RNN of StackedRNNCells carries every cell's states when stateful") {
    const auto make = [](bool stateful) {
      set_random_seed(21);
      auto in = Input(Shape{4, 2});
      auto out = call(
          StackedRNN({{.kind = CellKind::lstm, .units = 3}, {.kind = CellKind::gru, .units = 2}},
                     {.stateful = stateful, .name = "stack"}),
          in);
      return std::make_shared<Model>(std::vector{in}, std::vector{out}, "stateful_stack");
    };
    auto stateful = make(true);
    auto plain = make(false);
    const Tensor<float> a = recurrent_wave(Shape{3, 4, 2}, 1.0F);
    const Tensor<float> b = recurrent_wave(Shape{3, 4, 2}, 1.0F, 0.5F);
    CHECK(recurrent_same_bits(stateful->predict(a, {.verbose = 0}),
                              plain->predict(a, {.verbose = 0})));
    const json carried = stateful->carried_states();
    REQUIRE(carried.contains("stack"));
    CHECK(carried["stack"].size() == 3);  // the LSTM cell's h and c, the GRU cell's h
    const Tensor<float> next = stateful->predict(b, {.verbose = 0});
    CHECK_FALSE(recurrent_same_bits(next, plain->predict(b, {.verbose = 0})));
    stateful->restore_carried_states(carried);
    CHECK(recurrent_same_bits(stateful->predict(b, {.verbose = 0}), next));
    stateful->reset_states();
    CHECK(recurrent_same_bits(stateful->predict(b, {.verbose = 0}),
                              plain->predict(b, {.verbose = 0})));
    json two = carried;
    two["stack"].erase(2);
    CHECK_THROWS_WITH_AS(stateful->restore_carried_states(two),
                         doctest::Contains("rnn layer 'stack': carries 3 states (every cell's, in "
                                           "order) but was given states of shapes"),
                         ShapeError);
    CHECK_THROWS_WITH_AS(
        static_cast<void>(stateful->predict(recurrent_wave(Shape{2, 4, 2}, 1.0F), {.verbose = 0})),
        doctest::Contains("rnn layer 'stack': is stateful and carries the states "
                          "of batches of 3 samples, but got a batch of 2"),
        ShapeError);
  }

  TEST_CASE("RNN of StackedRNNCells refuses what it does not run, naming it") {
    const auto stack = [](json cells, json extra) {
      json config = {{"name", "rnn"},
                     {"cell", {{"class_name", "StackedRNNCells"}, {"config", {{"cells", cells}}}}}};
      config.update(extra);
      return config;
    };
    const json cells = json::array({{{"class_name", "LSTMCell"}, {"config", {{"units", 3}}}}});
    CHECK(make_layer("RNN", stack(cells, {{"return_state", true}}))->output_count() == 3);
    CHECK_THROWS_WITH_AS(
        make_layer("RNN",
                   stack(json::array({{{"class_name", "Dense"}, {"config", json::object()}}}),
                         json::object())),
        doctest::Contains("StackedRNNCells of SimpleRNNCell, LSTMCell or GRUCell cells but cell 0"),
        ConfigError);
    json reversed = stack(cells, json::object());
    reversed["cell"]["config"]["reverse_state_order"] = true;
    CHECK_THROWS_WITH_AS(make_layer("RNN", reversed),
                         doctest::Contains("config.cell: expected StackedRNNCells with "
                                           "reverse_state_order false"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(make_layer("RNN", stack(json::array(), json::object())),
                         doctest::Contains("config.cell: expected a StackedRNNCells config with a "
                                           "non-empty list of cells"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        make_layer("RNN", stack(json::array({{{"class_name", "LSTMCell"},
                                              {"config", {{"units", 3}, {"trainable", false}}}}}),
                                {{"trainable", true}})),
        doctest::Contains("a cell of the RNN's trainable true"), ConfigError);
    CHECK_THROWS_WITH_AS(
        make_layer("RNN", stack(json::array({{{"class_name", "LSTMCell"},
                                              {"config", {{"units", 3}, {"dropout", 2}}}}}),
                                json::object())),
        doctest::Contains("config.cell: layer (LSTMCell): config.dropout"), ConfigError);
    // Keras's initial_state: every cell's states, or none.
    auto layer = make_layer("RNN", stack(cells, json::object()));
    auto x = Input(Shape{4, 2});
    auto h = Input(Shape{3});
    CHECK_THROWS_WITH_AS(call(layer, {x, h}),
                         "rnn layer 'rnn': takes the sequence, and optionally every cell's initial "
                         "states (2 in cell order), but got 2 inputs",
                         ShapeError);
    CHECK_THROWS_WITH_AS(call(layer, {x, h, Input(Shape{2})}),
                         "rnn layer 'rnn': initial state 1 (of cell 'lstm_cell') must be (None, 3) "
                         "but is (None, 2)",
                         ShapeError);
    auto stateful = make_layer("RNN", stack(cells, {{"stateful", true}}));
    CHECK_THROWS_WITH_AS(call(stateful, {x, h, h}),
                         "rnn layer 'rnn': is stateful and was given initial states; a stateful "
                         "RNN starts from the states it carries",
                         ConfigError);
  }

  TEST_CASE("LSTM writes Keras's config and weight layout") {
    auto input = Input(Shape{5, 3}, "in");
    auto lstm = make_layer("LSTM", {{"units", 4}, {"name", "lstm"}});
    auto out = call(lstm, input);
    const json config = lstm->get_config();
    CHECK(config["units"] == 4);
    CHECK(config["activation"] == "tanh");
    CHECK(config["recurrent_activation"] == "sigmoid");
    CHECK(config["unit_forget_bias"] == true);
    CHECK(config["return_sequences"] == false);
    CHECK(config["recurrent_initializer"]["class_name"] == "Orthogonal");
    REQUIRE(lstm->weights().size() == 3);
    CHECK(lstm->weights()[0].value.shape() == Shape{3, 16});
    CHECK(lstm->weights()[1].value.shape() == Shape{4, 16});
    CHECK(lstm->weights()[2].value.shape() == Shape{16});
    CHECK(lstm->weights()[0].name == "lstm_cell/kernel");
    // unit_forget_bias: the forget gate's bias (the second block) starts at 1, the rest at 0.
    const Tensor<float>& bias = lstm->weights()[2].value;
    for (std::size_t i = 0; i < 16; ++i)
      CHECK(bias.data()[i] == (i >= 4 && i < 8 ? 1.0F : 0.0F));
    auto gru = make_layer("GRU", {{"units", 2}});
    call(gru, Input(Shape{5, 3}));
    CHECK(gru->weights()[2].value.shape() == Shape{2, 6});
    CHECK(gru->get_config()["reset_after"] == true);
    auto gru1 = make_layer("GRU", {{"units", 2}, {"reset_after", false}});
    call(gru1, Input(Shape{5, 3}));
    CHECK(gru1->weights()[2].value.shape() == Shape{6});
    auto both = make_layer("Bidirectional",
                           {{"layer", {{"class_name", "LSTM"}, {"config", {{"units", 2}}}}}});
    const Shape shape = call(both, Input(Shape{5, 3})).shape();
    CHECK(shape == Shape{4});
    CHECK(both->weights().size() == 6);
    CHECK(both->weights()[0].name == "forward_lstm/lstm_cell/kernel");
    CHECK(both->weights()[3].name == "backward_lstm/lstm_cell/kernel");
    CHECK(both->get_config()["layer"]["config"]["go_backwards"] == false);
  }

  TEST_CASE("LSTM learns to sum a sequence and its loss falls") {
    const auto [x, y] = sum_task();
    const std::size_t steps = x.dim(1);
    set_random_seed(5);
    Sequential model{Input(Shape{steps, 1}), LSTM(16), Dense(1)};
    model.compile({.optimizer = "adam", .loss = "mse"});
    const auto history = model.fit(x, y, {.epochs = 30, .batch_size = 32, .verbose = 0});
    const auto& loss = history.history.at("loss");
    INFO("first loss ", loss.front(), " last loss ", loss.back());
    CHECK(loss.back() < 0.1 * loss.front());
    CHECK(loss.back() < 0.1);
  }

  TEST_CASE("Embedding LSTM and Dense train on token sequences") {
    // Class 1 when token 3 appears in the sequence.
    const std::size_t n = 128, steps = 5;
    Tensor<float> x(Shape{n, steps}), y(Shape{n, 1});
    loadstar::SplitMix64 rng(9);
    for (std::size_t i = 0; i < n; ++i) {
      bool has = false;
      for (std::size_t s = 0; s < steps; ++s) {
        const float token = float(rng.next() % 6);
        x.data()[i * steps + s] = token;
        has = has || token == 3.0F;
      }
      y.data()[i] = has ? 1.0F : 0.0F;
    }
    Sequential model{Input(Shape{steps}), Embedding(6, 8), Bidirectional(GRU(8)),
                     Dense(1, {.activation = "sigmoid"})};
    model.compile({.optimizer = "adam", .loss = "binary_crossentropy"});
    const auto history = model.fit(x, y, {.epochs = 25, .batch_size = 16, .verbose = 0});
    const auto& loss = history.history.at("loss");
    INFO("first loss ", loss.front(), " last loss ", loss.back());
    CHECK(loss.back() < 0.5 * loss.front());
  }

  TEST_CASE("Recurrent layers refuse what loadstar does not run by its option") {
    const auto refused = [](const json& extra, const char* message) {
      json config = {{"units", 2}, {"name", "r"}};
      config.update(extra);
      CHECK_THROWS_WITH_AS(make_layer("LSTM", config), doctest::Contains(message), ConfigError);
    };
    refused({{"dropout", 1.0}}, "config.dropout: expected a number in [0, 1)");
    refused({{"recurrent_dropout", -0.1}}, "config.recurrent_dropout: expected a number in [0, 1)");
    refused({{"time_major", true}}, "config.time_major: expected false");
    refused({{"recurrent_regularizer", {{"class_name", "L2"}}}}, "config.recurrent_regularizer");
    refused({{"activation", "softmax"}}, "activation must act element by element");
    refused({{"implementation", 3}}, "config.implementation: expected 1 or 2");
    CHECK_THROWS_WITH_AS(make_layer("GRU", {{"units", 0}}), doctest::Contains("config.units"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        make_layer("Bidirectional",
                   {{"layer", {{"class_name", "LSTM"}, {"config", {{"units", 2}}}}},
                    {"merge_mode", "max"}}),
        doctest::Contains("merge_mode: expected \"concat\", \"sum\", \"mul\", \"ave\" or null"),
        ConfigError);
    CHECK_THROWS_WITH_AS(
        make_layer("Bidirectional",
                   {{"layer", {{"class_name", "Dense"}, {"config", {{"units", 2}}}}}}),
        doctest::Contains("config.layer: expected a SimpleRNN, LSTM or GRU layer"), ConfigError);
    // Inputs of another rank, and a batch shape that is not one (unknown lengths are
    // test_unknown_axes.cpp's).
    auto lstm = make_layer("LSTM", {{"units", 2}, {"name", "r"}});
    CHECK_THROWS_WITH_AS(call(lstm, Input(Shape{4})),
                         doctest::Contains("lstm layer 'r': expects inputs (batch, timesteps, "
                                           "features) with a known number of features"),
                         ShapeError);
    CHECK_THROWS_AS(LayerRegistry::instance().create(
                        "InputLayer", {{"batch_input_shape", {nullptr, 0, 3}}, {"name", "in"}}),
                    ConfigError);
  }

  TEST_CASE("Recurrent dropout predicts and evaluates as Keras and trains with its masks") {
    // A Keras text model with LSTM(dropout=0.2, recurrent_dropout=0.1): dropout does nothing
    // outside training, so predict and evaluate equal the same model without it. The masks'
    // numerics are in the reference cases (*_dropout).
    const auto model_of = [](double dropout, double recurrent) {
      auto tokens = Input(Shape{5}, "tokens");
      auto h = call(Embedding(9, 4), tokens);
      h = call(Bidirectional(GRU(3, {.return_sequences = true, .dropout = dropout}), MergeMode::sum,
                             "both"),
               h);
      h = call(
          LSTM(2,
               {.dropout = dropout, .recurrent_dropout = recurrent, .seed = 7, .name = "dropping"}),
          h);
      return std::make_shared<Model>(std::vector{tokens}, std::vector{h}, "text");
    };
    set_random_seed(3);
    auto dropping = model_of(0.2, 0.1);
    auto again = model_of(0.2, 0.1);
    auto plain = model_of(0.0, 0.0);
    plain->set_weights(dropping->get_weights());
    again->set_weights(dropping->get_weights());
    Tensor<float> x(Shape{2, 5});
    for (std::size_t i = 0; i < x.size(); ++i)
      x.data()[i] = static_cast<float>((i * 7) % 9);
    const Tensor<float> y(Shape{2, 2});
    CHECK(layer_cases::same_bits(dropping->predict(x, {.verbose = 0}),
                                 plain->predict(x, {.verbose = 0})));
    const json config = model_get_config(*dropping);
    const json& lstm = config["config"]["layers"][3]["config"];
    CHECK(lstm["name"] == "dropping");
    CHECK(lstm["dropout"] == 0.2);
    CHECK(lstm["recurrent_dropout"] == 0.1);
    CHECK(lstm["seed"] == 7);
    // recurrent_dropout draws a mask per gate: Keras's implementation 1.
    CHECK(lstm["implementation"] == 1);
    CHECK(config["config"]["layers"][2]["config"]["layer"]["config"]["implementation"] == 2);
    CHECK(model_get_config(*model_from_config(config)) == config);
    for (auto* m : {&dropping, &again, &plain})
      (*m)->compile({.optimizer = "sgd", .loss = "mse"});
    CHECK(dropping->test_on_batch(x, y).get("loss").value() ==
          plain->test_on_batch(x, y).get("loss").value());
    // Training drops: the loss differs from the plain model's, and the masks are the same for
    // the same seeds, so a second model trains to the same bits.
    const double dropped_loss = dropping->train_on_batch(x, y).get("loss").value();
    CHECK(dropped_loss != plain->train_on_batch(x, y).get("loss").value());
    CHECK(again->train_on_batch(x, y).get("loss").value() == dropped_loss);
    static_cast<void>(dropping->train_on_batch(x, y));
    static_cast<void>(again->train_on_batch(x, y));
    for (std::size_t i = 0; i < dropping->get_weights().size(); ++i)
      CHECK(layer_cases::same_bits(dropping->get_weights()[i], again->get_weights()[i]));
    CHECK_THROWS_WITH_AS(static_cast<void>(LSTM(2, {.recurrent_dropout = 1.0, .name = "r"})),
                         "lstm layer 'r': recurrent_dropout must be in [0, 1) but is 1.0",
                         ConfigError);
  }

  TEST_CASE("LSTM with dropout and recurrent_dropout learns to sum a sequence") {
    const auto [x, y] = sum_task();
    const std::size_t steps = x.dim(1);
    set_random_seed(11);
    Sequential model{Input(Shape{steps, 1}), LSTM(16, {.dropout = 0.05, .recurrent_dropout = 0.1}),
                     Dense(1)};
    model.compile({.optimizer = "adam", .loss = "mse"});
    const double before = model.evaluate(x, y, {.verbose = 0}).get("loss").value();
    const auto history = model.fit(x, y, {.epochs = 30, .batch_size = 32, .verbose = 0});
    const double after = model.evaluate(x, y, {.verbose = 0}).get("loss").value();
    INFO("loss before ", before, " after ", after, " last training loss ",
         history.history.at("loss").back());
    CHECK(after < 0.1 * before);
  }

  TEST_CASE("Orthogonal fills orthonormal rows or columns times the gain") {
    for (const Shape& shape : {Shape{6, 3}, Shape{3, 6}, Shape{2, 2, 4}}) {
      INFO(shape.str());
      Tensor<float> t(shape);
      Initializer::orthogonal(2.0).fill(t, 11);
      const std::size_t cols = shape[shape.rank() - 1], rows = t.size() / cols;
      // Q^T Q = gain^2 I over the shorter side.
      const bool by_columns = rows >= cols;
      const std::size_t n = by_columns ? cols : rows, m = by_columns ? rows : cols;
      for (std::size_t a = 0; a < n; ++a) {
        for (std::size_t b = 0; b < n; ++b) {
          double dot = 0.0;
          for (std::size_t k = 0; k < m; ++k) {
            const float va = by_columns ? t.data()[k * cols + a] : t.data()[a * cols + k];
            const float vb = by_columns ? t.data()[k * cols + b] : t.data()[b * cols + k];
            dot += double(va) * vb;
          }
          CHECK(dot == doctest::Approx(a == b ? 4.0 : 0.0).epsilon(1e-5).scale(1.0));
        }
      }
      Tensor<float> again(shape);
      Initializer::orthogonal(2.0).fill(again, 11);
      CHECK(recurrent_same_bits(t, again));
    }
    const Initializer init = Initializer::from_json(
        {{"class_name", "Orthogonal"}, {"config", {{"gain", 0.5}, {"seed", 3}}}});
    CHECK(init.to_json() ==
          json{{"class_name", "Orthogonal"}, {"config", {{"gain", 0.5}, {"seed", 3}}}});
    CHECK(Initializer("orthogonal").kind() == Initializer::Kind::orthogonal);
  }

  TEST_CASE("load_model reads recurrent layers from the cell groups of a Keras 3 archive") {
    const json reference = layer_cases::load("recurrent_keras3.json");
    const auto model = load_model(keras3_recurrent_file());
    const auto weights = model->get_weights();
    REQUIRE(weights.size() == reference["weights"].size());
    for (std::size_t i = 0; i < weights.size(); ++i) {
      const json& expected = reference["weights"][i];
      INFO(i, " ", expected["dataset"].get<std::string>());
      const Shape shape = layer_cases::shape_of(expected["shape"]);
      CHECK(weights[i] == layer_cases::tensor_of(expected["values"], shape));
    }
    // load_weights reads the same groups into a model of the same layers built here.
    auto input = Input(Shape{4, 3});
    auto h = call(LSTM(4, {.return_sequences = true}), input);
    h = call(Bidirectional(GRU(2, {.return_sequences = true})), h);
    auto built = std::make_shared<Model>(input, call(SimpleRNN(2), h));
    built->load_weights(keras3_recurrent_file());
    const Tensor<float> x = recurrent_wave(Shape{2, 4, 3}, 1.0F);
    CHECK(
        recurrent_same_bits(built->predict(x, {.verbose = 0}), model->predict(x, {.verbose = 0})));
  }

  TEST_CASE("save writes recurrent layers in the groups of Keras 3's layout") {
    const json reference = layer_cases::load("recurrent_keras3.json");
    check_keras3_groups(keras3_recurrent_file(), reference["groups"]);
    const auto model = load_model(keras3_recurrent_file());
    test_support::TempDir dir;
    model->save(dir / "copy.keras");
    check_keras3_groups(dir / "copy.keras", reference["groups"]);
    const auto copy = load_model(dir / "copy.keras");
    const auto weights = copy->get_weights();
    REQUIRE(weights.size() == model->get_weights().size());
    for (std::size_t i = 0; i < weights.size(); ++i)
      CHECK(recurrent_same_bits(weights[i], model->get_weights()[i]));
  }

  TEST_CASE("load_weights names the cell group a Keras 3 file lacks for a recurrent layer") {
    auto input = Input(Shape{4, 3});
    auto h = call(GRU(4, {.return_sequences = true}), input);
    h = call(Bidirectional(GRU(2, {.return_sequences = true})), h);
    auto model = std::make_shared<Model>(input, call(SimpleRNN(2), h));
    CHECK_THROWS_WITH_AS(model->load_weights(keras3_recurrent_file()),
                         doctest::Contains("(GRU) has weights but the file has no group "
                                           "'layers/gru/cell/vars' for it"),
                         FormatError);
    // With skip_mismatch the GRU keeps its weights and the others load.
    const auto before = model->get_weights();
    model->load_weights(keras3_recurrent_file(), {.skip_mismatch = true});
    const json reference = layer_cases::load("recurrent_keras3.json");
    const auto weights = model->get_weights();
    REQUIRE(weights.size() == reference["weights"].size());
    CHECK(recurrent_same_bits(weights[0], before[0]));
    for (std::size_t i = 3; i < weights.size(); ++i) {
      const json& expected = reference["weights"][i];
      CHECK(weights[i] ==
            layer_cases::tensor_of(expected["values"], layer_cases::shape_of(expected["shape"])));
    }
  }

  TEST_CASE("TimeDistributed matches PyTorch applying the layer step by step") {
    const json reference = layer_cases::load("time_distributed.json");
    REQUIRE(reference["cases"].size() == 4);
    for (std::size_t threads : {1, 3}) {
      CpuBackend backend(threads);
      for (const auto& c : reference["cases"])
        layer_cases::run_case(c, backend);
    }
    loadstar::test::ProtectedBackend backend(2);
    for (const auto& c : reference["cases"])
      layer_cases::run_case(c, backend);
  }

  TEST_CASE("TimeDistributed round-trips configs h5 and keras files and trains its layer") {
    check_recurrent_round_trip(
        "TimeDistributed",
        {{"layer", {{"class_name", "Dense"}, {"config", {{"units", 3}, {"activation", "relu"}}}}}},
        Shape{4, 2});
    check_recurrent_round_trip(
        "TimeDistributed",
        {{"layer",
          {{"class_name", "Conv2D"},
           {"config", {{"filters", 2}, {"kernel_size", {2, 2}}, {"padding", "same"}}}}}},
        Shape{3, 4, 4, 1});
    // Keras 3 keeps the wrapped layer's weights in `layer/vars` below the wrapper's group.
    Sequential model{Input(Shape{5, 2}), TimeDistributed(Dense(3)), LSTM(2)};
    test_support::TempDir dir;
    model.save(dir / "td.keras");
    check_keras3_groups(
        dir / "td.keras",
        json::array(
            {{{"path", "vars"}, {"name", model.name()}, {"size", 0}},
             {{"path", "layers/time_distributed/vars"}, {"name", "time_distributed"}, {"size", 0}},
             {{"path", "layers/time_distributed/layer/vars"}, {"name", "dense"}, {"size", 2}},
             {{"path", "layers/lstm/vars"}, {"name", "lstm"}, {"size", 0}},
             {{"path", "layers/lstm/cell/vars"}, {"name", "lstm_cell"}, {"size", 3}}}));
    const auto loaded = load_model(dir / "td.keras");
    CHECK(loaded->layers()[0]->get_config()["layer"]["config"]["units"] == 3);
    CHECK(loaded->layers()[0]->weights()[0].name == "kernel");
  }

  TEST_CASE("TimeDistributed applies its layer's regularizers and freezes with it") {
    auto dense = std::make_shared<Dense>(2);
    dense->set_regularizer("kernel", std::make_shared<regularizers::L2>(0.05));
    auto wrapper = std::make_shared<TimeDistributed>(dense);
    call(wrapper, Input(Shape{3, 4}));
    REQUIRE(wrapper->weight_options("kernel") != nullptr);
    CHECK(wrapper->weight_options("kernel")->regularizer != nullptr);
    // Frozen, the wrapped weights stay as they were while the rest trains.
    Sequential model{Input(Shape{3, 4}), TimeDistributed(Dense(2), "frozen"), Flatten(), Dense(1)};
    model.layers()[0]->set_trainable(false);
    model.compile({.optimizer = "sgd", .loss = "mse"});
    const auto before = model.get_weights();
    const Tensor<float> x = recurrent_wave(Shape{8, 3, 4}, 1.0F);
    const Tensor<float> y = recurrent_wave(Shape{8, 1}, 0.5F);
    model.train_on_batch(x, y);
    const auto after = model.get_weights();
    CHECK(recurrent_same_bits(before[0], after[0]));
    CHECK(recurrent_same_bits(before[1], after[1]));
    CHECK_FALSE(recurrent_same_bits(before[2], after[2]));
  }

  TEST_CASE("TimeDistributed refuses what it cannot run, naming it") {
    CHECK_THROWS_WITH_AS(static_cast<void>(TimeDistributed(std::shared_ptr<Layer>())),
                         "time_distributed layer: the wrapped layer is null", ConfigError);
    auto noisy = std::make_shared<Dense>(2, DenseOptions{.name = "noisy"});
    noisy->set_activity_regularizer(std::make_shared<regularizers::L2>(0.1));
    CHECK_THROWS_WITH_AS(static_cast<void>(TimeDistributed(noisy)),
                         "time_distributed layer: the wrapped layer 'noisy' has an activity "
                         "regularizer, which loadstar does not apply per step",
                         ConfigError);
    CHECK_THROWS_WITH_AS(make_layer("TimeDistributed", {{"name", "t"}}),
                         doctest::Contains("config.layer: expected the wrapped layer's"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        make_layer("TimeDistributed",
                   {{"layer", {{"class_name", "Mystery"}, {"config", json::object()}}}}),
        doctest::Contains("Mystery"), ConfigError);
    CHECK_THROWS_WITH_AS(
        call(make_layer(
                 "TimeDistributed",
                 {{"name", "t"}, {"layer", {{"class_name", "Dense"}, {"config", {{"units", 2}}}}}}),
             Input(Shape{4})),
        "time_distributed layer 't': expects inputs of rank 2 or more (time, "
        "features..., without the batch axis) but got (None, 4)",
        ShapeError);
    Sequential model{Input(Shape{3, 4}), TimeDistributed(BatchNormalization(), "norm"), Flatten(),
                     Dense(1)};
    model.compile({.optimizer = "sgd", .loss = "mse"});
    const Tensor<float> x = recurrent_wave(Shape{8, 3, 4}, 1.0F);
    CHECK_THROWS_WITH_AS(model.train_on_batch(x, recurrent_wave(Shape{8, 1}, 0.5F)),
                         doctest::Contains("time_distributed layer 'norm': training a wrapped "
                                           "BatchNormalization is not supported"),
                         ConfigError);
    CHECK(model.predict(x, {.verbose = 0}).shape() == Shape{8, 1});
  }
}

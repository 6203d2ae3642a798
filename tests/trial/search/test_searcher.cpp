// The searchers against Determined's master searchers (master/pkg/searcher/*.go@0.15.6): the
// operations of small searches, hand-computed from Determined's arithmetic, and a search saved and
// restored mid-way continuing as it would have.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <loadstar/random.hpp>
#include <loadstar/trial/detail/rng_state.hpp>
#include <loadstar/trial/experiment_config.hpp>
#include <loadstar/trial/searcher.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <variant>
#include <vector>

using namespace loadstar;
using namespace loadstar::trial;
using nlohmann::json;

namespace {

Hyperparameter constant(json value) {
  Hyperparameter hp;
  hp.type = Hyperparameter::Type::constant;
  hp.val = std::move(value);
  return hp;
}

Hyperparameter integer(double low, double high, std::uint64_t count) {
  Hyperparameter hp;
  hp.type = Hyperparameter::Type::integer;
  hp.minval = low;
  hp.maxval = high;
  hp.count = count;
  return hp;
}

Hyperparameter real(double low, double high) {
  Hyperparameter hp;
  hp.type = Hyperparameter::Type::real;
  hp.minval = low;
  hp.maxval = high;
  return hp;
}

Hyperparameter categorical(std::vector<json> values) {
  Hyperparameter hp;
  hp.type = Hyperparameter::Type::categorical;
  hp.vals = std::move(values);
  return hp;
}

ExperimentConfig config_for(const std::string& searcher, Length max_length) {
  ExperimentConfig config;
  config.entrypoint = "model_def:Trial";
  config.hyperparameters = {{"global_batch_size", constant(32)},
                            {"learning_rate", real(0.001, 0.1)}};
  config.searcher.name = searcher;
  config.searcher.metric = "val_loss";
  config.searcher.max_length = max_length;
  return config;
}

std::vector<std::string> strings(const std::vector<Operation>& ops) {
  std::vector<std::string> out;
  for (const auto& op : ops) {
    if (const auto* create = std::get_if<Create>(&op)) {
      out.push_back("Create " + std::to_string(create->request_id));  // seed and hparams apart
    } else {
      out.push_back(to_string(op));
    }
  }
  return out;
}

const ValidateAfter& validate_after(const std::vector<Operation>& ops, std::uint64_t id) {
  for (const auto& op : ops) {
    if (const auto* v = std::get_if<ValidateAfter>(&op); v && v->request_id == id) return *v;
  }
  FAIL("no ValidateAfter for request ", id);
  static const ValidateAfter none{};
  return none;
}

/// A simulated experiment: runs operations in order (a ValidateAfter becomes a validation
/// event, a Close a close event), reporting each event's answer; `metric` gives a trial's metric
/// at a length. The transcript lists every operation with its hparams and seed.
struct Simulation {
  struct Event {
    bool validate = false;
    ValidateAfter op;
    std::uint64_t request_id = 0;
  };
  std::deque<Event> events;
  std::vector<std::string> transcript;
  bool shut_down = false;

  static double metric(std::uint64_t id, std::uint64_t length) {
    return std::fmod(static_cast<double>(id) * 0.6180339887 + static_cast<double>(length) * 0.01,
                     1.0);
  }

  void take(const std::vector<Operation>& ops) {
    for (const auto& op : ops) {
      transcript.push_back(to_string(op));
      if (const auto* v = std::get_if<ValidateAfter>(&op)) {
        events.push_back(Event{true, *v, v->request_id});
      } else if (const auto* c = std::get_if<Close>(&op)) {
        events.push_back(Event{false, {}, c->request_id});
      } else if (std::holds_alternative<Shutdown>(op)) {
        shut_down = true;
      }
    }
  }

  /// Runs one event; false when none is left.
  bool step(Searcher& searcher) {
    if (events.empty()) return false;
    const Event event = events.front();
    events.pop_front();
    if (event.validate) {
      take(searcher.validation_completed(
          event.request_id, metric(event.request_id, event.op.length.value), event.op));
    } else {
      take(searcher.trial_closed(event.request_id));
    }
    return true;
  }
};

/// Runs a whole search, saving and restoring the searcher (through JSON text) after `restore_at`
/// events; returns the transcript.
std::vector<std::string> simulate(
    const ExperimentConfig& config, std::uint32_t seed,
    std::size_t restore_at = std::numeric_limits<std::size_t>::max()) {
  auto searcher = make_searcher(config, seed);
  Simulation sim;
  sim.take(searcher->initial_operations());
  for (std::size_t event = 0; event < 100000; ++event) {
    if (event == restore_at) {
      const std::string saved = searcher->state().dump();
      searcher = make_searcher(config, seed);
      searcher->restore(json::parse(saved));
      CHECK(searcher->state().dump() == saved);
    }
    if (!sim.step(*searcher)) break;
  }
  CHECK(sim.shut_down);
  CHECK(searcher->shutdown());
  return sim.transcript;
}

/// The adaptive_asha config of the promotion scenario: max_length {batches: 10}, 5 trials,
/// divisor 2, aggressive: 3 rungs at 2, 5 and 10 batches, 2 trials at a time.
ExperimentConfig promotion_config() {
  ExperimentConfig config = config_for("adaptive_asha", Length{Unit::batches, 10});
  config.searcher.max_trials = 5;
  config.searcher.divisor = 2;
  config.searcher.mode = "aggressive";
  config.searcher.max_concurrent_trials = 2;
  return config;
}

}  // namespace

TEST_SUITE("trial") {
  TEST_CASE("rng_state gives the position of a SplitMix64 generator") {
    for (const std::uint64_t x : {0ULL, 1ULL, 42ULL, 0xdeadbeefcafebabeULL, ~0ULL}) {
      CHECK(trial::detail::unmix64(mix64(x)) == x);
    }
    SplitMix64 rng(7);
    for (int i = 0; i < 5; ++i)
      (void)rng.next();
    SplitMix64 copy(trial::detail::rng_state(rng));
    for (int i = 0; i < 10; ++i)
      CHECK(copy.next() == rng.next());
  }

  TEST_CASE("Operation prints and round trips through JSON") {
    const std::vector<Operation> ops{Create{3, json{{"lr", 0.5}}, 42},
                                     ValidateAfter{3, Length{Unit::epochs, 2}}, Close{3},
                                     Shutdown{true}};
    CHECK(to_string(ops[0]) == "Create 3 seed 42 {\"lr\":0.5}");
    CHECK(to_string(ops[1]) == "ValidateAfter 3 {\"epochs\":2}");
    CHECK(to_string(ops[2]) == "Close 3");
    CHECK(to_string(ops[3]) == "Shutdown failure");
    for (const auto& op : ops)
      CHECK(operation_from_json(operation_to_json(op)) == op);
    CHECK_THROWS_WITH_AS(operation_from_json(json{{"type", "train"}}),
                         "searcher operation state: expected a type of create, validate_after, "
                         "close or shutdown but found 'train'",
                         CheckpointError);
  }

  TEST_CASE("make_searcher single creates one trial and shuts down when it closes") {
    const ExperimentConfig config = config_for("single", Length{Unit::batches, 100});
    auto searcher = make_searcher(config, 1234);
    CHECK(searcher->name() == "single");
    CHECK(searcher->max_concurrent_trials() == 1);
    const auto ops = searcher->initial_operations();
    CHECK(strings(ops) ==
          std::vector<std::string>{"Create 1", "ValidateAfter 1 {\"batches\":100}", "Close 1"});
    const auto& create = std::get<Create>(ops[0]);
    CHECK(create.hparams["global_batch_size"] == 32);
    CHECK(create.hparams["learning_rate"].get<double>() >= 0.001);
    CHECK(create.hparams["learning_rate"].get<double>() < 0.1);
    CHECK(create.trial_seed < (1U << 31U));
    // The draws: the hyperparameters, then the seed, from one generator seeded with the
    // experiment seed.
    SplitMix64 rng(1234);
    CHECK(create.hparams == sample_hparams(config.hyperparameters, rng));
    CHECK(create.trial_seed == rng.below(std::uint64_t{1} << 31U));
    CHECK(searcher->progress() == 0.0);
    CHECK(searcher->validation_completed(1, 0.25, validate_after(ops, 1)).empty());
    CHECK(searcher->progress() == 1.0);
    CHECK(searcher->current_operation(1) == validate_after(ops, 1));
    CHECK(strings(searcher->trial_closed(1)) == std::vector<std::string>{"Shutdown"});
    CHECK(searcher->shutdown());

    SUBCASE("the same seed gives the same trial and another seed another") {
      auto again = make_searcher(config, 1234)->initial_operations();
      CHECK(std::get<Create>(again[0]) == create);
      auto other = make_searcher(config, 1235)->initial_operations();
      CHECK(std::get<Create>(other[0]).trial_seed != create.trial_seed);
    }
  }

  TEST_CASE("make_searcher single shuts down as a failure when its trial errored") {
    auto searcher = make_searcher(config_for("single", Length{Unit::epochs, 3}), 5);
    const auto ops = searcher->initial_operations();
    CHECK(strings(ops)[1] == "ValidateAfter 1 {\"epochs\":3}");
    CHECK(searcher->trial_exited_early(1).empty());
    CHECK(strings(searcher->trial_closed(1)) == std::vector<std::string>{"Shutdown failure"});
  }

  TEST_CASE("make_searcher random keeps max_concurrent_trials running until max_trials") {
    ExperimentConfig config = config_for("random", Length{Unit::batches, 50});
    config.searcher.max_trials = 4;
    config.searcher.max_concurrent_trials = 2;
    auto searcher = make_searcher(config, 9);
    CHECK(searcher->max_concurrent_trials() == 2);
    const auto initial = searcher->initial_operations();
    CHECK(strings(initial) ==
          std::vector<std::string>{"Create 1", "ValidateAfter 1 {\"batches\":50}", "Close 1",
                                   "Create 2", "ValidateAfter 2 {\"batches\":50}", "Close 2"});
    CHECK(std::get<Create>(initial[0]).hparams != std::get<Create>(initial[3]).hparams);
    CHECK(searcher->validation_completed(2, 0.5, validate_after(initial, 2)).empty());
    CHECK(searcher->progress() == doctest::Approx(50.0 / 200));
    CHECK(strings(searcher->trial_closed(2)) ==
          std::vector<std::string>{"Create 3", "ValidateAfter 3 {\"batches\":50}", "Close 3"});
    // An invalid trial is replaced at once, and the replacement is not counted.
    CHECK(strings(searcher->trial_exited_early(1, ExitedReason::invalid_hp)) ==
          std::vector<std::string>{"Create 4", "ValidateAfter 4 {\"batches\":50}", "Close 4"});
    CHECK(strings(searcher->trial_closed(1)) ==
          std::vector<std::string>{"Create 5", "ValidateAfter 5 {\"batches\":50}", "Close 5"});
    // An errored trial is not replaced: four trials were created, the search ends.
    CHECK(searcher->trial_exited_early(3).empty());
    CHECK(searcher->trial_closed(3).empty());
    CHECK(searcher->trial_closed(4).empty());
    CHECK(strings(searcher->trial_closed(5)) == std::vector<std::string>{"Shutdown"});
    CHECK(searcher->trials_requested() == 5);
  }

  TEST_CASE("trials_at_once bounds a grid or random search without a limit by the machine") {
    ExperimentConfig config = config_for("random", Length{Unit::batches, 50});
    config.searcher.max_trials = 16;
    // max_concurrent_trials 0: every trial at once in Determined; here the cores per trial.
    CHECK(trials_at_once(config, 16, 8) == 8);
    config.slots_per_trial = 2;
    CHECK(trials_at_once(config, 16, 8) == 4);
    CHECK(trials_at_once(config, 16, 1) == 1);
    CHECK(trials_at_once(config, 3, 64) == 3);
    config.searcher.name = "grid";
    CHECK(trials_at_once(config, 16, 8) == 4);
    // A limit the user set is kept, as are adaptive_asha's own choices.
    config.searcher.max_concurrent_trials = 12;
    CHECK(trials_at_once(config, 12, 8) == 12);
    config.searcher.name = "adaptive_asha";
    config.searcher.max_concurrent_trials = 0;
    CHECK(trials_at_once(config, 16, 8) == 16);
    CHECK(trials_at_once(config, 0, 8) == 1);
    // resources.max_slots bounds every searcher: max_slots / slots_per_trial.
    config.max_slots = 5;
    CHECK(trials_at_once(config, 16, 8) == 2);
    config.slots_per_trial = 1;
    CHECK(trials_at_once(config, 16, 8) == 5);
    config.searcher.name = "random";
    CHECK(trials_at_once(config, 16, 64) == 5);
    CHECK(trials_at_once(config, 3, 64) == 3);
  }

  TEST_CASE("make_searcher grid takes the points from the end of the grid") {
    ExperimentConfig config = config_for("grid", Length{Unit::batches, 20});
    config.hyperparameters = {{"global_batch_size", constant(16)},
                              {"b", categorical({"x", "y"})},
                              {"a", integer(1, 3, 3)}};
    config.searcher.max_concurrent_trials = 2;
    auto searcher = make_searcher(config, 3);
    CHECK(searcher->max_concurrent_trials() == 2);
    // The grid, first name slowest: (1,x) (1,y) (2,x) (2,y) (3,x) (3,y); popped from the end.
    const auto point = [](int a, const char* b) {
      return json{{"a", a}, {"b", b}, {"global_batch_size", 16}};
    };
    std::vector<json> created;
    const auto note = [&](const std::vector<Operation>& ops) {
      for (const auto& op : ops) {
        if (const auto* c = std::get_if<Create>(&op)) created.push_back(c->hparams);
      }
      return strings(ops);
    };
    CHECK(note(searcher->initial_operations()) ==
          std::vector<std::string>{"Create 1", "ValidateAfter 1 {\"batches\":20}", "Close 1",
                                   "Create 2", "ValidateAfter 2 {\"batches\":20}", "Close 2"});
    CHECK(note(searcher->trial_closed(1)).front() == "Create 3");
    CHECK(note(searcher->trial_closed(2)).front() == "Create 4");
    CHECK(note(searcher->trial_closed(3)).front() == "Create 5");
    CHECK(note(searcher->trial_closed(4)).front() == "Create 6");
    CHECK(searcher->trial_closed(5).empty());
    CHECK(strings(searcher->trial_closed(6)) == std::vector<std::string>{"Shutdown"});
    CHECK(created == std::vector<json>{point(3, "y"), point(3, "x"), point(2, "y"), point(2, "x"),
                                       point(1, "y"), point(1, "x")});
  }

  TEST_CASE("make_searcher grid without a count names the hyperparameter") {
    ExperimentConfig config = config_for("grid", Length{Unit::batches, 20});
    CHECK_THROWS_WITH_AS(make_searcher(config, 1), doctest::Contains("learning_rate"), ConfigError);
  }

  TEST_CASE("adaptive_asha_plan follows Determined's bracket arithmetic") {
    SearcherConfig searcher;
    searcher.name = "adaptive_asha";
    searcher.max_length = Length{Unit::batches, 100};
    searcher.max_trials = 20;
    searcher.divisor = 4;
    searcher.max_rungs = 5;
    // max_rungs = min(5, int(log 100 / log 4) + 1 = 4, int(log 20 / log 4) + 1 = 3) = 3;
    // rung i of a bracket of n rungs at max(int(100 / 4^(n-i-1)), 1).

    SUBCASE("standard") {
      // Brackets of 2..3 rungs, most first; weights 4^2/3 and 4/2: int(14.5) = 14, int(5.45) =
      // 5, remainder 1 to the first; max(5 trials of the last bracket, int(4)) = 5 at once each.
      const AshaPlan plan = adaptive_asha_plan(searcher);
      CHECK(plan.bracket_rungs == std::vector<std::uint64_t>{3, 2});
      CHECK(plan.max_trials == std::vector<std::uint64_t>{15, 5});
      CHECK(plan.max_concurrent_trials == std::vector<std::uint64_t>{5, 5});
      CHECK(plan.rung_lengths == std::vector<std::vector<std::uint64_t>>{{6, 25, 100}, {25, 100}});
      ExperimentConfig config = config_for("adaptive_asha", searcher.max_length);
      config.searcher = searcher;
      CHECK(make_searcher(config, 1)->max_concurrent_trials() == 10);
    }
    SUBCASE("aggressive") {
      searcher.mode = "aggressive";
      const AshaPlan plan = adaptive_asha_plan(searcher);
      CHECK(plan.bracket_rungs == std::vector<std::uint64_t>{3});
      CHECK(plan.max_trials == std::vector<std::uint64_t>{20});
      CHECK(plan.max_concurrent_trials == std::vector<std::uint64_t>{20});
      CHECK(plan.rung_lengths == std::vector<std::vector<std::uint64_t>>{{6, 25, 100}});
    }
    SUBCASE("conservative") {
      // Weights 16/3, 4/2, 1/1 of 8.33: int(12.8) = 12, int(4.8) = 4, int(2.4) = 2, remainder 2.
      searcher.mode = "conservative";
      const AshaPlan plan = adaptive_asha_plan(searcher);
      CHECK(plan.bracket_rungs == std::vector<std::uint64_t>{3, 2, 1});
      CHECK(plan.max_trials == std::vector<std::uint64_t>{14, 4, 2});
      CHECK(plan.max_concurrent_trials == std::vector<std::uint64_t>{4, 4, 4});
      CHECK(plan.rung_lengths ==
            std::vector<std::vector<std::uint64_t>>{{6, 25, 100}, {25, 100}, {100}});
    }
    SUBCASE("max_concurrent_trials split evenly with the remainder to the first") {
      searcher.max_concurrent_trials = 7;
      CHECK(adaptive_asha_plan(searcher).max_concurrent_trials == std::vector<std::uint64_t>{4, 3});
      searcher.max_concurrent_trials = 1;  // at least one per bracket
      CHECK(adaptive_asha_plan(searcher).max_concurrent_trials == std::vector<std::uint64_t>{1, 1});
    }
    SUBCASE("bracket_rungs given") {
      searcher.bracket_rungs = {1, 4};
      const AshaPlan plan = adaptive_asha_plan(searcher);
      CHECK(plan.bracket_rungs == std::vector<std::uint64_t>{4, 1});
      // Weights 4^3/4 = 16 and 1: int(16/17*20) = 18, int(1/17*20) = 1, remainder 1.
      CHECK(plan.max_trials == std::vector<std::uint64_t>{19, 1});
      CHECK(plan.rung_lengths == std::vector<std::vector<std::uint64_t>>{{1, 6, 25, 100}, {100}});
    }
    SUBCASE("rungs that do not lengthen are refused") {
      searcher.max_length = Length{Unit::batches, 3};
      searcher.bracket_rungs = {3};
      CHECK_THROWS_WITH_AS(adaptive_asha_plan(searcher),
                           "searcher 'adaptive_asha': a bracket of 3 rungs over max_length "
                           "{\"batches\":3} validates at [1, 1, 3]; expected increasing lengths "
                           "(fewer rungs or a longer max_length)",
                           ConfigError);
    }
    SUBCASE("bad values are refused") {
      searcher.mode = "reckless";
      CHECK_THROWS_WITH_AS(adaptive_asha_plan(searcher),
                           "searcher 'adaptive_asha': mode: expected aggressive, standard or "
                           "conservative but found 'reckless'",
                           ConfigError);
      searcher.mode = "standard";
      searcher.divisor = 1;
      CHECK_THROWS_WITH_AS(adaptive_asha_plan(searcher),
                           doctest::Contains("expected a divisor greater than 1"), ConfigError);
    }
  }

  TEST_CASE("make_searcher runs a parsed adaptive_asha config in epochs") {
    const ExperimentConfig config = parse_experiment_config(R"(
entrypoint: model_def:Trial
hyperparameters:
  global_batch_size: 32
  learning_rate: {type: log, minval: -4, maxval: -1, base: 10}
  hidden_size: {type: int, minval: 32, maxval: 512}
records_per_epoch: 60000
searcher:
  name: adaptive_asha
  metric: val_loss
  max_length: {epochs: 5}
  max_trials: 16
)",
                                                            "adaptive.yaml");
    // max_rungs = min(5, int(log 5 / log 4) + 1 = 2, int(log 16 / log 4) + 1) = 2; standard:
    // brackets of 2 and 1 rungs; weights 4/2 and 1: int(10.7) = 10 + 1, int(5.3) = 5 trials;
    // max(5, 4) = 5 at once each; rungs at 5/4 = 1 and 5 epochs.
    const AshaPlan plan = adaptive_asha_plan(config.searcher);
    CHECK(plan.bracket_rungs == std::vector<std::uint64_t>{2, 1});
    CHECK(plan.max_trials == std::vector<std::uint64_t>{11, 5});
    CHECK(plan.max_concurrent_trials == std::vector<std::uint64_t>{5, 5});
    CHECK(plan.rung_lengths == std::vector<std::vector<std::uint64_t>>{{1, 5}, {5}});
    auto searcher = make_searcher(config, 42);
    CHECK(searcher->max_concurrent_trials() == 10);
    const auto ops = searcher->initial_operations();
    REQUIRE(ops.size() == 20);
    CHECK(to_string(ops[1]) == "ValidateAfter 1 {\"epochs\":1}");
    CHECK(to_string(ops[11]) == "ValidateAfter 6 {\"epochs\":5}");
    for (const auto& op : ops) {
      if (const auto* create = std::get_if<Create>(&op)) {
        CHECK_NOTHROW(check_hparams(config.hyperparameters, create->hparams));
        const double lr = create->hparams["learning_rate"].get<double>();
        CHECK(lr >= 1e-4);
        CHECK(lr <= 1e-1);
      }
    }
  }

  TEST_CASE("AdaptiveAsha promotes the top of each rung as Determined does") {
    for (const bool smaller_is_better : {true, false}) {
      CAPTURE(smaller_is_better);
      ExperimentConfig config = promotion_config();
      config.searcher.smaller_is_better = smaller_is_better;
      const double sign = smaller_is_better ? 1.0 : -1.0;
      auto searcher = make_searcher(config, 77);
      CHECK(searcher->max_concurrent_trials() == 2);
      std::vector<Operation> all;
      const auto take = [&](std::vector<Operation> ops) {
        all.insert(all.end(), ops.begin(), ops.end());
        return strings(ops);
      };
      const auto validate = [&](std::uint64_t id, double metric, std::uint64_t length) {
        return take(searcher->validation_completed(
            id, sign * metric, ValidateAfter{id, Length{Unit::batches, length}}));
      };
      using V = std::vector<std::string>;
      CHECK(take(searcher->initial_operations()) == V{"Create 1", "ValidateAfter 1 {\"batches\":2}",
                                                      "Create 2",
                                                      "ValidateAfter 2 {\"batches\":2}"});
      // Rung 0 (2 batches): int((n+1)/2) > int(n/2) opens a place in the top.
      CHECK(validate(1, 0.5, 2) == V{"Create 3", "ValidateAfter 3 {\"batches\":2}"});
      CHECK(validate(2, 0.3, 2) == V{"ValidateAfter 2 {\"batches\":5}"});
      CHECK(validate(3, 0.4, 2) == V{"Create 4", "ValidateAfter 4 {\"batches\":2}"});
      CHECK(validate(2, 0.2, 5) == V{"Create 5", "ValidateAfter 5 {\"batches\":2}"});
      CHECK(validate(4, 0.1, 2) == V{"ValidateAfter 4 {\"batches\":5}"});
      // The fifth and last trial through rung 0: the rung is closed out, worst last.
      CHECK(validate(5, 0.6, 2) == V{"Close 3", "Close 1", "Close 5"});
      CHECK(validate(4, 0.15, 5) == V{"ValidateAfter 4 {\"batches\":10}", "Close 2"});
      CHECK(validate(4, 0.05, 10) == V{"Close 4"});
      for (std::uint64_t id : {3, 1, 5, 2})
        CHECK(searcher->trial_closed(id).empty());
      CHECK(take(searcher->trial_closed(4)) == V{"Shutdown"});
      CHECK(searcher->progress() == 1.0);
      std::set<std::uint32_t> seeds;
      for (const auto& op : all) {
        if (const auto* c = std::get_if<Create>(&op)) seeds.insert(c->trial_seed);
      }
      CHECK(seeds.size() == 5);
    }
  }

  TEST_CASE("AdaptiveAsha gives a trial that exited early the worst metric") {
    auto searcher = make_searcher(promotion_config(), 77);
    using V = std::vector<std::string>;
    const auto validate = [&](std::uint64_t id, double metric, std::uint64_t length) {
      return strings(searcher->validation_completed(
          id, metric, ValidateAfter{id, Length{Unit::batches, length}}));
    };
    (void)searcher->initial_operations();
    CHECK(validate(1, 0.5, 2) == V{"Create 3", "ValidateAfter 3 {\"batches\":2}"});

    SUBCASE("an errored trial is ranked last and not closed again") {
      CHECK(validate(2, 0.3, 2) == V{"ValidateAfter 2 {\"batches\":5}"});
      CHECK(validate(3, 0.4, 2) == V{"Create 4", "ValidateAfter 4 {\"batches\":2}"});
      CHECK(validate(2, 0.2, 5) == V{"Create 5", "ValidateAfter 5 {\"batches\":2}"});
      CHECK(validate(4, 0.1, 2) == V{"ValidateAfter 4 {\"batches\":5}"});
      CHECK(strings(searcher->trial_exited_early(5)) == V{"Close 3", "Close 1"});
    }
    SUBCASE("an invalid trial is closed and replaced") {
      CHECK(strings(searcher->trial_exited_early(2, ExitedReason::invalid_hp)) ==
            V{"Close 2", "Create 4", "ValidateAfter 4 {\"batches\":2}"});
      CHECK_THROWS_WITH_AS(searcher->trial_exited_early(2), doctest::Contains("twice"),
                           ConfigError);
    }
  }

  TEST_CASE("AdaptiveAsha with stop_once stops a trial outside the top of its rung for good") {
    // Rungs at 2, 5 and 10 batches, divisor 2: at a rung of n metrics (its own included) a trial
    // goes on if it is in the top max(int(n/2), 1), ahead of equal metrics; else it is closed.
    for (const bool smaller_is_better : {true, false}) {
      CAPTURE(smaller_is_better);
      ExperimentConfig config = promotion_config();
      config.searcher.stop_once = true;
      config.searcher.smaller_is_better = smaller_is_better;
      const double sign = smaller_is_better ? 1.0 : -1.0;
      auto searcher = make_searcher(config, 77);
      CHECK(searcher->max_concurrent_trials() == 2);
      const auto validate = [&](std::uint64_t id, double metric, std::uint64_t length) {
        return strings(searcher->validation_completed(
            id, sign * metric, ValidateAfter{id, Length{Unit::batches, length}}));
      };
      using V = std::vector<std::string>;
      CHECK(strings(searcher->initial_operations()) ==
            V{"Create 1", "ValidateAfter 1 {\"batches\":2}", "Create 2",
              "ValidateAfter 2 {\"batches\":2}"});
      // Rung 0: [1] goes on; [1, 2] top 1: trial 2 stops and a new trial takes its place.
      CHECK(validate(1, 0.5, 2) == V{"ValidateAfter 1 {\"batches\":5}"});
      CHECK(validate(2, 0.6, 2) == V{"Close 2", "Create 3", "ValidateAfter 3 {\"batches\":2}"});
      // [3, 1, 2] top 1: trial 3 ties trial 1 and goes ahead of it (promotion would rank it
      // after and pause it).
      CHECK(validate(3, 0.5, 2) == V{"ValidateAfter 3 {\"batches\":5}"});
      // Rung 1: [1] goes on; [1, 3] top 1: trial 3 stops.
      CHECK(validate(1, 0.4, 5) == V{"ValidateAfter 1 {\"batches\":10}"});
      CHECK(validate(3, 0.45, 5) == V{"Close 3", "Create 4", "ValidateAfter 4 {\"batches\":2}"});
      // Rung 0: [4, 3, 1, 2] top 2.
      CHECK(validate(4, 0.1, 2) == V{"ValidateAfter 4 {\"batches\":5}"});
      // The top rung closes the trial; a fifth and last trial starts.
      CHECK(validate(1, 0.3, 10) == V{"Close 1", "Create 5", "ValidateAfter 5 {\"batches\":2}"});
      // Rung 1: [4, 1, 3] top 1.
      CHECK(validate(4, 0.35, 5) == V{"ValidateAfter 4 {\"batches\":10}"});
      // Rung 0: [4, 3, 1, 5, 2] top 2: trial 5 stops; no trial is left to create, and trials 2
      // and 3, stopped, are never taken up again.
      CHECK(validate(5, 0.55, 2) == V{"Close 5"});
      CHECK(validate(4, 0.2, 10) == V{"Close 4"});
      for (std::uint64_t id : {2, 3, 1, 5})
        CHECK(searcher->trial_closed(id).empty());
      CHECK(strings(searcher->trial_closed(4)) == V{"Shutdown"});
      CHECK(searcher->progress() == 1.0);
    }
  }

  TEST_CASE("AdaptiveAsha with stop_once keeps the metric of a trial that exited early") {
    ExperimentConfig config = promotion_config();
    config.searcher.stop_once = true;
    auto searcher = make_searcher(config, 77);
    using V = std::vector<std::string>;
    const auto validate = [&](std::uint64_t id, double metric, std::uint64_t length) {
      return strings(searcher->validation_completed(
          id, metric, ValidateAfter{id, Length{Unit::batches, length}}));
    };
    (void)searcher->initial_operations();
    SUBCASE("an errored trial is ranked last, not closed again, and replaced") {
      CHECK(strings(searcher->trial_exited_early(2)) ==
            V{"Create 3", "ValidateAfter 3 {\"batches\":2}"});
      // Rung 0 holds [1, 2 (the worst metric)]: top 1.
      CHECK(validate(1, 0.5, 2) == V{"ValidateAfter 1 {\"batches\":5}"});
      CHECK(validate(3, 0.6, 2) == V{"Close 3", "Create 4", "ValidateAfter 4 {\"batches\":2}"});
    }
    SUBCASE("an invalid trial is closed and replaced, its metric forgotten") {
      CHECK(validate(2, 0.4, 2) == V{"ValidateAfter 2 {\"batches\":5}"});
      CHECK(strings(searcher->trial_exited_early(2, ExitedReason::invalid_hp)) ==
            V{"Close 2", "Create 3", "ValidateAfter 3 {\"batches\":2}"});
      // Rung 0 holds [1] alone again: top 1.
      CHECK(validate(1, 0.5, 2) == V{"ValidateAfter 1 {\"batches\":5}"});
    }
  }

  TEST_CASE("Searcher restored mid search continues as it would have") {
    std::vector<ExperimentConfig> configs;
    ExperimentConfig random = config_for("random", Length{Unit::batches, 30});
    random.searcher.max_trials = 6;
    random.searcher.max_concurrent_trials = 3;
    configs.push_back(random);
    ExperimentConfig grid = config_for("grid", Length{Unit::records, 640});
    grid.hyperparameters = {{"global_batch_size", categorical({16, 32})},
                            {"units", integer(8, 64, 3)}};
    grid.searcher.max_concurrent_trials = 2;
    configs.push_back(grid);
    ExperimentConfig asha = config_for("adaptive_asha", Length{Unit::batches, 100});
    asha.searcher.max_trials = 20;
    asha.searcher.divisor = 4;
    asha.searcher.mode = "standard";
    configs.push_back(asha);
    ExperimentConfig larger = asha;
    larger.searcher.smaller_is_better = false;
    larger.searcher.mode = "conservative";
    larger.searcher.max_concurrent_trials = 4;
    configs.push_back(larger);
    ExperimentConfig stopping = asha;
    stopping.searcher.stop_once = true;
    configs.push_back(stopping);
    ExperimentConfig stopping_larger = larger;
    stopping_larger.searcher.stop_once = true;
    configs.push_back(stopping_larger);
    configs.push_back(config_for("single", Length{Unit::epochs, 1}));

    for (const auto& config : configs) {
      CAPTURE(config.searcher.name);
      CAPTURE(config.searcher.mode);
      CAPTURE(config.searcher.stop_once);
      const auto full = simulate(config, 2024);
      CHECK(full.size() > 2);
      for (std::size_t at = 0; at < full.size(); at += 3) {
        CAPTURE(at);
        CHECK(simulate(config, 2024, at) == full);
      }
    }
  }

  TEST_CASE("Searcher refuses events it cannot have had") {
    auto searcher = make_searcher(config_for("single", Length{Unit::batches, 10}), 1);
    const auto ops = searcher->initial_operations();
    const ValidateAfter op = std::get<ValidateAfter>(ops[1]);
    CHECK_THROWS_WITH_AS(searcher->trial_closed(2),
                         "searcher 'single': no trial has request id 2 (the requests are 1 to 1)",
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        searcher->validation_completed(1, std::nan(""), op),
        "searcher 'single': the searcher metric 'val_loss' of trial request 1 is NaN", ConfigError);
    (void)searcher->validation_completed(1, 0.1, op);
    CHECK_THROWS_WITH_AS(searcher->validation_completed(1, 0.1, op),
                         "searcher 'single': operation ValidateAfter 1 {\"batches\":10} was "
                         "already completed",
                         ConfigError);
    CHECK_THROWS_WITH_AS(make_searcher(config_for("bayesian", Length{Unit::batches, 10}), 1),
                         "searcher: expected single, grid, random or adaptive_asha but found "
                         "'bayesian'",
                         ConfigError);
    CHECK_THROWS_WITH_AS(make_searcher(config_for("single", Length{Unit::batches, 0}), 1),
                         "searcher 'single': expected a max_length of at least 1 but found "
                         "{\"batches\":0}",
                         ConfigError);
  }

  TEST_CASE("Searcher refuses a state of another searcher or a malformed one") {
    auto random = make_searcher(config_for("single", Length{Unit::batches, 10}), 1);
    (void)random->initial_operations();
    ExperimentConfig asha_config = promotion_config();
    auto asha = make_searcher(asha_config, 1);
    CHECK_THROWS_WITH_AS(asha->restore(random->state()),
                         "searcher state: saved by searcher 'single' but this experiment's "
                         "searcher is 'adaptive_asha'",
                         CheckpointError);
    auto other_seed = make_searcher(config_for("single", Length{Unit::batches, 10}), 2);
    CHECK_THROWS_WITH_AS(other_seed->restore(random->state()),
                         "searcher state: saved with experiment seed 1 but this experiment's "
                         "seed is 2",
                         CheckpointError);
    json state = asha->state();
    state["method"]["brackets"] = json::array();
    CHECK_THROWS_WITH_AS(asha->restore(state),
                         "searcher 'adaptive_asha' state: expected 1 brackets but found []",
                         CheckpointError);
    // A bracket's state says whether it stops or promotes; a state without it (saved before
    // stop_once was taken) promoted.
    ExperimentConfig stopping_config = asha_config;
    stopping_config.searcher.stop_once = true;
    auto stopping = make_searcher(stopping_config, 1);
    (void)asha->initial_operations();
    CHECK_THROWS_WITH_AS(stopping->restore(asha->state()),
                         "adaptive_asha bracket state: saved with stop_once false but this "
                         "config's searcher.stop_once is true",
                         CheckpointError);
    state = asha->state();
    CHECK(state["method"]["brackets"][0]["stop_once"] == false);
    state["method"]["brackets"][0].erase("stop_once");
    auto promoting = make_searcher(asha_config, 1);
    promoting->restore(state);
    CHECK(promoting->state() == asha->state());
    state = random->state();
    state.erase("rng");
    CHECK_THROWS_WITH_AS(random->restore(state),
                         doctest::Contains("searcher state: the field 'rng' is missing"),
                         CheckpointError);
  }
}

// The workload sequencer against Determined's master sequencer: streams worked out
// from Determined 0.15.6's master/internal/trial_workload_sequencer.go, workload by
// workload, plus initial validation, graceful stop, restore and a second operation.
#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <loadstar/trial/workload_sequencer.hpp>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

using namespace loadstar;
using namespace loadstar::trial;
using nlohmann::json;

namespace {

/// `T100` (train 100), `V@500`, `C@500`: a short notation for workloads.
std::string short_form(const Workload& w) {
  switch (w.kind) {
    case WorkloadKind::run_step:
      return "T" + std::to_string(w.num_batches);
    case WorkloadKind::compute_validation_metrics:
      return "V@" + std::to_string(w.total_batches_processed);
    case WorkloadKind::checkpoint_model:
      return "C@" + std::to_string(w.total_batches_processed);
    case WorkloadKind::terminate:
      return "X@" + std::to_string(w.total_batches_processed);
  }
  return "?";
}

/// Expands `T100x5` into five `T100`.
std::vector<std::string> expand(const std::string& stream) {
  std::vector<std::string> out;
  std::istringstream in(stream);
  std::string item;
  while (in >> item) {
    const auto times = item.find('x');
    if (times == std::string::npos) {
      out.push_back(item);
    } else {
      const auto count = std::stoul(item.substr(times + 1));
      for (std::size_t i = 0; i < count; ++i)
        out.push_back(item.substr(0, times));
    }
  }
  return out;
}

/// Runs `sequencer` to `terminate` (included), answering validations with `best(total)`;
/// `limit` guards against a stream that never ends.
std::vector<std::string> run(WorkloadSequencer& sequencer,
                             const std::function<bool(std::uint64_t)>& best,
                             std::size_t limit = 10000) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < limit; ++i) {
    const Workload w = sequencer.next();
    out.push_back(short_form(w));
    if (w.kind == WorkloadKind::terminate) break;
    if (w.kind == WorkloadKind::compute_validation_metrics) {
      sequencer.complete_validation(w, best(w.total_batches_processed));
    } else {
      sequencer.complete(w);
    }
  }
  return out;
}

bool always(std::uint64_t) {
  return true;
}
bool never(std::uint64_t) {
  return false;
}

/// Stream A's options: Fashion-MNIST 54 000 rows, gbs 32, scheduling_unit 100,
/// min_validation_period {batches: 500}, policy best.
SequencerOptions stream_a_options() {
  SequencerOptions options;
  options.global_batch_size = 32;
  options.records_per_epoch = 54000;
  options.scheduling_unit = 100;
  options.min_validation_period = Length{Unit::batches, 500};
  options.checkpoint_policy = CheckpointPolicy::best;
  options.searcher_unit = Unit::epochs;
  return options;
}

SequencerOptions stream_c_options() {
  SequencerOptions options;
  options.global_batch_size = 1;
  options.scheduling_unit = 4;
  options.min_validation_period = Length{Unit::batches, 3};
  options.min_checkpoint_period = Length{Unit::batches, 5};
  options.checkpoint_policy = CheckpointPolicy::all;
  return options;
}

}  // namespace

TEST_SUITE("trial") {
  TEST_CASE("WorkloadSequencer follows worked stream A when every validation improves") {
    WorkloadSequencer sequencer(stream_a_options());
    sequencer.set_operation(Length{Unit::epochs, 1});  // 54000 // 32 = 1687 batches
    CHECK(run(sequencer, always) ==
          expand("T100x5 V@500 C@500 T100x5 V@1000 C@1000 T100x5 V@1500 C@1500 T100 T87 C@1687 "
                 "V@1687 X@1687"));
    CHECK(sequencer.total_batches() == 1687);
    CHECK(sequencer.progress() == doctest::Approx(1687.0 * 32 / 54000));
  }

  TEST_CASE("WorkloadSequencer follows worked stream A when no validation improves") {
    WorkloadSequencer sequencer(stream_a_options());
    sequencer.set_operation(Length{Unit::epochs, 1});
    CHECK(run(sequencer, never) ==
          expand("T100x5 V@500 T100x5 V@1000 T100x5 V@1500 T100 T87 C@1687 V@1687 X@1687"));
  }

  TEST_CASE("WorkloadSequencer follows worked stream B with its one batch workload") {
    SequencerOptions options = stream_a_options();
    options.min_validation_period = Length{Unit::epochs, 1};  // 1687 batches
    options.checkpoint_policy = CheckpointPolicy::none;
    WorkloadSequencer sequencer(options);
    sequencer.set_operation(Length{Unit::epochs, 2});  // 108000 // 32 = 3375 batches
    CHECK(run(sequencer, always) ==
          expand("T100x16 T87 V@1687 T100x16 T87 V@3374 T1 C@3375 V@3375 X@3375"));
  }

  TEST_CASE("WorkloadSequencer follows worked stream C with policy all") {
    WorkloadSequencer sequencer(stream_c_options());
    sequencer.set_operation(Length{Unit::batches, 10});
    CHECK(run(sequencer, never) == expand("T3 V@3 C@3 T3 V@6 C@6 T3 V@9 C@9 T1 C@10 V@10 X@10"));
  }

  TEST_CASE("WorkloadSequencer numbers steps and counts prior batches like Determined") {
    WorkloadSequencer sequencer(stream_c_options());
    sequencer.set_operation(Length{Unit::batches, 10});
    std::vector<Workload> stream;
    for (Workload w = sequencer.next();; w = sequencer.next()) {
      stream.push_back(w);
      if (w.kind == WorkloadKind::terminate) break;
      if (w.kind == WorkloadKind::compute_validation_metrics) {
        sequencer.complete_validation(w, false);
      } else {
        sequencer.complete(w);
      }
    }
    const std::vector<Workload> expected{
        {WorkloadKind::run_step, 1, 3, 0},
        {WorkloadKind::compute_validation_metrics, 1, 0, 3},
        {WorkloadKind::checkpoint_model, 1, 0, 3},
        {WorkloadKind::run_step, 2, 3, 3},
        {WorkloadKind::compute_validation_metrics, 2, 0, 6},
        {WorkloadKind::checkpoint_model, 2, 0, 6},
        {WorkloadKind::run_step, 3, 3, 6},
        {WorkloadKind::compute_validation_metrics, 3, 0, 9},
        {WorkloadKind::checkpoint_model, 3, 0, 9},
        {WorkloadKind::run_step, 4, 1, 9},
        {WorkloadKind::checkpoint_model, 4, 0, 10},
        {WorkloadKind::compute_validation_metrics, 4, 0, 10},
        {WorkloadKind::terminate, 4, 0, 10},
    };
    REQUIRE(stream.size() == expected.size());
    for (std::size_t i = 0; i < stream.size(); ++i) {
      INFO("workload ", i, ": ", to_string(stream[i]), " expected ", to_string(expected[i]));
      CHECK(stream[i] == expected[i]);
    }
    CHECK(to_string(stream[0]) == "T3@0 step 1");
    CHECK(to_string(WorkloadKind::compute_validation_metrics) == "compute_validation_metrics");
  }

  TEST_CASE("WorkloadSequencer validates first with perform_initial_validation") {
    SequencerOptions options;
    options.scheduling_unit = 4;
    options.perform_initial_validation = true;
    WorkloadSequencer sequencer(options);
    // Nothing to do before the searcher's first operation, as in Determined (UpToDate).
    CHECK(sequencer.next() == Workload{WorkloadKind::terminate, 0, 0, 0});
    sequencer.set_operation(Length{Unit::batches, 10});
    CHECK(run(sequencer, always) == expand("V@0 T4 T4 T2 C@10 V@10 X@10"));
  }

  TEST_CASE("WorkloadSequencer checkpoints before terminate when an operation ends on a period") {
    // Determined's --test overrides: one batch, a validation period of one batch. The period
    // validation is the operation's; the trial checkpoints before it ends (pre-close checkpoint).
    SequencerOptions options;
    options.scheduling_unit = 1;
    options.min_validation_period = Length{Unit::batches, 1};
    options.checkpoint_policy = CheckpointPolicy::none;
    WorkloadSequencer sequencer(options);
    sequencer.set_operation(Length{Unit::batches, 1});
    CHECK(run(sequencer, never) == expand("T1 V@1 C@1 X@1"));
    SUBCASE("the same with policy best and an improvement") {
      options.checkpoint_policy = CheckpointPolicy::best;
      WorkloadSequencer best(options);
      best.set_operation(Length{Unit::batches, 1});
      CHECK(run(best, always) == expand("T1 V@1 C@1 X@1"));
    }
  }

  TEST_CASE("WorkloadSequencer checkpoints and terminates after a graceful stop") {
    SequencerOptions options;
    options.scheduling_unit = 4;
    WorkloadSequencer sequencer(options);
    sequencer.set_operation(Length{Unit::batches, 10});
    Workload w = sequencer.next();
    REQUIRE(short_form(w) == "T4");
    sequencer.complete(w);
    sequencer.request_stop();
    CHECK(sequencer.stop_requested());
    CHECK(run(sequencer, always) == expand("C@4 X@4"));

    SUBCASE("right after a checkpoint it terminates at once") {
      WorkloadSequencer again(stream_c_options());
      again.set_operation(Length{Unit::batches, 10});
      CHECK(run(again, never, 3) == expand("T3 V@3 C@3"));
      again.request_stop();
      CHECK(run(again, never) == expand("X@3"));
    }
    SUBCASE("a validation already due still runs first as in Determined") {
      WorkloadSequencer again(stream_c_options());
      again.set_operation(Length{Unit::batches, 10});
      CHECK(run(again, never, 1) == expand("T3"));
      again.request_stop();
      CHECK(run(again, never) == expand("V@3 C@3 X@3"));
    }
  }

  TEST_CASE("WorkloadSequencer continues a second operation after the first") {
    SequencerOptions options;
    options.scheduling_unit = 4;
    options.min_validation_period = Length{Unit::batches, 6};
    options.checkpoint_policy = CheckpointPolicy::none;
    WorkloadSequencer sequencer(options);
    sequencer.set_operation(Length{Unit::batches, 10});
    CHECK(run(sequencer, always) == expand("T4 T2 V@6 T4 C@10 V@10 X@10"));
    // The same operation again (a restarted trial told its operation once more) adds nothing.
    sequencer.set_operation(Length{Unit::batches, 10});
    CHECK(run(sequencer, always) == expand("X@10"));
    sequencer.set_operation(Length{Unit::batches, 20});
    CHECK(run(sequencer, always) == expand("T4 T2 V@16 T4 C@20 V@20 X@20"));
    CHECK(sequencer.step_id() == 6);
    CHECK(sequencer.operation_batches() == 20);
  }

  TEST_CASE("WorkloadSequencer restored mid stream gives the same remaining stream") {
    const auto full = expand(
        "T100x5 V@500 C@500 T100x5 V@1000 C@1000 T100x5 V@1500 C@1500 T100 T87 C@1687 V@1687 "
        "X@1687");
    for (std::size_t stop = 0; stop + 1 < full.size(); ++stop) {
      CAPTURE(stop);
      WorkloadSequencer first(stream_a_options());
      first.set_operation(Length{Unit::epochs, 1});
      auto head = run(first, always, stop);
      // What a checkpoint stores: the state once the checkpoint workload completes.
      const Workload w = first.next();
      json saved = first.state();
      if (w.kind == WorkloadKind::checkpoint_model) {
        saved = first.state_after(w);
        first.complete(w);
        head.push_back(short_form(w));
      }
      WorkloadSequencer second(stream_a_options());
      second.restore(json::parse(saved.dump()));
      second.set_operation(Length{Unit::epochs, 1});  // told its operation again: no change
      CHECK(second.state() == first.state());
      auto tail = run(second, always);
      head.insert(head.end(), tail.begin(), tail.end());
      CHECK(head == full);
    }
  }

  TEST_CASE("WorkloadSequencer rolls back to the state after the latest checkpoint") {
    WorkloadSequencer sequencer(stream_c_options());
    sequencer.set_operation(Length{Unit::batches, 10});
    CHECK(run(sequencer, never, 5) == expand("T3 V@3 C@3 T3 V@6"));
    CHECK(sequencer.snapshot()["total_batches_processed"] == 3);
    CHECK(sequencer.roll_back() == 3);
    CHECK(run(sequencer, never) == expand("T3 V@6 C@6 T3 V@9 C@9 T1 C@10 V@10 X@10"));
  }

  TEST_CASE("WorkloadSequencer refuses a malformed state by name") {
    WorkloadSequencer sequencer(stream_c_options());
    CHECK_THROWS_WITH_AS(sequencer.restore(json::array()),
                         "workload sequencer state: expected a JSON object but found []",
                         CheckpointError);
    json state = sequencer.state();
    state.erase("cur_step_id");
    CHECK_THROWS_WITH_AS(sequencer.restore(state),
                         doctest::Contains("the field 'cur_step_id' is missing"), CheckpointError);
    state = sequencer.state();
    state["ops"] = json::array({json{{"bathces", 3}}});
    CHECK_THROWS_WITH_AS(sequencer.restore(state),
                         doctest::Contains("ops: expected a length in batches, records or epochs "
                                           "but found {\"bathces\":3}"),
                         CheckpointError);
    state = sequencer.state();
    state["cur_op_idx"] = 2;
    CHECK_THROWS_WITH_AS(sequencer.restore(state),
                         "workload sequencer state: cur_op_idx 2 is beyond the 0 operations",
                         CheckpointError);
  }

  TEST_CASE("WorkloadSequencer refuses an operation that is not beyond the last one") {
    WorkloadSequencer sequencer(stream_c_options());
    CHECK_THROWS_WITH_AS(sequencer.set_operation(Length{Unit::batches, 0}),
                         "workload sequencer: operation {\"batches\":0} is 0 batches but expected "
                         "more than 0 (the batches trained or asked for before)",
                         ConfigError);
    sequencer.set_operation(Length{Unit::batches, 10});
    CHECK_THROWS_WITH_AS(sequencer.set_operation(Length{Unit::batches, 7}),
                         doctest::Contains("is 7 batches but expected more than 10"), ConfigError);
  }

  TEST_CASE("to_batches floors records and epochs like ToNearestBatch") {
    CHECK(to_batches(Length{Unit::batches, 7}, 32, 0) == 7);
    CHECK(to_batches(Length{Unit::records, 100}, 32, 0) == 3);
    CHECK(to_batches(Length{Unit::epochs, 2}, 32, 54000) == 3375);
    CHECK(to_batches(Length{Unit::epochs, 1}, 32, 54000) == 1687);
    CHECK_THROWS_WITH_AS(
        to_batches(Length{Unit::epochs, 1}, 32, 0),
        "length {\"epochs\":1}: a length in epochs needs records_per_epoch but it is not set",
        ConfigError);
    CHECK(units_from_batches(Unit::epochs, 1687, 32, 54000) == doctest::Approx(0.99970370));
    CHECK(units_from_batches(Unit::records, 3, 32, 0) == 96.0);
    CHECK(units_from_batches(Unit::batches, 3, 32, 0) == 3.0);
    CHECK(equal_within_batch(Length{Unit::epochs, 1}, 1687, 32, 54000));
    CHECK_FALSE(equal_within_batch(Length{Unit::epochs, 1}, 1686, 32, 54000));
    CHECK(equal_within_batch(Length{Unit::records, 100}, 3, 32, 0));
    CHECK(equal_within_batch(Length{Unit::records, 100}, 4, 32, 0));  // |100 - 128| < 32
    CHECK_FALSE(equal_within_batch(Length{Unit::records, 100}, 2, 32, 0));
  }

  TEST_CASE("sequencer_options takes the experiment config and the trial batch size") {
    ExperimentConfig config;
    config.records_per_epoch = 60000;
    config.scheduling_unit = 50;
    config.min_validation_period = Length{Unit::epochs, 1};
    config.min_checkpoint_period = Length{Unit::batches, 300};
    config.checkpoint_policy = CheckpointPolicy::all;
    config.perform_initial_validation = true;
    config.searcher.max_length = Length{Unit::epochs, 5};
    const SequencerOptions options = sequencer_options(config, 64);
    CHECK(options.global_batch_size == 64);
    CHECK(options.records_per_epoch == 60000);
    CHECK(options.scheduling_unit == 50);
    CHECK(options.min_validation_period == Length{Unit::epochs, 1});
    CHECK(options.min_checkpoint_period == Length{Unit::batches, 300});
    CHECK(options.checkpoint_policy == CheckpointPolicy::all);
    CHECK(options.perform_initial_validation);
    CHECK(options.searcher_unit == Unit::epochs);
    CHECK_THROWS_WITH_AS(
        sequencer_options(config, 0),
        "workload sequencer: expected a global_batch_size of at least 1 but found 0", ConfigError);
    config.records_per_epoch = 0;
    CHECK_THROWS_WITH_AS(sequencer_options(config, 64),
                         doctest::Contains("needs records_per_epoch but it is not set"),
                         ConfigError);
  }
}

#include <doctest/doctest.h>

#include <cstdint>
#include <fstream>
#include <loadstar/trial/experiment_config.hpp>
#include <loadstar/trial/hyperparameters.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "temp_dir.hpp"

using namespace loadstar;
using namespace loadstar::trial;
using nlohmann::json;
using Type = Hyperparameter::Type;

namespace {

const std::string single = "{name: single, metric: val_loss, max_length: {batches: 100}}";

/// A config with the given hyperparameters (a flow mapping's body), searcher and extra top-level
/// lines.
std::string yaml(const std::string& hparams = "global_batch_size: 32",
                 const std::string& searcher = single, const std::string& extra = "") {
  return "entrypoint: model_def:Trial\nhyperparameters: {" + hparams + "}\nsearcher: " + searcher +
         "\n" + extra;
}

ExperimentConfig parse(const std::string& text) {
  return parse_experiment_config(text, "c.yaml");
}

/// `message` as the config 'c.yaml' reports it.
std::string refusal(const std::string& message) {
  return "experiment config 'c.yaml': " + message;
}

}  // namespace

TEST_SUITE("trial") {
  TEST_CASE("parse_experiment_config fills in Determined's defaults") {
    const ExperimentConfig c = parse(yaml());
    CHECK(c.description.empty());
    CHECK(c.labels.empty());
    CHECK(c.entrypoint == "model_def:Trial");
    REQUIRE(c.hyperparameters.size() == 1);
    CHECK(c.hyperparameters[0].name == "global_batch_size");
    CHECK(c.hyperparameters[0].value.type == Type::constant);
    CHECK(c.hyperparameters[0].value.val == 32);
    CHECK(c.searcher.name == "single");
    CHECK(c.searcher.metric == "val_loss");
    CHECK(c.searcher.smaller_is_better);
    CHECK(c.searcher.max_length == Length{Unit::batches, 100});
    CHECK(c.searcher.max_trials == 0);
    CHECK(c.searcher.max_concurrent_trials == 0);
    CHECK(c.searcher.mode == "standard");
    CHECK(c.searcher.divisor == 4);
    CHECK(c.searcher.max_rungs == 5);
    CHECK(c.searcher.bracket_rungs.empty());
    CHECK_FALSE(c.searcher.stop_once);
    CHECK_FALSE(c.searcher.source_trial_id);
    CHECK_FALSE(c.searcher.source_checkpoint_uuid);
    CHECK(c.records_per_epoch == 0);
    CHECK(c.scheduling_unit == 100);
    CHECK(c.min_validation_period == Length{Unit::batches, 0});
    CHECK(c.min_checkpoint_period == Length{Unit::batches, 0});
    CHECK_FALSE(c.perform_initial_validation);
    CHECK(c.checkpoint_policy == CheckpointPolicy::best);
    CHECK(c.checkpoint_storage.type == "shared_fs");
    CHECK(c.checkpoint_storage.host_path.empty());
    CHECK(c.checkpoint_storage.storage_path.empty());
    CHECK(c.checkpoint_storage.save_experiment_best == 0);
    CHECK(c.checkpoint_storage.save_trial_best == 1);
    CHECK(c.checkpoint_storage.save_trial_latest == 1);
    CHECK_FALSE(c.experiment_seed);
    CHECK(c.max_restarts == 5);
    CHECK(c.slots_per_trial == 1);
    CHECK(c.aggregation_frequency == 1);
    CHECK_FALSE(c.average_training_metrics);
    CHECK(c.data_layer.type == "shared_fs");
    CHECK(c.data_layer.host_storage_path.empty());  // the user's cache directory
    CHECK(c.data == json::object());
    // raw is the config with the defaults written out, as Determined's master hands it over.
    CHECK(c.raw.at("scheduling_unit") == 100);
    CHECK(c.raw.at("max_restarts") == 5);
    CHECK(c.raw.at("checkpoint_storage") == json{{"type", "shared_fs"},
                                                 {"save_experiment_best", 0},
                                                 {"save_trial_best", 1},
                                                 {"save_trial_latest", 1}});
    CHECK(c.raw.at("hyperparameters") ==
          json{{"global_batch_size", {{"type", "const"}, {"val", 32}}}});
    CHECK(c.raw.at("searcher") == json{{"name", "single"},
                                       {"metric", "val_loss"},
                                       {"smaller_is_better", true},
                                       {"max_length", {{"batches", 100}}}});
    CHECK(c.raw.at("reproducibility") == json::object());
    CHECK(c.raw.at("data_layer") == json{{"type", "shared_fs"}});
    CHECK(c.raw == to_json(c));
  }

  TEST_CASE("parse_experiment_config reads every field") {
    const ExperimentConfig c = parse(R"(
description: fashion mnist
labels: [mlp, "small"]
entrypoint: model_def:FashionMNISTTrial
hyperparameters:
  global_batch_size: {type: categorical, vals: [16, 32]}
  learning_rate: {type: log, minval: -4, maxval: -1, base: 2, count: 3}
  hidden_size: {type: int, minval: 32, maxval: 256, count: 4}
  dropout: {type: double, minval: 0.0, maxval: 0.5}
  activation: {type: const, val: relu}
  layers: [64, 32]
  optimizer:
    name: adam
    beta_1: {type: double, minval: 0.8, maxval: 0.99}
searcher:
  name: adaptive_asha
  metric: val_accuracy
  smaller_is_better: false
  max_length: {epochs: 5}
  max_trials: 16
  max_concurrent_trials: 4
  mode: aggressive
  divisor: 3
  max_rungs: 4
  bracket_rungs: [4, 2]
  stop_once: false
records_per_epoch: 60000
scheduling_unit: 50
min_validation_period: {records: 6000}
min_checkpoint_period: {epochs: 1}
perform_initial_validation: true
checkpoint_policy: all
checkpoint_storage:
  type: shared_fs
  host_path: /tmp/checkpoints
  storage_path: fashion
  save_experiment_best: 2
  save_trial_best: 0
  save_trial_latest: 3
reproducibility: {experiment_seed: 2147483647}
max_restarts: 0
resources: {slots_per_trial: 2}
optimizations: {aggregation_frequency: 4, average_training_metrics: yes,
                average_aggregated_gradients: false, tensor_fusion_threshold: 0,
                tensor_fusion_cycle_time: 5, auto_tune_tensor_fusion: false,
                gradient_compression: false, mixed_precision: O0}
profiling: {enabled: false, begin_on_batch: 0}
data_layer: {type: shared_fs, host_storage_path: /data/caches}
data: {path: /data/fashion, augment: false}
)");
    CHECK(c.description == "fashion mnist");
    CHECK(c.labels == std::vector<std::string>{"mlp", "small"});
    CHECK(c.entrypoint == "model_def:FashionMNISTTrial");
    // Sorted by name.
    REQUIRE(c.hyperparameters.size() == 7);
    const auto& hp = c.hyperparameters;
    CHECK(hp[0].name == "activation");
    CHECK(hp[0].value.type == Type::constant);
    CHECK(hp[0].value.val == "relu");
    CHECK(hp[1].name == "dropout");
    CHECK(hp[1].value.type == Type::real);
    CHECK(hp[1].value.minval == 0.0);
    CHECK(hp[1].value.maxval == 0.5);
    CHECK_FALSE(hp[1].value.count);
    CHECK(hp[2].name == "global_batch_size");
    CHECK(hp[2].value.type == Type::categorical);
    CHECK(hp[2].value.vals == std::vector<json>{16, 32});
    CHECK(hp[3].name == "hidden_size");
    CHECK(hp[3].value.type == Type::integer);
    CHECK(hp[3].value.minval == 32);
    CHECK(hp[3].value.maxval == 256);
    CHECK(hp[3].value.count == 4);
    CHECK(hp[4].name == "layers");
    CHECK(hp[4].value.type == Type::constant);
    CHECK(hp[4].value.val == json{64, 32});
    CHECK(hp[5].name == "learning_rate");
    CHECK(hp[5].value.type == Type::log);
    CHECK(hp[5].value.base == 2);
    CHECK(hp[5].value.minval == -4);
    CHECK(hp[5].value.count == 3);
    CHECK(hp[6].name == "optimizer");
    CHECK(hp[6].value.type == Type::nested);
    REQUIRE(hp[6].value.members.size() == 2);
    CHECK(hp[6].value.members[0].name == "beta_1");
    CHECK(hp[6].value.members[0].value.type == Type::real);
    CHECK(hp[6].value.members[1].name == "name");
    CHECK(hp[6].value.members[1].value.val == "adam");
    const SearcherConfig& s = c.searcher;
    CHECK(s.name == "adaptive_asha");
    CHECK(s.metric == "val_accuracy");
    CHECK_FALSE(s.smaller_is_better);
    CHECK(s.max_length == Length{Unit::epochs, 5});
    CHECK(s.max_trials == 16);
    CHECK(s.max_concurrent_trials == 4);
    CHECK(s.mode == "aggressive");
    CHECK(s.divisor == 3);
    CHECK(s.max_rungs == 4);
    CHECK(s.bracket_rungs == std::vector<std::uint64_t>{4, 2});
    CHECK_FALSE(s.stop_once);
    CHECK_FALSE(s.source_trial_id);
    CHECK_FALSE(s.source_checkpoint_uuid);
    CHECK(c.records_per_epoch == 60000);
    CHECK(c.scheduling_unit == 50);
    CHECK(c.min_validation_period == Length{Unit::records, 6000});
    CHECK(c.min_checkpoint_period == Length{Unit::epochs, 1});
    CHECK(c.perform_initial_validation);
    CHECK(c.checkpoint_policy == CheckpointPolicy::all);
    CHECK(c.checkpoint_storage.host_path == "/tmp/checkpoints");
    CHECK(c.checkpoint_storage.storage_path == "fashion");
    CHECK(c.checkpoint_storage.save_experiment_best == 2);
    CHECK(c.checkpoint_storage.save_trial_best == 0);
    CHECK(c.checkpoint_storage.save_trial_latest == 3);
    CHECK(c.experiment_seed == 2147483647U);
    CHECK(c.max_restarts == 0);
    CHECK(c.slots_per_trial == 2);
    CHECK(c.aggregation_frequency == 4);
    CHECK(c.average_training_metrics);
    CHECK_FALSE(c.average_aggregated_gradients);
    CHECK(c.tensor_fusion_threshold == 0);
    CHECK(c.data_layer.host_storage_path == "/data/caches");
    CHECK(c.data == json{{"path", "/data/fashion"}, {"augment", false}});
    // The parsed hyperparameters drive the grid: 2 * 4 * 3 points (dropout and beta_1 have no
    // count, so the grid refuses them; drop them first).
    auto gridded = c.hyperparameters;
    gridded.erase(gridded.begin() + 1);
    gridded.back().value.members.erase(gridded.back().value.members.begin());
    CHECK(grid_hparams(gridded).size() == 24);
  }

  TEST_CASE("parse_experiment_config types plain scalars like YAML and keeps quoted ones text") {
    const ExperimentConfig c = parse(
        yaml("global_batch_size: 32, a: '5', b: 1e-3, c: yes, d: ~, e: -7, f: 0.5, g: \"true\", "
             "h: 1_000, i: .inf"));
    const auto value = [&](const std::string& name) {
      for (const auto& hp : c.hyperparameters) {
        if (hp.name == name) return hp.value.val;
      }
      FAIL("no hyperparameter " << name);
      return json();
    };
    CHECK(value("a") == "5");
    CHECK(value("b").is_number_float());
    CHECK(value("b") == 1e-3);
    CHECK(value("c") == true);
    CHECK(value("d").is_null());
    CHECK(value("e") == -7);
    CHECK(value("e").is_number_integer());
    CHECK(value("f") == 0.5);
    CHECK(value("g") == "true");
    CHECK(value("h") == 1000);
    CHECK(value("i").get<double>() == std::numeric_limits<double>::infinity());
  }

  TEST_CASE("parse_experiment_config refuses YAML aliases that expand without end or bound") {
    // An alias inside the value it names, and the "billion laughs" (each list ten of the last).
    CHECK_THROWS_WITH_AS(parse("description: &a [*a]\n"),
                         doctest::Contains("expected values nested at most 64 deep"), ConfigError);
    std::string laughs = "l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n";
    for (int i = 1; i < 9; ++i) {
      const std::string previous = "*l" + std::to_string(i - 1);
      laughs += "l" + std::to_string(i) + ": &l" + std::to_string(i) + " [";
      for (int k = 0; k < 10; ++k)
        laughs += (k > 0 ? ", " : "") + previous;
      laughs += "]\n";
    }
    CHECK_THROWS_WITH_AS(parse(laughs),
                         doctest::Contains("expected at most 100000 values in the document"),
                         ConfigError);
  }

  TEST_CASE("parse_experiment_config takes Determined's cluster keys at their defaults") {
    const ExperimentConfig c = parse(yaml(
        "global_batch_size: 32", single,
        "name: fashion\nenvironment: {image: null, force_pull_image: false}\nbind_mounts: []\n"
        "debug: false\nresources: {slots_per_trial: 1, max_slots: 4, weight: 1, "
        "resource_pool: '', native_parallel: false, priority: null}\n"
        "optimizations: {mixed_precision: O0}\ncheckpoint_storage: {propagation: rprivate}\n"));
    CHECK(c.name == "fashion");
    CHECK(c.max_slots == 4);
    CHECK(c.raw.at("name") == "fashion");
    CHECK(c.raw.at("environment") == json{{"image", nullptr}, {"force_pull_image", false}});
    CHECK(c.environment_variables.empty());
    const ExperimentConfig with_variables =
        parse(yaml("global_batch_size: 32", single,
                   "environment: {environment_variables: [OMP_NUM_THREADS=1, GREETING=a=b]}\n"));
    CHECK(with_variables.environment_variables ==
          std::vector<std::string>{"OMP_NUM_THREADS=1", "GREETING=a=b"});
    CHECK(experiment_config_from_json(to_json(with_variables), "stored") == with_variables);
    CHECK(experiment_config_from_json(to_json(c), "stored") == c);
    CHECK(c.raw.at("bind_mounts") == json::array());
    CHECK(c.raw.at("resources") == json{{"slots_per_trial", 1},
                                        {"max_slots", 4},
                                        {"weight", 1},
                                        {"resource_pool", ""},
                                        {"native_parallel", false},
                                        {"priority", nullptr}});
    CHECK(c.raw.at("optimizations") == json{{"mixed_precision", "O0"},
                                            {"aggregation_frequency", 1},
                                            {"average_training_metrics", false},
                                            {"average_aggregated_gradients", true},
                                            {"tensor_fusion_threshold", 64}});
    CHECK(c.raw.at("checkpoint_storage").at("propagation") == "rprivate");
  }

  TEST_CASE("parse_experiment_config refuses Determined's cluster keys at other values") {
    const auto refused = [](const std::string& extra) {
      try {
        parse(yaml("global_batch_size: 32", single, extra));
      } catch (const ConfigError& e) {
        return std::string(e.what());
      }
      return std::string("accepted");
    };
    const std::string containers = "trials run as processes of this machine, not in containers";
    CHECK(refused("environment: {image: determinedai/environments:py-3.8}\n") ==
          refusal("environment.image: expected no such key but found "
                  "\"determinedai/environments:py-3.8\": " +
                  containers));
    CHECK(refused("environment: {force_pull_image: true}\n") ==
          refusal("environment.force_pull_image: expected false (Determined's default) but found "
                  "true: " +
                  containers));
    CHECK(refused("environment: {ports: {web: 8080}}\n") ==
          refusal("environment.ports: expected {} (Determined's default) but found {web: 8080}: " +
                  containers));
    CHECK(refused("bind_mounts: [{host_path: /data, container_path: /data}]\n") ==
          refusal(
              "bind_mounts: expected [] (Determined's default) but found [{container_path: /data, "
              "host_path: /data}]: trials run as processes of this machine and read its "
              "files where they are, without containers to mount them into"));
    CHECK(refused("debug: true\n") ==
          refusal("debug: expected false (Determined's default) but found true: loadstar has no "
                  "debug mode; each trial's whole output is in its output.log either way"));
    CHECK(
        refused("resources: {resource_pool: gpus}\n") ==
        refusal("resources.resource_pool: expected \"\" (Determined's default) but found gpus: one "
                "machine runs every trial here; there are no agents to choose"));
    CHECK(refused("resources: {priority: 10}\n") ==
          refusal("resources.priority: expected no such key but found 10: loadstar runs one "
                  "experiment per command, with no cluster scheduler to order experiments"));
    CHECK(refused("resources: {weight: 2}\n") ==
          refusal("resources.weight: expected 1 (Determined's default) but found 2: loadstar runs "
                  "one experiment per command, with no cluster scheduler to order experiments"));
    CHECK(refused("resources: {native_parallel: true}\n") ==
          refusal("resources.native_parallel: expected false (Determined's default) but found "
                  "true: loadstar itself launches a trial's ranks (over mpirun when "
                  "slots_per_trial > 1)"));
    CHECK(refused("resources: {shm_size: 4G}\n") ==
          refusal("resources.shm_size: expected no such key but found 4G: trials run as processes "
                  "of this machine, not in containers, and see all of its devices and memory"));
    CHECK(refused("resources: {slots_per_trial: 2, max_slots: 1}\n") ==
          refusal("resources.max_slots: expected at least resources.slots_per_trial (2) but found "
                  "1: no trial could start"));
    CHECK(refused("checkpoint_storage: {propagation: shared}\n") ==
          refusal("checkpoint_storage.propagation: expected rprivate (Determined's default) but "
                  "found shared: it sets the mount propagation of the storage inside a trial's "
                  "container, and trials here run without containers"));
    CHECK(refused("resources: {max_slot: 4}\n") ==
          refusal("resources.max_slot: not a key of resources (did you mean 'max_slots'?)"));
  }

  TEST_CASE("parse_experiment_config refuses what it would otherwise ignore, naming the key") {
    const auto refused = [](const std::string& extra, const std::string& searcher = single) {
      try {
        parse(yaml("global_batch_size: 32", searcher, extra));
      } catch (const ConfigError& e) {
        return std::string(e.what());
      }
      return std::string("accepted");
    };
    CHECK(refused("optimizations: {mixed_precision: O1}\n") ==
          refusal("optimizations.mixed_precision: expected O0 but found O1: Determined's O1-O3 "
                  "are apex AMP levels for PyTorch trials; a Keras trial sets a dtype policy "
                  "instead: context.set_global_policy(\"mixed_float16\") in the trial's "
                  "constructor (from a hyperparameter if you like), or "
                  "keras::mixed_precision::set_global_policy with the Native API"));
    CHECK(refused("optimizations: {gradient_compression: true}\n") ==
          refusal("optimizations.gradient_compression: expected false but found true: "
                  "loadstar's allreduce does not compress gradients"));
    CHECK(refused("optimizations: {tensor_fusion_cycle_time: 1}\n") ==
          refusal("optimizations.tensor_fusion_cycle_time: expected 5 (Determined's default) but "
                  "found 1: loadstar's allreduce runs when the step calls it, without Horovod's "
                  "background cycle to time"));
    CHECK(refused("optimizations: {auto_tune_tensor_fusion: true}\n") ==
          refusal("optimizations.auto_tune_tensor_fusion: expected false but found true: "
                  "loadstar does not tune the fusion threshold; set "
                  "optimizations.tensor_fusion_threshold"));
    CHECK(refused("optimizations: {grad_updates_size_file: /tmp/x}\n") ==
          refusal("optimizations.grad_updates_size_file: expected no such key but found /tmp/x: "
                  "it logs Horovod's fusion tuning, which loadstar does not do"));
    CHECK(refused("optimizations: {tensor_fusion_threshold: -1}\n") ==
          refusal("optimizations.tensor_fusion_threshold: expected an int >= 0 but found -1"));
    CHECK(refused("profiling: {enabled: true}\n") ==
          refusal("profiling.enabled: expected false but found true: loadstar has no profiler "
                  "yet"));
    CHECK(refused("profiling: {enable: false}\n") ==
          refusal("profiling.enable: not a key of profiling (did you mean 'enabled'?)"));
    CHECK(refused("tensorboard_storage: {type: shared_fs, host_path: /tmp}\n") ==
          refusal("tensorboard_storage: expected no such key but found {host_path: /tmp, "
                  "type: shared_fs}: loadstar writes TensorBoard event files in each trial's "
                  "folder (<experiment>/trials/<id>/tensorboard) and has no separate storage for "
                  "them"));
    CHECK(refused("data_layer: {type: s3, bucket: b}\n") ==
          refusal("data_layer.type: expected shared_fs (the caches live in a directory of this "
                  "machine; loadstar has no S3 or GCS client) but found s3"));
    CHECK(refused("data_layer: {container_storage_path: /cache}\n") ==
          refusal("data_layer.container_storage_path: expected no such key but found /cache: "
                  "loadstar runs trials as processes of this machine, not in containers; give "
                  "host_storage_path"));
    CHECK(refused("data_layer: {host_storage_path: caches}\n") ==
          refusal("data_layer.host_storage_path: expected an absolute path but found caches"));
    CHECK(refused("data_layer: {host_storage_pth: /x}\n") ==
          refusal("data_layer.host_storage_pth: not a key of a shared_fs data layer (did you "
                  "mean 'host_storage_path'?)"));
    CHECK(refused("data_layer: [shared_fs]\n") ==
          refusal("data_layer: expected a mapping but found [shared_fs]"));
    CHECK(refused("environment: {environment_variables: {cpu: [A=1], cuda: [A=2]}}\n") ==
          refusal("environment.environment_variables: expected a list of KEY=VALUE strings but "
                  "found {cpu: [A=1], cuda: [A=2]}: loadstar does not choose variables by slot "
                  "type (cpu, cuda, rocm); give one list"));
    CHECK(refused("environment: {environment_variables: [A=1, =2]}\n") ==
          refusal("environment.environment_variables[1]: expected KEY=VALUE with a non-empty "
                  "KEY but found =2"));
    CHECK(refused("environment: {environment_variable: [A=1]}\n") ==
          refusal("environment.environment_variable: not a key of an environment (did you mean "
                  "'environment_variables'?)"));
    const std::string asha =
        "{name: adaptive_asha, metric: val_loss, max_length: {batches: 9}, max_trials: 4, ";
    CHECK(refused("", asha + "stop_once: 1}") ==
          refusal("searcher.stop_once: expected true or false but found 1"));
    CHECK(refused("", asha + "source_trial_id: 7}") ==
          refusal("searcher.source_trial_id: expected no such key but found 7: trials are "
                  "numbered per experiment folder here, so an id names no one trial; give "
                  "searcher.source_checkpoint_uuid (experiment describe lists the checkpoints)"));
    CHECK(refused("",
                  "{name: single, metric: val_loss, max_length: {batches: 9}, "
                  "source_checkpoint_uuid: abc-123}") == "accepted");
    CHECK(refused("",
                  "{name: single, metric: val_loss, max_length: {batches: 9}, "
                  "source_checkpoint_uuid: ../x}") ==
          refusal("searcher.source_checkpoint_uuid: expected a checkpoint's uuid (a folder name) "
                  "but found ../x"));
    // The defaults are accepted: they are what loadstar does.
    CHECK(refused("optimizations: {mixed_precision: O0, gradient_compression: false, "
                  "tensor_fusion_cycle_time: 5, auto_tune_tensor_fusion: false}\n"
                  "profiling: {enabled: false}\n",
                  asha + "stop_once: false}") == "accepted");
  }

  TEST_CASE("parse_experiment_config takes adaptive_asha's stop_once and round trips it") {
    const ExperimentConfig c =
        parse(yaml("global_batch_size: 32",
                   "{name: adaptive_asha, metric: val_loss, max_length: {batches: 9}, "
                   "max_trials: 4, stop_once: true}"));
    CHECK(c.searcher.stop_once);
    const json stored = to_json(c);
    CHECK(stored.at("searcher").at("stop_once") == true);
    const ExperimentConfig back = experiment_config_from_json(json::parse(stored.dump()), "e.json");
    CHECK(back.searcher.stop_once);
    CHECK(back == c);
  }

  TEST_CASE("to_json and experiment_config_from_json round trip") {
    const ExperimentConfig c = parse(yaml(
        "global_batch_size: {type: int, minval: 8, maxval: 64, count: 4}, lr: {type: log, "
        "minval: -5, maxval: -1, base: 10}, opt: {momentum: {type: double, minval: 0.5, maxval: "
        "0.9}, kind: {type: categorical, vals: [sgd, adam]}}, layers: [3, 4]",
        "{name: random, metric: val_accuracy, smaller_is_better: false, max_length: {records: "
        "6400}, max_trials: 5}",
        "records_per_epoch: 640\nmin_checkpoint_period: {epochs: 2}\ncheckpoint_policy: none\n"
        "reproducibility: {experiment_seed: 12}\nlabels: [x]\ndata: {k: [1, 2]}\n"
        "name: widths\nenvironment: {image: null}\ndata_layer: {host_storage_path: "
        "/srv/caches}\n"));
    const json stored = to_json(c);
    // Through text, as an experiment stores it.
    const ExperimentConfig back = experiment_config_from_json(json::parse(stored.dump()), "e.json");
    CHECK(to_json(back) == stored);
    CHECK(back.raw == c.raw);
    CHECK(back == c);
    CHECK(back.entrypoint == c.entrypoint);
    CHECK(back.labels == c.labels);
    REQUIRE(back.hyperparameters.size() == c.hyperparameters.size());
    for (std::size_t i = 0; i < c.hyperparameters.size(); ++i) {
      CHECK(back.hyperparameters[i].name == c.hyperparameters[i].name);
      CHECK(back.hyperparameters[i].value.type == c.hyperparameters[i].value.type);
    }
    // Sorted: global_batch_size, layers, lr, opt.
    REQUIRE(back.hyperparameters[2].name == "lr");
    CHECK(back.hyperparameters[2].value.minval == -5);
    CHECK(back.hyperparameters[2].value.base == 10);
    CHECK(back.hyperparameters[3].value.members[1].value.maxval == 0.9);
    CHECK(back.searcher.name == "random");
    CHECK(back.searcher.max_trials == 5);
    CHECK_FALSE(back.searcher.smaller_is_better);
    CHECK(back.searcher.max_length == Length{Unit::records, 6400});
    CHECK(back.records_per_epoch == 640);
    CHECK(back.min_checkpoint_period == Length{Unit::epochs, 2});
    CHECK(back.checkpoint_policy == CheckpointPolicy::none);
    CHECK(back.experiment_seed == 12U);
    CHECK(back.data == json{{"k", {1, 2}}});
    CHECK(back.data_layer.host_storage_path == "/srv/caches");
    CHECK(stored.at("data_layer") ==
          json{{"type", "shared_fs"}, {"host_storage_path", "/srv/caches"}});
    CHECK(back.raw.at("environment") == json{{"image", nullptr}});
    CHECK(back.name == "widths");
    // The stored form of the searcher holds only the keys the random searcher takes.
    CHECK(stored.at("searcher") == json{{"name", "random"},
                                        {"metric", "val_accuracy"},
                                        {"smaller_is_better", false},
                                        {"max_length", {{"records", 6400}}},
                                        {"max_trials", 5},
                                        {"max_concurrent_trials", 0}});
    // A config built in C++ round trips too.
    ExperimentConfig built;
    built.entrypoint = "t";
    built.hyperparameters.push_back({"global_batch_size", {}});
    built.hyperparameters[0].value.val = 4;
    built.searcher.metric = "val_loss";
    built.searcher.max_length = Length{Unit::batches, 3};
    const ExperimentConfig rebuilt = experiment_config_from_json(to_json(built), "built");
    CHECK(to_json(rebuilt) == to_json(built));
    CHECK_FALSE(rebuilt == built);  // built.raw is empty; rebuilt.raw is the whole config
    CHECK(rebuilt.raw == to_json(built));
  }

  TEST_CASE("make_test_config applies Determined's test mode") {
    const ExperimentConfig c = parse(
        yaml("global_batch_size: 32",
             "{name: adaptive_asha, metric: val_accuracy, smaller_is_better: false, max_length: "
             "{batches: 1000}, max_trials: 8}",
             "description: d\nscheduling_unit: 20\nmin_validation_period: {batches: 200}\n"
             "max_restarts: 3\ncheckpoint_storage: {save_trial_best: 2, save_trial_latest: 4, "
             "save_experiment_best: 1}\n"));
    const ExperimentConfig t = make_test_config(c);
    CHECK(t.description == "[test-mode] d");
    CHECK(t.scheduling_unit == 1);
    CHECK(t.min_validation_period == Length{Unit::batches, 1});
    CHECK(t.searcher.name == "single");
    CHECK(t.searcher.metric == "val_accuracy");
    CHECK_FALSE(t.searcher.smaller_is_better);
    CHECK(t.searcher.max_length == Length{Unit::batches, 1});
    CHECK(t.searcher.max_trials == 0);
    CHECK(t.checkpoint_storage.save_experiment_best == 0);
    CHECK(t.checkpoint_storage.save_trial_best == 0);
    CHECK(t.checkpoint_storage.save_trial_latest == 1);
    CHECK(t.max_restarts == 0);
    CHECK(t.entrypoint == c.entrypoint);
    CHECK(t.raw == to_json(t));
    CHECK(t.raw.at("searcher").at("name") == "single");
    // Applied twice, the same.
    CHECK(make_test_config(t) == t);
    CHECK_FALSE(t == c);
  }

  TEST_CASE("load_experiment_config reads a file and names it") {
    test_support::TempDir dir;
    {
      std::ofstream out(dir / "const.yaml");
      out << yaml("global_batch_size: 8") << "scheduling_unit: 7\n";
    }
    const ExperimentConfig c = load_experiment_config(dir / "const.yaml");
    CHECK(c.scheduling_unit == 7);
    {
      std::ofstream out(dir / "bad.yaml");
      out << yaml("global_batch_size: 8") << "scheduling_unit: 0\n";
    }
    CHECK_THROWS_WITH_AS(load_experiment_config(dir / "bad.yaml"),
                         ("experiment config '" + (dir / "bad.yaml").string() +
                          "': scheduling_unit: expected an int >= 1 but found 0")
                             .c_str(),
                         ConfigError);
    CHECK_THROWS_WITH_AS(load_experiment_config(dir / "missing.yaml"),
                         ("experiment config '" + (dir / "missing.yaml").string() +
                          "': cannot open for reading: No such file or directory")
                             .c_str(),
                         IoError);
    CHECK_THROWS_WITH_AS(load_experiment_config(dir.path()),
                         ("experiment config '" + dir.path().string() +
                          "': expected a YAML file but found a directory")
                             .c_str(),
                         IoError);
  }

  TEST_CASE("parse_experiment_config refuses unknown keys with a suggestion") {
    CHECK_THROWS_WITH_AS(
        parse(yaml("global_batch_size: 32",
                   "{name: single, metric: val_loss, max_length: {bathces: 5}}")),
        refusal("searcher.max_length: expected exactly one of batches, records or epochs but "
                "found {bathces: 5} (did you mean 'batches'?)")
            .c_str(),
        ConfigError);
    CHECK_THROWS_WITH_AS(
        parse(yaml("global_batch_size: 32",
                   "{name: single, metric: val_loss, max_length: {batches: 5, epochs: 1}}")),
        refusal("searcher.max_length: expected exactly one of batches, records or epochs but "
                "found {batches: 5, epochs: 1}")
            .c_str(),
        ConfigError);
    CHECK_THROWS_WITH_AS(parse(yaml() + "scheduling_units: 5\n"),
                         refusal("scheduling_units: not a key of an experiment config (did you "
                                 "mean 'scheduling_unit'?)")
                             .c_str(),
                         ConfigError);
    CHECK_THROWS_WITH_AS(parse(yaml() + "colour: blue\n"),
                         refusal("colour: not a key of an experiment config").c_str(), ConfigError);
    CHECK_THROWS_WITH_AS(
        parse(yaml("global_batch_size: 32",
                   "{name: single, metric: val_loss, max_length: {batches: 5}, max_trials: 3}")),
        refusal("searcher.max_trials: not a key of the single searcher").c_str(), ConfigError);
    CHECK_THROWS_WITH_AS(
        parse(yaml("global_batch_size: 32",
                   "{name: random, metric: val_loss, max_length: {batches: 5}, max_trial: 3}")),
        refusal("searcher.max_trial: not a key of the random searcher (did you mean "
                "'max_trials'?)")
            .c_str(),
        ConfigError);
    CHECK_THROWS_WITH_AS(parse(yaml() + "resources: {slot_per_trial: 2}\n"),
                         refusal("resources.slot_per_trial: not a key of resources (did you mean "
                                 "'slots_per_trial'?)")
                             .c_str(),
                         ConfigError);
    CHECK_THROWS_WITH_AS(parse(yaml() + "optimizations: {average_training_metric: true}\n"),
                         refusal("optimizations.average_training_metric: not a key of "
                                 "optimizations (did you mean 'average_training_metrics'?)")
                             .c_str(),
                         ConfigError);
    CHECK_THROWS_WITH_AS(parse(yaml() + "reproducibility: {seed: 3}\n"),
                         refusal("reproducibility.seed: not a key of reproducibility").c_str(),
                         ConfigError);
    CHECK_THROWS_WITH_AS(parse(yaml() + "checkpoint_storage: {save_trial_bset: 3}\n"),
                         refusal("checkpoint_storage.save_trial_bset: not a key of a shared_fs "
                                 "checkpoint storage (did you mean 'save_trial_best'?)")
                             .c_str(),
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        parse(yaml("global_batch_size: 32, units: {type: int, minval: 1, maxval: 4, counts: 2}")),
        refusal("hyperparameters.units.counts: not a key of an int hyperparameter (did you mean "
                "'count'?)")
            .c_str(),
        ConfigError);
    CHECK_THROWS_WITH_AS(
        parse(yaml("global_batch_size: 32, lr: {type: doubel, minval: 1, maxval: 4}")),
        refusal("hyperparameters.lr.type: expected one of const, int, double, log or categorical "
                "but found doubel (did you mean 'double'?)")
            .c_str(),
        ConfigError);
  }

  TEST_CASE("parse_experiment_config refuses wrong types and out of range values") {
    const auto refuses = [](const std::string& text, const std::string& message) {
      INFO(text);
      CHECK_THROWS_WITH_AS(parse(text), refusal(message).c_str(), ConfigError);
    };
    refuses(yaml() + "scheduling_unit: '100'\n",
            "scheduling_unit: expected an int >= 1 but found \"100\"");
    refuses(yaml() + "scheduling_unit: 1.5\n",
            "scheduling_unit: expected an int >= 1 but found 1.5");
    refuses(yaml() + "max_restarts: -1\n", "max_restarts: expected an int >= 0 but found -1");
    refuses(yaml() + "records_per_epoch: [1]\n",
            "records_per_epoch: expected an int >= 0 but found [1]");
    refuses(yaml() + "perform_initial_validation: 3\n",
            "perform_initial_validation: expected true or false but found 3");
    refuses(yaml() + "checkpoint_policy: bset\n",
            "checkpoint_policy: expected one of best, all or none but found bset (did you mean "
            "'best'?)");
    refuses(yaml() + "checkpoint_storage: {type: s3, bucket: b}\n",
            "checkpoint_storage.type: expected shared_fs (the one storage on one machine) but "
            "found s3");
    refuses(yaml() + "checkpoint_storage: {save_trial_latest: -2}\n",
            "checkpoint_storage.save_trial_latest: expected an int >= 0 but found -2");
    refuses(yaml() + "checkpoint_storage: {host_path: 5}\n",
            "checkpoint_storage.host_path: expected a string but found 5");
    refuses(yaml() + "reproducibility: {experiment_seed: 2147483648}\n",
            "reproducibility.experiment_seed: expected an int in [0, 2147483647] but found "
            "2147483648");
    refuses(yaml() + "resources: {slots_per_trial: 0}\n",
            "resources.slots_per_trial: expected an int >= 1 but found 0");
    refuses(yaml("global_batch_size: 2") + "resources: {slots_per_trial: 4}\n",
            "hyperparameters.global_batch_size: expected at least resources.slots_per_trial (4) "
            "but found 2");
    refuses(yaml() + "optimizations: {aggregation_frequency: 0}\n",
            "optimizations.aggregation_frequency: expected an int >= 1 but found 0");
    refuses(yaml() + "labels: mlp\n", "labels: expected a list of strings but found mlp");
    refuses(yaml() + "labels: [a, 1]\n", "labels[1]: expected a string but found 1");
    refuses(yaml() + "description: [a]\n", "description: expected a string but found [a]");
    refuses(yaml() + "data: 3\n", "data: expected a mapping but found 3");
    refuses(yaml() + "min_validation_period: 500\n",
            "min_validation_period: expected exactly one of batches, records or epochs but "
            "found 500");
    refuses(yaml() + "min_checkpoint_period: {batches: -1}\n",
            "min_checkpoint_period.batches: expected an int >= 0 but found -1");
    // Searchers.
    refuses(yaml("global_batch_size: 32", "{name: pbt, metric: val_loss}"),
            "searcher.name: expected one of single, grid, random or adaptive_asha but found pbt");
    refuses(yaml("global_batch_size: 32", "{name: randm, metric: val_loss}"),
            "searcher.name: expected one of single, grid, random or adaptive_asha but found "
            "randm (did you mean 'random'?)");
    refuses(yaml("global_batch_size: 32", "{metric: val_loss}"),
            "searcher.name: expected one of single, grid, random or adaptive_asha but it is "
            "missing");
    refuses(yaml("global_batch_size: 32", "{name: single, max_length: {batches: 1}}"),
            "searcher.metric: expected the validation metric's name but it is missing");
    refuses(yaml("global_batch_size: 32", "{name: single, metric: val_loss}"),
            "searcher.max_length: expected a length ({batches: N}, {records: N} or {epochs: N}) "
            "but it is missing");
    refuses(
        yaml("global_batch_size: 32", "{name: single, metric: val_loss, max_length: {batches: 0}}"),
        "searcher.max_length.batches: expected an int >= 1 but found 0");
    refuses(yaml("global_batch_size: 32",
                 "{name: single, metric: val_loss, max_length: {batches: 1}, smaller_is_better: "
                 "maybe}"),
            "searcher.smaller_is_better: expected true or false but found maybe");
    refuses(
        yaml("global_batch_size: 32", "{name: random, metric: val_loss, max_length: {batches: 1}}"),
        "searcher.max_trials: expected an int >= 1 but it is missing");
    refuses(yaml("global_batch_size: 32",
                 "{name: adaptive_asha, metric: val_loss, max_length: {batches: 1}, max_trials: "
                 "0}"),
            "searcher.max_trials: expected an int >= 1 but found 0");
    refuses(yaml("global_batch_size: 32",
                 "{name: adaptive_asha, metric: val_loss, max_length: {batches: 1}, max_trials: "
                 "2, mode: fast}"),
            "searcher.mode: expected one of aggressive, standard or conservative but found fast");
    refuses(yaml("global_batch_size: 32",
                 "{name: adaptive_asha, metric: val_loss, max_length: {batches: 1}, max_trials: "
                 "2, divisor: 1}"),
            "searcher.divisor: expected a number > 1 but found 1");
    refuses(yaml("global_batch_size: 32",
                 "{name: adaptive_asha, metric: val_loss, max_length: {batches: 1}, max_trials: "
                 "2, bracket_rungs: [2, 0]}"),
            "searcher.bracket_rungs[1]: expected an int >= 1 but found 0");
    refuses(yaml("global_batch_size: 32", "[single]"),
            "searcher: expected a mapping (name, metric, max_length) but found [single]");
  }

  TEST_CASE("parse_experiment_config refuses bad hyperparameters") {
    const auto refuses = [](const std::string& hparams, const std::string& message) {
      INFO(hparams);
      CHECK_THROWS_WITH_AS(parse(yaml(hparams)), refusal(message).c_str(), ConfigError);
    };
    refuses("global_batch_size: 32, units: {type: int, minval: 8, maxval: 8}",
            "hyperparameters.units: expected minval < maxval but found minval 8 and maxval 8");
    refuses("global_batch_size: 32, lr: {type: double, minval: 0.5, maxval: 0.1}",
            "hyperparameters.lr: expected minval < maxval but found minval 0.5 and maxval 0.1");
    refuses("global_batch_size: 32, units: {type: int, minval: 1.5, maxval: 8}",
            "hyperparameters.units.minval: expected an int but found 1.5");
    refuses("global_batch_size: 32, units: {type: int, minval: 1}",
            "hyperparameters.units.maxval: expected an int but it is missing");
    refuses("global_batch_size: 32, lr: {type: log, minval: -3, maxval: -1, base: 0}",
            "hyperparameters.lr.base: expected a number > 0 but found 0");
    refuses("global_batch_size: 32, lr: {type: log, minval: -3, maxval: x}",
            "hyperparameters.lr.maxval: expected a number but found x");
    refuses("global_batch_size: 32, lr: {type: double, minval: 0, maxval: 1, count: 0}",
            "hyperparameters.lr.count: expected an int >= 1 but found 0");
    refuses("global_batch_size: 32, act: {type: categorical, vals: []}",
            "hyperparameters.act.vals: expected a non-empty list of values but found []");
    refuses("global_batch_size: 32, act: {type: categorical}",
            "hyperparameters.act.vals: expected a non-empty list of values but it is missing");
    refuses("global_batch_size: 32, c: {type: const}",
            "hyperparameters.c.val: expected the constant's value but it is missing");
    refuses("global_batch_size: 32, c: {type: const, val: 1, vals: [1]}",
            "hyperparameters.c.vals: not a key of a const hyperparameter (did you mean 'val'?)");
    refuses("global_batch_size: 32, opt: {a.b: 1}",
            "hyperparameters.opt.a.b: expected a hyperparameter name without '.' but found 'a.b'");
    refuses("global_batch_size: 32, '': 1",
            "hyperparameters: expected non-empty hyperparameter names but found ''");
    refuses("global_batch_size: 32, g: {}",
            "hyperparameters.g: expected a hyperparameter or a group of them but found {}");
    refuses("global_batch_size: 32, opt: {lr: {type: int, minval: 2, maxval: 1}}",
            "hyperparameters.opt.lr: expected minval < maxval but found minval 2 and maxval 1");
    const std::string gbs =
        "hyperparameters.global_batch_size: expected an int >= 1 (a const, an int range or a "
        "categorical of ints; Determined's Keras trials need it) but ";
    refuses("batch_size: 32", gbs + "it is missing");
    refuses("global_batch_sise: 32",
            gbs + "it is missing (is 'global_batch_sise' a misspelling of it?)");
    refuses("global_batch_size: 0", gbs + "found 0");
    refuses("global_batch_size: '32'", gbs + "found \"32\"");
    refuses("global_batch_size: 32.5", gbs + "found 32.5");
    refuses("global_batch_size: {type: double, minval: 1, maxval: 2}",
            gbs + "found {maxval: 2, minval: 1, type: double}");
    refuses("global_batch_size: {type: int, minval: 0, maxval: 2}",
            gbs + "found {maxval: 2, minval: 0, type: int}");
    refuses("global_batch_size: {type: categorical, vals: [16, 0.5]}",
            gbs + "found {type: categorical, vals: [16, 0.5]}");
  }

  TEST_CASE("parse_experiment_config needs records_per_epoch for lengths in epochs") {
    CHECK_THROWS_WITH_AS(
        parse(yaml("global_batch_size: 32",
                   "{name: single, metric: val_loss, max_length: {epochs: 2}}")),
        refusal("searcher.max_length: expected a length in batches or records, or "
                "records_per_epoch set, but found {epochs: 2} with records_per_epoch unset")
            .c_str(),
        ConfigError);
    CHECK_THROWS_WITH_AS(
        parse(yaml() + "min_validation_period: {epochs: 1}\n"),
        refusal("min_validation_period: expected a length in batches or records, or "
                "records_per_epoch set, but found {epochs: 1} with records_per_epoch unset")
            .c_str(),
        ConfigError);
    CHECK_NOTHROW(parse(yaml() + "min_validation_period: {epochs: 1}\nrecords_per_epoch: 100\n"));
  }

  TEST_CASE("parse_experiment_config refuses text that is not a config") {
    CHECK_THROWS_WITH_AS(parse("entrypoint: [unclosed\n"),
                         doctest::Contains("experiment config 'c.yaml': line 2, column 1: expected "
                                           "YAML but found an error: "),
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        parse(yaml() + "scheduling_unit: 1\nscheduling_unit: 2\n"),
        refusal("scheduling_unit: expected each key once but found it twice").c_str(), ConfigError);
    CHECK_THROWS_WITH_AS(
        parse(""), refusal("the top level: expected a mapping but found an empty document").c_str(),
        ConfigError);
    CHECK_THROWS_WITH_AS(parse("- a\n- b\n"),
                         refusal("the top level: expected a mapping but found [a, b]").c_str(),
                         ConfigError);
    CHECK_THROWS_WITH_AS(parse("hyperparameters: {global_batch_size: 1}\nsearcher: " + single),
                         refusal("entrypoint: expected the registered trial's name "
                                 "(model_def:Trial) but it is missing")
                             .c_str(),
                         ConfigError);
    CHECK_THROWS_WITH_AS(parse("entrypoint: t\nsearcher: " + single),
                         refusal("hyperparameters: expected a mapping of hyperparameters but it is "
                                 "missing")
                             .c_str(),
                         ConfigError);
    CHECK_THROWS_WITH_AS(parse("entrypoint: t\nhyperparameters: {global_batch_size: 1}\n"),
                         refusal("searcher: expected a mapping (name, metric, max_length) but it "
                                 "is missing")
                             .c_str(),
                         ConfigError);
    CHECK_THROWS_WITH_AS(experiment_config_from_json(json{{"entrypoint", 3}}, "e.json"),
                         "experiment config 'e.json': entrypoint: expected a string but found 3",
                         ConfigError);
  }
}

TEST_SUITE("trial") {
  TEST_CASE("parse_experiment_config refuses text that is not UTF-8, naming the key and the byte") {
    // Two bytes found by fuzzing: a lone continuation byte, then '@'. Before, the refusal's own
    // message threw nlohmann::json::type_error dumping the text.
    CHECK_THROWS_WITH_AS(parse("\x91\x40"),
                         refusal("the document: expected UTF-8 text but found the byte 0x91 at "
                                 "byte offset 0 of the text '\\x91@' (which starts at line 1, "
                                 "column 1)")
                             .c_str(),
                         ConfigError);
    CHECK_THROWS_WITH_AS(parse(yaml() + "description: caf\xE9 au lait\n"),
                         doctest::Contains(refusal("description: expected UTF-8 text but found "
                                                   "the byte 0xE9 at byte offset 3 of the text "
                                                   "'caf\\xE9 au lait' (which starts at line 4,")
                                               .c_str()),
                         ConfigError);
    CHECK_THROWS_WITH_AS(parse(yaml("global_batch_size: 32, \"lr\xC0\": 0.1")),
                         doctest::Contains(refusal("a key of hyperparameters: expected UTF-8 "
                                                   "text but found the byte 0xC0 at byte offset "
                                                   "2 of the text 'lr\\xC0'")
                                               .c_str()),
                         ConfigError);
    CHECK_THROWS_WITH_AS(parse(yaml() + "labels: [a, \"\xED\xA0\x80\"]\n"),  // a surrogate
                         doctest::Contains(refusal("labels[1]: expected UTF-8 text but found the "
                                                   "byte 0xED at byte offset 0")
                                               .c_str()),
                         ConfigError);
    // Outside any key or value: named by its place in the document.
    CHECK_THROWS_WITH_AS(parse(yaml() + "# caf\xE9\n"),
                         refusal("line 4, column 6: expected UTF-8 text but found the byte 0xE9 "
                                 "at byte offset " +
                                 std::to_string(yaml().size() + 5) + " of the document")
                             .c_str(),
                         ConfigError);
    // UTF-8 text of any script is fine, and so is its refusal's message.
    CHECK(parse(yaml() + "description: café ☕ 𝄞\n").description == "café ☕ 𝄞");
    CHECK_THROWS_WITH_AS(parse(yaml() + "colour: café\n"),
                         refusal("colour: not a key of an experiment config").c_str(), ConfigError);
  }

  TEST_CASE("experiment_config_from_json refuses strings that are not UTF-8") {
    json config = json::parse(R"({"entrypoint": "model_def:Trial",
      "hyperparameters": {"global_batch_size": 32},
      "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 100}}})");
    config["description"] = "\xFF";
    CHECK_THROWS_WITH_AS(experiment_config_from_json(config, "c.json"),
                         doctest::Contains("experiment config 'c.json': expected UTF-8 text but "
                                           "found the byte 0xFF at offset 0 of /description"),
                         ConfigError);
  }
}

/// \file
/// The operations a searcher asks of an experiment (Determined's `master/pkg/searcher/
/// operations.go@0.15.6`): create a trial, train it until a length and validate, close it, shut
/// the experiment down.
#pragma once

#include "loadstar/config.hpp"

#include <cstdint>
#include <string>
#include <type_traits>
#include <variant>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"
#include "loadstar/trial/workload_sequencer.hpp"

namespace loadstar::trial {

/// Start a trial with these hyperparameter values and seed. Request ids count from 1 in the
/// order the searcher asks for trials.
struct Create {
  std::uint64_t request_id = 0;
  nlohmann::json hparams = nlohmann::json::object();
  std::uint32_t trial_seed = 0;

  friend bool operator==(const Create&, const Create&) = default;
};

/// Train the trial until the cumulative `length` (in the unit of `searcher.max_length`), then
/// validate and report the searcher metric with `Searcher::validation_completed`.
struct ValidateAfter {
  std::uint64_t request_id = 0;
  Length length;

  friend bool operator==(const ValidateAfter&, const ValidateAfter&) = default;
};

/// The trial gets no more operations: once the ones it has are done, it ends.
struct Close {
  std::uint64_t request_id = 0;

  friend bool operator==(const Close&, const Close&) = default;
};

/// The search is over; `failure` when every trial failed.
struct Shutdown {
  bool failure = false;

  friend bool operator==(const Shutdown&, const Shutdown&) = default;
};

using Operation = std::variant<Create, ValidateAfter, Close, Shutdown>;

/// `Create 1 seed 42 {"lr":0.1}`, `ValidateAfter 1 {"batches":100}`, `Close 1`, `Shutdown`
/// (`Shutdown failure`).
LOADSTAR_DECL std::string to_string(const Operation& operation);

/// An operation as JSON: `{"type": "create", "request_id": 1, "hparams": {...}, "trial_seed":
/// 42}`, `{"type": "validate_after", "request_id": 1, "length": {"batches": 100}}`,
/// `{"type": "close", "request_id": 1}`, `{"type": "shutdown", "failure": false}`.
LOADSTAR_DECL nlohmann::json operation_to_json(const Operation& operation);

/// Reads `operation_to_json`; `CheckpointError` naming what is wrong.
LOADSTAR_DECL Operation operation_from_json(const nlohmann::json& json);

}  // namespace loadstar::trial

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial {

std::string to_string(const Operation& operation) {
  return std::visit(
      [](const auto& op) -> std::string {
        using T = std::decay_t<decltype(op)>;
        if constexpr (std::is_same_v<T, Create>) {
          return "Create " + std::to_string(op.request_id) + " seed " +
                 std::to_string(op.trial_seed) + " " + op.hparams.dump();
        } else if constexpr (std::is_same_v<T, ValidateAfter>) {
          return "ValidateAfter " + std::to_string(op.request_id) + " " +
                 length_to_json(op.length).dump();
        } else if constexpr (std::is_same_v<T, Close>) {
          return "Close " + std::to_string(op.request_id);
        } else {
          return op.failure ? "Shutdown failure" : "Shutdown";
        }
      },
      operation);
}

nlohmann::json operation_to_json(const Operation& operation) {
  return std::visit(
      [](const auto& op) -> nlohmann::json {
        using T = std::decay_t<decltype(op)>;
        if constexpr (std::is_same_v<T, Create>) {
          return {{"type", "create"},
                  {"request_id", op.request_id},
                  {"hparams", op.hparams},
                  {"trial_seed", op.trial_seed}};
        } else if constexpr (std::is_same_v<T, ValidateAfter>) {
          return {{"type", "validate_after"},
                  {"request_id", op.request_id},
                  {"length", length_to_json(op.length)}};
        } else if constexpr (std::is_same_v<T, Close>) {
          return {{"type", "close"}, {"request_id", op.request_id}};
        } else {
          return {{"type", "shutdown"}, {"failure", op.failure}};
        }
      },
      operation);
}

Operation operation_from_json(const nlohmann::json& json) {
  const loadstar::detail::StateReader read("searcher operation", json);
  const auto type = read.get<std::string>("type");
  if (type == "create") {
    const auto seed = read.get<std::uint64_t>("trial_seed");
    if (seed > 0xffffffffULL) {
      throw CheckpointError("searcher operation state: trial_seed " + std::to_string(seed) +
                            " does not fit 32 bits");
    }
    return Create{read.get<std::uint64_t>("request_id"), read.get<nlohmann::json>("hparams"),
                  static_cast<std::uint32_t>(seed)};
  }
  if (type == "validate_after") {
    return ValidateAfter{
        read.get<std::uint64_t>("request_id"),
        length_from_json(read.get<nlohmann::json>("length"), "searcher operation state: length")};
  }
  if (type == "close") return Close{read.get<std::uint64_t>("request_id")};
  if (type == "shutdown") return Shutdown{read.get<bool>("failure")};
  throw CheckpointError(
      "searcher operation state: expected a type of create, validate_after, close or shutdown "
      "but found '" +
      type + "'");
}

}  // namespace loadstar::trial
#endif

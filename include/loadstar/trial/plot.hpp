/// \file
/// Training and validation curves of an experiment's trials, read from their `metrics.jsonl`
/// and drawn by gnuplot as an SVG or PNG file (what `experiment describe --plot` writes).
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/callbacks/detail/files.hpp"
#include "loadstar/trial/detail/experiment_process.hpp"

namespace loadstar::trial {

/// One line of a trial's `metrics.jsonl`: a training workload's averaged metrics or a
/// validation's metrics, at `batches` batches trained.
struct MetricsRecord {
  std::string kind;  ///< `training` or `validation`
  std::uint64_t trial_id = 0;
  std::uint64_t step_id = 0;
  std::uint64_t batches = 0;
  std::uint64_t records = 0;
  double epochs = 0;
  std::map<std::string, double> metrics;  ///< non-numeric values are left out
};

/// The records of a trial's `metrics.jsonl`, in file order. A last line without its newline (a
/// process killed while appending it) is ignored; any other malformed line is a `FormatError`
/// naming the file and the line. Throws `IoError` when the file cannot be read.
/// \code
/// for (const auto& record : read_metrics(dir / "trials/1/metrics.jsonl"))
///   if (record.kind == "validation") std::printf("%g\n", record.metrics.at("val_loss"));
/// \endcode
LOADSTAR_DECL std::vector<MetricsRecord> read_metrics(const std::filesystem::path& file);

/// The curves of one trial.
struct TrialCurves {
  std::uint64_t trial_id = 0;
  std::vector<MetricsRecord> records;
};

/// How `plot_metrics` draws.
struct PlotOptions {
  /// The title above the panels.
  std::string title = {};
  /// The gnuplot program: a name looked up on `PATH` or a path. Empty: `$LOADSTAR_GNUPLOT`, else
  /// `gnuplot`.
  std::string gnuplot = {};
};

namespace detail {

/// `text` as a single-quoted gnuplot string.
LOADSTAR_DECL std::string gnuplot_quote(std::string_view text);

/// A metric's panel: `val_loss` and `loss` share the panel `loss`.
LOADSTAR_DECL std::string panel_name(std::string_view metric);

/// A number as gnuplot reads it; non-finite values become `NaN` (a gap in the line).
LOADSTAR_DECL std::string gnuplot_number(double value);

}  // namespace detail

/// The gnuplot script that draws `trials` into `output` with `terminal` (`svg` or `pngcairo`):
/// one panel per metric (`loss` and `val_loss` together), batches on the x axis, one colour per
/// trial, training solid and validation dashed with points. The data travel inside the script
/// (gnuplot datablocks), so the script is all gnuplot needs.
LOADSTAR_DECL std::string gnuplot_script(const std::vector<TrialCurves>& trials,
                                         const std::filesystem::path& output,
                                         const std::string& terminal, const std::string& title);

/// Draws the training and validation curves of `trials` into `output` (`.svg` or `.png`, by
/// its extension) with gnuplot, writing a temporary file beside it that is renamed into place.
/// Throws `ConfigError` for another extension and `IoError` when gnuplot is missing or fails.
/// \code
/// plot_metrics({{1, read_metrics(dir / "trials/1/metrics.jsonl")}}, "curves.svg");
/// \endcode
LOADSTAR_DECL void plot_metrics(const std::vector<TrialCurves>& trials,
                                const std::filesystem::path& output,
                                const PlotOptions& options = {});

}  // namespace loadstar::trial

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial {

std::vector<MetricsRecord> read_metrics(const std::filesystem::path& file) {
  const std::string text = keras::detail::read_bytes(file);
  std::vector<MetricsRecord> records;
  std::size_t begin = 0;
  std::size_t line_number = 0;
  while (begin < text.size()) {
    const std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) break;  // a partial last line
    ++line_number;
    const std::string_view line(text.data() + begin, end - begin);
    begin = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const auto where = [&] {
      return "metrics '" + file.string() + "': line " + std::to_string(line_number) + ": ";
    };
    nlohmann::json object;
    try {
      object = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& error) {
      throw FormatError(where() + "expected a JSON object but found text that does not parse (" +
                        error.what() + ")");
    }
    if (!object.is_object() || !object.contains("kind") || !object["kind"].is_string() ||
        !object.contains("batches") || !object["batches"].is_number_unsigned() ||
        !object.contains("metrics") || !object["metrics"].is_object()) {
      throw FormatError(where() +
                        "expected an object with a string 'kind', an unsigned 'batches' and an "
                        "object 'metrics' but found " +
                        loadstar::detail::shown(object).substr(0, 200));
    }
    MetricsRecord record;
    record.kind = object["kind"].get<std::string>();
    record.batches = object["batches"].get<std::uint64_t>();
    if (object.contains("trial_id") && object["trial_id"].is_number_unsigned()) {
      record.trial_id = object["trial_id"].get<std::uint64_t>();
    }
    if (object.contains("step_id") && object["step_id"].is_number_unsigned()) {
      record.step_id = object["step_id"].get<std::uint64_t>();
    }
    if (object.contains("records") && object["records"].is_number_unsigned()) {
      record.records = object["records"].get<std::uint64_t>();
    }
    if (object.contains("epochs") && object["epochs"].is_number()) {
      record.epochs = object["epochs"].get<double>();
    }
    for (const auto& [name, value] : object["metrics"].items()) {
      if (value.is_number()) record.metrics[name] = value.get<double>();
    }
    records.push_back(std::move(record));
  }
  return records;
}

std::string gnuplot_script(const std::vector<TrialCurves>& trials,
                           const std::filesystem::path& output, const std::string& terminal,
                           const std::string& title) {
  std::set<std::string> panels;
  for (const auto& trial : trials) {
    for (const auto& record : trial.records) {
      for (const auto& [name, value] : record.metrics)
        panels.insert(detail::panel_name(name));
    }
  }
  const std::size_t rows = panels.empty() ? 1 : panels.size();
  std::ostringstream script;
  script << "set terminal " << terminal << " size 900," << 320 * rows
         << " noenhanced background rgb 'white' font 'sans,10'\n";
  script << "set output " << detail::gnuplot_quote(output.string()) << "\n";
  std::ostringstream plots;
  std::size_t block = 0;
  script << "set multiplot layout " << rows << ",1 title " << detail::gnuplot_quote(title) << "\n";
  script << "set grid\nset xlabel 'batches'\n";
  // Beyond a few trials a legend would outgrow the panels: colours tell trials apart, solid
  // lines are training and dashed ones validation.
  script << (trials.size() > 8 ? "unset key\n" : "set key outside right top\n");
  if (panels.empty()) {
    script << "set label 'no metrics yet' at graph 0.5,0.5 center\n"
           << "plot [0:1][0:1] NaN notitle\n";
  }
  for (const auto& panel : panels) {
    std::vector<std::string> clauses;
    std::size_t colour = 0;
    for (const auto& trial : trials) {
      ++colour;
      for (const std::string kind : {"training", "validation"}) {
        std::map<std::string, std::vector<std::pair<std::uint64_t, double>>> series;
        for (const auto& record : trial.records) {
          if (record.kind != kind) continue;
          for (const auto& [name, value] : record.metrics) {
            if (detail::panel_name(name) == panel) series[name].emplace_back(record.batches, value);
          }
        }
        for (const auto& [name, points] : series) {
          const std::string data = "$d" + std::to_string(block++);
          script << data << " << EOD\n";
          for (const auto& [x, y] : points)
            script << x << ' ' << detail::gnuplot_number(y) << '\n';
          script << "EOD\n";
          const std::string label = "trial " + std::to_string(trial.trial_id) + " " + name;
          clauses.push_back(data + " using 1:2 with " +
                            (kind == "training" ? std::string("lines lw 1.5")
                                                : std::string("linespoints dt 2 pt 7 ps 0.6")) +
                            " lc " + std::to_string(colour) + " title " +
                            detail::gnuplot_quote(label));
        }
      }
    }
    plots << "set ylabel " << detail::gnuplot_quote(panel) << "\n";
    plots << "plot ";
    for (std::size_t i = 0; i < clauses.size(); ++i)
      plots << (i > 0 ? ", " : "") << clauses[i];
    plots << "\n";
  }
  script << plots.str() << "unset multiplot\nset output\n";
  return script.str();
}

void plot_metrics(const std::vector<TrialCurves>& trials, const std::filesystem::path& output,
                  const PlotOptions& options) {
  const std::string extension = output.extension().string();
  std::string terminal;
  if (extension == ".svg")
    terminal = "svg";
  else if (extension == ".png")
    terminal = "pngcairo";
  else {
    throw ConfigError("plot '" + output.string() +
                      "': expected a file name ending in .svg or .png but found '" + extension +
                      "'");
  }
  std::string program = options.gnuplot;
  if (program.empty()) {
    const char* from_environment = std::getenv("LOADSTAR_GNUPLOT");
    program =
        from_environment != nullptr && *from_environment != '\0' ? from_environment : "gnuplot";
  }
  const std::filesystem::path found = detail::find_program(program);
  if (found.empty()) {
    throw IoError("plot '" + output.string() + "': the plotting program '" + program +
                  "' was not found on PATH (install gnuplot, e.g. Debian's gnuplot-nox, or "
                  "name it in LOADSTAR_GNUPLOT)");
  }
  std::filesystem::path temporary = output;
  temporary += ".tmp";
  const std::string script = gnuplot_script(trials, temporary, terminal, options.title);
  const detail::ProgramResult result = detail::run_program({found.string()}, script);
  std::error_code ignored;
  const bool written = std::filesystem::exists(temporary, ignored) &&
                       std::filesystem::file_size(temporary, ignored) > 0;
  if (!WIFEXITED(result.status) || WEXITSTATUS(result.status) != 0 || !written) {
    std::filesystem::remove(temporary, ignored);
    std::string said = result.output.substr(0, 500);
    while (!said.empty() && (said.back() == '\n' || said.back() == ' '))
      said.pop_back();
    throw IoError("plot '" + output.string() + "': '" + found.string() + "' ended with " +
                  detail::describe_status(result.status) +
                  (said.empty() ? std::string(" and wrote nothing") : ": " + said));
  }
  keras::detail::rename_into_place(temporary, output);
}

}  // namespace loadstar::trial
namespace loadstar::trial::detail {

std::string gnuplot_quote(std::string_view text) {
  std::string quoted = "'";
  for (const char c : text) {
    if (c == '\'')
      quoted += "''";
    else if (c == '\n')
      quoted += ' ';
    else
      quoted += c;
  }
  return quoted + "'";
}

std::string panel_name(std::string_view metric) {
  if (metric.starts_with("val_")) metric.remove_prefix(4);
  return std::string(metric);
}

std::string gnuplot_number(double value) {
  if (!std::isfinite(value)) return "NaN";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.10g", value);
  return buffer;
}

}  // namespace loadstar::trial::detail
#endif

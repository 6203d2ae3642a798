// The `loadstar` command-line tool: inspect, run and convert Keras model files.
//
//   loadstar summary MODEL                      Keras's model.summary() table
//   loadstar predict MODEL --input FILE ...     inference on .npy or HDF5 inputs
//   loadstar convert MODEL OUT                  .h5 <-> .keras
//   loadstar weights MODEL                      every weight with its statistics
//
// Errors are one line on stderr, `loadstar: error: ...`, with exit status 2 for bad usage and 1
// for everything that goes wrong at run time (missing or malformed files, shape mismatches).

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#include <CLI/CLI.hpp>
#pragma GCC diagnostic pop

#include <nlohmann/json.hpp>

#include <loadstar/data/hdf5.hpp>
#include <loadstar/data/npy.hpp>
#include <loadstar/error.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/keras/saving/saving.hpp>
#include <loadstar/tensor.hpp>

#ifndef LOADSTAR_CLI_VERSION
#define LOADSTAR_CLI_VERSION "unknown"
#endif

namespace {

namespace fs = std::filesystem;
namespace keras = loadstar::keras;
using loadstar::Shape;
using loadstar::Tensor;

/// A mistake in the command line found after parsing (exit status 2, as CLI11's own).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr int exit_usage = 2;
constexpr int exit_runtime = 1;

/// The extension of `path` in lower case (`".h5"`).
std::string extension(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

bool is_hdf5_name(const fs::path& path) {
  const std::string ext = extension(path);
  return ext == ".h5" || ext == ".hdf5";
}

/// The first bytes of `path` (fewer for a shorter file); throws `IoError` when it cannot be read.
std::string leading_bytes(const fs::path& path, std::size_t count, const std::string& what) {
  std::error_code error;
  if (fs::is_directory(path, error)) {
    throw loadstar::IoError(what + " '" + path.string() + "': cannot open (is a directory)");
  }
  errno = 0;
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    throw loadstar::IoError(what + " '" + path.string() + "': cannot open (" +
                            (errno != 0 ? std::strerror(errno) : "unknown error") + ")");
  }
  std::string bytes(count, '\0');
  bytes.resize(std::fread(bytes.data(), 1, count, file));
  std::fclose(file);
  return bytes;
}

constexpr std::string_view hdf5_signature{"\x89HDF\r\n\x1a\n", 8};
constexpr std::string_view npy_signature{"\x93NUMPY", 6};

/// Whether `path` holds an architecture as JSON (`model.to_json()`) rather than a model file:
/// by its `.json` extension, or by text starting with `{`.
bool is_json_model(const fs::path& path) {
  if (extension(path) == ".json") return true;
  const std::string head = leading_bytes(path, 64, "model file");
  const auto first = head.find_first_not_of(" \t\r\n");
  return first != std::string::npos && head[first] == '{';
}

/// The model a `.json` architecture, an `.h5` file or a `.keras` archive holds.
std::unique_ptr<keras::Model> read_model(const fs::path& path, bool compile) {
  if (is_json_model(path)) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw loadstar::IoError("model file '" + path.string() + "': cannot open");
    std::ostringstream text;
    text << in.rdbuf();
    // model_from_json names neither the file nor the key path's origin: prefix the file.
    const std::string where = "model file '" + path.string() + "': ";
    try {
      return keras::model_from_json(text.str());
    } catch (const keras::UnsupportedLayersError& e) {
      throw keras::UnsupportedLayersError(where + e.where(), e.layers());
    } catch (const loadstar::FormatError& e) {
      throw loadstar::FormatError(where + e.what());
    } catch (const loadstar::ConfigError& e) {
      throw loadstar::ConfigError(where + e.what());
    } catch (const loadstar::ShapeError& e) {
      throw loadstar::ShapeError(where + e.what());
    }
  }
  keras::LoadOptions options;
  options.compile = compile;
  return keras::load_model(path, {}, options);
}

/// The model of `path`, with the weights of `weights` (a `save_weights` file) when not empty.
std::unique_ptr<keras::Model> open_model(const fs::path& path, const std::string& weights,
                                         bool compile) {
  auto model = read_model(path, compile);
  if (!weights.empty()) {
    keras::load_weights(*model, weights);
  }
  return model;
}

/// `value` in the shortest text that reads back as the same float.
std::string shortest(float value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char text[32];
  const auto result = std::to_chars(text, text + sizeof text, value);
  return std::string(text, result.ptr);
}

/// `value` with 6 significant digits, as NumPy prints statistics.
std::string six_digits(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

// --- summary ---------------------------------------------------------------------------------

struct SummaryArgs {
  std::string model;
  std::string weights;
};

int run_summary(const SummaryArgs& args) {
  const auto model = open_model(args.model, args.weights, false);
  model->summary(std::cout);
  return 0;
}

// --- weights ---------------------------------------------------------------------------------

struct WeightsArgs {
  std::string model;
  std::string weights;
  bool json = false;
};

/// Statistics of one weight: min, max, mean and population standard deviation of its finite
/// values, and the counts of NaN and infinite ones.
struct WeightStats {
  std::size_t count = 0;
  std::size_t finite = 0;
  std::size_t nan = 0;
  std::size_t inf = 0;
  double min = 0;
  double max = 0;
  double mean = 0;
  double std = 0;
};

WeightStats statistics(const Tensor<float>& value) {
  WeightStats s;
  s.count = value.size();
  double sum = 0;
  double lowest = std::numeric_limits<double>::infinity();
  double highest = -std::numeric_limits<double>::infinity();
  const float* data = value.data();
  for (std::size_t i = 0; i < s.count; ++i) {
    const double v = data[i];
    if (std::isnan(v)) {
      ++s.nan;
    } else if (std::isinf(v)) {
      ++s.inf;
    } else {
      ++s.finite;
      sum += v;
      lowest = std::min(lowest, v);
      highest = std::max(highest, v);
    }
  }
  if (s.finite == 0) return s;
  s.min = lowest;
  s.max = highest;
  s.mean = sum / static_cast<double>(s.finite);
  // Two passes: the sum of squared deviations keeps its precision for values far from zero.
  double squares = 0;
  for (std::size_t i = 0; i < s.count; ++i) {
    const double v = data[i];
    if (std::isfinite(v)) squares += (v - s.mean) * (v - s.mean);
  }
  s.std = std::sqrt(squares / static_cast<double>(s.finite));
  return s;
}

int run_weights(const WeightsArgs& args) {
  const auto model = open_model(args.model, args.weights, false);
  struct Row {
    std::string layer, name;
    Shape shape;
    bool trainable;
    WeightStats stats;
  };
  std::vector<Row> rows;
  std::size_t parameters = 0;
  for (const auto& layer : model->layers()) {
    for (const auto& w : layer->weights()) {
      rows.push_back({layer->name(), w.name, w.value.shape(), w.trainable, statistics(w.value)});
      parameters += w.value.size();
    }
  }
  if (args.json) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& r : rows) {
      const auto number = [&](double v) -> nlohmann::ordered_json {
        if (r.stats.finite == 0) return nullptr;
        return v;
      };
      const std::vector<std::size_t> dims(r.shape.begin(), r.shape.end());
      out.push_back({{"layer", r.layer},
                     {"weight", r.name},
                     {"name", r.layer + "/" + r.name + ":0"},
                     {"shape", dims},
                     {"dtype", "float32"},
                     {"trainable", r.trainable},
                     {"count", r.stats.count},
                     {"min", number(r.stats.min)},
                     {"max", number(r.stats.max)},
                     {"mean", number(r.stats.mean)},
                     {"std", number(r.stats.std)},
                     {"nan", r.stats.nan},
                     {"inf", r.stats.inf}});
    }
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::vector<std::vector<std::string>> table;
  table.push_back(
      {"Weight", "Shape", "DType", "Trainable", "Min", "Max", "Mean", "Std", "NaN", "Inf"});
  for (const auto& r : rows) {
    const bool any = r.stats.finite != 0;
    table.push_back({r.layer + "/" + r.name + ":0", r.shape.str(), "float32",
                     r.trainable ? "yes" : "no", any ? six_digits(r.stats.min) : "-",
                     any ? six_digits(r.stats.max) : "-", any ? six_digits(r.stats.mean) : "-",
                     any ? six_digits(r.stats.std) : "-", std::to_string(r.stats.nan),
                     std::to_string(r.stats.inf)});
  }
  std::vector<std::size_t> widths(table.front().size(), 0);
  for (const auto& row : table) {
    for (std::size_t c = 0; c < row.size(); ++c)
      widths[c] = std::max(widths[c], row[c].size());
  }
  std::cout << "Model: \"" << model->name() << "\"\n";
  for (std::size_t k = 0; k < table.size(); ++k) {
    std::string line;
    for (std::size_t c = 0; c < table[k].size(); ++c) {
      const std::string& cell = table[k][c];
      // Text columns are left-aligned, numbers right-aligned.
      const std::string pad(widths[c] - cell.size(), ' ');
      line += c < 4 ? cell + pad : pad + cell;
      if (c + 1 < table[k].size()) line += "  ";
    }
    while (!line.empty() && line.back() == ' ')
      line.pop_back();
    std::cout << line << "\n";
    if (k == 0) std::cout << std::string(line.size(), '=') << "\n";
  }
  std::cout << "Total: " << rows.size() << " weights, " << parameters << " parameters\n";
  return 0;
}

// --- predict ---------------------------------------------------------------------------------

struct PredictArgs {
  std::string model;
  std::string weights;
  std::vector<std::string> inputs;
  std::vector<std::string> datasets;
  std::string output;
  std::vector<std::string> output_datasets;
  std::size_t batch_size = 32;
};

/// Dataset `name` of the HDF5 file `file` as floats; integer datasets (token ids, labels) are
/// read as int64 and converted.
Tensor<float> read_hdf5_as_float(const fs::path& file, const std::string& name) {
  try {
    return loadstar::read_hdf5<float>(file, name);
  } catch (const loadstar::ShapeError& not_float) {
    Tensor<std::int64_t> integers;
    try {
      integers = loadstar::read_hdf5<std::int64_t>(file, name);
    } catch (const loadstar::Error&) {
      throw not_float;
    }
    Tensor<float> out = Tensor<float>::uninitialized(integers.shape());
    for (std::size_t i = 0; i < integers.size(); ++i)
      out.data()[i] = static_cast<float>(integers.data()[i]);
    return out;
  }
}

/// The arrays named by `--input` and `--dataset`, one per model input.
std::vector<Tensor<float>> read_inputs(const PredictArgs& args) {
  std::vector<bool> hdf5(args.inputs.size());
  std::size_t hdf5_files = 0;
  for (std::size_t i = 0; i < args.inputs.size(); ++i) {
    const std::string head = leading_bytes(args.inputs[i], 8, "input file");
    if (head.starts_with(npy_signature)) continue;
    if (head.starts_with(hdf5_signature)) {
      hdf5[i] = true;
      ++hdf5_files;
      continue;
    }
    throw loadstar::FormatError("input file '" + args.inputs[i] +
                                "': expected a NumPy .npy file or an HDF5 file but found "
                                "neither signature");
  }
  if (hdf5_files == 0 && !args.datasets.empty()) {
    throw UsageError("--dataset names an HDF5 dataset but no --input is an HDF5 file");
  }
  std::vector<Tensor<float>> arrays;
  if (args.inputs.size() == 1 && hdf5_files == 1) {
    if (args.datasets.empty()) {
      throw UsageError("--dataset is required when --input is an HDF5 file");
    }
    for (const auto& name : args.datasets)
      arrays.push_back(read_hdf5_as_float(args.inputs[0], name));
    return arrays;
  }
  if (args.datasets.size() != hdf5_files) {
    throw UsageError(
        "each HDF5 --input needs one --dataset, in order: " + std::to_string(hdf5_files) +
        " HDF5 inputs but " + std::to_string(args.datasets.size()) + " --dataset");
  }
  std::size_t next = 0;
  for (std::size_t i = 0; i < args.inputs.size(); ++i) {
    arrays.push_back(hdf5[i] ? read_hdf5_as_float(args.inputs[i], args.datasets[next++])
                             : loadstar::read_npy<float>(args.inputs[i]));
  }
  return arrays;
}

/// Writes `outputs` as text: per output a `# name: shape` line, then one line per sample with
/// its values (flattened) in the shortest form that reads back as the same float.
void print_outputs(const std::vector<Tensor<float>>& outputs,
                   const std::vector<std::string>& names) {
  std::string text;
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    const Tensor<float>& out = outputs[k];
    text += "# " + names[k] + ": shape " + out.shape().str() + "\n";
    const std::size_t rows = out.shape().rank() == 0 ? 1 : out.shape()[0];
    const std::size_t width = rows == 0 ? 0 : out.size() / rows;
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t c = 0; c < width; ++c) {
        if (c != 0) text += ' ';
        text += shortest(out.data()[r * width + c]);
      }
      text += '\n';
      if (text.size() > (1u << 16)) {
        std::cout << text;
        text.clear();
      }
    }
  }
  std::cout << text;
}

/// Writes `outputs` to a fresh HDF5 file, one dataset each, renamed into place when complete.
void write_hdf5_outputs(const fs::path& file, const std::vector<Tensor<float>>& outputs,
                        const std::vector<std::string>& names) {
  const fs::path temporary = file.parent_path() / ("." + file.filename().string() + ".predict-" +
                                                   std::to_string(::getpid()));
  std::error_code ignored;
  fs::remove(temporary, ignored);
  try {
    for (std::size_t k = 0; k < outputs.size(); ++k)
      loadstar::write_hdf5(temporary, names[k], outputs[k]);
  } catch (...) {
    fs::remove(temporary, ignored);
    throw;
  }
  std::error_code error;
  fs::rename(temporary, file, error);
  if (error) {
    fs::remove(temporary, ignored);
    throw loadstar::IoError("output file '" + file.string() + "': cannot rename '" +
                            temporary.string() + "' into place (" + error.message() + ")");
  }
}

int run_predict(const PredictArgs& args) {
  const bool to_npy = !args.output.empty() && extension(args.output) == ".npy";
  const bool to_hdf5 = !args.output.empty() && is_hdf5_name(args.output);
  if (!args.output.empty() && !to_npy && !to_hdf5) {
    throw UsageError("--output must end in .npy, .h5 or .hdf5 but is '" + args.output + "'");
  }
  if (!args.output_datasets.empty() && !to_hdf5) {
    throw UsageError("--output-dataset needs an --output ending in .h5 or .hdf5");
  }
  const auto model = open_model(args.model, args.weights, false);
  std::vector<Tensor<float>> inputs = read_inputs(args);
  const std::size_t wanted = model->inputs().size();
  if (inputs.size() != wanted) {
    std::string names;
    for (const auto& n : model->input_names())
      names += (names.empty() ? "" : ", ") + n;
    throw loadstar::ConfigError("model '" + model->name() + "' has " + std::to_string(wanted) +
                                " input" + (wanted == 1 ? "" : "s") + " (" + names + ") but " +
                                std::to_string(inputs.size()) + " array" +
                                (inputs.size() == 1 ? " was" : "s were") + " given");
  }
  keras::PredictOptions options;
  options.batch_size = args.batch_size;
  std::vector<Tensor<float>> outputs = inputs.size() == 1
                                           ? model->predict_outputs(inputs.front(), options)
                                           : model->predict_outputs(inputs, options);
  std::vector<std::string> names = model->output_names();
  if (!args.output_datasets.empty()) {
    if (args.output_datasets.size() != outputs.size()) {
      throw loadstar::ConfigError(
          "model '" + model->name() + "' has " + std::to_string(outputs.size()) + " outputs but " +
          std::to_string(args.output_datasets.size()) + " --output-dataset names were given");
    }
    names = args.output_datasets;
  }
  if (args.output.empty()) {
    print_outputs(outputs, names);
  } else if (to_npy) {
    if (outputs.size() != 1) {
      throw loadstar::ConfigError("model '" + model->name() + "' has " +
                                  std::to_string(outputs.size()) +
                                  " outputs but an .npy file holds one array; write an .h5 file");
    }
    loadstar::write_npy(args.output, outputs.front());
  } else {
    write_hdf5_outputs(args.output, outputs, names);
  }
  return 0;
}

// --- convert ---------------------------------------------------------------------------------

struct ConvertArgs {
  std::string model;
  std::string weights;
  std::string out;
  bool no_optimizer = false;
};

int run_convert(const ConvertArgs& args) {
  const std::string ext = extension(args.out);
  if (ext != ".h5" && ext != ".hdf5" && ext != ".keras") {
    throw UsageError("OUT must end in .h5, .hdf5 or .keras but is '" + args.out + "'");
  }
  std::unique_ptr<keras::Model> model;
  try {
    model = open_model(args.model, args.weights, !args.no_optimizer);
  } catch (const loadstar::ConfigError& e) {
    const std::string message = e.what();
    if (message.find("training_config") == std::string::npos &&
        message.find("compile_config") == std::string::npos) {
      throw;
    }
    throw loadstar::ConfigError(message + " (--no-optimizer converts the model without it)");
  }
  keras::SaveOptions options;
  options.include_optimizer = !args.no_optimizer;
  keras::save_model(*model, args.out, options);
  return 0;
}

/// `message` on one line: line breaks become "; ".
std::string one_line(std::string message) {
  std::string out;
  for (std::size_t i = 0; i < message.size(); ++i) {
    if (message[i] == '\n' || message[i] == '\r') {
      while (!out.empty() && out.back() == ' ')
        out.pop_back();
      if (i + 1 < message.size() && !out.empty()) out += "; ";
      while (i + 1 < message.size() &&
             (message[i + 1] == '\n' || message[i + 1] == '\r' || message[i + 1] == ' ')) {
        ++i;
      }
    } else {
      out += message[i];
    }
  }
  return out;
}

int fail(const std::string& message, int status) {
  std::cout.flush();
  std::cerr << "loadstar: error: " << one_line(message) << std::endl;
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Inspect, run and convert Keras model files (.h5, .keras, architecture .json).",
               "loadstar"};
  app.set_version_flag("--version", std::string("loadstar ") + LOADSTAR_CLI_VERSION);
  app.require_subcommand(1);
  app.footer("Run 'loadstar COMMAND --help' for the options of a command.");

  SummaryArgs summary;
  auto* summary_cmd = app.add_subcommand(
      "summary", "Print Keras's model.summary() table: layers, output shapes, parameter counts.");
  summary_cmd->add_option("MODEL", summary.model, "Model file: .h5, .keras or architecture .json")
      ->required();
  summary_cmd->add_option("-w,--weights", summary.weights,
                          "Weights file to load into the model (model.save_weights: .h5 or "
                          ".weights.h5), e.g. for an architecture .json");

  PredictArgs predict;
  auto* predict_cmd = app.add_subcommand(
      "predict", "Run inference on arrays from .npy or HDF5 files and write the outputs.");
  predict_cmd->add_option("MODEL", predict.model, "Model file: .h5, .keras or architecture .json")
      ->required();
  predict_cmd->add_option("-w,--weights", predict.weights,
                          "Weights file to load into the model (model.save_weights: .h5 or "
                          ".weights.h5), e.g. for an architecture .json");
  predict_cmd
      ->add_option("-i,--input", predict.inputs,
                   "Input file, .npy or HDF5 (by contents); repeat for a model with several "
                   "inputs, in the model's input order")
      ->required()
      ->allow_extra_args(false);
  predict_cmd
      ->add_option("-d,--dataset", predict.datasets,
                   "HDF5 dataset to read from an HDF5 --input (e.g. /x); one per model input "
                   "when a single HDF5 file holds them all")
      ->allow_extra_args(false);
  predict_cmd->add_option("-o,--output", predict.output,
                          "Where to write the outputs: .npy (one output) or .h5/.hdf5 (one "
                          "dataset per output, named after it); text on stdout when absent");
  predict_cmd
      ->add_option("--output-dataset", predict.output_datasets,
                   "Dataset names for the outputs in an .h5 --output (default: the model's "
                   "output names)")
      ->allow_extra_args(false);
  predict_cmd->add_option("-b,--batch-size", predict.batch_size, "Samples per batch")
      ->default_val(32)
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30));

  ConvertArgs convert;
  auto* convert_cmd = app.add_subcommand(
      "convert",
      "Convert a model between the legacy Keras HDF5 format (.h5) and the Keras 3 archive "
      "(.keras), by OUT's extension.");
  convert_cmd->add_option("MODEL", convert.model, "Model file: .h5, .keras or architecture .json")
      ->required();
  convert_cmd->add_option("-w,--weights", convert.weights,
                          "Weights file to load into the model (model.save_weights: .h5 or "
                          ".weights.h5), e.g. for an architecture .json");
  convert_cmd->add_option("OUT", convert.out, "File to write: .h5, .hdf5 or .keras")->required();
  convert_cmd->add_flag("--no-optimizer", convert.no_optimizer,
                        "Write neither the training config nor the optimizer's state");

  WeightsArgs weights;
  auto* weights_cmd = app.add_subcommand(
      "weights",
      "List every weight (layer/weight name, shape, dtype) with its min, max, mean and standard "
      "deviation over finite values, and its NaN and Inf counts.");
  weights_cmd->add_option("MODEL", weights.model, "Model file: .h5, .keras or architecture .json")
      ->required();
  weights_cmd->add_option("-w,--weights", weights.weights,
                          "Weights file to load into the model (model.save_weights: .h5 or "
                          ".weights.h5), e.g. for an architecture .json");
  weights_cmd->add_flag("--json", weights.json, "Print the list as JSON");

  // CLI11 reports a mistyped command as a missing one.
  if (argc > 1 && argv[1][0] != '-') {
    const std::string name = argv[1];
    if (name != "summary" && name != "predict" && name != "convert" && name != "weights") {
      return fail("unknown command '" + name +
                      "' (expected summary, predict, convert or weights; see 'loadstar --help')",
                  exit_usage);
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::string where;
    for (const auto* sub : app.get_subcommands())
      where = " (see 'loadstar " + sub->get_name() + " --help')";
    if (where.empty()) where = " (see 'loadstar --help')";
    return fail(e.what() + where, exit_usage);
  }

  try {
    if (summary_cmd->parsed()) return run_summary(summary);
    if (predict_cmd->parsed()) return run_predict(predict);
    if (convert_cmd->parsed()) return run_convert(convert);
    if (weights_cmd->parsed()) return run_weights(weights);
    return fail("no command given (see 'loadstar --help')", exit_usage);
  } catch (const UsageError& e) {
    return fail(e.what(), exit_usage);
  } catch (const keras::UnsupportedLayersError& e) {
    // A user of the tool cannot pass custom objects: say only what loadstar does not support.
    return fail(e.describe(/*custom_objects_advice=*/false), exit_runtime);
  } catch (const std::exception& e) {
    return fail(e.what(), exit_runtime);
  } catch (...) {
    return fail("unknown failure", exit_runtime);
  }
}

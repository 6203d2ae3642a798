/// \file
/// `EventWriter`: TensorBoard's event files (`events.out.tfevents.*`), header-only, encoded with
/// Debian's protobuf library.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cfloat>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"
#include "loadstar/tensorboard/detail/crc32c.hpp"
#include "loadstar/tensorboard/detail/event_proto.hpp"

namespace loadstar::tensorboard {

/// A metric the hparams dashboard shows beside the hyperparameters (TensorBoard's `hp.Metric`):
/// the scalar tag, the run folder relative to the session's (`group`, empty for the same
/// folder), and whether it is measured on validation data.
struct HParamsMetric {
  std::string tag;
  std::string group = {};
  bool validation = false;
};

/// One TFRecord: the length as a little-endian uint64, the masked CRC-32C of those 8 bytes, the
/// data, and the masked CRC-32C of the data (tensorflow/core/lib/io/record_writer.cc).
inline std::string tfrecord(std::string_view data) {
  std::string record(8 + 4 + data.size() + 4, '\0');
  const std::uint64_t length = data.size();
  for (int i = 0; i < 8; ++i)
    record[static_cast<std::size_t>(i)] = static_cast<char>((length >> (8 * i)) & 0xFFU);
  const auto put32 = [&](std::size_t at, std::uint32_t value) {
    for (int i = 0; i < 4; ++i)
      record[at + static_cast<std::size_t>(i)] = static_cast<char>((value >> (8 * i)) & 0xFFU);
  };
  put32(8, detail::masked_crc32c(std::string_view(record.data(), 8)));
  std::memcpy(record.data() + 12, data.data(), data.size());
  put32(12 + data.size(), detail::masked_crc32c(data));
  return record;
}

/// TensorFlow's default histogram bucket limits (tensorflow/core/lib/histogram/histogram.cc):
/// from 1e-12 growing by 10% up to 1e20 on each side of zero, closed by DBL_MAX.
inline const std::vector<double>& default_bucket_limits() {
  static const std::vector<double> limits = [] {
    std::vector<double> positive;
    for (double v = 1.0e-12; v < 1.0e20; v *= 1.1)
      positive.push_back(v);
    positive.push_back(DBL_MAX);
    std::vector<double> all;
    for (auto it = positive.rbegin(); it != positive.rend(); ++it)
      all.push_back(-*it);
    all.push_back(0.0);
    all.insert(all.end(), positive.begin(), positive.end());
    return all;
  }();
  return limits;
}

/// Writes one TensorBoard event file in `log_dir` (created if missing), named as TensorFlow names
/// them, `events.out.tfevents.<unix seconds>.<hostname>`, followed by `.<pid>.<n>` so that
/// writers of several processes, or several in one, never share a file. The seconds are moved
/// past those of the event files already in `log_dir`, so that the names sort in the order the
/// files were begun (TensorBoard reads a folder's files in the order of their names). The first
/// event is `file_version: "brain.Event:2"`. Each event is written with one `write` as soon as it
/// is added, so a process killed at any moment leaves whole records and at most a cut last one,
/// which readers skip. Throws `IoError` when the file cannot be created or written.
/// \code
/// loadstar::tensorboard::EventWriter writer("logs/train");
/// writer.add_scalar("epoch_loss", 0.25, 3);
/// \endcode
class EventWriter {
 public:
  explicit EventWriter(const std::filesystem::path& log_dir) {
    std::error_code error;
    std::filesystem::create_directories(log_dir, error);
    if (error) {
      throw IoError("tensorboard log folder '" + log_dir.string() +
                    "': cannot create: " + error.message());
    }
    const std::string prefix = "events.out.tfevents.";
    long long seconds = static_cast<long long>(wall_time());
    for (const auto& entry : std::filesystem::directory_iterator(log_dir, error)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind(prefix, 0) != 0) continue;
      long long earlier = 0;
      const char* begin = name.data() + prefix.size();
      if (std::from_chars(begin, name.data() + name.size(), earlier).ec == std::errc()) {
        seconds = std::max(seconds, earlier + 1);
      }
    }
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
    static std::atomic<std::uint64_t> opened{0};  // several writers of one process in one second
    char digits[32];
    std::snprintf(digits, sizeof digits, "%010lld", seconds);
    path_ = log_dir / (prefix + digits + "." + host + "." + std::to_string(::getpid()) + "." +
                       std::to_string(opened++));
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      throw IoError("tensorboard event file '" + path_.string() +
                    "': cannot create: " + std::strerror(errno));
    }
    auto event = make_event(0);
    detail::Fields(*event).set("file_version", "brain.Event:2");
    write(*event);
  }

  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;
  ~EventWriter() {
    if (fd_ >= 0) ::close(fd_);
  }

  /// The event file.
  const std::filesystem::path& path() const noexcept { return path_; }

  /// A scalar as `Summary.Value.simple_value` (what TensorBoard's scalars dashboard reads).
  void add_scalar(const std::string& tag, double value, std::int64_t step) {
    auto event = make_event(step);
    detail::Fields(*event)
        .message("summary")
        .add_message("value")
        .set("tag", tag)
        .set("simple_value", value);
    write(*event);
  }

  /// A histogram of `values` as a `HistogramProto` with TensorFlow's default buckets, encoded as
  /// TensorFlow's `Histogram::EncodeToProto` does (runs of empty buckets merged into one).
  void add_histogram(const std::string& tag, std::span<const float> values, std::int64_t step) {
    const auto& limits = default_bucket_limits();
    std::vector<double> counts(limits.size(), 0.0);
    double min = DBL_MAX, max = -DBL_MAX, sum = 0.0, sum_squares = 0.0;
    for (const float f : values) {
      const double v = f;
      const auto b = std::upper_bound(limits.begin(), limits.end(), v) - limits.begin();
      counts[static_cast<std::size_t>(
          std::min<std::ptrdiff_t>(b, static_cast<std::ptrdiff_t>(limits.size()) - 1))] += 1.0;
      min = std::min(min, v);
      max = std::max(max, v);
      sum += v;
      sum_squares += v * v;
    }
    auto event = make_event(step);
    auto histo = detail::Fields(*event)
                     .message("summary")
                     .add_message("value")
                     .set("tag", tag)
                     .message("histo");
    histo.set("min", min)
        .set("max", max)
        .set("num", static_cast<double>(values.size()))
        .set("sum", sum)
        .set("sum_squares", sum_squares);
    bool any = false;
    for (std::size_t i = 0; i < counts.size();) {
      double end = limits[i];
      double count = counts[i];
      ++i;
      if (count <= 0.0) {
        while (i < counts.size() && counts[i] <= 0.0) {
          end = limits[i];
          count = counts[i];
          ++i;
        }
      }
      histo.add("bucket_limit", end).add("bucket", count);
      any = true;
    }
    if (!any) histo.add("bucket_limit", DBL_MAX).add("bucket", 0.0);
    write(*event);
  }

  /// A string tensor (`DT_STRING`, rank 0) for the plugin `plugin_name`, with `content` as its
  /// plugin data: how Keras writes a model's config for the graph dashboard
  /// (`keras_model_summary`: plugin `graph_keras_model`, content `1`).
  void add_text_tensor(const std::string& tag, std::string text, const std::string& plugin_name,
                       std::string content, std::int64_t step) {
    auto event = make_event(step);
    auto value = detail::Fields(*event).message("summary").add_message("value").set("tag", tag);
    value.message("metadata")
        .message("plugin_data")
        .set("plugin_name", plugin_name)
        .set("content", std::move(content));
    auto tensor = value.message("tensor");
    tensor.set("dtype", 7.0 /* DT_STRING */).message("tensor_shape");
    tensor.add_string("string_val", std::move(text));
    write(*event);
  }

  /// `SessionLog{status: START}` at `step`: TensorBoard drops the events it read before, from
  /// this folder, at steps from `step` on (a restart from a checkpoint).
  void add_session_start(std::int64_t step) {
    auto event = make_event(step);
    detail::Fields(*event).message("session_log").set("status", 1.0 /* START */);
    write(*event);
  }

  /// The hparams plugin's experiment summary (TensorBoard's `hp.hparams_config`): each
  /// hyperparameter of `hparams` with its type, and `metrics`.
  void add_hparams_config(const nlohmann::json& hparams, std::span<const HParamsMetric> metrics,
                          double time_created_secs) {
    auto data = hparams_data();
    auto experiment = data.message("experiment");
    experiment.set("time_created_secs", time_created_secs);
    for (const auto& [name, value] : flatten(hparams)) {
      const double type = value.is_boolean() ? 2.0 : value.is_number() ? 3.0 : 1.0;
      experiment.add_message("hparam_infos").set("name", name).set("type", type);
    }
    for (const auto& metric : metrics) {
      auto info = experiment.add_message("metric_infos");
      info.message("name").set("group", metric.group).set("tag", metric.tag);
      info.set("dataset_type", metric.validation ? 2.0 : 1.0);
    }
    add_hparams_summary("_hparams_/experiment", data.get());
  }

  /// The hparams plugin's session start (TensorBoard's `hp.hparams(hparams, trial_id)`): the
  /// session's hyperparameters (nested objects flattened with `.`, lists as JSON text), its group
  /// name and start time.
  void add_hparams(const nlohmann::json& hparams, const std::string& group_name,
                   double start_time_secs) {
    auto data = hparams_data();
    auto start = data.message("session_start_info");
    start.set("group_name", group_name).set("start_time_secs", start_time_secs);
    for (const auto& [name, value] : flatten(hparams)) {
      auto entry = start.add_message("hparams");
      entry.set("key", name);
      auto v = entry.message("value");
      if (value.is_boolean()) {
        v.set("bool_value", value.get<bool>() ? 1.0 : 0.0);
      } else if (value.is_number()) {
        v.set("number_value", value.get<double>());
      } else if (value.is_string()) {
        v.set("string_value", value.get<std::string>());
      } else {
        v.set("string_value", value.dump());
      }
    }
    add_hparams_summary("_hparams_/session_start_info", data.get());
  }

  /// The current time as TensorFlow's events carry it: seconds since the Unix epoch.
  static double wall_time() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

 private:
  std::unique_ptr<google::protobuf::Message> make_event(std::int64_t step) const {
    auto event = detail::Schema::get().make("tensorflow.Event");
    detail::Fields(*event).set("wall_time", wall_time()).set_int64("step", step);
    return event;
  }

  /// A fresh `HParamsPluginData` (version 0, TensorBoard's `PLUGIN_DATA_VERSION`); kept alive by
  /// `hparams_`.
  detail::Fields hparams_data() {
    hparams_ = detail::Schema::get().make("tensorboard.hparams.HParamsPluginData");
    return detail::Fields(*hparams_).set("version", 0.0);
  }

  /// As TensorBoard's hparams `summary._summary`: the plugin data as the metadata's content and a
  /// null tensor (a rank-0 DT_FLOAT 0) as the value, at step 0.
  void add_hparams_summary(const std::string& tag, const google::protobuf::Message& data) {
    std::string content;
    data.SerializeToString(&content);
    auto event = make_event(0);
    auto value = detail::Fields(*event).message("summary").add_message("value").set("tag", tag);
    value.message("metadata")
        .message("plugin_data")
        .set("plugin_name", "hparams")
        .set("content", std::move(content));
    auto tensor = value.message("tensor");
    tensor.set("dtype", 1.0 /* DT_FLOAT */).message("tensor_shape");
    tensor.add("float_val", 0.0);
    write(*event);
  }

  /// The hyperparameters as (name, scalar) pairs: nested objects' names joined with `.`.
  static std::vector<std::pair<std::string, nlohmann::json>> flatten(
      const nlohmann::json& hparams, const std::string& prefix = "") {
    std::vector<std::pair<std::string, nlohmann::json>> flat;
    if (!hparams.is_object()) return flat;
    for (const auto& [name, value] : hparams.items()) {
      if (value.is_object()) {
        auto inner = flatten(value, prefix + name + ".");
        flat.insert(flat.end(), inner.begin(), inner.end());
      } else {
        flat.emplace_back(prefix + name, value);
      }
    }
    return flat;
  }

  void write(const google::protobuf::Message& event) {
    std::string data;
    if (!event.SerializeToString(&data)) {
      throw IoError("tensorboard event file '" + path_.string() +
                    "': cannot encode an event of type " + event.GetDescriptor()->full_name());
    }
    const std::string record = tfrecord(data);
    std::size_t done = 0;
    while (done < record.size()) {
      const ::ssize_t n = ::write(fd_, record.data() + done, record.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        throw IoError("tensorboard event file '" + path_.string() +
                      "': cannot write: " + std::strerror(errno));
      }
      done += static_cast<std::size_t>(n);
    }
  }

  std::filesystem::path path_;
  int fd_ = -1;
  std::unique_ptr<google::protobuf::Message> hparams_;
};

}  // namespace loadstar::tensorboard

// TensorBoard's event files: CRC-32C and TFRecord framing, the events EventWriter writes read back
// through protobuf, the order of file names, and the refusals of keras::callbacks::TensorBoard.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <loadstar/keras/callbacks/detail/files.hpp>
#include <loadstar/keras/callbacks/tensorboard.hpp>
#include <loadstar/tensorboard/event_writer.hpp>
#include <string>
#include <vector>

#include "temp_dir.hpp"

namespace {

using loadstar::ConfigError;
using loadstar::IoError;
using loadstar::keras::callbacks::TensorBoard;
using loadstar::keras::callbacks::TensorBoardOptions;
namespace tb = loadstar::tensorboard;

std::uint64_t little_endian(const std::string& bytes, std::size_t at, int size) {
  std::uint64_t value = 0;
  for (int i = size - 1; i >= 0; --i)
    value = (value << 8) | static_cast<unsigned char>(bytes[at + static_cast<std::size_t>(i)]);
  return value;
}

/// The records of a TFRecord file, each length and CRC checked.
std::vector<std::string> records(const std::filesystem::path& path) {
  const std::string bytes = loadstar::keras::detail::read_bytes(path);
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < bytes.size()) {
    REQUIRE(bytes.size() - at >= 16);
    const auto length = little_endian(bytes, at, 8);
    CHECK(little_endian(bytes, at + 8, 4) ==
          tb::detail::masked_crc32c(std::string_view(bytes).substr(at, 8)));
    REQUIRE(at + 16 + length <= bytes.size());
    std::string data = bytes.substr(at + 12, length);
    CHECK(little_endian(bytes, at + 12 + length, 4) == tb::detail::masked_crc32c(data));
    out.push_back(std::move(data));
    at += 16 + length;
  }
  return out;
}

std::unique_ptr<google::protobuf::Message> event(const std::string& bytes) {
  auto message = tb::detail::Schema::get().make("tensorflow.Event");
  REQUIRE(message->ParseFromString(bytes));
  return message;
}

/// The event as protobuf's text format.
std::string text(const std::string& bytes) {
  return event(bytes)->ShortDebugString();
}

}  // namespace

TEST_SUITE("tensorboard") {
  TEST_CASE("crc32c gives the check value of CRC-32C and TFRecord's mask") {
    CHECK(tb::detail::crc32c("123456789") == 0xE3069283U);
    CHECK(tb::detail::masked_crc32c("123456789") == 0xC78AB0E5U);
    CHECK(tb::detail::crc32c("") == 0U);
    CHECK(tb::detail::crc32c("123456788") != 0xE3069283U);
  }

  TEST_CASE("tfrecord frames data with its length and two masked CRCs") {
    const std::string record = tb::tfrecord("abc");
    REQUIRE(record.size() == 3 + 16);
    CHECK(little_endian(record, 0, 8) == 3);
    CHECK(little_endian(record, 8, 4) == tb::detail::masked_crc32c(record.substr(0, 8)));
    CHECK(record.substr(12, 3) == "abc");
    CHECK(little_endian(record, 15, 4) == tb::detail::masked_crc32c("abc"));
  }

  TEST_CASE("EventWriter writes the file version then each event as it is added") {
    test_support::TempDir dir;
    tb::EventWriter writer(dir.path() / "run");
    const auto name = writer.path().filename().string();
    CHECK(name.rfind("events.out.tfevents.", 0) == 0);
    CHECK(writer.path().parent_path() == dir.path() / "run");
    writer.add_scalar("epoch_loss", 0.25, 3);
    // Nothing is buffered: the file holds both events before the writer closes.
    const auto written = records(writer.path());
    REQUIRE(written.size() == 2);
    CHECK(text(written[0]).find("file_version: \"brain.Event:2\"") != std::string::npos);
    const auto scalar = text(written[1]);
    CHECK(scalar.find("step: 3") != std::string::npos);
    CHECK(scalar.find("summary { value { tag: \"epoch_loss\" simple_value: 0.25 } }") !=
          std::string::npos);

    writer.add_session_start(7);
    const auto start = text(records(writer.path()).back());
    CHECK(start.find("step: 7 session_log { status: START }") != std::string::npos);
  }

  TEST_CASE("EventWriter encodes histograms as TensorFlow's default buckets") {
    test_support::TempDir dir;
    tb::EventWriter writer(dir.path());
    const float values[] = {-1.0F, 0.0F, 0.5F, 2.0F, 2.0F};
    writer.add_histogram("w/histogram", values, 1);
    auto message = event(records(writer.path()).back());
    const auto* d = message->GetDescriptor();
    const auto& reflection = *message->GetReflection();
    const auto& summary = reflection.GetMessage(*message, d->FindFieldByName("summary"));
    const auto& value = summary.GetReflection()->GetRepeatedMessage(
        summary, summary.GetDescriptor()->FindFieldByName("value"), 0);
    const auto& histo =
        value.GetReflection()->GetMessage(value, value.GetDescriptor()->FindFieldByName("histo"));
    const auto* h = histo.GetDescriptor();
    const auto& r = *histo.GetReflection();
    CHECK(r.GetDouble(histo, h->FindFieldByName("num")) == 5.0);
    CHECK(r.GetDouble(histo, h->FindFieldByName("min")) == -1.0);
    CHECK(r.GetDouble(histo, h->FindFieldByName("max")) == 2.0);
    CHECK(r.GetDouble(histo, h->FindFieldByName("sum")) == 3.5);
    CHECK(r.GetDouble(histo, h->FindFieldByName("sum_squares")) == 9.25);
    const auto* limits = h->FindFieldByName("bucket_limit");
    const auto* counts = h->FindFieldByName("bucket");
    const int n = r.FieldSize(histo, counts);
    REQUIRE(n == r.FieldSize(histo, limits));
    double total = 0;
    std::vector<double> nonzero;
    for (int i = 0; i < n; ++i) {
      total += r.GetRepeatedDouble(histo, counts, i);
      if (r.GetRepeatedDouble(histo, counts, i) > 0) {
        nonzero.push_back(r.GetRepeatedDouble(histo, counts, i));
        // Each value lies below its bucket's limit and at or above the previous one.
        if (i > 0)
          CHECK(r.GetRepeatedDouble(histo, limits, i - 1) < r.GetRepeatedDouble(histo, limits, i));
      }
    }
    CHECK(total == 5.0);
    CHECK(nonzero == std::vector<double>{1, 1, 1, 2});
    // Runs of empty buckets are merged: far fewer entries than TensorFlow's 1551 buckets.
    CHECK(n < 12);
    CHECK(tb::default_bucket_limits().size() == 1551);
  }

  TEST_CASE("EventWriter names files so that they sort in the order they were begun") {
    test_support::TempDir dir;
    std::filesystem::create_directories(dir.path());
    std::ofstream(dir.path() / "events.out.tfevents.9999999990.elsewhere.1.0") << "";
    tb::EventWriter first(dir.path());
    tb::EventWriter second(dir.path());
    CHECK(first.path().filename().string().rfind("events.out.tfevents.9999999991.", 0) == 0);
    CHECK(second.path().filename().string().rfind("events.out.tfevents.9999999992.", 0) == 0);
  }

  TEST_CASE("EventWriter throws IoError naming a folder it cannot create") {
    test_support::TempDir dir;
    std::filesystem::create_directories(dir.path());
    std::ofstream(dir.path() / "file") << "x";
    const std::string expected =
        "tensorboard log folder '" + (dir.path() / "file" / "logs").string() + "': cannot create";
    CHECK_THROWS_WITH_AS(tb::EventWriter(dir.path() / "file" / "logs"),
                         doctest::Contains(expected.c_str()), IoError);
  }

  TEST_CASE("EventWriter writes hparams as TensorBoard's hparams plugin") {
    test_support::TempDir dir;
    tb::EventWriter writer(dir.path());
    const tb::HParamsMetric metric{.tag = "Determined/val_loss", .validation = true};
    const nlohmann::json hparams = {{"lr", 0.5}, {"opt", "adam"}, {"net", {{"deep", true}}}};
    writer.add_hparams_config(hparams, {&metric, 1}, 10.0);
    writer.add_hparams(hparams, "group", 11.0);
    const auto written = records(writer.path());
    REQUIRE(written.size() == 3);
    const auto config = text(written[1]);
    CHECK(config.find("tag: \"_hparams_/experiment\" tensor { dtype: DT_FLOAT tensor_shape { } "
                      "float_val: 0 } metadata { plugin_data { plugin_name: \"hparams\"") !=
          std::string::npos);
    // The plugin data decodes as HParamsPluginData.
    auto message = event(written[2]);
    auto data = tb::detail::Schema::get().make("tensorboard.hparams.HParamsPluginData");
    const std::string start = text(written[2]);
    const auto at = start.find("content: \"");
    REQUIRE(at != std::string::npos);
    const auto* d = message->GetDescriptor();
    const auto& summary =
        message->GetReflection()->GetMessage(*message, d->FindFieldByName("summary"));
    const auto& value = summary.GetReflection()->GetRepeatedMessage(
        summary, summary.GetDescriptor()->FindFieldByName("value"), 0);
    const auto& metadata = value.GetReflection()->GetMessage(
        value, value.GetDescriptor()->FindFieldByName("metadata"));
    const auto& plugin = metadata.GetReflection()->GetMessage(
        metadata, metadata.GetDescriptor()->FindFieldByName("plugin_data"));
    REQUIRE(data->ParseFromString(plugin.GetReflection()->GetString(
        plugin, plugin.GetDescriptor()->FindFieldByName("content"))));
    const auto info = data->ShortDebugString();
    CHECK(info.find("group_name: \"group\"") != std::string::npos);
    CHECK(info.find("key: \"net.deep\" value { bool_value: true }") != std::string::npos);
    CHECK(info.find("key: \"lr\" value { number_value: 0.5 }") != std::string::npos);
    CHECK(info.find("key: \"opt\" value { string_value: \"adam\" }") != std::string::npos);
  }

  TEST_CASE("TensorBoard refuses the options it cannot honour by name") {
    const auto refused = [](TensorBoardOptions options) {
      try {
        TensorBoard board(std::move(options));
      } catch (const ConfigError& e) {
        return std::string(e.what());
      }
      return std::string("accepted");
    };
    CHECK(refused({.update_freq = 0}) ==
          "callback (TensorBoard): update_freq: expected \"epoch\", \"batch\" or a positive "
          "number of batches but found '0'");
    CHECK(refused({.update_freq = "weekly"}) ==
          "callback (TensorBoard): update_freq: expected \"epoch\", \"batch\" or a positive "
          "number of batches but found 'weekly'");
    CHECK(refused({.update_freq = -3}) ==
          "callback (TensorBoard): update_freq: expected \"epoch\", \"batch\" or a positive "
          "number of batches but found '-3'");
    CHECK(refused({.write_images = true}) ==
          "callback (TensorBoard): write_images: expected false (loadstar writes no weight "
          "images) but found true");
    CHECK(refused({.profile_batch = 5}) ==
          "callback (TensorBoard): profile_batch: expected 0 (loadstar has no profiler to trace "
          "batches with) but found 5");
    CHECK(refused({.embeddings_freq = 1}) ==
          "callback (TensorBoard): embeddings_freq: expected 0 (loadstar writes no embedding "
          "projector checkpoints) but found 1");
    CHECK(refused({.embeddings_metadata = "meta.tsv"}) ==
          "callback (TensorBoard): embeddings_metadata: expected no value (loadstar writes no "
          "embedding projector checkpoints) but found 'meta.tsv'");
    CHECK(refused({.log_dir = ""}) ==
          "callback (TensorBoard): log_dir: expected a folder but found an empty path");
    CHECK(refused({.update_freq = "batch"}) == "accepted");
    CHECK(refused({.update_freq = 100}) == "accepted");
    CHECK(refused({}) == "accepted");
  }
}

// libFuzzer harness: TFRecordDataset over the input as a TFRecord file (plain, and ZLIB-
// compressed), every record parsed as a tf.train.Example, and the input itself parsed as one, so
// that mutations reach the Example parser behind the records' CRCs too.
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <loadstar/data/dataset/tfrecord.hpp>
#include <loadstar/data/example.hpp>
#include <loadstar/error.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.hpp"

namespace {

const loadstar::FeatureSpecs& specs() {
  using loadstar::ExampleDtype;
  static const loadstar::FeatureSpecs features = {
      {"label", loadstar::FixedLenFeature{{}, ExampleDtype::int64, std::vector<std::int64_t>{0}}},
      {"weights",
       loadstar::FixedLenFeature{{3}, ExampleDtype::float32, std::vector<float>{0.f, 0.f, 0.f}}},
      {"name", loadstar::FixedLenFeature{{1}, ExampleDtype::string, std::vector<std::string>{""}}},
      {"tags", loadstar::VarLenFeature{ExampleDtype::string}},
      {"ids", loadstar::VarLenFeature{ExampleDtype::int64}},
      {"boxes", loadstar::FixedLenSequenceFeature{{2}, ExampleDtype::float32, true}}};
  return features;
}

void parse(std::string_view bytes) {
  try {
    (void)loadstar::parse_single_example(bytes, specs());
  } catch (const loadstar::Error&) {
  }
  try {
    const std::vector<std::string> batch{std::string(bytes), std::string(bytes)};
    (void)loadstar::parse_example(batch, specs());
  } catch (const loadstar::Error&) {
  }
}

void read_all(const std::string& path, const std::string& compression) {
  try {
    loadstar::TFRecordDataset ds({path, path}, compression, 64, 2);
    while (auto record = ds.next())
      parse(*record);
  } catch (const loadstar::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  parse(std::string_view(reinterpret_cast<const char*>(data), size));
  const auto plain = fuzz_support::write_input(data, size, ".tfrecord");
  read_all(plain.string(), "");
  std::vector<std::uint8_t> packed(compressBound(static_cast<uLong>(size)));
  uLongf packed_size = packed.size();
  if (compress(packed.data(), &packed_size, data, static_cast<uLong>(size)) != Z_OK) std::abort();
  const auto zlib = fuzz_support::write_input(packed.data(), packed_size, ".tfrecord.zlib");
  read_all(zlib.string(), "ZLIB");
  return 0;
}

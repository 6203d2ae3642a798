// libFuzzer harness: model_from_json on any text (Keras's model_config JSON). Every outcome but a
// model or a loadstar::Error is a finding.
#include <cstddef>
#include <cstdint>
#include <loadstar/error.hpp>
#include <loadstar/keras.hpp>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    (void)loadstar::keras::model_from_json(text);
  } catch (const loadstar::Error&) {
  }
  return 0;
}

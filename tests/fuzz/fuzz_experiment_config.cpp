// libFuzzer harness: parse_experiment_config on any bytes (Determined's experiment YAML). Every
// outcome but a config or a loadstar::Error is a finding. A parsed config is also written out as
// an experiment stores it (to_json, dumped to text, so that strings the YAML held are encoded),
// read back, and must come back equal, as experiment_config.hpp promises.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <loadstar/error.hpp>
#include <loadstar/trial/experiment_config.hpp>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace trial = loadstar::trial;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  trial::ExperimentConfig config;
  try {
    config = trial::parse_experiment_config(text, "fuzz.yaml");
  } catch (const loadstar::Error&) {
    return 0;
  }
  // Outside the try: what a valid config makes these throw is a finding too.
  const nlohmann::json stored = trial::to_json(config);
  (void)stored.dump();
  (void)trial::to_json(trial::make_test_config(config)).dump();
  if (!(trial::experiment_config_from_json(stored, "stored") == config)) {
    const auto shown = stored.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    std::fprintf(stderr, "the config read back from to_json differs: %s\n", shown.c_str());
    std::abort();
  }
  return 0;
}

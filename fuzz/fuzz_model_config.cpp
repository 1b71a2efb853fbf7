// libFuzzer target: config.json parsing, value checks and the expected-tensor list.
//
// Any input must end in a ModelConfig or a dsinfer::Error; a crash, another exception or a
// runaway allocation is a bug.
#include <cstddef>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "model/expected_tensors.h"
#include "model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    dsinfer::ModelConfig config = dsinfer::ModelConfig::from_json(j, "fuzz/config.json");
    // Listing a large model is correct but slow; keep iterations fast.
    const int64_t num_layers = config.num_hidden_layers + config.num_nextn_predict_layers;
    if (num_layers * (config.n_routed_experts + 1) <= 4096) {
      (void)dsinfer::expected_tensors(config);
    }
  } catch (const dsinfer::Error&) {
  }
  return 0;
}

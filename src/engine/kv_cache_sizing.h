// How many latent KV blocks fit a share of the device's memory. The weights are loaded; what a
// step needs beside them is found by running the largest step the scheduler can make (its token
// budget as one prompt, logits for as many rows as requests may run) on a throwaway cache, so
// that its activations stay in the backend's cache as they would while serving. The KV cache
// then takes what is left of `fraction` of the device's memory.
#pragma once

#include <optional>

#include "backend/backend.h"
#include "engine/engine_config.h"
#include "model/deepseek_model.h"

namespace dsinfer {

// The number of blocks, or nothing where the backend has no device memory to size against.
// Throws Error (kResourceExhausted) when the share left cannot hold one full-length request.
std::optional<int> kv_blocks_for_device_memory(DeepseekModel& model, Backend& backend, const EngineConfig& config,
                                               int max_model_len);

}  // namespace dsinfer

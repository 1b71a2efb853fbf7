// The weights of a DeepSeek V2/V3 model, prepared on a backend from a checkpoint.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/checkpoint.h"
#include "model/model_config.h"

namespace dsinfer {

struct LayerWeights {
  Tensor input_norm;        // [hidden]
  Tensor post_attn_norm;    // [hidden]
  bool has_q_lora = false;
  LinearWeight q_a;         // [q_lora, hidden]
  Tensor q_a_norm;          // [q_lora]
  LinearWeight q_b;         // [heads * (nope + rope), q_lora]
  LinearWeight q;           // [heads * (nope + rope), hidden] when q_lora_rank is null
  LinearWeight kv_a;        // [kv_lora + rope, hidden]
  MlaWeights mla;           // kv_a_layernorm and kv_b_proj split per head
  LinearWeight o_proj;      // [hidden, heads * v]
  bool is_moe = false;
  LinearWeight dense_gate_up;  // [2 * intermediate, hidden]
  LinearWeight dense_down;     // [hidden, intermediate]
  MoeWeights moe;
};

// One multi-token-prediction module (DeepSeek-V3's MTP, stored as layer num_hidden_layers + i).
struct MtpWeights {
  Tensor enorm, hnorm;      // [hidden]
  LinearWeight eh_proj;     // [hidden, 2 * hidden]
  LayerWeights layer;
  Tensor head_norm;         // shared_head.norm [hidden]
  LinearWeight head;        // shared_head.head [vocab, hidden]
  Tensor embed;             // [vocab, hidden]; the main embedding when the module has none
};

struct ModelWeights {
  Tensor embed;             // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Tensor final_norm;        // [hidden]
  LinearWeight lm_head;     // [vocab, hidden]
  std::vector<MtpWeights> mtp;
};

// Validates the checkpoint against the config and prepares every tensor on the backend.
// Throws Error naming the file and tensor on any problem.
ModelWeights load_model_weights(const ModelConfig& config, const Checkpoint& checkpoint, Backend& backend);

// Random weights of the right shapes (for benchmarks without files), deterministic per seed.
// fp8_linears: the layers' projection matrices as e4m3 with 128x128 block scales, as an FP8
// checkpoint has them (for backends that keep FP8; others get the same values widened).
ModelWeights make_random_weights(const ModelConfig& config, Backend& backend, uint64_t seed,
                                 bool fp8_linears = false);

}  // namespace dsinfer

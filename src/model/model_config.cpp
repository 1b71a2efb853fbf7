#include "model/model_config.h"

#include "model/json_file.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace dsinfer {

namespace {

using nlohmann::json;

enum class Family { kV2, kV3 };

constexpr int kMaxLayers = 4096;
constexpr int kMaxExperts = 1 << 16;
constexpr int kMaxDim = 1 << 24;
constexpr int64_t kMaxLayerExperts = 1 << 20;  // DeepSeek-V3: 62 x 257

// Reads typed fields of one JSON object, naming the source and the field in every error.
class FieldReader {
 public:
  FieldReader(const json& j, std::string source, std::string prefix = "")
      : j_(j), source_(std::move(source)), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw Error(StatusCode::kInvalidArgument,
                source_ + ": field \"" + prefix_ + field + "\" " + what);
  }

  // Absent and null both count as "not given": HF treats null as "use the default".
  bool given(const char* field) const {
    auto it = j_.find(field);
    return it != j_.end() && !it->is_null();
  }
  bool present_null(const char* field) const {
    auto it = j_.find(field);
    return it != j_.end() && it->is_null();
  }

  int get_int(const char* field, int fallback) const {
    if (!given(field)) return fallback;
    return to_int(field, j_.at(field));
  }
  int to_int(const std::string& field, const json& v) const {
    int64_t value = 0;
    if (v.is_number_integer()) {
      if (v.is_number_unsigned()) {
        uint64_t u = v.get<uint64_t>();
        if (u > static_cast<uint64_t>(std::numeric_limits<int>::max())) fail(field, "is too large");
        value = static_cast<int64_t>(u);
      } else {
        value = v.get<int64_t>();
      }
    } else if (v.is_number_float()) {
      // Some exporters write 7168.0; accept integral floats only.
      double d = v.get<double>();
      if (!std::isfinite(d) || d != std::floor(d)) fail(field, "must be an integer, got " + v.dump());
      if (std::fabs(d) > std::numeric_limits<int>::max()) fail(field, "is too large");
      value = static_cast<int64_t>(d);
    } else {
      fail(field, "must be an integer, got " + v.dump());
    }
    if (value > std::numeric_limits<int>::max() || value < std::numeric_limits<int>::min()) {
      fail(field, "is out of range");
    }
    return static_cast<int>(value);
  }
  double get_double(const char* field, double fallback) const {
    if (!given(field)) return fallback;
    const json& v = j_.at(field);
    if (!v.is_number()) fail(field, std::string("must be a number, got ") + v.dump());
    double d = v.get<double>();
    if (!std::isfinite(d)) fail(field, "must be finite");
    return d;
  }
  bool get_bool(const char* field, bool fallback) const {
    if (!given(field)) return fallback;
    const json& v = j_.at(field);
    if (!v.is_boolean()) fail(field, std::string("must be true or false, got ") + v.dump());
    return v.get<bool>();
  }
  std::string get_string(const char* field, const std::string& fallback) const {
    if (!given(field)) return fallback;
    const json& v = j_.at(field);
    if (!v.is_string()) fail(field, std::string("must be a string, got ") + v.dump());
    return v.get<std::string>();
  }

 private:
  const json& j_;
  std::string source_;
  std::string prefix_;
};

// HF transformers 5.x defaults: DeepseekV2Config and DeepseekV3Config differ in many fields.
// DeepseekV2Config has no scoring_func (softmax is implied) and DeepseekV3Config has neither
// topk_method nor scoring_func (noaux_tc with sigmoid is implied); neither has moe_layer_freq
// (always 1) nor num_nextn_predict_layers (0 when absent).
ModelConfig family_defaults(Family family) {
  ModelConfig c;
  if (family == Family::kV3) {
    c.architecture = "DeepseekV3ForCausalLM";
    c.model_type = "deepseek_v3";
    c.vocab_size = 129280;
    c.hidden_size = 7168;
    c.intermediate_size = 18432;
    c.moe_intermediate_size = 2048;
    c.num_hidden_layers = 61;
    c.num_attention_heads = 128;
    c.n_shared_experts = 1;
    c.n_routed_experts = 256;
    c.num_experts_per_tok = 8;
    c.n_group = 8;
    c.topk_group = 4;
    c.topk_method = TopkMethod::kNoauxTc;
    c.scoring_func = ScoringFunc::kSigmoid;
    c.norm_topk_prob = true;
    c.routed_scaling_factor = 2.5;
    c.first_k_dense_replace = 3;
    c.q_lora_rank = 1536;
    c.max_position_embeddings = 4096;
    c.bos_token_id = 0;
    c.eos_token_ids = {1};
  } else {
    c.architecture = "DeepseekV2ForCausalLM";
    c.model_type = "deepseek_v2";
    c.vocab_size = 32000;
    c.hidden_size = 4096;
    c.intermediate_size = 11008;
    c.moe_intermediate_size = 1407;
    c.num_hidden_layers = 32;
    c.num_attention_heads = 32;
    c.n_shared_experts = 2;
    c.n_routed_experts = 64;
    c.num_experts_per_tok = 0;  // null in HF: must be given when there are routed experts
    c.n_group = 1;
    c.topk_group = 1;
    c.topk_method = TopkMethod::kGreedy;
    c.scoring_func = ScoringFunc::kSoftmax;
    c.norm_topk_prob = false;
    c.routed_scaling_factor = 1.0;
    c.first_k_dense_replace = 0;
    c.q_lora_rank = 1536;
    c.max_position_embeddings = 2048;
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
  }
  c.kv_lora_rank = 512;
  c.qk_rope_head_dim = 64;
  c.qk_nope_head_dim = 128;
  c.v_head_dim = 128;
  c.moe_layer_freq = 1;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.num_nextn_predict_layers = 0;
  c.tie_word_embeddings = false;
  return c;
}

bool family_of_architecture(const std::string& arch, Family* out) {
  if (arch == "DeepseekV3ForCausalLM") { *out = Family::kV3; return true; }
  if (arch == "DeepseekV2ForCausalLM") { *out = Family::kV2; return true; }
  return false;
}

bool family_of_model_type(const std::string& type, Family* out) {
  if (type == "deepseek_v3") { *out = Family::kV3; return true; }
  if (type == "deepseek_v2") { *out = Family::kV2; return true; }
  return false;
}

void read_rope_scaling(const FieldReader& top, const json& j, const std::string& source,
                       const std::string& key, ModelConfig* c) {
  const json& rs = j.at(key);
  if (!rs.is_object()) top.fail(key, "must be an object or null");
  FieldReader r(rs, source, key + ".");
  std::string type = r.get_string("type", r.get_string("rope_type", ""));
  // transformers 5.x writes rope_parameters {rope_type: "default", rope_theta} for plain RoPE.
  if (type == "default") type.clear();
  if (!type.empty() && type != "yarn") {
    r.fail(r.given("type") ? "type" : "rope_type",
           "is \"" + type + "\"; only \"yarn\" (or no scaling) is supported");
  }
  c->rope_theta = r.get_double("rope_theta", c->rope_theta);
  c->rope_scaling.type = type;
  if (type.empty()) return;
  RopeScaling& s = c->rope_scaling;
  s.factor = r.get_double("factor", s.factor);
  s.original_max_position_embeddings =
      r.get_int("original_max_position_embeddings", c->max_position_embeddings);
  s.beta_fast = r.get_double("beta_fast", s.beta_fast);
  s.beta_slow = r.get_double("beta_slow", s.beta_slow);
  s.mscale = r.get_double("mscale", s.mscale);
  s.mscale_all_dim = r.get_double("mscale_all_dim", s.mscale_all_dim);
  if (!(s.factor >= 1.0)) r.fail("factor", "must be >= 1");
  if (s.original_max_position_embeddings <= 0) r.fail("original_max_position_embeddings", "must be positive");
  if (!(s.beta_fast > 0.0) || !(s.beta_slow > 0.0)) r.fail("beta_fast", "and beta_slow must be positive");
}

void read_quantization(const FieldReader& top, const json& j, const std::string& source, ModelConfig* c) {
  const json& q = j.at("quantization_config");
  if (!q.is_object()) top.fail("quantization_config", "must be an object or null");
  FieldReader r(q, source, "quantization_config.");
  std::string method = r.get_string("quant_method", "");
  if (method != "fp8") {
    r.fail("quant_method", "is \"" + method + "\"; only \"fp8\" (block-scaled e4m3) is supported");
  }
  std::string fmt = r.get_string("fmt", "e4m3");
  if (fmt != "e4m3") r.fail("fmt", "is \"" + fmt + "\"; only \"e4m3\" is supported");
  std::string scheme = r.get_string("activation_scheme", "dynamic");
  if (scheme != "dynamic") r.fail("activation_scheme", "is \"" + scheme + "\"; only \"dynamic\" is supported");
  c->fp8.enabled = true;
  if (r.given("weight_block_size")) {
    const json& b = q.at("weight_block_size");
    if (!b.is_array() || b.size() != 2) r.fail("weight_block_size", "must be [rows, cols]");
    c->fp8.block_rows = r.to_int("weight_block_size", b[0]);
    c->fp8.block_cols = r.to_int("weight_block_size", b[1]);
    if (c->fp8.block_rows <= 0 || c->fp8.block_cols <= 0) r.fail("weight_block_size", "must be positive");
  }
}

void validate(const ModelConfig& c, const FieldReader& r) {
  auto positive = [&](const char* name, int v) {
    if (v <= 0) r.fail(name, "must be positive, got " + std::to_string(v));
  };
  auto non_negative = [&](const char* name, int v) {
    if (v < 0) r.fail(name, "must not be negative, got " + std::to_string(v));
  };
  positive("vocab_size", c.vocab_size);
  positive("hidden_size", c.hidden_size);
  positive("num_hidden_layers", c.num_hidden_layers);
  positive("num_attention_heads", c.num_attention_heads);
  positive("kv_lora_rank", c.kv_lora_rank);
  positive("qk_rope_head_dim", c.qk_rope_head_dim);
  positive("qk_nope_head_dim", c.qk_nope_head_dim);
  positive("v_head_dim", c.v_head_dim);
  positive("max_position_embeddings", c.max_position_embeddings);
  positive("moe_layer_freq", c.moe_layer_freq);
  non_negative("q_lora_rank", c.q_lora_rank);
  non_negative("first_k_dense_replace", c.first_k_dense_replace);
  non_negative("num_nextn_predict_layers", c.num_nextn_predict_layers);
  non_negative("n_routed_experts", c.n_routed_experts);
  non_negative("n_shared_experts", c.n_shared_experts);
  // RoPE rotates pairs of values.
  if (c.qk_rope_head_dim % 2 != 0) r.fail("qk_rope_head_dim", "must be even");
  if (!(c.rms_norm_eps > 0.0)) r.fail("rms_norm_eps", "must be positive");
  if (!(c.rope_theta > 0.0)) r.fail("rope_theta", "must be positive");
  if (!(c.routed_scaling_factor > 0.0)) r.fail("routed_scaling_factor", "must be positive");

  // Upper bounds far above any published model; they keep a corrupt config from asking for
  // billions of tensors or overflowing shape arithmetic.
  auto at_most = [&](const char* name, int v, int limit) {
    if (v > limit) r.fail(name, "is " + std::to_string(v) + ", implausibly large (limit " + std::to_string(limit) + ")");
  };
  at_most("num_hidden_layers", c.num_hidden_layers, kMaxLayers);
  at_most("num_nextn_predict_layers", c.num_nextn_predict_layers, kMaxLayers);
  at_most("n_routed_experts", c.n_routed_experts, kMaxExperts);
  at_most("n_shared_experts", c.n_shared_experts, kMaxExperts);
  for (auto [name, v] : {std::pair{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
                         {"intermediate_size", c.intermediate_size}, {"moe_intermediate_size", c.moe_intermediate_size},
                         {"num_attention_heads", c.num_attention_heads}, {"q_lora_rank", c.q_lora_rank},
                         {"kv_lora_rank", c.kv_lora_rank}, {"qk_rope_head_dim", c.qk_rope_head_dim},
                         {"qk_nope_head_dim", c.qk_nope_head_dim}, {"v_head_dim", c.v_head_dim}}) {
    at_most(name, v, kMaxDim);
  }
  const int num_layers = c.num_hidden_layers + c.num_nextn_predict_layers;
  if (static_cast<int64_t>(num_layers) * (c.n_routed_experts + 1) > kMaxLayerExperts) {
    r.fail("n_routed_experts", "times the number of layers is implausibly large (limit " +
                                   std::to_string(kMaxLayerExperts) + ")");
  }
  bool any_dense = false, any_moe = false;
  for (int layer = 0; layer < num_layers; ++layer) {
    (c.is_moe_layer(layer) ? any_moe : any_dense) = true;
  }
  if (any_dense) positive("intermediate_size", c.intermediate_size);
  if (any_moe) {
    positive("moe_intermediate_size", c.moe_intermediate_size);
    positive("num_experts_per_tok", c.num_experts_per_tok);
    positive("n_group", c.n_group);
    positive("topk_group", c.topk_group);
    if (c.num_experts_per_tok > c.n_routed_experts) {
      r.fail("num_experts_per_tok", "(" + std::to_string(c.num_experts_per_tok) +
                                        ") must not exceed n_routed_experts (" +
                                        std::to_string(c.n_routed_experts) + ")");
    }
    if (c.n_routed_experts % c.n_group != 0) {
      r.fail("n_group", "(" + std::to_string(c.n_group) + ") must divide n_routed_experts (" +
                            std::to_string(c.n_routed_experts) + ")");
    }
    if (c.topk_group > c.n_group) {
      r.fail("topk_group", "(" + std::to_string(c.topk_group) + ") must not exceed n_group (" +
                               std::to_string(c.n_group) + ")");
    }
    const int experts_per_group = c.n_routed_experts / c.n_group;
    if (c.topk_method != TopkMethod::kGreedy &&
        c.num_experts_per_tok > c.topk_group * experts_per_group) {
      r.fail("num_experts_per_tok", "exceeds the experts in topk_group groups (" +
                                        std::to_string(c.topk_group * experts_per_group) + ")");
    }
    // noaux_tc scores a group by the sum of its two best experts.
    if (c.topk_method == TopkMethod::kNoauxTc && experts_per_group < 2) {
      r.fail("n_group", "leaves fewer than 2 experts per group, which noaux_tc needs");
    }
  }
  if (c.bos_token_id >= c.vocab_size) r.fail("bos_token_id", "is outside the vocabulary");
  for (int id : c.eos_token_ids) {
    if (id < 0 || id >= c.vocab_size) r.fail("eos_token_id", "holds " + std::to_string(id) + ", outside the vocabulary");
  }
}

}  // namespace

const char* topk_method_name(TopkMethod method) {
  switch (method) {
    case TopkMethod::kGreedy: return "greedy";
    case TopkMethod::kGroupLimitedGreedy: return "group_limited_greedy";
    case TopkMethod::kNoauxTc: return "noaux_tc";
  }
  return "?";
}

const char* scoring_func_name(ScoringFunc func) {
  switch (func) {
    case ScoringFunc::kSoftmax: return "softmax";
    case ScoringFunc::kSigmoid: return "sigmoid";
  }
  return "?";
}

bool ModelConfig::is_moe_layer(int layer) const {
  return n_routed_experts > 0 && layer >= first_k_dense_replace && moe_layer_freq > 0 &&
         layer % moe_layer_freq == 0;
}

ModelConfig ModelConfig::from_json(const nlohmann::json& j, const std::string& source_name) {
  if (!j.is_object()) {
    throw Error(StatusCode::kInvalidArgument, source_name + ": config must be a JSON object");
  }
  FieldReader r(j, source_name);

  // The family (and so the defaults) comes from "architectures"; model_type only when that is
  // absent. Other model_type strings are kept for checkpoints that reuse the architecture.
  Family family = Family::kV3;
  std::string architecture;
  if (r.given("architectures")) {
    const json& a = j.at("architectures");
    if (!a.is_array() || a.empty()) r.fail("architectures", "must be a non-empty list");
    for (const json& name : a) {
      if (name.is_string() && family_of_architecture(name.get<std::string>(), &family)) {
        architecture = name.get<std::string>();
        break;
      }
    }
    if (architecture.empty()) {
      r.fail("architectures", "is " + a.dump() +
                                  "; supported: DeepseekV3ForCausalLM, DeepseekV2ForCausalLM");
    }
  }
  std::string model_type = r.get_string("model_type", "");
  if (architecture.empty()) {
    if (model_type.empty()) {
      r.fail("architectures", "is missing (and so is model_type); cannot tell the model family");
    }
    if (!family_of_model_type(model_type, &family)) {
      r.fail("model_type", "is \"" + model_type + "\"; supported: deepseek_v3, deepseek_v2");
    }
  }

  ModelConfig c = family_defaults(family);
  if (!architecture.empty()) c.architecture = architecture;
  if (!model_type.empty()) c.model_type = model_type;

  c.vocab_size = r.get_int("vocab_size", c.vocab_size);
  c.hidden_size = r.get_int("hidden_size", c.hidden_size);
  c.intermediate_size = r.get_int("intermediate_size", c.intermediate_size);
  c.moe_intermediate_size = r.get_int("moe_intermediate_size", c.moe_intermediate_size);
  c.num_hidden_layers = r.get_int("num_hidden_layers", c.num_hidden_layers);
  c.num_attention_heads = r.get_int("num_attention_heads", c.num_attention_heads);
  c.n_shared_experts = r.get_int("n_shared_experts", c.n_shared_experts);
  // null n_routed_experts means a dense model in DeepSeek's original code.
  c.n_routed_experts = r.present_null("n_routed_experts") ? 0 : r.get_int("n_routed_experts", c.n_routed_experts);
  c.num_experts_per_tok = r.get_int("num_experts_per_tok", c.num_experts_per_tok);
  // null n_group / topk_group mean one group.
  c.n_group = r.present_null("n_group") ? 1 : r.get_int("n_group", c.n_group);
  c.topk_group = r.present_null("topk_group") ? 1 : r.get_int("topk_group", c.topk_group);

  if (r.given("topk_method")) {
    std::string m = r.get_string("topk_method", "");
    if (m == "greedy") c.topk_method = TopkMethod::kGreedy;
    else if (m == "group_limited_greedy") c.topk_method = TopkMethod::kGroupLimitedGreedy;
    else if (m == "noaux_tc") c.topk_method = TopkMethod::kNoauxTc;
    else r.fail("topk_method", "is \"" + m + "\"; supported: greedy, group_limited_greedy, noaux_tc");
  }
  if (r.given("scoring_func")) {
    std::string s = r.get_string("scoring_func", "");
    if (s == "softmax") c.scoring_func = ScoringFunc::kSoftmax;
    else if (s == "sigmoid") c.scoring_func = ScoringFunc::kSigmoid;
    else r.fail("scoring_func", "is \"" + s + "\"; supported: softmax, sigmoid");
  }
  c.norm_topk_prob = r.get_bool("norm_topk_prob", c.norm_topk_prob);
  // Fields the forward pass does not implement: refuse rather than compute something else.
  const std::string act = r.get_string("hidden_act", "silu");
  if (act != "silu") r.fail("hidden_act", "is \"" + act + "\"; only \"silu\" is supported");
  if (r.get_bool("attention_bias", false)) r.fail("attention_bias", "is true; attention projections without bias only");
  if (!r.get_bool("rope_interleave", true)) r.fail("rope_interleave", "is false; only interleaved RoPE pairs are supported");
  c.routed_scaling_factor = r.get_double("routed_scaling_factor", c.routed_scaling_factor);
  c.first_k_dense_replace = r.get_int("first_k_dense_replace", c.first_k_dense_replace);
  c.moe_layer_freq = r.get_int("moe_layer_freq", c.moe_layer_freq);
  // q_lora_rank null means q_proj is a plain [heads*qk_head_dim, hidden] projection.
  c.q_lora_rank = r.present_null("q_lora_rank") ? 0 : r.get_int("q_lora_rank", c.q_lora_rank);
  c.kv_lora_rank = r.get_int("kv_lora_rank", c.kv_lora_rank);
  c.qk_rope_head_dim = r.get_int("qk_rope_head_dim", c.qk_rope_head_dim);
  c.qk_nope_head_dim = r.get_int("qk_nope_head_dim", c.qk_nope_head_dim);
  c.v_head_dim = r.get_int("v_head_dim", c.v_head_dim);
  c.rms_norm_eps = r.get_double("rms_norm_eps", c.rms_norm_eps);
  c.num_nextn_predict_layers = r.get_int("num_nextn_predict_layers", c.num_nextn_predict_layers);
  c.max_position_embeddings = r.get_int("max_position_embeddings", c.max_position_embeddings);
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", c.tie_word_embeddings);
  c.rope_theta = r.get_double("rope_theta", c.rope_theta);
  // Hub configs say rope_scaling; transformers 5.x saves rope_parameters. rope_scaling wins.
  if (r.given("rope_scaling")) {
    read_rope_scaling(r, j, source_name, "rope_scaling", &c);
  } else if (r.given("rope_parameters")) {
    read_rope_scaling(r, j, source_name, "rope_parameters", &c);
  }
  if (r.given("quantization_config")) read_quantization(r, j, source_name, &c);

  if (r.present_null("bos_token_id")) c.bos_token_id = -1;
  else c.bos_token_id = r.get_int("bos_token_id", c.bos_token_id);
  if (r.present_null("eos_token_id")) {
    c.eos_token_ids.clear();
  } else if (r.given("eos_token_id")) {
    const json& e = j.at("eos_token_id");
    c.eos_token_ids.clear();
    if (e.is_array()) {
      for (const json& id : e) c.eos_token_ids.push_back(r.to_int("eos_token_id", id));
    } else {
      c.eos_token_ids.push_back(r.to_int("eos_token_id", e));
    }
  }

  validate(c, r);
  return c;
}

ModelConfig ModelConfig::load(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  // A config is a few KB; refuse to slurp something that is clearly not one.
  const json j = read_json_file(path, size_t{16} << 20, StatusCode::kInvalidArgument, "a config",
                                " (does the model directory exist?)");
  return from_json(j, path);
}

}  // namespace dsinfer

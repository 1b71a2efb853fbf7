#include "model/expected_tensors.h"

#include <map>
#include <set>

#include "core/status.h"

namespace dsinfer {

namespace {

constexpr size_t kMaxReportedProblems = 20;
constexpr std::string_view kScaleSuffix = "_scale_inv";

class ListBuilder {
 public:
  explicit ListBuilder(std::vector<ExpectedTensor>* out) : out_(out) {}
  int mtp_layer = -1;
  bool optional = false;

  void norm(const std::string& name, int64_t dim) { add(name, {dim}, false); }
  void linear(const std::string& name, int64_t rows, int64_t cols) { add(name, {rows, cols}, true); }
  void plain(const std::string& name, std::vector<int64_t> shape) { add(name, std::move(shape), false); }
  void add(const std::string& name, std::vector<int64_t> shape, bool quantizable) {
    out_->push_back({name, std::move(shape), quantizable, optional, mtp_layer});
  }

 private:
  std::vector<ExpectedTensor>* out_;
};

void add_decoder_layer(const ModelConfig& c, int layer, ListBuilder& b) {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  const int64_t hidden = c.hidden_size;
  const int64_t heads = c.num_attention_heads;
  b.norm(p + "input_layernorm.weight", hidden);
  b.norm(p + "post_attention_layernorm.weight", hidden);
  const std::string a = p + "self_attn.";
  if (c.q_lora_rank > 0) {
    b.linear(a + "q_a_proj.weight", c.q_lora_rank, hidden);
    b.norm(a + "q_a_layernorm.weight", c.q_lora_rank);
    b.linear(a + "q_b_proj.weight", heads * c.qk_head_dim(), c.q_lora_rank);
  } else {
    b.linear(a + "q_proj.weight", heads * c.qk_head_dim(), hidden);
  }
  b.linear(a + "kv_a_proj_with_mqa.weight", c.kv_lora_rank + c.qk_rope_head_dim, hidden);
  b.norm(a + "kv_a_layernorm.weight", c.kv_lora_rank);
  b.linear(a + "kv_b_proj.weight", heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
  b.linear(a + "o_proj.weight", hidden, heads * c.v_head_dim);

  const std::string m = p + "mlp.";
  auto mlp = [&](const std::string& prefix, int64_t inter) {
    b.linear(prefix + "gate_proj.weight", inter, hidden);
    b.linear(prefix + "up_proj.weight", inter, hidden);
    b.linear(prefix + "down_proj.weight", hidden, inter);
  };
  if (c.is_moe_layer(layer)) {
    b.plain(m + "gate.weight", {c.n_routed_experts, hidden});
    if (c.topk_method == TopkMethod::kNoauxTc) b.plain(m + "gate.e_score_correction_bias", {c.n_routed_experts});
    for (int e = 0; e < c.n_routed_experts; ++e) mlp(m + "experts." + std::to_string(e) + ".", c.moe_intermediate_size);
    if (c.n_shared_experts > 0) {
      mlp(m + "shared_experts.", static_cast<int64_t>(c.moe_intermediate_size) * c.n_shared_experts);
    }
  } else {
    mlp(m, c.intermediate_size);
  }
}

bool float_dtype(DType d) { return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

std::vector<int64_t> fp8_scale_shape(const std::vector<int64_t>& shape, const Fp8Quantization& fp8) {
  if (shape.size() != 2) return {};
  return {ceil_div(shape[0], fp8.block_rows), ceil_div(shape[1], fp8.block_cols)};
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  std::vector<ExpectedTensor> out;
  ListBuilder b(&out);
  const int64_t vocab = c.vocab_size, hidden = c.hidden_size;
  b.plain("model.embed_tokens.weight", {vocab, hidden});
  b.norm("model.norm.weight", hidden);
  if (!c.tie_word_embeddings) b.plain("lm_head.weight", {vocab, hidden});
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) add_decoder_layer(c, layer, b);

  for (int layer = c.num_hidden_layers; layer < c.num_hidden_layers + c.num_nextn_predict_layers; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    b.optional = true;
    b.mtp_layer = layer;
    add_decoder_layer(c, layer, b);
    b.norm(p + "enorm.weight", hidden);
    b.norm(p + "hnorm.weight", hidden);
    b.linear(p + "eh_proj.weight", hidden, 2 * hidden);
    b.norm(p + "shared_head.norm.weight", hidden);
    b.plain(p + "shared_head.head.weight", {vocab, hidden});
    // The hub's V3 repeats the embedding in the MTP layer; converted checkpoints often share it.
    b.mtp_layer = -1;
    b.plain(p + "embed_tokens.weight", {vocab, hidden});
  }
  return out;
}

bool has_mtp_layer(const Checkpoint& ckpt, const ModelConfig& config, int layer) {
  bool any = false;
  for (const ExpectedTensor& t : expected_tensors(config)) {
    if (t.mtp_layer != layer) continue;
    any = true;
    if (!ckpt.has(t.name)) return false;
  }
  return any;
}

void validate_checkpoint(const Checkpoint& ckpt, const ModelConfig& config) {
  std::vector<std::string> problems;
  size_t num_problems = 0;
  auto problem = [&](std::string what) {
    ++num_problems;
    if (problems.size() < kMaxReportedProblems) problems.push_back(std::move(what));
  };

  const std::vector<ExpectedTensor> expected = expected_tensors(config);
  std::set<std::string, std::less<>> known;  // expected names and their legitimate scale tensors

  // MTP layers are all-or-nothing: a partial one is a broken export, not an absent feature.
  std::map<int, std::pair<int, int>> mtp_counts;  // layer -> (present, total)
  for (const ExpectedTensor& t : expected) {
    if (t.mtp_layer < 0) continue;
    auto& [present, total] = mtp_counts[t.mtp_layer];
    ++total;
    if (ckpt.has(t.name)) ++present;
  }

  for (const ExpectedTensor& t : expected) {
    known.insert(t.name);
    const TensorInfo* info = ckpt.find(t.name);
    if (info == nullptr) {
      if (t.mtp_layer >= 0) {
        // One line per incomplete MTP layer rather than dozens of missing expert weights.
        auto& [present, total] = mtp_counts[t.mtp_layer];
        if (present > 0 && present < total) {
          problem("MTP layer " + std::to_string(t.mtp_layer) + " is incomplete: " + std::to_string(present) +
                  " of " + std::to_string(total) + " tensors present, missing e.g. " + t.name + " " +
                  shape_to_string(t.shape));
          present = total;  // reported
        }
      } else if (!t.optional) {
        problem("missing tensor " + t.name + " " + shape_to_string(t.shape));
      }
      continue;
    }
    if (info->shape != t.shape) {
      problem("tensor " + t.name + " has shape " + shape_to_string(info->shape) + ", expected " +
              shape_to_string(t.shape) + " (in " + info->file + ")");
      continue;
    }
    const std::string scale_name = t.name + std::string(kScaleSuffix);
    if (info->dtype == DType::kF8E4M3 && t.quantizable) {
      if (!config.fp8.enabled) {
        problem("tensor " + t.name + " is F8_E4M3 but config.json has no fp8 quantization_config (in " +
                info->file + ")");
        continue;
      }
      known.insert(scale_name);
      const TensorInfo* scale = ckpt.find(scale_name);
      const std::vector<int64_t> scale_shape = fp8_scale_shape(t.shape, config.fp8);
      if (scale == nullptr) {
        problem("missing tensor " + scale_name + " " + shape_to_string(scale_shape) + " (F32 scales of F8_E4M3 " +
                t.name + ")");
      } else if (scale->dtype != DType::kF32) {
        problem("tensor " + scale_name + " has dtype " + dtype_name(scale->dtype) + ", expected F32 (in " +
                scale->file + ")");
      } else if (scale->shape != scale_shape) {
        problem("tensor " + scale_name + " has shape " + shape_to_string(scale->shape) + ", expected " +
                shape_to_string(scale_shape) + " for " + std::to_string(config.fp8.block_rows) + "x" +
                std::to_string(config.fp8.block_cols) + " blocks (in " + scale->file + ")");
      }
    } else if (!float_dtype(info->dtype)) {
      problem("tensor " + t.name + " has dtype " + dtype_name(info->dtype) + ", expected " +
              (t.quantizable ? "BF16, F16, F32 or F8_E4M3" : "BF16, F16 or F32") + " (in " + info->file + ")");
    }
  }

  for (const std::string& name : ckpt.names()) {
    if (known.count(name)) continue;
    std::string why;
    if (name.ends_with(kScaleSuffix)) {
      const std::string_view weight = std::string_view(name).substr(0, name.size() - kScaleSuffix.size());
      const TensorInfo* w = ckpt.find(weight);
      if (w != nullptr && w->dtype != DType::kF8E4M3) why = " (its weight is " + std::string(dtype_name(w->dtype)) + ", not F8_E4M3)";
    }
    problem("unexpected tensor " + name + why + " (in " + ckpt.get(name).file + ")");
  }

  if (num_problems == 0) return;
  std::string msg = ckpt.dir() + ": checkpoint does not match its config (" + config.architecture + ", " +
                    std::to_string(config.num_hidden_layers) + " layers): " + std::to_string(num_problems) +
                    " problem" + (num_problems == 1 ? "" : "s");
  if (num_problems > problems.size()) msg += ", first " + std::to_string(problems.size());
  for (const std::string& p : problems) msg += "\n  " + p;
  throw Error(StatusCode::kInvalidArgument, msg);
}

}  // namespace dsinfer

// `dsinfer inspect`: reads a model directory's config.json and safetensors, checks them
// against each other, and prints a JSON summary. Exit 0 when the checkpoint is complete and
// consistent, 1 (with the problems on stderr) when it is not, 2 on usage errors.
#include <cstdio>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "command.h"
#include "model/checkpoint.h"
#include "model/expected_tensors.h"
#include "model/model_config.h"

namespace dsinfer::cli {
namespace {

int usage_error(const std::string& msg) {
  std::fprintf(stderr, "dsinfer inspect: %s (see --help)\n", msg.c_str());
  return 2;
}

nlohmann::json config_summary(const ModelConfig& c) {
  return {{"architecture", c.architecture},
          {"model_type", c.model_type},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_attention_heads", c.num_attention_heads},
          {"q_lora_rank", c.q_lora_rank},
          {"kv_lora_rank", c.kv_lora_rank},
          {"qk_nope_head_dim", c.qk_nope_head_dim},
          {"qk_rope_head_dim", c.qk_rope_head_dim},
          {"v_head_dim", c.v_head_dim},
          {"first_k_dense_replace", c.first_k_dense_replace},
          {"n_routed_experts", c.n_routed_experts},
          {"n_shared_experts", c.n_shared_experts},
          {"num_experts_per_tok", c.num_experts_per_tok},
          {"n_group", c.n_group},
          {"topk_group", c.topk_group},
          {"topk_method", topk_method_name(c.topk_method)},
          {"scoring_func", scoring_func_name(c.scoring_func)},
          {"norm_topk_prob", c.norm_topk_prob},
          {"routed_scaling_factor", c.routed_scaling_factor},
          {"rope_theta", c.rope_theta},
          {"rope_scaling", c.rope_scaling.type.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.rope_scaling.type)},
          {"max_position_embeddings", c.max_position_embeddings},
          {"num_nextn_predict_layers", c.num_nextn_predict_layers},
          {"fp8", c.fp8.enabled},
          {"bos_token_id", c.bos_token_id},
          {"eos_token_ids", c.eos_token_ids},
          {"tie_word_embeddings", c.tie_word_embeddings}};
}

int run_inspect(int argc, char** argv) {
  std::string model = default_model_dir();
  bool list_tensors = false, quiet = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: dsinfer inspect [--model DIR] [--tensors] [--quiet]\n"
          "Checks DIR's config.json against its safetensors (model.safetensors or the shards of\n"
          "model.safetensors.index.json) and prints a JSON summary; --tensors lists every tensor.\n"
          "Exits 1 naming the first problems when tensors are missing, unexpected or ill-shaped.\n"
          "--quiet hides the progress line that large checkpoints print to stderr.\n");
      return 0;
    } else if (a == "--model") {
      if (i + 1 >= argc) return usage_error("--model needs a value");
      model = argv[++i];
    } else if (a == "--tensors") {
      list_tensors = true;
    } else if (a == "--quiet") {
      quiet = true;
    } else {
      return usage_error("unknown option " + a);
    }
  }

  const ModelConfig config = ModelConfig::load(model);
  LoadProgressPrinter printer("mapping weights");
  auto ckpt = Checkpoint::open(model, quiet ? Checkpoint::ProgressFn() : Checkpoint::ProgressFn(std::ref(printer)));
  validate_checkpoint(*ckpt, config);

  std::map<std::string, size_t> bytes_by_dtype;
  int64_t num_params = 0;
  nlohmann::json tensors = nlohmann::json::array();
  for (const std::string& name : ckpt->names()) {
    const TensorInfo& t = ckpt->get(name);
    bytes_by_dtype[dtype_name(t.dtype)] += t.num_bytes;
    if (!name.ends_with("_scale_inv")) num_params += t.num_elements();
    if (list_tensors) {
      tensors.push_back({{"name", name}, {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"file", t.file}});
    }
  }
  nlohmann::json mtp_present = nlohmann::json::array();
  for (int l = config.num_hidden_layers; l < config.num_hidden_layers + config.num_nextn_predict_layers; ++l) {
    if (has_mtp_layer(*ckpt, config, l)) mtp_present.push_back(l);
  }
  nlohmann::json out = {{"model_dir", model},
                        {"valid", true},
                        {"config", config_summary(config)},
                        {"num_files", ckpt->files().size()},
                        {"num_tensors", ckpt->num_tensors()},
                        {"num_params", num_params},
                        {"total_bytes", ckpt->total_bytes()},
                        {"bytes_by_dtype", bytes_by_dtype},
                        {"mtp_layers_present", mtp_present}};
  if (list_tensors) out["tensors"] = std::move(tensors);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

DSINFER_REGISTER_COMMAND(inspect, "inspect", "check a model directory's config and weights; print a summary",
                         run_inspect);

}  // namespace dsinfer::cli

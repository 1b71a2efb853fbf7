#include "model/deepseek_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "core/check.h"
#include "core/dtype.h"
#include "core/random_normal.h"
#include "core/shape.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "model/expected_tensors.h"
#include "model/weights_fp8.h"

namespace dsinfer {
namespace {

// Default-initialises its elements, i.e. leaves floats unwritten: every producer of host
// values below writes each of them, and a full-size model's ~1e10 values would otherwise be
// zeroed on one thread before being written (in parallel).
template <typename T>
struct UninitialisedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitialisedAllocator<U>;
  };
  UninitialisedAllocator() = default;
  template <typename U>
  UninitialisedAllocator(const UninitialisedAllocator<U>&) noexcept {}
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    if constexpr (sizeof...(Args) == 0)
      ::new (static_cast<void*>(p)) U;
    else
      ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
// A tensor's fp32 values in host memory.
using HostValues = std::vector<float, UninitialisedAllocator<float>>;

// A tensor source: either a checkpoint or a random generator, so both paths share the layout
// code below. Writes the tensor, widened to fp32 (FP8 block scales applied), to `out`, which
// holds as many floats as the shape has elements (so that two halves can land side by side).
using FetchFn = std::function<void(const std::string& name, const std::vector<int64_t>& shape, float* out)>;

HostValues fetch_values(const FetchFn& fetch, const std::string& name, const std::vector<int64_t>& shape) {
  HostValues values(num_elements(shape));
  fetch(name, shape, values.data());
  return values;
}

void widen(const TensorInfo& info, const Checkpoint& ckpt, const ModelConfig& config, float* out) {
  // Copy through an aligned buffer: tensors inside a mapping may be unaligned.
  std::vector<uint8_t> raw(info.data, info.data + info.num_bytes);
  if (info.dtype == DType::kF8E4M3) {
    const TensorInfo& scale = ckpt.get(info.name + "_scale_inv");
    std::vector<float> s(scale.num_elements());
    std::memcpy(s.data(), scale.data, scale.num_bytes);
    dequantize_fp8_block(raw.data(), s.data(), info.shape[0], info.shape[1], config.fp8.block_rows,
                         config.fp8.block_cols, out);
  } else {
    convert_to_f32(info.dtype, raw.data(), out, info.num_elements());
  }
}

// An F8_E4M3 checkpoint weight as stored, for backends that keep FP8 (Backend::wants_raw_fp8).
struct RawFp8 {
  std::vector<uint8_t> bytes;  // [rows, cols] e4m3
  std::vector<float> scales;   // [ceil(rows / block_rows), ceil(cols / block_cols)]
};
// Returns the raw form when the named tensor is FP8 and the backend wants it, else nothing.
using RawFp8Fn = std::function<std::optional<RawFp8>(const std::string& name, const std::vector<int64_t>& shape)>;

// A linear weight made by the backend without host values (random weights on the device): for
// the named tensor [rows, cols], or for a gate/up pair (up_name non-null, each [rows, cols]).
// Returns nothing where the backend or the tensor has no such path.
using BackendLinearFn = std::function<std::optional<LinearWeight>(const std::string& name, const std::string* up_name,
                                                                  int64_t rows, int64_t cols)>;

class WeightBuilder {
 public:
  WeightBuilder(const ModelConfig& config, Backend& backend, FetchFn fetch, RawFp8Fn raw_fp8 = nullptr,
                BackendLinearFn backend_linear = nullptr)
      : c_(config),
        be_(backend),
        fetch_(std::move(fetch)),
        raw_fp8_(std::move(raw_fp8)),
        backend_linear_(std::move(backend_linear)) {}

  Tensor vec(const std::string& name, int64_t n) { return host({n}, fetch(name, {n})); }
  Tensor mat(const std::string& name, int64_t rows, int64_t cols) {
    return host({rows, cols}, fetch(name, {rows, cols}));
  }
  LinearWeight linear(const std::string& name, int64_t out, int64_t in, bool routed_expert = false) {
    if (backend_linear_) {
      if (auto made = backend_linear_(name, nullptr, out, in)) return std::move(*made);
    }
    if (raw_fp8_) {
      if (auto raw = raw_fp8_(name, {out, in})) return fp8_linear(*raw, out, in);
    }
    const HostValues data = fetch(name, {out, in});
    HostTensor h{DType::kF32, {out, in}, data.data()};
    h.routed_expert = routed_expert;
    return be_.make_linear(h);
  }
  // gate and up stacked into one [2 * inter, in] weight, gate rows first.
  LinearWeight gate_up(const std::string& prefix, int64_t inter, int64_t in, bool routed_expert = false) {
    if (backend_linear_) {
      const std::string up_name = prefix + "up_proj.weight";
      if (auto made = backend_linear_(prefix + "gate_proj.weight", &up_name, inter, in)) return std::move(*made);
    }
    if (raw_fp8_) {
      auto gate = raw_fp8_(prefix + "gate_proj.weight", {inter, in});
      auto up = gate ? raw_fp8_(prefix + "up_proj.weight", {inter, in}) : std::nullopt;
      if (gate && up) {
        const int block_rows = stacked_block_rows(inter);
        const RawFp8 stacked = stack_gate_up(*gate, *up, inter, in, block_rows);
        return fp8_linear(stacked, 2 * inter, in, /*gate_up=*/true, block_rows);
      }
    }
    HostValues gate_up(2 * inter * in);
    fetch_(prefix + "gate_proj.weight", {inter, in}, gate_up.data());
    fetch_(prefix + "up_proj.weight", {inter, in}, gate_up.data() + inter * in);
    HostTensor h{DType::kF32, {2 * inter, in}, gate_up.data()};
    h.routed_expert = routed_expert;
    return be_.make_gate_up(h);
  }

  LayerWeights layer(int index) {
    const std::string p = "model.layers." + std::to_string(index) + ".";
    const int64_t hidden = c_.hidden_size, heads = c_.num_attention_heads;
    const int64_t qk = c_.qk_head_dim(), lora = c_.kv_lora_rank, rope = c_.qk_rope_head_dim;
    const int64_t nope = c_.qk_nope_head_dim, vdim = c_.v_head_dim;
    LayerWeights l;
    l.input_norm = vec(p + "input_layernorm.weight", hidden);
    l.post_attn_norm = vec(p + "post_attention_layernorm.weight", hidden);
    l.has_q_lora = c_.q_lora_rank > 0;
    if (l.has_q_lora) {
      l.q_a = linear(p + "self_attn.q_a_proj.weight", c_.q_lora_rank, hidden);
      l.q_a_norm = vec(p + "self_attn.q_a_layernorm.weight", c_.q_lora_rank);
      l.q_b = linear(p + "self_attn.q_b_proj.weight", heads * qk, c_.q_lora_rank);
    } else {
      l.q = linear(p + "self_attn.q_proj.weight", heads * qk, hidden);
    }
    l.kv_a = linear(p + "self_attn.kv_a_proj_with_mqa.weight", lora + rope, hidden);
    MlaWeights& m = l.mla;
    m.num_heads = static_cast<int>(heads);
    m.kv_lora_rank = static_cast<int>(lora);
    m.qk_nope_head_dim = static_cast<int>(nope);
    m.qk_rope_head_dim = static_cast<int>(rope);
    m.v_head_dim = static_cast<int>(vdim);
    m.kv_a_layernorm = vec(p + "self_attn.kv_a_layernorm.weight", lora);
    // kv_b_proj rows per head: [W_UK (nope rows); W_UV (v rows)], each row kv_lora wide.
    const HostValues kv_b = fetch(p + "self_attn.kv_b_proj.weight", {heads * (nope + vdim), lora});
    HostValues uk(heads * nope * lora), uv(heads * vdim * lora);
    for (int64_t h = 0; h < heads; ++h) {
      const float* base = kv_b.data() + h * (nope + vdim) * lora;
      std::copy_n(base, nope * lora, uk.data() + h * nope * lora);
      std::copy_n(base + nope * lora, vdim * lora, uv.data() + h * vdim * lora);
    }
    m.w_uk = host({heads, nope, lora}, std::move(uk));
    m.w_uv = host({heads, vdim, lora}, std::move(uv));
    be_.prepare(m);
    l.o_proj = linear(p + "self_attn.o_proj.weight", hidden, heads * vdim);

    l.is_moe = c_.is_moe_layer(index);
    if (!l.is_moe) {
      l.dense_gate_up = gate_up(p + "mlp.", c_.intermediate_size, hidden);
      l.dense_down = linear(p + "mlp.down_proj.weight", hidden, c_.intermediate_size);
      return l;
    }
    MoeWeights& moe = l.moe;
    const int64_t experts = c_.n_routed_experts, inter = c_.moe_intermediate_size;
    moe.num_experts = static_cast<int>(experts);
    moe.top_k = c_.num_experts_per_tok;
    moe.num_groups = c_.n_group;
    moe.topk_groups = c_.topk_group;
    moe.scoring = c_.scoring_func == ScoringFunc::kSigmoid ? GateScoring::kSigmoid : GateScoring::kSoftmax;
    moe.topk_method = c_.topk_method == TopkMethod::kNoauxTc              ? GateTopk::kNoauxTc
                      : c_.topk_method == TopkMethod::kGroupLimitedGreedy ? GateTopk::kGroupLimitedGreedy
                                                                          : GateTopk::kGreedy;
    moe.norm_topk_prob = c_.norm_topk_prob;
    moe.routed_scaling_factor = static_cast<float>(c_.routed_scaling_factor);
    moe.gate = mat(p + "mlp.gate.weight", experts, hidden);
    if (moe.topk_method == GateTopk::kNoauxTc)
      moe.score_correction_bias = vec(p + "mlp.gate.e_score_correction_bias", experts);
    for (int64_t e = 0; e < experts; ++e) {
      const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
      moe.expert_gate_up.push_back(gate_up(ep, inter, hidden, /*routed_expert=*/true));
      moe.expert_down.push_back(linear(ep + "down_proj.weight", hidden, inter, /*routed_expert=*/true));
    }
    moe.has_shared = c_.n_shared_experts > 0;
    if (moe.has_shared) {
      const int64_t shared_inter = inter * c_.n_shared_experts;
      moe.shared_gate_up = gate_up(p + "mlp.shared_experts.", shared_inter, hidden);
      moe.shared_down = linear(p + "mlp.shared_experts.down_proj.weight", hidden, shared_inter);
    }
    be_.prepare(moe);
    return l;
  }

  ModelWeights model(const std::function<bool(const std::string&)>& has) {
    ModelWeights w;
    const int64_t hidden = c_.hidden_size, vocab = c_.vocab_size;
    w.embed = mat("model.embed_tokens.weight", vocab, hidden);
    for (int i = 0; i < c_.num_hidden_layers; ++i) w.layers.push_back(layer(i));
    w.final_norm = vec("model.norm.weight", hidden);
    w.lm_head = linear(c_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", vocab, hidden);
    for (int i = 0; i < c_.num_nextn_predict_layers; ++i) {
      const int index = c_.num_hidden_layers + i;
      const std::string p = "model.layers." + std::to_string(index) + ".";
      if (!has(p + "eh_proj.weight")) break;  // checkpoints may ship without their MTP modules
      MtpWeights m;
      m.enorm = vec(p + "enorm.weight", hidden);
      m.hnorm = vec(p + "hnorm.weight", hidden);
      m.eh_proj = linear(p + "eh_proj.weight", hidden, 2 * hidden);
      m.layer = layer(index);
      m.head_norm = vec(p + "shared_head.norm.weight", hidden);
      m.head = has(p + "shared_head.head.weight") ? linear(p + "shared_head.head.weight", vocab, hidden) : w.lm_head;
      m.embed = has(p + "embed_tokens.weight") ? mat(p + "embed_tokens.weight", vocab, hidden) : w.embed;
      w.mtp.push_back(std::move(m));
    }
    return w;
  }

 private:
  LinearWeight fp8_linear(const RawFp8& raw, int64_t out, int64_t in, bool gate_up = false, int block_rows = 0) {
    HostTensor h{DType::kF8E4M3, {out, in}, raw.bytes.data(), raw.scales.data(),
                 block_rows > 0 ? block_rows : c_.fp8.block_rows, c_.fp8.block_cols};
    return gate_up ? be_.make_gate_up(h) : be_.make_linear(h);
  }

  // Rows per scale block of a stacked gate/up whose halves are `inter` rows each: the checkpoint's
  // block rows where each half fills whole blocks, else the largest count dividing both (an
  // intermediate size of 96 under 128-row blocks: 32), so that no block spans the two halves.
  int stacked_block_rows(int64_t inter) const {
    return static_cast<int>(std::gcd(inter, static_cast<int64_t>(c_.fp8.block_rows)));
  }

  // gate's rows, then up's, as one e4m3 weight with scale blocks of `block_rows` rows (a divisor of
  // the checkpoint's): each takes the scale of the checkpoint block that holds its rows. The
  // values stay exactly the checkpoint's, where widening them to be stacked would round them to
  // whatever the backend keeps (bf16 on the CUDA backend).
  RawFp8 stack_gate_up(const RawFp8& gate, const RawFp8& up, int64_t inter, int64_t in, int block_rows) const {
    const int64_t col_blocks = (in + c_.fp8.block_cols - 1) / c_.fp8.block_cols;
    const int64_t blocks_per_half = (inter + block_rows - 1) / block_rows;
    RawFp8 stacked;
    stacked.bytes.reserve(gate.bytes.size() + up.bytes.size());
    stacked.bytes.insert(stacked.bytes.end(), gate.bytes.begin(), gate.bytes.end());
    stacked.bytes.insert(stacked.bytes.end(), up.bytes.begin(), up.bytes.end());
    stacked.scales.reserve(2 * blocks_per_half * col_blocks);
    for (const RawFp8* half : {&gate, &up}) {
      for (int64_t b = 0; b < blocks_per_half; ++b) {
        const auto source = half->scales.begin() + (b * block_rows / c_.fp8.block_rows) * col_blocks;
        stacked.scales.insert(stacked.scales.end(), source, source + col_blocks);
      }
    }
    return stacked;
  }

  HostValues fetch(const std::string& name, const std::vector<int64_t>& shape) {
    return fetch_values(fetch_, name, shape);
  }

  Tensor host(std::vector<int64_t> shape, HostValues data) {
    HostTensor h{DType::kF32, std::move(shape), data.data()};
    return be_.from_host(h);
  }

  const ModelConfig& c_;
  Backend& be_;
  FetchFn fetch_;
  RawFp8Fn raw_fp8_;
  BackendLinearFn backend_linear_;
};

}  // namespace

ModelWeights load_model_weights(const ModelConfig& config, const Checkpoint& ckpt, Backend& backend) {
  validate_checkpoint(ckpt, config);
  FetchFn fetch = [&](const std::string& name, const std::vector<int64_t>& shape, float* out) {
    const TensorInfo& info = ckpt.get(name);
    if (info.shape != shape)
      throw Error(StatusCode::kInvalidArgument, "tensor " + name + " in " + info.file + " has shape " +
                                                    shape_to_string(info.shape) + ", expected " + shape_to_string(shape));
    widen(info, ckpt, config, out);
  };
  RawFp8Fn raw_fp8;
  if (backend.wants_raw_fp8()) {
    raw_fp8 = [&](const std::string& name, const std::vector<int64_t>& shape) -> std::optional<RawFp8> {
      const TensorInfo& info = ckpt.get(name);
      if (info.dtype != DType::kF8E4M3 || info.shape != shape || shape.size() != 2) return std::nullopt;
      const TensorInfo& scale = ckpt.get(name + "_scale_inv");
      const int64_t expected = ((shape[0] + config.fp8.block_rows - 1) / config.fp8.block_rows) *
                               ((shape[1] + config.fp8.block_cols - 1) / config.fp8.block_cols);
      if (scale.dtype != DType::kF32 || scale.num_elements() != expected)
        throw Error(StatusCode::kInvalidArgument, "tensor " + scale.name + " in " + scale.file + " has shape " +
                                                      shape_to_string(scale.shape) + ", expected " +
                                                      std::to_string(expected) + " fp32 block scales");
      RawFp8 raw;
      raw.bytes.assign(info.data, info.data + info.num_bytes);
      raw.scales.resize(scale.num_elements());
      std::memcpy(raw.scales.data(), scale.data, scale.num_bytes);
      return raw;
    };
  }
  WeightBuilder builder(config, backend, fetch, raw_fp8);
  return builder.model([&](const std::string& name) { return ckpt.has(name); });
}

namespace {

// How a random tensor's standard normal draws z become its values: norms 1 + 0.1 z, biases
// 0.05 |z|, anything else scale · z (scaled_values_scale).
enum class RandomValues { kNorm, kBias, kScaled };

RandomValues random_values_of(const std::string& name) {
  if (name.find("norm") != std::string::npos) return RandomValues::kNorm;
  if (name.find("bias") != std::string::npos) return RandomValues::kBias;
  return RandomValues::kScaled;
}

// Embeddings N(0, 1), matrices N(0, 1 / in), other vectors N(0, 0.01).
float scaled_values_scale(const std::string& name, const std::vector<int64_t>& shape) {
  if (name.find("embed_tokens") != std::string::npos) return 1.0f;
  return shape.size() == 2 ? 1.0f / std::sqrt(static_cast<float>(shape[1])) : 0.1f;
}

}  // namespace

ModelWeights make_random_weights(const ModelConfig& model_config, Backend& backend, uint64_t seed, bool fp8_linears) {
  ModelConfig config = model_config;
  if (fp8_linears) config.fp8 = Fp8Quantization{true, 128, 128};
  // Each tensor draws from a stream of its own.
  const auto seed_of = [seed](const std::string& name) { return seed ^ std::hash<std::string>{}(name); };
  FetchFn fetch = [&](const std::string& name, const std::vector<int64_t>& shape, float* v) {
    // Each tensor's values depend only on its name and the seed: value pair j comes from one
    // counter-based draw, so the tensor fills in parallel in any split (a full-size model has
    // ~1e10 values, most in expert matrices of a few million).
    const uint64_t base_seed = seed_of(name);
    const int64_t n = num_elements(shape);
    const RandomValues kind = random_values_of(name);
    const float scale = scaled_values_scale(name, shape);
    auto shaped = [&](float z) {
      if (kind == RandomValues::kNorm) return 1.0f + 0.1f * z;
      if (kind == RandomValues::kBias) return 0.05f * std::abs(z);
      return scale * z;
    };
    constexpr int64_t kPairsPerTask = int64_t{1} << 15;
    const int64_t num_pairs = (n + 1) / 2;
    auto fill_pairs = [&](int64_t task_begin, int64_t task_end) {
      const int64_t pair_end = std::min(num_pairs, task_end * kPairsPerTask);
      for (int64_t j = task_begin * kPairsPerTask; j < pair_end; ++j) {
        const NormalPair pair = normal_pair(random_word(base_seed, static_cast<uint64_t>(j)));
        v[2 * j] = shaped(pair.first);
        if (2 * j + 1 < n) v[2 * j + 1] = shaped(pair.second);
      }
    };
    const int64_t num_tasks = (num_pairs + kPairsPerTask - 1) / kPairsPerTask;
    if (num_tasks <= 1) fill_pairs(0, num_tasks);
    else global_thread_pool().parallel_for(num_tasks, fill_pairs, 1);
  };
  // FP8 as DeepSeek-V3 ships it: the projection matrices of the layers (kv_a_proj_with_mqa
  // too) in e4m3 with one scale per 128x128 block (amax / 448); embeddings, norms, router and
  // LM head stay wide, and kv_b_proj, which the attention absorbs, too.
  const auto fp8_projection = [](const std::string& name) {
    const auto ends_with = [&](std::string_view suffix) {
      return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    return name.rfind("model.layers.", 0) == 0 && (ends_with("_proj.weight") || ends_with("_proj_with_mqa.weight")) &&
           name.find("kv_b_proj") == std::string::npos;
  };
  RawFp8Fn raw_fp8;
  if (fp8_linears && backend.wants_raw_fp8()) {
    raw_fp8 = [&](const std::string& name, const std::vector<int64_t>& shape) -> std::optional<RawFp8> {
      if (!fp8_projection(name) || shape.size() != 2) return std::nullopt;
      const HostValues v = fetch_values(fetch, name, shape);
      const int64_t rows = shape[0], cols = shape[1], rb = (rows + 127) / 128, cb = (cols + 127) / 128;
      RawFp8 raw;
      raw.scales.assign(rb * cb, 0.0f);
      global_thread_pool().parallel_for(rb, [&](int64_t b, int64_t e) {
        for (int64_t block_row = b; block_row < e; ++block_row)
          for (int64_t r = block_row * 128; r < std::min(rows, (block_row + 1) * 128); ++r)
            for (int64_t c = 0; c < cols; ++c) {
              float& s = raw.scales[block_row * cb + c / 128];
              s = std::max(s, std::abs(v[r * cols + c]));
            }
      }, 1);
      for (float& s : raw.scales) s = e4m3_block_scale(s);
      raw.bytes.resize(rows * cols);
      global_thread_pool().parallel_for(rows, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r)
          for (int64_t c = 0; c < cols; ++c)
            raw.bytes[r * cols + c] = f32_to_fp8e4m3(v[r * cols + c] / raw.scales[(r / 128) * cb + c / 128]);
      }, 16);
      return raw;
    };
  }
  // Linear weights made on the device where the backend can: the values above, up to the last
  // bits of the device's logarithm, sine and cosine, without drawing, packing and copying them
  // here (most of a model's time to load).
  BackendLinearFn backend_linear = [&](const std::string& name, const std::string* up_name, int64_t rows,
                                       int64_t cols) -> std::optional<LinearWeight> {
    if (random_values_of(name) != RandomValues::kScaled) return std::nullopt;
    RandomLinearSpec spec;
    spec.out_features = rows;
    spec.in_features = cols;
    spec.seeds[0] = seed_of(name);
    if (up_name != nullptr) spec.seeds[1] = seed_of(*up_name);
    spec.scale = scaled_values_scale(name, {rows, cols});
    spec.gate_up = up_name != nullptr;
    // As the raw FP8 form above, gate and up each in blocks of their own.
    spec.fp8 = raw_fp8 != nullptr && fp8_projection(name) && (up_name == nullptr || fp8_projection(*up_name));
    return backend.make_random_linear(spec);
  };
  WeightBuilder builder(config, backend, fetch, raw_fp8, backend_linear);
  return builder.model([](const std::string& name) { return true; });
}

}  // namespace dsinfer

// The CPU backend: fp32 arithmetic throughout, weights widened to fp32 when prepared (FP8
// weights dequantised with their 128x128 block scales). The readable reference for all others.
//
// For precision studies it can round the inputs of the layers' products (linear(): the
// projections, the experts' and the LM head; not the router's logits or attention's absorbed
// products, which the CUDA backend keeps in fp32 too) to bf16 first, as the CUDA backend's
// products read them: DSINFER_CPU_PRODUCT_INPUTS=bf16 for every product, bf16-multirow for the
// products of steps of two rows or more only (a single sequence's decode steps then keep fp32
// inputs; an expert's rows count as their step's, since the engine picks a product's form by the
// step's rows). f16 rounds every product's inputs to f16 instead: ten mantissa bits (TF32's) at
// 0.955-0.980 of bf16's tensor-core rate on the H200 (bench_operand_types), the form an f16
// operand path would take; f16-multirow does so in steps of two rows or more, keeping one-row
// steps in fp32. f16-pairs also sums one-row products as the few-row walks sum f16 pairs (chains
// of four products in f16, then fp32), the form such a path's decode walks would take.
//
// DSINFER_CPU_FP8_ACTIVATIONS=D,E also runs DeepSeek's FP8 recipe where the CUDA backend does:
// products over e4m3 checkpoint weights read their inputs quantised per row and 128 columns to
// e4m3 under the tile's scale (its largest magnitude / 448) in steps of D rows or more (dense
// products and shared experts) and E rows or more (routed experts); "33,3" is the CUDA backend's
// default (cuBLASLt above 32 rows, the expert blocks past the few-row kernel's two tokens).
// D,E,T,M also reads the dense products' inputs of steps of D to M rows in T e4m3 terms, the
// CUDA backend's default "33,3,3,256" (CpuFp8Activations::dense_terms).
// DSINFER_CPU_EXPANDED_ATTENTION=bf16 runs prefill chunks of 64 tokens or more as the CUDA
// backend's expanded form does (cpu_attention.cpp): the gathered latent, the up-projected keys
// and values, the queries and the unnormalised probabilities in bf16; DSINFER_CPU_QUERY_TILES=bf16
// the other tokens of steps with a sequence of 16 or more as its query tiles do (bf16 queries,
// entries and probabilities, an fp32 cache only); DSINFER_CPU_HEAD_TILES=tf32 the steps its head
// tiles take (TF32 queries and probabilities, the entries' low mantissa bits ignored).
//
// DSINFER_CPU_ONE_ROW_BF16=routed,e4m3,W,... (with bf16-multirow only) keeps bf16 inputs in some
// of the one-row steps' products: the routed experts' (`routed`), those over e4m3 weights
// (`e4m3`: as the CUDA backend's few-row forms of e4m3 weights read them under
// DSINFER_FEW_ROW_F32_ROWS=bf16-weights; by default they read f16 pairs,
// CpuRoundings::one_row_e4m3_f16_pairs) and
// the other products whose inputs are W columns wide. It asks which of decode's products need
// fp32 rows for bf16-multirow's agreement; the widths name the products on a given checkpoint
// (its hidden size: the products after a norm; the heads' value width: o_proj; an intermediate
// size: a down product).
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"

namespace dsinfer {

enum class CpuProductInputs { kFp32, kBf16, kBf16MultiRow, kF16, kF16MultiRow, kF16Pairs };

// The smallest steps whose products over e4m3 weights take FP8 activations (0: none).
struct CpuFp8Activations {
  int64_t dense_min_rows = 0;
  int64_t routed_min_rows = 0;
  // Dense products of steps of dense_min_rows to dense_terms_max_rows rows read their inputs,
  // rounded to bf16, in dense_terms e4m3 terms: the recipe's rows, then the recipe's rows of
  // what the terms before leave (the CUDA backend's launch_quantize_rows_e4m3_terms, which it
  // runs in steps that carry a prompt: every such step of a teacher-forced reference). The routed
  // experts of those steps (of routed_min_rows rows or more) take as many terms.
  int dense_terms = 1;
  int64_t dense_terms_max_rows = 0;
  bool any() const { return dense_min_rows > 0 || routed_min_rows > 0; }
};

// One-row steps' products that keep bf16 inputs under kBf16MultiRow (none by default).
struct CpuOneRowBf16 {
  bool routed_experts = false;
  std::vector<int64_t> input_widths;  // of the products other than the routed experts'
  bool e4m3_weights = false;          // every product over e4m3 weights
  bool takes(int64_t input_width, bool routed_expert, bool e4m3_weight) const;
};

// Where the CPU backend rounds as the CUDA backend does (nowhere by default).
struct CpuRoundings {
  CpuProductInputs product_inputs = CpuProductInputs::kFp32;
  CpuFp8Activations fp8_activations{};
  bool bf16_expanded_attention = false;
  bool bf16_query_tiles = false;
  bool tf32_head_tiles = false;
  CpuOneRowBf16 one_row_bf16{};
  // One-row steps' products over e4m3 weights read f16 inputs, summed in f16 pairs (the few-row
  // e4m3 walks on fp32 rows, scaled_halves_of_f32x16).
  bool one_row_e4m3_f16_pairs = false;
  // Routed experts' weights other than e4m3 ones kept in bf16, as the CUDA backend's pack_weight
  // keeps them (its other weights take a second bf16 term where bf16 would round them): a float16
  // checkpoint's experts lose three bits of each value; a bf16 checkpoint's stay as they are.
  bool bf16_routed_expert_weights = false;
  // The CUDA backend's attention kernels' operands, with these products' inputs.
  static CpuRoundings cuda_attention_with(CpuProductInputs inputs, CpuFp8Activations fp8_activations = {}) {
    return {.product_inputs = inputs,
            .fp8_activations = fp8_activations,
            .bf16_expanded_attention = true,
            .bf16_query_tiles = true,
            .tf32_head_tiles = true,
            .one_row_bf16 = {},
            .one_row_e4m3_f16_pairs = false,
            .bf16_routed_expert_weights = false};
  }
  // The CUDA backend's default path: bf16 product inputs, but fp32 ones in one-row steps'
  // products over bf16 weights and f16 pairs over e4m3 ones (GroupedGemmArgs::x_f32), FP8
  // activations as it takes them (three terms in steps of up to 256 rows), its attention kernels'
  // operands, its weights.
  static CpuRoundings cuda_default() {
    CpuRoundings r = cuda_attention_with(CpuProductInputs::kBf16MultiRow, {33, 3, 3, 256});
    r.one_row_e4m3_f16_pairs = true;
    r.bf16_routed_expert_weights = true;
    return r;
  }
};

class CpuBackend : public Backend {
 public:
  using ProductInputs = CpuProductInputs;
  using Fp8Activations = CpuFp8Activations;

  // Roundings from DSINFER_CPU_PRODUCT_INPUTS, DSINFER_CPU_FP8_ACTIVATIONS,
  // DSINFER_CPU_EXPANDED_ATTENTION, DSINFER_CPU_QUERY_TILES, DSINFER_CPU_HEAD_TILES and
  // DSINFER_CPU_ONE_ROW_BF16 (none where they are unset).
  CpuBackend();
  explicit CpuBackend(ProductInputs inputs) { roundings_.product_inputs = inputs; }
  explicit CpuBackend(const CpuRoundings& roundings) : roundings_(roundings) {}
  const CpuRoundings& roundings() const { return roundings_; }

  std::string name() const override { return "cpu"; }
  // e4m3 weights come as stored where FP8 activations are asked for, so that their products are known.
  bool wants_raw_fp8() const override {
    return roundings_.fp8_activations.any() || roundings_.one_row_bf16.e4m3_weights ||
           roundings_.one_row_e4m3_f16_pairs;
  }

  Tensor empty(const std::vector<int64_t>& shape, DType dtype) override;
  Tensor from_host(const HostTensor& host) override;
  void to_host(const Tensor& t, float* dst) override;
  void penalise_logits(Tensor& logits, std::span<const LogitPenalty> penalties) override;
  LinearWeight make_linear(const HostTensor& w) override;

  void embedding(const Tensor& table, std::span<const TokenId> ids, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override;
  void add(Tensor& x, const Tensor& y) override;
  void linear(const Tensor& x, const LinearWeight& w, Tensor& out) override;
  // linear() over rows gathered from a step of step_rows rows (an expert's rows; routed_expert
  // for a routed expert's): the modes that keep one-row steps apart go by the step's rows, not
  // the product's.
  void linear_in_step(const Tensor& x, const LinearWeight& w, Tensor& out, int64_t step_rows,
                      bool routed_expert = false);
  void silu_mul(const Tensor& gate_up, Tensor& out) override;
  void concat_cols(const Tensor& a, const Tensor& b, Tensor& out) override;
  void gather_rows(const Tensor& x, std::span<const int32_t> rows, Tensor& out) override;
  void mla_attention(const MlaAttentionArgs& args) override;
  void moe(const Tensor& x, const MoeWeights& w, Tensor& out, MoeRouting* routing) override;

  void read_cache_block(const LayerKvCache& cache, int32_t block, void* dst) override;
  void write_cache_block(LayerKvCache& cache, int32_t block, const void* src) override;

 private:
  // The tokens marked in `expanded` (whole prefill chunks) in the CUDA backend's expanded form,
  // with its bf16 operands (cpu_attention.cpp); the cache holds their entries already.
  void expanded_bf16_attention(const MlaAttentionArgs& args, const std::vector<char>& expanded);

  CpuRoundings roundings_;
  // The weights make_linear took in e4m3, by address; an entry whose storage is gone is stale
  // (another weight may since have been given its address).
  std::unordered_map<const void*, std::weak_ptr<void>> e4m3_weights_;
  bool is_e4m3(const LinearWeight& w) const;
};

namespace cpu {
// Routing of one token for every gate variant (exposed for tests): fills top_k expert ids and
// weights from the router logits [num_experts].
void route_token(const float* logits, const MoeWeights& w, int32_t* expert_ids, float* weights);
void rms_norm_row(const float* x, const float* w, int64_t n, float eps, float* out);
}  // namespace cpu

}  // namespace dsinfer

// The CUDA backend (Hopper, sm_90a), checked op by op against the CPU backend.
//
// Choices:
// - Activations are fp32 device tensors, as the model allocates them; a GEMM converts its input
//   to bf16 on the fly, so every product reads narrow operands while norms, softmax and
//   residual sums stay fp32.
// - Weights are packed for the backend's own GEMM (grouped_gemm.h): bf16, or e4m3 with their
//   block scales, zero padded to whole tiles; gate/up pairs interleave their rows so that the
//   GEMM's epilogue applies SiLU·mul. Decode-sized products run through that kernel; products
//   with many rows go to cuBLASLt (bf16; e4m3 weights through its block-scaled FP8 product,
//   activations quantised per 1x128 tile on the fly, or DSINFER_CUDA_FP8_GEMM=0: widened to
//   bf16 for the call), unless batch invariance is asked for
//   (DSINFER_BATCH_INVARIANT=1), which keeps every product and attention on summation orders
//   that do not depend on the batch. DSINFER_CUDA_PRECISION=fp32 keeps weights and products in
//   fp32 instead, on those same batch-invariant forms (gemm_f32.h).
// - MoE runs without the host: the router kernel writes the expert of every entry, a planning
//   kernel groups the entries by expert, and the grouped GEMM (or, for prefill-sized layers,
//   cuBLASLt products batched through pointer arrays) reads that layout.
// - Other tensors (norm weights, embeddings, router, W_UK/W_UV, RoPE tables) are fp32, and so
//   is the paged latent cache by default (read_cache_block/write_cache_block are plain copies);
//   with KvCacheFormat::kFp8 it holds FP8 entries (latent_cache_format.h).
// - begin_step uploads the step's token layout once into fixed device buffers; with them a
//   decode step can be recorded as a CUDA graph and replayed (DSINFER_CUDA_GRAPHS=0 turns that
//   off, =padded keeps the padding without recording). All work runs on one stream; the host
//   waits only in to_host, sample_rows, wait_choice, cache block reads, when routing is
//   recorded for inspection, and once per prefill-sized MoE layer where a switch asks for the
//   per-expert products (moe_experts_host_planned).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/gemm_f32.h"
#include "backend/cuda/grouped_gemm.h"

struct CUevent_st;

namespace dsinfer::cuda {

class DeviceAllocator;
class KernelTimeline;
class LtMatmul;
struct PackedWeightLayout;
class StepGapTracker;

// The kernel's view of a weight made by CudaBackend::make_linear / make_gate_up.
GemmWeight gemm_weight_of(const LinearWeight& w);
// The bf16 terms a packed weight's values are summed from: 2 for a dense weight whose values bf16
// would round (a float16 or fp32 checkpoint's; pack_weight), its data then [n_padded, 2 · k]:
// each value rounded to bf16 in columns [0, k), what that rounding left, in bf16, in [k, 2 · k),
// so that a product reading its rows twice ([x | x], CudaBackend::rows_for_two_terms) sums the exact
// value (a float16 value's 11 significant bits fit in two bf16 terms of 8); 1 otherwise.
int weight_terms(const LinearWeight& w);
// The padded width of the rows a product by w reads: k_padded over weight_terms.
int64_t input_cols_padded(const LinearWeight& w);

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(Precision precision = Precision::kDefault);
  ~CudaBackend() override;
  std::string name() const override { return "cuda"; }
  // The fp32 precision mode widens FP8 weights to their real values instead.
  bool wants_raw_fp8() const override { return !f32_products_; }

  Tensor empty(const std::vector<int64_t>& shape, DType dtype) override;
  Tensor from_host(const HostTensor& host) override;
  void to_host(const Tensor& t, float* dst) override;
  LinearWeight make_linear(const HostTensor& w) override;

  void embedding(const Tensor& table, std::span<const TokenId> ids, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override;
  void add(Tensor& x, const Tensor& y) override;
  void add_rms_norm(Tensor& x, const Tensor& y, const Tensor& w, float eps, Tensor& out) override;
  void linear(const Tensor& x, const LinearWeight& w, Tensor& out) override;
  // One bf16 conversion of x for both products; in steps of one row, one launch for both.
  void linear_pair(const Tensor& x, const LinearWeight& w1, Tensor& out1, const LinearWeight& w2,
                   Tensor& out2) override;
  void silu_mul(const Tensor& gate_up, Tensor& out) override;
  void concat_cols(const Tensor& a, const Tensor& b, Tensor& out) override;
  void gather_rows(const Tensor& x, std::span<const int32_t> rows, Tensor& out) override;
  void mla_attention(const MlaAttentionArgs& args) override;
  void mla_queries(const Tensor& x, const LinearWeight& wq, const MlaWeights& w, const ForwardBatch& batch,
                   Tensor& q) override;
  // In steps the few-row kernel takes, linear_pair (the queries go through linear there anyway).
  void mla_queries_and_linear(const Tensor& x, const LinearWeight& wq, const MlaWeights& w, const ForwardBatch& batch,
                              Tensor& q, const LinearWeight& w2, Tensor& out2) override;
  void moe(const Tensor& x, const MoeWeights& w, Tensor& out, MoeRouting* routing) override;
  // In steps of a few rows, the norm left to the products after it (PendingNorm).
  void linear_add_rms_norm(const Tensor& x, const LinearWeight& w, Tensor& out, Tensor& residual,
                           const Tensor& norm_w, float eps, Tensor& normed) override;
  // The combine made by the norm where it adds it (launch_moe_combine_add_rms_norm); in steps of
  // a few rows, the norm left to the products after it (PendingNorm).
  void moe_add_rms_norm(const Tensor& x, const MoeWeights& w, Tensor& out, MoeRouting* routing, Tensor& residual,
                        const Tensor& norm_w, float eps, Tensor& normed) override;
  LinearWeight make_gate_up(const HostTensor& w) override;
  std::optional<LinearWeight> make_random_linear(const RandomLinearSpec& spec) override;
  void prepare(MlaWeights& w) override;
  void prepare(MoeWeights& w) override;
  void prepare_router(MoeWeights& moe, const LinearWeight& o_proj, const Tensor& norm_w) override;
  void will_route(const MoeWeights& moe, const Tensor& residual) override;
  void gated_mlp(const Tensor& x, const LinearWeight& gate_up, const LinearWeight& down, Tensor& out) override;
  void begin_step(const ForwardBatch& batch) override;
  void end_step() override;
  void abandon_step() override;
  std::optional<DeviceMemory> device_memory() override;
  void sample_rows(const Tensor& logits, std::span<const RowSampling> rows, std::vector<int32_t>& out) override;
  void penalise_logits(Tensor& logits, std::span<const LogitPenalty> penalties) override;
  uint64_t choose_async(const Tensor& logits, std::span<const RowSampling> rows) override;
  std::vector<int32_t> wait_choice(uint64_t ticket) override;
  // Placeholders are resolved on the device by begin_step: the ids go to the embedding as they are.
  std::span<const TokenId> input_ids(const ForwardBatch& batch) override { return batch.token_ids; }
  bool can_record() const override { return graphs_ == Graphs::kRecorded; }
  bool pads_decode_steps() const override { return graphs_ != Graphs::kEager; }
  // For decode steps whose attention takes the long-context tiles, the runs a token they take
  // (long_context_splits), else 0: steps whose runs the GPU's tile slots cap (V2-Lite's steps of
  // four or eight tokens: 64 and 33) keep one recording however long their contexts grow. Before
  // the first absorbed attention has told the tiles' blocks, the most runs (long_context_runs).
  uint32_t recording_variant(const ForwardBatch& batch) const override;
  void begin_recording(uint64_t key) override;
  bool end_recording(uint64_t key) override;
  bool replay(uint64_t key) override;
  std::optional<StepGapStats> step_gaps() override;

  void read_cache_block(const LayerKvCache& cache, int32_t block, void* dst) override;
  void write_cache_block(LayerKvCache& cache, int32_t block, const void* src) override;

  void synchronize();
  bool batch_invariant() const { return batch_invariant_; }
  bool f32_products() const { return f32_products_; }

 private:
  struct StepBuffers;  // the step's token layout, host (pinned) and device
  struct Recordings;   // CUDA graphs by key
  struct Choices;      // asynchronous token choices

  // Device ids of rows [rows] chosen from logits (argmax when every row is greedy).
  void choose_into(const Tensor& logits, std::span<const RowSampling> rows, int32_t* ids);
  // Copies host ints to a fresh device tensor (stream-ordered).
  Tensor upload_ints(const std::vector<int32_t>& v);
  Tensor view_rows(const Tensor& t, int64_t row_begin, int64_t num_rows) const;
  // Packs w [rows, cols] for the GEMM; gate_up: rows are gate then up, interleaved per tile.
  LinearWeight pack_weight(const HostTensor& w, bool gate_up);
  // The LinearWeight of a packed weight filled at `storage` (packed_weight.h).
  LinearWeight packed_linear(const Tensor& storage, const PackedWeightLayout& layout);
  // The own kernels' arguments for the product of rows of x_bf16 by w, epilogue into y [rows, ldy].
  GroupedGemmArgs dense_product(const Tensor& x_bf16, int64_t rows, const LinearWeight& w, GemmEpilogue epilogue,
                                void* y, int64_t ldy, int64_t n_out) const;
  // Whether the few-row products of a step of step_rows rows over weights of this type read
  // fp32 rows (GroupedGemmArgs::x_f32): a single sequence's decode steps (step_rows 1), over e4m3
  // weights where their one-row products stay on CUDA cores (DSINFER_FEW_ROW_MMA), unless batch
  // invariance or DSINFER_FEW_ROW_F32_ROWS (0: none; bf16-weights: over bf16 weights only) says
  // otherwise. Their gate/up products then write fp32 SiLU·up rows for the down product
  // (kSiluMulF32).
  bool few_row_f32_rows(int64_t step_rows, bool weights_fp8) const {
    return few_row_f32_rows_ && !batch_invariant_ && step_rows == 1 && few_row_gemm_takes(1) &&
           (!weights_fp8 || (few_row_f32_rows_e4m3_ && !few_row_mma_one_token_ && !few_row_mma_dense_));
  }
  // a reads x's fp32 rows [*, x.dim(1)] where few_row_f32_rows allows it and x's rows can be
  // read 8 columns at a time; else a is unchanged (bf16 rows).
  void read_f32_rows(GroupedGemmArgs& a, const Tensor* x, int64_t step_rows) const;
  // Whether a gated MLP's (or experts') gate/up product writes fp32 SiLU·up rows for its down
  // product to read (kSiluMulF32): where few_row_f32_rows holds for both weights' types, down's
  // input width (its k_padded: the SiLU·up rows' width) a multiple of 8.
  bool silu_up_f32(int64_t step_rows, const LinearWeight& gate_up, const LinearWeight& down) const {
    return few_row_f32_rows(step_rows, gate_up.weight.dtype == DType::kF8E4M3 ||
                                           down.weight.dtype == DType::kF8E4M3) &&
           down.weight.dim(1) % 8 == 0;
  }
  // y (epilogue's layout) = x · Wᵀ for bf16 x [rows, w's k_padded]; own kernel or cuBLASLt.
  // library_gemm: use cuBLASLt whatever the row count (unless batch invariance is asked for).
  // x_f32: the same rows in fp32 (read_f32_rows), or null.
  // A weight in two terms (weight_terms) reads x [rows, input_cols_padded(w)] twice: gemm copies
  // the rows its product reads once more (rows_for_two_terms) and takes the product over both
  // terms' columns.
  void gemm(const Tensor& x_bf16, int64_t rows, const LinearWeight& w, int epilogue, void* y, int64_t ldy,
            int64_t n_out, bool library_gemm = false, const Tensor* x_f32 = nullptr);
  // The rows a product of `rows` rows over a weight in two terms reads, [rows, 2 · x_bf16's
  // width]: [x | x] of the fp32 rows where its few-row form reads them (read_f32_rows; they then
  // stand for the bf16 ones too, as gated_mlp_bf16's fp32 SiLU·up rows do), else of the bf16
  // ones, each copy followed by zeros to x_bf16's width (launch_rows_twice). A pending norm's
  // factor is applied first.
  Tensor rows_for_two_terms(const Tensor& x_bf16, int64_t rows, const Tensor* x_f32, bool library_gemm);
  // cuBLASLt's product of many rows into fp32 out [rows rounded up to 4, n_padded].
  void library_product(const Tensor& x_bf16, int64_t rows, const GemmWeight& w, float* out);
  // The block-scaled FP8 product when cuBLASLt has one for the shape, into fp32 out (or bf16
  // with out_bf16) [rows rounded up to 4, n_padded]; false: nothing was run.
  bool library_product_fp8(const Tensor& x_bf16, int64_t rows, const GemmWeight& w, void* out,
                           bool out_bf16 = false);
  // The e4m3 terms that the FP8 activations of a cuBLASLt product of `rows` rows take
  // (launch_quantize_rows_e4m3_terms): in steps that carry a prompt, DSINFER_FP8_ACTIVATION_TERMS
  // (default 3) up to DSINFER_FP8_TERMS_MAX_ROWS rows (default 256); one elsewhere. Where the
  // recipe starts (33 rows) its single term costs agreement with the reference that bf16 rows
  // would keep, and a prompt's rows are written once into the latent cache that every later token
  // reads; such prefill steps wait on latency, not on the product's rate. Decode-only steps of 33
  // to 256 rows are where throughput is made, and there three terms cost 7-10% (FP8 decode at
  // batch 64-256, H200), so they keep DeepSeek's single term unless DSINFER_FP8_TERMS_IN_DECODE=1.
  // From a few hundred rows up a product is compute-bound and the terms would cost their multiple.
  int fp8_activation_terms(int64_t rows) const {
    const bool wanted = !step_decode_only_ || fp8_terms_in_decode_;
    return wanted && rows <= fp8_terms_max_rows_ ? fp8_activation_terms_ : 1;
  }
  // library_product_fp8 in fp8_activation_terms(rows) terms: one product over all their rows,
  // added after; false where cuBLASLt has no product for that many rows.
  bool library_product_fp8_terms(const Tensor& x_bf16, int64_t rows, const GemmWeight& w, void* out, bool out_bf16);
  // Whether a library gate/up product of `rows` rows writes bf16: bf16 weights always; e4m3 ones
  // where cuBLASLt has a block-scaled product writing bf16 (fp8_gate_up_bf16_).
  bool library_gate_up_bf16(const GemmWeight& w, int64_t rows);
  // cuBLASLt's gate/up product of a gated MLP for SiLU·up to read: [library_rows, n_padded],
  // bf16 where library_gate_up_bf16, else fp32.
  struct GateUpRows {
    Tensor rows;
    bool halves = false;  // from the weight's halves copy: every gate column, then every up one
  };
  GateUpRows library_gate_up(const Tensor& x_bf16, int64_t rows, const GemmWeight& g);
  // cuBLASLt's copy of the e4m3 gate/up weight w with 128 × 128 block scales (gate_up_halves.cu)
  // where its source blocks allow one; library_gate_up then takes it.
  void make_gate_up_halves(const LinearWeight& w);
  // Runs `product`, which writes cuBLASLt's fp32 rows of g [library_rows, n_padded], so that the
  // first `rows` land in y [rows, ldy] (n_out columns):
  // straight there where the layouts agree, else through a buffer.
  void library_product_into(int64_t rows, const GemmWeight& g, float* y, int64_t ldy, int64_t n_out,
                            const std::function<void(float*)>& product);
  // cuBLASLt's product of many rows into out [rows rounded up to 4, n_padded] in
  // library_output_dtype: bf16 for bf16 weights (half the bytes to write and read back), fp32
  // for e4m3 ones, whose block-scaled products write fp32.
  static DType library_output_dtype(const GemmWeight& w) { return w.scales == nullptr ? DType::kBF16 : DType::kF32; }
  void library_product_native(const Tensor& x_bf16, int64_t rows, const GemmWeight& w, void* out);
  // x in bf16, rows padded with zeros to k_padded columns: the bf16 copy of the last norm's or
  // attention's output where x is that output (see NormedCopy), else a conversion.
  Tensor to_bf16_padded(const Tensor& x, int64_t k_padded);
  // Where the op about to write `out` (a norm; attention) writes its bf16 copy (rows of ld
  // elements), remembered as out's copy; data null where it writes none (out not a 2-D fp32
  // tensor). An op that then does not write it forgets it.
  struct Bf16Rows {
    uint16_t* data = nullptr;
    int64_t ld = 0;
  };
  Bf16Rows start_normed_copy(const Tensor& out);
  // Where the FP8 products after a norm of `rows` rows will quantise its bf16 copy (e4m3 weights
  // in cuBLASLt's FP8 products or the expert blocks), the norm writes the e4m3 rows itself:
  // their buffers, kept as the copy's quantised rows; else none (q null). After
  // start_normed_copy.
  E4m3Rows normed_e4m3_rows(int64_t rows);
  void forget_normed_copy() { normed_copy_ = {}; }
  // Forgets the copy when `written` overlaps the tensor it was made from.
  void forget_normed_copy_if_written(const Tensor& written);
  // out fp32 [rows, w.out_features] = x · wᵀ for bf16 x [rows, w's k_padded] (x_f32: gemm's).
  void linear_bf16(const Tensor& x_bf16, int64_t rows, const LinearWeight& w, Tensor& out,
                   const Tensor* x_f32 = nullptr);
  // A one-token step's routed down product left to the caller, which launches it with the
  // combine (launch_few_row_gemm_combine); `input` holds the rows it reads until then.
  struct DeferredDown {
    GroupedGemmArgs args;
    int max_n_padded = 0, max_row_blocks = 0;
    Tensor input;
  };
  // The routed experts in the own grouped kernels; the layout's row-blocks hold rows_per_block
  // rows (kExpertBlockWideRows only where fp8_expert_activations_for holds). Gives their rows
  // [num_entries, hidden]: bf16 from the prefill expert blocks (prefill_expert_outputs_bf16_),
  // fp32 otherwise.
  // x_scale: xb's rows are a pending norm's output (the few-row kernel only; see PendingNorm).
  // shared_down: the shared experts' down product of a one-token step, run in the launch of the
  // routed down product where both take the few-row kernel (shared_down_with_routed_), else
  // after it. x: xb's rows in fp32, for products that read them so (read_f32_rows), or null.
  // layout_written_earlier: the plan was written before the launch just before this call's first
  // one, so the gate/up product may read it, and request its experts' weights, before its wait.
  // defer_down: a one-token step's down product, where it takes the few-row kernel alone, is not
  // launched but left there (left empty where it was launched).
  Tensor moe_experts_grouped(const MoeWeights& w, const Tensor& xb, const int32_t* row_offsets,
                             const int32_t* block_offsets, const int32_t* src_rows, int64_t num_entries,
                             int rows_per_block, const RowRmsScale& x_scale = {},
                             const GroupedGemmArgs* shared_down = nullptr, const Tensor* x = nullptr,
                             bool layout_written_earlier = false,
                             std::optional<DeferredDown>* defer_down = nullptr);
  // Whether the layer's experts, where they take the 128-row expert blocks, run DeepSeek's FP8
  // activations there (e4m3 weights, both switches on, k and the intermediate size whole
  // 128-column scale blocks): in the steps where the dense products take e4m3 terms
  // (fp8_activation_terms), in as many terms, in the decode-sized blocks. There the single term
  // cost tiny_v3_fp8's long reference 19 of its 3,072 steps (RESULTS.md, "Exact FP8 gate/up
  // weights").
  bool fp8_expert_activations_for(const MoeWeights& w) const;
  struct QuantisedRows {
    Tensor q, scales;  // e4m3 [terms * rows_padded, k], fp32 [k / 128, terms * rows_padded]
    int terms = 1;     // launch_quantize_rows_e4m3_terms's, term t's rows from t * rows_padded
  };
  // Rows [0, rows) of x_bf16 [rows, k] in DeepSeek's FP8 activations (launch_quantize_rows_e4m3),
  // in `terms` e4m3 terms (launch_quantize_rows_e4m3_terms) where more than one, rows past them
  // zeros. Rows of the normed copy are quantised once per stream: the products that read them
  // next (kv_a after q_proj; the shared experts after the routed ones) take the same e4m3 rows.
  QuantisedRows quantise_rows(const Tensor& x_bf16, int64_t rows, int64_t rows_padded, int64_t k, int terms = 1);
  // Buffers for rows_padded quantised rows of k columns.
  QuantisedRows new_quantised_rows(int64_t rows_padded, int64_t k);
  // Keeps q as the normed copy's first `rows` rows in e4m3, made on this stream.
  void keep_quantised(const QuantisedRows& q, int64_t rows);
  // The same for the wgmma blocks' `args` to read (the buffers must outlive their launch).
  QuantisedRows quantise_rows_for(const Tensor& x_bf16, int64_t rows, int64_t k, GroupedGemmArgs& args,
                                  int terms = 1);
  // args reads q as its e4m3 activations.
  void take_quantised_rows(const QuantisedRows& q, GroupedGemmArgs& args) const;
  // The layer's tensor maps of its e4m3 expert weights ([gate_up | down], made by prepare), or
  // null.
  const CUtensorMap* expert_weight_maps(const MoeWeights& w) const;
  // A MoE layer up to its combine: the routing, the routed and shared experts, and what the
  // combine reads (its buffers held in keep until the launches that read them are issued).
  struct MoeOutputs {
    MoeCombineRows combine;
    Tensor ids, weights;  // [T * top_k] the routing: int32 expert ids, fp32 weights
    std::vector<Tensor> keep;
    std::optional<DeferredDown> down;  // where defer_down was asked for and the step takes it
  };
  MoeOutputs moe_until_combine(const Tensor& x, const MoeWeights& w, bool defer_down = false);
  // The deferred down product with the combine into `out` (the next norm's, before its factor).
  void launch_down_combine(const DeferredDown& down, const MoeCombineRows& rows, int64_t hidden,
                           const ResidualNormOutput& out);
  // The routing's ids and weights to the host, when asked for (waits for the stream).
  void copy_routing(const MoeOutputs& m, MoeRouting* routing);
  Tensor moe_experts_host_planned(const MoeWeights& w, const Tensor& xb, const int32_t* row_offsets,
                                  const int32_t* src_rows, int64_t num_entries);
  bool chunked_experts_ready(const MoeWeights& w, int num_chunks);
  Tensor moe_experts_chunked(const MoeWeights& w, const Tensor& xb, const int32_t* row_offsets,
                             const int32_t* chunk_offsets, const int32_t* src_rows, const int32_t* expert_ids,
                             const int32_t* slot_rows, int64_t num_entries, int num_chunks, int32_t* chunk_slot_rows);
  // Whether a dense product of `rows` rows with w runs on the own kernel (else cuBLASLt, unless
  // the caller asks for the library anyway).
  bool own_gemm_takes(const GemmWeight& w, int64_t rows) const {
    return batch_invariant_ || rows <= (w.scales != nullptr ? own_gemm_max_rows_fp8_ : own_gemm_max_rows_);
  }
  // Whether products whose row-blocks have at most `rows` rows take the few-row kernel.
  bool few_row_gemm_takes(int64_t rows) const { return !batch_invariant_ && rows <= few_row_gemm_max_rows_; }
  // Whether a MoE step of num_tokens tokens runs its routed experts on the few-row kernel.
  bool routed_few_row_takes(int64_t num_tokens) const {
    return few_row_gemm_takes(num_tokens) && num_tokens <= moe_few_row_max_tokens_;
  }
  // Whether gemm() takes cuBLASLt for a product of `rows` rows with w (unless asked to anyway).
  bool library_gemm_takes(const GemmWeight& w, int64_t rows) const {
    return !few_row_gemm_takes(rows) && !own_gemm_takes(w, rows);
  }
  // Runs `launches` with stream_ and matmul_ swapped for side_stream_ and side_matmul_ (within
  // a fork, see ForkedStreams), so that what they queue goes to the side stream.
  void queue_on_side(const std::function<void()>& launches);
  // x · gate_up → SiLU·mul → down for bf16 x [rows, gate_up's k_padded] (x_f32: gemm's).
  void gated_mlp_bf16(const Tensor& x_bf16, int64_t rows, const LinearWeight& gate_up, const LinearWeight& down,
                      float* out, int64_t ldo, const Tensor* x_f32 = nullptr);
  // linear() of fp32 rows straight to their e4m3 form where cuBLASLt's block-scaled product takes
  // them; false: nothing was run.
  bool linear_f32_e4m3(const Tensor& x, const LinearWeight& w, Tensor& out);
  // gated_mlp_bf16 with SiLU·up written straight as the down product's e4m3 rows, where both
  // products are cuBLASLt's and down's is block-scaled FP8; false: nothing was run.
  bool gated_mlp_e4m3(const Tensor& x_bf16, int64_t rows, const LinearWeight& gate_up, const LinearWeight& down,
                      float* out, int64_t ldo);

  // The fp32 precision mode (cuda_backend_f32.cpp, gemm_f32.h): weights [out, in] in fp32 as
  // the checkpoint's values widen (gate/up pairs gate rows first, unpacked), and products that
  // read the fp32 activations as they are.
  LinearWeight f32_weight(const HostTensor& w, bool gate_up);
  // Device table of the experts' fp32 weights, [gate_up of each expert | down of each expert].
  void prepare_f32(MoeWeights& w);
  // launch_gemm_f32 with the workspace its partial sums need, if any.
  void launch_f32(GemmF32Args args, int64_t max_row_blocks);
  // y [rows, ldy] = x [rows, ldx] · wᵀ.
  void product_f32(const float* x, int64_t rows, int64_t ldx, const LinearWeight& w, float* y, int64_t ldy);
  // out [rows, ldo] = down(silu(gate(x)) · up(x)) for x [rows, gate_up.in_features].
  void gated_mlp_f32(const Tensor& x, const LinearWeight& gate_up, const LinearWeight& down, float* out,
                     int64_t ldo);
  // The routed experts over the routing's plan (row-blocks of kGemmF32RowsPerBlock rows):
  // their rows [num_entries, hidden] in fp32.
  Tensor moe_experts_f32(const MoeWeights& w, const Tensor& x, const int32_t* row_offsets,
                         const int32_t* block_offsets, const int32_t* src_rows, int64_t num_entries);

  // MLA attention (cuda_backend_mla.cpp) in the absorbed form for the tokens of `view`
  // (token_seq: their sequences, on the host), and in the expanded form for one sequence's
  // chunk of new tokens, the last of its context_len positions, whose keys and values
  // (bf16 [context_len, heads * head_width]) are at kv.
  // mla_absorbed also writes out in bf16 to out_bf16 where given, for steps of up to four
  // tokens; returns whether it did. With cache_write, it writes the new cache entries first (in
  // steps of up to four tokens, in the W_UK product's launch).
  bool mla_absorbed(const MlaAttentionArgs& args, const MlaBatchView& view, std::span<const int32_t> token_seq,
                    const float* q, float* out, Bf16Rows out_bf16, const MlaCacheWrite* cache_write = nullptr);
  // Whether absorbed attention over num_tokens of the batch's tokens takes the few-token tiles
  // for the length of its contexts (long_context_tiles_min_positions_): 0 if not, else the most
  // runs a token its longest context calls for (64, 128 or 256; mla_absorbed takes fewer where
  // fewer fill the GPU).
  int long_context_runs(int64_t num_tokens, const ForwardBatch& batch) const;
  // The runs a token a long-context step takes: as many as head_tile_blocks fill over its
  // tokens, up to long_runs, and past kMaxMlaSplits only where at least twice as many fit.
  static int long_context_splits(int long_runs, int head_tile_blocks, int64_t num_tokens);
  // bf16_queries: the step's queries as mla_queries kept them (bf16 [T, heads * qk], rotated
  // here), or null to make them from args.q.
  void mla_expanded(const MlaAttentionArgs& args, const MlaBatchView& view, int first_token, int num_tokens,
                    int context_len, const uint16_t* kv, const uint16_t* latent, uint16_t* bf16_queries);
  bool expanded_form_allowed(const MlaWeights& w) const;
  // The keys and values of the expanded form for several sequences' contexts (context_lens[i]
  // positions, the block table at table_offsets[i] of the step's tables) in one up-projection:
  // kv bf16 [sum of context_lens, heads * head_width] from the gathered latent rows bf16 [sum of
  // context_lens, ld_latent], sequence i's rows after those of 0..i-1 in both.
  struct ExpandedKeysValues {
    Tensor kv, latent;
  };
  ExpandedKeysValues mla_expanded_keys_values(const MlaAttentionArgs& args, const MlaBatchView& view,
                                              std::span<const int> context_lens,
                                              std::span<const int32_t> table_offsets);
  // Whether the expanded form's keys take their rope columns from the latent rows (the fused
  // kernel's warpgroup form) instead of from each head's up-projected rows.
  bool expanded_rope_shared(const MlaWeights& w) const;

  // The device copy of a field of the current step's batch, or null for other host data.
  const int32_t* step_ints(const void* host_field) const;
  // Device ints for `host`: the step buffers' copy when it is a field of the step, else a fresh
  // upload kept alive by `uploaded`.
  const int32_t* device_ints(std::span<const int32_t> host, Tensor& uploaded);

  Stream stream_ = nullptr;
  // MoE steps of up to shared_beside_library_max_tokens_ tokens run their shared experts on
  // side_stream_, beside the routing and the routed experts on stream_ (see moe_until_combine);
  // the events fork and join the two.
  Stream side_stream_ = nullptr;
  // Set while launches are queued on the side stream of a fork (stream_ and side_stream_
  // swapped): work queued on the main stream before the fork is done before them.
  bool queuing_on_side_ = false;
  CUevent_st* fork_event_ = nullptr;
  CUevent_st* join_event_ = nullptr;
  int num_sms_ = 132;
  bool batch_invariant_ = false;
  // Precision::kFp32 or DSINFER_CUDA_PRECISION=fp32: weights and products in fp32 (f32_weight), and the forms of
  // attention and routing that batch invariance takes, which are fp32 too (batch_invariant_
  // set with it). The model's results then follow the fp32 reference to its rounding.
  bool f32_products_ = false;
  // Dense weights that bf16 would round packed in two bf16 terms (weight_terms;
  // DSINFER_CUDA_WEIGHT_TERMS=1: rounded to one, half the bytes to read).
  bool two_term_weights_ = true;
  // How decode steps run: recorded per bucket and replayed (the default), padded to their bucket
  // but issued eagerly (DSINFER_CUDA_GRAPHS=padded), or issued eagerly as they come (=0).
  enum class Graphs { kRecorded, kPadded, kEager };
  Graphs graphs_ = Graphs::kRecorded;
  bool recording_ = false;
  bool library_fp8_ = true;  // many-row e4m3 products in FP8 (DSINFER_CUDA_FP8_GEMM=0: weights widened to bf16)
  bool shared_experts_alongside_ = true;  // DSINFER_MOE_SIDE_STREAM=0: shared experts after the routed ones
  // Steps of a few tokens: the shared experts' products in the routing's launches
  // (DSINFER_MOE_SHARED_IN_ROUTING=0: beside the routing on the side stream instead).
  bool shared_experts_in_routing_ = true;
  // Steps of up to this many tokens whose shared products take cuBLASLt run those on the side
  // stream, beside the routing and the routed experts; larger ones after the routed experts
  // (DSINFER_MOE_SHARED_BESIDE_LIBRARY=0: never beside, =1: at every size). Measured: FP8 decode
  // at batch 64 6,768 → 7,229 tok/s and bf16 4,885 → 5,121; at batch 256 0.3% and 1.2% slower,
  // the 4 × 4k FP8 prefill and the 200-prompt workload within their runs' spread.
  int64_t shared_beside_library_max_tokens_ = 128;
  // Steps of at least this many tokens have their MoE layer's combine made by the next norm
  // where it adds it; smaller ones run the combine's own kernel, then the norm (same bits). In
  // a small step the norm's one block a token would make the combine's reads from one SM:
  // batch-1 and 2 decode ran 0.7% and 1.7% slower with it, a 4 x 4k bf16 prefill 1% faster.
  // DSINFER_MOE_COMBINE_IN_NORM=0: never; =1: every step.
  int64_t combine_in_norm_min_rows_ = 512;
  // One-token steps whose router logits are made beside o_proj (router_beside_o_proj_), in the
  // order kBeside below, run their shared experts' down product in the launch of the routed
  // experts' down product (few_row_gemm_with_dense.cu; DSINFER_MOE_SHARED_DOWN_WITH_ROUTED=0: a
  // launch of its own after it). Measured: batch-1 decode bf16 1.3–2.7% faster, FP8 0.8–1.1%; in
  // the routed gate/up product's launch instead, the same within the runs' spread.
  bool shared_down_with_routed_ = true;
  // The launches of those steps' MoE layer after the router logits:
  // - kSharedDownBetween (default): the routing and planning with the shared gate/up beside them,
  //   the shared down, then the routed gate/up and down. The routed gate/up product finds its
  //   plan written two launches back and requests its experts' weights before its wait, as the
  //   down product does; the shared down product's weights stream in during the routing.
  //   Measured on an H100 against kBeside: batch-1 decode FP8 476.4 → 483.0 tok/s, bf16 391.9 →
  //   395.3 (medians of three), the routed e4m3 gate/up product 19.7 → 16.6 µs a layer.
  // - kBeside (DSINFER_MOE_ONE_TOKEN_ORDER=beside): the routing with the shared gate/up, the
  //   routed gate/up, then the routed down with the shared down (shared_down_with_routed_).
  // The routing alone in its launch, the shared gate/up in the next, was 4.4% slower with bf16
  // weights: its launch (10.5–11.8 µs on an H100, with the block's general routing path) then
  // hides no product.
  enum class OneTokenMoeOrder { kSharedDownBetween, kBeside };
  OneTokenMoeOrder one_token_moe_order_ = OneTokenMoeOrder::kSharedDownBetween;
  // A one-token step's routing and plan in one warp, in registers, where the layer has up to 64
  // experts and no group limit (moe_routing.cuh, route_plan_one_token); the same bits as the
  // block's path, which DSINFER_MOE_ROUTE_ONE_WARP=0 keeps.
  bool one_token_route_in_a_warp_ = true;
  // DSINFER_MOE_ROUTE_REHEARSAL=1: that warp runs its routing once before its wait, on no data
  // and storing nothing, so that its instructions are fetched while the launch before drains
  // (moe_routing_beside.cu has why it is off: the rehearsal outlasts the launch before it);
  // =beside: a second warp of its block runs it while the routing's warp waits (off too: the
  // routing is done sooner, the step no faster).
  RouteRehearsal route_rehearsal_ = RouteRehearsal::kNone;
  // A one-token step's routed down product does the MoE combine in its blocks, the last of each
  // column slice's (few_row_gemm_combine.cu), where the combine goes to the next norm
  // (DSINFER_MOE_COMBINE_IN_DOWN=0: the combine's own launch after it). combine_arrivals_: the
  // slices' arrival counts [kMaxCombineSlices], zero between launches (a slice is one unit of four
  // output rows or more: V3's 7,168 take at most 1,792).
  static constexpr int64_t kMaxCombineSlices = 4096;
  bool combine_in_down_ = true;
  Tensor combine_arrivals_;
  // The few-row products read their weights with an L2 evict-first policy
  // (GroupedGemmArgs::weights_evict_first; DSINFER_WEIGHTS_L2_EVICT_FIRST=0: an evict-normal
  // one). Batch-1 decode on an H100: FP8 8% and bf16 3% faster than with it off.
  bool weights_l2_evict_first_ = true;
  // The absorbed attention's W_UK and W_UV (fp32, 4 MB each a V2-Lite layer), read under the
  // same policy in steps of a few tokens (DSINFER_ATTN_WEIGHTS_L2_EVICT_FIRST=0: evict-normal).
  // Batch-1 decode on an H100 0–0.3% faster with it, at the edge of the runs' spread; on for one
  // policy over every weight stream.
  bool attention_weights_l2_evict_first_ = true;
  // Slots whose rows each thread of the MoE combine kernel requests together
  // (MoeCombineRows::slots_at_once; DSINFER_MOE_COMBINE_SLOTS_AT_ONCE=1: one after another).
  int combine_slots_at_once_ = kMoeCombineSlotsAtOnce;
  // A MoE layer's router logits made from o_proj's input in one-token steps (prepare_router):
  // the logits are (G' · h + M · a) / rms with G' = gate · diag(norm weight) and M = G' · W_o,
  // a o_proj's input and h the residual before it. G' · h is made beside the layer's first pair
  // of products (pre), M · a beside o_proj (logits, before 1 / rms), which the routing applies;
  // the logits' own launch goes. DSINFER_ROUTER_BESIDE_O_PROJ=0: the logits' own launch.
  struct RouterIdentity {
    Tensor g_prime;  // [num_experts, hidden] fp32
    Tensor m;        // [num_experts, o_proj's in_features] fp32
    Tensor pre, logits;  // [1, num_experts] fp32
    const void* o_proj = nullptr;  // the weights M was made from
    const void* gate = nullptr;
  };
  std::unordered_map<const MoeWeights*, RouterIdentity> router_identities_;
  // The layer will_route named in this forward, and how far its logits are made.
  struct RouteHint {
    const MoeWeights* moe = nullptr;
    RouterIdentity* id = nullptr;
    const void* residual = nullptr;
    bool pre_made = false, logits_made = false;
  };
  RouteHint route_hint_;
  bool router_beside_o_proj_ = true;
  // Decode batches of this many tokens or more attend in planned head tiles
  // (mla_decode_tiles.cu); smaller ones in the fp32 split kernel, or in the few-token tiles below
  // (DSINFER_MLA_HEAD_TILE_MIN_TOKENS).
  int head_tile_min_tokens_ = 16;
  // Steps of few_token_tiles_min_tokens_ to few_token_tiles_max_tokens_ tokens attend in head
  // tiles of this many runs of each token's context per head group, without a plan (at most 64;
  // DSINFER_MLA_FEW_TOKEN_TILES; 0: the split kernel), their blocks requesting a first chunk of
  // older entries before their wait (DSINFER_MLA_FEW_TOKEN_TILES_EARLY=0: after it).
  // On the H200 (V2-Lite, 1k contexts) 32 runs took decode at batch 4 and 8 up 5–9% against the
  // split kernel; at batch 1 and 2 the split kernel stays ahead (3–8% and 0–1%), at 12 they tie.
  int few_token_tile_runs_ = 32;
  int few_token_tiles_min_tokens_ = 4;  // DSINFER_MLA_FEW_TOKEN_TILES_MIN
  int few_token_tiles_max_tokens_ = 8;  // DSINFER_MLA_FEW_TOKEN_TILES_MAX
  // Steps of fewer than head_tile_min_tokens_ tokens whose contexts together have this many
  // positions or more attend in the few-token tiles, whatever their number of tokens, at as many
  // runs a token as fill the GPU in one wave, up to long_context_runs
  // (DSINFER_MLA_LONG_CONTEXT_TILES; 0: never); steps in those tiles anyway take these runs where
  // one context alone is that long. The split kernel scores each head's positions apart, reading
  // every cache entry once per head, where a tile reads it once for 16 heads: on the H100
  // (V2-Lite, fp32 cache) one sequence of 32k positions decoded at 142 tok/s in the split kernel
  // and at 272 in the tiles (206 at 64 runs), two at 176 and 375. The split kernel's smaller
  // fixed cost keeps it ahead below about 2.5k positions (one sequence of 2k: as fast; two of 2k:
  // 5% slower; bench/RESULTS.md, "Long contexts of a few sequences in head tiles").
  int long_context_tiles_min_positions_ = 2560;
  // The head tiles' blocks a group of heads for this model's attention (mla_head_tile_blocks),
  // set by the first absorbed attention that may take tiles; 0 before it.
  int head_tile_blocks_seen_ = 0;
  // The most runs a token of the long-context tiles (DSINFER_MLA_LONG_CONTEXT_RUNS, 64 to
  // kMaxMlaLongSplits), each of at least kLongContextRunPositions of the longest context: past
  // 64 runs the merge takes a launch of its own, the combine kernel's form for many runs.
  int long_context_max_runs_ = kMaxMlaLongSplits;
  static constexpr int kLongContextRunPositions = 64;
  bool few_token_tiles_early_ = true;
  // Prefill query tiles (chunks of 16 new tokens or more that the expanded form cannot take,
  // and every token of their step) cut each tile's context into runs until there are this many blocks an SM
  // (DSINFER_MLA_QUERY_TILE_BLOCKS; 0: one run a tile), each run at least
  // kQueryTileRunPositions of the longest context, up to kMaxMlaSplits; the split path's
  // combine merges them. A tile in one run is one block per head for the whole context.
  int query_tile_blocks_per_sm_ = 2;
  static constexpr int kQueryTileRunPositions = 256;
  int query_tile_runs(int num_tiles, int num_heads, const ForwardBatch& batch) const;
  // Split-path steps of up to this many tokens merge their splits in the W_UV product's launch
  // instead of a launch of their own (DSINFER_MLA_MERGE_BESIDE_W_UV=0..4; 0: never). On the
  // H200 (V2-Lite, 1k contexts) one-token steps gained 1.2-2.1% (bf16) and 2.1-3.0% (FP8),
  // two-token ones 0.4-1.0% and 0.5-1.2%; four-token ones tied.
  int merge_beside_max_tokens_ = 2;
  // Where prefill-sized MoE layers run their experts (DSINFER_MOE_PREFILL_EXPERTS):
  // - kAuto (the default): e4m3 experts that take DeepSeek's FP8 activations
  //   (fp8_expert_activations_for) as kGrouped, in the prefill expert blocks; others as kChunked;
  // - kChunked ("chunked"): cuBLASLt products batched through pointer arrays that the device
  //   fills from its plan, no host wait (e4m3 experts widened to bf16 first);
  // - kHostPlanned ("host"): a cuBLASLt product per expert, whose row counts come to the host,
  //   one wait per layer;
  // - kGrouped ("grouped"): the own grouped kernels, with row-blocks of kExpertBlockWideRows
  //   for e4m3 activations (the prefill expert blocks), else as in decode.
  enum class PrefillExperts { kAuto, kChunked, kHostPlanned, kGrouped };
  PrefillExperts prefill_experts_ = PrefillExperts::kAuto;
  // Chunked layers take e4m3 experts too, widened to bf16 for the layer
  // (DSINFER_MOE_FP8_CHUNKED=0: they take the host-planned path and DeepSeek's FP8 activations).
  bool fp8_experts_chunked_ = true;
  // Decode-sized layers with a few rows per expert or more run e4m3 experts in the 128-row
  // expert blocks (DSINFER_MOE_FP8_EXPERT_BLOCKS=0: in the 32-row blocks).
  bool fp8_expert_blocks_ = true;
  // Those blocks take DeepSeek's FP8 activations (per row and 128 columns) into Hopper's FP8
  // products, where the weights' k is whole 128-column blocks (DSINFER_MOE_FP8_ACTIVATIONS=0:
  // bf16 activations and the weights widened to bf16 in registers).
  bool fp8_expert_activations_ = true;
  // Block-scaled FP8 gate/up products in cuBLASLt (the shared experts, dense layers) write bf16
  // for SiLU·up to read, half the bytes of fp32 (DSINFER_FP8_GATE_UP_BF16=0: fp32).
  bool fp8_gate_up_bf16_ = true;
  // Gated MLPs whose down product is cuBLASLt's block-scaled FP8 get SiLU·up as its e4m3 rows in
  // one pass (DSINFER_SILU_E4M3=0: bf16 rows, then the quantising pass).
  bool silu_e4m3_ = true;
  // fp32 rows without a bf16 copy (attention's output in prefill, for o_proj) go to cuBLASLt's
  // block-scaled product quantised in one pass (DSINFER_F32_E4M3=0: converted to bf16 rows, then
  // quantised).
  bool f32_e4m3_ = true;
  int fp8_expert_pass_rows_ = 0;  // their rows per pass (DSINFER_MOE_FP8_PASS_ROWS=32|64; 0: by the rows)
  // The prefill expert blocks write the down product's rows in bf16, as the model's own experts
  // give them, for the combine to read: half the bytes of fp32 both ways
  // (DSINFER_MOE_PREFILL_OUTPUTS_BF16=0: fp32 rows).
  bool prefill_expert_outputs_bf16_ = true;
  // Their tiles take 256 weight rows, 171 FLOP per byte brought from L2, with each stage's
  // products in two halves of 128 (DSINFER_MOE_PREFILL_WEIGHT_ROWS=192: one group of 192 rows,
  // 154 FLOP per byte; =128: 128).
  int prefill_expert_weight_rows_ = 256;
  // With 256-row tiles the gate/up blocks write the down product's e4m3 rows
  // (DSINFER_MOE_PREFILL_SILU_E4M3=0: bf16 rows, then the quantising pass; same bits).
  bool prefill_expert_silu_e4m3_ = true;
  // Their down product's bf16 rows go out through shared memory in 16-byte pieces
  // (DSINFER_MOE_PREFILL_STAGED_BF16=0: each thread's own 4-byte pairs; same bits).
  bool prefill_expert_staged_bf16_ = true;
  // Their 256-row tiles' weight rows come by TMA, two boxes a stage that one thread requests,
  // instead of 16-byte cp.async pieces from every copying thread
  // (DSINFER_MOE_PREFILL_TMA_WEIGHTS=0: cp.async; same bits).
  bool prefill_expert_tma_weights_ = true;
  // With TMA weights, the down product's e4m3 rows (contiguous per row-block) come as one TMA
  // box a stage too (DSINFER_MOE_PREFILL_TMA_ROWS=0: cp.async pieces; same bits). The gate/up
  // product's rows, gathered by src_rows, stay on cp.async: gathered by a pass first for the
  // same boxes, the pass cost more than the boxes saved.
  bool prefill_expert_tma_rows_ = true;
  // In steps whose FP8 products take cuBLASLt's block-scaled product, the norms write the e4m3
  // rows those products read (DSINFER_NORM_E4M3=0: the first product quantises them).
  bool norm_writes_e4m3_ = true;
  // Steps of a few tokens write the attention's cache entries in the W_UK product's launch
  // (DSINFER_MLA_CACHE_WRITE_BESIDE=0: in a launch of their own before it; same results).
  bool cache_write_beside_ = true;
  // The split attention kernel's forms for DeepSeek's widths (DSINFER_MLA_SPLIT_GENERIC=1: the
  // generic form, the same bits).
  bool fixed_split_forms_ = true;
  // Positions a warp of the split attention kernel scores at once: 0 chooses by the grid
  // (cuda_backend_mla.cpp); DSINFER_MLA_SPLIT_GROUP=1 or 4 fixes it.
  int split_group_positions_ = 0;
  // make_random_linear fills weights on the device (DSINFER_DEVICE_RANDOM_WEIGHTS=0: it declines,
  // and the caller draws them on the host).
  bool device_random_weights_ = true;
  // cuBLASLt's copies of the shared experts' e4m3 gate/up (DSINFER_GATE_UP_HALVES=0: none).
  bool gate_up_halves_ready_ = true;
  bool fused_prefill_attention_ = true;  // expanded prefill in one kernel (DSINFER_MLA_FLASH=0: cuBLASLt products)
  // A sequence with this many new tokens or more in a step attends in the expanded form
  // (DSINFER_MLA_EXPANDED_MIN_TOKENS). The form's cost is mostly the up-projection of the whole
  // context, whatever the chunk, where the absorbed forms read the context again for each new
  // token: on the H100 (V2-Lite) a follow-up turn of 16 to 63 tokens after 32k cached positions
  // took 28-32 ms to prefill in the expanded form against 397-457 ms in query tiles (55-194 ms
  // in query tiles cut into runs; 38-113 ms in head tiles over an FP8 cache), after 4k
  // positions 14-16 ms against 62-72 ms, after 256 positions 10.7-12.3 against 14.4-16.6, and a
  // fresh prompt of 16-63 tokens 2-11% less (bench/RESULTS.md, "Follow-up turns over a cached
  // prefix").
  int expanded_min_tokens_ = 16;
  // That kernel on warpgroup products for 192 / 128 heads (DSINFER_MLA_FLASH_WGMMA=0: mma.sync).
  bool warpgroup_flash_attention_ = true;
  // Above this many rows a dense product goes to cuBLASLt (not batch-invariant). The own kernel
  // runs rows in passes of up to 32 that each re-read the weight tile: at 64 rows it took 48 µs
  // for a 12.6 MB bf16 projection that cuBLASLt reads in about 9. e4m3 weights then take
  // DeepSeek's FP8 activations too; keeping them on the own kernel (bf16 activations) up to 128
  // rows made FP8 decode 20% slower at batch 64 and 27% at batch 128
  // (DSINFER_CUDA_FP8_GEMM_MAX_ROWS sets their bound alone).
  int own_gemm_max_rows_ = 32;
  int own_gemm_max_rows_fp8_ = 32;
  // Up to this many rows (per expert, in an MoE layer) products take the few-row kernel, whose
  // blocks sum whole rows on CUDA cores (DSINFER_CUDA_FEW_ROW_GEMM_MAX_ROWS; 0: never). Not in
  // batch-invariant steps, which keep one kernel at every batch size.
  int few_row_gemm_max_rows_ = kFewRowGemmDefaultMaxRows;
  int moe_few_row_max_tokens_ = kFewRowGemmMaxRows;  // DSINFER_MOE_FEW_ROW_MAX_TOKENS
  // Routed rows per expert on average from which experts take the 128-row expert blocks:
  // bf16 ones (DSINFER_MOE_EXPERT_BLOCK_MIN_ROWS), and e4m3 ones with FP8 activations
  // (DSINFER_MOE_FP8_EXPERT_BLOCK_MIN_ROWS).
  int expert_block_min_rows_ = 4;
  int fp8_expert_block_min_rows_ = 1;
  // There, the routed experts' e4m3 weights go to f16 tensor-core products, two weights a
  // conversion, instead of CUDA cores, in steps of two tokens; one-token steps keep CUDA cores,
  // whose one-row blocks walk a fixed number of phases with x in registers (batch-1 FP8 decode
  // 2.9% faster, batch 2 4.3% slower on tensor cores). Dense products keep CUDA cores: a block
  // of that form takes 32-row tiles, and V2-Lite's q_proj (96 tiles) or o_proj (64) then leave
  // most of the GPU idle (12.0 µs against 7.0 and 6.1 under Nsight Compute).
  // DSINFER_FEW_ROW_MMA=0: CUDA cores for all; =experts: the routed experts on tensor cores in
  // one-token steps too; =all: and dense products too.
  bool few_row_mma_experts_ = true;
  bool few_row_mma_one_token_ = false;
  bool few_row_mma_dense_ = false;
  bool few_row_fixed_phases_ = true;  // DSINFER_FEW_ROW_FIXED_PHASES=0: phases read at run time
  int fp8_activation_terms_ = 3;       // DSINFER_FP8_ACTIVATION_TERMS (1 to kMaxFp8ActivationTerms)
  int64_t fp8_terms_max_rows_ = 256;   // DSINFER_FP8_TERMS_MAX_ROWS
  bool fp8_terms_in_decode_ = false;   // DSINFER_FP8_TERMS_IN_DECODE=1
  // Whether the step under way brings one new token per sequence (products outside a step, as
  // the op tests run them, count as a prompt's).
  bool step_decode_only_ = false;
  bool few_row_f32_rows_ = true;       // DSINFER_FEW_ROW_F32_ROWS=0: one-row steps read bf16 rows too
  bool few_row_f32_rows_e4m3_ = true;  // DSINFER_FEW_ROW_F32_ROWS=bf16-weights: but over e4m3 weights
  const ForwardBatch* step_batch_ = nullptr;
  Tensor tile_counters_;  // [kGemmMaxTileCounters] split-K arrival counts, zero between GEMMs
  Tensor argmax_scratch_;  // launch_argmax_rows' arrival counts and slice keys, zero between launches
  std::shared_ptr<DeviceAllocator> alloc_;
  std::unique_ptr<LtMatmul> matmul_;
  // cuBLASLt on side_stream_, with its own workspace: matmul_ and side_matmul_ swap with the
  // streams while launches go to the side stream.
  std::unique_ptr<LtMatmul> side_matmul_;
  // cuBLASLt's copy of the scales of each e4m3 weight (keyed by the weight's device data): per
  // 128x128 block where the packed rows keep the checkpoint's blocks, else per row and 128
  // columns (gate/up pairs, whose packing interleaves rows of two blocks).
  struct LibraryScales {
    const float* scales = nullptr;
    bool blocks_128x128 = false;
    bool gate_up_halves_blocks = false;  // PackedWeightLayout's
  };
  std::unordered_map<const void*, LibraryScales> fp8_library_scales_;
  // make_gate_up_halves's copies, by the packed weight's data.
  std::unordered_map<const void*, Tensor> gate_up_halves_;
  // e4m3 weight w's library scales where cuBLASLt has a block-scaled product of `rows` rows for
  // it (writing bf16 where out_bf16), else null.
  const LibraryScales* library_fp8_scales(const GemmWeight& w, int64_t rows, bool out_bf16);
  // cuBLASLt's block-scaled product of rows already in e4m3 (all of x's padded rows) by w, whose
  // library scales are lib, into out [x's padded rows, n_padded] (fp32, or bf16 with out_bf16).
  void library_product_fp8_rows(const QuantisedRows& x, const GemmWeight& w, const LibraryScales& lib, void* out,
                                bool out_bf16);
  std::unique_ptr<StepBuffers> step_;
  std::unique_ptr<Recordings> recordings_;
  std::unique_ptr<Choices> choices_;
  std::unique_ptr<StepGapTracker> step_gaps_;
  std::unique_ptr<KernelTimeline> timeline_;  // build option, with DSINFER_KERNEL_TIMELINE set
  uint64_t timeline_key_ = 0;                 // the recording replayed last
  // The last norm's output in bf16 (rows padded with zeros to whole 128-column tiles), written
  // by the norm's own kernel, or the attention's output (o_proj's input) written by its last
  // product in steps of a few tokens: the products that take that output next (linear,
  // linear_pair, gated_mlp, moe) read it instead of converting the output again, a kernel fewer
  // before each such product. Every other op forgets it before it runs, and those
  // products forget it when they write over its source, so it never outlives the values it
  // copies.
  struct NormedCopy {
    const void* of = nullptr;    // the fp32 tensor it copies
    std::shared_ptr<void> keep;  // of's storage, so that its memory is not handed out again meanwhile
    std::vector<int64_t> shape;  // of's shape
    Tensor bf16;                 // [rows, cols rounded up to 128]
    // bf16's first quantised_rows rows in e4m3, as the norm or quantise_rows made them last (q's
    // shape gives the padding and width), on stream quantised_on (another would not wait for them).
    QuantisedRows quantised;
    Stream quantised_on = nullptr;
    int64_t quantised_rows = 0;
  };
  NormedCopy normed_copy_;
  // A norm left to the products that read its output (ResidualNormOutput, RowRmsScale): in a
  // step of a few rows its own launch is a link in the step's chain of launches that moves almost
  // no bytes, two a layer (a build that skipped both ran batch-1 decode 5% faster). The kernel
  // before it (o_proj's few-row product, or the MoE combine) adds to the residual and writes x · w
  // as the norm's output and its bf16 copy; the few-row products that read them, and the router
  // logits beside them, multiply their sums by each row's 1 / rms, which every block finds from
  // the residual rows. Any other reader gets finished rows first (settle_norm), and so does any
  // write to the residual while the output lives; overwriting the output ends it.
  struct PendingNorm {
    const void* of = nullptr;    // the norm's fp32 output [rows, n], x · w
    std::shared_ptr<void> keep;  // of's storage
    Tensor bf16;                 // its copy [rows, n] (n a multiple of 128, so unpadded)
    Tensor partials;             // [rows, n / 4] the residual's squares (ResidualNormOutput)
    RowRmsScale scale;           // over partials
    const void* residual = nullptr;  // [rows, n]
    std::shared_ptr<void> keep_residual;
    int64_t rows = 0;
  };
  PendingNorm pending_norm_;
  // Steps of up to this many rows leave their norms to the products (DSINFER_NORM_IN_PRODUCTS=N:
  // up to N, within the few-row kernel's bound; 0: every norm in its own launch). One: at batch 1
  // V2-Lite decode ran 1.9% (bf16) and 2.3% (FP8) faster, at batch 2 bf16 1.1% slower.
  int64_t norms_in_products_max_rows_ = 1;
  // Steps of up to this many rows run linear_pair's two products in one launch where the few-row
  // kernel takes them (DSINFER_FEW_ROW_PAIRS=N; 0: two launches). One: V2-Lite decode at batch 1
  // bf16 +1.9%, FP8 unchanged; at batch 2 the pair kernel's two-row forms hold 168 registers
  // (the own launches' 128) and ran 4.1% (bf16) and 2.3% (FP8) slower.
  int64_t few_row_pairs_max_rows_ = 1;
  // Whether a norm of `rows` rows of n after a residual add may be left to the products.
  bool can_leave_norm(int64_t rows, int64_t n) const;
  // The output's copy and the residual that a kernel about to be launched fills as
  // ResidualNormOutput, and the pending norm it leaves (after start_normed_copy(normed)).
  ResidualNormOutput leave_norm(Tensor& residual, const Tensor& norm_w, float eps, Tensor& normed);
  // The factor a few-row product reading `rows` (the pending norm's output or its copy) applies;
  // none for other rows.
  RowRmsScale left_norm_scale(const void* rows) const;
  // Finishes the pending norm's output and copy in place (launch_apply_row_rms) and ends it.
  void settle_norm();
  // Before an op that reads `reads` and writes `writes`: settles the pending norm where it reads
  // its output or writes the residual without overwriting that output, ends it where it
  // overwrites the output.
  void reconcile_norm(std::initializer_list<const Tensor*> reads, std::initializer_list<const Tensor*> writes);
  // Queries mla_queries wrote in bf16 only, for the mla_attention that reads the fp32 tensor at
  // `of` (whose rows were not written); taken by that call.
  struct QueryRows {
    const void* of = nullptr;
    Tensor bf16;  // bf16 [T rounded up, heads * qk]
  };
  QueryRows query_rows_;
};

}  // namespace dsinfer::cuda

// The Backend interface: the operations the DeepSeek forward is written against. The CPU
// backend is the readable fp32 reference; other backends are checked against it op by op.
//
// Activations are 2-D [num_tokens, features] fp32 tensors on the CPU backend (a device backend
// may pick its own activation dtype). Weights are prepared once from checkpoint tensors of any
// dtype (F32/F16/BF16, or F8_E4M3 with 128x128 block scales) into a backend-resident form.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/latent_cache_format.h"
#include "backend/precision.h"
#include "backend/tensor.h"
#include "backend/token_choice.h"
#include "dsinfer/engine_types.h"

namespace dsinfer {

// A checkpoint tensor as stored (host memory, possibly memory-mapped).
struct HostTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  // F8_E4M3 weights only: real = fp8 × scale_inv[row/block_rows][col/block_cols].
  const float* scale_inv = nullptr;
  int block_rows = 128;
  int block_cols = 128;
  // A routed expert's weight, read only by the MoE layer's grouped products: a backend may keep
  // it in a narrower form than the dense weights (the CUDA backend's single bf16 term).
  bool routed_expert = false;
};

// y = x · Wᵀ with W [out_features, in_features] (PyTorch's nn.Linear layout).
struct LinearWeight {
  int64_t out_features = 0;
  int64_t in_features = 0;
  Tensor weight;  // backend-resident; layout and dtype are the backend's choice
  // A gate/up pair from Backend::make_gate_up whose rows the backend packed for a fused
  // SiLU·mul: only gated_mlp and moe may use it.
  bool packed_gate_up = false;
};

// A linear weight of random values, for benchmarks without files (--dummy-weights). Each source
// tensor [out_features, in_features] holds scale · normal_value(seed, i) (core/random_normal.h)
// at element i; a gate/up weight stacks two, gate rows first, as make_gate_up takes them. fp8:
// those values in e4m3 with one scale per 128 × 128 block (its largest magnitude / 448), as an
// FP8 checkpoint stores them.
struct RandomLinearSpec {
  int64_t out_features = 0;  // rows of each source tensor
  int64_t in_features = 0;
  uint64_t seeds[2] = {0, 0};  // the tensor's stream; for gate/up the gate's, then the up's
  float scale = 1.0f;
  bool gate_up = false;
  bool fp8 = false;  // gate/up: out_features a multiple of 128
};

// MLA projections of one layer that attention needs in absorbed form.
struct MlaWeights {
  int num_heads = 0;
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  Tensor kv_a_layernorm;  // [kv_lora_rank]
  Tensor w_uk;            // [num_heads, qk_nope_head_dim, kv_lora_rank] (rows of kv_b_proj)
  Tensor w_uv;            // [num_heads, v_head_dim, kv_lora_rank]
  Tensor derived;         // backend-private, made by Backend::prepare (CUDA: W_UV transposed per head)
};

// One forward step's token layout: the struct the model runner builds from the scheduler's
// output. Tokens of one sequence are contiguous and in position order.
struct ForwardBatch {
  int num_tokens = 0;
  std::vector<TokenId> token_ids;       // [num_tokens]
  std::vector<int32_t> positions;       // [num_tokens]
  std::vector<int32_t> slot_mapping;    // [num_tokens] block_id * block_size + offset; -1: padding, not stored
  std::vector<int32_t> token_seq;       // [num_tokens] index of the token's sequence
  // Per sequence: its block table and its context length after this step (cached + new).
  std::vector<std::vector<int32_t>> block_tables;
  std::vector<int32_t> context_lens;
  // Token indices whose logits are wanted (the last token of each sequence that samples).
  std::vector<int32_t> logits_indices;
};

// The paged latent cache of one layer: [num_blocks, block_size, entry], one entry per position
// in `format` (latent_cache_format.h): fp32 [kv_lora_rank + rope_dim], or the bytes of an FP8
// entry (dtype kU8).
struct LayerKvCache {
  Tensor data;
  KvCacheFormat format = KvCacheFormat::kF32;
};

// How long a device sat idle between consecutive steps, from the end of one step's work to the
// start of the next one's: zero while the host enqueues each step before the last one ends.
struct StepGapStats {
  struct Summary {
    int64_t num_gaps = 0;
    double total_us = 0, median_us = 0, p99_us = 0, max_us = 0;
  };
  Summary all;          // every pair of consecutive steps
  Summary decode_only;  // pairs of decode-only steps (one new token per sequence)
};

struct MlaAttentionArgs {
  const MlaWeights* weights = nullptr;
  const Tensor* q = nullptr;       // [T, heads * (nope + rope)], rope part not yet rotated
  const Tensor* kv_a = nullptr;    // [T, kv_lora + rope]: un-normalised c_kv | k_rope (unrotated)
  const Tensor* rope_cos = nullptr;  // [max_positions, rope_dim / 2] (attention factor folded in)
  const Tensor* rope_sin = nullptr;
  const ForwardBatch* batch = nullptr;
  LayerKvCache* cache = nullptr;
  int block_size = 64;
  float softmax_scale = 1.0f;
  float latent_norm_eps = 1e-6f;
  Tensor* out = nullptr;           // [T, heads * v_head_dim]
};

enum class GateScoring { kSoftmax, kSigmoid };
enum class GateTopk { kGreedy, kGroupLimitedGreedy, kNoauxTc };

struct MoeWeights {
  int num_experts = 0;
  int top_k = 0;
  int num_groups = 1;
  int topk_groups = 1;
  GateScoring scoring = GateScoring::kSoftmax;
  GateTopk topk_method = GateTopk::kGreedy;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
  Tensor gate;                    // [num_experts, hidden] router weight, fp32
  Tensor score_correction_bias;   // [num_experts] (noaux_tc) or empty
  std::vector<LinearWeight> expert_gate_up;  // per expert: [2 * inter, hidden], gate rows first
  std::vector<LinearWeight> expert_down;     // per expert: [hidden, inter]
  bool has_shared = false;
  LinearWeight shared_gate_up;    // [2 * shared_inter, hidden]
  LinearWeight shared_down;       // [hidden, shared_inter]
  Tensor derived;                 // backend-private, made by Backend::prepare (CUDA: expert descriptors)
};

// Router decisions for a batch, exposed for tests and expert-load statistics.
struct MoeRouting {
  std::vector<int32_t> expert_ids;  // [T, top_k]
  std::vector<float> weights;       // [T, top_k]
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // True when make_linear takes F8_E4M3 weights as stored (with scale_inv and block sizes)
  // and keeps them in FP8; the loader then skips widening those weights to fp32.
  virtual bool wants_raw_fp8() const { return false; }

  virtual Tensor empty(const std::vector<int64_t>& shape, DType dtype) = 0;
  virtual Tensor from_host(const HostTensor& host) = 0;  // widened/converted as the backend likes
  virtual void to_host(const Tensor& t, float* dst) = 0;  // fp32 copy out
  virtual LinearWeight make_linear(const HostTensor& w) = 0;
  // gate and up projections stacked [2 * inter, in], gate rows first; the result feeds
  // gated_mlp and MoeWeights only (a backend may reorder rows for a fused SiLU·mul).
  virtual LinearWeight make_gate_up(const HostTensor& w) { return make_linear(w); }
  // The weight RandomLinearSpec describes, made where the backend keeps it (the device fills it,
  // sparing the host the drawing, packing and copying of a model's values); nothing where the
  // backend has no such path, and the caller draws the values on the host.
  virtual std::optional<LinearWeight> make_random_linear(const RandomLinearSpec& spec) {
    (void)spec;
    return std::nullopt;
  }

  virtual void embedding(const Tensor& table, std::span<const TokenId> ids, Tensor& out) = 0;
  virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) = 0;
  virtual void add(Tensor& x, const Tensor& y) = 0;  // x += y
  // The residual step between sublayers: x += y, then out = rms_norm(x). A backend may fuse the
  // two passes; the default runs add, then rms_norm.
  virtual void add_rms_norm(Tensor& x, const Tensor& y, const Tensor& w, float eps, Tensor& out);
  virtual void linear(const Tensor& x, const LinearWeight& w, Tensor& out) = 0;
  // Two projections of one input, out1 = x · w1ᵀ and out2 = x · w2ᵀ (attention's query and
  // latent projections). A backend may share the work both do on x; the default runs linear
  // twice.
  virtual void linear_pair(const Tensor& x, const LinearWeight& w1, Tensor& out1, const LinearWeight& w2,
                           Tensor& out2);
  virtual void silu_mul(const Tensor& gate_up, Tensor& out) = 0;  // [T, 2I] → [T, I]
  virtual void concat_cols(const Tensor& a, const Tensor& b, Tensor& out) = 0;  // [T,A],[T,B]→[T,A+B]
  virtual void gather_rows(const Tensor& x, std::span<const int32_t> rows, Tensor& out) = 0;
  virtual void mla_attention(const MlaAttentionArgs& args) = 0;
  // The queries of an MLA layer, q = x · wqᵀ (fp32 [T, heads * qk_head_dim]), for the next
  // mla_attention of `batch` with these weights, which must be q's only reader: a backend may keep
  // them in the form its attention reads and leave q's own rows unwritten. The default runs
  // linear.
  virtual void mla_queries(const Tensor& x, const LinearWeight& wq, const MlaWeights& w, const ForwardBatch& batch,
                           Tensor& q) {
    (void)w;
    (void)batch;
    linear(x, wq, q);
  }
  // mla_queries(x, wq, w, batch, q), then linear(x, w2, out2): a layer's query and latent
  // projections where both read the layer's input (no q_lora). A backend may run them together;
  // the default runs the two.
  virtual void mla_queries_and_linear(const Tensor& x, const LinearWeight& wq, const MlaWeights& w,
                                      const ForwardBatch& batch, Tensor& q, const LinearWeight& w2, Tensor& out2) {
    mla_queries(x, wq, w, batch, q);
    linear(x, w2, out2);
  }
  virtual void moe(const Tensor& x, const MoeWeights& w, Tensor& out, MoeRouting* routing) = 0;
  // A linear layer and the residual step after it: linear(x, w, out), then
  // add_rms_norm(residual, out, norm_w, eps, normed). out is scratch, as in moe_add_rms_norm.
  // The default runs the two.
  virtual void linear_add_rms_norm(const Tensor& x, const LinearWeight& w, Tensor& out, Tensor& residual,
                                   const Tensor& norm_w, float eps, Tensor& normed);
  // A MoE layer and the residual step after it: moe(x, w, out, routing), then
  // add_rms_norm(residual, out, norm_w, eps, normed). out is scratch: a backend that makes the
  // layer's output where the norm adds it may leave it unwritten. normed may be x. The default
  // runs the two.
  virtual void moe_add_rms_norm(const Tensor& x, const MoeWeights& w, Tensor& out, MoeRouting* routing,
                                Tensor& residual, const Tensor& norm_w, float eps, Tensor& normed);
  // Called once a layer's attention or MoE weights are complete, before any forward: a backend
  // may derive data of its own from them into `derived`.
  virtual void prepare(MlaWeights& w) { (void)w; }
  virtual void prepare(MoeWeights& w) { (void)w; }
  // Called once for each MoE layer, after its weights are prepared, with the attention output
  // projection before it and the norm between them: a backend may derive data for making the
  // router's logits from o_proj's input (the model keeps all three in place from then on).
  virtual void prepare_router(MoeWeights& moe, const LinearWeight& o_proj, const Tensor& norm_w) {
    (void)moe;
    (void)o_proj;
    (void)norm_w;
  }
  // Called in each forward before a MoE layer's attention, with the residual rows it starts from
  // (which stay unchanged until o_proj's linear_add_rms_norm adds to them): a hint that the
  // layer's launches up to its moe_add_rms_norm may start on its routing. The default ignores it.
  virtual void will_route(const MoeWeights& moe, const Tensor& residual) {
    (void)moe;
    (void)residual;
  }
  // out = down(silu(gate(x)) · up(x)) with gate_up from make_gate_up.
  virtual void gated_mlp(const Tensor& x, const LinearWeight& gate_up, const LinearWeight& down, Tensor& out);

  // Called by the model at the start of each forward with the step's batch, before any op
  // that reads it: a device backend uploads the step's token layout once here.
  virtual void begin_step(const ForwardBatch& batch) { (void)batch; }
  virtual void end_step() {}  // the step's batch may be gone after this
  // After an exception part way through a step (between begin_step and end_step, recording or
  // not): the step's work is dropped and the backend left ready for the next step.
  virtual void abandon_step() {}
  // The device's memory once its queued work is done: free (cudaMemGetInfo's, which counts what
  // a caching allocator holds idle as used) and total. None for backends without device memory.
  struct DeviceMemory {
    int64_t free_bytes = 0;
    int64_t total_bytes = 0;
  };
  virtual std::optional<DeviceMemory> device_memory() { return std::nullopt; }
  // Greedy choice per row of logits [rows, vocab]: sample_rows with every row greedy.
  void argmax_rows(const Tensor& logits, std::vector<int32_t>& out);
  // One token per row of logits [rows, vocab] as choose_token picks it with that row's
  // parameters and draw; the CPU form (choose_token on copied logits) is the reference.
  virtual void sample_rows(const Tensor& logits, std::span<const RowSampling> rows, std::vector<int32_t>& out);
  // Changes the named logits of logits [rows, vocab] in place (penalised_logit), ahead of the
  // rows' choice: a request's penalties on the tokens it has seen.
  virtual void penalise_logits(Tensor& logits, std::span<const LogitPenalty> penalties) = 0;
  // Asynchronous token choice, for an engine that schedules one step ahead: choose_async
  // enqueues the choice of every row (the argmax when every row is greedy) and returns a
  // ticket at once; wait_choice returns a ticket's ids (tickets are waited in order, at most
  // two outstanding). A later step's token id -1 - r names row r of the latest choice: a
  // device backend resolves it in begin_step, others through input_ids. The default chooses
  // at once.
  virtual uint64_t choose_async(const Tensor& logits, std::span<const RowSampling> rows);
  virtual std::vector<int32_t> wait_choice(uint64_t ticket);
  // The ids the embedding reads: the batch's, with every -1 - r replaced from the latest
  // choice by the default; a device backend that resolves them itself returns them as they are.
  virtual std::span<const TokenId> input_ids(const ForwardBatch& batch);

  // Step recording (CUDA graphs). A backend that records may capture the work issued between
  // begin_recording and end_recording under `key`, and later replay it instead of issuing it
  // again. Inputs reach a replay through the buffers begin_step fills, so everything recorded
  // must read its per-step data from there. end_recording returns false when capture failed
  // (the work was then not run and must be issued eagerly).
  virtual bool can_record() const { return false; }
  // Whether decode steps are padded to their bucket's size, as a recording runs them: where the
  // backend records, and where it is asked to run them so without recording (to tell what a
  // recording changes from what padding changes: a padded step may take other kernel forms).
  virtual bool pads_decode_steps() const { return can_record(); }
  // The form the backend gives a recordable step, beyond its number of rows: steps the backend
  // lays out differently (a long context's attention, say) are recorded apart, under keys that
  // differ in this value. 0 where every step of a size takes one form.
  virtual uint32_t recording_variant(const ForwardBatch& batch) const { (void)batch; return 0; }
  virtual void begin_recording(uint64_t key) { (void)key; }
  virtual bool end_recording(uint64_t key) { (void)key; return false; }
  virtual bool replay(uint64_t key) { (void)key; return false; }

  // Device idle time between consecutive steps since the last call (waits for the steps in
  // flight); nullopt for a backend that does not measure it (the CPU's work is the caller's
  // own thread).
  virtual std::optional<StepGapStats> step_gaps() { return std::nullopt; }

  // KV block movement for the host tier / block store: one layer's block, as the cache stores it
  // (block_size entries of latent_entry_bytes(cache.format, ...) bytes).
  virtual void read_cache_block(const LayerKvCache& cache, int32_t block, void* dst) = 0;
  virtual void write_cache_block(LayerKvCache& cache, int32_t block, const void* src) = 0;

 protected:
  // What every penalise_logits takes: fp32 logits [rows, vocab], each change inside them.
  static void check_logit_penalties(const Tensor& logits, std::span<const LogitPenalty> penalties);

 private:
  // The default asynchronous choice: ids by ticket, the latest choice, resolved input ids.
  std::map<uint64_t, std::vector<int32_t>> choices_;
  std::vector<int32_t> latest_choice_;
  std::vector<TokenId> resolved_ids_;
  uint64_t next_ticket_ = 1;
};

// "cpu" or "cuda"; throws dsinfer::Error for an unknown or unavailable backend. The CPU backend
// is fp32 whatever the precision asked for.
std::unique_ptr<Backend> make_backend(const std::string& name, Precision precision = Precision::kDefault);
bool cuda_backend_available();
// Device-to-device copy bandwidth (bytes read + written per second) of the named backend's
// device, measured now; 0 for backends without a device of their own (cpu).
double measure_device_copy_bandwidth(const std::string& name);
// Dense GEMM rate (FLOP/s) of the named backend's compute, measured now, in the precision its
// linear layers use: cuBLASLt bf16 8192³ on the device for cuda (with fp8: its block-scaled
// e4m3 product, the one FP8 weights take), the backend's own fp32 matmul on all threads for
// cpu. The ceiling that prefill FLOP rates are compared with. sustained_window_s > 0 (cuda):
// the same product back to back for that long, over the whole window (clocks the power limit
// has brought down), instead of the best of short groups.
double measure_device_gemm_flops(const std::string& backend_name, bool fp8 = false, double sustained_window_s = 0);

}  // namespace dsinfer

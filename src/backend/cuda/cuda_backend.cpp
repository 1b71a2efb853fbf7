// The CUDA backend's tensors, weights and simple ops; attention and MoE are in
// cuda_backend_layers.cpp.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_state.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend_factory.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_allocator.h"
#include "backend/cuda/gate_up_halves.h"
#include "backend/cuda/grouped_gemm.h"
#include "backend/cuda/kernel_timeline.h"
#include "backend/cuda/lt_matmul.h"
#include "backend/cuda/packed_weight.h"
#include "backend/cuda/random_weights.h"
#include "backend/cuda/step_gaps.h"
#include "core/logging.h"
#include "core/shape.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "model/weights_fp8.h"

namespace dsinfer::cuda {
namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Bytes of a packed weight's elements; an e4m3 weight's scales follow at this offset (256-byte
// aligned).
size_t packed_data_bytes(int64_t n_padded, int64_t k_padded, int64_t elem_bytes) {
  return static_cast<size_t>(round_up(n_padded * k_padded * elem_bytes, 256));
}

// A checkpoint tensor widened to fp32 on the host, FP8 block scales applied.
std::vector<float> widen_host(const HostTensor& h) {
  const int64_t n = num_elements(h.shape);
  std::vector<float> out(n);
  if (h.dtype == DType::kF8E4M3 && h.scale_inv != nullptr) {
    DS_CHECK(h.shape.size() == 2);
    dequantize_fp8_block(static_cast<const uint8_t*>(h.data), h.scale_inv, h.shape[0], h.shape[1], h.block_rows,
                         h.block_cols, out.data());
  } else {
    convert_to_f32(h.dtype, h.data, out.data(), n);
  }
  return out;
}

// Whether bf16 holds each of the n values as it is (its low 16 bits are zero).
bool all_bf16(const float* values, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, values + i, sizeof(bits));
    if ((bits & 0xFFFFu) != 0) return false;
  }
  return true;
}

void check_linear(const Tensor& x, const LinearWeight& w, const Tensor& out) {
  DS_CHECK_MSG(x.dim(1) == w.in_features, "linear: input width " << x.dim(1) << " vs " << w.in_features);
  DS_CHECK_MSG(!w.packed_gate_up, "linear: a packed gate/up weight goes through gated_mlp or moe");
  DS_CHECK(x.dtype == DType::kF32 && out.dtype == DType::kF32 && out.dim(1) == w.out_features);
}

}  // namespace

namespace {
bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == value;
}
}  // namespace

CudaBackend::CudaBackend(Precision precision) {
  DS_CUDA_CHECK(cudaSetDevice(0));
  // The main stream at the highest priority: where work forks onto the side stream (shared
  // experts beside the routing), the main stream's kernels are the step's critical path.
  int least_priority = 0, greatest_priority = 0;
  DS_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least_priority, &greatest_priority));
  DS_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest_priority));
  DS_CUDA_CHECK(cudaStreamCreateWithPriority(&side_stream_, cudaStreamNonBlocking, least_priority));
  DS_CUDA_CHECK(cudaEventCreateWithFlags(&fork_event_, cudaEventDisableTiming));
  DS_CUDA_CHECK(cudaEventCreateWithFlags(&join_event_, cudaEventDisableTiming));
  alloc_ = std::make_shared<DeviceAllocator>();
  int64_t tune_max_rows = 0;
  if (const char* rows = std::getenv("DSINFER_CUBLASLT_TUNE_MAX_ROWS")) tune_max_rows = std::max(0, std::atoi(rows));
  matmul_ = std::make_unique<LtMatmul>(stream_, tune_max_rows);
  side_matmul_ = std::make_unique<LtMatmul>(side_stream_, tune_max_rows);
  step_ = std::make_unique<StepBuffers>();
  recordings_ = std::make_unique<Recordings>();
  choices_ = std::make_unique<Choices>();
  step_gaps_ = std::make_unique<StepGapTracker>();
  for (Choices::Slot& slot : choices_->slots)
    DS_CUDA_CHECK(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
  DS_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, 0));
  DS_CUDA_CHECK(cudaEventCreateWithFlags(&step_->copied, cudaEventDisableTiming));
  tile_counters_ = alloc_->persistent({kGemmMaxTileCounters}, DType::kI32);
  DS_CUDA_CHECK(cudaMemsetAsync(tile_counters_.data, 0, tile_counters_.num_bytes(), stream_));
  combine_arrivals_ = alloc_->persistent({kMaxCombineSlices}, DType::kI32);
  DS_CUDA_CHECK(cudaMemsetAsync(combine_arrivals_.data, 0, combine_arrivals_.num_bytes(), stream_));
  argmax_scratch_ = alloc_->persistent({argmax_scratch_bytes()}, DType::kU8);
  DS_CUDA_CHECK(cudaMemsetAsync(argmax_scratch_.data, 0, argmax_scratch_.num_bytes(), stream_));
  f32_products_ = precision == Precision::kFp32 || env_is("DSINFER_CUDA_PRECISION", "fp32");
  batch_invariant_ = f32_products_ || env_is("DSINFER_BATCH_INVARIANT", "1");
  two_term_weights_ = !env_is("DSINFER_CUDA_WEIGHT_TERMS", "1");
  if (env_is("DSINFER_CUDA_GRAPHS", "0")) graphs_ = Graphs::kEager;
  else if (env_is("DSINFER_CUDA_GRAPHS", "padded")) graphs_ = Graphs::kPadded;
  gate_up_halves_ready_ = !env_is("DSINFER_GATE_UP_HALVES", "0");
  fused_prefill_attention_ = !env_is("DSINFER_MLA_FLASH", "0");
  warpgroup_flash_attention_ = !env_is("DSINFER_MLA_FLASH_WGMMA", "0");
  if (const char* tokens = std::getenv("DSINFER_MLA_EXPANDED_MIN_TOKENS"))
    expanded_min_tokens_ = std::max(1, std::atoi(tokens));
  cache_write_beside_ = !env_is("DSINFER_MLA_CACHE_WRITE_BESIDE", "0");
  fixed_split_forms_ = !env_is("DSINFER_MLA_SPLIT_GENERIC", "1");
  if (env_is("DSINFER_MLA_SPLIT_GROUP", "4")) split_group_positions_ = 4;
  if (env_is("DSINFER_MLA_SPLIT_GROUP", "1")) split_group_positions_ = 1;
  device_random_weights_ = !env_is("DSINFER_DEVICE_RANDOM_WEIGHTS", "0");
  shared_experts_alongside_ = !env_is("DSINFER_MOE_SIDE_STREAM", "0");
  shared_experts_in_routing_ = shared_experts_alongside_ && !env_is("DSINFER_MOE_SHARED_IN_ROUTING", "0");
  if (!shared_experts_alongside_ || env_is("DSINFER_MOE_SHARED_BESIDE_LIBRARY", "0"))
    shared_beside_library_max_tokens_ = 0;
  else if (env_is("DSINFER_MOE_SHARED_BESIDE_LIBRARY", "1"))
    shared_beside_library_max_tokens_ = INT64_MAX;
  if (env_is("DSINFER_MOE_COMBINE_IN_NORM", "0")) combine_in_norm_min_rows_ = INT64_MAX;
  if (env_is("DSINFER_MOE_COMBINE_IN_NORM", "1")) combine_in_norm_min_rows_ = 1;
  router_beside_o_proj_ = !env_is("DSINFER_ROUTER_BESIDE_O_PROJ", "0");
  shared_down_with_routed_ = !env_is("DSINFER_MOE_SHARED_DOWN_WITH_ROUTED", "0");
  if (env_is("DSINFER_MOE_ONE_TOKEN_ORDER", "beside")) one_token_moe_order_ = OneTokenMoeOrder::kBeside;
  one_token_route_in_a_warp_ = !env_is("DSINFER_MOE_ROUTE_ONE_WARP", "0");
  if (env_is("DSINFER_MOE_ROUTE_REHEARSAL", "1")) route_rehearsal_ = RouteRehearsal::kSameWarp;
  if (env_is("DSINFER_MOE_ROUTE_REHEARSAL", "beside")) route_rehearsal_ = RouteRehearsal::kBesideWarp;
  combine_in_down_ = !env_is("DSINFER_MOE_COMBINE_IN_DOWN", "0");
  weights_l2_evict_first_ = !env_is("DSINFER_WEIGHTS_L2_EVICT_FIRST", "0");
  attention_weights_l2_evict_first_ = !env_is("DSINFER_ATTN_WEIGHTS_L2_EVICT_FIRST", "0");
  if (const char* slots = std::getenv("DSINFER_MOE_COMBINE_SLOTS_AT_ONCE"))
    combine_slots_at_once_ = std::clamp(std::atoi(slots), 1, kMoeCombineSlotsAtOnce);
  if (const char* tokens = std::getenv("DSINFER_MLA_HEAD_TILE_MIN_TOKENS"))
    head_tile_min_tokens_ = std::max(1, std::atoi(tokens));
  if (const char* runs = std::getenv("DSINFER_MLA_FEW_TOKEN_TILES"))
    few_token_tile_runs_ = std::clamp(std::atoi(runs), 0, kMaxMlaSplits);
  if (const char* tokens = std::getenv("DSINFER_MLA_FEW_TOKEN_TILES_MIN"))
    few_token_tiles_min_tokens_ = std::max(1, std::atoi(tokens));
  if (const char* tokens = std::getenv("DSINFER_MLA_FEW_TOKEN_TILES_MAX"))
    few_token_tiles_max_tokens_ = std::max(1, std::atoi(tokens));
  if (const char* positions = std::getenv("DSINFER_MLA_LONG_CONTEXT_TILES"))
    long_context_tiles_min_positions_ = std::max(0, std::atoi(positions));
  if (const char* runs = std::getenv("DSINFER_MLA_LONG_CONTEXT_RUNS"))
    long_context_max_runs_ = std::clamp(std::atoi(runs), kMaxMlaSplits, kMaxMlaLongSplits);
  few_token_tiles_early_ = !env_is("DSINFER_MLA_FEW_TOKEN_TILES_EARLY", "0");
  if (const char* blocks = std::getenv("DSINFER_MLA_QUERY_TILE_BLOCKS"))
    query_tile_blocks_per_sm_ = std::clamp(std::atoi(blocks), 0, 64);
  if (const char* tokens = std::getenv("DSINFER_MLA_MERGE_BESIDE_W_UV"))
    merge_beside_max_tokens_ = std::clamp(std::atoi(tokens), 0, 4);
  if (env_is("DSINFER_MOE_PREFILL_EXPERTS", "chunked")) prefill_experts_ = PrefillExperts::kChunked;
  if (env_is("DSINFER_MOE_PREFILL_EXPERTS", "host")) prefill_experts_ = PrefillExperts::kHostPlanned;
  if (env_is("DSINFER_MOE_PREFILL_EXPERTS", "grouped")) prefill_experts_ = PrefillExperts::kGrouped;
  fp8_experts_chunked_ = !env_is("DSINFER_MOE_FP8_CHUNKED", "0");
  fp8_expert_blocks_ = !env_is("DSINFER_MOE_FP8_EXPERT_BLOCKS", "0");
  fp8_expert_activations_ = !env_is("DSINFER_MOE_FP8_ACTIVATIONS", "0");
  fp8_gate_up_bf16_ = !env_is("DSINFER_FP8_GATE_UP_BF16", "0");
  silu_e4m3_ = !env_is("DSINFER_SILU_E4M3", "0");
  f32_e4m3_ = !env_is("DSINFER_F32_E4M3", "0");
  prefill_expert_outputs_bf16_ = !env_is("DSINFER_MOE_PREFILL_OUTPUTS_BF16", "0");
  norm_writes_e4m3_ = !env_is("DSINFER_NORM_E4M3", "0");
  if (const char* rows = std::getenv("DSINFER_FEW_ROW_PAIRS")) few_row_pairs_max_rows_ = std::max(0, std::atoi(rows));
  if (const char* rows = std::getenv("DSINFER_NORM_IN_PRODUCTS"))
    norms_in_products_max_rows_ = std::max(0, std::atoi(rows));
  if (env_is("DSINFER_MOE_PREFILL_WEIGHT_ROWS", "128")) prefill_expert_weight_rows_ = 128;
  if (env_is("DSINFER_MOE_PREFILL_WEIGHT_ROWS", "192")) prefill_expert_weight_rows_ = 192;
  if (env_is("DSINFER_MOE_PREFILL_WEIGHT_ROWS", "256")) prefill_expert_weight_rows_ = 256;
  prefill_expert_silu_e4m3_ = !env_is("DSINFER_MOE_PREFILL_SILU_E4M3", "0");
  prefill_expert_staged_bf16_ = !env_is("DSINFER_MOE_PREFILL_STAGED_BF16", "0");
  prefill_expert_tma_weights_ = !env_is("DSINFER_MOE_PREFILL_TMA_WEIGHTS", "0");
  prefill_expert_tma_rows_ = !env_is("DSINFER_MOE_PREFILL_TMA_ROWS", "0");
  if (env_is("DSINFER_MOE_FP8_PASS_ROWS", "32")) fp8_expert_pass_rows_ = 32;
  if (env_is("DSINFER_MOE_FP8_PASS_ROWS", "64")) fp8_expert_pass_rows_ = 64;
  library_fp8_ = !env_is("DSINFER_CUDA_FP8_GEMM", "0");
  few_row_mma_experts_ = !env_is("DSINFER_FEW_ROW_MMA", "0");
  few_row_mma_one_token_ = env_is("DSINFER_FEW_ROW_MMA", "experts") || env_is("DSINFER_FEW_ROW_MMA", "all");
  few_row_mma_dense_ = env_is("DSINFER_FEW_ROW_MMA", "all");
  few_row_fixed_phases_ = !env_is("DSINFER_FEW_ROW_FIXED_PHASES", "0");
  few_row_f32_rows_ = !env_is("DSINFER_FEW_ROW_F32_ROWS", "0");
  few_row_f32_rows_e4m3_ = !env_is("DSINFER_FEW_ROW_F32_ROWS", "bf16-weights");
  if (const char* rows = std::getenv("DSINFER_CUDA_GEMM_MAX_ROWS"))
    own_gemm_max_rows_ = own_gemm_max_rows_fp8_ = std::max(1, std::atoi(rows));
  if (const char* rows = std::getenv("DSINFER_CUDA_FP8_GEMM_MAX_ROWS"))
    own_gemm_max_rows_fp8_ = std::max(1, std::atoi(rows));
  if (const char* terms = std::getenv("DSINFER_FP8_ACTIVATION_TERMS"))
    fp8_activation_terms_ = std::clamp(std::atoi(terms), 1, kMaxFp8ActivationTerms);
  if (const char* rows = std::getenv("DSINFER_FP8_TERMS_MAX_ROWS"))
    fp8_terms_max_rows_ = std::max(0, std::atoi(rows));
  fp8_terms_in_decode_ = env_is("DSINFER_FP8_TERMS_IN_DECODE", "1");
  if (const char* rows = std::getenv("DSINFER_CUDA_FEW_ROW_GEMM_MAX_ROWS"))
    few_row_gemm_max_rows_ = std::clamp(std::atoi(rows), 0, kFewRowGemmMaxRows);
  if (const char* tokens = std::getenv("DSINFER_MOE_FEW_ROW_MAX_TOKENS"))
    moe_few_row_max_tokens_ = std::max(0, std::atoi(tokens));
  if (const char* rows = std::getenv("DSINFER_MOE_EXPERT_BLOCK_MIN_ROWS"))
    expert_block_min_rows_ = std::max(1, std::atoi(rows));
  if (const char* rows = std::getenv("DSINFER_MOE_FP8_EXPERT_BLOCK_MIN_ROWS"))
    fp8_expert_block_min_rows_ = std::max(1, std::atoi(rows));
  timeline_ = kernel_timeline_from_env();
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(stream_);
  if (timeline_ != nullptr) {
    auto it = recordings_->launches.find(timeline_key_);
    if (it != recordings_->launches.end()) timeline_->write(it->second, stream_);
    timeline_.reset();
  }
  recordings_.reset();
  choices_.reset();
  step_.reset();
  matmul_.reset();
  cudaStreamSynchronize(side_stream_);
  side_matmul_.reset();
  cudaEventDestroy(fork_event_);
  cudaEventDestroy(join_event_);
  cudaStreamDestroy(side_stream_);
  cudaStreamDestroy(stream_);
}

void CudaBackend::begin_step(const ForwardBatch& batch) {
  forget_normed_copy();
  route_hint_ = {};  // a step cut short may have left one
  using F = StepBuffers::Field;
  StepBuffers& st = *step_;
  int64_t table_ints = 0;
  for (const auto& t : batch.block_tables) table_ints += static_cast<int64_t>(t.size());
  const int64_t num_seqs = static_cast<int64_t>(batch.block_tables.size());
  const int64_t need[F::kNumFields] = {batch.num_tokens, batch.num_tokens, batch.num_tokens, batch.num_tokens,
                                       static_cast<int64_t>(batch.logits_indices.size()), num_seqs, table_ints};
  bool grow = st.host == nullptr;
  for (int f = 0; f < F::kNumFields; ++f) grow = grow || need[f] > st.capacity[f];
  DS_CUDA_CHECK(cudaEventSynchronize(st.copied));
  if (grow) {
    DS_CHECK_MSG(!recording_, "step buffers cannot move while a step is being recorded");
    static constexpr int64_t kMinCapacity[F::kNumFields] = {4096, 4096, 4096, 4096, 1024, 1024, 1 << 16};
    int64_t total = 0;
    for (int f = 0; f < F::kNumFields; ++f) {
      st.capacity[f] = std::max({st.capacity[f], kMinCapacity[f], round_up(need[f] * 2, 64)});
      st.offset[f] = total;
      total += st.capacity[f];  // multiples of 64 ints: every field starts 256-byte aligned
    }
    if (st.host != nullptr) DS_CUDA_CHECK(cudaFreeHost(st.host));
    st.host = nullptr;
    DS_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&st.host), total * sizeof(int32_t)));
    st.device = alloc_->persistent({total}, DType::kI32);
    recordings_->clear();
  }
  int32_t* h = st.host;
  auto put = [&](F f, const int32_t* src, int64_t n) {
    if (n > 0) std::memcpy(h + st.offset[f], src, n * sizeof(int32_t));
  };
  put(F::kTokenIds, batch.token_ids.data(), need[F::kTokenIds]);
  put(F::kPositions, batch.positions.data(), need[F::kPositions]);
  put(F::kTokenSeq, batch.token_seq.data(), need[F::kTokenSeq]);
  put(F::kSlots, batch.slot_mapping.data(), need[F::kSlots]);
  put(F::kLogitsRows, batch.logits_indices.data(), need[F::kLogitsRows]);
  int32_t next = 0;
  for (int64_t i = 0; i < num_seqs; ++i) {
    h[st.offset[F::kTableOffsets] + i] = next;
    std::memcpy(h + st.offset[F::kTables] + next, batch.block_tables[i].data(),
                batch.block_tables[i].size() * sizeof(int32_t));
    next += static_cast<int32_t>(batch.block_tables[i].size());
  }
  step_decode_only_ = num_seqs == batch.num_tokens;
  step_gaps_->mark_head(stream_, step_decode_only_);
  int32_t* d = st.device.as<int32_t>();
  for (int f = 0; f < F::kNumFields; ++f) {
    if (need[f] == 0) continue;
    DS_CUDA_CHECK(cudaMemcpyAsync(d + st.offset[f], h + st.offset[f], need[f] * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, stream_));
  }
  DS_CUDA_CHECK(cudaEventRecord(st.copied, stream_));
  // Token placeholders -1 - r (the engine scheduled this step before the last one's tokens
  // reached the host) take row r of the latest choice, on the device.
  int64_t max_row = -1;
  for (TokenId id : batch.token_ids) max_row = std::max<int64_t>(max_row, -1 - static_cast<int64_t>(id));
  if (max_row >= 0) {
    DS_CHECK_MSG(choices_->latest >= 0 && max_row < choices_->slots[choices_->latest].rows,
                 "a token placeholder names row " << max_row << " of no pending choice");
    launch_resolve_placeholders(d + st.offset[F::kTokenIds], batch.num_tokens,
                                choices_->slots[choices_->latest].ids.as<int32_t>(), stream_);
  }
  step_batch_ = &batch;
}

const int32_t* CudaBackend::step_ints(const void* host_field) const {
  if (step_batch_ == nullptr || host_field == nullptr) return nullptr;
  if (!step_batch_->token_ids.empty() && host_field == step_batch_->token_ids.data())
    return step_->field(StepBuffers::kTokenIds);
  if (!step_batch_->logits_indices.empty() && host_field == step_batch_->logits_indices.data())
    return step_->field(StepBuffers::kLogitsRows);
  return nullptr;
}

const int32_t* CudaBackend::device_ints(std::span<const int32_t> host, Tensor& uploaded) {
  if (const int32_t* d = step_ints(host.data())) return d;
  uploaded = upload_ints(std::vector<int32_t>(host.begin(), host.end()));
  return uploaded.as<int32_t>();
}

void CudaBackend::begin_recording(uint64_t key) {
  forget_normed_copy();
  (void)key;
  DS_CHECK(!recording_);
  alloc_->set_graph_pool(true);
  recording_ = true;
  if (timeline_ != nullptr) timeline_->open_log();
  DS_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
}

bool CudaBackend::end_recording(uint64_t key) {
  forget_normed_copy();
  DS_CHECK(recording_);
  cudaGraph_t graph = nullptr;
  cudaError_t err = cudaStreamEndCapture(stream_, &graph);
  alloc_->set_graph_pool(false);
  recording_ = false;
  if (timeline_ != nullptr) recordings_->launches[key] = timeline_->close_log();
  if (err != cudaSuccess || graph == nullptr) {
    cudaGetLastError();
    DS_LOG_WARN("cuda: recording a step failed (" << cudaGetErrorString(err) << "); it runs eagerly");
    return false;
  }
  cudaGraphExec_t exec = nullptr;
  err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (err != cudaSuccess) {
    cudaGetLastError();
    DS_LOG_WARN("cuda: instantiating a recorded step failed (" << cudaGetErrorString(err) << "); it runs eagerly");
    return false;
  }
  auto it = recordings_->graphs.find(key);
  if (it != recordings_->graphs.end()) cudaGraphExecDestroy(it->second);
  recordings_->graphs[key] = exec;
  return true;
}

bool CudaBackend::replay(uint64_t key) {
  forget_normed_copy();
  auto it = recordings_->graphs.find(key);
  if (it == recordings_->graphs.end()) return false;
  if (timeline_ != nullptr) {
    timeline_->clear(stream_);
    timeline_key_ = key;
  }
  DS_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
  return true;
}

void CudaBackend::choose_into(const Tensor& logits, std::span<const RowSampling> rows, int32_t* ids) {
  DS_CHECK(logits.dtype == DType::kF32 && logits.shape.size() == 2);
  const int64_t num_rows = logits.dim(0), vocab = logits.dim(1);
  DS_CHECK_MSG(static_cast<int64_t>(rows.size()) == num_rows,
               "token choice: " << rows.size() << " parameter rows for " << num_rows << " logit rows");
  if (num_rows == 0) return;
  bool all_greedy = true;
  for (const RowSampling& r : rows) all_greedy = all_greedy && is_greedy(r);
  if (all_greedy) {
    launch_argmax_rows(logits.as<float>(), num_rows, vocab, ids, argmax_scratch_.data, stream_);
    return;
  }
  const size_t params_bytes = rows.size() * sizeof(RowSampling);
  Tensor params = alloc_->cached({static_cast<int64_t>(params_bytes)}, DType::kU8);
  DS_CUDA_CHECK(cudaMemcpyAsync(params.data, rows.data(), params_bytes, cudaMemcpyHostToDevice, stream_));
  const size_t workspace_bytes = sample_rows_workspace_bytes(num_rows, vocab);
  Tensor workspace = alloc_->cached({static_cast<int64_t>(workspace_bytes)}, DType::kU8);
  launch_sample_rows(logits.as<float>(), num_rows, vocab, static_cast<const RowSampling*>(params.data),
                     workspace.data, workspace_bytes, ids, stream_);
}

void CudaBackend::penalise_logits(Tensor& logits, std::span<const LogitPenalty> penalties) {
  check_logit_penalties(logits, penalties);
  if (penalties.empty()) return;
  // A factor still pending on the rows (a norm's) applies before the change, not after it.
  reconcile_norm({&logits}, {});
  forget_normed_copy();
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  const size_t bytes = penalties.size() * sizeof(LogitPenalty);
  Tensor device = alloc_->cached({static_cast<int64_t>(bytes)}, DType::kU8);
  // From pageable memory: the copy has read `penalties` when it returns.
  DS_CUDA_CHECK(cudaMemcpyAsync(device.data, penalties.data(), bytes, cudaMemcpyHostToDevice, stream_));
  launch_penalise_logits(logits.as<float>(), rows, vocab, static_cast<const LogitPenalty*>(device.data),
                         static_cast<int64_t>(penalties.size()), stream_);
}

void CudaBackend::sample_rows(const Tensor& logits, std::span<const RowSampling> rows, std::vector<int32_t>& out) {
  reconcile_norm({&logits}, {});
  forget_normed_copy();
  const int64_t num_rows = logits.dim(0);
  out.resize(static_cast<size_t>(num_rows));
  if (num_rows == 0) return;
  Tensor ids = alloc_->cached({num_rows}, DType::kI32);
  choose_into(logits, rows, ids.as<int32_t>());
  DS_CUDA_CHECK(cudaMemcpyAsync(out.data(), ids.data, num_rows * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  synchronize();
}

void CudaBackend::end_step() {
  forget_normed_copy();
  step_batch_ = nullptr;
  step_decode_only_ = false;
  step_gaps_->mark_tail(stream_);
}

void CudaBackend::abandon_step() {
  if (recording_) {
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream_, &graph);  // the partial recording is discarded
    if (graph != nullptr) cudaGraphDestroy(graph);
    alloc_->set_graph_pool(false);
    recording_ = false;
    if (timeline_ != nullptr) timeline_->close_log();
  }
  cudaGetLastError();  // an allocation failure is not sticky; clear it
  forget_normed_copy();
  pending_norm_ = {};
  if (step_batch_ != nullptr) step_gaps_->mark_tail(stream_);
  step_batch_ = nullptr;
  step_decode_only_ = false;
  // What the step launched finishes before its blocks are freed: the next step, likely as large,
  // then starts from memory given back to the device rather than a fragmented cache.
  synchronize();
  alloc_->release_cached();
}

std::optional<Backend::DeviceMemory> CudaBackend::device_memory() {
  synchronize();
  size_t free_bytes = 0, total_bytes = 0;
  DS_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return DeviceMemory{static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

std::optional<StepGapStats> CudaBackend::step_gaps() { return step_gaps_->take_stats(); }

uint64_t CudaBackend::choose_async(const Tensor& logits, std::span<const RowSampling> rows) {
  reconcile_norm({&logits}, {});
  forget_normed_copy();
  Choices& c = *choices_;
  Choices::Slot& slot = c.slots[c.latest == 0 ? 1 : 0];
  DS_CHECK_MSG(slot.ticket == 0, "choose_async: two choices are still waiting");
  const int64_t num_rows = logits.dim(0);
  if (num_rows > slot.capacity) {
    const int64_t capacity = std::max<int64_t>(num_rows, 256);
    Tensor ids = alloc_->persistent({capacity}, DType::kI32);  // may throw: the slot is left as it was
    if (slot.host != nullptr) DS_CUDA_CHECK(cudaFreeHost(slot.host));
    slot.host = nullptr;
    DS_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&slot.host), capacity * sizeof(int32_t)));
    slot.ids = std::move(ids);
    slot.capacity = capacity;
  }
  choose_into(logits, rows, slot.ids.as<int32_t>());
  if (num_rows > 0)
    DS_CUDA_CHECK(cudaMemcpyAsync(slot.host, slot.ids.data, num_rows * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                  stream_));
  DS_CUDA_CHECK(cudaEventRecord(slot.copied, stream_));
  step_gaps_->mark_tail(stream_);
  slot.rows = num_rows;
  slot.ticket = c.next_ticket++;
  c.latest = static_cast<int>(&slot - c.slots);
  return slot.ticket;
}

std::vector<int32_t> CudaBackend::wait_choice(uint64_t ticket) {
  for (Choices::Slot& slot : choices_->slots) {
    if (slot.ticket != ticket || ticket == 0) continue;
    DS_CUDA_CHECK(cudaEventSynchronize(slot.copied));
    slot.ticket = 0;  // free for the next choice; its device ids stay readable until then
    return std::vector<int32_t>(slot.host, slot.host + slot.rows);
  }
  DS_CHECK_MSG(false, "wait_choice: unknown ticket " << ticket);
  return {};
}

void CudaBackend::synchronize() { DS_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

Tensor CudaBackend::empty(const std::vector<int64_t>& shape, DType dtype) { return alloc_->cached(shape, dtype); }

Tensor CudaBackend::upload_ints(const std::vector<int32_t>& v) {
  DS_CHECK_MSG(!recording_, "a recorded step reads its inputs from the step buffers only");
  Tensor t = alloc_->cached({static_cast<int64_t>(v.size())}, DType::kI32);
  if (!v.empty())
    DS_CUDA_CHECK(cudaMemcpyAsync(t.data, v.data(), v.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  return t;
}

Tensor CudaBackend::view_rows(const Tensor& t, int64_t row_begin, int64_t num_rows) const {
  Tensor v = t;
  const int64_t row_elems = t.num_elements() / t.dim(0);
  v.data = static_cast<char*>(t.data) + row_begin * row_elems * dtype_size_bytes(t.dtype);
  v.shape[0] = num_rows;
  return v;
}

Tensor CudaBackend::from_host(const HostTensor& host) {
  forget_normed_copy();
  if (host.dtype == DType::kI32 || host.dtype == DType::kI64) {
    Tensor t = alloc_->persistent(host.shape, host.dtype);
    DS_CUDA_CHECK(cudaMemcpyAsync(t.data, host.data, t.num_bytes(), cudaMemcpyHostToDevice, stream_));
    return t;
  }
  Tensor t = alloc_->persistent(host.shape, DType::kF32);
  if (host.dtype == DType::kF32) {
    DS_CUDA_CHECK(cudaMemcpyAsync(t.data, host.data, t.num_bytes(), cudaMemcpyHostToDevice, stream_));
  } else {
    const std::vector<float> wide = widen_host(host);
    DS_CUDA_CHECK(cudaMemcpyAsync(t.data, wide.data(), t.num_bytes(), cudaMemcpyHostToDevice, stream_));
  }
  return t;
}

void CudaBackend::to_host(const Tensor& t, float* dst) {
  reconcile_norm({&t}, {});
  if (t.dtype == DType::kBF16) {
    std::vector<uint16_t> bits(t.num_elements());
    DS_CUDA_CHECK(cudaMemcpyAsync(bits.data(), t.data, t.num_bytes(), cudaMemcpyDeviceToHost, stream_));
    synchronize();
    for (size_t i = 0; i < bits.size(); ++i) dst[i] = bf16_to_f32(bits[i]);
    return;
  }
  DS_CHECK(t.dtype == DType::kF32);
  DS_CUDA_CHECK(cudaMemcpyAsync(dst, t.data, t.num_bytes(), cudaMemcpyDeviceToHost, stream_));
  synchronize();
}

LinearWeight CudaBackend::make_linear(const HostTensor& w) {
  return f32_products_ ? f32_weight(w, false) : pack_weight(w, false);
}

LinearWeight CudaBackend::make_gate_up(const HostTensor& w) {
  return f32_products_ ? f32_weight(w, true) : pack_weight(w, true);
}

LinearWeight CudaBackend::pack_weight(const HostTensor& w, bool gate_up) {
  DS_CHECK(w.shape.size() == 2);
  const int64_t rows = w.shape[0], cols = w.shape[1];
  // e4m3 stays e4m3 when its scale blocks cover whole 16-row groups of the packed layout.
  const bool fp8 = w.dtype == DType::kF8E4M3 && w.scale_inv != nullptr && w.block_rows % kPackedScaleRows == 0 &&
                   w.block_cols == 128 && (!gate_up || (rows / 2) % kPackedScaleRows == 0);
  std::vector<float> wide;
  const float* values = nullptr;
  if (!fp8) {
    values = static_cast<const float*>(w.data);
    if (w.dtype != DType::kF32) {
      wide = widen_host(w);
      values = wide.data();
    }
  }
  // The routed experts stay in one term: their grouped products read each row once, and they
  // hold most of a MoE model's bytes. So do widened e4m3 values (scale × code), as on the CPU.
  const bool two_terms = !fp8 && two_term_weights_ && !w.routed_expert && w.dtype == DType::kF32 &&
                         !all_bf16(values, rows * cols);
  const int64_t term_cols = round_up(cols, kLibraryFp8TileColumns);
  const PackedWeightLayout layout(rows, two_terms ? 2 * term_cols : cols, gate_up, fp8, w.block_rows);
  const int64_t n_p = layout.n_padded, k_p = layout.k_padded, scale_cols = layout.scale_cols;
  std::vector<uint8_t> image(layout.total_bytes(), 0);
  if (fp8) {
    const uint8_t* src = static_cast<const uint8_t*>(w.data);
    const int64_t col_blocks = (cols + 127) / 128;  // == scale_cols
    auto scale_of = [&](int64_t source, int64_t cb) {
      return source >= 0 ? w.scale_inv[(source / w.block_rows) * col_blocks + cb] : 1.0f;
    };
    float* scales = reinterpret_cast<float*>(image.data() + layout.data_bytes);
    float* library = reinterpret_cast<float*>(image.data() + layout.data_bytes + layout.scale_bytes);
    for (int64_t r = 0; r < n_p; ++r) {
      const int64_t s = layout.source_row(r);
      if (s >= 0) std::memcpy(image.data() + r * k_p, src + s * cols, cols);
      for (int64_t cb = 0; cb < scale_cols; ++cb) {
        if (r % kPackedScaleRows == 0) scales[(r / kPackedScaleRows) * scale_cols + cb] = scale_of(s, cb);
        if (!layout.library_blocks) library[cb * n_p + r] = scale_of(s, cb);
        else if (r % 128 == 0) library[(r / 128) * layout.library_block_cols + cb] = scale_of(s, cb);
      }
    }
  } else {
    uint16_t* dst = reinterpret_cast<uint16_t*>(image.data());
    // Round to bf16 on the host (all threads) so that only 2 bytes per weight cross PCIe.
    global_thread_pool().parallel_for(n_p, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const int64_t s = layout.source_row(r);
        if (s < 0) continue;
        for (int64_t c = 0; c < cols; ++c) {
          const float value = values[s * cols + c];
          const uint16_t rounded = f32_to_bf16(value);
          dst[r * k_p + c] = rounded;
          if (two_terms) dst[r * k_p + term_cols + c] = f32_to_bf16(value - bf16_to_f32(rounded));
        }
      }
    }, std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, cols)));
  }
  Tensor storage = alloc_->persistent_bytes(image.size());
  DS_CUDA_CHECK(cudaMemcpyAsync(storage.data, image.data(), image.size(), cudaMemcpyHostToDevice, stream_));
  synchronize();  // the host image goes out of scope
  LinearWeight lw = packed_linear(storage, layout);
  lw.in_features = cols;
  return lw;
}

std::optional<LinearWeight> CudaBackend::make_random_linear(const RandomLinearSpec& spec) {
  if (!device_random_weights_ || f32_products_) return std::nullopt;
  // An e4m3 gate/up whose halves split a 16-row scale group is widened to bf16 from host values,
  // as pack_weight does with a checkpoint's.
  if (spec.fp8 && spec.gate_up && spec.out_features % kPackedScaleRows != 0) return std::nullopt;
  DS_CHECK_MSG(spec.out_features > 0 && spec.in_features > 0,
               "random weight [" << spec.out_features << ", " << spec.in_features << "]");
  const int64_t rows = spec.gate_up ? 2 * spec.out_features : spec.out_features;
  const PackedWeightLayout layout(rows, spec.in_features, spec.gate_up, spec.fp8, kRandomWeightBlockEdge);
  Tensor storage = alloc_->persistent_bytes(layout.total_bytes());
  Tensor block_scales;
  if (spec.fp8) block_scales = alloc_->cached({random_weight_block_scales(layout)}, DType::kF32);
  launch_random_packed_weight(layout, spec.seeds[0], spec.seeds[1], spec.scale, storage.data,
                              spec.fp8 ? block_scales.as<float>() : nullptr, stream_);
  return packed_linear(storage, layout);
}

LinearWeight CudaBackend::packed_linear(const Tensor& storage, const PackedWeightLayout& layout) {
  LinearWeight lw;
  lw.out_features = layout.rows;
  lw.in_features = layout.cols;
  lw.weight = storage;
  lw.weight.shape = {layout.n_padded, layout.k_padded};
  lw.weight.dtype = layout.fp8 ? DType::kF8E4M3 : DType::kBF16;
  lw.packed_gate_up = layout.gate_up;
  gate_up_halves_.erase(storage.data);  // a copy made for a weight freed before, at this address
  if (layout.fp8) {
    fp8_library_scales_[storage.data] = {
        reinterpret_cast<const float*>(static_cast<const char*>(storage.data) + layout.data_bytes +
                                       layout.scale_bytes),
        layout.library_blocks, layout.gate_up_halves_blocks};
  }
  return lw;
}

int weight_terms(const LinearWeight& w) {
  return w.weight.dtype == DType::kBF16 && w.weight.shape.size() == 2 &&
                 w.weight.dim(1) == 2 * round_up(w.in_features, kLibraryFp8TileColumns)
             ? 2
             : 1;
}

int64_t input_cols_padded(const LinearWeight& w) { return w.weight.dim(1) / weight_terms(w); }

GemmWeight gemm_weight_of(const LinearWeight& w) {
  DS_CHECK(w.weight.dtype == DType::kBF16 || w.weight.dtype == DType::kF8E4M3);
  GemmWeight g;
  g.data = w.weight.data;
  g.n_padded = static_cast<int32_t>(w.weight.dim(0));
  g.k_padded = static_cast<int32_t>(w.weight.dim(1));
  if (w.weight.dtype == DType::kF8E4M3)
    g.scales = reinterpret_cast<const float*>(static_cast<const char*>(w.weight.data) +
                                              packed_data_bytes(w.weight.dim(0), w.weight.dim(1), 1));
  return g;
}

Tensor CudaBackend::to_bf16_padded(const Tensor& x, int64_t k_padded) {
  DS_CHECK(x.dtype == DType::kF32 && x.shape.size() == 2 && x.dim(1) <= k_padded);
  // A pending norm's copy, for products that apply its factor (gemm, moe_until_combine); any
  // other view of its rows gets them finished first.
  if (pending_norm_.of == x.data && pending_norm_.rows == x.dim(0) && pending_norm_.scale.n == x.dim(1) &&
      pending_norm_.bf16.dim(1) == k_padded)
    return pending_norm_.bf16;
  reconcile_norm({&x}, {});
  if (normed_copy_.of != nullptr && normed_copy_.of == x.data && normed_copy_.shape == x.shape &&
      normed_copy_.bf16.dim(1) == k_padded)
    return normed_copy_.bf16;
  Tensor xb = alloc_->cached({x.dim(0), k_padded}, DType::kBF16);
  launch_f32_to_bf16_padded(x.as<float>(), x.dim(0), x.dim(1), k_padded, xb.as<uint16_t>(), stream_);
  return xb;
}

CudaBackend::Bf16Rows CudaBackend::start_normed_copy(const Tensor& out) {
  forget_normed_copy();
  // fp32 products read the fp32 rows themselves.
  if (f32_products_ || out.dtype != DType::kF32 || out.shape.size() != 2 || out.dim(0) == 0) return {};
  normed_copy_.of = out.data;
  normed_copy_.keep = out.storage;
  normed_copy_.shape = out.shape;
  normed_copy_.bf16 = alloc_->cached({out.dim(0), round_up(out.dim(1), kLibraryFp8TileColumns)}, DType::kBF16);
  return {normed_copy_.bf16.as<uint16_t>(), normed_copy_.bf16.dim(1)};
}

E4m3Rows CudaBackend::normed_e4m3_rows(int64_t rows) {
  NormedCopy& copy = normed_copy_;
  const bool wanted = norm_writes_e4m3_ && library_fp8_ && !fp8_library_scales_.empty() && !batch_invariant_ &&
                      copy.of != nullptr && rows > own_gemm_max_rows_fp8_ && fp8_activation_terms(rows) == 1 &&
                      copy.shape[1] % kLibraryFp8TileColumns == 0;
  if (!wanted) return {};
  const int64_t rows_padded = round_up(rows, kLibraryFp8RowMultiple);
  keep_quantised(new_quantised_rows(rows_padded, copy.bf16.dim(1)), rows);
  return E4m3Rows{copy.quantised.q.as<uint8_t>(), copy.quantised.scales.as<float>(), rows_padded};
}

CudaBackend::QuantisedRows CudaBackend::new_quantised_rows(int64_t rows_padded, int64_t k) {
  return QuantisedRows{alloc_->cached({rows_padded, k}, DType::kF8E4M3),
                       alloc_->cached({k / kLibraryFp8TileColumns, rows_padded}, DType::kF32)};
}

void CudaBackend::keep_quantised(const QuantisedRows& q, int64_t rows) {
  normed_copy_.quantised = q;
  normed_copy_.quantised_on = stream_;
  normed_copy_.quantised_rows = rows;
}

void CudaBackend::forget_normed_copy_if_written(const Tensor& written) {
  if (normed_copy_.of == nullptr || written.empty()) return;
  const auto* begin = static_cast<const char*>(written.data);
  const auto* of = static_cast<const char*>(normed_copy_.of);
  const size_t of_bytes = num_elements(normed_copy_.shape) * sizeof(float);
  if (begin < of + of_bytes && of < begin + written.num_bytes()) forget_normed_copy();
}

GroupedGemmArgs CudaBackend::dense_product(const Tensor& x_bf16, int64_t rows, const LinearWeight& w,
                                           GemmEpilogue epilogue, void* y, int64_t ldy, int64_t n_out) const {
  const GemmWeight g = gemm_weight_of(w);
  GroupedGemmArgs a;
  a.x = x_bf16.as<uint16_t>();
  a.ldx = g.k_padded;
  a.dense = g;
  a.dense_rows = static_cast<int>(rows);
  a.weights_fp8 = g.scales != nullptr;
  a.few_row_mma = few_row_mma_dense_;
  a.weights_evict_first = weights_l2_evict_first_;
  a.few_row_fixed_phases = few_row_fixed_phases_;
  a.epilogue = epilogue;
  a.y = y;
  a.ldy = ldy;
  a.n_out = static_cast<int>(n_out);
  return a;
}

void CudaBackend::read_f32_rows(GroupedGemmArgs& a, const Tensor* x, int64_t step_rows) const {
  if (x == nullptr || !few_row_f32_rows(step_rows, a.weights_fp8) || x->dtype != DType::kF32 ||
      x->shape.size() != 2 || x->dim(1) % 8 != 0 || x->dim(1) > a.ldx ||
      reinterpret_cast<uintptr_t>(x->data) % 16 != 0)
    return;
  a.x_f32 = x->as<float>();
  a.ldx_f32 = a.x_f32_cols = static_cast<int>(x->dim(1));
}

void CudaBackend::gemm(const Tensor& x_bf16, int64_t rows, const LinearWeight& w, int epilogue, void* y,
                       int64_t ldy, int64_t n_out, bool library_gemm, const Tensor* x_f32) {
  if (rows == 0) return;
  if (weight_terms(w) == 2 && 2 * x_bf16.dim(1) == w.weight.dim(1)) {
    const Tensor twice = rows_for_two_terms(x_bf16, rows, x_f32, library_gemm);
    gemm(twice, rows, w, epilogue, y, ldy, n_out, library_gemm, twice.dtype == DType::kF32 ? &twice : nullptr);
    return;
  }
  const auto kind = static_cast<GemmEpilogue>(epilogue);
  GroupedGemmArgs a = dense_product(x_bf16, rows, w, kind, y, ldy, n_out);
  const GemmWeight g = a.dense;
  const RowRmsScale left = left_norm_scale(x_bf16.data);
  if (!library_gemm && few_row_gemm_takes(rows)) {
    a.rms_scale = left;
    read_f32_rows(a, x_f32, rows);
    // fp32 rows in place of bf16 ones (gated_mlp_bf16's SiLU·up) must be read as such.
    DS_CHECK_MSG(x_bf16.dtype == DType::kBF16 || a.x_f32 == x_bf16.data, "gemm: fp32 rows the product cannot read");
    launch_few_row_gemm(a, g.n_padded, 1, static_cast<int>(rows), stream_);
    return;
  }
  DS_CHECK_MSG(kind != GemmEpilogue::kSiluMulF32, "gemm: fp32 SiLU·up rows come from the few-row kernel");
  if (left.partials != nullptr) settle_norm();  // cuBLASLt and the own kernel apply no factor
  if (library_gemm || library_gemm_takes(g, rows)) {
    // Many rows: compute-bound, cuBLASLt. Its fp32 output lands in y directly when the layouts
    // agree (an FP8 product writes whole groups of 4 rows).
    if (kind == GemmEpilogue::kSiluMulBf16) {
      DS_CHECK(ldy == g.n_padded / 2);
      const GateUpRows gate_up = library_gate_up(x_bf16, rows, g);
      launch_silu_mul_interleaved(gate_up.rows.data, gate_up.rows.dtype == DType::kBF16, rows, g.n_padded / 2,
                                  gate_up.halves, static_cast<uint16_t*>(y), stream_);
      return;
    }
    DS_CHECK(kind == GemmEpilogue::kStoreF32);
    library_product_into(rows, g, static_cast<float*>(y), ldy, n_out,
                         [&](float* out) { library_product(x_bf16, rows, g, out); });
    return;
  }
  a.k_splits = gemm_k_splits(g.n_padded, g.k_padded);
  a.tile_counters = tile_counters_.as<int>();
  // Split-K products keep their partial tiles in a workspace: at most 1024 rows per launch.
  const int64_t rows_per_launch = a.k_splits > 1 ? 1024 : rows;
  const size_t y_elem_bytes = kind == GemmEpilogue::kStoreF32 ? sizeof(float) : sizeof(uint16_t);
  for (int64_t row0 = 0; row0 < rows; row0 += rows_per_launch) {
    const int64_t n_rows = std::min(rows_per_launch, rows - row0);
    Tensor partials;
    if (a.k_splits > 1) {
      partials = alloc_->cached({a.k_splits, n_rows, g.n_padded}, DType::kF32);
      a.partials = partials.as<float>();
    }
    a.x = x_bf16.as<uint16_t>() + row0 * g.k_padded;
    a.y = static_cast<char*>(y) + row0 * ldy * y_elem_bytes;
    a.dense_rows = static_cast<int>(n_rows);
    launch_grouped_gemm(a, g.n_padded, static_cast<int>((n_rows + kGemmRowsPerBlock - 1) / kGemmRowsPerBlock),
                        static_cast<int>(n_rows), stream_);
  }
}

Tensor CudaBackend::rows_for_two_terms(const Tensor& x_bf16, int64_t rows, const Tensor* x_f32, bool library_gemm) {
  reconcile_norm({&x_bf16}, {});
  if (x_f32 != nullptr) reconcile_norm({x_f32}, {});
  // read_f32_rows's test, for bf16 weights.
  const bool f32_rows = x_f32 != nullptr && x_f32->dtype == DType::kF32 && !library_gemm &&
                        few_row_gemm_takes(rows) && few_row_f32_rows(rows, /*weights_fp8=*/false);
  DS_CHECK_MSG(f32_rows || x_bf16.dtype == DType::kBF16, "gemm: fp32 rows the product cannot read");
  const Tensor& x = f32_rows ? *x_f32 : x_bf16;
  const int64_t half_cols = x_bf16.dim(1);
  DS_CHECK(x.shape.size() == 2 && x.dim(0) >= rows && x.dim(1) <= half_cols);
  Tensor twice = alloc_->cached({rows, 2 * half_cols}, x.dtype);
  launch_rows_twice(x.data, dtype_size_bytes(x.dtype), rows, x.dim(1), half_cols, twice.data, stream_);
  return twice;
}

namespace {
// The rows cuBLASLt's product of `rows` rows by g writes: e4m3 products write whole groups of
// kLibraryFp8RowMultiple.
int64_t library_rows(const GemmWeight& g, int64_t rows) {
  return g.scales != nullptr ? round_up(rows, kLibraryFp8RowMultiple) : rows;
}
}  // namespace

CudaBackend::GateUpRows CudaBackend::library_gate_up(const Tensor& x_bf16, int64_t rows, const GemmWeight& g) {
  // gate and up in bf16 where cuBLASLt writes them so (half the bytes of fp32 to write and read
  // back); SiLU·up rounds to bf16 after them anyway.
  const bool gate_up_bf16 = library_gate_up_bf16(g, rows);
  Tensor gate_up = alloc_->cached({library_rows(g, rows), g.n_padded}, gate_up_bf16 ? DType::kBF16 : DType::kF32);
  if (gate_up_bf16 && g.scales != nullptr) {
    // The weight's copy with 128 × 128 block scales where it has one and cuBLASLt a product for it.
    const auto halves = gate_up_halves_.find(g.data);
    if (halves != gate_up_halves_.end()) {
      GemmWeight copy = g;
      copy.data = halves->second.data;
      if (library_product_fp8(x_bf16, rows, copy, gate_up.data, /*out_bf16=*/true)) return {gate_up, true};
    }
    DS_CHECK(library_product_fp8(x_bf16, rows, g, gate_up.data, /*out_bf16=*/true));
  } else {
    library_product_native(x_bf16, rows, g, gate_up.data);
  }
  return {gate_up, false};
}

void CudaBackend::make_gate_up_halves(const LinearWeight& w) {
  const auto lib = fp8_library_scales_.find(w.weight.data);
  if (!gate_up_halves_ready_ || !library_fp8_ || f32_products_ || !w.packed_gate_up ||
      w.weight.dtype != DType::kF8E4M3 || lib == fp8_library_scales_.end() || !lib->second.gate_up_halves_blocks ||
      gate_up_halves_.count(w.weight.data))
    return;
  const GemmWeight g = gemm_weight_of(w);
  // The copy is laid out as a plain e4m3 weight of 128-row blocks: its data, then cuBLASLt's
  // block scales (no packed scales: the own kernels keep reading the interleaved weight).
  const PackedWeightLayout blocks(g.n_padded, g.k_padded, /*is_gate_up=*/false, /*is_fp8=*/true, 128);
  Tensor copy = alloc_->persistent_bytes(blocks.data_bytes + blocks.library_scale_count * sizeof(float));
  auto* scales = reinterpret_cast<float*>(static_cast<char*>(copy.data) + blocks.data_bytes);
  launch_gate_up_halves(g, copy.data, scales, blocks.library_block_cols, stream_);
  fp8_library_scales_[copy.data] = {scales, /*blocks_128x128=*/true};
  gate_up_halves_[w.weight.data] = copy;
}

void CudaBackend::library_product_into(int64_t rows, const GemmWeight& g, float* y, int64_t ldy, int64_t n_out,
                                       const std::function<void(float*)>& product) {
  const int64_t rows_out = library_rows(g, rows);
  const uintptr_t alignment = g.scales != nullptr ? LtMatmul::kFp8AlignmentBytes : LtMatmul::kMinAlignmentBytes;
  if (ldy == g.n_padded && rows_out == rows && reinterpret_cast<uintptr_t>(y) % alignment == 0) {
    product(y);
    return;
  }
  Tensor full = alloc_->cached({rows_out, g.n_padded}, DType::kF32);
  product(full.as<float>());
  DS_CUDA_CHECK(cudaMemcpy2DAsync(y, ldy * sizeof(float), full.data, g.n_padded * sizeof(float), n_out * sizeof(float),
                                  rows, cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::library_product(const Tensor& x_bf16, int64_t rows, const GemmWeight& w, float* out) {
  const auto* x = x_bf16.as<uint16_t>();
  if (w.scales == nullptr) {
    matmul_->bf16(static_cast<const uint16_t*>(w.data), x, out, rows, w.n_padded, w.k_padded);
    return;
  }
  if (library_product_fp8(x_bf16, rows, w, out)) return;
  // No FP8 algorithm for this shape: the weight widened to bf16 for the call.
  Tensor widened = alloc_->cached({w.n_padded, w.k_padded}, DType::kBF16);
  launch_gemm_weight_to_bf16(w, widened.as<uint16_t>(), stream_);
  matmul_->bf16(widened.as<uint16_t>(), x, out, rows, w.n_padded, w.k_padded);
}

void CudaBackend::library_product_native(const Tensor& x_bf16, int64_t rows, const GemmWeight& w, void* out) {
  if (library_output_dtype(w) == DType::kBF16)
    matmul_->bf16(static_cast<const uint16_t*>(w.data), x_bf16.as<uint16_t>(), out, rows, w.n_padded, w.k_padded,
                  /*y_bf16=*/true);
  else
    library_product(x_bf16, rows, w, static_cast<float*>(out));
}

CudaBackend::QuantisedRows CudaBackend::quantise_rows(const Tensor& x_bf16, int64_t rows, int64_t rows_padded,
                                                      int64_t k, int terms) {
  NormedCopy& copy = normed_copy_;
  const bool of_copy = copy.of != nullptr && x_bf16.data == copy.bf16.data;
  const Tensor& kept = copy.quantised.q;
  // Rows quantised on the main stream before a fork are ready for its side stream too (while
  // launches go to the side, side_stream_ is the main stream).
  const bool ready_here = copy.quantised_on == stream_ || (queuing_on_side_ && copy.quantised_on == side_stream_);
  if (of_copy && ready_here && copy.quantised_rows == rows && copy.quantised.terms == terms && !kept.empty() &&
      kept.dim(0) == terms * rows_padded && kept.dim(1) == k)
    return copy.quantised;
  QuantisedRows q = new_quantised_rows(terms * rows_padded, k);
  q.terms = terms;
  if (terms == 1)
    launch_quantize_rows_e4m3(x_bf16.as<uint16_t>(), rows, k, rows_padded, q.q.as<uint8_t>(), q.scales.as<float>(),
                              stream_);
  else
    launch_quantize_rows_e4m3_terms(x_bf16.as<uint16_t>(), rows, k, rows_padded, terms, q.q.as<uint8_t>(),
                                    q.scales.as<float>(), stream_);
  // The main stream's launches would not wait for rows the side stream makes.
  if (of_copy && !queuing_on_side_) keep_quantised(q, rows);
  return q;
}

namespace {
LtMatmul::Fp8WeightScales scale_mode(bool blocks_128x128) {
  return blocks_128x128 ? LtMatmul::Fp8WeightScales::kBlocks128x128 : LtMatmul::Fp8WeightScales::kRows1x128;
}
}  // namespace

const CudaBackend::LibraryScales* CudaBackend::library_fp8_scales(const GemmWeight& w, int64_t rows, bool out_bf16) {
  if (!library_fp8_) return nullptr;
  const auto it = fp8_library_scales_.find(w.data);
  if (it == fp8_library_scales_.end()) return nullptr;
  const bool ready = matmul_->fp8_ready(round_up(rows, kLibraryFp8RowMultiple), w.n_padded, w.k_padded,
                                        scale_mode(it->second.blocks_128x128), out_bf16);
  return ready ? &it->second : nullptr;
}

bool CudaBackend::library_product_fp8(const Tensor& x_bf16, int64_t rows, const GemmWeight& w, void* out,
                                      bool out_bf16) {
  if (fp8_activation_terms(rows) > 1 && library_product_fp8_terms(x_bf16, rows, w, out, out_bf16)) return true;
  const LibraryScales* lib = library_fp8_scales(w, rows, out_bf16);
  if (lib == nullptr) return false;
  const int64_t rows_p = round_up(rows, kLibraryFp8RowMultiple);
  library_product_fp8_rows(quantise_rows(x_bf16, rows, rows_p, w.k_padded), w, *lib, out, out_bf16);
  return true;
}

bool CudaBackend::library_product_fp8_terms(const Tensor& x_bf16, int64_t rows, const GemmWeight& w, void* out,
                                            bool out_bf16) {
  const int terms = fp8_activation_terms(rows);
  const int64_t rows_p = round_up(rows, kLibraryFp8RowMultiple), all_rows = terms * rows_p;
  const LibraryScales* lib = library_fp8_scales(w, all_rows, /*out_bf16=*/false);
  if (lib == nullptr) return false;
  Tensor products = alloc_->cached({all_rows, w.n_padded}, DType::kF32);
  library_product_fp8_rows(quantise_rows(x_bf16, rows, rows_p, w.k_padded, terms), w, *lib, products.data,
                           /*out_bf16=*/false);
  launch_add_row_terms(products.as<float>(), terms, rows_p, w.n_padded, out, out_bf16, stream_);
  return true;
}

void CudaBackend::library_product_fp8_rows(const QuantisedRows& x, const GemmWeight& w, const LibraryScales& lib,
                                           void* out, bool out_bf16) {
  matmul_->fp8(static_cast<const uint8_t*>(w.data), lib.scales, scale_mode(lib.blocks_128x128), x.q.as<uint8_t>(),
               x.scales.as<float>(), out, x.q.dim(0), w.n_padded, w.k_padded, out_bf16);
}

bool CudaBackend::library_gate_up_bf16(const GemmWeight& w, int64_t rows) {
  if (w.scales == nullptr) return true;
  return fp8_gate_up_bf16_ && library_fp8_scales(w, rows, /*out_bf16=*/true) != nullptr;
}

void CudaBackend::linear(const Tensor& x, const LinearWeight& w, Tensor& out) {
  check_linear(x, w, out);
  const int64_t m = x.dim(0);
  if (m == 0) return;
  // Only the few-row kernel applies a pending norm's factor (the e4m3 path below reads x itself).
  if (!few_row_gemm_takes(m)) reconcile_norm({&x}, {});
  reconcile_norm({}, {&out});
  if (f32_products_) product_f32(x.as<float>(), m, x.dim(1), w, out.as<float>(), out.dim(1));
  else if (!linear_f32_e4m3(x, w, out)) linear_bf16(to_bf16_padded(x, input_cols_padded(w)), m, w, out, &x);
  forget_normed_copy_if_written(out);
}

bool CudaBackend::linear_f32_e4m3(const Tensor& x, const LinearWeight& w, Tensor& out) {
  // Only where gemm() would take cuBLASLt's block-scaled product, which would quantise the bf16
  // rows to_bf16_padded makes: the same products, so the same bits. Rows with a bf16 copy
  // already (a norm's, attention's) keep the path that reads it.
  const int64_t m = x.dim(0);
  const GemmWeight g = gemm_weight_of(w);
  const bool has_copy = normed_copy_.of != nullptr && normed_copy_.of == x.data;
  if (!f32_e4m3_ || has_copy || fp8_activation_terms(m) > 1 || x.dim(1) != g.k_padded ||
      reinterpret_cast<uintptr_t>(x.data) % 16 != 0 || !library_gemm_takes(g, m))
    return false;
  const LibraryScales* lib = library_fp8_scales(g, m, /*out_bf16=*/false);
  if (lib == nullptr) return false;
  QuantisedRows q = new_quantised_rows(round_up(m, kLibraryFp8RowMultiple), g.k_padded);
  launch_quantize_rows_f32_e4m3(x.as<float>(), m, g.k_padded, q.q.dim(0), q.q.as<uint8_t>(), q.scales.as<float>(),
                                stream_);
  library_product_into(m, g, out.as<float>(), w.out_features, w.out_features,
                       [&](float* y) { library_product_fp8_rows(q, g, *lib, y, /*out_bf16=*/false); });
  return true;
}

void CudaBackend::linear_bf16(const Tensor& x_bf16, int64_t rows, const LinearWeight& w, Tensor& out,
                              const Tensor* x_f32) {
  gemm(x_bf16, rows, w, static_cast<int>(GemmEpilogue::kStoreF32), out.data, w.out_features, w.out_features,
       /*library_gemm=*/false, x_f32);
}

void CudaBackend::linear_pair(const Tensor& x, const LinearWeight& w1, Tensor& out1, const LinearWeight& w2,
                              Tensor& out2) {
  // Both weights take x's width, so they pad k alike (whole 128-column tiles).
  if (f32_products_) {
    linear(x, w1, out1);
    linear(x, w2, out2);
    return;
  }
  check_linear(x, w1, out1);
  check_linear(x, w2, out2);
  DS_CHECK(input_cols_padded(w1) == input_cols_padded(w2));
  const int64_t m = x.dim(0);
  if (m == 0) return;
  reconcile_norm({}, {&out1, &out2});
  const Tensor xb = to_bf16_padded(x, input_cols_padded(w1));
  const bool same_type = (w1.weight.dtype == DType::kF8E4M3) == (w2.weight.dtype == DType::kF8E4M3);
  const int terms = weight_terms(w1);
  if (m <= few_row_pairs_max_rows_ && few_row_gemm_takes(m) && same_type && terms == weight_terms(w2)) {
    // Both products in one launch (a link fewer in a small step's chain), each as gemm() runs it;
    // weights in two terms read the rows twice, copied once for both.
    const Tensor twice = terms == 2 ? rows_for_two_terms(xb, m, &x, /*library_gemm=*/false) : Tensor{};
    const Tensor& rows = terms == 2 ? twice : xb;
    const Tensor* rows_f32 = terms == 1 ? &x : twice.dtype == DType::kF32 ? &twice : nullptr;
    GroupedGemmArgs a = dense_product(rows, m, w1, GemmEpilogue::kStoreF32, out1.data, w1.out_features,
                                      w1.out_features);
    GroupedGemmArgs b = dense_product(rows, m, w2, GemmEpilogue::kStoreF32, out2.data, w2.out_features,
                                      w2.out_features);
    a.rms_scale = b.rms_scale = left_norm_scale(rows.data);
    read_f32_rows(a, rows_f32, m);
    read_f32_rows(b, rows_f32, m);
    // A MoE layer's router logits from the residual it starts from, in the same launch
    // (will_route, RouterIdentity): the layer's first pair of products.
    RouterLogitsRow pre;
    const bool router_part = route_hint_.id != nullptr && !route_hint_.pre_made && m == 1;
    if (router_part) {
      RouterIdentity& id = *route_hint_.id;
      pre = RouterLogitsRow{static_cast<const float*>(route_hint_.residual), id.g_prime.as<float>(),
                            static_cast<int>(id.g_prime.dim(1)), static_cast<int>(id.g_prime.dim(0)),
                            id.pre.as<float>(), nullptr};
      route_hint_.pre_made = true;
    }
    launch_few_row_gemm_pair(a, b, static_cast<int>(m), stream_, router_part ? &pre : nullptr);
  } else {
    linear_bf16(xb, m, w1, out1, &x);
    linear_bf16(xb, m, w2, out2, &x);
  }
  forget_normed_copy_if_written(out1);
  forget_normed_copy_if_written(out2);
}

void CudaBackend::gated_mlp_bf16(const Tensor& x_bf16, int64_t rows, const LinearWeight& gate_up,
                                 const LinearWeight& down, float* out, int64_t ldo, const Tensor* x_f32) {
  const int64_t inter_p = gate_up.weight.dim(0) / 2;
  DS_CHECK_MSG(input_cols_padded(down) == inter_p && down.in_features == gate_up.out_features / 2,
               "gated MLP: down projection takes " << down.in_features << " inputs, gate/up gives "
                                                   << gate_up.out_features / 2);
  // cuBLASLt's products apply no pending norm's factor.
  if (!few_row_gemm_takes(rows) && left_norm_scale(x_bf16.data).partials != nullptr) settle_norm();
  if (silu_e4m3_ && gated_mlp_e4m3(x_bf16, rows, gate_up, down, out, ldo)) return;
  // SiLU·up in fp32 where the down product reads fp32 rows (few_row_f32_rows); its bf16 rows
  // are then unused.
  const bool act_f32 = silu_up_f32(rows, gate_up, down);
  Tensor act = alloc_->cached({rows, inter_p}, act_f32 ? DType::kF32 : DType::kBF16);
  gemm(x_bf16, rows, gate_up,
       static_cast<int>(act_f32 ? GemmEpilogue::kSiluMulF32 : GemmEpilogue::kSiluMulBf16), act.data, inter_p,
       inter_p, /*library_gemm=*/false, x_f32);
  gemm(act, rows, down, static_cast<int>(GemmEpilogue::kStoreF32), out, ldo, down.out_features,
       /*library_gemm=*/false, act_f32 ? &act : nullptr);
}

bool CudaBackend::gated_mlp_e4m3(const Tensor& x_bf16, int64_t rows, const LinearWeight& gate_up,
                                 const LinearWeight& down, float* out, int64_t ldo) {
  // Only where gemm() would take cuBLASLt for both products and the block-scaled FP8 one for
  // down: the same products as the two-pass form, so the same bits.
  const GemmWeight g = gemm_weight_of(gate_up), d = gemm_weight_of(down);
  if (!library_gemm_takes(g, rows) || !library_gemm_takes(d, rows) || fp8_activation_terms(rows) > 1) return false;
  const LibraryScales* down_scales = library_fp8_scales(d, rows, /*out_bf16=*/false);
  if (down_scales == nullptr) return false;
  const int64_t inter_p = g.n_padded / 2;
  const GateUpRows gate_up_rows = library_gate_up(x_bf16, rows, g);
  QuantisedRows act = new_quantised_rows(round_up(rows, kLibraryFp8RowMultiple), inter_p);
  launch_silu_mul_interleaved_e4m3(gate_up_rows.rows.data, gate_up_rows.rows.dtype == DType::kBF16, rows, inter_p,
                                   gate_up_rows.halves, act.q.dim(0), act.q.as<uint8_t>(), act.scales.as<float>(),
                                   stream_);
  library_product_into(rows, d, out, ldo, down.out_features,
                       [&](float* y) { library_product_fp8_rows(act, d, *down_scales, y, /*out_bf16=*/false); });
  return true;
}

void CudaBackend::gated_mlp(const Tensor& x, const LinearWeight& gate_up, const LinearWeight& down, Tensor& out) {
  DS_CHECK_MSG(gate_up.packed_gate_up, "gated_mlp: the gate/up weight must come from make_gate_up");
  DS_CHECK(x.dim(1) == gate_up.in_features && out.dim(1) == down.out_features);
  const int64_t m = x.dim(0);
  if (m == 0) return;
  reconcile_norm({}, {&out});
  if (f32_products_) gated_mlp_f32(x, gate_up, down, out.as<float>(), out.dim(1));
  else gated_mlp_bf16(to_bf16_padded(x, input_cols_padded(gate_up)), m, gate_up, down, out.as<float>(), out.dim(1),
                      &x);
  forget_normed_copy_if_written(out);
}

void CudaBackend::embedding(const Tensor& table, std::span<const TokenId> ids, Tensor& out) {
  reconcile_norm({}, {&out});
  forget_normed_copy();
  const int64_t vocab = table.dim(0), hidden = table.dim(1);
  // Placeholders (< 0) are the step's, resolved on the device by begin_step.
  const bool step_ids = step_ints(ids.data()) != nullptr;
  for (TokenId id : ids)
    DS_CHECK_MSG(id < vocab && (id >= 0 || step_ids), "token id " << id << " outside vocab " << vocab);
  Tensor uploaded;
  const int32_t* d_ids = device_ints(ids, uploaded);
  launch_gather_rows(table.as<float>(), d_ids, static_cast<int64_t>(ids.size()), hidden, out.as<float>(), stream_);
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  reconcile_norm({&x}, {&out});
  const Bf16Rows copy = start_normed_copy(out);
  launch_rms_norm(x.as<float>(), w.as<float>(), eps, x.dim(0), x.dim(1), out.as<float>(), copy.data, copy.ld,
                  normed_e4m3_rows(x.dim(0)), stream_);
}

void CudaBackend::add(Tensor& x, const Tensor& y) {
  reconcile_norm({&x, &y}, {&x});
  forget_normed_copy();
  DS_CHECK(y.num_elements() == x.num_elements());
  launch_add(x.as<float>(), y.as<float>(), x.num_elements(), stream_);
}

void CudaBackend::add_rms_norm(Tensor& x, const Tensor& y, const Tensor& w, float eps, Tensor& out) {
  DS_CHECK(y.num_elements() == x.num_elements() && out.num_elements() == x.num_elements());
  reconcile_norm({&x, &y}, {&x, &out});
  const Bf16Rows copy = start_normed_copy(out);
  launch_add_rms_norm(x.as<float>(), y.as<float>(), w.as<float>(), eps, x.dim(0), x.dim(1), out.as<float>(), copy.data,
                      copy.ld, normed_e4m3_rows(x.dim(0)), stream_);
}

void CudaBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  reconcile_norm({&gate_up}, {&out});
  forget_normed_copy();
  launch_silu_mul(gate_up.as<float>(), gate_up.dim(0), gate_up.dim(1) / 2, out.as<float>(), stream_);
}

void CudaBackend::concat_cols(const Tensor& a, const Tensor& b, Tensor& out) {
  reconcile_norm({&a, &b}, {&out});
  forget_normed_copy();
  launch_concat_cols(a.as<float>(), b.as<float>(), a.dim(0), a.dim(1), b.dim(1), out.as<float>(), stream_);
}

void CudaBackend::gather_rows(const Tensor& x, std::span<const int32_t> rows, Tensor& out) {
  reconcile_norm({&x}, {&out});
  forget_normed_copy();
  const int64_t num_rows = x.dim(0);
  for (int32_t i : rows) DS_CHECK_MSG(i >= 0 && i < num_rows, "gather_rows: row " << i << " of " << num_rows);
  Tensor uploaded;
  const int32_t* d_rows = device_ints(rows, uploaded);
  launch_gather_rows(x.as<float>(), d_rows, static_cast<int64_t>(rows.size()), x.dim(1), out.as<float>(), stream_);
}

void CudaBackend::read_cache_block(const LayerKvCache& cache, int32_t block, void* dst) {
  const size_t block_bytes = cache.data.num_bytes() / static_cast<size_t>(cache.data.dim(0));
  DS_CUDA_CHECK(cudaMemcpyAsync(dst, static_cast<const uint8_t*>(cache.data.data) + block * block_bytes, block_bytes,
                                cudaMemcpyDeviceToHost, stream_));
  synchronize();
}

void CudaBackend::write_cache_block(LayerKvCache& cache, int32_t block, const void* src) {
  forget_normed_copy();
  const size_t block_bytes = cache.data.num_bytes() / static_cast<size_t>(cache.data.dim(0));
  DS_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(cache.data.data) + block * block_bytes, src, block_bytes,
                                cudaMemcpyHostToDevice, stream_));
  synchronize();  // the caller may reuse src at once
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Backend> make_cuda_backend(Precision precision) {
  // The kernels are compiled for sm_90a alone (src/CMakeLists.txt): Hopper's warpgroup products
  // and FP8 forms, code that runs on compute capability 9.0 and nowhere else. Another device is
  // refused here, with its name, rather than at the first launch.
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    cudaGetLastError();
    throw Error(StatusCode::kUnavailable, "backend 'cuda': device 0 could not be queried");
  }
  if (prop.major != 9 || prop.minor != 0)
    throw Error(StatusCode::kUnavailable, "backend 'cuda': this build's kernels run on compute capability 9.0 "
                                          "(Hopper: H100, H200, H800, H20); device 0 is " +
                                              std::string(prop.name) + ", compute capability " +
                                              std::to_string(prop.major) + "." + std::to_string(prop.minor));
  return std::make_unique<CudaBackend>(precision);
}

double measure_copy_bandwidth_bytes_per_s() {
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  DS_CUDA_CHECK(cudaSetDevice(0));
  DS_CUDA_CHECK(cudaMalloc(&a, bytes));
  DS_CUDA_CHECK(cudaMalloc(&b, bytes));
  DS_CUDA_CHECK(cudaMemset(a, 1, bytes));
  cudaEvent_t start, stop;
  DS_CUDA_CHECK(cudaEventCreate(&start));
  DS_CUDA_CHECK(cudaEventCreate(&stop));
  double best = 0.0;
  for (int rep = 0; rep < 6; ++rep) {
    DS_CUDA_CHECK(cudaEventRecord(start));
    DS_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    DS_CUDA_CHECK(cudaEventRecord(stop));
    DS_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    DS_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (rep > 0 && ms > 0.0f) best = std::max(best, 2.0 * bytes / (ms * 1e-3));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  return best;
}

}  // namespace dsinfer::cuda

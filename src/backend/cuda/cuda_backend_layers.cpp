// The CUDA backend's MoE: host-side planning around the kernels of cuda_moe.cu and the
// grouped GEMM.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_state.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_allocator.h"
#include "backend/cuda/gemm_f32.h"
#include "backend/cuda/lt_matmul.h"
#include "backend/cuda/tensor_map.h"

namespace dsinfer::cuda {
namespace {
GroupedGemmArgs scaled(GroupedGemmArgs a, const RowRmsScale& s) {
  a.rms_scale = s;
  return a;
}

// From this many routed rows per expert on average (prefill), an MoE layer's experts go to
// cuBLASLt (moe_experts_chunked, or moe_experts_host_planned); below it (decode) they stay on
// the own grouped kernel.
constexpr int64_t kPrefillRowsPerExpert = 32;
// Chunks of the pointer-array expert products: cuBLASLt's tiles of 128 rows, and the rows
// spent on chunks that hold no routed row (at most one partial chunk per expert, plus the
// batch's rounding) bounded by experts x 128 + kChunkBatchStep x 128.
constexpr int kChunkRows = 128;
// The batch is sized from the entry count and rounded up to this many chunks, so that a plan
// (an answer of cuBLASLt's heuristic) serves every step of the same rounded size.
constexpr int kChunkBatchStep = 32;

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// A batch of num_chunks products of kChunkRows bf16 rows with w's shape, bf16 out, operands
// through pointer arrays.
LtMatmul::Strided chunk_product(const GemmWeight& w, int num_chunks) {
  LtMatmul::Strided s;
  s.m = kChunkRows;
  s.n = w.n_padded;
  s.k = w.k_padded;
  s.batch = num_chunks;
  s.y_bf16 = true;
  s.ld_x = w.k_padded;
  s.ld_w = w.k_padded;
  s.ld_y = w.n_padded;
  s.pointer_array = true;
  return s;
}
// Router logits of up to this many tokens come from the own fp32 kernel, above it from cuBLAS.
constexpr int64_t kRouterKernelMaxTokens = 128;

// Work forked onto a second stream until join(): the side stream starts after everything queued
// on the main stream so far, and the main stream's work after join() waits for the side's.
// Blocks the allocator gets back in between are held until the join, since either stream may
// still be using them. The destructor joins when join() was not reached (an exception).
class ForkedStreams {
 public:
  ForkedStreams(Stream main, Stream side, CUevent_st* fork, CUevent_st* join, DeviceAllocator& alloc)
      : main_(main), side_(side), join_(join), alloc_(alloc) {
    DS_CUDA_CHECK(cudaEventRecord(fork, main_));
    DS_CUDA_CHECK(cudaStreamWaitEvent(side_, fork, 0));
    alloc_.hold_reuse(true);
  }
  ForkedStreams(const ForkedStreams&) = delete;
  ForkedStreams& operator=(const ForkedStreams&) = delete;
  ~ForkedStreams() {
    if (joined_) return;
    cudaEventRecord(join_, side_);
    cudaStreamWaitEvent(main_, join_, 0);
    alloc_.hold_reuse(false);
  }
  void join() {
    joined_ = true;
    alloc_.hold_reuse(false);
    DS_CUDA_CHECK(cudaEventRecord(join_, side_));
    DS_CUDA_CHECK(cudaStreamWaitEvent(main_, join_, 0));
  }

 private:
  Stream main_, side_;
  CUevent_st* join_;
  DeviceAllocator& alloc_;
  bool joined_ = false;
};

// Where a layer's expert tensor maps start in MoeWeights::derived: after the table, 128-byte
// aligned (a tensor map in device memory needs 64).
size_t expert_maps_offset(int num_experts) {
  return (2 * static_cast<size_t>(num_experts) * sizeof(GemmWeight) + 127) / 128 * 128;
}
}  // namespace

// Device descriptors of a layer's expert weights, [gate_up of each expert | down of each expert].
void CudaBackend::prepare(MoeWeights& w) {
  const int num_experts = w.num_experts;
  DS_CHECK(static_cast<int>(w.expert_gate_up.size()) == num_experts &&
           static_cast<int>(w.expert_down.size()) == num_experts && num_experts > 0);
  for (const LinearWeight& gu : w.expert_gate_up)
    DS_CHECK_MSG(gu.packed_gate_up, "MoE expert gate/up weights must come from make_gate_up");
  for (const std::vector<LinearWeight>* weights : {&w.expert_gate_up, &w.expert_down}) {
    for (const LinearWeight& e : *weights)
      DS_CHECK_MSG(weight_terms(e) == 1, "MoE experts' weights must be made as routed experts' (one term)");
  }
  if (f32_products_) {
    prepare_f32(w);
    return;
  }
  // The shared experts' gate/up takes cuBLASLt in prefill-sized steps.
  if (w.has_shared) make_gate_up_halves(w.shared_gate_up);
  std::vector<GemmWeight> table;
  for (const LinearWeight& gu : w.expert_gate_up) table.push_back(gemm_weight_of(gu));
  for (const LinearWeight& d : w.expert_down) table.push_back(gemm_weight_of(d));
  for (int e = 1; e < num_experts; ++e) {
    DS_CHECK_MSG(table[e].n_padded == table[0].n_padded && table[e].k_padded == table[0].k_padded &&
                     (table[e].scales == nullptr) == (table[0].scales == nullptr) &&
                     table[num_experts + e].n_padded == table[num_experts].n_padded &&
                     table[num_experts + e].k_padded == table[num_experts].k_padded &&
                     (table[num_experts + e].scales == nullptr) == (table[num_experts].scales == nullptr),
                 "MoE experts of one layer must share shapes and dtype");
  }
  // e4m3 experts also get a tensor map per weight, after the table, for the prefill expert
  // blocks' weight rows by TMA (GroupedGemmArgs::weight_maps): boxes of 128 rows × 128 bytes.
  std::vector<CUtensorMap> maps;
  if (table[0].scales != nullptr && table[0].k_padded % kLibraryFp8TileColumns == 0 &&
      table[num_experts].k_padded % kLibraryFp8TileColumns == 0) {
    try {
      for (const GemmWeight& g : table)
        maps.push_back(encode_tensor_map(TensorMap2d{g.data, CU_TENSOR_MAP_DATA_TYPE_UINT8,
                                                     static_cast<uint64_t>(g.k_padded),
                                                     static_cast<uint64_t>(g.n_padded),
                                                     static_cast<uint64_t>(g.k_padded), 128, 128, true}));
    } catch (const Error&) {
      maps.clear();  // a driver without tensor maps: the blocks copy their weight rows by cp.async
    }
  }
  const size_t table_bytes = expert_maps_offset(num_experts);
  const size_t bytes = table_bytes + maps.size() * sizeof(CUtensorMap);
  w.derived = alloc_->persistent_bytes(bytes);
  DS_CUDA_CHECK(cudaMemcpyAsync(w.derived.data, table.data(), table.size() * sizeof(GemmWeight),
                                cudaMemcpyHostToDevice, stream_));
  if (!maps.empty())
    DS_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(w.derived.data) + table_bytes, maps.data(),
                                  maps.size() * sizeof(CUtensorMap), cudaMemcpyHostToDevice, stream_));
  synchronize();
}

const CUtensorMap* CudaBackend::expert_weight_maps(const MoeWeights& w) const {
  const size_t offset = expert_maps_offset(w.num_experts);
  if (w.derived.num_bytes() < offset + 2 * w.num_experts * sizeof(CUtensorMap)) return nullptr;
  return reinterpret_cast<const CUtensorMap*>(static_cast<const uint8_t*>(w.derived.data) + offset);
}

void CudaBackend::moe(const Tensor& x, const MoeWeights& w, Tensor& out, MoeRouting* routing) {
  const int64_t num_tokens = x.dim(0), hidden = x.dim(1);
  if (num_tokens == 0) return;
  DS_CHECK(out.dim(0) == num_tokens && out.dim(1) == hidden);
  reconcile_norm({}, {&out});
  const MoeOutputs m = moe_until_combine(x, w);
  launch_moe_combine(m.combine, num_tokens, hidden, out.as<float>(), stream_);
  copy_routing(m, routing);
  forget_normed_copy_if_written(out);
}

void CudaBackend::moe_add_rms_norm(const Tensor& x, const MoeWeights& w, Tensor& out, MoeRouting* routing,
                                   Tensor& residual, const Tensor& norm_w, float eps, Tensor& normed) {
  if (x.dim(0) < combine_in_norm_min_rows_) {
    const int64_t rows = x.dim(0), n = residual.dim(-1);
    if (!can_leave_norm(rows, n) || normed.shape != residual.shape || residual.shape != x.shape ||
        out.shape != x.shape || norm_w.num_elements() != n) {
      Backend::moe_add_rms_norm(x, w, out, routing, residual, norm_w, eps, normed);
      return;
    }
    // The combine adds to the residual and writes the norm's output before its factor, which
    // the next layer's products apply (PendingNorm).
    const MoeOutputs m = moe_until_combine(x, w, combine_in_down_ && rows == 1);
    if (moe_combine_rows_in_fours(m.combine, n)) {
      reconcile_norm({}, {&out, &residual, &normed});  // ends the norm x was, if it was one
      const ResidualNormOutput r = leave_norm(residual, norm_w, eps, normed);
      if (m.down)
        launch_down_combine(*m.down, m.combine, n, r);
      else
        launch_moe_combine_residual(m.combine, rows, n, r, stream_);
    } else {
      if (m.down) launch_few_row_gemm(m.down->args, m.down->max_n_padded, m.down->max_row_blocks, 1, stream_);
      launch_moe_combine(m.combine, rows, n, out.as<float>(), stream_);
      add_rms_norm(residual, out, norm_w, eps, normed);
    }
    copy_routing(m, routing);
    return;
  }
  // A step without tokens took the two kernels above: every bound is at least one row.
  const int64_t num_tokens = x.dim(0), hidden = x.dim(1);
  DS_CHECK(out.dim(0) == num_tokens && out.dim(1) == hidden && residual.num_elements() == out.num_elements() &&
           normed.num_elements() == out.num_elements() && norm_w.num_elements() == hidden);
  const MoeOutputs m = moe_until_combine(x, w);
  // After the layer's launches: its products read x's copy, which normed may overwrite.
  const Bf16Rows copy = start_normed_copy(normed);
  launch_moe_combine_add_rms_norm(residual.as<float>(), m.combine, out.as<float>(), norm_w.as<float>(), eps, num_tokens,
                                  hidden, normed.as<float>(), copy.data, copy.ld, normed_e4m3_rows(num_tokens),
                                  stream_);
  copy_routing(m, routing);
}

void CudaBackend::copy_routing(const MoeOutputs& m, MoeRouting* routing) {
  if (routing == nullptr) return;
  const int64_t num_entries = m.ids.num_elements();
  routing->expert_ids.resize(num_entries);
  routing->weights.resize(num_entries);
  DS_CUDA_CHECK(
      cudaMemcpyAsync(routing->expert_ids.data(), m.ids.data, num_entries * 4, cudaMemcpyDeviceToHost, stream_));
  DS_CUDA_CHECK(
      cudaMemcpyAsync(routing->weights.data(), m.weights.data, num_entries * 4, cudaMemcpyDeviceToHost, stream_));
  synchronize();
}

void CudaBackend::queue_on_side(const std::function<void()>& launches) {
  DS_CHECK_MSG(!queuing_on_side_, "queue_on_side: already queuing on the side stream");
  const auto swap = [this] {
    std::swap(stream_, side_stream_);
    std::swap(matmul_, side_matmul_);
    queuing_on_side_ = !queuing_on_side_;
  };
  swap();
  struct SwapBack {
    const decltype(swap)& back;
    ~SwapBack() { back(); }
  } swap_back{swap};
  launches();
}

void CudaBackend::launch_down_combine(const DeferredDown& down, const MoeCombineRows& rows, int64_t hidden,
                                      const ResidualNormOutput& out) {
  launch_few_row_gemm_combine(down.args, down.max_n_padded, down.max_row_blocks, rows, hidden, out,
                              combine_arrivals_.as<int32_t>(), static_cast<int>(combine_arrivals_.num_elements()),
                              stream_);
}

CudaBackend::MoeOutputs CudaBackend::moe_until_combine(const Tensor& x, const MoeWeights& w, bool defer_down) {
  const int64_t num_tokens = x.dim(0), hidden = x.dim(1);
  const int top_k = w.top_k, num_experts = w.num_experts;
  const int64_t num_entries = num_tokens * top_k;
  DS_CHECK_MSG(num_entries <= INT32_MAX / 2, "MoE: " << num_entries << " routed entries in one step");
  MoeRouteParams params{num_experts,
                        top_k,
                        w.num_groups,
                        w.topk_groups,
                        w.scoring == GateScoring::kSigmoid,
                        w.topk_method == GateTopk::kGreedy               ? 0
                        : w.topk_method == GateTopk::kGroupLimitedGreedy ? 1
                                                                         : 2,
                        w.norm_topk_prob,
                        w.routed_scaling_factor};
  DS_CHECK_MSG(!w.derived.empty(), "moe: the layer's weights were not prepared (Backend::prepare)");
  const LinearWeight& gu0 = w.expert_gate_up[0];
  const LinearWeight& down0 = w.expert_down[0];
  const int64_t k_p = gu0.weight.dim(1), inter_p = gu0.weight.dim(0) / 2;
  DS_CHECK(down0.weight.dim(1) == inter_p && down0.out_features == hidden && gu0.in_features == hidden);
  // fp32 products read x itself.
  const Tensor xb = f32_products_ ? Tensor{} : to_bf16_padded(x, k_p);
  // e4m3 experts in a step whose dense products take FP8 activation terms take the grouped
  // kernel's forms: its decode-sized expert blocks take the terms, and its others bf16 rows with
  // the weights as stored, where the prefill forms take one term or widen e4m3 weights to bf16 (a
  // rounding of their scaled values). Such steps hold up to 256 tokens; a layer of V2-Lite's 64
  // experts is prefill-sized from 342.
  const bool e4m3_experts_in_terms =
      gu0.weight.dtype == DType::kF8E4M3 && !f32_products_ && fp8_activation_terms(num_tokens) > 1;
  const bool prefill_sized = !batch_invariant_ && !recording_ && !e4m3_experts_in_terms &&
                             num_entries >= kPrefillRowsPerExpert * num_experts;
  const int num_chunks = static_cast<int>(
      std::min<int64_t>(INT32_MAX / kChunkRows,
                        round_up((num_entries + kChunkRows - 1) / kChunkRows + num_experts, kChunkBatchStep)));
  // Prefill-sized layers of e4m3 experts with e4m3 activations take the prefill expert blocks,
  // whose row-blocks hold kExpertBlockWideRows rows, unless another form is asked for. Those
  // address their e4m3 rows with 32-bit offsets: a step with more than 4 GiB of them in one
  // product (about 500,000 tokens on V2-Lite, 260,000 on V3) takes the chunked products instead.
  const bool rows_addressable =
      std::max(round_up(num_tokens, kLibraryFp8RowMultiple) * k_p,
               round_up(num_entries, kLibraryFp8RowMultiple) * inter_p) <= int64_t{UINT32_MAX};
  const bool prefill_blocks =
      prefill_sized && rows_addressable && fp8_expert_activations_for(w) &&
      (prefill_experts_ == PrefillExperts::kAuto || prefill_experts_ == PrefillExperts::kGrouped);
  const bool chunked = prefill_sized && !prefill_blocks &&
                       (prefill_experts_ == PrefillExperts::kAuto || prefill_experts_ == PrefillExperts::kChunked) &&
                       chunked_experts_ready(w, num_chunks);
  const bool host_planned =
      prefill_sized && !chunked && !prefill_blocks && prefill_experts_ != PrefillExperts::kGrouped;
  const int grouped_rows_per_block = prefill_blocks  ? kExpertBlockWideRows
                                     : f32_products_ ? kGemmF32RowsPerBlock
                                                     : kGemmRowsPerBlock;

  // The shared experts depend on x alone. In a small step the routing before the routed experts
  // is a chain of short kernels that leave the memory idle, so the shared experts run with it:
  // - in a step of a few tokens, in the routing's own launches (gate/up in the router logits',
  //   down in the routing and planning's), where both of their products take the few-row kernel;
  // - else beside it on the side stream, joined before the combine, where both take the own
  //   kernel;
  // - in a step of up to shared_beside_library_max_tokens_ tokens (128) whose shared products
  //   both take cuBLASLt, on the side stream too, with the side's own cuBLASLt handle: the main
  //   stream's kernels come first (it has the higher priority), the side's fill the SMs they
  //   leave idle;
  // - else after the routed experts.
  Tensor shared, shared_act;
  const int64_t shared_inter_p = w.has_shared ? w.shared_gate_up.weight.dim(0) / 2 : 0;
  if (w.has_shared) {
    DS_CHECK(input_cols_padded(w.shared_gate_up) == k_p && input_cols_padded(w.shared_down) == shared_inter_p);
    shared = alloc_->cached({num_tokens, hidden}, DType::kF32);
  }
  // Shared weights in two terms (weight_terms) take gemm's copy of the rows, after the routed experts.
  const bool shared_one_term =
      w.has_shared && weight_terms(w.shared_gate_up) == 1 && weight_terms(w.shared_down) == 1;
  const bool shared_in_routing = shared_one_term && shared_experts_in_routing_ && !host_planned && !chunked &&
                                 num_tokens <= kMoeRoutePlanMaxTokens && num_tokens <= kRouterKernelMaxTokens &&
                                 few_row_gemm_takes(num_tokens);
  // x as a pending norm's output (xb its copy): the launches below apply its factor where the
  // shared experts run in the routing's launches and the routed ones take the few-row kernel
  // (both then do); else x and xb are finished here, before any launch reads them.
  if (!shared_in_routing || !routed_few_row_takes(num_tokens)) reconcile_norm({&x}, {});
  const RowRmsScale x_scale = left_norm_scale(x.data);
  const bool shared_on_side = shared_one_term && !shared_in_routing && shared_experts_alongside_ && !host_planned &&
                              !f32_products_ && [&] {
                                const GemmWeight gu = gemm_weight_of(w.shared_gate_up);
                                const GemmWeight down = gemm_weight_of(w.shared_down);
                                if (own_gemm_takes(gu, num_tokens) && own_gemm_takes(down, num_tokens)) return true;
                                return num_tokens <= shared_beside_library_max_tokens_ &&
                                       library_gemm_takes(gu, num_tokens) && library_gemm_takes(down, num_tokens);
                              }();
  // SiLU·up in fp32 where the shared down product reads fp32 rows (few_row_f32_rows).
  const bool shared_act_f32 = shared_in_routing && silu_up_f32(num_tokens, w.shared_gate_up, w.shared_down);
  if (shared_in_routing)
    shared_act = alloc_->cached({num_tokens, shared_inter_p}, shared_act_f32 ? DType::kF32 : DType::kBF16);
  // The logits made beside o_proj (RouterIdentity), before the norm's factor, which the routing
  // applies: the shared experts' gate/up goes beside the routing, their down product with the
  // routed experts (moe_experts_grouped).
  const RouteHint hint = std::exchange(route_hint_, RouteHint{});
  const bool identity_logits = hint.logits_made && hint.moe == &w && num_tokens == 1 && shared_in_routing &&
                               x_scale.partials != nullptr;
  DS_CHECK(!identity_logits || !f32_products_);  // one-token steps of f32 products make their own logits
  // The shared experts' products where they run in the routing's launches (or, their down
  // product, with the routed experts').
  GroupedGemmArgs shared_gate_up, shared_down;
  if (shared_in_routing) {
    shared_gate_up = scaled(
        dense_product(xb, num_tokens, w.shared_gate_up,
                      shared_act_f32 ? GemmEpilogue::kSiluMulF32 : GemmEpilogue::kSiluMulBf16, shared_act.data,
                      shared_inter_p, shared_inter_p),
        x_scale);
    read_f32_rows(shared_gate_up, &x, num_tokens);
    shared_down = dense_product(shared_act, num_tokens, w.shared_down, GemmEpilogue::kStoreF32, shared.data, hidden,
                                w.shared_down.out_features);
    if (shared_act_f32) {
      read_f32_rows(shared_down, &shared_act, num_tokens);
      DS_CHECK(shared_down.x_f32 != nullptr);
    }
  }
  std::optional<ForkedStreams> forked;
  if (shared_on_side) {
    forked.emplace(stream_, side_stream_, fork_event_, join_event_, *alloc_);
    queue_on_side(
        [&] { gated_mlp_bf16(xb, num_tokens, w.shared_gate_up, w.shared_down, shared.as<float>(), hidden, &x); });
  }

  Tensor d_ids = alloc_->cached({num_entries}, DType::kI32);
  Tensor d_weights = alloc_->cached({num_entries}, DType::kF32);
  const float* bias = w.score_correction_bias.empty() ? nullptr : w.score_correction_bias.as<float>();
  Tensor logits = alloc_->cached({num_tokens, num_experts}, DType::kF32);
  if (identity_logits) {
    // made beside o_proj
  } else if (shared_in_routing) {
    launch_router_logits_beside(x.as<float>(), w.gate.as<float>(), num_tokens, static_cast<int>(hidden), num_experts,
                                logits.as<float>(), shared_gate_up, stream_);
  } else if (!batch_invariant_ && num_tokens > kRouterKernelMaxTokens) {
    matmul_->f32(w.gate.as<float>(), x.as<float>(), logits.as<float>(), num_tokens, num_experts, hidden);
  } else {
    launch_router_logits(x.as<float>(), w.gate.as<float>(), num_tokens, static_cast<int>(hidden), num_experts,
                         logits.as<float>(), stream_);
  }

  // plan = [row_offsets E+1 | block_offsets E+1 | src_rows | slot_rows]
  Tensor plan = alloc_->cached({2 * (num_experts + 1) + 2 * num_entries}, DType::kI32);
  int32_t* row_offsets = plan.as<int32_t>();
  int32_t* block_offsets = row_offsets + num_experts + 1;
  int32_t* src_rows = block_offsets + num_experts + 1;
  int32_t* slot_rows = src_rows + num_entries;
  const int64_t plan_workspace_ints = moe_plan_workspace_ints(static_cast<int>(num_entries), num_experts);
  Tensor plan_workspace;
  if (plan_workspace_ints > 0) plan_workspace = alloc_->cached({plan_workspace_ints}, DType::kI32);
  // With the logits from beside o_proj the gate/up product runs here; its down product after the
  // routing's launch (one_token_moe_order_), so that the routed gate/up product after that one
  // reads its plan before its wait, or with the routed down product.
  const bool shared_down_between =
      identity_logits && one_token_moe_order_ == OneTokenMoeOrder::kSharedDownBetween;
  if (shared_in_routing)
    launch_moe_route_and_plan_beside(identity_logits ? hint.id->logits.as<float>() : logits.as<float>(), num_tokens,
                                     params, bias, d_ids.as<int32_t>(), d_weights.as<float>(), kGemmRowsPerBlock,
                                     row_offsets, block_offsets, src_rows, slot_rows,
                                     identity_logits ? shared_gate_up : shared_down, stream_,
                                     identity_logits ? x_scale : RowRmsScale{}, one_token_route_in_a_warp_,
                                     route_rehearsal_);
  else  // chunked layers count their block offsets in chunks
    launch_moe_route_and_plan(logits.as<float>(), num_tokens, params, bias, d_ids.as<int32_t>(),
                              d_weights.as<float>(), chunked ? kChunkRows : grouped_rows_per_block, row_offsets,
                              block_offsets, src_rows, slot_rows,
                              plan_workspace_ints > 0 ? plan_workspace.as<int32_t>() : nullptr, stream_,
                              one_token_route_in_a_warp_);

  Tensor expert_out;
  std::optional<DeferredDown> deferred;
  const int32_t* combine_rows = slot_rows;
  Tensor chunk_slot_rows;
  if (chunked) {
    chunk_slot_rows = alloc_->cached({num_entries}, DType::kI32);
    expert_out = moe_experts_chunked(w, xb, row_offsets, block_offsets, src_rows, d_ids.as<int32_t>(), slot_rows,
                                     num_entries, num_chunks, chunk_slot_rows.as<int32_t>());
    combine_rows = chunk_slot_rows.as<int32_t>();
  } else if (host_planned) {
    expert_out = moe_experts_host_planned(w, xb, row_offsets, src_rows, num_entries);
  } else if (f32_products_) {
    expert_out = moe_experts_f32(w, x, row_offsets, block_offsets, src_rows, num_entries);
  } else {
    if (shared_down_between)
      launch_few_row_gemm(shared_down, shared_down.dense.n_padded, 1, shared_down.dense_rows, stream_);
    expert_out = moe_experts_grouped(w, xb, row_offsets, block_offsets, src_rows, num_entries,
                                     grouped_rows_per_block, x_scale,
                                     identity_logits && !shared_down_between ? &shared_down : nullptr, &x,
                                     shared_down_between, defer_down ? &deferred : nullptr);
  }

  if (forked) forked->join();
  else if (w.has_shared && f32_products_)
    gated_mlp_f32(x, w.shared_gate_up, w.shared_down, shared.as<float>(), hidden);
  else if (w.has_shared && !shared_in_routing)
    gated_mlp_bf16(xb, num_tokens, w.shared_gate_up, w.shared_down, shared.as<float>(), hidden, &x);
  MoeOutputs m;
  m.combine = MoeCombineRows{expert_out.data,
                             expert_out.dtype == DType::kBF16,
                             expert_out.dim(1),
                             combine_rows,
                             d_weights.as<float>(),
                             shared.empty() ? nullptr : shared.as<float>(),
                             top_k,
                             combine_slots_at_once_};
  m.keep = {std::move(expert_out), std::move(plan), std::move(chunk_slot_rows), std::move(shared)};
  m.down = std::move(deferred);
  m.ids = std::move(d_ids);
  m.weights = std::move(d_weights);
  return m;
}

CudaBackend::QuantisedRows CudaBackend::quantise_rows_for(const Tensor& x_bf16, int64_t rows, int64_t k,
                                                          GroupedGemmArgs& args, int terms) {
  // Padded as the library products pad theirs, so that the shared experts' product can take
  // the routed experts' quantised rows.
  const int64_t rows_padded = round_up(rows, kLibraryFp8RowMultiple);
  QuantisedRows q = quantise_rows(x_bf16, rows, rows_padded, k, terms);
  take_quantised_rows(q, args);
  return q;
}

void CudaBackend::take_quantised_rows(const QuantisedRows& q, GroupedGemmArgs& args) const {
  args.xq = q.q.as<uint8_t>();
  args.x_scales = q.scales.as<float>();
  args.x_scale_rows = q.scales.dim(1);  // scales [k / 128, terms * rows_padded]
  args.x_terms = q.terms;
  args.x_term_rows = q.scales.dim(1) / q.terms;
  args.pass_rows = fp8_expert_pass_rows_;
}

bool CudaBackend::fp8_expert_activations_for(const MoeWeights& w) const {
  const LinearWeight& gu0 = w.expert_gate_up[0];
  const LinearWeight& down0 = w.expert_down[0];
  const int64_t k_p = gu0.weight.dim(1), inter_p = gu0.weight.dim(0) / 2;
  return fp8_expert_blocks_ && fp8_expert_activations_ && gu0.weight.dtype == DType::kF8E4M3 &&
         down0.weight.dtype == DType::kF8E4M3 && k_p % kLibraryFp8TileColumns == 0 &&
         inter_p % kLibraryFp8TileColumns == 0;
}

// All experts in two grouped GEMMs that read the routing from the device (no host wait).
Tensor CudaBackend::moe_experts_grouped(const MoeWeights& w, const Tensor& xb, const int32_t* row_offsets,
                                        const int32_t* block_offsets, const int32_t* src_rows, int64_t num_entries,
                                        int rows_per_block, const RowRmsScale& x_scale,
                                        const GroupedGemmArgs* shared_down, const Tensor* x,
                                        bool layout_written_earlier, std::optional<DeferredDown>* defer_down) {
  const int num_experts = w.num_experts;
  const GemmWeight* gate_up_table = static_cast<const GemmWeight*>(w.derived.data);
  const LinearWeight& gu0 = w.expert_gate_up[0];
  const LinearWeight& down0 = w.expert_down[0];
  const int64_t k_p = gu0.weight.dim(1), inter_p = gu0.weight.dim(0) / 2, hidden = down0.out_features;
  // In a decode step of few tokens the bound by the routed entries is the tighter one: at batch 1
  // the grid holds 6 row-blocks instead of 65 (V2-Lite), none that would only find its expert empty.
  const int max_blocks = static_cast<int>(grouped_max_row_blocks(num_entries, rows_per_block, num_experts));
  const int rows_hint = static_cast<int>((num_entries + num_experts - 1) / num_experts);
  // A token's experts are distinct: no expert has more rows than the step has tokens.
  const int64_t num_tokens = num_entries / w.top_k;
  const bool few_rows = routed_few_row_takes(num_tokens);
  // Experts with enough rows take the 128-row expert blocks (e4m3 ones unless
  // DSINFER_MOE_FP8_EXPERT_BLOCKS=0); batch-invariant steps keep one kind of block at every
  // batch size. e4m3 experts that take DeepSeek's FP8 activations there do so past the few-row
  // kernel's steps at any row count: their warpgroup products read the weights without widening
  // them, and beat the 32-row blocks from one row per expert (FP8 decode at batch 4 to 32 7–14%
  // faster); bf16 experts from four (below it an expert's weight is read by few 128-row blocks,
  // one per SM at batch 1, which keep too little in flight, and the 32-row blocks win).
  const bool fp8_activation_experts = fp8_expert_activations_for(w);
  const int min_rows = fp8_activation_experts ? fp8_expert_block_min_rows_ : expert_block_min_rows_;
  const bool expert_blocks = !batch_invariant_ && !few_rows && rows_hint >= min_rows;

  GroupedGemmArgs up;
  up.x = xb.as<uint16_t>();
  up.ldx = k_p;
  up.src_rows = src_rows;
  up.groups = gate_up_table;
  up.row_offsets = row_offsets;
  up.block_offsets = block_offsets;
  up.num_groups = num_experts;
  up.rows_per_block = rows_per_block;
  up.weights_fp8 = gu0.weight.dtype == DType::kF8E4M3;
  up.few_row_fixed_phases = few_row_fixed_phases_;
  up.expert_blocks = expert_blocks && (!up.weights_fp8 || fp8_expert_blocks_);
  up.epilogue = GemmEpilogue::kSiluMulBf16;
  up.prefill_weight_rows = prefill_expert_weight_rows_;
  up.ldy = inter_p;
  up.n_out = static_cast<int>(inter_p);
  up.few_row_mma = few_row_mma_experts_ && (num_tokens >= 2 || few_row_mma_one_token_);
  up.layout_before_wait = layout_written_earlier;
  up.weights_evict_first = weights_l2_evict_first_;
  // e4m3 experts in the expert blocks with e4m3 activations: the step's rows quantised once for
  // the gate/up product (which gathers them by src_rows), and its SiLU·up rows for the down one.
  const bool fp8_activations = expert_blocks && fp8_activation_experts;  // expert_blocks: past few_rows
  DS_CHECK_MSG(rows_per_block == kGemmRowsPerBlock || fp8_activations,
               "moe: row-blocks of " << rows_per_block << " rows need the e4m3 expert blocks");
  QuantisedRows x_q, act_q;
  // In the steps whose dense products take e4m3 terms, these blocks take as many.
  const int terms = rows_per_block == kGemmRowsPerBlock ? fp8_activation_terms(num_tokens) : 1;
  if (fp8_activations) x_q = quantise_rows_for(xb, num_tokens, k_p, up, terms);
  // The prefill expert blocks' 256-row tiles write the down product's e4m3 rows themselves (a
  // tile's 128 outputs are one scale tile), without the bf16 rows and the pass that quantised
  // them (DSINFER_MOE_PREFILL_SILU_E4M3=0 keeps those).
  const bool act_e4m3 = fp8_activations && rows_per_block == kExpertBlockWideRows &&
                        up.prefill_weight_rows == 256 && prefill_expert_silu_e4m3_;
  // SiLU·up in fp32 where the few-row down product reads fp32 rows (few_row_f32_rows).
  const bool act_f32 = few_rows && silu_up_f32(num_tokens, gu0, down0);
  if (act_f32) up.epilogue = GemmEpilogue::kSiluMulF32;
  Tensor act;
  // Their weight rows by TMA where the layer has tensor maps (DSINFER_MOE_PREFILL_TMA_WEIGHTS=0:
  // cp.async).
  const CUtensorMap* weight_maps = expert_weight_maps(w);
  up.tma_weights = act_e4m3 && prefill_expert_tma_weights_ && weight_maps != nullptr;
  up.weight_maps = up.tma_weights ? weight_maps : nullptr;
  if (act_e4m3) {
    act_q = new_quantised_rows(round_up(num_entries, kLibraryFp8RowMultiple), inter_p);
    up.epilogue = GemmEpilogue::kSiluMulE4m3;
    up.y = act_q.q.data;
    up.y_scales = act_q.scales.as<float>();
    up.y_scale_rows = act_q.scales.dim(1);
  } else {
    act = alloc_->cached({num_entries, inter_p}, act_f32 ? DType::kF32 : DType::kBF16);
    up.y = act.data;
  }
  const int max_rows_per_block = static_cast<int>(num_tokens);
  DS_CHECK_MSG(x_scale.partials == nullptr || few_rows, "moe: only the few-row kernel applies a pending norm's factor");
  up.rms_scale = x_scale;
  if (few_rows) read_f32_rows(up, x, num_tokens);
  if (few_rows)
    launch_few_row_gemm(up, static_cast<int>(gu0.weight.dim(0)), max_blocks, max_rows_per_block, stream_);
  else
    launch_grouped_gemm(up, static_cast<int>(gu0.weight.dim(0)), max_blocks, rows_hint, stream_);

  GroupedGemmArgs down = up;
  down.rms_scale = {};
  down.x = act_e4m3 || act_f32 ? nullptr : act.as<uint16_t>();
  down.x_f32 = nullptr;
  if (act_f32) {
    read_f32_rows(down, &act, num_tokens);
    DS_CHECK(down.x_f32 != nullptr);
  }
  down.y_scales = nullptr;
  down.y_scale_rows = 0;
  down.weight_maps = up.tma_weights ? weight_maps + num_experts : nullptr;
  down.ldx = inter_p;
  down.src_rows = nullptr;
  down.tma_rows = down.tma_weights && prefill_expert_tma_rows_;  // its rows are contiguous per row-block
  down.groups = gate_up_table + num_experts;
  // The gate/up product, the launch before, waited for the routing and planning.
  down.layout_before_wait = true;
  down.weights_fp8 = down0.weight.dtype == DType::kF8E4M3;
  down.expert_blocks = expert_blocks && (!down.weights_fp8 || fp8_expert_blocks_);
  down.epilogue = GemmEpilogue::kStoreF32;
  if (act_e4m3) take_quantised_rows(act_q, down);
  else if (fp8_activations) act_q = quantise_rows_for(act, num_entries, inter_p, down, terms);
  // Row-blocks of kExpertBlockWideRows rows are the prefill expert blocks' (e4m3 activations).
  const bool out_bf16 = rows_per_block == kExpertBlockWideRows && prefill_expert_outputs_bf16_;
  if (out_bf16) down.epilogue = GemmEpilogue::kStoreBf16;
  down.staged_bf16_stores = prefill_expert_staged_bf16_ && hidden % 8 == 0;  // whole 16-byte pieces
  Tensor expert_out = alloc_->cached({num_entries, hidden}, out_bf16 ? DType::kBF16 : DType::kF32);
  down.y = expert_out.data;
  down.ldy = hidden;
  down.n_out = static_cast<int>(hidden);
  // The shared experts' down product in the same launch where both take the few-row kernel at one
  // row (one-token steps), else after it.
  const bool shared_down_with_routed =
      shared_down != nullptr && few_rows && max_rows_per_block == 1 && shared_down_with_routed_;
  if (defer_down != nullptr && few_rows && max_rows_per_block == 1 && shared_down == nullptr && !out_bf16) {
    defer_down->emplace(DeferredDown{down, static_cast<int>(down0.weight.dim(0)), max_blocks, act});
    return expert_out;
  }
  if (shared_down_with_routed)
    launch_few_row_gemm_with_dense(down, static_cast<int>(down0.weight.dim(0)), max_blocks, *shared_down, stream_);
  else if (few_rows)
    launch_few_row_gemm(down, static_cast<int>(down0.weight.dim(0)), max_blocks, max_rows_per_block, stream_);
  else
    launch_grouped_gemm(down, static_cast<int>(down0.weight.dim(0)), max_blocks, rows_hint, stream_);
  if (shared_down != nullptr && !shared_down_with_routed)
    launch_few_row_gemm(*shared_down, shared_down->dense.n_padded, 1, shared_down->dense_rows, stream_);
  return expert_out;
}

// The pointer-array products of a chunked layer, for both of its products at the batch of
// num_chunks chunks: whether cuBLASLt has algorithms for them (plans cached). They are bf16
// products: e4m3 experts are widened for the layer (cuBLASLt's block-scaled FP8 product takes
// one scale pointer per matrix, not one per batch entry), unless DSINFER_MOE_FP8_CHUNKED=0.
bool CudaBackend::chunked_experts_ready(const MoeWeights& w, int num_chunks) {
  const GemmWeight gu = gemm_weight_of(w.expert_gate_up[0]), down = gemm_weight_of(w.expert_down[0]);
  if ((gu.scales != nullptr || down.scales != nullptr) && !fp8_experts_chunked_) return false;
  return matmul_->pointer_array_ready(chunk_product(gu, num_chunks)) &&
         matmul_->pointer_array_ready(chunk_product(down, num_chunks));
}

// Prefill-sized experts without the host: the grouped rows in chunks of kChunkRows, each
// chunk one entry of a cuBLASLt product whose operands come from pointer arrays that a kernel
// fills from the device plan (MoeChunkLayout); e4m3 experts are widened to bf16 first. Gives
// bf16 rows [num_chunks * kChunkRows, the down weight's n_padded] and, in chunk_slot_rows, the
// row of every (token, slot) entry.
Tensor CudaBackend::moe_experts_chunked(const MoeWeights& w, const Tensor& xb, const int32_t* row_offsets,
                                        const int32_t* chunk_offsets, const int32_t* src_rows,
                                        const int32_t* expert_ids, const int32_t* slot_rows, int64_t num_entries,
                                        int num_chunks, int32_t* chunk_slot_rows) {
  const GemmWeight* table = static_cast<const GemmWeight*>(w.derived.data);
  const GemmWeight gu = gemm_weight_of(w.expert_gate_up[0]), down = gemm_weight_of(w.expert_down[0]);
  const int64_t k_p = gu.k_padded, inter_p = gu.n_padded / 2, rows = int64_t{num_chunks} * kChunkRows;
  // The routed rows grouped by expert, and kChunkRows spare rows for the last chunk to read
  // (zeros: every product reads only defined values).
  Tensor xeb = alloc_->cached({num_entries + kChunkRows, k_p}, DType::kBF16);
  launch_gather_rows_bf16(xb.as<uint16_t>(), src_rows, num_entries, k_p, xeb.as<uint16_t>(), stream_);
  DS_CUDA_CHECK(cudaMemsetAsync(xeb.as<uint16_t>() + num_entries * k_p, 0, kChunkRows * k_p * sizeof(uint16_t),
                                stream_));
  Tensor gate_up = alloc_->cached({rows, gu.n_padded}, DType::kBF16);
  Tensor act = alloc_->cached({rows, inter_p}, DType::kBF16);
  Tensor expert_out = alloc_->cached({rows, down.n_padded}, DType::kBF16);
  Tensor pointers = alloc_->cached({6 * int64_t{num_chunks}}, DType::kI64);
  MoeChunkLayout layout;
  // e4m3 experts: every expert's weights widened to bf16 (block scales applied) for this layer,
  // expert e's at e * stride elements of `widened`.
  const auto widen_experts = [&](const std::vector<LinearWeight>& experts, Tensor& widened, int64_t& stride) {
    const GemmWeight first = gemm_weight_of(experts[0]);
    if (first.scales == nullptr) return static_cast<const uint16_t*>(nullptr);
    stride = int64_t{first.n_padded} * first.k_padded;
    widened = alloc_->cached({w.num_experts * stride}, DType::kBF16);
    for (int e = 0; e < w.num_experts; ++e)
      launch_gemm_weight_to_bf16(gemm_weight_of(experts[e]), widened.as<uint16_t>() + e * stride, stream_);
    return static_cast<const uint16_t*>(widened.as<uint16_t>());
  };
  Tensor gate_up_widened, down_widened;
  layout.gate_up_widened = widen_experts(w.expert_gate_up, gate_up_widened, layout.gate_up_widened_stride);
  layout.down_widened = widen_experts(w.expert_down, down_widened, layout.down_widened_stride);
  layout.row_offsets = row_offsets;
  layout.chunk_offsets = chunk_offsets;
  layout.gate_up = table;
  layout.down = table + w.num_experts;
  layout.num_experts = w.num_experts;
  layout.num_chunks = num_chunks;
  layout.chunk_rows = kChunkRows;
  layout.x = xeb.as<uint16_t>();
  layout.ld_x = k_p;
  layout.gate_up_out = gate_up.as<uint16_t>();
  layout.ld_gate_up = gu.n_padded;
  layout.act = act.as<uint16_t>();
  layout.ld_act = inter_p;
  layout.out = expert_out.as<uint16_t>();
  layout.ld_out = down.n_padded;
  layout.pointers = static_cast<void**>(pointers.data);
  layout.expert_ids = expert_ids;
  layout.slot_rows = slot_rows;
  layout.num_entries = static_cast<int>(num_entries);
  layout.chunk_slot_rows = chunk_slot_rows;
  launch_moe_chunk_layout(layout, stream_);
  void** p = layout.pointers;
  const int64_t n = num_chunks;
  matmul_->bf16_pointer_array(chunk_product(gu, num_chunks), p, p + n, p + 2 * n);
  launch_silu_mul_interleaved(gate_up.data, /*gate_up_bf16=*/true, rows, inter_p, /*halves=*/false,
                              act.as<uint16_t>(), stream_);
  matmul_->bf16_pointer_array(chunk_product(down, num_chunks), p + 3 * n, p + 4 * n, p + 5 * n);
  return expert_out;
}

// Prefill-sized batches: the experts' row counts come to the host (one wait per layer) and
// each expert's rows run as plain GEMMs, which cuBLASLt tiles far better than the decode
// kernel once an expert has hundreds of rows. bf16 experts give bf16 rows [num_entries, the
// down weight's n_padded] (half the bytes for the combine to read), e4m3 ones fp32 rows
// [num_entries, hidden].
Tensor CudaBackend::moe_experts_host_planned(const MoeWeights& w, const Tensor& xb, const int32_t* row_offsets,
                                             const int32_t* src_rows, int64_t num_entries) {
  const int num_experts = w.num_experts;
  std::vector<int32_t> offsets(num_experts + 1);
  DS_CUDA_CHECK(cudaMemcpyAsync(offsets.data(), row_offsets, offsets.size() * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                stream_));
  synchronize();
  const int64_t hidden = w.expert_down[0].out_features;
  const LinearWeight& gu0 = w.expert_gate_up[0];
  const int64_t k_p = gu0.weight.dim(1), inter_p = gu0.weight.dim(0) / 2;
  // The routed rows, grouped by expert, from the bf16 input (a quarter of the fp32 traffic).
  Tensor xeb = alloc_->cached({num_entries, k_p}, DType::kBF16);
  launch_gather_rows_bf16(xb.as<uint16_t>(), src_rows, num_entries, k_p, xeb.as<uint16_t>(), stream_);
  // Every expert's gate/up product lands in one buffer, so that SiLU·up runs once over all of
  // them. An FP8 product writes its rows in groups of 4: the spare rows of one expert are
  // overwritten by the next one's (the stream runs them in order), the last one's land in
  // the extra rows at the end.
  Tensor gate_up = alloc_->cached({num_entries + kLibraryFp8RowMultiple, 2 * inter_p},
                                  library_output_dtype(gemm_weight_of(gu0)));
  const size_t gate_up_row_bytes = 2 * inter_p * dtype_size_bytes(gate_up.dtype);
  for (int e = 0; e < num_experts; ++e) {
    const int64_t begin = offsets[e], n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    library_product_native(view_rows(xeb, begin, n), n, gemm_weight_of(w.expert_gate_up[e]),
                           static_cast<char*>(gate_up.data) + begin * gate_up_row_bytes);
  }
  Tensor act = alloc_->cached({num_entries, inter_p}, DType::kBF16);
  launch_silu_mul_interleaved(gate_up.data, gate_up.dtype == DType::kBF16, num_entries, inter_p, /*halves=*/false,
                              act.as<uint16_t>(), stream_);
  // bf16 rows straight from cuBLASLt; fp32 ones (e4m3 experts) through gemm, which drops the
  // FP8 product's spare rows on the way to `hidden`-wide rows.
  const GemmWeight down0 = gemm_weight_of(w.expert_down[0]);
  const bool down_bf16 = library_output_dtype(down0) == DType::kBF16;
  Tensor expert_out = down_bf16 ? alloc_->cached({num_entries, down0.n_padded}, DType::kBF16)
                                : alloc_->cached({num_entries, hidden}, DType::kF32);
  for (int e = 0; e < num_experts; ++e) {
    const int64_t begin = offsets[e], n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    const Tensor act_rows = view_rows(act, begin, n);
    if (down_bf16)
      library_product_native(act_rows, n, gemm_weight_of(w.expert_down[e]),
                             expert_out.as<uint16_t>() + begin * down0.n_padded);
    else
      gemm(act_rows, n, w.expert_down[e], static_cast<int>(GemmEpilogue::kStoreF32),
           expert_out.as<float>() + begin * hidden, hidden, hidden, /*library_gemm=*/true);
  }
  return expert_out;
}

}  // namespace dsinfer::cuda

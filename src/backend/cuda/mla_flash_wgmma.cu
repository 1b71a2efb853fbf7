// Fused causal attention of the expanded MLA prefill form on Hopper's warpgroup products
// (wgmma.cuh), for DeepSeek's head widths (192 for queries and keys, 128 for values). The
// algorithm is mla_flash.cu's; what changes is where the operands live:
// - Q·Kᵀ reads both operands from shared memory (K-major, 128-byte swizzle), so the keys are
//   not pulled through every warp's registers: with mma.sync each warp read the whole key and
//   value tiles with ldmatrix, about 8 multiply-adds per byte of shared memory read, which
//   bounds that kernel near half the tensor rate;
// - P·V takes the probabilities from registers (the score accumulators, packed to bf16, are
//   already in the A-fragment layout) and the values from shared memory as stored, rows along
//   the keys (the product's MN-major B form);
// - a block is three warpgroups of 64 queries each, which share the key stages: each 64 keys
//   are read from L2 once per 192 queries (blocks of one warpgroup, two per SM, made 4 × 4k
//   prefill 5% slower, blocks of two 2%);
// - a fourth warpgroup copies: one of its threads issues the queries and each stage of keys and
//   values as TMA boxes, and the stages pass between it and the math groups through mbarriers,
//   so no block barrier holds the groups in step (one group's softmax runs while another's
//   products do). The same hand-over with a copy loop of 16-byte cp.async copies ran a fifth of
//   the kernel's instructions and lost to a block barrier per step; with TMA the kernel took
//   153 µs for one 4k sequence against the barrier form's 232 (RESULTS.md, "Prefill attention
//   fed by TMA");
// - inside a group, a step's Q·Kᵀ runs beside the step before's P·V, the softmax between them
//   (FlashAttention-3's order: 147–150 µs);
// - a step issues few instructions besides its products (see the kernel);
// - the keys' rope columns are MLA's: one rotated k_rope per position, shared by every head. They
//   come from the latent rows themselves (the third key panel of a stage), so the up-projection
//   makes only each head's k_nope and v (a fifth fewer products than with the rope copied per
//   head through identity rows, and a fifth fewer bytes of keys and values).
#include <cuda_bf16.h>

#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/mbarrier.cuh"
#include "backend/cuda/mla_flash.h"
#include "backend/cuda/tensor_core.cuh"
#include "backend/cuda/tensor_map.h"
#include "backend/cuda/wgmma.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kKeys = 64;  // keys per step
constexpr int kNope = 128, kRope = 64, kQk = kNope + kRope, kV = 128;
constexpr int kKvHeadWidth = kNope + kV;  // a head's columns of the up-projected keys and values
constexpr int kPanelCols = 64;               // bf16 columns of a 128-byte swizzle row
constexpr int kPanelBytes = 64 * 128;        // 64 rows of one panel (queries and keys alike)
constexpr int kQkPanels = kQk / kPanelCols;  // 3
constexpr int kVPanels = kV / kPanelCols;    // 2
constexpr int kGroupQBytes = kQkPanels * kPanelBytes;            // a warpgroup's 64 queries
constexpr int kStageBytes = (kQkPanels + kVPanels) * kPanelBytes;
constexpr int kVOffset = kQkPanels * kPanelBytes;  // within a stage

constexpr int kGroups = 3;  // math warpgroups of 64 queries
constexpr int kMathThreads = kGroups * 128;
constexpr int kThreads = kMathThreads + 128;  // and the copy warpgroup
constexpr int kQueries = kGroups * 64;        // a block's
constexpr int kStages = 3;
// The registers a thread of each role may use (setmaxnreg). The launch gives each of the 512
// threads 128; setmaxnreg.inc takes only registers that setmaxnreg.dec gave back, and the copy
// group's 128 × (128 - 24) cover the math groups' 384 × (160 - 128).
constexpr int kCopyRegisters = 24, kMathRegisters = 160;
// Shared memory from a 1024-byte boundary: each group's Q panels, then per stage K's panels and
// V's, then the barriers: the queries' one, and per stage a full and an empty one.
constexpr int kStagesOffset = kGroups * kGroupQBytes;
constexpr int kBarrierOffset = kStagesOffset + kStages * kStageBytes;
constexpr int kBytes = kBarrierOffset + 8 * (1 + 2 * kStages) + 1024;  // and the slack to align the start
static_assert(kBytes <= 227 * 1024, "a block fits on an SM");

// 2^x on the special-function unit, denormal results flushed to zero (exp2f adds a range check
// and two multiplies around the same instruction; here every x is a score less its row's max).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The online softmax over a step of a warp's raw scores s (the products' layout: s[4 n + e] is
// key group n's value e, rows g and g + 8): keys past a row's position or at key_end and after
// set to -inf when kMasked (only steps on the diagonal or at the end have any); each row's
// running max (in log2 units) and sum move on, the scores become their exponentials, and
// rescale[i] is the factor for what row i accumulated under its old max (0 at the first step).
// The scale folds into the exponent's multiply-add: with scale_log2 > 0 the max of the raw
// scores scales to the max of the scaled ones. Every row sees key 0 at the first step, so its
// max is finite from then on.
template <bool kMasked>
__device__ __forceinline__ void softmax_scores(float (&s)[32], float (&row_max)[2], float (&row_sum)[2],
                                               float (&rescale)[2], float scale_log2, int j0, int warp_pos,
                                               int key_end, int g, int t) {
  if constexpr (kMasked) {
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = j0 + n * 8 + 2 * t + (e & 1), pos = warp_pos + g + (e >> 1) * 8;
        if (key > pos || key >= key_end) s[4 * n + e] = -INFINITY;
      }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float m = fmaxf(s[2 * i], s[2 * i + 1]);
#pragma unroll
    for (int n = 1; n < kKeys / 8; ++n) m = fmaxf(m, fmaxf(s[4 * n + 2 * i], s[4 * n + 2 * i + 1]));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    const float m_new = fmaxf(row_max[i], m * scale_log2);
    rescale[i] = exp2_ftz(row_max[i] - m_new);
    row_max[i] = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
      s[4 * n + 2 * i] = exp2_ftz(fmaf(s[4 * n + 2 * i], scale_log2, -m_new));
      s[4 * n + 2 * i + 1] = exp2_ftz(fmaf(s[4 * n + 2 * i + 1], scale_log2, -m_new));
      sum += s[4 * n + 2 * i] + s[4 * n + 2 * i + 1];
    }
    row_sum[i] = row_sum[i] * rescale[i] + sum;
  }
}

// The masked or the plain step, as the step's keys and the warpgroup's rows (from group_pos, the
// position of its first) need. Decided for the whole warpgroup, so that the compiler sees the
// branch taken alike by its warps (one decided per warp made ptxas serialise the products that
// follow, its C7520 warning).
__device__ __forceinline__ void softmax_scores(float (&s)[32], float (&row_max)[2], float (&row_sum)[2],
                                               float (&rescale)[2], float scale_log2, int j0, int group_pos,
                                               int warp_pos, int key_end, int g, int t) {
  if (j0 + kKeys - 1 > group_pos || j0 + kKeys > key_end)
    softmax_scores<true>(s, row_max, row_sum, rescale, scale_log2, j0, warp_pos, key_end, g, t);
  else
    softmax_scores<false>(s, row_max, row_sum, rescale, scale_log2, j0, warp_pos, key_end, g, t);
}

__device__ __forceinline__ void rescale_output(float (&o)[kVPanels][32], const float (&rescale)[2]) {
#pragma unroll
  for (int p = 0; p < kVPanels; ++p)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      o[p][4 * j + 0] *= rescale[0];
      o[p][4 * j + 1] *= rescale[0];
      o[p][4 * j + 2] *= rescale[1];
      o[p][4 * j + 3] *= rescale[1];
    }
}

// Descriptors advance by an address in 16-byte units in their low field (shared addresses stay
// below 2^18, so the field never carries).
__device__ __forceinline__ uint64_t advance_descriptor(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// A group's 64 × 64 scores: Q (desc_q, its three panels) · the stage's keys (desc_stage, the
// stage's start)ᵀ, twelve k16 steps, four per 128-byte panel (32 bytes each), committed.
__device__ __forceinline__ void issue_scores(float (&s)[32], uint64_t desc_q, uint64_t desc_stage) {
#pragma unroll
  for (int kk = 0; kk < kQk / 16; ++kk) {
    const uint32_t offset = (kk / 4) * kPanelBytes + 32 * (kk % 4);
    const uint64_t dq = advance_descriptor(desc_q, offset), dk = advance_descriptor(desc_stage, offset);
    if (kk == 0) wgmma_m64n64k16_bf16<false>(s, dq, dk);
    else wgmma_m64n64k16_bf16<true>(s, dq, dk);
  }
  wgmma_commit();
}

// Probabilities as the A fragments of keys 16 kk .. 16 kk + 15 (score groups 2 kk and 2 kk + 1).
__device__ __forceinline__ void pack_probabilities(const float (&s)[32], uint32_t (&a)[kKeys / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    a[kk][0] = pack_bf16x2(s[8 * kk + 0], s[8 * kk + 1]);
    a[kk][1] = pack_bf16x2(s[8 * kk + 2], s[8 * kk + 3]);
    a[kk][2] = pack_bf16x2(s[8 * kk + 4], s[8 * kk + 5]);
    a[kk][3] = pack_bf16x2(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// O [64 x 128] += P [64 x 64] · V of the stage (desc_stage_mn: the stage's start in the MN-major
// form); a value panel is 64 columns, one product each; committed.
__device__ __forceinline__ void issue_values(float (&o)[kVPanels][32], const uint32_t (&a)[kKeys / 16][4],
                                             uint64_t desc_stage_mn) {
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk)
#pragma unroll
    for (int p = 0; p < kVPanels; ++p)
      wgmma_m64n64k16_bf16_registers_a(o[p], a[kk],
                                       advance_descriptor(desc_stage_mn, kVOffset + p * kPanelBytes + kk * 16 * 128));
  wgmma_commit();
}

// Normalised rows into out [num_queries, heads, v_dim] (rows ld_out floats apart); v_dim is a
// multiple of 4, so a thread's column pair is whole or past the end.
__device__ __forceinline__ void store_rows(const float (&o)[kVPanels][32], const float (&row_sum)[2], float* out,
                                           int64_t ld_out, int q0, int rows, int h, int v_dim, int warp_row0, int g,
                                           int t) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float sum = row_sum[i];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int r = warp_row0 + g + i * 8;
    if (r >= rows) continue;
    const float inv = 1.0f / sum;
    float* dst = out + static_cast<int64_t>(q0 + r) * ld_out + static_cast<int64_t>(h) * v_dim;
#pragma unroll
    for (int p = 0; p < kVPanels; ++p)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int c = p * kPanelCols + j * 8 + 2 * t;
        if (c < v_dim)
          *reinterpret_cast<float2*>(dst + c) = make_float2(o[p][4 * j + 2 * i] * inv, o[p][4 * j + 2 * i + 1] * inv);
      }
  }
}

// Block (query block, head) of 192 queries; math warpgroup wg owns queries 64 wg .. 64 wg + 63
// of them, warp w of it rows 16 w .. 16 w + 15. As flash_attention_kernel in mla_flash.cu
// (positions, masking, the running max and sum per row), except the order of the blocks: one
// dimension, the heads of a query block next to each other and the longest query blocks (the
// last) first, so that the blocks issued first are the longest ones whatever the head count
// (with a block filling an SM, the heads of one query block per grid row left the longest for
// the later waves). This thread's score and output accumulators are in the products' layout
// (wgmma.cuh): s[4 n + e] is mma.sync's s[n][e].
//
// q_map covers queries [num_queries, heads × 192], kv_map keys' nope columns and values
// [num_keys, heads × (128 + 128)], rope_map the keys' shared rope columns [num_keys, 64], all in
// boxes of 64 columns (one swizzle row) by 64 rows. Rows past their ends arrive as zeros: queries
// past the chunk give finite scores and are never written; keys past key_end within the tensor
// arrive as they are and are masked.
//
// A step's instructions other than the products took more of the kernel's time than the
// products would at the tensor rate, so they are kept few: the descriptors are made once, from
// values the compiler knows to be warp-uniform, the masking runs only on the steps that need it,
// and the softmax scale rides in the exponent's multiply-add (softmax_scores).
__global__ void __launch_bounds__(kThreads, 1)
    flash_attention_wgmma_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap kv_map,
                                 const __grid_constant__ CUtensorMap rope_map, int num_heads, int v_dim,
                                 int num_queries, int first_pos, int num_keys, float scale_log2, float* out,
                                 int64_t ld_out) {
  await_previous_kernels();
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // Read through a shuffle from lane 0, these are known to the compiler to be the same in every
  // lane, and the descriptors made from them stay in uniform registers (a descriptor made per
  // product from per-thread values cost a move to a uniform register each).
  unsigned char* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
  const uint32_t smem_addr = __shfl_sync(0xffffffffu, shared_address(smem), 0);
  const uint32_t q_bar = smem_addr + kBarrierOffset, full_bar = q_bar + 8, empty_bar = full_bar + 8 * kStages;
  if (threadIdx.x == 0) {
    mbarrier_init(q_bar, 1);
    for (int i = 0; i < kStages; ++i) {
      mbarrier_init(full_bar + 8 * i, 1);                  // the copy thread's, with the bytes
      mbarrier_init(empty_bar + 8 * i, kMathThreads / 32);  // lane 0 of each math warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // seen by the copies
  }
  __syncthreads();
  const int num_q_blocks = (num_queries + kQueries - 1) / kQueries;
  const int q0 = (num_q_blocks - 1 - static_cast<int>(blockIdx.x) / num_heads) * kQueries;
  const int h = static_cast<int>(blockIdx.x) % num_heads;
  const int rows = min(kQueries, num_queries - q0);
  const int key_end = min(num_keys, first_pos + q0 + rows);
  const int num_steps = (key_end + kKeys - 1) / kKeys;

  if (threadIdx.x >= kMathThreads) {  // the copy warpgroup: one thread issues every copy
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kCopyRegisters));
    if (threadIdx.x != kMathThreads) return;
    mbarrier_arrive_expect_bytes(q_bar, kGroups * kGroupQBytes);
    for (int group = 0; group < kGroups; ++group)
      for (int p = 0; p < kQkPanels; ++p)
        tma_load_2d(smem_addr + group * kGroupQBytes + p * kPanelBytes, &q_map, h * kQk + p * kPanelCols,
                    q0 + 64 * group, q_bar);
    for (int step = 0; step < num_steps; ++step) {
      const int slot = step % kStages;
      if (step >= kStages) mbarrier_wait(empty_bar + 8 * slot, (step / kStages - 1) & 1);
      const uint32_t stage = smem_addr + kStagesOffset + slot * kStageBytes;
      mbarrier_arrive_expect_bytes(full_bar + 8 * slot, kStageBytes);
      // K's panels (nope, nope, the shared rope), then V's.
      for (int p = 0; p < kQkPanels + kVPanels; ++p) {
        const bool rope = p == kNope / kPanelCols;
        const int col = h * kKvHeadWidth + (p < kNope / kPanelCols ? p : p - 1) * kPanelCols;
        tma_load_2d(stage + p * kPanelBytes, rope ? &rope_map : &kv_map, rope ? 0 : col, step * kKeys,
                    full_bar + 8 * slot);
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kMathRegisters));
  const int group = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int group_row0 = 64 * group;
  // The positions of the group's and the warp's first rows.
  const int group_pos = first_pos + q0 + group_row0, warp_pos = group_pos + warp * 16;
  // The keys this group's rows see: it skips the steps past them (the block's later rows need
  // them), and all of them if its rows are past the chunk.
  const int group_key_end = group_row0 < rows ? min(key_end, group_pos + 64) : 0;
  const int group_steps = (group_key_end + kKeys - 1) / kKeys;  // a prefix of the block's steps
  const uint64_t desc_q = wgmma_descriptor_sw128(smem_addr + group * kGroupQBytes);
  const uint64_t desc_stages = wgmma_descriptor_sw128(smem_addr + kStagesOffset);
  const uint64_t desc_stages_mn = wgmma_descriptor_sw128_mn64(smem_addr + kStagesOffset);
  auto wait_full = [&](int step) { mbarrier_wait(full_bar + 8 * (step % kStages), (step / kStages) & 1); };
  auto release = [&](int step) {  // after this warp's products from the stage have completed
    __syncwarp();
    if (lane == 0) mbarrier_arrive(empty_bar + 8 * (step % kStages));
  };
  mbarrier_wait(q_bar, 0);

  // o[p][4 j + e]: row g (+ 8 for e >= 2) of the warp's 16, value column 64 p + 8 j + 2 t + e % 2.
  float o[kVPanels][32];
#pragma unroll
  for (int p = 0; p < kVPanels; ++p)
#pragma unroll
    for (int i = 0; i < 32; ++i) o[p][i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

  auto keys = [&](int step) { return advance_descriptor(desc_stages, (step % kStages) * kStageBytes); };
  auto values = [&](int step) { return advance_descriptor(desc_stages_mn, (step % kStages) * kStageBytes); };
  // FlashAttention-3's order inside the group: a step's Q·Kᵀ goes in flight together with the
  // step before's P·V, and the softmax of the step's scores runs while the latter computes.
  // (Measured with the copies by cp.async, this order lost; with the copies by TMA it took 147–150
  // µs against 153–155 for one 4k sequence.) The group then holds two stages at once, so the
  // copies run at most one stage ahead of it.
  float s[32];
  uint32_t a[kKeys / 16][4];  // the probabilities of the step before, as P·V's A fragments
  float rescale[2];
  if (group_steps > 0) {
    wait_full(0);
    wgmma_fence();
    issue_scores(s, desc_q, keys(0));
    wgmma_wait_all();
    wgmma_fence_registers(s);
    softmax_scores(s, row_max, row_sum, rescale, scale_log2, 0, group_pos, warp_pos, key_end, g, t);  // o is zero
    pack_probabilities(s, a);
    for (int step = 1; step < group_steps; ++step) {
      wait_full(step);
      wgmma_fence();
      issue_scores(s, desc_q, keys(step));
      issue_values(o, a, values(step - 1));
      wgmma_wait<1>();  // the scores (groups complete in order)
      wgmma_fence_registers(s);
      softmax_scores(s, row_max, row_sum, rescale, scale_log2, step * kKeys, group_pos, warp_pos, key_end, g, t);
      wgmma_wait<0>();  // the step before's values
      wgmma_fence_registers(o[0]);
      wgmma_fence_registers(o[1]);
      release(step - 1);
      rescale_output(o, rescale);
      pack_probabilities(s, a);
    }
    wgmma_fence();
    issue_values(o, a, values(group_steps - 1));
    wgmma_wait_all();
    wgmma_fence_registers(o[0]);
    wgmma_fence_registers(o[1]);
    release(group_steps - 1);
  }
  // The steps past this group's rows: the stages still pass through it, so that each empty
  // barrier counts every math warp once per phase.
  for (int step = group_steps; step < num_steps; ++step) {
    wait_full(step);
    release(step);
  }
  store_rows(o, row_sum, out, ld_out, q0, rows, h, v_dim, group_row0 + warp * 16, g, t);
}

}  // namespace

bool flash_attention_wgmma_supported(int qk_nope, int qk_rope, int v_padded) {
  return qk_nope == kNope && qk_rope == kRope && v_padded == kV;
}

void launch_flash_attention_wgmma(const uint16_t* queries, const uint16_t* kv, const uint16_t* rope, int64_t ld_rope,
                                  int num_heads, int v_dim, int num_queries, int first_pos, int num_keys,
                                  float scale_log2, float* out, int64_t ld_out, Stream stream) {
  DS_CHECK(reinterpret_cast<uintptr_t>(rope) % 16 == 0 && ld_rope % 8 == 0 && ld_rope >= kRope);
  const uint64_t q_width = static_cast<uint64_t>(num_heads) * kQk;
  const uint64_t kv_width = static_cast<uint64_t>(num_heads) * kKvHeadWidth;
  // Boxes of one swizzle row (64 columns) by 64 rows: a group's queries, a step's keys.
  const TensorMap2d queries_2d{queries, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, q_width, static_cast<uint64_t>(num_queries),
                               q_width * 2, kPanelCols, 64, true};
  const TensorMap2d kv_2d{kv, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, kv_width, static_cast<uint64_t>(num_keys),
                          kv_width * 2, kPanelCols, kKeys, true};
  const TensorMap2d rope_2d{rope, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, kRope, static_cast<uint64_t>(num_keys),
                            static_cast<uint64_t>(ld_rope) * 2, kPanelCols, kKeys, true};
  const CUtensorMap q_map = encode_tensor_map(queries_2d), kv_map = encode_tensor_map(kv_2d);
  const CUtensorMap rope_map = encode_tensor_map(rope_2d);
  allow_shared_bytes<flash_attention_wgmma_kernel>(kBytes);
  const int num_blocks = (num_queries + kQueries - 1) / kQueries * num_heads;
  launch_kernel(flash_attention_wgmma_kernel, dim3(num_blocks), kThreads, kBytes, stream, q_map, kv_map, rope_map,
                num_heads, v_dim, num_queries, first_pos, num_keys, scale_log2, out, ld_out);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace dsinfer::cuda

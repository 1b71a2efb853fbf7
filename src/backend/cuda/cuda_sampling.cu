// Token choice on the device, following choose_token (backend/token_choice.cpp): one segmented
// radix sort puts every row's logits in descending order (stable, so tied logits keep their
// ids ascending, as the reference's order has them), then one block per row walks its sorted
// row in double precision: the temperature's probabilities, the min_p and top_p cuts, and the
// token where the cumulative probability first passes the row's draw.
#include <algorithm>
#include <climits>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_launch.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kThreads = 1024;

__global__ void row_ids_kernel(int64_t total, int vocab, int32_t* ids, int32_t* offsets, int num_rows) {
  await_previous_kernels();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < total) ids[i] = static_cast<int32_t>(i % vocab);
  if (i <= num_rows) offsets[i] = static_cast<int32_t>(i * vocab);
}

__device__ double probability(const float* keys, int i, double max_logit, double inv_t, double inv_sum) {
  return exp((static_cast<double>(keys[i]) - max_logit) * inv_t) * inv_sum;
}

using Scan = cub::BlockScan<double, kThreads>;

// The probabilities of positions base + threadIdx.x of a sorted row (0 from `end` on) and their
// cumulative sum from the row's start: `carry` holds the sum before the tile and is advanced
// past it, the same in every thread.
__device__ void scan_tile(typename Scan::TempStorage& storage, const float* keys, int base, int end,
                          double max_logit, double inv_t, double inv_sum, double& carry, double& q, double& cum) {
  const int i = base + threadIdx.x;
  q = i < end ? probability(keys, i, max_logit, inv_t, inv_sum) : 0.0;
  double tile_total;
  __syncthreads();  // the scan's storage may still be read by the previous tile
  Scan(storage).InclusiveSum(q, cum, tile_total);
  cum += carry;
  carry += tile_total;
}

__global__ void __launch_bounds__(kThreads) choose_sorted_kernel(const float* sorted_logits, const int32_t* sorted_ids,
                                                                 int vocab, const RowSampling* params, int32_t* out) {
  await_previous_kernels();
  using Reduce = cub::BlockReduce<double, kThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ double s_value;
  __shared__ int s_cut;
  const int r = blockIdx.x, tid = threadIdx.x;
  const float* keys = sorted_logits + static_cast<int64_t>(r) * vocab;
  const int32_t* ids = sorted_ids + static_cast<int64_t>(r) * vocab;
  const RowSampling p = params[r];
  if (p.temperature <= 0.0f || p.top_k == 1) {  // greedy: the first of the sorted row
    if (tid == 0) out[r] = ids[0];
    return;
  }
  const int n = p.top_k > 0 && p.top_k < vocab ? p.top_k : vocab;
  const double inv_t = 1.0 / p.temperature, max_logit = keys[0];

  // The normaliser over the top-k candidates.
  double part = 0.0;
  for (int i = tid; i < n; i += kThreads) part += probability(keys, i, max_logit, inv_t, 1.0);
  const double sum = Reduce(tmp.reduce).Sum(part);
  if (tid == 0) s_value = sum;
  __syncthreads();
  const double inv_sum = 1.0 / s_value;

  // The kept prefix: it ends before the first candidate (after the best) under min_p × the best
  // probability, or after the first one whose cumulative probability reaches top_p.
  int kept = n;
  if (p.min_p > 0.0f || p.top_p < 1.0f) {
    const double floor = static_cast<double>(p.min_p) * inv_sum;  // min_p × the best's probability
    if (tid == 0) s_cut = n;
    __syncthreads();
    double carry = 0.0;
    for (int base = 0; base < n; base += kThreads) {
      const int i = base + tid;
      double q, cum;
      scan_tile(tmp.scan, keys, base, n, max_logit, inv_t, inv_sum, carry, q, cum);
      if (i < n) {
        if (p.min_p > 0.0f && i >= 1 && q < floor) atomicMin(&s_cut, i);
        if (p.top_p < 1.0f && cum >= p.top_p) atomicMin(&s_cut, i + 1);
      }
      __syncthreads();
      if (s_cut < n) break;
    }
    kept = s_cut;
  }

  // The kept mass, then the token where the cumulative probability first passes draw × mass.
  part = 0.0;
  for (int i = tid; i < kept; i += kThreads) part += probability(keys, i, max_logit, inv_t, inv_sum);
  __syncthreads();
  const double total = Reduce(tmp.reduce).Sum(part);
  if (tid == 0) {
    s_value = total;
    s_cut = kept - 1;
  }
  __syncthreads();
  const double target = p.uniform * s_value;
  double carry = 0.0;
  for (int base = 0; base < kept; base += kThreads) {
    const int i = base + tid;
    double q, acc;
    scan_tile(tmp.scan, keys, base, kept, max_logit, inv_t, inv_sum, carry, q, acc);
    if (i < kept && target < acc) atomicMin(&s_cut, i);
    __syncthreads();
    if (s_cut < kept - 1 || carry > target) break;
  }
  if (tid == 0) out[r] = ids[s_cut];
}

// Workspace: sorted logits, ids in, ids out (rows × vocab each), offsets (rows + 1), then CUB's
// temporary storage (the rest).
struct SampleLayout {
  size_t sorted_bytes, ids_bytes, offsets_bytes;
  size_t fixed() const { return sorted_bytes + 2 * ids_bytes + offsets_bytes; }
};

size_t round_up_256(size_t v) { return (v + 255) / 256 * 256; }

SampleLayout layout_for(int64_t rows, int64_t vocab) {
  const int64_t items = rows * vocab;
  return SampleLayout{round_up_256(items * sizeof(float)), round_up_256(items * sizeof(int32_t)),
                      round_up_256((rows + 1) * sizeof(int32_t))};
}

}  // namespace

size_t sample_rows_workspace_bytes(int64_t rows, int64_t vocab) {
  DS_CHECK_MSG(rows * vocab <= INT_MAX, "sampling " << rows << " rows of " << vocab << " logits at once");
  size_t cub_bytes = 0;
  DS_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
      nullptr, cub_bytes, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(rows * vocab),
      static_cast<int>(rows), static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(nullptr)));
  return layout_for(rows, vocab).fixed() + cub_bytes;
}

__global__ void penalise_logits_kernel(float* logits, int64_t rows, int64_t vocab, const LogitPenalty* penalties,
                                       int64_t num_penalties) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= num_penalties) return;
  const LogitPenalty p = penalties[i];
  if (p.row < 0 || p.row >= rows || p.token < 0 || p.token >= vocab) return;  // checked on the host
  float& logit = logits[p.row * vocab + p.token];
  logit = penalised_logit(logit, p.repetition, p.subtract);
}

void launch_penalise_logits(float* logits, int64_t rows, int64_t vocab, const LogitPenalty* penalties,
                            int64_t num_penalties, Stream stream) {
  if (num_penalties == 0) return;
  launch_kernel(penalise_logits_kernel, static_cast<unsigned>((num_penalties + 255) / 256), 256, 0, stream, logits,
                rows, vocab, penalties, num_penalties);
  DS_CUDA_CHECK_LAUNCH();
}

void launch_sample_rows(const float* logits, int64_t rows, int64_t vocab, const RowSampling* params, void* workspace,
                        size_t workspace_bytes, int32_t* out, Stream stream) {
  if (rows == 0) return;
  const SampleLayout l = layout_for(rows, vocab);
  DS_CHECK(workspace_bytes > l.fixed());
  size_t cub_bytes = workspace_bytes - l.fixed();
  auto* base = static_cast<unsigned char*>(workspace);
  auto* sorted = reinterpret_cast<float*>(base);
  auto* ids_in = reinterpret_cast<int32_t*>(base + l.sorted_bytes);
  auto* ids_out = reinterpret_cast<int32_t*>(base + l.sorted_bytes + l.ids_bytes);
  auto* offsets = reinterpret_cast<int32_t*>(base + l.sorted_bytes + 2 * l.ids_bytes);
  void* cub_storage = base + l.fixed();
  const int64_t items = rows * vocab;
  const int64_t fill = std::max(items, rows + 1);
  launch_kernel(row_ids_kernel, static_cast<unsigned>((fill + 255) / 256), 256, 0, stream, items,
                static_cast<int>(vocab), ids_in, offsets, static_cast<int>(rows));
  DS_CUDA_CHECK_LAUNCH();
  DS_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
      cub_storage, cub_bytes, logits, sorted, ids_in, ids_out, static_cast<int>(items), static_cast<int>(rows),
      offsets, offsets + 1, 0, static_cast<int>(sizeof(float) * 8), stream));
  launch_kernel(choose_sorted_kernel, static_cast<unsigned>(rows), kThreads, 0, stream, sorted, ids_out,
                static_cast<int>(vocab), params, out);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace dsinfer::cuda

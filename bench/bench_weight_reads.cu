// How fast one wave of few-row blocks reads a weight, by the order its lanes read it. At batch 1
// the routed experts' e4m3 gate/up product reads 34.6 MB: on tensor cores (few_row_mma.cuh) at
// about 1.9 TB/s, while the bf16 form on CUDA cores (few_row_gemm.cuh) reads its 69 MB at 3.2.
// The two differ in what one load instruction of a warp covers:
//  - rows: the CUDA-core form, 512 bytes of one row (a thread reads piece `thread` of each of a
//    quad's four rows, a step a quad);
//  - fragments: the tensor-core form, 64 bytes of each of eight rows (lane (g, t) reads 16 bytes
//    of tile rows g, g + 8, g + 16, g + 24 at column 64 c + 16 t, chunk c = warp + 4 step), as an
//    mma fragment must hold them;
//  - tiled fragments: the same lanes and steps over a weight stored a 32-row × 64-column chunk
//    after another, each chunk in the order its lanes read it, so that a load covers 512
//    contiguous bytes.
// Each form runs the few-row walk alone, without its arithmetic: a block of 128 threads takes a
// 32-row tile, kDepth steps of four 16-byte pieces in flight per thread, each step consumed (its
// words folded into a sum) before the one kDepth later is issued into its registers. A stream of
// the same bytes by every resident thread, and of a weight 16 times larger, are the ceilings.
// Last, the tensor-core form itself (launch_few_row_gemm) over the same bytes: as the routed
// gate/up product of one token (six experts' weights, a grouped layout read after the wait, or
// before it as the down product reads its own), and as one dense weight of as many rows. What it
// takes beyond the walk with its arithmetic is what the rest of the kernel costs.
// Three rows price 16-bit weights in the CUDA-core form's walk with its arithmetic: bf16 as the
// backend sums it, f16 widened exactly, and f16 summed in f16 pairs (docs/cuda.md, "Known gaps":
// the f16 operand route).
// Launches go one after another in a recorded graph over rotating copies of the weight (four,
// past L2), so each time includes a launch boundary. The walks load under the products' L2
// evict-first policy (since 2026-12-07; the figures before it in bench/RESULTS.md had none).
//
// Usage: bench_weight_reads [--rows N] [--cols N] [--replays N] [--append RESULTS.md]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/few_row_gemm.cuh"
#include "backend/cuda/few_row_mma.cuh"
#include "backend/cuda/grouped_gemm.h"
#include "backend/cuda/weight_load.cuh"
#include "cuda_bench.h"

namespace {

namespace few_row = dsinfer::cuda::few_row;
using dsinfer::cuda::load_weight_piece;
using dsinfer::cuda::weight_l2_policy;

constexpr int kThreads = 128;
constexpr int kTileRows = 32;
constexpr int kChunkBytes = 64;  // a fragment step's columns of one row
constexpr int kCopies = 4;       // rotating copies of the weight, together past L2
constexpr int kGraphLaunches = 40;
constexpr int kXPieces = 512;    // x's row in shared memory: 2,048 16-bit values

enum class Order { kRows, kFragments, kTiledFragments };

// Byte offset of piece 0 of step s for thread tid of block `tile`, in a weight of row_bytes
// bytes a row (a multiple of 2,048: one rows step covers a row in 128 pieces, and four warps'
// fragment chunks cover 256 bytes); piece r lies r · piece_stride further.
template <Order kOrder>
__device__ __forceinline__ int64_t step_offset(int64_t tile, int s, int tid, int64_t row_bytes) {
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int64_t tile_base = tile * kTileRows * row_bytes;
  if constexpr (kOrder == Order::kRows) {
    const int phases = static_cast<int>(row_bytes / (16 * kThreads)), quad = s / phases, phase = s % phases;
    return tile_base + 4 * quad * row_bytes + (phase * kThreads + tid) * 16;
  } else if constexpr (kOrder == Order::kFragments) {
    return tile_base + g * row_bytes + (warp + 4 * s) * kChunkBytes + 16 * t;
  } else {
    return tile_base + static_cast<int64_t>(warp + 4 * s) * kTileRows * kChunkBytes + g * kChunkBytes + 16 * t;
  }
}
template <Order kOrder>
__device__ __forceinline__ int64_t piece_stride(int64_t row_bytes) {
  if constexpr (kOrder == Order::kRows) return row_bytes;
  else if constexpr (kOrder == Order::kFragments) return 8 * row_bytes;
  else return 8 * kChunkBytes;
}

// What a step does with its pieces besides folding them: nothing, the tensor-core form's work
// (each e4m3 pair to an f16 pair, then eight f16 products m16n8k16 a step), or e4m3 products
// m16n8k32 straight from the pieces (four a step; eight, for x in two e4m3 parts). For the rows
// order (the CUDA-core form's quads: piece r of a step is row r's), 16-bit weights against one
// x piece: bf16 widened by integer operations and summed in fp32 as the backend's bf16 walk
// does; f16 widened exactly (widen_f16x8_unscaled, x carrying the 2^112) and summed in fp32; or
// f16 pairs summed in f16 chains of four, then in fp32, as the e4m3 walks sum theirs.
enum class Work {
  kFold,
  kConvert,
  kF16Products,
  kE4m3Products,
  kE4m3ProductsTwice,
  kBf16Sums,
  kF16Sums,
  kF16PairSums
};

// The eight f16 of a 16-byte piece as fp32 values 2^-112 times theirs, exactly (subnormals
// included, which stay fp32 subnormals): the exponent and mantissa moved to fp32's places, the
// sign to its own. Multiplying by 2^112, or taking x 2^112 times larger, restores the values.
__device__ __forceinline__ void widen_f16x8_unscaled(const uint4& v, float (&out)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(((words[i] << 13) & 0x0fffe000u) | ((words[i] << 16) & 0x80000000u));
    out[2 * i + 1] = __uint_as_float(((words[i] >> 3) & 0x0fffe000u) | (words[i] & 0x80000000u));
  }
}

// The quad's four pieces against one x piece, into acc[r / 2][2 (r % 2) …], as kWork does them.
template <Work kWork>
__device__ __forceinline__ void row_sums_step(const uint4 (&rows)[4], const uint4& x_piece, float (&acc)[2][4]) {
  const uint32_t xw[4] = {x_piece.x, x_piece.y, x_piece.z, x_piece.w};
  if constexpr (kWork == Work::kF16PairSums) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const uint32_t w[4] = {rows[r].x, rows[r].y, rows[r].z, rows[r].w};
      __half2 sum = __hmul2(*reinterpret_cast<const __half2*>(&w[0]), *reinterpret_cast<const __half2*>(&xw[0]));
#pragma unroll
      for (int j = 1; j < 4; ++j)
        sum = __hfma2(*reinterpret_cast<const __half2*>(&w[j]), *reinterpret_cast<const __half2*>(&xw[j]), sum);
      const float2 f = __half22float2(sum);
      acc[r / 2][2 * (r % 2)] += f.x + f.y;
    }
  } else {
    // x widened once for the quad's four rows, as bf16 in both forms (f16 x would take the
    // same widening as its weights, once a step instead of four times).
    float x[8];
    dsinfer::cuda::few_row::widen_bf16x8(x_piece, x);
    if constexpr (kWork == Work::kF16Sums) {
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] *= 0x1p112f;
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      float w[8];
      if constexpr (kWork == Work::kBf16Sums) dsinfer::cuda::few_row::widen_bf16x8(rows[r], w);
      else widen_f16x8_unscaled(rows[r], w);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float& a = acc[r / 2][2 * (r % 2) + (i & 1)];
        a = fmaf(w[i], x[i], a);
      }
    }
  }
}

// The e4m3 product m16n8k32 (no kernel of the backend uses it: on this GPU it is slower than the
// conversion to f16 and tensor_core.cuh's f16 product, which the other rows run as the kernel does).
__device__ __forceinline__ void mma_e4m3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The step's pieces (tile rows g, g + 8, g + 16, g + 24) into acc as `kWork` does them, with x's
// fragment words from shared memory as the tensor-core form reads them (two 16-byte pieces).
template <Work kWork>
__device__ __forceinline__ void work_step(const uint4 (&rows)[4], const uint4* x_piece, float (&acc)[2][4],
                                          uint32_t& folded) {
  if constexpr (kWork == Work::kFold) {
#pragma unroll
    for (int r = 0; r < 4; ++r) folded += rows[r].x ^ rows[r].y ^ rows[r].z ^ rows[r].w;
  } else if constexpr (kWork == Work::kBf16Sums || kWork == Work::kF16Sums || kWork == Work::kF16PairSums) {
    row_sums_step<kWork>(rows, x_piece[0], acc);
  } else {
    const uint4 xa = x_piece[0], xb = x_piece[1];
    const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
    for (int gi = 0; gi < 2; ++gi) {
      const uint4& lo = rows[2 * gi];
      const uint4& hi = rows[2 * gi + 1];
      const uint32_t lo_words[4] = {lo.x, lo.y, lo.z, lo.w}, hi_words[4] = {hi.x, hi.y, hi.z, hi.w};
      float sums[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if constexpr (kWork == Work::kConvert || kWork == Work::kF16Products) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t frag[4];
          few_row::e4m3x4_to_f16x2x2(lo_words[j], frag[0], frag[2]);
          few_row::e4m3x4_to_f16x2x2(hi_words[j], frag[1], frag[3]);
          if constexpr (kWork == Work::kConvert) folded += frag[0] ^ frag[1] ^ frag[2] ^ frag[3];
          else dsinfer::cuda::mma_f16_16x8x16(sums, frag, xw[2 * j], xw[2 * j + 1]);
        }
      } else {
        // Two k32 products: words 0, 1 of rows g and g + 8, then words 2, 3.
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const uint32_t frag[4] = {lo_words[2 * j], hi_words[2 * j], lo_words[2 * j + 1], hi_words[2 * j + 1]};
          mma_e4m3(sums, frag, xw[2 * j], xw[2 * j + 1]);
          if constexpr (kWork == Work::kE4m3ProductsTwice) mma_e4m3(sums, frag, xw[2 * j + 4], xw[2 * j + 5]);
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[gi][i] = fmaf(sums[i], 0.5f, acc[gi][i]);
    }
  }
}

// One tile a block: steps_per_thread steps of four pieces, kDepth in flight.
template <Order kOrder, int kDepth, Work kWork = Work::kFold>
__global__ void __launch_bounds__(kThreads, 4)
    walk_kernel(const uint8_t* weight, int64_t row_bytes, int steps_per_thread, uint32_t* sink) {
  const int tid = threadIdx.x;
  const int64_t tile = blockIdx.x;
  uint4 steps[kDepth][4];
  const int64_t stride = piece_stride<kOrder>(row_bytes);
  const uint64_t policy = weight_l2_policy(/*evict_first=*/true);  // as the products read
  auto issue = [&](int s, uint4 (&dst)[4]) {
    const uint8_t* first = weight + step_offset<kOrder>(tile, s, tid, row_bytes);
#pragma unroll
    for (int r = 0; r < 4; ++r)
      dst[r] = s < steps_per_thread ? load_weight_piece(first + r * stride, policy) : make_uint4(0, 0, 0, 0);
  };
#pragma unroll
  for (int d = 0; d < kDepth; ++d) issue(d, steps[d]);
  // x's row as the tensor-core form keeps it: 16-bit values, 2 bytes a column of a 2,048-column
  // chunk walk (values the compiler cannot know).
  __shared__ uint4 x_pieces[kXPieces];
  for (int i = tid; i < kXPieces; i += kThreads) x_pieces[i] = make_uint4(i, i * 3u, i * 5u, i * 7u);
  __syncthreads();
  const int warp = tid / 32, t = tid % 4;
  uint32_t folded = 0;
  float acc[2][4] = {};
  for (int s0 = 0; s0 < steps_per_thread; s0 += kDepth) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      // The rows order's step takes x's piece `tid` of its phase; the fragments' two pieces
      // at the chunk's column.
      const int x_index = kOrder == Order::kRows ? ((s0 + d) * kThreads + tid) % kXPieces
                                                 : ((warp + 4 * (s0 + d)) * kChunkBytes + 16 * t) / 8 % (kXPieces - 1);
      work_step<kWork>(steps[d], x_pieces + x_index, acc, folded);
      issue(s0 + d + kDepth, steps[d]);
    }
  }
#pragma unroll
  for (int gi = 0; gi < 2; ++gi)
#pragma unroll
    for (int i = 0; i < 4; ++i) folded += __float_as_uint(acc[gi][i]);
  // A store the compiler cannot drop, which the weight's contents (zeros) never make.
  if (folded == 0x9e3779b9u) sink[tid] = folded;
}

// Every resident thread reads 16-byte pieces, four in flight, over the whole weight.
__global__ void __launch_bounds__(256) stream_kernel(const uint8_t* weight, int64_t num_pieces, uint32_t* sink) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const uint64_t policy = weight_l2_policy(/*evict_first=*/true);
  uint32_t folded = 0;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < num_pieces; p += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      v[i] = p + i * stride < num_pieces ? load_weight_piece(weight + 16 * (p + i * stride), policy)
                                         : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < 4; ++i) folded += v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  }
  if (folded == 0x9e3779b9u) sink[threadIdx.x] = folded;
}

// µs per launch of `launch(copy)`, kGraphLaunches launches over the rotating copies recorded as
// one graph, replayed num_replays times after two untimed replays.
double time_launches(const std::function<void(int, cudaStream_t)>& launch, int num_replays, cudaStream_t stream) {
  const auto record = [&](cudaStream_t s) {
    for (int i = 0; i < kGraphLaunches; ++i) launch(i % kCopies, s);
  };
  return 1e3 * dsinfer::bench::graph_replay_ms(record, 2, num_replays, stream) / kGraphLaunches;
}

// The tensor-core form's launches over the rotating copies: a grouped call of one row a group
// (gate/up of experts of expert_rows rows each, SiLU·up into bf16) or a dense call of one row.
class FewRowCalls {
 public:
  FewRowCalls(uint8_t* const* copies, int num_copies, int64_t rows, int64_t row_bytes, int64_t expert_rows)
      : num_experts_(static_cast<int>(rows / expert_rows)),
        expert_rows_(expert_rows),
        rows_(rows),
        row_bytes_(row_bytes) {
    namespace cuda = dsinfer::cuda;
    const int64_t scale_cols = (row_bytes + 127) / 128;
    scales_ = device_zeros<float>(rows / 16 * scale_cols);
    x_ = device_zeros<uint16_t>(row_bytes);
    y_ = device_zeros<float>(rows);  // room for either output
    std::vector<int32_t> offsets(num_experts_ + 1), src_rows(num_experts_, 0);
    for (int g = 0; g <= num_experts_; ++g) offsets[g] = g;
    row_offsets_ = upload(offsets);
    src_rows_ = upload(src_rows);
    for (int c = 0; c < num_copies; ++c) {
      std::vector<cuda::GemmWeight> experts(num_experts_);
      for (int g = 0; g < num_experts_; ++g)
        experts[g] = {copies[c] + g * expert_rows * row_bytes, scales_ + g * expert_rows / 16 * scale_cols,
                      static_cast<int32_t>(expert_rows), static_cast<int32_t>(row_bytes)};
      groups_.push_back(upload(experts));
      dense_.push_back({copies[c], scales_, static_cast<int32_t>(rows), static_cast<int32_t>(row_bytes)});
    }
  }
  FewRowCalls(const FewRowCalls&) = delete;
  FewRowCalls& operator=(const FewRowCalls&) = delete;
  ~FewRowCalls() {
    for (void* p : owned_) cudaFree(p);
  }

  void grouped(int copy, bool layout_before_wait, cudaStream_t stream) const {
    dsinfer::cuda::GroupedGemmArgs a = common();
    a.src_rows = src_rows_;
    a.groups = groups_[copy];
    a.row_offsets = row_offsets_;
    a.block_offsets = row_offsets_;  // one row, so one row-block, a group
    a.num_groups = num_experts_;
    a.layout_before_wait = layout_before_wait;
    a.epilogue = dsinfer::cuda::GemmEpilogue::kSiluMulBf16;
    a.ldy = expert_rows_ / 2;
    a.n_out = static_cast<int>(expert_rows_ / 2);
    dsinfer::cuda::launch_few_row_gemm(a, static_cast<int>(expert_rows_), num_experts_, 1, stream);
  }
  void dense(int copy, cudaStream_t stream) const {
    dsinfer::cuda::GroupedGemmArgs a = common();
    a.dense = dense_[copy];
    a.dense_rows = 1;
    a.ldy = rows_;
    a.n_out = static_cast<int>(rows_);
    dsinfer::cuda::launch_few_row_gemm(a, static_cast<int>(rows_), 1, 1, stream);
  }

 private:
  template <typename T>
  T* device_zeros(int64_t n) {
    void* p = nullptr;
    DS_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
    DS_CUDA_CHECK(cudaMemset(p, 0, n * sizeof(T)));
    owned_.push_back(p);
    return static_cast<T*>(p);
  }
  template <typename T>
  T* upload(const std::vector<T>& v) {
    T* p = device_zeros<T>(static_cast<int64_t>(v.size()));
    DS_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
  }
  dsinfer::cuda::GroupedGemmArgs common() const {
    dsinfer::cuda::GroupedGemmArgs a;
    a.x = x_;
    a.ldx = row_bytes_;
    a.weights_fp8 = true;
    a.few_row_mma = true;
    a.y = y_;
    return a;
  }

  int num_experts_;
  int64_t expert_rows_, rows_, row_bytes_;
  float* scales_ = nullptr;
  float* y_ = nullptr;
  uint16_t* x_ = nullptr;
  int32_t *row_offsets_ = nullptr, *src_rows_ = nullptr;
  std::vector<const dsinfer::cuda::GemmWeight*> groups_;
  std::vector<dsinfer::cuda::GemmWeight> dense_;
  std::vector<void*> owned_;
};

struct Row {
  std::string name;
  int64_t bytes = 0;
  double us = 0;
  double tb_per_s() const { return static_cast<double>(bytes) / (us * 1e6); }
};

}  // namespace

int main(int argc, char** argv) {
  // The routed experts' gate/up weight at batch 1 of V2-Lite: six experts of 2 × 1,408 rows.
  int64_t rows = 6 * 2816, row_bytes = 2048;
  int num_replays = 50;
  std::string append_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&](int64_t& v) {
      if (i + 1 < argc) v = std::max<int64_t>(1, std::atoll(argv[++i]));
    };
    int64_t replays = num_replays;
    if (a == "--rows") next(rows);
    else if (a == "--cols") next(row_bytes);
    else if (a == "--replays") next(replays), num_replays = static_cast<int>(replays);
    else if (a == "--append" && i + 1 < argc) append_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--rows N] [--cols N] [--replays N] [--append FILE]\n", argv[0]);
      return 2;
    }
  }
  if (rows % kTileRows != 0 || row_bytes % 2048 != 0) {
    std::fprintf(stderr, "bench_weight_reads: --rows must be a multiple of 32 and --cols of 2048\n");
    return 2;
  }
  cudaDeviceProp prop;
  if (!dsinfer::bench::first_device("bench_weight_reads", prop)) return 1;
  const int sms = prop.multiProcessorCount;
  const int64_t bytes = rows * row_bytes, large_bytes = 16 * bytes;
  uint8_t* copies[kCopies];
  for (auto& c : copies) {
    DS_CUDA_CHECK(cudaMalloc(&c, bytes));
    DS_CUDA_CHECK(cudaMemset(c, 0, bytes));
  }
  uint8_t* large = nullptr;
  DS_CUDA_CHECK(cudaMalloc(&large, large_bytes));
  DS_CUDA_CHECK(cudaMemset(large, 0, large_bytes));
  uint32_t* sink = nullptr;
  DS_CUDA_CHECK(cudaMalloc(&sink, 256 * sizeof(uint32_t)));
  cudaStream_t stream;
  DS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  const int tiles = static_cast<int>(rows / kTileRows);
  const int row_steps = static_cast<int>(kTileRows / 4 * (row_bytes / 2048));  // a quad's phases × 8 quads
  const int fragment_steps = static_cast<int>(row_bytes / (4 * kChunkBytes));
  auto walk = [&](auto kernel, int steps) {
    return [=](int copy, cudaStream_t s) {
      kernel<<<tiles, kThreads, 0, s>>>(copies[copy], row_bytes, steps, sink);
      DS_CUDA_CHECK(cudaGetLastError());
    };
  };
  int stream_per_sm = 0;
  DS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&stream_per_sm, stream_kernel, 256, 0));
  const int stream_blocks = sms * stream_per_sm;
  std::vector<Row> table;
  auto add = [&](const std::string& name, int64_t n, const std::function<void(int, cudaStream_t)>& launch) {
    table.push_back({name, n, time_launches(launch, num_replays, stream)});
  };
  add("stream, every resident thread, 4 pieces in flight (ceiling, 16 × the weight)", large_bytes,
      [&](int, cudaStream_t s) {
        stream_kernel<<<stream_blocks, 256, 0, s>>>(large, large_bytes / 16, sink);
        DS_CUDA_CHECK(cudaGetLastError());
      });
  add("stream, every resident thread, 4 pieces in flight", bytes, [&](int copy, cudaStream_t s) {
    stream_kernel<<<stream_blocks, 256, 0, s>>>(copies[copy], bytes / 16, sink);
    DS_CUDA_CHECK(cudaGetLastError());
  });
  add("rows (CUDA-core form), 4 steps in flight", bytes, walk(walk_kernel<Order::kRows, 4>, row_steps));
  add("fragments (tensor-core form), 4 steps in flight", bytes,
      walk(walk_kernel<Order::kFragments, 4>, fragment_steps));
  add("tiled fragments, 4 steps in flight", bytes, walk(walk_kernel<Order::kTiledFragments, 4>, fragment_steps));
  add("rows, bf16 weights widened and summed in fp32 (the CUDA-core bf16 walk's work)", bytes,
      walk(walk_kernel<Order::kRows, 4, Work::kBf16Sums>, row_steps));
  add("rows, f16 weights widened exactly and summed in fp32", bytes,
      walk(walk_kernel<Order::kRows, 4, Work::kF16Sums>, row_steps));
  add("rows, f16 weights summed in f16 pairs (chains of four), then in fp32", bytes,
      walk(walk_kernel<Order::kRows, 4, Work::kF16PairSums>, row_steps));
  add("rows, 2 steps in flight", bytes, walk(walk_kernel<Order::kRows, 2>, row_steps));
  add("fragments, 2 steps in flight", bytes, walk(walk_kernel<Order::kFragments, 2>, fragment_steps));
  add("tiled fragments, 2 steps in flight", bytes, walk(walk_kernel<Order::kTiledFragments, 2>, fragment_steps));
  add("fragments, each e4m3 pair to f16", bytes,
      walk(walk_kernel<Order::kFragments, 4, Work::kConvert>, fragment_steps));
  add("fragments, to f16 and 8 f16 products m16n8k16 a step (the tensor-core form)", bytes,
      walk(walk_kernel<Order::kFragments, 4, Work::kF16Products>, fragment_steps));
  add("fragments, 4 e4m3 products m16n8k32 a step", bytes,
      walk(walk_kernel<Order::kFragments, 4, Work::kE4m3Products>, fragment_steps));
  add("fragments, 8 e4m3 products m16n8k32 a step", bytes,
      walk(walk_kernel<Order::kFragments, 4, Work::kE4m3ProductsTwice>, fragment_steps));
  add("tiled fragments, to f16 and 8 f16 products a step", bytes,
      walk(walk_kernel<Order::kTiledFragments, 4, Work::kF16Products>, fragment_steps));
  add("tiled fragments, 8 e4m3 products a step", bytes,
      walk(walk_kernel<Order::kTiledFragments, 4, Work::kE4m3ProductsTwice>, fragment_steps));
  // The tensor-core form itself, where the weight divides into gate/up weights of 2,816 rows.
  constexpr int64_t kExpertRows = 2 * 1408;
  if (rows % kExpertRows == 0) {
    const FewRowCalls calls(copies, kCopies, rows, row_bytes, kExpertRows);
    // Once outside a capture: the launches size their grids and set their kernels' attributes.
    calls.grouped(0, false, stream);
    calls.dense(0, stream);
    DS_CUDA_CHECK(cudaStreamSynchronize(stream));
    add("the tensor-core form, routed gate/up of one token (layout after the wait)", bytes,
        [&](int copy, cudaStream_t s) { calls.grouped(copy, false, s); });
    add("the tensor-core form, routed gate/up of one token (layout before the wait)", bytes,
        [&](int copy, cudaStream_t s) { calls.grouped(copy, true, s); });
    add("the tensor-core form, one dense weight of one row", bytes,
        [&](int copy, cudaStream_t s) { calls.dense(copy, s); });
  }

  std::ostringstream text;
  text << "\n## One wave of few-row blocks reading a weight, by the order of their loads ("
       << dsinfer::bench::utc_date() << ")\n\nMachine: " << prop.name << " (" << sms
       << " SMs). Command: `build-gpu/bench_weight_reads";
  for (int i = 1; i < argc; ++i) text << " " << argv[i];
  text << "`\n\nA weight of " << rows << " rows × " << row_bytes << " bytes (" << bytes / 1e6 << " MB), " << tiles
       << " blocks of " << kThreads << " threads (a 32-row tile each); " << kGraphLaunches
       << " launches a recorded graph over " << kCopies << " copies, replayed " << num_replays
       << " times. Each time includes a launch boundary.\n\n"
       << "| reads | MB | µs a launch | TB/s | of the ceiling |\n|---|---:|---:|---:|---:|\n";
  char line[320];
  for (const Row& r : table) {
    std::snprintf(line, sizeof(line), "| %s | %.1f | %.2f | %.2f | %.0f%% |\n", r.name.c_str(), r.bytes / 1e6, r.us,
                  r.tb_per_s(), 100.0 * r.tb_per_s() / table[0].tb_per_s());
    text << line;
  }
  std::fputs(text.str().c_str(), stdout);
  if (!append_path.empty()) dsinfer::bench::append_results(append_path, text.str());
  DS_CUDA_CHECK(cudaStreamDestroy(stream));
  for (auto& c : copies) DS_CUDA_CHECK(cudaFree(c));
  DS_CUDA_CHECK(cudaFree(large));
  DS_CUDA_CHECK(cudaFree(sink));
  return 0;
}

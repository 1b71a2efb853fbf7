// Every element-wise op and `linear` (bf16 and FP8 weights) of the CUDA backend against the
// CPU backend on random inputs at several shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string>
#include <utility>

#include "backend/cuda/few_row_phases.h"
#include "backend/cuda/grouped_gemm.h"
#include "backend/cuda/step_divisor.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace dsinfer {
namespace {

using testing_cuda::bf16_values;
using testing_cuda::CudaVsCpuTest;
using testing_cuda::download;
using testing_cuda::make_backend_with_env;
using testing_cuda::random_values;
using testing_cuda::relative_error;
using testing_cuda::upload;

class CudaOpsTest : public CudaVsCpuTest {
 protected:
  void expect_batch_invariant_rows(const HostTensor& weight, const std::vector<float>& x);
};

// An e4m3 weight [n, k] with one scale per 16 rows x 128 columns, all different in a test's
// shapes (scale i is 1e-3 · (1 + (scale_step · i) % scale_period)).
struct Fp8BlockScaledWeight {
  static constexpr int kBlockRows = 16;
  Fp8BlockScaledWeight(int64_t rows, int64_t cols, uint32_t seed, int scale_step, int scale_period)
      : n(rows), k(cols), scales((rows / kBlockRows) * ((cols + 127) / 128)), bytes(rows * cols) {
    for (size_t i = 0; i < scales.size(); ++i)
      scales[i] = 1e-3f * (1.0f + static_cast<float>((scale_step * i) % scale_period));
    const auto real = random_values(n * k, seed, 100.0f);
    for (int64_t i = 0; i < n * k; ++i) bytes[i] = f32_to_fp8e4m3(real[i]);
  }
  HostTensor host() const { return {DType::kF8E4M3, {n, k}, bytes.data(), scales.data(), kBlockRows, 128}; }

  int64_t n, k;
  std::vector<float> scales;
  std::vector<uint8_t> bytes;
};

// y [m, w's rows] = x · wᵀ on one backend, for x [m, w's columns] and a weight given on the host.
std::vector<float> linear_on(Backend& be, const HostTensor& w, const std::vector<float>& x, int64_t m) {
  const LinearWeight lw = be.make_linear(w);
  Tensor tx = upload(be, {m, w.shape[1]}, x), ty = be.empty({m, w.shape[0]}, DType::kF32);
  be.linear(tx, lw, ty);
  return download(be, ty);
}

// Random values that bf16 holds exactly, so that the GPU's rounding of activations is a no-op.
std::vector<float> bf16_exact_values(int64_t count, uint32_t seed) {
  auto x = random_values(count, seed);
  for (float& v : x) v = bf16_to_f32(f32_to_bf16(v));
  return x;
}

TEST_F(CudaOpsTest, RmsNormMatchesCpuIncludingInPlace) {
  // Widths for each register form of the norm (2, 4 and 8 float4 a thread in blocks of 256, one
  // in blocks of 512) and the loop form.
  for (auto [rows, n] :
       {std::pair<int64_t, int64_t>{1, 64}, {7, 1000}, {3, 1028}, {4, 2048}, {5, 3072}, {33, 7168}, {2, 9000}}) {
    const auto x = random_values(rows * n, 1, 2.0f, 0.5f);
    const auto w = random_values(n, 2, 0.1f, 1.0f);
    Backend* bes[2] = {cpu_.get(), gpu_.get()};
    std::vector<float> res[2], res_inplace[2];
    for (int b = 0; b < 2; ++b) {
      Tensor tx = upload(*bes[b], {rows, n}, x), tw = upload(*bes[b], {n}, w);
      Tensor out = bes[b]->empty({rows, n}, DType::kF32);
      bes[b]->rms_norm(tx, tw, 1e-6f, out);
      res[b] = download(*bes[b], out);
      bes[b]->rms_norm(tx, tw, 1e-6f, tx);
      res_inplace[b] = download(*bes[b], tx);
    }
    EXPECT_LT(relative_error(res[1], res[0]), 1e-5) << rows << "x" << n;
    EXPECT_LT(relative_error(res_inplace[1], res[0]), 1e-5) << rows << "x" << n;
  }
}

// The fused residual step equals add then rms_norm on this backend bit for bit, and the CPU's
// within fp32 rounding; x holds the sum afterwards.
TEST_F(CudaOpsTest, AddRmsNormIsAddThenRmsNorm) {
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{1, 2048}, {70, 2048}, {9, 1000}, {6, 4096}, {40, 7168}}) {
    const auto x = random_values(rows * n, 11, 2.0f, 0.5f), y = random_values(rows * n, 12, 1.5f);
    const auto w = random_values(n, 13, 0.1f, 1.0f);
    std::vector<float> fused_sum[2], fused_out[2];
    Backend* bes[2] = {cpu_.get(), gpu_.get()};
    for (int b = 0; b < 2; ++b) {
      Tensor tx = upload(*bes[b], {rows, n}, x), ty = upload(*bes[b], {rows, n}, y), tw = upload(*bes[b], {n}, w);
      Tensor out = bes[b]->empty({rows, n}, DType::kF32);
      bes[b]->add_rms_norm(tx, ty, tw, 1e-6f, out);
      fused_sum[b] = download(*bes[b], tx);
      fused_out[b] = download(*bes[b], out);
    }
    Tensor tx = upload(*gpu_, {rows, n}, x), ty = upload(*gpu_, {rows, n}, y), tw = upload(*gpu_, {n}, w);
    Tensor out = gpu_->empty({rows, n}, DType::kF32);
    gpu_->add(tx, ty);
    gpu_->rms_norm(tx, tw, 1e-6f, out);
    EXPECT_EQ(fused_sum[1], download(*gpu_, tx)) << rows << "x" << n;
    EXPECT_EQ(fused_out[1], download(*gpu_, out)) << rows << "x" << n;
    EXPECT_LT(relative_error(fused_sum[1], fused_sum[0]), 1e-6) << rows << "x" << n;
    EXPECT_LT(relative_error(fused_out[1], fused_out[0]), 1e-5) << rows << "x" << n;
  }
}

// A norm also writes its output in bf16, and the product that takes that output next reads the
// copy instead of converting it. The copy must give the conversion's bits, for widths it pads
// with zeros and rows the register kernel does not hold, and must never outlive its values:
// a write over the norm's output, by another op or by the product itself, makes the next
// product read the new values.
TEST_F(CudaOpsTest, ProductsAfterANormReadItsBf16CopyOnlyWhileItHolds) {
  Backend& be = *gpu_;
  const float eps = 1e-6f;
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{1, 2048}, {3, 200}, {5, 202}, {40, 9000}}) {
    const int64_t n_out = 96;
    const auto x = random_values(rows * n, 51, 2.0f, 0.5f), y = random_values(rows * n, 52);
    const auto w = random_values(n, 53, 0.1f, 1.0f);
    const auto wp = bf16_values(random_values(n_out * n, 54, 0.05f));
    const LinearWeight proj = be.make_linear(HostTensor{DType::kF32, {n_out, n}, wp.data()});
    Tensor tx = upload(be, {rows, n}, x), ty = upload(be, {rows, n}, y), tw = upload(be, {n}, w);
    Tensor normed = be.empty({rows, n}, DType::kF32);
    Tensor got = be.empty({rows, n_out}, DType::kF32), got2 = be.empty({rows, n_out}, DType::kF32);
    // The product of a tensor that no norm wrote: a conversion, the reference for each case.
    const auto converted = [&](const Tensor& t) {
      Tensor fresh = upload(be, {rows, n}, download(be, t)), r = be.empty({rows, n_out}, DType::kF32);
      be.linear(fresh, proj, r);
      return download(be, r);
    };
    const std::string shape = std::to_string(rows) + "x" + std::to_string(n);

    be.rms_norm(tx, tw, eps, normed);
    be.linear(normed, proj, got);
    EXPECT_EQ(download(be, got), converted(normed)) << shape << ": rms_norm, then linear";

    Tensor sum = upload(be, {rows, n}, x);
    be.add_rms_norm(sum, ty, tw, eps, normed);
    be.linear_pair(normed, proj, got, proj, got2);
    const auto want = converted(normed);
    EXPECT_EQ(download(be, got), want) << shape << ": add_rms_norm, then linear_pair";
    EXPECT_EQ(download(be, got2), want) << shape << ": add_rms_norm, then linear_pair";

    be.rms_norm(tx, tw, eps, normed);
    be.add(normed, ty);
    be.linear(normed, proj, got);
    EXPECT_EQ(download(be, got), converted(normed)) << shape << ": an add over the norm's output";

    if (n > 2048) continue;  // a square weight of the widest rows would take a gigabyte
    const auto wsq = bf16_values(random_values(n * n, 55, 0.05f));
    const LinearWeight square = be.make_linear(HostTensor{DType::kF32, {n, n}, wsq.data()});
    be.rms_norm(tx, tw, eps, normed);
    be.linear(normed, square, normed);  // the product writes over its own input
    be.linear(normed, proj, got);
    EXPECT_EQ(download(be, got), converted(normed)) << shape << ": a product over the norm's output";
  }
}

TEST_F(CudaOpsTest, AddSiluMulConcatGatherEmbeddingMatchCpu) {
  const int64_t rows = 19, a_cols = 48, b_cols = 80, inter = 333, vocab = 50;
  const auto a = random_values(rows * a_cols, 3), b = random_values(rows * b_cols, 4);
  const auto a2 = random_values(rows * a_cols, 5);
  const auto gu = random_values(rows * 2 * inter, 6, 3.0f);
  const auto table = random_values(vocab * a_cols, 7);
  const std::vector<int32_t> pick = {18, 0, 5, 5, 17, 2};
  const std::vector<TokenId> ids = {49, 0, 7, 7, 31, 12, 3};
  Backend* bes[2] = {cpu_.get(), gpu_.get()};
  std::vector<float> sum[2], act[2], cat[2], gathered[2], emb[2];
  for (int i = 0; i < 2; ++i) {
    Backend& be = *bes[i];
    Tensor ta = upload(be, {rows, a_cols}, a), tb = upload(be, {rows, b_cols}, b), ta2 = upload(be, {rows, a_cols}, a2);
    be.add(ta, ta2);
    sum[i] = download(be, ta);
    Tensor tgu = upload(be, {rows, 2 * inter}, gu), tact = be.empty({rows, inter}, DType::kF32);
    be.silu_mul(tgu, tact);
    act[i] = download(be, tact);
    Tensor tcat = be.empty({rows, a_cols + b_cols}, DType::kF32);
    be.concat_cols(ta, tb, tcat);
    cat[i] = download(be, tcat);
    Tensor tg = be.empty({static_cast<int64_t>(pick.size()), a_cols + b_cols}, DType::kF32);
    be.gather_rows(tcat, pick, tg);
    gathered[i] = download(be, tg);
    Tensor ttable = upload(be, {vocab, a_cols}, table), te = be.empty({static_cast<int64_t>(ids.size()), a_cols}, DType::kF32);
    be.embedding(ttable, ids, te);
    emb[i] = download(be, te);
  }
  EXPECT_LT(relative_error(sum[1], sum[0]), 1e-6);
  EXPECT_LT(relative_error(act[1], act[0]), 1e-5);
  EXPECT_EQ(cat[1], cat[0]);
  EXPECT_EQ(gathered[1], gathered[0]);
  EXPECT_EQ(emb[1], emb[0]);
}

TEST_F(CudaOpsTest, LinearBf16MatchesCpuAtSeveralShapes) {
  struct Shape { int64_t m, n, k; };
  for (Shape s : {Shape{1, 64, 64}, Shape{7, 200, 96}, Shape{33, 576, 2048}, Shape{130, 1000, 384}, Shape{5, 3, 24}}) {
    const auto w = bf16_values(random_values(s.n * s.k, 11, 1.0f / std::sqrt(static_cast<float>(s.k))));
    const auto x = random_values(s.m * s.k, 12);
    std::vector<float> y[2];
    Backend* bes[2] = {cpu_.get(), gpu_.get()};
    for (int i = 0; i < 2; ++i) y[i] = linear_on(*bes[i], HostTensor{DType::kF32, {s.n, s.k}, w.data()}, x, s.m);
    // bf16 operands (8 significant bits) with fp32 accumulation.
    EXPECT_LT(relative_error(y[1], y[0]), 2e-2) << s.m << "x" << s.n << "x" << s.k;
  }
}

TEST_F(CudaOpsTest, LinearRowCountsSharingAPlanMatchCpu) {
  // Above 128 rows cuBLASLt's plans are chosen per row count rounded up to 32, and one plan
  // serves every count it covers with its layouts reset to each call's rows. Counts that share
  // a plan (289-320), in an order that shrinks and grows it: a plan left at a smaller count would
  // leave the later rows unwritten, one left at a larger count would write past the output.
  const int64_t n = 640, k = 256;
  const auto w = bf16_values(random_values(n * k, 31, 1.0f / std::sqrt(static_cast<float>(k))));
  LinearWeight lw_cpu = cpu_->make_linear(HostTensor{DType::kF32, {n, k}, w.data()});
  LinearWeight lw_gpu = gpu_->make_linear(HostTensor{DType::kF32, {n, k}, w.data()});
  for (int64_t m : {300, 289, 320, 129, 289, 319}) {
    const auto x = random_values(m * k, 32 + static_cast<uint32_t>(m));
    Tensor cx = upload(*cpu_, {m, k}, x), cy = cpu_->empty({m, n}, DType::kF32);
    cpu_->linear(cx, lw_cpu, cy);
    // The output is the first m rows of a buffer of m + 8 rows filled with a sentinel.
    Tensor gx = upload(*gpu_, {m, k}, x), gy = upload(*gpu_, {m + 8, n}, std::vector<float>((m + 8) * n, 12345.0f));
    Tensor gy_rows = gy;
    gy_rows.shape = {m, n};
    gpu_->linear(gx, lw_gpu, gy_rows);
    const auto got = download(*gpu_, gy);
    const std::vector<float> rows(got.begin(), got.begin() + m * n), past(got.begin() + m * n, got.end());
    EXPECT_LT(relative_error(rows, download(*cpu_, cy)), 2e-2) << m << " rows";
    EXPECT_EQ(past, std::vector<float>(8 * n, 12345.0f)) << m << " rows: written past the output";
  }
}

TEST_F(CudaOpsTest, LinearFp8BlockScaledMatchesDequantisedCpu) {
  // e4m3 weights stay e4m3 on the device and are widened tile by tile inside the decode-sized
  // GEMM, up to 32 rows (products of more rows: cuda_fp8_gemm_test.cpp).
  struct Shape { int64_t m, n, k; };
  for (Shape s : {Shape{1, 256, 512}, Shape{5, 576, 2048}, Shape{29, 192, 160}, Shape{32, 1000, 384}}) {
    // An FP8 weight with 128x128 block scales that vary across blocks.
    const int64_t rb = (s.n + 127) / 128, cb = (s.k + 127) / 128;
    std::vector<float> scales(rb * cb);
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = 1e-3f * (1.0f + static_cast<float>(i % 5));
    const auto w_real = random_values(s.n * s.k, 21, 0.2f);
    std::vector<uint8_t> w_fp8(s.n * s.k);
    for (int64_t r = 0; r < s.n; ++r)
      for (int64_t c = 0; c < s.k; ++c)
        w_fp8[r * s.k + c] = f32_to_fp8e4m3(w_real[r * s.k + c] / (scales[(r / 128) * cb + c / 128] * 100.0f));
    const auto x = random_values(s.m * s.k, 22);
    HostTensor h{DType::kF8E4M3, {s.n, s.k}, w_fp8.data(), scales.data(), 128, 128};
    std::vector<float> y[2];
    Backend* bes[2] = {cpu_.get(), gpu_.get()};
    for (int i = 0; i < 2; ++i) y[i] = linear_on(*bes[i], h, x, s.m);
    // The activations are rounded to bf16 on the GPU.
    EXPECT_LT(relative_error(y[1], y[0]), 2e-2) << s.m << "x" << s.n << "x" << s.k;
  }
}

TEST_F(CudaOpsTest, LinearFp8ComputesWithTheCheckpointsWeightsExactly) {
  // With bf16-exact activations the only difference from the CPU's fp32 product of the
  // dequantised weight is the order of fp32 sums: the e4m3 weights and their block scales reach
  // the sums unrounded. Scales per 16 rows and 128 columns, all different, so that both row
  // groups of each 32-row tile and every k block carry their own; rows 1 / 9 / 32 take the
  // kernel's three tile heights. One row takes the few-row kernel, here its walk of phases read
  // at run time: the fixed walk sums in f16 pairs (FewRowHalfProductsKeepEveryRowsRangeAndCode).
  constexpr int64_t n = 96, k = 384;
  const Fp8BlockScaledWeight weight(n, k, 41, 7, 23);
  const HostTensor h = weight.host();
  auto run_time_walk = make_backend_with_env("cuda", "DSINFER_FEW_ROW_FIXED_PHASES", "0");
  for (int64_t m : {1, 9, 32}) {
    const auto x = bf16_exact_values(m * k, 42);
    std::vector<float> y[2];
    Backend* bes[2] = {cpu_.get(), run_time_walk.get()};
    for (int i = 0; i < 2; ++i) y[i] = linear_on(*bes[i], h, x, m);
    // Weights rounded to bf16 after their scale would be about 1e-3 off.
    EXPECT_LT(relative_error(y[1], y[0]), 2e-5) << m << " rows";
  }
}

TEST_F(CudaOpsTest, GatedMlpMatchesCpuIncludingPaddedShapes) {
  struct Shape { int64_t m, hidden, inter; };
  for (Shape s : {Shape{1, 64, 32}, Shape{9, 80, 24}, Shape{70, 256, 1408}, Shape{200, 96, 40}}) {
    const auto gu =
        bf16_values(random_values(2 * s.inter * s.hidden, 31, 1.0f / std::sqrt(static_cast<float>(s.hidden))));
    const auto down = bf16_values(random_values(s.hidden * s.inter, 32, 1.0f / std::sqrt(static_cast<float>(s.inter))));
    const auto x = random_values(s.m * s.hidden, 33);
    std::vector<float> y[2];
    Backend* bes[2] = {cpu_.get(), gpu_.get()};
    for (int i = 0; i < 2; ++i) {
      LinearWeight w_gu = bes[i]->make_gate_up(HostTensor{DType::kF32, {2 * s.inter, s.hidden}, gu.data()});
      LinearWeight w_down = bes[i]->make_linear(HostTensor{DType::kF32, {s.hidden, s.inter}, down.data()});
      Tensor tx = upload(*bes[i], {s.m, s.hidden}, x), ty = bes[i]->empty({s.m, s.hidden}, DType::kF32);
      bes[i]->gated_mlp(tx, w_gu, w_down, ty);
      y[i] = download(*bes[i], ty);
    }
    EXPECT_LT(relative_error(y[1], y[0]), 2e-2) << s.m << "x" << s.hidden << "x" << s.inter;
  }
}

// Attention's query and latent projections share one bf16 conversion of their input (and, in
// steps of one row, one launch where both weights have one type; here of two rows too,
// DSINFER_FEW_ROW_PAIRS=2): each product gives the bits that linear alone gives, on the own
// kernels (bf16 or e4m3 weights, or one of each) and through cuBLASLt.
TEST_F(CudaOpsTest, LinearPairGivesWhatTwoLinearsGive) {
  const int64_t k = 256, n1 = 96, n2 = 48;
  const auto w1 = bf16_values(random_values(n1 * k, 41, 0.1f)), w2 = bf16_values(random_values(n2 * k, 42, 0.1f));
  const Fp8BlockScaledWeight f1(n1, k, 44, 3, 7), f2(n2, k, 45, 5, 11);
  auto paired = make_backend_with_env("cuda", "DSINFER_FEW_ROW_PAIRS", "2");
  Backend& be = *paired;
  const LinearWeight b1 = be.make_linear(HostTensor{DType::kF32, {n1, k}, w1.data()});
  const LinearWeight b2 = be.make_linear(HostTensor{DType::kF32, {n2, k}, w2.data()});
  const LinearWeight e1 = be.make_linear(f1.host()), e2 = be.make_linear(f2.host());
  // linear_pair's two outputs for x [m, K] (n1 and n2 columns), each checked against linear alone.
  auto pair_outputs = [&](const LinearWeight& first, const LinearWeight& second, const std::vector<float>& x,
                          int64_t m, const std::string& what) {
    const int64_t x_cols = static_cast<int64_t>(x.size()) / m;
    Tensor tx = upload(be, {m, x_cols}, x);
    Tensor pair1 = be.empty({m, n1}, DType::kF32), alone1 = be.empty({m, n1}, DType::kF32);
    Tensor pair2 = be.empty({m, n2}, DType::kF32), alone2 = be.empty({m, n2}, DType::kF32);
    be.linear_pair(tx, first, pair1, second, pair2);
    be.linear(tx, first, alone1);
    be.linear(tx, second, alone2);
    std::pair<std::vector<float>, std::vector<float>> got{download(be, pair1), download(be, pair2)};
    EXPECT_EQ(got.first, download(be, alone1)) << what << ", " << m << " rows";
    EXPECT_EQ(got.second, download(be, alone2)) << what << ", " << m << " rows";
    return got;
  };
  struct Pair {
    const LinearWeight *first, *second;
    const char* name;
  };
  for (const Pair& p : {Pair{&b1, &b2, "bf16"}, Pair{&e1, &e2, "e4m3"}, Pair{&e1, &b2, "e4m3 and bf16"}}) {
    for (int64_t m : {1, 2, 9, 300}) {
      const auto x = random_values(m * k, 43 + static_cast<uint32_t>(m));
      const auto got = pair_outputs(*p.first, *p.second, x, m, p.name);
      EXPECT_GT(*std::max_element(got.first.begin(), got.first.end()), 0.0f);
    }
  }
  // e4m3 weights of V3's hidden size (7,168 columns: 448 pieces, three and a half phases walked
  // as four, their x pieces in shared memory), within a part in 10^3 of the CPU (f16 sums).
  const int64_t wide_k = 7168;
  const Fp8BlockScaledWeight g1(n1, wide_k, 46, 3, 7), g2(n2, wide_k, 47, 5, 11);
  const LinearWeight v1 = be.make_linear(g1.host()), v2 = be.make_linear(g2.host());
  for (int64_t m : {1, 2}) {
    const auto x = bf16_exact_values(m * wide_k, 49 + static_cast<uint32_t>(m));
    const auto [got1, got2] = pair_outputs(v1, v2, x, m, "e4m3, K 7168");
    EXPECT_LT(relative_error(got1, linear_on(*cpu_, g1.host(), x, m)), 1e-3) << m << " rows";
    EXPECT_LT(relative_error(got2, linear_on(*cpu_, g2.host(), x, m)), 1e-3) << m << " rows";
  }
}

// Products of one to four rows take the few-row kernel (sums of whole rows on CUDA cores):
// against the CPU and against the tensor-core kernel, with K over several of the kernel's
// phases, ragged K, gate/up pairs, and e4m3 weights with scales that vary per 16 rows. One-row
// products over bf16 weights read x's fp32 rows (GroupedGemmArgs::x_f32), and a gated MLP's
// SiLU·up stays fp32 between them: the CPU's fp32 sums to a few parts in 10^6, where bf16 rows
// would be a few parts in 10^3 off.
TEST_F(CudaOpsTest, FewRowProductsMatchCpuAndTheTensorCoreKernel) {
  setenv("DSINFER_CUDA_FEW_ROW_GEMM_MAX_ROWS", "0", 1);
  auto tensor_cores = make_backend("cuda");
  setenv("DSINFER_CUDA_FEW_ROW_GEMM_MAX_ROWS", "4", 1);  // every row count the kernel has
  auto few_rows = make_backend("cuda");
  unsetenv("DSINFER_CUDA_FEW_ROW_GEMM_MAX_ROWS");
  Backend* bes[3] = {cpu_.get(), few_rows.get(), tensor_cores.get()};
  struct Shape { int64_t n, k; };
  // Weights exact in bf16, so that the CPU's products are those of the GPU's operands.
  const auto bf16_weights = [](int64_t count, uint32_t seed, float stddev) {
    auto w = random_values(count, seed, stddev);
    for (float& v : w) v = bf16_to_f32(f32_to_bf16(v));
    return w;
  };
  for (Shape s : {Shape{96, 200}, Shape{40, 90}, Shape{576, 2048}, Shape{64, 9000}}) {
    const auto w = bf16_weights(s.n * s.k, 51, 1.0f / std::sqrt(static_cast<float>(s.k)));
    for (int64_t m : {1, 2, 3, 4}) {
      const auto x = random_values(m * s.k, 52 + static_cast<uint32_t>(m));
      std::vector<float> y[3];
      for (int i = 0; i < 3; ++i) y[i] = linear_on(*bes[i], HostTensor{DType::kF32, {s.n, s.k}, w.data()}, x, m);
      if (m == 1) {
        // fp32 rows (K 90 is no whole number of 8-column pieces: bf16 rows, the tensor-core
        // kernel's operands).
        const bool f32_rows = s.k % 8 == 0;
        EXPECT_LT(relative_error(y[1], y[0]), f32_rows ? 2e-5 : 2e-2) << s.n << "x" << s.k;
        if (f32_rows) EXPECT_GT(relative_error(y[2], y[0]), 1e-4) << s.n << "x" << s.k << ": bf16 rows";
        else EXPECT_LT(relative_error(y[1], y[2]), 1e-5) << s.n << "x" << s.k;
        continue;
      }
      EXPECT_LT(relative_error(y[1], y[0]), 2e-2) << m << "x" << s.n << "x" << s.k;
      // Both kernels see the same bf16 operands: they differ only in the order of fp32 sums.
      EXPECT_LT(relative_error(y[1], y[2]), 1e-5) << m << "x" << s.n << "x" << s.k;
    }
  }
  for (int64_t m : {1, 3}) {
    const int64_t hidden = 320, inter = 700;
    const auto gu = bf16_weights(2 * inter * hidden, 61, 1.0f / std::sqrt(static_cast<float>(hidden)));
    const auto down = bf16_weights(hidden * inter, 62, 1.0f / std::sqrt(static_cast<float>(inter)));
    const auto x = random_values(m * hidden, 63);
    std::vector<float> y[3];
    for (int i = 0; i < 3; ++i) {
      LinearWeight w_gu = bes[i]->make_gate_up(HostTensor{DType::kF32, {2 * inter, hidden}, gu.data()});
      LinearWeight w_down = bes[i]->make_linear(HostTensor{DType::kF32, {hidden, inter}, down.data()});
      Tensor tx = upload(*bes[i], {m, hidden}, x), ty = bes[i]->empty({m, hidden}, DType::kF32);
      bes[i]->gated_mlp(tx, w_gu, w_down, ty);
      y[i] = download(*bes[i], ty);
    }
    if (m == 1) {
      EXPECT_LT(relative_error(y[1], y[0]), 2e-5) << "one row, gated MLP: fp32 rows and SiLU·up";
      EXPECT_GT(relative_error(y[2], y[0]), 1e-4) << "one row, gated MLP: bf16 rows and SiLU·up";
      continue;
    }
    EXPECT_LT(relative_error(y[1], y[0]), 2e-2) << m << " rows, gated MLP";
    // SiLU·up is rounded to bf16 between the two products, so an order of sums may move it by
    // one bf16 step.
    EXPECT_LT(relative_error(y[1], y[2]), 1e-3) << m << " rows, gated MLP";
  }
  // e4m3: K of one phase (72 pieces of 16 columns) and of three (288 pieces, so threads take
  // pieces in several 128-column scale blocks); each piece's sums take the scale of its rows'
  // 16-row group and its 128 columns. Both forms of the few-row kernel: the CUDA-core one (dense
  // products' default) and the tensor-core one (DSINFER_FEW_ROW_MMA=all), the latter also at a K
  // of one and a half 64-column chunks (two of four warps without a chunk, two lanes' pieces
  // past K). The CUDA-core blocks of one or two rows over up to four phases sum each piece's
  // products in f16 (few_row_gemm.cuh, dot_e4m3x16_halves): a part in 10^3 of the CPU's sums
  // rather than fp32's 10^-5, and far from the 1% that a wrong pairing or scale would give.
  setenv("DSINFER_CUDA_FEW_ROW_GEMM_MAX_ROWS", "4", 1);
  auto few_rows_mma = make_backend_with_env("cuda", "DSINFER_FEW_ROW_MMA", "all");
  unsetenv("DSINFER_CUDA_FEW_ROW_GEMM_MAX_ROWS");
  struct Fp8Shape { int64_t n, k; uint32_t seed; };
  for (Fp8Shape s : {Fp8Shape{160, 1152, 71}, Fp8Shape{96, 4608, 73}, Fp8Shape{64, 96, 75}}) {
    const Fp8BlockScaledWeight weight(s.n, s.k, s.seed, 5, 19);
    const HostTensor h = weight.host();
    for (int64_t m : {1, 2, 3, 4}) {
      const auto x = bf16_exact_values(m * s.k, 72);
      std::vector<float> y[3];
      for (int i = 0; i < 3; ++i) y[i] = linear_on(*bes[i], h, x, m);
      const auto y_mma = linear_on(*few_rows_mma, h, x, m);
      const double cuda_core_bound = m <= 2 && s.k <= 4 * 128 * 16 ? 1e-3 : 2e-5;
      EXPECT_LT(relative_error(y[1], y[0]), cuda_core_bound) << m << "x" << s.n << "x" << s.k << ", e4m3";
      EXPECT_LT(relative_error(y[2], y[0]), 2e-5) << m << "x" << s.n << "x" << s.k << ", e4m3, tensor-core kernel";
      EXPECT_LT(relative_error(y_mma, y[0]), 2e-5) << m << "x" << s.n << "x" << s.k << ", e4m3 on tensor cores";
      // A row's outputs do not depend on the rows beside it.
      const auto first = linear_on(*few_rows_mma, h, {x.begin(), x.begin() + s.k}, 1);
      EXPECT_TRUE(std::equal(first.begin(), first.end(), y_mma.begin())) << m << " rows";
    }
  }
}

// Products of one or two rows whose K takes one, two or (bf16) up to four of the few-row kernel's
// phases (128 pieces of 8 bf16 or 16 e4m3 columns each) walk them with the count fixed at compile
// time, x's pieces held in registers: for bf16 weights the same bits as the walk of phases read
// at run time (DSINFER_FEW_ROW_FIXED_PHASES=0), at K of one phase, two, a second one partly past
// K, three (walked as four) and five (the run-time walk in both), and in linear_pair's launch of
// two products. e4m3 weights' fixed walks (up to four phases, three walked as four, as V3's 7,168
// columns) sum each piece in f16 pairs: within a part in 10^3 of the CPU, where the run-time
// walk's fp32 sums are within 2 in 10^5; at K of five phases both take the run-time walk and give
// the same bits.
TEST_F(CudaOpsTest, FewRowFixedPhasesMatchTheRunTimeWalk) {
  auto run_time = make_backend_with_env("cuda", "DSINFER_FEW_ROW_FIXED_PHASES", "0");
  Backend* bes[2] = {gpu_.get(), run_time.get()};
  const int64_t n = 96;
  for (int64_t k : {200, 1024, 1408, 2048, 2816, 4608}) {
    const auto w = bf16_values(random_values(n * k, 311, 1.0f / std::sqrt(static_cast<float>(k))));
    const HostTensor h{DType::kF32, {n, k}, w.data()};
    for (int64_t m : {1, 2}) {
      const auto x = random_values(m * k, 312);
      const auto fixed = linear_on(*bes[0], h, x, m);
      EXPECT_EQ(fixed, linear_on(*bes[1], h, x, m)) << "bf16, K " << k << ", " << m << " rows";
      EXPECT_LT(relative_error(fixed, linear_on(*cpu_, h, x, m)), 2e-2) << "bf16, K " << k << ", " << m << " rows";
    }
  }
  for (int64_t k : {1152, 2048, 2816, 4608, 7168, 10240}) {
    const Fp8BlockScaledWeight weight(n, k, 313, 5, 19);
    for (int64_t m : {1, 2}) {
      const auto x = bf16_exact_values(m * k, 314);
      const auto fixed = linear_on(*bes[0], weight.host(), x, m), run = linear_on(*bes[1], weight.host(), x, m);
      const auto want = linear_on(*cpu_, weight.host(), x, m);
      EXPECT_LT(relative_error(run, want), 2e-5) << "e4m3, K " << k << ", " << m << " rows";
      if (k > 4 * 128 * 16) {
        EXPECT_EQ(fixed, run) << "e4m3, K " << k << ", " << m << " rows";
      } else {
        EXPECT_LT(relative_error(fixed, want), 1e-3) << "e4m3, K " << k << ", " << m << " rows";
        EXPECT_NE(fixed, run) << "e4m3, K " << k << ", " << m << " rows: the fixed walk's f16 sums";
      }
    }
  }
  const int64_t k = 1408, n2 = 48;
  const auto w1 = bf16_values(random_values(n * k, 315, 0.03f)), w2 = bf16_values(random_values(n2 * k, 316, 0.03f));
  const auto x = random_values(k, 317);
  std::vector<float> pair[2];
  for (int i = 0; i < 2; ++i) {
    Backend& be = *bes[i];
    const LinearWeight b1 = be.make_linear(HostTensor{DType::kF32, {n, k}, w1.data()});
    const LinearWeight b2 = be.make_linear(HostTensor{DType::kF32, {n2, k}, w2.data()});
    Tensor tx = upload(be, {1, k}, x), y1 = be.empty({1, n}, DType::kF32), y2 = be.empty({1, n2}, DType::kF32);
    be.linear_pair(tx, b1, y1, b2, y2);
    pair[i] = download(be, y1);
    const auto second = download(be, y2);
    pair[i].insert(pair[i].end(), second.begin(), second.end());
  }
  EXPECT_EQ(pair[0], pair[1]);
  EXPECT_GT(*std::max_element(pair[0].begin(), pair[0].end()), 0.0f);
}

// The tensor-core form of the few-row kernel carries x in f16, each row scaled by a power of two
// so that its largest magnitude lies in [2^14, 2^15): rows far beyond f16's range (1e9) or below
// its normal numbers (1e-12), beside an ordinary row, each give the CPU's sums to fp32 rounding;
// a row with a few values a million times its others keeps the small ones' contribution, and an
// all-zero row gives zeros.
TEST_F(CudaOpsTest, FewRowTensorCoreFormKeepsEveryRowsRange) {
  setenv("DSINFER_CUDA_FEW_ROW_GEMM_MAX_ROWS", "4", 1);
  auto few_rows = make_backend_with_env("cuda", "DSINFER_FEW_ROW_MMA", "all");
  unsetenv("DSINFER_CUDA_FEW_ROW_GEMM_MAX_ROWS");
  const int64_t n = 96, k = 1152;
  const Fp8BlockScaledWeight weight(n, k, 81, 5, 19);
  const HostTensor h = weight.host();
  for (float row_scale : {1e9f, 1e-12f}) {
    auto x = bf16_exact_values(2 * k, 82);
    for (int64_t c = 0; c < k; ++c) x[c] = bf16_to_f32(f32_to_bf16(x[c] * row_scale));
    const auto got = linear_on(*few_rows, h, x, 2), want = linear_on(*cpu_, h, x, 2);
    for (int64_t r = 0; r < 2; ++r) {
      const std::vector<float> got_row(got.begin() + r * n, got.begin() + (r + 1) * n);
      const std::vector<float> want_row(want.begin() + r * n, want.begin() + (r + 1) * n);
      EXPECT_LT(relative_error(got_row, want_row), 2e-5) << "row " << r << ", scale " << row_scale;
    }
  }
  // Row 0: three values of 2^20 among values of about 1, whose own products are some 1e-5 of
  // the result: compared with those three alone, the result must move by them.
  const float peak = 1048576.0f;  // 2^20, a bf16 value
  auto x = bf16_exact_values(2 * k, 83);
  for (int64_t c : {5, 500, 1000}) x[c] = peak;
  std::fill(x.begin() + k, x.end(), 0.0f);
  std::vector<float> peaks(k, 0.0f);
  for (int64_t c : {5, 500, 1000}) peaks[c] = peak;
  const auto got = linear_on(*few_rows, h, x, 2), want = linear_on(*cpu_, h, x, 2);
  const auto peaks_only = linear_on(*cpu_, h, peaks, 1);
  const std::vector<float> got_row(got.begin(), got.begin() + n), want_row(want.begin(), want.begin() + n);
  EXPECT_LT(relative_error(got_row, want_row), 2e-6);
  EXPECT_GT(relative_error(peaks_only, want_row), 1e-6) << "the small values must count";
  EXPECT_TRUE(std::all_of(got.begin() + n, got.end(), [](float v) { return v == 0.0f; })) << "an all-zero row";
}

// The tensor-core form takes every e4m3 code to f16 exactly: every finite code, in rows 0-15,
// and rows 16-31 of subnormal codes alone (m · 2^-9), whose sums would be zero if the
// conversion or the products flushed them.
TEST_F(CudaOpsTest, FewRowTensorCoreFormTakesEveryE4m3Code) {
  setenv("DSINFER_CUDA_FEW_ROW_GEMM_MAX_ROWS", "4", 1);
  auto few_rows = make_backend_with_env("cuda", "DSINFER_FEW_ROW_MMA", "all");
  unsetenv("DSINFER_CUDA_FEW_ROW_GEMM_MAX_ROWS");
  constexpr int64_t n = 32, k = 256, kHalfRows = 16;
  std::vector<uint8_t> codes(n * k);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      uint8_t code = static_cast<uint8_t>((r * 7 + c) % 256);
      if (r >= kHalfRows) code = static_cast<uint8_t>((c % 2 == 0 ? 0x00 : 0x80) | (c + r) % 8);
      if ((code & 0x7f) == 0x7f) code = 0;  // NaN, which no checkpoint holds
      codes[r * k + c] = code;
    }
  std::vector<float> scales = {0.5f, 3.0f, 0.25f, 1.5f};  // [2 row groups][2 column blocks]
  const HostTensor h{DType::kF8E4M3, {n, k}, codes.data(), scales.data(), kHalfRows, 128};
  for (int64_t m : {1, 3}) {
    const auto x = bf16_exact_values(m * k, 91 + static_cast<uint32_t>(m));
    const auto got = linear_on(*few_rows, h, x, m), want = linear_on(*cpu_, h, x, m);
    for (int64_t t = 0; t < m; ++t)
      for (int64_t half = 0; half < 2; ++half) {
        const auto first = got.begin() + t * n + half * kHalfRows;
        const std::vector<float> got_rows(first, first + kHalfRows);
        const auto want_first = want.begin() + t * n + half * kHalfRows;
        const std::vector<float> want_rows(want_first, want_first + kHalfRows);
        EXPECT_LT(relative_error(got_rows, want_rows), 1e-6) << m << " rows, token " << t << ", rows of "
                                                             << (half == 0 ? "every code" : "subnormals");
        float largest = 0.0f;
        for (float v : want_rows) largest = std::max(largest, std::abs(v));
        EXPECT_GT(largest, 0.0f) << "the reference's sums must not vanish";
      }
  }
}

// The CUDA-core form's blocks of one or two rows sum each 16-column piece of e4m3 weights in f16
// pairs, x scaled per piece by a power of two (few_row_gemm.cuh, scaled_halves_of_bf16x16):
// - rows far beyond f16's range (1e9) and below its normal numbers (1e-12), and a row whose
//   values differ by 2^20 from piece to piece, each within a part in 10^3 of the CPU; an all-zero
//   row gives zeros;
// - every finite e4m3 code, the largest (448) in every column of some rows against x at the top
//   of its scaled range, where a piece's f16 sums are largest, and rows of subnormal codes alone,
//   whose sums would vanish if the conversion flushed them: within 2 parts in 10^3 (rows of every
//   code hold sums that cancel).
TEST_F(CudaOpsTest, FewRowHalfProductsKeepEveryRowsRangeAndCode) {
  setenv("DSINFER_CUDA_FEW_ROW_GEMM_MAX_ROWS", "4", 1);
  auto few_rows = make_backend_with_env("cuda", "DSINFER_FEW_ROW_MMA", "0");
  unsetenv("DSINFER_CUDA_FEW_ROW_GEMM_MAX_ROWS");
  auto rows_error = [](const std::vector<float>& got, const std::vector<float>& want, int64_t first, int64_t count) {
    return relative_error({got.begin() + first, got.begin() + first + count},
                          {want.begin() + first, want.begin() + first + count});
  };
  for (int64_t k : {1152, 7168}) {  // one phase (x in registers), four (x in shared memory)
    const int64_t n = 96;
    const Fp8BlockScaledWeight weight(n, k, 85, 5, 19);
    const HostTensor h = weight.host();
    for (float row_scale : {1e9f, 1e-12f, 0.0f}) {
      auto x = bf16_exact_values(2 * k, 86);
      for (int64_t c = 0; c < k; ++c) x[k + c] *= c / 16 % 2 == 0 ? 1.0f : 1048576.0f;  // 2^20: still exact
      for (int64_t c = 0; c < k; ++c) x[c] = bf16_to_f32(f32_to_bf16(x[c] * row_scale));
      const auto got = linear_on(*few_rows, h, x, 2), want = linear_on(*cpu_, h, x, 2);
      if (row_scale == 0.0f) {
        EXPECT_TRUE(std::all_of(got.begin(), got.begin() + n, [](float v) { return v == 0.0f; })) << "an all-zero row";
      } else {
        EXPECT_LT(rows_error(got, want, 0, n), 1e-3) << "K " << k << ", row scale " << row_scale;
      }
      EXPECT_LT(rows_error(got, want, n, n), 1e-3) << "K " << k << ", pieces 2^20 apart, beside " << row_scale;
    }
  }
  constexpr int64_t n = 48, k = 512, kGroupRows = 16;
  std::vector<uint8_t> codes(n * k);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      uint8_t code = static_cast<uint8_t>((r * 7 + c) % 256);
      if ((code & 0x7f) == 0x7f) code = 0;  // NaN, which no checkpoint holds
      if (r >= kGroupRows) code = static_cast<uint8_t>((c % 2 == 0 ? 0x00 : 0x80) | (c + r) % 8);
      if (r >= 2 * kGroupRows) code = r % 2 == 0 ? 0x7e : 0xfe;  // +448, -448
      codes[r * k + c] = code;
    }
  std::vector<float> scales = {0.5f, 3.0f, 0.25f, 1.5f, 2.0f, 0.75f, 1.0f, 4.0f, 0.125f, 1.0f, 2.0f, 1.0f};
  const HostTensor h{DType::kF8E4M3, {n, k}, codes.data(), scales.data(), kGroupRows, 128};
  for (int64_t m : {1, 2}) {
    auto x = bf16_exact_values(m * k, 93 + static_cast<uint32_t>(m));
    // The last token: every value just below a power of two, the top of the scaled range.
    for (int64_t c = 0; c < k; ++c) x[(m - 1) * k + c] = (c % 3 == 0 ? -1.0f : 1.0f) * 1.9921875f;
    const auto got = linear_on(*few_rows, h, x, m), want = linear_on(*cpu_, h, x, m);
    for (int64_t t = 0; t < m; ++t)
      for (int64_t group = 0; group < 3; ++group) {
        const char* rows = group == 0 ? "every code" : group == 1 ? "subnormals" : "448s";
        EXPECT_LT(rows_error(got, want, t * n + group * kGroupRows, kGroupRows), 2e-3)
            << m << " rows, token " << t << ", rows of " << rows;
        float largest = 0.0f;
        for (int64_t r = 0; r < kGroupRows; ++r)
          largest = std::max(largest, std::abs(want[t * n + group * kGroupRows + r]));
        EXPECT_GT(largest, 0.0f) << "the reference's sums must not vanish";
      }
  }
}

// Which K the few-row kernel's CUDA-core blocks walk with a fixed phase count (few_row_phases.h):
// bf16 rows of 1,024 columns a phase up to four phases (three walked as four) within the
// launch's bound, e4m3 rows of 2,048 columns a phase likewise within theirs (V3's 7,168: four;
// the routing-and-plan launch's bound of two: the run-time walk), five or more never. A host
// test: no GPU needed.
TEST(FewRowPhasesTest, FixedWalksTakeUpToFourPhasesWithinTheLaunchsBound) {
  using cuda::few_row::fixed_phases;
  struct Case { int64_t k; bool fp8; int max_phases, max_fp8_phases, want; };
  for (const Case& c : {Case{1024, false, 4, 4, 1}, Case{2048, false, 4, 4, 2}, Case{2816, false, 4, 4, 4},
                        Case{2816, false, 2, 4, 0}, Case{4096, false, 4, 4, 4}, Case{4608, false, 4, 4, 0},
                        Case{1408, true, 2, 4, 1}, Case{2816, true, 2, 4, 2}, Case{4608, true, 2, 4, 4},
                        Case{7168, true, 4, 4, 4}, Case{7168, true, 4, 2, 0}, Case{8192, true, 4, 4, 4},
                        Case{10240, true, 4, 4, 0}, Case{16384, true, 4, 4, 0}})
    EXPECT_EQ(fixed_phases(c.k, c.fp8, c.max_phases, c.max_fp8_phases), c.want)
        << "K " << c.k << (c.fp8 ? " e4m3" : " bf16") << ", bounds " << c.max_phases << " / " << c.max_fp8_phases;
}

// The few-row blocks' step quotients (step_divisor.h) over every step a block can have below
// kStepDivisorMaxK: divisors up to 255 (K / 1024 of bf16 rows) over 36 steps each, up to 1,023
// (K / 256 chunks of the tensor-core form) over 8 each. A host test: no GPU needed.
TEST(FewRowStepDivisorTest, QuotientsAreExactForEveryStepOfABlock) {
  struct Range { int max_divisor, steps_per_divisor; };
  for (Range range : {Range{255, 36}, Range{1023, 8}}) {
    for (int d = 1; d <= range.max_divisor; ++d) {
      const cuda::StepDivisor div(d);
      int wrong = -1;
      for (int s = 0; s < range.steps_per_divisor * d && wrong < 0; ++s)
        if (div.quotient(s) != s / d) wrong = s;
      ASSERT_EQ(wrong, -1) << "divisor " << d;
    }
  }
  // Beyond those ranges the quotient does go wrong, which is why with_block_form bounds K.
  const cuda::StepDivisor large(3000);
  bool any_wrong = false;
  for (int s = 0; s < 36 * 3000 && !any_wrong; ++s) any_wrong = large.quotient(s) != s / 3000;
  EXPECT_TRUE(any_wrong);
}

// linear_add_rms_norm in steps of one and two rows: o_proj's few-row product adds its outputs to
// the residual and writes the next norm's output without each row's 1 / rms, which the products
// reading that output apply (CudaBackend::PendingNorm). Against the CPU (bf16 weights) and the
// CUDA form that runs the norm in its own launch (DSINFER_NORM_IN_PRODUCTS=0): the residual (the
// same bits as that form's), products of the norm's output (linear, linear_pair, gated_mlp), and
// the output itself, read after a write to the residual, which must not change it. (By default
// only steps of one row leave the norm; DSINFER_NORM_IN_PRODUCTS=2 takes two as well.)
TEST_F(CudaOpsTest, NormLeftToTheProductsAfterItFollowsTheNormInItsOwnLaunch) {
  auto apart = make_backend_with_env("cuda", "DSINFER_NORM_IN_PRODUCTS", "0");
  gpu_ = make_backend_with_env("cuda", "DSINFER_NORM_IN_PRODUCTS", "2");
  constexpr int64_t kIn = 192, kHidden = 256, kQ = 160, kInter = 96;
  const float eps = 1e-6f;
  const auto o_w = bf16_values(random_values(kHidden * kIn, 91, 1.0f / std::sqrt(static_cast<float>(kIn))));
  const auto q_w = bf16_values(random_values(kQ * kHidden, 92, 1.0f / std::sqrt(static_cast<float>(kHidden))));
  const auto gu_w = bf16_values(random_values(2 * kInter * kHidden, 93, 1.0f / std::sqrt(static_cast<float>(kHidden))));
  const auto down_w = bf16_values(random_values(kHidden * kInter, 94, 1.0f / std::sqrt(static_cast<float>(kInter))));
  const auto norm_w = random_values(kHidden, 95, 0.5f, 1.0f);
  const Fp8BlockScaledWeight o_fp8(kHidden, kIn, 96, 7, 5), q_fp8(kQ, kHidden, 97, 3, 11);
  for (const bool fp8 : {false, true}) {
    for (const int64_t rows : {int64_t{1}, int64_t{2}}) {
      SCOPED_TRACE(testing::Message() << rows << " rows, fp8 " << fp8);
      const auto x = random_values(rows * kIn, 100 + static_cast<uint32_t>(rows));
      const auto residual = random_values(rows * kHidden, 110 + static_cast<uint32_t>(rows), 3.0f);
      const auto later = random_values(rows * kHidden, 120 + static_cast<uint32_t>(rows));
      // bf16: the CPU too; e4m3 weights: the two CUDA forms.
      std::vector<Backend*> bes = {apart.get(), gpu_.get()};
      if (!fp8) bes.push_back(cpu_.get());
      std::vector<std::vector<float>> res(bes.size()), q(bes.size()), q2(bes.size()), kv(bes.size()),
          mlp(bes.size()), normed(bes.size());
      for (size_t b = 0; b < bes.size(); ++b) {
        Backend& be = *bes[b];
        const LinearWeight o = be.make_linear(fp8 ? o_fp8.host() : HostTensor{DType::kF32, {kHidden, kIn}, o_w.data()});
        const LinearWeight wq = be.make_linear(fp8 ? q_fp8.host() : HostTensor{DType::kF32, {kQ, kHidden}, q_w.data()});
        const LinearWeight gu = be.make_gate_up(HostTensor{DType::kF32, {2 * kInter, kHidden}, gu_w.data()});
        const LinearWeight down = be.make_linear(HostTensor{DType::kF32, {kHidden, kInter}, down_w.data()});
        Tensor tx = upload(be, {rows, kIn}, x), tres = upload(be, {rows, kHidden}, residual);
        Tensor tw = upload(be, {kHidden}, norm_w), tlater = upload(be, {rows, kHidden}, later);
        Tensor ty = be.empty({rows, kHidden}, DType::kF32), th = be.empty({rows, kHidden}, DType::kF32);
        Tensor tq = be.empty({rows, kQ}, DType::kF32), tq2 = be.empty({rows, kQ}, DType::kF32);
        Tensor tkv = be.empty({rows, kQ}, DType::kF32), tmlp = be.empty({rows, kHidden}, DType::kF32);
        be.linear_add_rms_norm(tx, o, ty, tres, tw, eps, th);
        be.linear(th, wq, tq);
        be.linear_pair(th, wq, tq2, wq, tkv);
        be.gated_mlp(th, gu, down, tmlp);
        res[b] = download(be, tres);
        q[b] = download(be, tq);
        q2[b] = download(be, tq2);
        kv[b] = download(be, tkv);
        mlp[b] = download(be, tmlp);
        be.add(tres, tlater);
        normed[b] = download(be, th);
      }
      EXPECT_EQ(res[1], res[0]);
      EXPECT_EQ(q2[1], q[1]);  // linear_pair's products are linear's
      EXPECT_EQ(kv[1], q[1]);
      EXPECT_LT(relative_error(q[1], q[0]), 1e-2);
      EXPECT_LT(relative_error(mlp[1], mlp[0]), 2e-2);
      EXPECT_LT(relative_error(normed[1], normed[0]), 1e-5);
      if (!fp8) {
        EXPECT_LT(relative_error(res[1], res[2]), 1e-2);
        EXPECT_LT(relative_error(q[1], q[2]), 2e-2);
        EXPECT_LT(relative_error(mlp[1], mlp[2]), 3e-2);
        EXPECT_LT(relative_error(normed[1], normed[2]), 1e-2);
      }
    }
  }
}

// The GEMM's summation order of a row does not depend on the other rows: a row computed alone
// is bit-identical to the same row computed among others of the same kernel (the few-row
// kernel's rows, and the tensor-core kernel's up to 32), and among any number once batch
// invariance is asked for.
TEST_F(CudaOpsTest, LinearRowsAreBatchInvariant) {
  const int64_t n = 576, k = 2048;
  const auto w = bf16_values(random_values(n * k, 41, 1.0f / std::sqrt(static_cast<float>(k))));
  const Fp8BlockScaledWeight w_fp8(n, k, 43, 3, 7);
  const auto x = random_values(300 * k, 42);
  for (const HostTensor& weight : {HostTensor{DType::kF32, {n, k}, w.data()}, w_fp8.host()}) {
    SCOPED_TRACE(weight.dtype == DType::kF8E4M3 ? "e4m3" : "bf16");
    expect_batch_invariant_rows(weight, x);
  }
}

// One row's output is the same alone as among others: within the few-row kernel's reach, above
// it on the tensor-core kernel up to its bound of 32 rows, and at any row count in
// batch-invariant mode. A one-row step reads its row in fp32 (over e4m3 weights as f16 pairs),
// not as the bf16 rows of more rows (few_row_f32_rows): the same with that off
// (DSINFER_FEW_ROW_F32_ROWS=0), within bf16's rounding with it on.
void CudaOpsTest::expect_batch_invariant_rows(const HostTensor& weight, const std::vector<float>& x) {
  const int64_t n = weight.shape[0], k = weight.shape[1];
  auto run = [&](Backend& be, int64_t rows) {
    return linear_on(be, weight, {x.begin(), x.begin() + rows * k}, rows);
  };
  auto bf16_rows = make_backend_with_env("cuda", "DSINFER_FEW_ROW_F32_ROWS", "0");
  const auto alone = run(*bf16_rows, 1), alone_default = run(*gpu_, 1);
  EXPECT_NE(alone_default, alone) << "fp32 rows in one-row steps";
  EXPECT_LT(relative_error(alone_default, alone), 1e-2);
  for (int64_t rows = 2; rows <= cuda::kFewRowGemmDefaultMaxRows; ++rows) {
    const auto few = run(*gpu_, rows);
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), few.begin())) << rows << " rows";
  }
  const auto first_of_more = run(*gpu_, cuda::kFewRowGemmDefaultMaxRows + 1);
  for (int64_t rows : {7, 20, 32}) {
    const auto many = run(*gpu_, rows);
    EXPECT_TRUE(std::equal(first_of_more.begin(), first_of_more.begin() + n, many.begin())) << rows << " rows";
  }
  auto invariant = make_backend_with_env("cuda", "DSINFER_BATCH_INVARIANT", "1");
  // Batch-invariant steps never take the few-row kernel: a row alone runs as among many.
  const auto inv_alone = run(*invariant, 1);
  EXPECT_TRUE(std::equal(inv_alone.begin(), inv_alone.end(), first_of_more.begin()));
  const auto inv_many = run(*invariant, 300);
  EXPECT_TRUE(std::equal(inv_alone.begin(), inv_alone.end(), inv_many.begin())) << "300 rows, batch-invariant mode";
}

TEST_F(CudaOpsTest, CacheBlocksRoundTrip) {
  const int64_t num_blocks = 5, block_size = 64, entry = 576;
  LayerKvCache cache{gpu_->empty({num_blocks, block_size, entry}, DType::kF32)};
  const auto a = random_values(block_size * entry, 31), b = random_values(block_size * entry, 32);
  gpu_->write_cache_block(cache, 3, a.data());
  gpu_->write_cache_block(cache, 1, b.data());
  std::vector<float> got(block_size * entry);
  gpu_->read_cache_block(cache, 3, got.data());
  EXPECT_EQ(got, a);
  gpu_->read_cache_block(cache, 1, got.data());
  EXPECT_EQ(got, b);
}

}  // namespace
}  // namespace dsinfer

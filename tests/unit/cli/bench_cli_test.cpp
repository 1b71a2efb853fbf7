// `dsinfer bench` as a user runs it on the CPU backend: the offline workload through the real
// engine, its counts and its results section; the prefill FLOP columns.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "run_binary.h"

namespace {

using dsinfer::testing::run_dsinfer;

std::string tiny_v3() { return std::string(DSINFER_SOURCE_DIR) + "/tests/data/tiny_v3"; }

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The report table's row for `batch`, without its newline; empty when there is none.
std::string table_row(const std::string& out, int batch) {
  const size_t at = out.find("\n| " + std::to_string(batch) + " | ");
  if (at == std::string::npos) return "";
  return out.substr(at + 1, out.find('\n', at + 1) - at - 1);
}

// A results file that already holds something, as bench/RESULTS.md does.
std::string fresh_results(const std::string& name) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << "# results\n\nearlier section\n";
  return path;
}

TEST(BenchCli, WorkloadReportsEveryRequestAndAppendsItsSection) {
  const std::string results = fresh_results("bench_workload_results.md");
  const auto r = run_dsinfer("bench --backend cpu --model " + tiny_v3() + " --workload 6x20x5 --results " + results);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("completed: 6 of 6 requests, 30 output tokens (5 each), 120 prompt tokens"),
            std::string::npos)
      << r.out;
  const std::string text = read_file(results);
  EXPECT_EQ(text.rfind("# results\n\nearlier section\n", 0), 0u) << "the file must be appended to, not rewritten";
  const size_t section = text.find("### dsinfer bench --workload 6x20x5");
  ASSERT_NE(section, std::string::npos) << text;
  const std::string tail = text.substr(section);
  EXPECT_NE(tail.find("- date: "), std::string::npos);
  EXPECT_NE(tail.find("- machine: "), std::string::npos);
  EXPECT_NE(tail.find("- command: `dsinfer bench --backend cpu"), std::string::npos);
  EXPECT_NE(tail.find("--workload 6x20x5"), std::string::npos);
  EXPECT_NE(tail.find("completed: 6 of 6 requests, 30 output tokens"), std::string::npos);
  EXPECT_NE(tail.find("| wall s | requests/s | output tok/s |"), std::string::npos);
}

// The 5x30x4 workload with extra engine flags completes every request with its counts.
void expect_5x30x4_completes(const std::string& flags) {
  const auto r = run_dsinfer("bench --backend cpu --model " + tiny_v3() + " --workload 5x30x4 " + flags);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("completed: 5 of 5 requests, 20 output tokens (4 each), 150 prompt tokens"),
            std::string::npos)
      << r.out;
}

TEST(BenchCli, WorkloadWithTooSmallScheduleStillCompletesEveryRequest) {
  // Two requests at a time, a 16-token step budget: chunked prefill and queueing, same counts.
  expect_5x30x4_completes("--max-num-seqs 2 --max-batched-tokens 16");
}

// Scheduling one step ahead: a call to the engine's step may only collect the step in flight,
// which the warm-up and the workload loop must not take for an idle engine.
TEST(BenchCli, WorkloadWithAsynchronousSchedulingCompletesEveryRequest) {
  expect_5x30x4_completes("--max-num-seqs 3 --async-scheduling");
}

// The workload's engine line says how it scheduled: one step ahead only when asked on the CPU
// backend (the default there; the CUDA backend's default is the other way round); both flags
// at once are refused.
TEST(BenchCli, WorkloadSchedulesOneStepAheadOnlyWhenAskedOnTheCpu) {
  const std::string base = "bench --backend cpu --model " + tiny_v3() + " --workload 2x10x3 --results ";
  const struct {
    const char* flags;
    bool ahead;
  } cases[] = {{"", false}, {" --async-scheduling", true}, {" --no-async-scheduling", false}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.flags);
    const std::string results = fresh_results("bench_workload_scheduling.md");
    const auto r = run_dsinfer(base + results + c.flags);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const std::string text = read_file(results);
    ASSERT_NE(text.find("- engine: max batched tokens"), std::string::npos) << text;
    EXPECT_EQ(text.find(", asynchronous scheduling") != std::string::npos, c.ahead) << text;
  }
  const auto both = run_dsinfer(base + fresh_results("bench_workload_both.md") +
                                " --async-scheduling --no-async-scheduling");
  EXPECT_NE(both.exit_code, 0) << both.out;
  EXPECT_NE(both.exit_code, -1) << "must not crash: " << both.out;
  EXPECT_NE(both.out.find("--async-scheduling excludes --no-async-scheduling"), std::string::npos) << both.out;
}

TEST(BenchCli, WorkloadLongerThanTheModelFailsWithAClearMessage) {
  // tiny_v3 holds 256 positions; 250 + 10 does not fit.
  const std::string results = fresh_results("bench_workload_too_long.md");
  const auto r = run_dsinfer("bench --backend cpu --model " + tiny_v3() + " --workload 2x250x10 --results " + results);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.exit_code, -1) << "must not crash: " << r.out;
  EXPECT_NE(r.out.find("maximum context length"), std::string::npos) << r.out;
  EXPECT_EQ(read_file(results).find("--workload"), std::string::npos) << "a failed run must not be recorded";
}

TEST(BenchCli, MalformedWorkloadIsRejected) {
  for (const char* bad : {"6x20", "6x0x5", "ax20x5", "6x20x5x1", "0x20x5", "6*20*5"}) {
    const auto r = run_dsinfer(std::string("bench --backend cpu --model ") + tiny_v3() + " --workload " + bad);
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.out;
    EXPECT_NE(r.out.find("NUMxINxOUT"), std::string::npos) << bad << ": " << r.out;
  }
}

TEST(BenchCli, PrefillOnlyPrintsFlopRateAndRatioToTheGemmCeiling) {
  const std::string results = fresh_results("bench_prefill_results.md");
  const auto r = run_dsinfer("bench --backend cpu --model " + tiny_v3() +
                             " --batch-sizes 1,2 --prompt-len 16 --prefill-only --results " + results);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("| batch | prefill tok/s | prefill TFLOP/s | of GEMM ceiling |"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("decode tok/s"), std::string::npos) << r.out;
  // One row per batch size, each with a percentage (the CPU ceiling is measured, never n/a).
  for (const int batch : {1, 2}) {
    const std::string line = table_row(r.out, batch);
    ASSERT_FALSE(line.empty()) << r.out;
    EXPECT_NE(line.find("% |"), std::string::npos) << line;
  }
  EXPECT_NE(read_file(results).find("GEMM ceiling"), std::string::npos);
}

// --precision fp32 says so in the report's header (its floor counts the default path's bytes);
// an unknown precision is refused before anything runs.
TEST(BenchCli, PrecisionIsReportedAndCheckedUpFront) {
  const auto r = run_dsinfer("bench --backend cpu --model " + tiny_v3() +
                             " --batch-sizes 1 --prompt-len 8 --prefill-only --precision fp32");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\n- precision: fp32"), std::string::npos) << r.out;
  const auto plain =
      run_dsinfer("bench --backend cpu --model " + tiny_v3() + " --batch-sizes 1 --prompt-len 8 --prefill-only");
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  EXPECT_EQ(plain.out.find("- precision:"), std::string::npos) << plain.out;
  const auto bad = run_dsinfer("bench --backend cpu --model " + tiny_v3() + " --precision bf8");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("precision"), std::string::npos) << bad.out;
}

// The number in column `column` (1: batch) of `batch`'s table row; NaN where the row is short.
double table_cell(const std::string& out, int batch, int column) {
  std::stringstream cells(table_row(out, batch));
  std::string cell;
  std::getline(cells, cell, '|');  // before the row's first bar
  for (int c = 1; c <= column; ++c)
    if (!std::getline(cells, cell, '|')) return std::nan("");
  return std::strtod(cell.c_str(), nullptr);
}

// The decode tok/s column (the fifth) of the table's row for `batch` (NaN when there is none).
double decode_tok_s(const std::string& out, int batch) { return table_cell(out, batch, 5); }

// Decode steps one at a time by default on the CPU backend, one ahead with --async-scheduling
// (the tokens of each step then come from the step before it through the backend's placeholder
// path); either way every timed step gives a row, and the header says which was measured.
TEST(BenchCli, DecodeStepsOneAheadOrOneAtATime) {
  const std::string base =
      "bench --backend cpu --model " + tiny_v3() + " --batch-sizes 3 --prompt-len 8 --decode-steps 3";
  const auto plain = run_dsinfer(base);
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  EXPECT_NE(plain.out.find("\n- decode steps: one at a time"), std::string::npos) << plain.out;
  EXPECT_NE(plain.out.find("\n| 3 | "), std::string::npos) << plain.out;
  const auto ahead = run_dsinfer(base + " --async-scheduling");
  ASSERT_EQ(ahead.exit_code, 0) << ahead.out;
  EXPECT_NE(ahead.out.find("\n- decode steps: one ahead"), std::string::npos) << ahead.out;
  EXPECT_NE(ahead.out.find("\n| 3 | "), std::string::npos) << ahead.out;
  for (const auto* r : {&plain, &ahead}) {
    const double tok_s = decode_tok_s(r->out, 3);
    EXPECT_TRUE(std::isfinite(tok_s) && tok_s > 0) << r->out;
  }
}

// Model FLOPs per prefilled token: the table's TFLOP/s over its tok/s for `batch`'s row.
double prefill_flops_per_token(const std::string& out, int batch) {
  return table_cell(out, batch, 3) * 1e12 / table_cell(out, batch, 2);
}

// --cached-prefix-len: the prompts' first positions are in the cache before the timed prefill,
// whose tokens attend to them (their model FLOPs count that attention: about 1.8 times a fresh
// prompt's per token on tiny_v3 after 200 positions), and decode continues after both; the
// header and the prefill time column say what was timed.
TEST(BenchCli, PrefillAfterACachedPrefixCountsItsAttention) {
  const std::string base = "bench --backend cpu --model " + tiny_v3() + " --batch-sizes 2 --prompt-len 8";
  const auto fresh = run_dsinfer(base + " --prefill-only");
  const auto after = run_dsinfer(base + " --prefill-only --cached-prefix-len 200");
  ASSERT_EQ(fresh.exit_code, 0) << fresh.out;
  ASSERT_EQ(after.exit_code, 0) << after.out;
  EXPECT_NE(after.out.find("- prefill: 8-token prompts after cached prefixes of 200 positions"), std::string::npos)
      << after.out;
  EXPECT_EQ(fresh.out.find("cached prefixes"), std::string::npos) << fresh.out;
  EXPECT_NE(after.out.find("| of GEMM ceiling | prefill ms |"), std::string::npos) << after.out;
  EXPECT_GT(prefill_flops_per_token(after.out, 2), 1.5 * prefill_flops_per_token(fresh.out, 2))
      << fresh.out << after.out;
  const auto decode = run_dsinfer(base + " --decode-steps 2 --cached-prefix-len 40");
  ASSERT_EQ(decode.exit_code, 0) << decode.out;
  EXPECT_NE(decode.out.find("decode contexts start at 48 tokens"), std::string::npos) << decode.out;
  EXPECT_TRUE(std::isfinite(decode_tok_s(decode.out, 2)) && decode_tok_s(decode.out, 2) > 0) << decode.out;
  EXPECT_NE(run_dsinfer(base + " --cached-prefix-len -1").exit_code, 0);
}

TEST(BenchCli, PrefillAndDecodeTableKeepsTheBandwidthColumns) {
  const auto r = run_dsinfer("bench --backend cpu --model " + tiny_v3() +
                             " --batch-sizes 2 --prompt-len 8 --decode-steps 2");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string columns =
      "| of GEMM ceiling | decode tok/s | decode step ms | bandwidth floor ms | achieved GB/s | of copy bw |";
  EXPECT_NE(r.out.find(columns), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n| 2 | "), std::string::npos) << r.out;
}

}  // namespace

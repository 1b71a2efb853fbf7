#!/usr/bin/env bash
# The one script run on the GPU machine (see GPU.md, "Build here, run there"): environment
# facts, the CUDA unit tests (CPU-vs-CUDA consistency and the golden fixtures), a short
# compute-sanitizer pass, then the V2-Lite-shaped decode benchmark with the device copy
# bandwidth measured in the same run. Logs go to $OUT; a short summary is printed last.
#
# Run from the repository root:
#   scripts/build_gpu.sh                      # here: stripped binaries in build-gpu/bin
#   BIN_DIR=build-gpu/bin tools/gpu_check.sh  # there
# BIN_DIR holds the stripped dsinfer and unit_cuda; MODEL_DIR the bench config.
set -uo pipefail
BIN_DIR="${BIN_DIR:-build-gpu/bin}"
MODEL_DIR="${MODEL_DIR:-bench/configs/v2_lite}"
OUT="${OUT:-out}"
UNIT_TIMEOUT_S="${UNIT_TIMEOUT_S:-150}"
SANITIZER_TIMEOUT_S="${SANITIZER_TIMEOUT_S:-45}"
BENCH_TIMEOUT_S="${BENCH_TIMEOUT_S:-200}"
BATCHES="${BATCHES:-1,16,64}"
BENCH_ARGS="${BENCH_ARGS:-}"  # e.g. "--decode-steps 8"
mkdir -p "$OUT"
export DSINFER_SOURCE_DIR="$PWD"
# cuBLASLt is linked dynamically; CUDA's own library folder may not be on the loader's path.
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"

{
  date -u
  nvidia-smi
  echo "--- ldd dsinfer"; ldd "$BIN_DIR/dsinfer"
  echo "--- ldd unit_cuda"; ldd "$BIN_DIR/unit_cuda"
} > "$OUT/env.log" 2>&1
grep -E "H200|H100|Driver Version" "$OUT/env.log" | head -3
grep -E "not found" "$OUT/env.log" && echo "missing libraries (see env.log)"

timeout "$UNIT_TIMEOUT_S" "$BIN_DIR/unit_cuda" > "$OUT/unit_cuda.log" 2>&1
unit_rc=$?

sanitizer_rc=skipped
if command -v compute-sanitizer > /dev/null && [ "$SANITIZER_TIMEOUT_S" -gt 0 ]; then
  timeout "$SANITIZER_TIMEOUT_S" compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN_DIR/unit_cuda" \
    --gtest_filter='CudaOpsTest.*:CudaAttentionTest.RaggedBatch*:CudaMoeTest.NoauxTc*' > "$OUT/sanitizer.log" 2>&1
  sanitizer_rc=$?
fi

timeout "$BENCH_TIMEOUT_S" "$BIN_DIR/dsinfer" bench --backend cuda --dummy-weights --model "$MODEL_DIR" \
  --batch-sizes "$BATCHES" --results "$OUT/RESULTS.md" ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
bench_rc=$?

echo "=== unit_cuda (rc $unit_rc)"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |agreement|Failure|error|cuda: " "$OUT/unit_cuda.log" | sort -u | head -40
echo "=== compute-sanitizer (rc $sanitizer_rc)"
grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/sanitizer.log" 2>/dev/null | tail -4
echo "=== bench (rc $bench_rc)"
tail -12 "$OUT/bench.log"

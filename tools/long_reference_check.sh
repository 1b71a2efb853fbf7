#!/usr/bin/env bash
# One GPU-machine call for the long teacher-forced references: makes
# tests/data/<fixture>/reference_long.json for the three fixtures with HF transformers
# (tools/make_long_reference.py; its seeds give the same files on every run), packs them into
# $OUT/reference_long.tar.gz so that they come back to be committed, then runs the CUDA tests
# over them and the short fixtures (unit_cuda '*LongReference*:*CudaGoldenModelTest*').
#
# Run from the repository root:
#   BIN_DIR=build-gpu/bin OUT=out tools/long_reference_check.sh
# BIN_DIR holds a stripped unit_cuda, and where it also holds unit_model (`cmake --build build-gpu
# --target unit_model`, stripped alike), the CPU's tests over the same files run too
# (LongReferenceTest: the CPU's roundings against HF's paths);
# REFERENCE_THREADS the CPU threads of each fixture's HF run (the three run at once);
# EXTRA_FILTER more gtest patterns (":"-joined) for unit_cuda.
set -uo pipefail
BIN_DIR="${BIN_DIR:-build-gpu/bin}"
OUT="${OUT:-out}"
REFERENCE_THREADS="${REFERENCE_THREADS:-5}"
REFERENCE_TIMEOUT_S="${REFERENCE_TIMEOUT_S:-240}"
UNIT_TIMEOUT_S="${UNIT_TIMEOUT_S:-240}"
EXTRA_FILTER="${EXTRA_FILTER:-}"
FIXTURES=(tiny_v3 tiny_v2_lite tiny_v3_fp8)
mkdir -p "$OUT"
export DSINFER_SOURCE_DIR="$PWD"
# cuBLASLt is linked dynamically; CUDA's own library folder may not be on the loader's path.
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"

pids=()
for fx in "${FIXTURES[@]}"; do
  timeout "$REFERENCE_TIMEOUT_S" python3 tools/make_long_reference.py --threads "$REFERENCE_THREADS" \
    "tests/data/$fx" > "$OUT/make_long_reference_$fx.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "make_long_reference ${FIXTURES[$i]}: exit $?"; status=1; }
done
files=()
for fx in "${FIXTURES[@]}"; do
  [ -f "tests/data/$fx/reference_long.json" ] && files+=("tests/data/$fx/reference_long.json")
done
[ ${#files[@]} -gt 0 ] && tar -czf "$OUT/reference_long.tar.gz" "${files[@]}"

filter='*LongReference*:*CudaGoldenModelTest*'
[ -n "$EXTRA_FILTER" ] && filter="$filter:$EXTRA_FILTER"
timeout "$UNIT_TIMEOUT_S" "$BIN_DIR/unit_cuda" --gtest_filter="$filter" > "$OUT/unit_cuda_long.log" 2>&1
echo "unit_cuda: exit $?" >> "$OUT/unit_cuda_long.log"

if [ -x "$BIN_DIR/unit_model" ]; then
  timeout "$UNIT_TIMEOUT_S" "$BIN_DIR/unit_model" --gtest_filter='*LongReference*' \
    > "$OUT/unit_model_long.log" 2>&1
  echo "unit_model: exit $?" >> "$OUT/unit_model_long.log"
fi

echo "== summary"
for fx in "${FIXTURES[@]}"; do tail -n 2 "$OUT/make_long_reference_$fx.log"; done
grep -E "default path|fp32 mode|top-1 agreement|^\[  (PASSED|FAILED)|FAILED  \]|exit" "$OUT/unit_cuda_long.log"
[ -f "$OUT/unit_model_long.log" ] && grep -E "\(|^\[  (PASSED|FAILED)|FAILED  \]|exit" "$OUT/unit_model_long.log"
exit $status

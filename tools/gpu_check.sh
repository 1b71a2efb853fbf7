#!/usr/bin/env bash
# The one script run on the GPU machine (see GPU.md, "Build here, run there"): environment
# facts, the CUDA unit tests (CPU-vs-CUDA consistency and the golden fixtures), a short
# compute-sanitizer pass, then V2-Lite-shaped benchmarks with random weights, each under its own
# timeout: decode against the device copy bandwidth, prefill against the bf16 GEMM ceiling
# (both measured in the same run), an offline workload through the whole engine, the same
# workload served over HTTP, the server's device memory, FP8 decode, and FP8 decode on
# DeepSeek-V3's shapes; optionally a kernel profile of the prefill (NCU_TIMEOUT_S).
# Logs go to $OUT; a short summary is printed last.
#
# Run from the repository root:
#   scripts/build_gpu.sh                      # here: stripped binaries in build-gpu/bin
#   BIN_DIR=build-gpu/bin tools/gpu_check.sh  # there
# BIN_DIR holds the stripped dsinfer and unit_cuda; MODEL_DIR the bench config. Each step's
# limit is an env variable (*_TIMEOUT_S; 0 skips the prefill and workload steps), as are the
# shapes (BATCHES, PREFILL_BATCHES, PREFILL_LEN, WORKLOAD) and extra flags (*_ARGS).
set -uo pipefail
BIN_DIR="${BIN_DIR:-build-gpu/bin}"
MODEL_DIR="${MODEL_DIR:-bench/configs/v2_lite}"
OUT="${OUT:-out}"
UNIT_TIMEOUT_S="${UNIT_TIMEOUT_S:-150}"
# The unit step's gtest filter: all but the long teacher-forced references (3,072 steps a
# fixture, three fixtures, two precisions), which tools/long_reference_check.sh runs.
UNIT_FILTER="${UNIT_FILTER:--*CudaLongReference*}"
SANITIZER_TIMEOUT_S="${SANITIZER_TIMEOUT_S:-45}"
BENCH_TIMEOUT_S="${BENCH_TIMEOUT_S:-200}"
BATCHES="${BATCHES:-1,16,64}"
BENCH_ARGS="${BENCH_ARGS:-}"  # e.g. "--decode-steps 8"
# Prefill: 4 prompts of 4096 tokens in one step, its model FLOP rate over the GEMM ceiling.
PREFILL_TIMEOUT_S="${PREFILL_TIMEOUT_S:-150}"
PREFILL_BATCHES="${PREFILL_BATCHES:-4}"
PREFILL_LEN="${PREFILL_LEN:-4096}"
PREFILL_ARGS="${PREFILL_ARGS:---prefill-reps 3}"
# Optional (NCU_TIMEOUT_S > 0, after the prefill bench): the same prefill under Nsight Compute,
# kernel durations only, tabled per MoE layer by tools/ncu_kernel_times.py. NCU_ARGS picks the
# kernels (the default skips the first passes' start and takes about four layers).
NCU_TIMEOUT_S="${NCU_TIMEOUT_S:-0}"
NCU_ARGS="${NCU_ARGS:---launch-skip 2000 --launch-count 600}"
# Offline workload NUMxINxOUT through the engine (0 or empty skips it).
WORKLOAD_TIMEOUT_S="${WORKLOAD_TIMEOUT_S:-240}"
WORKLOAD="${WORKLOAD-200x1000x100}"
WORKLOAD_ARGS="${WORKLOAD_ARGS:-}"  # e.g. "--max-batched-tokens 16384"
# The workload's shape served over HTTP (`dsinfer serve` on a directory from
# tools/serving_model_dir.py, `dsinfer bench-serve` with every request at once), after the
# engine-level workload; SERVE_TIMEOUT_S=0 skips it.
SERVE_TIMEOUT_S="${SERVE_TIMEOUT_S:-120}"
# The server's device memory (tools/device_memory_check.py): the KV cache sized to the GPU by
# default, and a prompt whose step runs out of device memory answered in smaller steps.
MEMORY_TIMEOUT_S="${MEMORY_TIMEOUT_S:-90}"
# Decode with the layers' projections in FP8 (e4m3 weights, 128x128 block scales) last; empty
# FP8_BATCHES skips it.
FP8_TIMEOUT_S="${FP8_TIMEOUT_S:-200}"
FP8_BATCHES="${FP8_BATCHES-1,64}"
FP8_ARGS="${FP8_ARGS:-}"
# FP8 decode on DeepSeek-V3's shapes (bench/configs/v3_slice: five layers of V3, which one H200
# holds with dummy weights) with 1k-token contexts, after the FP8 step; empty V3_BATCHES skips it.
V3_TIMEOUT_S="${V3_TIMEOUT_S:-60}"
V3_BATCHES="${V3_BATCHES-1,16}"
V3_MODEL_DIR="${V3_MODEL_DIR:-bench/configs/v3_slice}"
# The device runs one command for at most 600 s: the last two steps get what is left of this
# budget (at most their own timeout), so a slow early step shortens them rather than having the
# whole call killed before the summary is printed.
TOTAL_BUDGET_S="${TOTAL_BUDGET_S:-570}"
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

timeout "$UNIT_TIMEOUT_S" "$BIN_DIR/unit_cuda" --gtest_filter="$UNIT_FILTER" > "$OUT/unit_cuda.log" 2>&1
unit_rc=$?

sanitizer_rc=skipped
if command -v compute-sanitizer > /dev/null && [ "$SANITIZER_TIMEOUT_S" -gt 0 ]; then
  timeout "$SANITIZER_TIMEOUT_S" compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN_DIR/unit_cuda" \
    --gtest_filter='CudaOpsTest.*:CudaFp8GemmTest.Linear*:CudaAttentionTest.RaggedBatch*:CudaMoeTest.NoauxTc*:CudaMoeTest.PrefillSized*:CudaMoeTest.Skewed*:CudaAttentionTest.DecodeBatchInHeadTiles' > "$OUT/sanitizer.log" 2>&1
  sanitizer_rc=$?
fi

timeout "$BENCH_TIMEOUT_S" "$BIN_DIR/dsinfer" bench --backend cuda --dummy-weights --model "$MODEL_DIR" \
  --batch-sizes "$BATCHES" --results "$OUT/RESULTS.md" ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
bench_rc=$?

# Seconds the next step may take: its own timeout, capped by what is left of TOTAL_BUDGET_S
# (10 s kept for the summary); 0 when nothing is left.
step_budget() {
  local left=$((TOTAL_BUDGET_S - SECONDS - 10))
  [ "$left" -lt 0 ] && left=0
  if [ "$1" -lt "$left" ]; then echo "$1"; else echo "$left"; fi
}

# A binary older than these modes would fail on the unknown flag with a CLI11 message that is
# easy to misread in a log; say so plainly instead.
bench_help="$("$BIN_DIR/dsinfer" bench --help 2>&1)"
prefill_rc=skipped
prefill_s=$(step_budget "$PREFILL_TIMEOUT_S")
if [ "$prefill_s" -le 0 ]; then
  echo "prefill bench skipped (PREFILL_TIMEOUT_S=0 or TOTAL_BUDGET_S spent)" > "$OUT/prefill.log"
elif ! grep -q -- "--prefill-only" <<< "$bench_help"; then
  echo "prefill bench skipped: this dsinfer has no 'bench --prefill-only' (rebuild from a newer tree)" > "$OUT/prefill.log"
  prefill_rc=missing-flag
else
  timeout "$prefill_s" "$BIN_DIR/dsinfer" bench --backend cuda --dummy-weights --model "$MODEL_DIR" \
    --batch-sizes "$PREFILL_BATCHES" --prompt-len "$PREFILL_LEN" --prefill-only --results "$OUT/RESULTS.md" \
    ${PREFILL_ARGS:-} > "$OUT/prefill.log" 2>&1
  prefill_rc=$?
fi

ncu_rc=skipped
ncu_s=$(step_budget "$NCU_TIMEOUT_S")
if [ "$ncu_s" -le 0 ] || ! command -v ncu > /dev/null; then
  echo "kernel profile skipped (NCU_TIMEOUT_S=0, no ncu, or TOTAL_BUDGET_S spent)" > "$OUT/ncu_prefill_layers.txt"
else
  timeout "$ncu_s" ncu --metrics gpu__time_duration.sum $NCU_ARGS --print-summary per-kernel \
    "$BIN_DIR/dsinfer" bench --backend cuda --dummy-weights --model "$MODEL_DIR" --batch-sizes "$PREFILL_BATCHES" \
    --prompt-len "$PREFILL_LEN" --prefill-only > "$OUT/ncu_prefill.txt" 2>&1
  ncu_rc=$?
  python3 tools/ncu_kernel_times.py "$OUT/ncu_prefill.txt" --per route_kernel > "$OUT/ncu_prefill_layers.txt" 2>&1
fi

workload_rc=skipped
workload_s=$(step_budget "$WORKLOAD_TIMEOUT_S")
if [ -z "$WORKLOAD" ] || [ "$WORKLOAD" = "0" ] || [ "$workload_s" -le 0 ]; then
  echo "workload bench skipped (WORKLOAD empty/0, WORKLOAD_TIMEOUT_S=0 or TOTAL_BUDGET_S spent)" > "$OUT/workload.log"
elif ! grep -q -- "--workload" <<< "$bench_help"; then
  echo "workload bench skipped: this dsinfer has no 'bench --workload' (rebuild from a newer tree)" > "$OUT/workload.log"
  workload_rc=missing-flag
else
  timeout "$workload_s" "$BIN_DIR/dsinfer" bench --backend cuda --dummy-weights --model "$MODEL_DIR" \
    --workload "$WORKLOAD" --results "$OUT/RESULTS.md" ${WORKLOAD_ARGS:-} > "$OUT/workload.log" 2>&1
  workload_rc=$?
fi

# The model directory both served steps use: the config with a tokenizer for every id.
serve_dir=$(mktemp -d)
python3 tools/serving_model_dir.py "$MODEL_DIR/config.json" "$serve_dir" > "$OUT/serving_model_dir.log" 2>&1

serve_rc=skipped
serve_s=$(step_budget "$SERVE_TIMEOUT_S")
if [ -z "$WORKLOAD" ] || [ "$WORKLOAD" = "0" ] || [ "$serve_s" -le 0 ]; then
  echo "serving bench skipped (WORKLOAD empty/0, SERVE_TIMEOUT_S=0 or TOTAL_BUDGET_S spent)" > "$OUT/serve.log"
else
  IFS=x read -r serve_num serve_in serve_out <<< "$WORKLOAD"
  : > "$OUT/serve.log"
  serve_vocab=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["vocab_size"])' \
    "$MODEL_DIR/config.json")
  "$BIN_DIR/dsinfer" serve --backend cuda --dummy-weights --model "$serve_dir" --served-model-name bench --port 0 \
    --no-kv-store --max-batched-tokens 16384 2> "$OUT/serve_server.log" &
  server_pid=$!
  serve_deadline=$((SECONDS + serve_s))
  serve_left() { local left=$((serve_deadline - SECONDS)); echo $((left < 1 ? 1 : left)); }
  until grep -q 'serve: ready' "$OUT/serve_server.log" || [ "$SECONDS" -ge "$serve_deadline" ] ||
        ! kill -0 "$server_pid" 2> /dev/null; do sleep 0.2; done
  serve_port=$(grep -o 'http://127.0.0.1:[0-9]*' "$OUT/serve_server.log" | head -1 | cut -d: -f3)
  serve_rc=no-server
  if [ -n "$serve_port" ]; then
    client=("$BIN_DIR/dsinfer" bench-serve --port "$serve_port" --model bench --endpoint completions
            --min-prompt-id 300 --max-prompt-id "$serve_vocab")
    # A warm-up that records the decode steps, then every request at once.
    timeout "$(serve_left)" "${client[@]}" --num-requests 8 --concurrency 8 --input-tokens "$serve_in" \
      --output-tokens 16 --seed 7 >> "$OUT/serve.log" 2>&1
    timeout "$(serve_left)" "${client[@]}" --num-requests "$serve_num" --concurrency "$serve_num" \
      --input-tokens "$serve_in" --output-tokens "$serve_out" >> "$OUT/serve.log" 2>&1
    serve_rc=$?
  fi
  kill -TERM "$server_pid" 2> /dev/null
  wait "$server_pid"
fi

memory_rc=skipped
memory_s=$(step_budget "$MEMORY_TIMEOUT_S")
if [ "$memory_s" -le 0 ]; then
  echo "device memory check skipped (MEMORY_TIMEOUT_S=0 or TOTAL_BUDGET_S spent)" > "$OUT/memory.log"
else
  timeout "$memory_s" python3 tools/device_memory_check.py "$BIN_DIR/dsinfer" "$serve_dir" "$OUT" \
    > "$OUT/memory.log" 2>&1
  memory_rc=$?
fi
rm -rf "$serve_dir"

fp8_rc=skipped
fp8_s=$(step_budget "$FP8_TIMEOUT_S")
if [ -z "$FP8_BATCHES" ] || [ "$fp8_s" -le 0 ]; then
  echo "FP8 decode bench skipped (FP8_BATCHES empty or TOTAL_BUDGET_S spent)" > "$OUT/fp8.log"
elif ! grep -q -- "--fp8" <<< "$bench_help"; then
  echo "FP8 decode bench skipped: this dsinfer has no 'bench --fp8'" > "$OUT/fp8.log"
  fp8_rc=missing-flag
else
  timeout "$fp8_s" "$BIN_DIR/dsinfer" bench --backend cuda --dummy-weights --fp8 --model "$MODEL_DIR" \
    --batch-sizes "$FP8_BATCHES" --results "$OUT/RESULTS.md" ${FP8_ARGS:-} > "$OUT/fp8.log" 2>&1
  fp8_rc=$?
fi

v3_rc=skipped
v3_s=$(step_budget "$V3_TIMEOUT_S")
if [ -z "$V3_BATCHES" ] || [ "$v3_s" -le 0 ] || [ ! -f "$V3_MODEL_DIR/config.json" ]; then
  echo "V3-shaped FP8 decode bench skipped (V3_BATCHES empty, no $V3_MODEL_DIR or TOTAL_BUDGET_S spent)" \
    > "$OUT/v3_fp8.log"
else
  timeout "$v3_s" "$BIN_DIR/dsinfer" bench --backend cuda --dummy-weights --fp8 --model "$V3_MODEL_DIR" \
    --batch-sizes "$V3_BATCHES" --prompt-len 1024 --decode-steps 16 --results "$OUT/RESULTS.md" \
    > "$OUT/v3_fp8.log" 2>&1
  v3_rc=$?
fi

# 124 is timeout(1)'s "ran out of time".
explain_rc() {
  case "$1" in
    0) echo "ok" ;;
    124) echo "timed out" ;;
    *[!0-9]*) echo "$1" ;;
    *) echo "rc $1" ;;
  esac
}

echo "=== unit_cuda (rc $unit_rc)"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |agreement|Failure|error|cuda: " "$OUT/unit_cuda.log" | sort -u | head -40
echo "=== compute-sanitizer (rc $sanitizer_rc)"
grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/sanitizer.log" 2>/dev/null | tail -4
echo "=== decode bench ($(explain_rc "$bench_rc"))"
tail -12 "$OUT/bench.log"
echo "=== prefill bench $PREFILL_BATCHES x $PREFILL_LEN ($(explain_rc "$prefill_rc"), limit ${prefill_s}s)"
grep -E "GEMM ceiling|sustained GEMM rate|SM clock|^\| |error|skipped" "$OUT/prefill.log" | tail -10
echo "=== prefill kernels per MoE layer, Nsight Compute ($(explain_rc "$ncu_rc"), limit ${ncu_s}s)"
head -16 "$OUT/ncu_prefill_layers.txt"
echo "=== workload $WORKLOAD ($(explain_rc "$workload_rc"), limit ${workload_s}s)"
grep -E "GEMM ceiling|^completed|^- engine|^- device idle|^\| |error|skipped" "$OUT/workload.log" | tail -12
echo "=== served over HTTP, $WORKLOAD ($(explain_rc "$serve_rc"), limit ${serve_s}s)"
tail -6 "$OUT/serve.log"
echo "=== device memory ($(explain_rc "$memory_rc"), limit ${memory_s}s)"
tail -8 "$OUT/memory.log"
echo "=== FP8 decode bench $FP8_BATCHES ($(explain_rc "$fp8_rc"), limit ${fp8_s}s)"
grep -E "^\| |error|skipped" "$OUT/fp8.log" | tail -6
echo "=== V3-shaped FP8 decode bench $V3_BATCHES ($(explain_rc "$v3_rc"), limit ${v3_s}s)"
grep -E "^\| |error|skipped" "$OUT/v3_fp8.log" | tail -6

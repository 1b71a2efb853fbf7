#!/usr/bin/env bash
# Serving benchmarks on the CPU with a tiny real model (tests/data/tiny_v3 + a fitted
# tokenizer, see tests/e2e/tiny_model.mjs), with DEMO=1 the trained demo model (models/demo),
# or with SMALL=1 the bench/configs/small_v3 config with random weights (--dummy-weights):
#  1. server overhead per streamed token: output tokens/s of `dsinfer serve` + `bench-serve`
#     against `dsinfer generate` on the same prompts in the same run (goal: ratio >= 0.95);
#  2. 1,000 concurrent streaming connections to the real engine: all must complete.
# Prints a table and appends it to bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${DSINFER_BINARY:-build/dsinfer}
NUM=${NUM:-64}; IN=${IN:-32}; OUT=${OUT:-128}; REPEATS=${REPEATS:-5}
TMP_MODEL=$(node -e "import('./tests/e2e/tiny_model.mjs').then(m => console.log(m.makeTinyModelDir()))")
MODEL=$TMP_MODEL
WEIGHTS=()
DESCRIPTION="tiny_v3 random-weight model (3 layers, hidden 64), byte tokenizer"
if [ "${SMALL:-0}" = 1 ]; then
  rm "$MODEL/config.json" "$MODEL/model.safetensors"
  cp bench/configs/small_v3/config.json "$MODEL/config.json"
  WEIGHTS=(--dummy-weights)
  DESCRIPTION="bench/configs/small_v3 with random weights (6 layers, hidden 1024, 32 experts, top-4), byte tokenizer"
elif [ "${DEMO:-0}" = 1 ]; then
  MODEL=models/demo
  DESCRIPTION="the trained demo model (models/demo: 3 layers, hidden 192, 16 experts, its own 8000-id tokenizer)"
fi
WORK=$(mktemp -d)
trap 'rm -rf "$TMP_MODEL" "$WORK"; [ -n "${SERVER:-}" ] && kill "$SERVER" 2>/dev/null || true' EXIT

# The same prompts for both: NUM lines of IN token ids drawn from the byte-token range.
python3 - "$NUM" "$IN" > "$WORK/prompts.jsonl" <<'PY'
import json, random, sys
n, m = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(0)
for _ in range(n):
    print(json.dumps({"prompt_ids": [rng.randrange(100, 200) for _ in range(m)]}))
PY

# Two measures per run. Wall clock: output tokens/s (generate: its run minus a load-only run).
# CPU time: output tokens per CPU-second of the serving process (engine + HTTP) against the
# generate process (engine alone), which the other jobs of a shared machine do not distort.
# The server listens at once and says "ready" when the model has loaded.
wait_ready() {
  for _ in $(seq 1200); do grep -q 'serve: ready' "$WORK/serve.log" && return 0; sleep 0.1; done
  echo "the server did not get ready:"; cat "$WORK/serve.log"; exit 1
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
wall_ratios=(); cpu_ratios=(); gen_rates=(); serve_rates=()
for rep in $(seq "$REPEATS"); do
  /usr/bin/time -f "%e %U %S" -o "$WORK/t_load" "$BIN" generate --model "$MODEL" "${WEIGHTS[@]}" --prompt-ids 100 --max-tokens 1 > /dev/null
  /usr/bin/time -f "%e %U %S" -o "$WORK/t_gen" "$BIN" generate --model "$MODEL" "${WEIGHTS[@]}" --input "$WORK/prompts.jsonl" \
      --max-tokens "$OUT" --ignore-eos --temperature 0 > "$WORK/gen.jsonl"
  read -r gen_rate gen_cpu_rate < <(python3 - "$WORK/t_load" "$WORK/t_gen" "$NUM" "$OUT" <<'PY'
import sys
load = [float(x) for x in open(sys.argv[1]).read().split()[-3:]]
run = [float(x) for x in open(sys.argv[2]).read().split()[-3:]]
tokens = int(sys.argv[3]) * int(sys.argv[4])
print(tokens / (run[0] - load[0]), tokens / ((run[1] + run[2]) - (load[1] + load[2])))
PY
)
  "$BIN" serve --engine model --model "$MODEL" "${WEIGHTS[@]}" --served-model-name tiny --port 0 2> "$WORK/serve.log" & SERVER=$!
  wait_ready
  PORT=$(grep -o 'http://127.0.0.1:[0-9]*' "$WORK/serve.log" | head -1 | cut -d: -f3)
  c0=$(cpu_ticks "$SERVER")
  "$BIN" bench-serve --port "$PORT" --model tiny --num-requests "$NUM" --concurrency "$NUM" \
      --input-tokens "$IN" --output-tokens "$OUT" --json "$WORK/serve.json" > "$WORK/serve.txt" || { cat "$WORK/serve.txt"; exit 1; }
  c1=$(cpu_ticks "$SERVER")
  kill -TERM "$SERVER"; wait "$SERVER"; SERVER=
  read -r serve_rate serve_cpu_rate < <(python3 - "$WORK/serve.json" "$c0" "$c1" "$(getconf CLK_TCK)" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
cpu_s = (int(sys.argv[3]) - int(sys.argv[2])) / int(sys.argv[4])
print(j["output_token_throughput"], j["num_output_tokens"] / cpu_s)
PY
)
  gen_rates+=("$gen_rate"); serve_rates+=("$serve_rate")
  wall_ratios+=("$(python3 -c "print($serve_rate/$gen_rate)")")
  cpu_ratios+=("$(python3 -c "print($serve_cpu_rate/$gen_cpu_rate)")")
  printf 'run %d: generate %.0f tok/s (%.0f tok/CPU-s), served %.0f tok/s (%.0f tok/CPU-s)\n' "$rep" \
      "$gen_rate" "$gen_cpu_rate" "$serve_rate" "$serve_cpu_rate"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
spread() { printf '%.2f-%.2f' "$(printf '%s\n' "$@" | sort -g | head -1)" "$(printf '%s\n' "$@" | sort -g | tail -1)"; }
GEN=$(median "${gen_rates[@]}"); SERVED=$(median "${serve_rates[@]}")
WALL=$(printf '%.3f' "$(median "${wall_ratios[@]}")"); CPU=$(printf '%.3f' "$(median "${cpu_ratios[@]}")")

# 1,000 concurrent streams against the real engine (not with SMALL: too slow a model).
C1000=""
if [ "${SMALL:-0}" != 1 ]; then
  "$BIN" serve --engine model --model "$MODEL" --served-model-name tiny --port 0 --max-queued 2000 2> "$WORK/serve.log" & SERVER=$!
  wait_ready
  PORT=$(grep -o 'http://127.0.0.1:[0-9]*' "$WORK/serve.log" | head -1 | cut -d: -f3)
  "$BIN" bench-serve --port "$PORT" --model tiny --num-requests 1000 --concurrency 1000 --input-tokens 16 --output-tokens 16 \
      --json "$WORK/c1000.json" --plot bench/serve_c1000.png > "$WORK/c1000.txt" || true
  kill -TERM "$SERVER"; wait "$SERVER"; SERVER=
  cat "$WORK/c1000.txt"
  C1000=$(python3 -c "import json; j=json.load(open('$WORK/c1000.json')); print(f\"{j['num_ok']} ok / {j['num_failed']} failed, {j['output_token_throughput']:.0f} tok/s, TTFT p50 {j['ttft_ms']['p50']:.0f} ms p99 {j['ttft_ms']['p99']:.0f} ms, ITL p50 {j['itl_ms']['p50']:.1f} ms p99 {j['itl_ms']['p99']:.1f} ms\")")
fi

[ -f bench/RESULTS.md ] || echo "# dsinfer benchmark results" > bench/RESULTS.md
{
  echo
  echo "## Serving: server overhead per streamed token${C1000:+, and 1,000 concurrent streams}"
  echo
  echo "$(date -u +%Y-%m-%d), dev box: 2-core x86-64, Debian 12 (shared; load average $(cut -d' ' -f1 /proc/loadavg)),"
  echo "CPU backend, $DESCRIPTION;"
  echo "\`SMALL=${SMALL:-0} DEMO=${DEMO:-0} NUM=$NUM IN=$IN OUT=$OUT REPEATS=$REPEATS bench/serve_bench.sh\` (medians of paired runs)."
  echo
  echo "| measure | value |"
  echo "|---|---|"
  echo "| dsinfer generate, output tokens/s, wall clock (model load subtracted), median | $(printf '%.0f' "$GEN") |"
  echo "| dsinfer serve + bench-serve (streamed, concurrency $NUM), output tokens/s, median | $(printf '%.0f' "$SERVED") |"
  echo "| served / generate, wall clock, median of paired runs (goal >= 0.95) | $WALL (runs: $(spread "${wall_ratios[@]}")) |"
  echo "| served / generate, tokens per CPU-second of the process, median (goal >= 0.95) | $CPU (runs: $(spread "${cpu_ratios[@]}")) |"
  if [ -n "$C1000" ]; then echo "| 1,000 concurrent streaming requests (16 in / 16 out) | $C1000 |"; fi
} >> bench/RESULTS.md
tail -12 bench/RESULTS.md

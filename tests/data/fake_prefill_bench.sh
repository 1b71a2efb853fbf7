#!/usr/bin/env bash
# Stands in for `dsinfer bench --prefill-only` in tools/prefill_ab.py's test: prints the parts of
# a bench's output the tool reads, with the rate and clock from FAKE_RATE and FAKE_CLOCK;
# FAKE_PLAIN=1 leaves out the clock and sustained-rate lines (a bench without NVML), FAKE_EXIT
# exits with that status, FAKE_SLEEP sleeps first. FAKE_DECODE=1 prints a decode bench's rows
# instead (batches 1 and 2, the batch-1 rate from FAKE_DECODE_RATE; batch 2's prompts, as if they
# did not fit one prefill step, with n/a in its prefill cells).
[ -n "${FAKE_SLEEP:-}" ] && sleep "$FAKE_SLEEP"
[ -n "${FAKE_EXIT:-}" ] && exit "$FAKE_EXIT"
echo "### dsinfer bench — DeepseekV2ForCausalLM (random weights) hidden 2048, 27 layers, 64 experts top-6, backend cuda"
echo
if [ -z "${FAKE_PLAIN:-}" ]; then
  echo "- SM clock (NVML, every 2 ms): GEMM ceiling 1980 MHz mean (1980-1980), 123 W, power-capped in 0% and slowed for heat in 0% of 569 samples; prefill at batch 4 ${FAKE_CLOCK:-1821} MHz mean (1800-1830), 292 W, power-capped in 100% and slowed for heat in 0% of 70 samples"
  echo "- sustained GEMM rate (the ceiling's product back to back for 0.2 s, over the whole window): 1167.53 TFLOP/s, SM clock 1947 MHz mean (1470-1980), 145 W; prefill at batch 4: 51.2% of it"
fi
echo
if [ -n "${FAKE_DECODE:-}" ]; then
  echo "| batch | prefill tok/s | prefill TFLOP/s | of GEMM ceiling | decode tok/s | decode step ms |" \
    "bandwidth floor ms | achieved GB/s | of copy bw |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  echo "| 1 | 82899 | 383.4 | 28.6% | ${FAKE_DECODE_RATE:-429.1} | 2.33 | 0.65 | 1169.6 | 28% |"
  echo "| 2 | n/a | n/a | n/a | 578.7 | 3.46 | 0.97 | 1175.2 | 28% |"
  exit 0
fi
echo "| batch | prefill tok/s | prefill TFLOP/s | of GEMM ceiling | prefill ms |"
echo "|---:|---:|---:|---:|---:|"
echo "| 4 | ${FAKE_RATE:-118407} | 597.9 | 45.6% | 138.38 |"

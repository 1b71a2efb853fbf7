#!/usr/bin/env python3
"""Prefill A/B comparison in one GPU call: `dsinfer bench --prefill-only` for each variant in
turn, several rounds, one markdown row per run and each variant's median.

Under the GPU's power limit a prefill pass runs at whatever clock the driver allows, and that
moves its rate by a few percent from one call to the next; variants are only comparable within
one call, run alternately. Each row therefore also carries the prefill's mean SM clock and its
share of the sustained GEMM rate the same bench measured.

Usage (from the repository root, on the GPU machine):
  tools/prefill_ab.py [--rounds N] [--timeout S] [--args "BENCH ARGS"] VARIANT...
A VARIANT is NAME=BINARY[,ENV=VALUE...], e.g.
  base=.devcarry/a/dsinfer  new=.devcarry/b/dsinfer  off=.devcarry/b/dsinfer,DSINFER_MOE_PREFILL_PAIRS=0

With --decode the runs are decode benches instead (by default batches 1 and 2 at 1k context; add
--fp8 through --args), tabled by batch: decode tok/s and share of the copy bandwidth.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

DEFAULT_ARGS = ("--backend cuda --dummy-weights --model bench/configs/v2_lite --prompt-len 4096 "
                "--batch-sizes 4 --prefill-only --prefill-reps 3 --fp8")
DEFAULT_DECODE_ARGS = ("--backend cuda --dummy-weights --model bench/configs/v2_lite --prompt-len 1024 "
                       "--decode-steps 16 --batch-sizes 1,2")


def parse_variant(spec):
    name, sep, rest = spec.partition("=")
    if not sep or not name or not rest:
        raise ValueError(f"variant {spec!r}: expected NAME=BINARY[,ENV=VALUE...]")
    binary, *settings = rest.split(",")
    env = {}
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key:
            raise ValueError(f"variant {spec!r}: {setting!r} is not ENV=VALUE")
        env[key] = value
    return name, binary, env


def parse_bench(text):
    """The first prefill row of a bench's output: tok/s, share of the best-group ceiling, share
    of the sustained rate and the prefill's mean SM clock (None where the bench printed none)."""
    row = re.search(r"^\| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)% \|", text, re.M)
    if row is None:
        return None
    batch = row.group(1)
    sustained = re.search(r"sustained GEMM rate .*?prefill at batch " + batch + r": ([\d.]+)% of it", text)
    clock = re.search(r"SM clock \(NVML.*?prefill at batch " + batch + r" (\d+) MHz mean", text)
    return {
        "tok_s": float(row.group(2)),
        "share": float(row.group(4)),
        "sustained_share": float(sustained.group(1)) if sustained else None,
        "clock_mhz": int(clock.group(1)) if clock else None,
    }


def parse_decode(text):
    """Every batch row's decode rate: [{batch, tok_s, copy_share}], or None without one."""
    # The prefill columns read n/a where a batch's prompts did not fit one step.
    rows = re.findall(r"^\| (\d+) \| (?:[\d.]+|n/a) \| (?:[\d.]+|n/a) \| (?:[\d.]+%|n/a) \| ([\d.]+) \| [\d.]+ \| "
                      r"[\d.]+ \| [\d.]+ \| (\d+)% \|", text, re.M)
    if not rows:
        return None
    return [{"batch": int(b), "tok_s": float(rate), "copy_share": int(share)} for b, rate, share in rows]


def run_once(binary, env, bench_args, timeout_s, parse=parse_bench, rows_named="prefill row"):
    """(result or None, note)."""
    try:
        done = subprocess.run([binary, "bench", *bench_args.split()], env={**os.environ, **env},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout_s} s"
    except OSError as e:
        return None, f"cannot run: {e.strerror}"
    if done.returncode != 0:
        return None, f"exit status {done.returncode}"
    result = parse(done.stdout)
    return (result, "") if result else (None, f"no {rows_named} in its output")


def fmt(value, suffix=""):
    return "—" if value is None else f"{value}{suffix}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="+", metavar="VARIANT")
    ap.add_argument("--rounds", type=int, default=2)
    # An FP8 decode run over batches 1, 2 and 4, which quantises the weights at load, took over 45 s on the H200.
    ap.add_argument("--timeout", type=float, default=100.0, help="seconds per bench run")
    ap.add_argument("--args", default=None, help="the bench's arguments")
    ap.add_argument("--decode", action="store_true", help="compare decode rates per batch")
    opts = ap.parse_args()
    if opts.args is None:
        opts.args = DEFAULT_DECODE_ARGS if opts.decode else DEFAULT_ARGS
    try:
        variants = [parse_variant(v) for v in opts.variants]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if opts.rounds < 1:
        print("error: --rounds must be at least 1", file=sys.stderr)
        return 2

    if opts.decode:
        return compare_decode(variants, opts)
    print("| variant | round | tok/s | of best group | of sustained | prefill clock |")
    print("|---|---:|---:|---:|---:|---:|")
    rates = {name: [] for name, _, _ in variants}
    for rnd in range(1, opts.rounds + 1):
        for name, binary, env in variants:
            result, note = run_once(binary, env, opts.args, opts.timeout)
            if result is None:
                print(f"| {name} | {rnd} | {note} | | | |", flush=True)
                continue
            rates[name].append(result["tok_s"])
            print(f"| {name} | {rnd} | {result['tok_s']:,.0f} | {result['share']}% | "
                  f"{fmt(result['sustained_share'], '%')} | {fmt(result['clock_mhz'], ' MHz')} |", flush=True)
    print()
    print("| variant | median tok/s | runs |")
    print("|---|---:|---:|")
    for name, _, _ in variants:
        got = rates[name]
        median = f"{statistics.median(got):,.0f}" if got else "—"
        print(f"| {name} | {median} | {len(got)} of {opts.rounds} |")
    return 0 if all(rates.values()) else 1


def compare_decode(variants, opts):
    print("| variant | round | batch | decode tok/s | of copy bw |")
    print("|---|---:|---:|---:|---:|")
    rates = {name: {} for name, _, _ in variants}
    batches = []
    for rnd in range(1, opts.rounds + 1):
        for name, binary, env in variants:
            rows, note = run_once(binary, env, opts.args, opts.timeout, parse_decode, "decode rows")
            if rows is None:
                print(f"| {name} | {rnd} | {note} | | |", flush=True)
                continue
            for row in rows:
                if row["batch"] not in batches:
                    batches.append(row["batch"])
                rates[name].setdefault(row["batch"], []).append(row["tok_s"])
                print(f"| {name} | {rnd} | {row['batch']} | {row['tok_s']:,.1f} | {row['copy_share']}% |", flush=True)
    print()
    print("| variant | batch | median tok/s | runs |")
    print("|---|---:|---:|---:|")
    for name, _, _ in variants:
        for batch in batches:
            got = rates[name].get(batch, [])
            median = f"{statistics.median(got):,.1f}" if got else "—"
            print(f"| {name} | {batch} | {median} | {len(got)} of {opts.rounds} |")
    return 0 if all(rates.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Kernel times of one forward step from an Nsight Compute run with one row per launch.

Reads what `ncu --metrics gpu__time_duration.sum --csv --page raw ...` prints and cuts the
launches into steps: a step ends with each launch of the kernel whose name contains --step-end
(argmax_rows_kernel by default: `dsinfer bench` chooses its greedy tokens once per forward).
Prints the launches of one step in order, with grid, block and time, then the step's total;
--summary lists the step's kernels by total time instead. Where ncu_kernel_times.py tables a
whole run, this one separates a decode step from the prefill before it. Plain Python 3.

  DSINFER_CUDA_GRAPHS=0 ncu --metrics gpu__time_duration.sum --csv --page raw \\
      dsinfer bench --backend cuda --dummy-weights --model <3-layer config> \\
      --batch-sizes 256 --prompt-len 1024 --decode-steps 2 > ncu.csv
  tools/ncu_step_kernels.py ncu.csv --step -2
"""
import argparse
import collections
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_kernel_times import MICROSECONDS_PER_UNIT, short_name  # noqa: E402

COLUMNS = ("Kernel Name", "Grid Size", "Block Size", "gpu__time_duration.sum")


def read_launches(text):
    """[(name, grid, block, µs)] in launch order."""
    lines = [line for line in text.split("\n") if not line.startswith("==")]
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        sys.exit("no launch table found (was ncu run with --csv --page raw?)")
    rows = list(csv.reader(lines[start:]))
    header, units = rows[0], rows[1]
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        sys.exit(f"the launch table has no column {missing[0]!r}")
    name_at, grid_at, block_at, time_at = (header.index(c) for c in COLUMNS)
    per_unit = MICROSECONDS_PER_UNIT.get(units[time_at])
    if per_unit is None:
        sys.exit(f"unknown duration unit {units[time_at]!r}")
    launches = []
    for row in rows[2:]:
        if len(row) != len(header):
            continue
        us = float(row[time_at].replace(",", "")) * per_unit
        launches.append((short_name(row[name_at]), row[grid_at], row[block_at], us))
    return launches


def split_steps(launches, step_end):
    """The launches cut after each one named like step_end; a trailing partial step is dropped."""
    steps, current = [], []
    for launch in launches:
        current.append(launch)
        if step_end in launch[0]:
            steps.append(current)
            current = []
    return steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="ncu output with --csv --page raw")
    parser.add_argument("--step", type=int, default=-1, help="which step, counted from 0 (negative: from the end)")
    parser.add_argument("--step-end", default="argmax_rows_kernel", help="the kernel that ends a step")
    parser.add_argument("--summary", action="store_true", help="kernels by total time instead of launch order")
    args = parser.parse_args()
    with open(args.file, encoding="utf-8", errors="replace") as f:
        launches = read_launches(f.read())
    steps = split_steps(launches, args.step_end)
    if not steps:
        sys.exit(f"no kernel named like {args.step_end!r} ends a step")
    if not -len(steps) <= args.step < len(steps):
        sys.exit(f"step {args.step} asked for, {len(steps)} steps found")
    index = args.step % len(steps)
    step = steps[index]
    total = sum(us for _, _, _, us in step)
    print(f"step {index} of {len(steps)}: {len(step)} launches, {total:.1f} us")
    if args.summary:
        by_kernel, calls = collections.Counter(), collections.Counter()
        for name, _, _, us in step:
            by_kernel[name] += us
            calls[name] += 1
        for name, us in by_kernel.most_common():
            print(f"{us:10.1f} us {calls[name]:4d} calls  {name}")
        return
    for name, grid, block, us in step:
        print(f"{us:10.1f} us  {name}  {grid}x{block}")


if __name__ == "__main__":
    main()

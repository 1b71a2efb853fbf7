#!/usr/bin/env python3
"""Kernel time table from an Nsight Compute run with a per-kernel summary.

Reads the text that `ncu --metrics gpu__time_duration.sum --print-summary per-kernel ...`
prints and lists the total time of each kernel, longest first. With --per NAME, the times are
divided by the invocations of the first kernel whose name contains NAME (e.g. route_kernel,
which runs once per MoE layer), giving time per layer. --group-library lumps cuBLASLt's
kernels (nvjet_*, *xmma*) into one row. Plain Python 3, no other packages.

  ncu --metrics gpu__time_duration.sum --launch-skip 2000 --launch-count 600 \\
      --print-summary per-kernel dsinfer bench ... > ncu.txt
  tools/ncu_kernel_times.py ncu.txt --per route_kernel --group-library
"""
import argparse
import collections
import re
import sys

HEADER = re.compile(r"^\s+(?P<name>\S.*?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Device \d+, CC [\d.]+"
                    r"(?:, Invocations (?P<calls>\d+))?\s*$")
DURATION = re.compile(r"gpu__time_duration\.sum\s+(?P<unit>\S+)\s+[\d.]+\s+[\d.]+\s+(?P<average>[\d.]+)")
MICROSECONDS_PER_UNIT = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6}


def short_name(name):
    """The kernel's name without its parameter list, return type and anonymous namespace."""
    name = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    name = re.sub(r"^void ", "", name)
    depth, end = 0, len(name)
    for i, ch in enumerate(name):  # cut at the parameter list's '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            end = i
            break
    return name[:end]


def is_library(name):
    return name.startswith("nvjet_") or "xmma" in name or "cutlass" in name


def read_kernels(lines):
    """[(name, invocations, average µs)] in the order ncu prints them."""
    kernels = []
    for i, line in enumerate(lines):
        header = HEADER.match(line)
        if not header:
            continue
        for follow in lines[i + 1:i + 10]:
            duration = DURATION.search(follow)
            if duration:
                unit = MICROSECONDS_PER_UNIT.get(duration.group("unit"))
                if unit is None:
                    sys.exit(f"unknown duration unit {duration.group('unit')!r}")
                calls = int(header.group("calls") or 1)
                kernels.append((short_name(header.group("name")), calls, float(duration.group("average")) * unit))
                break
    return kernels


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="ncu output with --print-summary per-kernel")
    parser.add_argument("--per", help="divide by the invocations of the kernel whose name contains this")
    parser.add_argument("--group-library", action="store_true", help="one row for all cuBLASLt kernels")
    parser.add_argument("--rows", type=int, default=30)
    args = parser.parse_args()
    with open(args.file, encoding="utf-8", errors="replace") as f:
        kernels = read_kernels([line for line in f.read().split("\n") if "==PROF==" not in line])
    if not kernels:
        sys.exit("no kernel summaries found (was ncu run with --print-summary per-kernel?)")
    total_us = collections.Counter()
    calls = collections.Counter()
    for name, n, average_us in kernels:
        key = "cuBLASLt products" if args.group_library and is_library(name) else name
        total_us[key] += n * average_us
        calls[key] += n
    divisor, unit = 1, "us"
    if args.per:
        marker = [n for name, n, _ in kernels if args.per in name]
        if not marker:
            sys.exit(f"no kernel named like {args.per!r}")
        divisor, unit = sum(marker), f"us per {args.per}"
    print(f"{sum(total_us.values()) / divisor:10.1f} {unit}, all kernels")
    for key, us in total_us.most_common(args.rows):
        print(f"{us / divisor:10.1f} {unit} {calls[key] / divisor:7.1f} calls  {key}")


if __name__ == "__main__":
    main()

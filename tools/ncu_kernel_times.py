#!/usr/bin/env python3
"""Kernel time table from an Nsight Compute run with a per-kernel summary.

Reads the text that `ncu --metrics gpu__time_duration.sum --print-summary per-kernel ...`
prints and lists the total time of each kernel, longest first. Where the run also asked for
dram__bytes_read.sum and dram__bytes_write.sum, each row adds the kernel's DRAM traffic and its
rate (read + write over time), which tells a pass that moves bytes slowly from one that is
done. With --per NAME, the times are divided by the invocations of the first kernel whose name
contains NAME (e.g. route_kernel, which runs once per MoE layer), giving time per layer.
--group-library lumps cuBLASLt's kernels (nvjet_*, *xmma*) into one row. Plain Python 3, no other packages.

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
DURATION = re.compile(r"gpu__time_duration\.sum\s+(?P<unit>\S+)\s+[\d.,]+\s+[\d.,]+\s+(?P<average>[\d.,]+)")
MICROSECONDS_PER_UNIT = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6}
DRAM_BYTES = re.compile(
    r"dram__bytes_(?:read|write)\.sum\s+(?P<unit>\S+)\s+[\d.,]+\s+[\d.,]+\s+(?P<average>[\d.,]+)")
MEGABYTES_PER_UNIT = {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3, "Tbyte": 1e6}


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
    """[(name, invocations, average µs, average DRAM MB or None)] in the order ncu prints them."""
    kernels = []
    for i, line in enumerate(lines):
        header = HEADER.match(line)
        if not header:
            continue
        average_us, dram_mb = None, None
        for follow in lines[i + 1:i + 14]:
            if HEADER.match(follow):
                break
            duration = DURATION.search(follow)
            if duration:
                unit = MICROSECONDS_PER_UNIT.get(duration.group("unit"))
                if unit is None:
                    sys.exit(f"unknown duration unit {duration.group('unit')!r}")
                average_us = float(duration.group("average").replace(",", "")) * unit
            dram = DRAM_BYTES.search(follow)
            if dram:
                unit = MEGABYTES_PER_UNIT.get(dram.group("unit"))
                if unit is None:
                    sys.exit(f"unknown byte unit {dram.group('unit')!r}")
                dram_mb = (dram_mb or 0.0) + float(dram.group("average").replace(",", "")) * unit
        if average_us is not None:
            calls = int(header.group("calls") or 1)
            kernels.append((short_name(header.group("name")), calls, average_us, dram_mb))
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
    total_mb = collections.Counter()
    calls = collections.Counter()
    with_dram = all(mb is not None for _, _, _, mb in kernels)
    for name, n, average_us, average_mb in kernels:
        key = "cuBLASLt products" if args.group_library and is_library(name) else name
        total_us[key] += n * average_us
        calls[key] += n
        if with_dram:
            total_mb[key] += n * average_mb
    divisor, unit = 1, "us"
    if args.per:
        marker = [n for name, n, _, _ in kernels if args.per in name]
        if not marker:
            sys.exit(f"no kernel named like {args.per!r}")
        divisor, unit = sum(marker), f"us per {args.per}"
    print(f"{sum(total_us.values()) / divisor:10.1f} {unit}, all kernels")
    for key, us in total_us.most_common(args.rows):
        dram = ""
        if with_dram:  # MB / µs is TB/s
            dram = f" {total_mb[key] / divisor:9.1f} MB DRAM {1e3 * total_mb[key] / us:6.0f} GB/s"
        print(f"{us / divisor:10.1f} {unit} {calls[key] / divisor:7.1f} calls{dram}  {key}")


if __name__ == "__main__":
    main()

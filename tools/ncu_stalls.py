#!/usr/bin/env python3
"""Where a kernel's warps wait, from Nsight Compute's per-instruction source counters.

Reads what `ncu --import REPORT --page source --csv --print-source sass` prints (plain or
gzipped) for a report taken with `--section SourceCounters --section WarpStateStats`, and
tables for each kernel:
- the instructions run at least once, in bytes of code and 128-byte lines: what a launch
  fetches into the SM's instruction caches;
- the warp stall samples by reason, largest first, with their share of all samples;
- the instructions with the most samples, each with its offset in the kernel, its SASS and its
  two largest reasons;
- per opcode: instructions executed, samples and shared-memory wavefronts (with the count an
  access without bank conflicts would take), which tells whether the products, the copies or
  the loads are the ones that keep shared memory busy.
The source page repeats a kernel's block once per profiled launch of it; repeats of the same
kernel are read once. Plain Python 3, no other packages.

  ncu --section WarpStateStats --section SourceCounters -o stall dsinfer bench ...
  ncu --import stall.ncu-rep --page source --csv --print-source sass > stall.csv
  tools/ncu_stalls.py stall.csv --top 20
"""
import argparse
import collections
import csv
import gzip
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
WAVEFRONTS = "L1 Wavefronts Shared"
WAVEFRONTS_IDEAL = "L1 Wavefronts Shared Ideal"
STALL_PREFIX = "stall_"
INSTRUCTION_BYTES = 16  # every SASS instruction since Volta
CODE_LINE_BYTES = 128
NOT_ISSUED = "(Not Issued)"


class Kernel:
    def __init__(self, name):
        self.name = name
        self.header = None
        self.rows = []  # each a dict of header -> cell


def read_kernels(path):
    """The kernels of a source-page CSV in order of first appearance, repeats dropped."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        lines = list(csv.reader(f))
    kernels, seen, current = [], set(), None
    for cells in lines:
        if not cells:
            continue
        if cells[0] == "Kernel Name":
            name = cells[1] if len(cells) > 1 else "?"
            current = None if name in seen else Kernel(name)
            if current is not None:
                seen.add(name)
                kernels.append(current)
            continue
        if current is None:
            continue
        if cells[0] == "Address":
            current.header = cells
            continue
        if current.header is not None and len(cells) == len(current.header):
            current.rows.append(dict(zip(current.header, cells)))
    return kernels


def number(cell):
    try:
        return int(float(cell.replace(",", ""))) if cell not in ("", "-") else 0
    except ValueError:
        return 0


def stall_columns(header):
    return [h for h in header if h.startswith(STALL_PREFIX) and NOT_ISSUED not in h]


def opcode(sass):
    words = sass.split()
    if words and words[0].startswith("@"):  # a predicate guard
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def share(part, whole):
    return f"{100.0 * part / whole:.1f}%" if whole else "—"


def report(kernel, top):
    rows = kernel.rows
    if kernel.header is None or SAMPLES not in kernel.header:
        return f"## {kernel.name}\n\nno per-instruction samples in this block\n"
    stalls = stall_columns(kernel.header)
    total = sum(number(r[SAMPLES]) for r in rows)
    # The code a launch fetches: the instructions run at least once, and the 128-byte lines
    # that hold them (a short launch finds its code cold in the SM's instruction caches).
    run = [int(r["Address"], 16) for r in rows
           if number(r.get(EXECUTED, "")) > 0 and r["Address"].startswith("0x")]
    out = [f"## {kernel.name}", "",
           f"{total:,} samples over {len(rows):,} instructions; "
           f"{sum(number(r.get(EXECUTED, '')) for r in rows):,} warp instructions executed",
           f"{len(run):,} instructions run at least once ({len(run) * INSTRUCTION_BYTES:,} bytes of code; "
           f"{CODE_LINE_BYTES}-byte lines: {len({a // CODE_LINE_BYTES for a in run}):,})", ""]

    by_reason = collections.Counter()
    for r in rows:
        for s in stalls:
            by_reason[s] += number(r[s])
    out += ["| stall reason | samples | share |", "|---|---:|---:|"]
    for reason, n in by_reason.most_common():
        if n:
            out.append(f"| {reason[len(STALL_PREFIX):]} | {n:,} | {share(n, total)} |")

    base = min((int(r["Address"], 16) for r in rows if r["Address"].startswith("0x")), default=0)
    out += ["", f"| offset | samples | share | instruction | main reasons |", "|---:|---:|---:|---|---|"]
    for r in sorted(rows, key=lambda r: -number(r[SAMPLES]))[:top]:
        n = number(r[SAMPLES])
        if not n:
            break
        reasons = sorted(((number(r[s]), s) for s in stalls), reverse=True)[:2]
        main = ", ".join(f"{s[len(STALL_PREFIX):]} {c:,}" for c, s in reasons if c)
        offset = int(r["Address"], 16) - base if r["Address"].startswith("0x") else 0
        sass = " ".join(r["Source"].split()).replace("|", "\\|")
        out.append(f"| {offset:#x} | {n:,} | {share(n, total)} | `{sass}` | {main} |")

    per_op = collections.defaultdict(lambda: [0, 0, 0, 0])
    for r in rows:
        t = per_op[opcode(r["Source"])]
        t[0] += number(r.get(EXECUTED, ""))
        t[1] += number(r[SAMPLES])
        t[2] += number(r.get(WAVEFRONTS, ""))
        t[3] += number(r.get(WAVEFRONTS_IDEAL, ""))
    out += ["", "| opcode | executed | samples | shared wavefronts | without conflicts |",
            "|---|---:|---:|---:|---:|"]
    for op, (executed, samples, waves, ideal) in sorted(per_op.items(), key=lambda kv: -kv[1][0])[:top]:
        out.append(f"| {op} | {executed:,} | {samples:,} | {waves:,} | {ideal:,} |")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="ncu --page source --csv --print-source sass output (.gz too)")
    parser.add_argument("--top", type=int, default=15, help="rows of the instruction and opcode tables")
    parser.add_argument("--kernel", default="", help="only kernels whose name contains this")
    args = parser.parse_args()
    try:
        kernels = read_kernels(args.csv)
    except (OSError, csv.Error, UnicodeDecodeError) as e:
        print(f"error: cannot read {args.csv}: {e}", file=sys.stderr)
        return 2
    kernels = [k for k in kernels if args.kernel in k.name]
    if not kernels:
        print(f"error: no kernel{' named ' + repr(args.kernel) if args.kernel else ''} in {args.csv}",
              file=sys.stderr)
        return 1
    print("\n".join(report(k, args.top) for k in kernels))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The loops of each kernel in a SASS listing, with their instruction counts by opcode.

A loop is the span from a backward branch's target to the branch. For a kernel bound by the
instructions of its inner loop (the few-row products' walks at batch 1), the loop's length per
step is the figure a change to the walk moves, and the opcode counts say what the length is
made of (conversions, products, address arithmetic, zeroing moves, branches). Spill traffic
shows as LDL / STL in a loop. Reads `cuobjdump -sass` output and `nvdisasm` output of a cubin
(plain or gzipped); branch targets may be addresses or labels.

  cuobjdump -sass few_row_gemm.cu.o > few_row.sass
  tools/sass_loops.py few_row.sass [--kernel NAME] [--min 50] [--ops 12] [--count F2FP,HFMA2,LDL]

Plain Python 3, no other packages.
"""
import argparse
import collections
import gzip
import re
import sys

FUNCTION = re.compile(r"Function\s*:\s*(\S+)")
SECTION = re.compile(r"^\s*\.text\.(\S+):\s*$")
LABEL = re.compile(r"^\s*(\.L\w+):\s*$")
INSTRUCTION = re.compile(r"^\s*/\*([0-9a-fA-F]+)\*/\s+(.*?)\s*;")
GUARD = re.compile(r"^@!?U?P[T0-9]+\s+")
BRANCH = re.compile(r"^BRA(?:\.\S+)?\s+(?:`\((\.L\w+)\)|(0x[0-9a-fA-F]+))")


def read_kernels(path):
    """[(name, [(offset, text)], {label: offset})] in listing order."""
    opener = gzip.open if path.endswith(".gz") else open
    kernels = []
    pending_labels = []
    with opener(path, "rt", errors="replace") as f:
        for line in f:
            m = FUNCTION.search(line) or SECTION.match(line)
            if m:
                kernels.append((m.group(1), [], {}))
                pending_labels = []
                continue
            if not kernels:
                continue
            m = LABEL.match(line)
            if m:
                pending_labels.append(m.group(1))
                continue
            m = INSTRUCTION.match(line)
            if m:
                offset = int(m.group(1), 16)
                kernels[-1][1].append((offset, m.group(2)))
                for label in pending_labels:
                    kernels[-1][2][label] = offset
                pending_labels = []
    return kernels


def opcode(text):
    return GUARD.sub("", text).split()[0].split(".")[0]


def loops(instructions, labels):
    """[(first offset, branch offset, [text])] for each backward branch, by first offset."""
    index = {offset: i for i, (offset, _) in enumerate(instructions)}
    found = []
    for i, (offset, text) in enumerate(instructions):
        m = BRANCH.match(GUARD.sub("", text))
        if not m:
            continue
        target = labels.get(m.group(1)) if m.group(1) else int(m.group(2), 16)
        if target is None or target > offset or target not in index:
            continue
        body = [t for _, t in instructions[index[target]:i + 1]]
        found.append((target, offset, body))
    return sorted(found)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sass", help="cuobjdump -sass or nvdisasm output (.gz too)")
    parser.add_argument("--kernel", default="", help="only kernels whose name contains this")
    parser.add_argument("--min", type=int, default=1, help="only loops of at least this many instructions")
    parser.add_argument("--ops", type=int, default=8, help="most frequent opcodes listed per loop")
    parser.add_argument("--count", default="LDL,STL", help="opcodes counted in columns of their own")
    args = parser.parse_args()
    counted = [op for op in args.count.split(",") if op]
    try:
        kernels = read_kernels(args.sass)
    except OSError as e:
        print(f"error: cannot read {args.sass}: {e.strerror}", file=sys.stderr)
        return 2
    kernels = [k for k in kernels if args.kernel in k[0]]
    if not kernels:
        print(f"error: no kernel named '{args.kernel}' in {args.sass}", file=sys.stderr)
        return 1
    for name, instructions, labels in kernels:
        found = [l for l in loops(instructions, labels) if len(l[2]) >= args.min]
        noun = "loop" if len(found) == 1 else "loops"
        print(f"## {name}\n\n{len(instructions)} instructions, {len(found)} {noun} of {args.min} or more\n")
        if not found:
            continue
        print("| loop | instructions | " + " | ".join(counted) + (" | " if counted else "") + "most frequent |")
        print("|---|---:|" + "---:|" * len(counted) + "---|")
        for first, last, body in found:
            ops = collections.Counter(opcode(t) for t in body)
            columns = "".join(f" {ops[op]} |" for op in counted)
            common = ", ".join(f"{op} {n}" for op, n in ops.most_common(args.ops))
            print(f"| {first:#06x}-{last:#06x} | {len(body)} |{columns} {common} |")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

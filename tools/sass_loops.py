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
import re
import sys

from sass_listing import GUARD, chosen_kernels

BRANCH = re.compile(r"^BRA(?:\.\S+)?\s+(?:`\((\.L\w+)\)|(0x[0-9a-fA-F]+))")


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
    kernels, status = chosen_kernels(args.sass, args.kernel)
    if status:
        return status
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

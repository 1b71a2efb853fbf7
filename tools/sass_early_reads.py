#!/usr/bin/env python3
"""Global loads whose registers are read soon after the load, from `cuobjdump -sass` output.

A warp stalls at the first instruction that reads a load's destination until the data arrives.
Where that instruction stands right after the load (a register move the compiler placed there
to merge the two sides of a branch, or a sum in a loop that reads one element at a time), loads
meant to be in flight together arrive one after another. For each kernel of a listing (plain or
gzipped; `nvdisasm` output too): its global loads (LDG, LD), how many have a destination
register read within --window instructions, and the first --examples such pairs with their
offsets.

  cuobjdump -sass few_row_gemm.cu.o > few_row.sass
  tools/sass_early_reads.py few_row.sass [--window 4] [--kernel NAME] [--examples 6]

Plain Python 3, no other packages.
"""
import argparse
import re
import sys

from sass_listing import GUARD, chosen_kernels

REGISTER = re.compile(r"(?<![A-Za-z0-9_])R(\d+)(?![0-9])")
WRITES_NOTHING = ("ST", "RED", "ATOM", "BRA", "BAR", "EXIT", "RET", "CALL", "MEMBAR", "FENCE")


def operands(text):
    """(opcode, destination registers, source registers) of one instruction."""
    body = GUARD.sub("", text)
    parts = body.split(None, 1)
    opcode = parts[0]
    if len(parts) == 1:
        return opcode, set(), set()
    ops = [o.strip() for o in parts[1].split(",")]
    if opcode.startswith(WRITES_NOTHING):
        dst, srcs = [], ops
    else:
        dst, srcs = ops[:1], ops[1:]
    width = 4 if ".128" in opcode else 2 if ".64" in opcode else 1
    dst_regs = set()
    for d in dst:
        m = REGISTER.match(d)
        if m:
            dst_regs = set(range(int(m.group(1)), int(m.group(1)) + width))
    src_regs = {int(r) for s in srcs for r in REGISTER.findall(s)}
    return opcode, dst_regs, src_regs


def is_global_load(opcode):
    return opcode.startswith("LDG") or opcode == "LD" or opcode.startswith("LD.")


def early_reads(instructions, window):
    """(number of global loads, [(load, reader)] for loads read within `window` instructions)."""
    parsed = [operands(text) for _, text in instructions]
    loads, early = 0, []
    for i, (opcode, dst, _) in enumerate(parsed):
        if not is_global_load(opcode) or not dst:
            continue
        loads += 1
        live = set(dst)
        for j in range(i + 1, min(len(parsed), i + 1 + window)):
            _, later_dst, later_src = parsed[j]
            if later_src & live:
                early.append((instructions[i], instructions[j]))
                break
            live -= later_dst  # overwritten before it was read
            if not live:
                break
    return loads, early


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sass", help="cuobjdump -sass output (.gz too)")
    parser.add_argument("--window", type=int, default=4, help="instructions after a load that count as soon")
    parser.add_argument("--kernel", default="", help="only kernels whose name contains this")
    parser.add_argument("--examples", type=int, default=6, help="pairs listed per kernel")
    args = parser.parse_args()
    chosen, status = chosen_kernels(args.sass, args.kernel)
    if status:
        return status
    for name, instructions, _ in chosen:
        loads, early = early_reads(instructions, max(1, args.window))
        print(f"## {name}\n\n{loads} global loads, {len(early)} read within {args.window} instructions\n")
        if early:
            print("| load | reader |\n|---|---|")
            for (lo, lt), (ro, rt) in early[:args.examples]:
                print(f"| {lo:#06x} `{lt}` | {ro:#06x} `{rt}` |")
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

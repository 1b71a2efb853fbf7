"""SASS listings for the sass_*.py tools: `cuobjdump -sass` output (a kernel after each
"Function : NAME") or `nvdisasm` output of a cubin (after each ".text.NAME:"), plain or gzipped;
branch targets may be labels (".L_x_12:" before the instruction they name).

Plain Python 3, no other packages.
"""
import gzip
import re
import sys

FUNCTION = re.compile(r"Function\s*:\s*(\S+)")
SECTION = re.compile(r"^\s*\.text\.(\S+):\s*$")
LABEL = re.compile(r"^\s*(\.L\w+):\s*$")
INSTRUCTION = re.compile(r"^\s*/\*([0-9a-fA-F]+)\*/\s+(.*?)\s*;")
GUARD = re.compile(r"^@!?U?P[T0-9]+\s+")


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


def chosen_kernels(path, name_part):
    """(the kernels whose name contains name_part, 0), or ([], exit status) after the error."""
    try:
        kernels = read_kernels(path)
    except OSError as e:
        print(f"error: cannot read {path}: {e.strerror}", file=sys.stderr)
        return [], 2
    chosen = [k for k in kernels if name_part in k[0]]
    if not chosen:
        print(f"error: no kernel named '{name_part}' in {path}", file=sys.stderr)
        return [], 1
    return chosen, 0

#!/usr/bin/env python3
"""Sums up a kernel timeline (DSINFER_KERNEL_TIMELINE, docs/cuda.md): where a recorded step's
time goes, kernel by kernel.

On the main stream, a kernel's share of the step is the time from its own wait returning to the
next kernel's wait returning: while it runs, nothing after it can start. Its lead is how long
its first block had been resident before its wait returned: near zero when it was launched only
as the kernel before it finished, instead of overlapping that kernel's end.

With --stages, the step's repeating run of main-stream kernels (a layer: the run of kernel
names and grids that recurs most often) is listed position by position, each with its median
time over the repeats, and the sum of those medians: the time of a typical layer. Where a
kernel's first block notes when its own work is done (first_block_done_us), the median time
from its wait to then follows the list.

    python3 tools/kernel_timeline.py timeline.tsv [--by-grid] [--top N] [--sequence N] [--stages]
"""
import argparse
import collections
import re
import statistics


def short_name(kernel):
    """dsinfer::cuda::(anonymous namespace)::few_row_gemm_kernel<1, false>(args) -> few_row_gemm_kernel<1, false>"""
    name = kernel
    depth, cut = 0, len(name)
    for i, c in enumerate(name):  # drop the parameter list: the first '(' outside template brackets
        if c == '<':
            depth += 1
        elif c == '>':
            depth -= 1
        elif c == '(' and depth == 0 and not name.startswith('(anonymous', i):
            cut = i
            break
    name = name[:cut]
    name = re.sub(r'^void ', '', name)
    name = re.sub(r'(\w+::|\(anonymous namespace\)::)+(?=\w)', '', name, count=1)
    return name


def read(path):
    rows = []
    with open(path) as f:
        header = f.readline().rstrip('\n').split('\t')
        for line in f:
            fields = dict(zip(header, line.rstrip('\n').split('\t', len(header) - 1)))
            rows.append({
                'stream': fields['stream'],
                'grid': fields['grid'],
                'entered': float(fields['entered_us']),
                'resumed': float(fields['resumed_us']),
                # When the first block noted its own work done (timelines since that column; '-'
                # where the kernel does not note it).
                'first_done': (float(fields['first_block_done_us'])
                               if fields.get('first_block_done_us', '-') != '-' else None),
                'kernel': short_name(fields['kernel']),
            })
    return rows


def repeating_run(keys):
    """The (start, length) of the run of keys that recurs most often without overlapping itself,
    and the starts of its repeats; None if nothing recurs. The length is the shortest period at
    which keys mostly repeat (its multiples repeat too); of the runs of that length, the one
    with the most repeats, then the earliest."""
    n = len(keys)
    matches = {p: sum(1 for i in range(n - p) if keys[i] == keys[i + p]) for p in range(2, n // 2 + 1)}
    if not matches or max(matches.values()) == 0:
        return None
    best = max(matches.values())
    length = min(p for p, m in matches.items() if m >= 0.9 * best)
    best_starts = []
    for first in range(n - length + 1):
        window = keys[first:first + length]
        starts, i = [], first
        while i + length <= n:
            if keys[i:i + length] == window:
                starts.append(i)
                i += length
            else:
                i += 1
        if len(starts) > len(best_starts):
            best_starts = starts
    return (length, best_starts) if len(best_starts) >= 2 else None


def print_stages(main_rows):
    # The grid tells apart the launches of one kernel at different places of a layer.
    keys = [(r['kernel'], r['grid']) for r in main_rows[:-1]]
    times = [nxt['resumed'] - cur['resumed'] for cur, nxt in zip(main_rows, main_rows[1:])]
    found = repeating_run(keys)
    if found is None:
        print('\nno repeating run of kernels')
        return
    length, starts = found
    print(f'\nrepeating run: {length} kernels, {len(starts)} repeats (first at main-stream kernel #{starts[0]})')
    print(f"{'#':>3} {'kernel':<60} {'grid':<14} {'median us':>9}")
    total = 0.0
    for k in range(length):
        median = statistics.median(times[s + k] for s in starts)
        total += median
        row = main_rows[starts[0] + k]
        print(f"{k:>3} {row['kernel'][:60]:<60} {row['grid']:<14} {median:>9.2f}")
    print(f"{'':>3} {'(sum)':<60} {'':<14} {total:>9.2f}")
    # Kernels whose first block does work of its own beside the others' (the routing beside a
    # product): how long that block took after its wait, against the kernel's share above.
    for k in range(length):
        rows = [main_rows[s + k] for s in starts]
        own = [r['first_done'] - r['resumed'] for r in rows if r['first_done'] is not None]
        if own:
            print(f"first block of #{k} done {statistics.median(own):.2f} us after its wait (median of {len(own)})")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('timeline')
    parser.add_argument('--by-grid', action='store_true', help='tell kernels apart by their grid too')
    parser.add_argument('--top', type=int, default=30, help='kernels to list (default 30)')
    parser.add_argument('--sequence', type=int, default=0, help='also list the first N kernels one by one')
    parser.add_argument('--stages', action='store_true', help='also list the repeating run of kernels (a layer)')
    args = parser.parse_args()

    rows = read(args.timeline)
    while rows and rows[-1]['stream'] == '?':  # kernels that ran after the replay
        rows.pop()
    main_rows = [r for r in rows if r['stream'] != 'side']
    if len(main_rows) < 2:
        raise SystemExit('fewer than two kernels on the main stream')
    span = main_rows[-1]['resumed'] - main_rows[0]['resumed']
    print(f'{len(rows)} kernels ({len(rows) - len(main_rows)} on the side stream); '
          f'first to last wait returning: {span:.1f} us (the last kernel\'s own time not included)')

    totals = collections.defaultdict(list)
    leads = collections.defaultdict(list)
    for cur, nxt in zip(main_rows, main_rows[1:]):
        key = cur['kernel'] + (f" [{cur['grid']}]" if args.by_grid else '')
        totals[key].append(nxt['resumed'] - cur['resumed'])
        leads[key].append(cur['resumed'] - cur['entered'])

    print(f"\n{'kernel':<60} {'count':>5} {'total us':>9} {'share':>6} {'median us':>9} {'lead us':>8}")
    ranked = sorted(totals.items(), key=lambda kv: -sum(kv[1]))
    for key, times in ranked[:args.top]:
        print(f'{key[:60]:<60} {len(times):>5} {sum(times):>9.1f} {100 * sum(times) / span:>5.1f}% '
              f'{statistics.median(times):>9.2f} {statistics.median(leads[key]):>8.2f}')
    rest = ranked[args.top:]
    if rest:
        print(f"{'(the rest)':<60} {sum(len(t) for _, t in rest):>5} {sum(sum(t) for _, t in rest):>9.1f}")

    all_leads = [r['resumed'] - r['entered'] for r in main_rows[1:]]
    print(f'\nlead over all main-stream kernels: median {statistics.median(all_leads):.2f} us; '
          f'{sum(1 for x in all_leads if x < 0.5)} of {len(all_leads)} under 0.5 us')

    if args.stages:
        print_stages(main_rows)

    if args.sequence:
        print(f"\n{'#':>4} {'stream':<6} {'entered':>9} {'resumed':>9} {'grid':<14} kernel")
        for i, r in enumerate(rows[:args.sequence]):
            print(f"{i:>4} {r['stream']:<6} {r['entered']:>9.2f} {r['resumed']:>9.2f} {r['grid']:<14} {r['kernel']}")


if __name__ == '__main__':
    main()

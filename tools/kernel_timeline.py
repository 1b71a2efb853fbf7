#!/usr/bin/env python3
"""Sums up a kernel timeline (DSINFER_KERNEL_TIMELINE, docs/cuda.md): where a recorded step's
time goes, kernel by kernel.

On the main stream, a kernel's share of the step is the time from its own wait returning to the
next kernel's wait returning: while it runs, nothing after it can start. Its lead is how long
its first block had been resident before its wait returned: near zero when it was launched only
as the kernel before it finished, instead of overlapping that kernel's end.

    python3 tools/kernel_timeline.py timeline.tsv [--by-grid] [--top N] [--sequence N]
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
                'kernel': short_name(fields['kernel']),
            })
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('timeline')
    parser.add_argument('--by-grid', action='store_true', help='tell kernels apart by their grid too')
    parser.add_argument('--top', type=int, default=30, help='kernels to list (default 30)')
    parser.add_argument('--sequence', type=int, default=0, help='also list the first N kernels one by one')
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

    if args.sequence:
        print(f"\n{'#':>4} {'stream':<6} {'entered':>9} {'resumed':>9} {'grid':<14} kernel")
        for i, r in enumerate(rows[:args.sequence]):
            print(f"{i:>4} {r['stream']:<6} {r['entered']:>9.2f} {r['resumed']:>9.2f} {r['grid']:<14} {r['kernel']}")


if __name__ == '__main__':
    main()

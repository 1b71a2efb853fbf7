#!/usr/bin/env python3
"""Writes a long teacher-forced reference for an existing fixture: tests/data/<fixture>/reference_long.json.

The fixtures' reference.json holds 144 greedy steps (6 prompts x 24 tokens): one step is 0.7% of
agreement, too coarse to tell 98.6% from 99.3%. This draws many more prompts for the same
checkpoint (lengths spread log-uniformly from 1 to MAX_PROMPT_LEN, so that every step size the
engines route differently is hit) and computes their greedy continuations with HF transformers
exactly as make_reference.py does: fp32 on the CPU, eager attention, no KV cache, each step's
top-1/top-2 margin kept. FP8 checkpoints are widened to e4m3 x block scale in fp32
(hf_teacher_forced.widened_copy), the values make_reference.py computed its oracle with.

As a check of the oracle, the fixture's own reference.json prompts are run again and their
greedy tokens and margins compared (printed; the script exits with 1 if a token differs, and the
file records it).

Usage (GPU machine, CPU arithmetic): python3 tools/make_long_reference.py tests/data/tiny_v3 ...
    [--num-prompts 128] [--num-greedy-tokens 24]
"""

import argparse
import json
import math
import os
import shutil
import sys
import tempfile

import torch

import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_teacher_forced import model_class, widened_copy  # noqa: E402
from make_reference import greedy_path  # noqa: E402

MAX_PROMPT_LEN = 200
# One seed per fixture name, so that rerunning one fixture gives the same prompts.
SEEDS = {"tiny_v3": 3000, "tiny_v2_lite": 3001, "tiny_v3_fp8": 3002}


def prompt_lengths(gen, num_prompts):
    """Log-uniform in [1, MAX_PROMPT_LEN]: as many short prompts (one-row and few-row products)
    as long ones (tensor-core and library products)."""
    u = torch.rand(num_prompts, generator=gen, dtype=torch.float64)
    return [max(1, min(MAX_PROMPT_LEN, int(math.exp(x * math.log(MAX_PROMPT_LEN + 1))))) for x in u.tolist()]


def check_oracle(model, ref):
    """The fixture's reference.json prompts again: returns the number of prompts whose greedy
    tokens differ (none expected) and the largest margin difference over the others."""
    worst, num_differ = 0.0, 0
    for p in ref["prompts"]:
        greedy, margins = greedy_path(model, p["prompt_ids"], len(p["greedy_ids"]))
        if greedy != p["greedy_ids"]:
            print(f"oracle check: a prompt of {len(p['prompt_ids'])} tokens gives {greedy} against "
                  f"reference.json's {p['greedy_ids']}", flush=True)
            num_differ += 1
            continue
        worst = max(worst, max(abs(a - b) for a, b in zip(margins, p["greedy_margins"])))
    return num_differ, worst


def make_long_reference(fixture_dir, num_prompts, num_tokens):
    name = os.path.basename(fixture_dir.rstrip("/"))
    with open(os.path.join(fixture_dir, "reference.json")) as f:
        ref = json.load(f)
    tmp = tempfile.mkdtemp()
    try:
        cfg = widened_copy(fixture_dir, tmp)
        model = model_class(cfg).from_pretrained(tmp, torch_dtype=torch.float32,
                                                 attn_implementation="eager").eval()
        num_differ, margin_diff = check_oracle(model, ref)
        print(f"{name}: reference.json's prompts run again: {num_differ} of {len(ref['prompts'])} differ, "
              f"largest margin difference {margin_diff:.2e}", flush=True)
        gen = torch.Generator().manual_seed(SEEDS.get(name, 3999))
        vocab = cfg["vocab_size"]
        prompts = []
        for n in prompt_lengths(gen, num_prompts):
            ids = torch.randint(2, vocab, (n,), generator=gen).tolist()
            greedy, margins = greedy_path(model, ids, num_tokens)
            prompts.append(dict(prompt_ids=ids, greedy_ids=greedy,
                                greedy_margins=[float(f"{m:.7g}") for m in margins]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = dict(model=name, transformers_version=transformers.__version__, torch_version=torch.__version__,
               dtype="float32", attention="eager", kv_cache=False, num_greedy_tokens=num_tokens,
               max_prompt_len=MAX_PROMPT_LEN, reference_prompts_differing=num_differ,
               reference_margin_check=margin_diff, prompts=prompts)
    path = os.path.join(fixture_dir, "reference_long.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    margins = sorted(m for p in prompts for m in p["greedy_margins"])
    steps = len(margins)
    print(f"{name}: wrote {path}: {len(prompts)} prompts, {steps} steps; reference margins below "
          f"1e-3: {sum(m < 1e-3 for m in margins)}, below 1e-2: {sum(m < 1e-2 for m in margins)}, "
          f"below 0.1: {sum(m < 0.1 for m in margins)}", flush=True)
    return num_differ == 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fixtures", nargs="+", help="fixture directories (tests/data/<name>)")
    ap.add_argument("--num-prompts", type=int, default=128)
    ap.add_argument("--num-greedy-tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}", flush=True)
    ok = [make_long_reference(d, args.num_prompts, args.num_greedy_tokens) for d in args.fixtures]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())

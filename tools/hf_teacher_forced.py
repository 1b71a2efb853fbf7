#!/usr/bin/env python3
"""Teacher-forced top-1 agreement of HF transformers itself, in a chosen dtype, with a fixture's
fp32 reference (tests/data/<fixture>/reference.json).

The reference's greedy tokens were computed in fp32. This runs the same checkpoint through
transformers in bf16 (or f16, or fp32 as a check of the script) and counts the steps whose
argmax is the reference's token, feeding the reference's tokens back as the engine's golden
test does. It measures how far the reference implementation's own low-precision arithmetic
moves these random models' near ties: the floor any bf16 engine is compared against.

FP8 checkpoints are widened to their real values (e4m3 x 128x128 block scale) in fp32 first,
then cast to the chosen dtype like every other weight.

Usage (GPU machine): python3 tools/hf_teacher_forced.py --fixtures tests/data/tiny_v3 ...
                     [--dtypes float32 bfloat16 float16] [--device cuda] [--cache]
                     [--reference reference_long.json]
"""

import argparse
import json
import os
import shutil
import tempfile

import torch
from safetensors.torch import load_file, save_file

from transformers import (DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config,
                          DeepseekV3ForCausalLM)


def widened_copy(fixture_dir, out_dir):
    """The fixture with FP8 weights widened to fp32 and no quantization_config."""
    with open(os.path.join(fixture_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg.pop("quantization_config", None)
    tensors = {}
    for name in sorted(os.listdir(fixture_dir)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(fixture_dir, name)))
    out = {}
    for k, t in tensors.items():
        if k.endswith("_scale_inv"):
            continue
        scale = tensors.get(k + "_scale_inv")
        if scale is None:
            out[k] = t.float() if t.dtype == torch.float8_e4m3fn else t
            continue
        rows, cols = t.shape
        s = scale.float().repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]
        out[k] = t.float() * s
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(out_dir, "model.safetensors"))
    return cfg


def model_class(cfg):
    return DeepseekV3ForCausalLM if cfg["model_type"] == "deepseek_v3" else DeepseekV2ForCausalLM


@torch.no_grad()
def agreement(model, ref, device, use_cache):
    num_steps = num_agree = 0
    for p in ref["prompts"]:
        seq = list(p["prompt_ids"])
        past = None
        for step, want in enumerate(p["greedy_ids"]):
            if use_cache:
                ids = seq if past is None else seq[-1:]
                out = model(torch.tensor([ids], device=device), past_key_values=past, use_cache=True)
                past = out.past_key_values
            else:
                out = model(torch.tensor([seq], device=device), use_cache=False)
            got = int(out.logits[0, -1].float().argmax())
            num_steps += 1
            num_agree += got == want
            seq.append(want)
    return num_agree, num_steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", nargs="+", required=True)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "float16"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--cache", action="store_true", help="decode through HF's KV cache")
    ap.add_argument("--reference", default="reference.json",
                    help="the fixture's reference file (reference_long.json: make_long_reference.py)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for fixture_dir in args.fixtures:
        with open(os.path.join(fixture_dir, args.reference)) as f:
            ref = json.load(f)
        tmp = tempfile.mkdtemp()
        try:
            cfg = widened_copy(fixture_dir, tmp)
            for dtype in args.dtypes:
                model = model_class(cfg).from_pretrained(tmp, torch_dtype=getattr(torch, dtype),
                                                         attn_implementation="eager")
                model = model.to(args.device).eval()
                a, n = agreement(model, ref, args.device, args.cache)
                print(f"{os.path.basename(fixture_dir.rstrip('/'))} {args.reference} {dtype} {args.device}"
                      f"{' cache' if args.cache else ''}: top-1 agreement {a}/{n} ({100.0 * a / n:.2f}%)",
                      flush=True)
                del model
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes tiny random DeepSeek checkpoints in hub format plus HF transformers reference outputs.

Run on a machine with PyTorch and transformers 5.x (the GPU machine); the computation itself
runs on the CPU in fp32 with eager attention, so no TF32 or kernel choice can blur the oracle.

For each fixture model it writes <out>/<name>/:
  config.json                  hub-style config (rope_scaling, per-expert tensor names)
  model.safetensors            or shards + model.safetensors.index.json
  reference.json               prompts, top-5 logits at the last position, the full last-position
                               logits, and 24 greedy tokens computed without a KV cache, each
                               with its top-1/top-2 margin

The checkpoint on disk is checked by loading it back with from_pretrained and comparing logits
with the in-memory model, which proves the per-expert names are what HF expects.
"""

import argparse
import json
import math
import os
import shutil
import sys

import torch
from safetensors.torch import save_file

import transformers
from transformers import (DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config,
                          DeepseekV3ForCausalLM)

PROMPT_LENGTHS = [1, 5, 17, 64, 65, 130]
NUM_GREEDY_TOKENS = 24

BASE_V3 = dict(
    architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
    vocab_size=512, hidden_size=64, intermediate_size=160, moe_intermediate_size=32,
    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
    n_shared_experts=1, n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
    topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True,
    routed_scaling_factor=2.5, first_k_dense_replace=1, moe_layer_freq=1,
    q_lora_rank=48, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=24, v_head_dim=20,
    rope_theta=10000.0,
    rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=64,
                      beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=0.8),
    max_position_embeddings=256, rms_norm_eps=1e-6, num_nextn_predict_layers=1,
    bos_token_id=0, eos_token_id=1, tie_word_embeddings=False, hidden_act="silu",
    attention_bias=False, torch_dtype="bfloat16",
)

FIXTURES = {
    # V3: noaux_tc with groups and a correction bias, q_lora, yarn, an MTP layer; bf16.
    "tiny_v3": dict(config=BASE_V3, storage=torch.bfloat16, shards=1),
    # V2-Lite style: q_proj (no q_lora), softmax greedy without renormalisation, 2 shared
    # experts, no rope scaling; f16 in two shards with an index.
    "tiny_v2_lite": dict(config=dict(
        architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2",
        vocab_size=384, hidden_size=64, intermediate_size=144, moe_intermediate_size=24,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        n_shared_experts=2, n_routed_experts=12, num_experts_per_tok=3, n_group=1, topk_group=1,
        topk_method="greedy", scoring_func="softmax", norm_topk_prob=False,
        routed_scaling_factor=1.0, first_k_dense_replace=1, moe_layer_freq=1,
        q_lora_rank=None, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=32,
        v_head_dim=32, rope_theta=10000.0, rope_scaling=None, max_position_embeddings=512,
        rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
        hidden_act="silu", attention_bias=False, torch_dtype="float16"),
        storage=torch.float16, shards=2),
    # V3 with DeepSeek's FP8 format: linear weights e4m3 with a float32 weight_scale_inv per
    # 128x128 block. Shapes are not multiples of 128, so partial blocks are exercised.
    "tiny_v3_fp8": dict(
        config=dict(BASE_V3,
                    vocab_size=448, hidden_size=192, intermediate_size=320,
                    moe_intermediate_size=96, n_routed_experts=8, num_experts_per_tok=2,
                    n_group=4, topk_group=2, q_lora_rank=160, kv_lora_rank=64,
                    qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=32,
                    num_nextn_predict_layers=0,
                    quantization_config=dict(quant_method="fp8", fmt="e4m3",
                                             activation_scheme="dynamic",
                                             weight_block_size=[128, 128])),
        storage="fp8", shards=1),
}


def hf_classes(config_dict):
    if config_dict["model_type"] == "deepseek_v3":
        return DeepseekV3Config, DeepseekV3ForCausalLM
    return DeepseekV2Config, DeepseekV2ForCausalLM


def hf_config(config_dict):
    config_cls, _ = hf_classes(config_dict)
    d = {k: v for k, v in config_dict.items() if k not in ("quantization_config", "torch_dtype")}
    config = config_cls(**d)
    scaling = config_dict.get("rope_scaling")
    params = getattr(config, "rope_parameters", None)
    if scaling and (not params or params.get("rope_type") != scaling["type"]):
        # Older/newer spellings: make sure yarn reached the rotary embedding.
        config.rope_parameters = dict(rope_type=scaling["type"], rope_theta=config_dict["rope_theta"],
                                      **{k: v for k, v in scaling.items() if k != "type"})
    print(f"rope parameters: {getattr(config, 'rope_parameters', None)}", flush=True)
    return config


def randomize(model, gen):
    """Non-trivial random weights: unit-scale activations, decisive routing, norms != 1."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            elif p.dim() >= 2:
                fan_in = p.shape[-1]
                scale = 2.0 if name.endswith("mlp.gate.weight") else 1.0
                p.copy_(torch.randn(p.shape, generator=gen) * scale / math.sqrt(fan_in))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                # Positive, so that masked-out experts (filled with 0 by some implementations,
                # -inf by others) can never outrank a kept one: both conventions agree.
                b.copy_(torch.rand(b.shape, generator=gen) * 0.3)


def hub_state_dict(model):
    """HF's in-memory names → hub names (per-expert tensors)."""
    out = {}
    for name, t in model.state_dict().items():
        t = t.detach().clone().contiguous()
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = t[e, :inter].contiguous()
                out[f"{prefix}{e}.up_proj.weight"] = t[e, inter:].contiguous()
        elif name.endswith("mlp.experts.down_proj") and t.dim() == 3:
            prefix = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = t[e].contiguous()
        elif "rotary_emb" in name:
            continue
        else:
            out[name] = t
    return out


def is_quantizable(name):
    if not name.endswith(".weight") or ".layers." not in name:
        return False
    if "norm" in name or name.endswith("mlp.gate.weight"):
        return False
    return "_proj" in name


def quantize_fp8_blocks(w, block=128):
    """Per 128x128 block: scale = amax / 448; returns (e4m3 weight, scale_inv, dequantized)."""
    rows, cols = w.shape
    nbr, nbc = (rows + block - 1) // block, (cols + block - 1) // block
    scale = torch.empty(nbr, nbc, dtype=torch.float32)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    deq = torch.empty(rows, cols, dtype=torch.float32)
    for i in range(nbr):
        for j in range(nbc):
            blk = w[i * block:(i + 1) * block, j * block:(j + 1) * block].float()
            s = blk.abs().max().clamp(min=1e-12) / 448.0
            qb = (blk / s).clamp(-448, 448).to(torch.float8_e4m3fn)
            scale[i, j] = s
            q[i * block:(i + 1) * block, j * block:(j + 1) * block] = qb
            deq[i * block:(i + 1) * block, j * block:(j + 1) * block] = qb.float() * s
    return q, scale, deq


def add_mtp_layer(hub, cfg, gen):
    """Random MTP module stored as layer num_hidden_layers (HF ignores it; our loader keeps it)."""
    n = cfg["num_hidden_layers"]
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    # A full decoder layer: copy the shapes of the last layer (an MoE layer) under the new index.
    last = f"model.layers.{n - 1}."
    for name in [k for k in hub if k.startswith(last)]:
        t = hub[name]
        new = torch.randn(t.shape, generator=gen) / math.sqrt(t.shape[-1]) if t.dim() >= 2 else \
            1.0 + 0.3 * torch.randn(t.shape, generator=gen)
        if name.endswith("e_score_correction_bias"):
            new = torch.rand(t.shape, generator=gen) * 0.3
        hub[f"model.layers.{n}." + name[len(last):]] = new.to(t.dtype)
    p = f"model.layers.{n}."
    hub[p + "enorm.weight"] = 1.0 + 0.3 * torch.randn(h, generator=gen)
    hub[p + "hnorm.weight"] = 1.0 + 0.3 * torch.randn(h, generator=gen)
    hub[p + "eh_proj.weight"] = torch.randn(h, 2 * h, generator=gen) / math.sqrt(2 * h)
    hub[p + "shared_head.norm.weight"] = 1.0 + 0.3 * torch.randn(h, generator=gen)
    hub[p + "shared_head.head.weight"] = torch.randn(v, h, generator=gen) / math.sqrt(h)
    hub[p + "embed_tokens.weight"] = torch.randn(v, h, generator=gen)


@torch.no_grad()
def last_logits(model, ids):
    return model(torch.tensor([ids]), use_cache=False).logits[0, -1].float()


@torch.no_grad()
def greedy_path(model, prompt_ids, num_tokens):
    """num_tokens greedy tokens after the prompt, each with its top-1/top-2 logit margin."""
    seq, greedy, margins = list(prompt_ids), [], []
    for _ in range(num_tokens):
        top = torch.topk(last_logits(model, seq), 2)
        greedy.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
        seq.append(greedy[-1])
    return greedy, margins


@torch.no_grad()
def reference_outputs(model, vocab_size, gen):
    prompts = []
    for i, n in enumerate(PROMPT_LENGTHS):
        ids = torch.randint(2, vocab_size, (n,), generator=gen).tolist()
        logits = last_logits(model, ids)
        top = torch.topk(logits, 5)
        greedy, margins = greedy_path(model, ids, NUM_GREEDY_TOKENS)
        prompts.append(dict(
            prompt_ids=ids,
            top5_ids=[int(x) for x in top.indices],
            top5_logits=[float(x) for x in top.values],
            last_logits=[round(float(x), 6) for x in logits],
            greedy_ids=greedy, greedy_margins=margins))
    return prompts


def write_checkpoint(out_dir, hub, cfg, shards):
    names = sorted(hub)
    if shards == 1:
        save_file({k: hub[k] for k in names}, os.path.join(out_dir, "model.safetensors"),
                  metadata={"format": "pt"})
        return
    weight_map = {}
    per = (len(names) + shards - 1) // shards
    for s in range(shards):
        part = names[s * per:(s + 1) * per]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: hub[k] for k in part}, os.path.join(out_dir, fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in part})
    total = sum(t.numel() * t.element_size() for t in hub.values())
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)


def make_fixture(name, spec, out_root, seed):
    cfg = spec["config"]
    out_dir = os.path.join(out_root, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    gen = torch.Generator().manual_seed(seed)
    _, model_cls = hf_classes(cfg)
    config = hf_config(cfg)
    config._attn_implementation = "eager"
    model = model_cls(config).float().eval()
    randomize(model, gen)

    hub = hub_state_dict(model)
    storage = spec["storage"]
    if storage == "fp8":
        deq_hub = {}
        for k in list(hub):
            if is_quantizable(k):
                q, s, deq = quantize_fp8_blocks(hub[k])
                hub[k] = q
                hub[k + "_scale_inv"] = s
                deq_hub[k] = deq
            elif k.endswith("e_score_correction_bias"):
                deq_hub[k] = hub[k]
            else:
                hub[k] = hub[k].to(torch.bfloat16)
                deq_hub[k] = hub[k].float()
        # The oracle computes with exactly the values the engine will see.
        inverse = {}
        for k, t in deq_hub.items():
            inverse[k] = t
        sd = model.state_dict()
        new_sd = {}
        for key in sd:
            if key.endswith("mlp.experts.gate_up_proj"):
                prefix = key[: -len("gate_up_proj")]
                n_exp = sd[key].shape[0]
                new_sd[key] = torch.stack([torch.cat([inverse[f"{prefix}{e}.gate_proj.weight"],
                                                      inverse[f"{prefix}{e}.up_proj.weight"]])
                                           for e in range(n_exp)])
            elif key.endswith("mlp.experts.down_proj") and sd[key].dim() == 3:
                prefix = key[: -len("down_proj")]
                new_sd[key] = torch.stack([inverse[f"{prefix}{e}.down_proj.weight"]
                                           for e in range(sd[key].shape[0])])
            elif key in inverse:
                new_sd[key] = inverse[key]
            else:
                new_sd[key] = sd[key]
        model.load_state_dict(new_sd)
    else:
        for k in hub:
            if not k.endswith("e_score_correction_bias"):  # real checkpoints keep it f32
                hub[k] = hub[k].to(storage)
        # Round the model to the stored precision so the oracle sees the stored values.
        model.load_state_dict({k: (v if k.endswith("e_score_correction_bias") else
                                   v.to(storage).float())
                               for k, v in model.state_dict().items()})

    if cfg.get("num_nextn_predict_layers", 0) > 0:
        add_mtp_layer(hub, cfg, gen)
        n = cfg["num_hidden_layers"]
        for k in hub:
            if k.startswith(f"model.layers.{n}.") and not k.endswith("e_score_correction_bias"):
                hub[k] = hub[k].to(torch.bfloat16 if storage == "fp8" else storage)

    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    write_checkpoint(out_dir, hub, cfg, spec["shards"])

    roundtrip = None
    if storage != "fp8":
        _, cls = hf_classes(cfg)
        loaded = cls.from_pretrained(out_dir, torch_dtype=torch.float32,
                                     attn_implementation="eager").eval()
        ids = torch.randint(2, cfg["vocab_size"], (1, 40), generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            a = model(ids, use_cache=False).logits
            b = loaded(ids, use_cache=False).logits
        roundtrip = float((a - b).abs().max())
        print(f"{name}: from_pretrained round-trip max |diff| = {roundtrip:.3e}", flush=True)
        if roundtrip > 1e-4:
            print(f"{name}: WARNING: the checkpoint on disk does not reproduce the model; "
                  "the reference comes from the in-memory model", flush=True)
        else:
            model = loaded

    prompts = reference_outputs(model, cfg["vocab_size"], gen)
    ref = dict(model=name, transformers_version=transformers.__version__,
               torch_version=torch.__version__, dtype="float32", attention="eager",
               roundtrip_max_abs_diff=roundtrip, num_greedy_tokens=NUM_GREEDY_TOKENS,
               prompts=prompts)
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(ref, f)
    min_margin = min(min(p["greedy_margins"]) for p in prompts)
    print(f"{name}: wrote {out_dir} (smallest greedy margin {min_margin:.2e})", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="directory to write fixtures into")
    ap.add_argument("--only", nargs="*", help="fixture names (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(min(16, os.cpu_count() or 1))
    torch.use_deterministic_algorithms(True)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}", flush=True)
    for i, (name, spec) in enumerate(FIXTURES.items()):
        if args.only and name not in args.only:
            continue
        make_fixture(name, spec, args.out, seed=1000 + i)
    return 0


if __name__ == "__main__":
    sys.exit(main())

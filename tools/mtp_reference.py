#!/usr/bin/env python3
"""Plain-function PyTorch reference of the DeepSeek-V3 forward, MTP module included.

It reads a hub-format model directory (config.json + model.safetensors, FP8 128x128 block
weights dequantised on load) and computes, for one sequence at a time, in float32:

  main_forward(w, cfg, ids)            -> logits [T, V], hidden [T, H] (after model.norm), routes
  mtp_forward(w, cfg, prev_hidden, next_ids, positions)
                                       -> logits [T, V], hidden [T, H] (before shared_head.norm)

MTP convention (the one vLLM and SGLang use when they serve V3 with its MTP layer):
slot i combines prev_hidden[i] = the main model's final hidden state of position i (after
model.norm) with the embedding of token i+1, sits at RoPE position i, and predicts token i+2:

  h = eh_proj(concat(enorm(embed(next_ids)), hnorm(prev_hidden)))
  h = decoder_layer[num_hidden_layers](h, positions)
  logits = shared_head.head(shared_head.norm(h))

The MTP layer has no embed_tokens of its own in models/demo: it uses model.embed_tokens.

Run as a script it writes the MTP fixture for the engine's tests:
  python3 tools/mtp_reference.py --model models/demo --out tests/data/demo_mtp_reference.json
"""
import argparse
import json
import math
import os

import torch
import torch.nn.functional as F


# ---------------------------------------------------------------- loading

def dequantize_fp8_block(weight, scale_inv, block=(128, 128)):
    """real = fp8 value x scale of its 128x128 block (scale_inv holds that scale)."""
    out_dim, in_dim = weight.shape
    w = weight.to(torch.float32)
    s = scale_inv.to(torch.float32)
    s = s.repeat_interleave(block[0], dim=0)[:out_dim]
    s = s.repeat_interleave(block[1], dim=1)[:, :in_dim]
    return w * s


def _e4m3_table():
    """float32 value of each of the 256 e4m3fn bit patterns (bias 7, no infinities)."""
    values = []
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        exp, man = (b >> 3) & 0xF, b & 0x7
        if exp == 0xF and man == 0x7:
            values.append(float("nan"))
        elif exp == 0:
            values.append(sign * man / 8.0 * 2.0 ** -6)
        else:
            values.append(sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7))
    return torch.tensor(values, dtype=torch.float32)


def read_safetensors(path):
    """Minimal reader (BF16, F16, F32, F8_E4M3) for machines without the safetensors
    package or a PyTorch with float8: FP8 tensors come back as float32 values."""
    import struct
    import numpy as np
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    base = 8 + header_len
    e4m3 = _e4m3_table()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = np.frombuffer(data[base + begin:base + end], dtype=np.uint8)
        shape, dt = info["shape"], info["dtype"]
        if dt == "F32":
            t = torch.from_numpy(raw.view(np.float32).copy())
        elif dt == "F16":
            t = torch.from_numpy(raw.view(np.float16).astype(np.float32))
        elif dt == "BF16":
            t = torch.from_numpy((raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32))
        elif dt == "F8_E4M3":
            t = e4m3[torch.from_numpy(raw.astype(np.int64))]
        else:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {dt}")
        out[name] = t.reshape(shape)
    return out


def load_model(model_dir, device="cpu"):
    """Returns (config dict, {name: float32 tensor}) with FP8 weights dequantised."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    path = os.path.join(model_dir, "model.safetensors")
    try:
        from safetensors.torch import load_file
        raw = load_file(path)
    except ImportError:
        raw = read_safetensors(path)
    return cfg, dequantize_state(raw, cfg, device)


def dequantize_state(raw, cfg, device="cpu"):
    block = tuple((cfg.get("quantization_config") or {}).get("weight_block_size", [128, 128]))
    weights = {}
    for name, t in raw.items():
        if name.endswith(".weight_scale_inv"):
            continue
        scale_name = name[: -len("weight")] + "weight_scale_inv" if name.endswith(".weight") else None
        if scale_name is not None and scale_name in raw:
            weights[name] = dequantize_fp8_block(t, raw[scale_name], block).to(device)
        else:
            weights[name] = t.to(torch.float32).to(device)
    return weights


# ---------------------------------------------------------------- building blocks

def rms_norm(x, weight, eps):
    x = x.to(torch.float32)
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_cos_sin(cfg, positions):
    dim = cfg["qk_rope_head_dim"]
    inv_freq = 1.0 / (cfg.get("rope_theta", 10000.0) **
                      (torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope_interleaved(x, cos, sin):
    """Rotates interleaved pairs (x0,x1),(x2,x3)...; the result is returned de-interleaved
    (evens then odds), which is what HF does: q and k get the same permutation, so q.k is the
    complex-multiplication result."""
    *lead, d = x.shape
    x = x.reshape(*lead, d // 2, 2).transpose(-1, -2).reshape(*lead, d)
    half = d // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def linear(w, name, x):
    return x @ w[name + ".weight"].t()


def attention(w, p, cfg, x, positions):
    t = x.shape[0]
    nh = cfg["num_attention_heads"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    eps = cfg["rms_norm_eps"]
    if cfg.get("q_lora_rank"):
        q = linear(w, p + "q_b_proj", rms_norm(linear(w, p + "q_a_proj", x),
                                                w[p + "q_a_layernorm.weight"], eps))
    else:
        q = linear(w, p + "q_proj", x)
    q = q.view(t, nh, nope + rope).transpose(0, 1)  # [nh, t, d]
    q_nope, q_rope = q[..., :nope], q[..., nope:]
    kv = linear(w, p + "kv_a_proj_with_mqa", x)
    c_kv, k_rope = kv[:, :cfg["kv_lora_rank"]], kv[:, cfg["kv_lora_rank"]:]
    kvb = linear(w, p + "kv_b_proj", rms_norm(c_kv, w[p + "kv_a_layernorm.weight"], eps))
    kvb = kvb.view(t, nh, nope + vd).transpose(0, 1)
    k_nope, v = kvb[..., :nope], kvb[..., nope:]
    cos, sin = rope_cos_sin(cfg, positions)
    q_rope = apply_rope_interleaved(q_rope, cos, sin)
    k_rope = apply_rope_interleaved(k_rope[None], cos, sin).expand(nh, t, rope)
    qf = torch.cat((q_nope, q_rope), dim=-1)
    kf = torch.cat((k_nope, k_rope), dim=-1)
    scale = (nope + rope) ** -0.5
    scores = (qf @ kf.transpose(-1, -2)) * scale
    mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    out = (probs @ v).transpose(0, 1).reshape(t, nh * vd)
    return linear(w, p + "o_proj", out)


def mlp(w, p, x):
    return linear(w, p + "down_proj", F.silu(linear(w, p + "gate_proj", x)) * linear(w, p + "up_proj", x))


def route(w, p, cfg, x):
    """noaux_tc gate. Returns (topk_idx [T,k], topk_weight [T,k], min choice score)."""
    e = cfg["n_routed_experts"]
    scores = torch.sigmoid(x.to(torch.float32) @ w[p + "gate.weight"].t())
    choice = scores + w[p + "gate.e_score_correction_bias"][None, :]
    ng, per = cfg["n_group"], e // cfg["n_group"]
    group_scores = choice.view(-1, ng, per).topk(2, dim=-1)[0].sum(-1)
    group_idx = group_scores.topk(cfg["topk_group"], dim=-1)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0)
    keep = group_mask[:, :, None].expand(-1, ng, per).reshape(-1, e).bool()
    # Experts outside the kept groups get 0.0, as HF transformers does.
    masked = choice.masked_fill(~keep, 0.0)
    idx = masked.topk(cfg["num_experts_per_tok"], dim=-1)[1]
    weight = scores.gather(1, idx)
    if cfg.get("norm_topk_prob", True):
        weight = weight / (weight.sum(-1, keepdim=True) + 1e-20)
    weight = weight * cfg["routed_scaling_factor"]
    min_kept = choice.masked_fill(~keep, float("inf")).min().item()
    return idx, weight, min_kept


def moe(w, p, cfg, x):
    idx, weight, min_kept = route(w, p, cfg, x)
    out = torch.zeros_like(x)
    for e in range(cfg["n_routed_experts"]):
        tok, slot = torch.where(idx == e)
        if tok.numel():
            y = mlp(w, f"{p}experts.{e}.", x[tok]) * weight[tok, slot][:, None]
            out.index_add_(0, tok, y)
    out = out + mlp(w, p + "shared_experts.", x)
    return out, idx, min_kept


def decoder_layer(w, cfg, layer, x, positions, routes=None):
    p = f"model.layers.{layer}."
    eps = cfg["rms_norm_eps"]
    x = x + attention(w, p + "self_attn.", cfg, rms_norm(x, w[p + "input_layernorm.weight"], eps), positions)
    h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
    if layer >= cfg["first_k_dense_replace"]:
        y, idx, min_kept = moe(w, p + "mlp.", cfg, h)
        if routes is not None:
            routes[layer] = (idx, min_kept)
    else:
        y = mlp(w, p + "mlp.", h)
    return x + y


# ---------------------------------------------------------------- whole model

def main_forward(w, cfg, ids, routes=None):
    """ids: 1-D LongTensor. Returns (logits [T,V], hidden after model.norm [T,H])."""
    positions = torch.arange(ids.shape[0], device=ids.device)
    x = w["model.embed_tokens.weight"][ids]
    for layer in range(cfg["num_hidden_layers"]):
        x = decoder_layer(w, cfg, layer, x, positions, routes)
    hidden = rms_norm(x, w["model.norm.weight"], cfg["rms_norm_eps"])
    return hidden @ w["lm_head.weight"].t(), hidden


def mtp_forward(w, cfg, prev_hidden, next_ids, positions, routes=None):
    """One MTP step over a sequence of slots (see the module docstring)."""
    layer = cfg["num_hidden_layers"]
    p = f"model.layers.{layer}."
    eps = cfg["rms_norm_eps"]
    embed = w.get(p + "embed_tokens.weight", w["model.embed_tokens.weight"])
    e = rms_norm(embed[next_ids], w[p + "enorm.weight"], eps)
    h = rms_norm(prev_hidden, w[p + "hnorm.weight"], eps)
    x = linear(w, p + "eh_proj", torch.cat((e, h), dim=-1))
    x = decoder_layer(w, cfg, layer, x, positions, routes)
    logits = rms_norm(x, w[p + "shared_head.norm.weight"], eps) @ w[p + "shared_head.head.weight"].t()
    return logits, x


def mtp_over_sequence(w, cfg, ids):
    """Teacher-forced main + MTP pass: returns (main logits, main hidden, mtp logits for
    slots 0..T-2, mtp hidden). mtp logits[i] predicts ids[i+2]."""
    logits, hidden = main_forward(w, cfg, ids)
    positions = torch.arange(ids.shape[0] - 1, device=ids.device)
    mtp_logits, mtp_hidden = mtp_forward(w, cfg, hidden[:-1], ids[1:], positions)
    return logits, hidden, mtp_logits, mtp_hidden


# ---------------------------------------------------------------- fixture

def _round(values, digits=6):
    return [round(float(v), digits) for v in values]


def make_fixture(w, cfg, sequences):
    """sequences: list of (name, ids list). Everything needed to test an MTP implementation
    without the main model: the main model's hidden states are included."""
    cases = []
    for name, ids in sequences:
        ids_t = torch.tensor(ids, dtype=torch.long, device=w["lm_head.weight"].device)
        logits, hidden, mtp_logits, mtp_hidden = mtp_over_sequence(w, cfg, ids_t)
        top5 = mtp_logits.topk(5, dim=-1)
        agree = (mtp_logits.argmax(-1)[:-1] == ids_t[2:]).float().mean().item() if len(ids) > 2 else 0.0
        cases.append({
            "name": name,
            "token_ids": ids,
            "mtp_positions": list(range(len(ids) - 1)),
            "prev_hidden": [_round(row) for row in hidden[:-1].cpu()],
            "main_argmax": logits.argmax(-1).cpu().tolist(),
            "mtp_argmax": mtp_logits.argmax(-1).cpu().tolist(),
            "mtp_top5_ids": top5.indices.cpu().tolist(),
            "mtp_top5_logits": [_round(r, 4) for r in top5.values.cpu()],
            "mtp_hidden_first8": [_round(r[:8]) for r in mtp_hidden.cpu()],
            "mtp_hidden_l2": _round(mtp_hidden.norm(dim=-1).cpu()),
            "mtp_top1_agreement_with_next_next": round(agree, 4),
        })
    return {
        "description": "DeepSeek-V3 MTP forward on models/demo, float32, FP8 weights dequantised. "
                       "Slot i: hnorm(prev_hidden[i]) (main model's hidden after model.norm at "
                       "position i) and enorm(embed(token_ids[i+1])), RoPE position i; "
                       "mtp logits[i] predict token_ids[i+2].",
        "generated_by": "tools/mtp_reference.py",
        "hidden_size": cfg["hidden_size"],
        "cases": cases,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/demo")
    ap.add_argument("--out", default="tests/data/demo_mtp_reference.json")
    ap.add_argument("--text", action="append", default=None, help="text to encode (repeatable)")
    args = ap.parse_args()
    from tokenizers import Tokenizer
    cfg, w = load_model(args.model)
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    texts = args.text or ["def add(a, b):\n    return a + b\n",
                          "<｜begin▁of▁sentence｜><｜User｜>What is the capital of France?<｜Assistant｜>"]
    seqs = [(f"text{i}", tok.encode(t).ids) for i, t in enumerate(texts)]
    with torch.no_grad():
        fixture = make_fixture(w, cfg, seqs)
    with open(args.out, "w") as f:
        json.dump(fixture, f, ensure_ascii=False)
    print(f"wrote {args.out}: {len(seqs)} sequences")


if __name__ == "__main__":
    main()

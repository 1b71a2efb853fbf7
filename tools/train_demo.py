#!/usr/bin/env python3
"""Trains, exports and documents models/demo: a small DeepSeek-V3-architecture model.

Stages (all in one run; see tools/README.md for the recipe):
  1. data: Python sources/docs that ship on the machine + synthetic chats (tools/demo_data.py)
  2. tokenizer: byte-level BPE trained with `tokenizers`, DeepSeek-V3's pre-tokenizer and
     special tokens, V3's chat_template
  3. training: MLA (q_lora), noaux_tc sigmoid gate with groups and e_score_correction_bias
     updated by the auxiliary-loss-free rule, shared expert, dense first layer, one MTP module
     trained with the MTP loss; bf16 autocast; stops after --train-seconds
  4. export: hub-format config.json + model.safetensors (FP8 e4m3 128x128 blocks for linear
     weights in the layers, bf16 embeddings/norms/head, fp32 correction bias)
  5. checks: HF transformers DeepseekV3ForCausalLM on the exported weights vs
     tools/mtp_reference.py (fp32 logits)
  6. fixtures: tests/data/demo_reference.json (HF greedy, no KV cache) and
     tests/data/demo_mtp_reference.json; model card numbers, loss.png

Resumable: --ckpt-out writes the weights, step and tokenizer; --resume continues from them
(the optimizer restarts with a short warm-up). --train-seconds 0 with --resume only exports.
"""
import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_data as dd  # noqa: E402
import mtp_reference as ref  # noqa: E402

try:
    import tokenizers  # noqa: F401
    HAVE_TOKENIZERS = True
except ImportError:
    HAVE_TOKENIZERS = False


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ================================================================== config

def make_config(args, vocab_size):
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": vocab_size,
        "hidden_size": args.hidden,
        "intermediate_size": args.dense_inter,
        "moe_intermediate_size": args.moe_inter,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.heads,
        "n_shared_experts": 1,
        "n_routed_experts": args.experts,
        "num_experts_per_tok": args.topk,
        "n_group": args.groups,
        "topk_group": args.topk_groups,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "q_lora_rank": args.q_lora,
        "kv_lora_rank": args.kv_lora,
        "qk_rope_head_dim": args.rope_dim,
        "qk_nope_head_dim": args.nope_dim,
        "v_head_dim": args.v_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "rms_norm_eps": 1e-6,
        "num_nextn_predict_layers": 1,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
        "use_cache": True,
        "torch_dtype": "bfloat16",
    }


# ================================================================== tokenizer

class ByteTokenizer:
    """Stand-in when `tokenizers` is missing (CPU smoke tests only): specials, then bytes."""

    def __init__(self):
        self.n_special = len(dd.SPECIAL_TOKENS)
        self.special = {t: i for i, t in enumerate(dd.SPECIAL_TOKENS)}

    def vocab_size(self):
        return self.n_special + 256

    def encode(self, text):
        import re
        ids = []
        pattern = "(" + "|".join(re.escape(t) for t in dd.SPECIAL_TOKENS) + ")"
        for part in re.split(pattern, text):
            if part in self.special:
                ids.append(self.special[part])
            elif part:
                ids.extend(self.n_special + b for b in part.encode("utf-8"))
        return ids

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]

    def decode(self, ids):
        out, buf = [], bytearray()
        for i in ids:
            if i < self.n_special:
                out.append(buf.decode("utf-8", "replace"))
                buf = bytearray()
                out.append(dd.SPECIAL_TOKENS[i])
            else:
                buf.append(i - self.n_special)
        out.append(buf.decode("utf-8", "replace"))
        return "".join(out)

    def to_json(self):
        return None


class BpeTokenizer:
    def __init__(self, tok):
        self.tok = tok

    def vocab_size(self):
        return self.tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text):
        return self.tok.encode(text).ids

    def encode_batch(self, texts):
        return [e.ids for e in self.tok.encode_batch(texts)]

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=False)

    def to_json(self):
        return self.tok.to_str()


def train_tokenizer(texts, real_tokenizer_json, vocab_size):
    """BPE over bytes with V3's pre-tokenizer; specials first (ids 0..15)."""
    from tokenizers import Tokenizer, Regex, models, pre_tokenizers, trainers, decoders
    with open(real_tokenizer_json) as f:
        real = json.load(f)
    pre = real["pre_tokenizer"]
    splits = [pre_tokenizers.Split(Regex(p["pattern"]["Regex"]), behavior="isolated", invert=False)
              for p in pre["pretokenizers"] if p["type"] == "Split"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=dd.SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  min_frequency=2, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    # Same JSON structure as V3's tokenizer.json for everything but the vocabulary, so the
    # engine's tokenizer treats both alike; added-token flags copied from V3 (R1 for think).
    data = json.loads(tok.to_str())
    for key in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        data[key] = real[key]
    real_flags = {a["content"]: a for a in real["added_tokens"]}
    for a in data["added_tokens"]:
        src = real_flags.get(a["content"])
        if src is not None:
            a["special"], a["normalized"] = src["special"], src["normalized"]
        else:  # <think>, </think>: plain added tokens in DeepSeek-R1
            a["special"], a["normalized"] = False, True
    return Tokenizer.from_str(json.dumps(data, ensure_ascii=False)), data


def write_tokenizer_files(out_dir, tok_json, real_config_json):
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(tok_json, f, ensure_ascii=False, separators=(",", ":"))
    with open(real_config_json) as f:
        real = json.load(f)
    cfg = {k: real[k] for k in ("add_bos_token", "add_eos_token", "bos_token", "clean_up_tokenization_spaces",
                                "eos_token", "legacy", "pad_token", "sp_model_kwargs", "unk_token",
                                "tokenizer_class") if k in real}
    cfg["pad_token"] = dict(real["pad_token"], content=dd.PAD) if isinstance(real.get("pad_token"), dict) else dd.PAD
    cfg["model_max_length"] = 4096
    cfg["chat_template"] = real["chat_template"]
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)


# ================================================================== model for training

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps))).to(x.dtype)


def lin(i, o):
    return nn.Linear(i, o, bias=False)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        nh, qk = c["num_attention_heads"], c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
        self.q_a_proj = lin(c["hidden_size"], c["q_lora_rank"])
        self.q_a_layernorm = RMSNorm(c["q_lora_rank"], c["rms_norm_eps"])
        self.q_b_proj = lin(c["q_lora_rank"], nh * qk)
        self.kv_a_proj_with_mqa = lin(c["hidden_size"], c["kv_lora_rank"] + c["qk_rope_head_dim"])
        self.kv_a_layernorm = RMSNorm(c["kv_lora_rank"], c["rms_norm_eps"])
        self.kv_b_proj = lin(c["kv_lora_rank"], nh * (c["qk_nope_head_dim"] + c["v_head_dim"]))
        self.o_proj = lin(nh * c["v_head_dim"], c["hidden_size"])

    def forward(self, x, cos, sin):
        c = self.c
        b, t, _ = x.shape
        nh, nope, rope, vd = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(b, t, nh, nope + rope).transpose(1, 2)
        kv = self.kv_a_proj_with_mqa(x)
        c_kv, k_rope = kv.split([c["kv_lora_rank"], rope], dim=-1)
        kvb = self.kv_b_proj(self.kv_a_layernorm(c_kv)).view(b, t, nh, nope + vd).transpose(1, 2)
        k_nope, v = kvb.split([nope, vd], dim=-1)
        q_rope = ref.apply_rope_interleaved(q[..., nope:], cos, sin)
        k_rope = ref.apply_rope_interleaved(k_rope.reshape(b, 1, t, rope), cos, sin).expand(b, nh, t, rope)
        qf = torch.cat((q[..., :nope], q_rope.to(q.dtype)), dim=-1)
        kf = torch.cat((k_nope, k_rope.to(k_nope.dtype)), dim=-1)
        # The default scale, 1/sqrt(q head dim) = (nope + rope)^-0.5, is V3's (no YaRN here).
        if hasattr(F, "scaled_dot_product_attention"):
            out = F.scaled_dot_product_attention(qf, kf, v, is_causal=True)
        else:  # older PyTorch (CPU smoke tests)
            s = (qf @ kf.transpose(-1, -2)) * (nope + rope) ** -0.5
            s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
            out = torch.softmax(s.float(), dim=-1).to(v.dtype) @ v
        return self.o_proj(out.transpose(1, 2).reshape(b, t, nh * vd))


class MLP(nn.Module):
    def __init__(self, h, i):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = lin(h, i), lin(h, i), lin(i, h)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    """Routed experts computed densely (all experts, then weighted by a combine matrix that is
    zero outside each token's top-k): the same function as the sparse form, and fast for 16
    tiny experts. The correction bias only steers selection and is not trained by gradients."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        e, h, i = c["n_routed_experts"], c["hidden_size"], c["moe_intermediate_size"]
        self.gate_weight = nn.Parameter(torch.randn(e, h) * 0.02)
        self.register_buffer("bias", torch.zeros(e))
        self.w_gate = nn.Parameter(torch.randn(e, i, h) * 0.02)
        self.w_up = nn.Parameter(torch.randn(e, i, h) * 0.02)
        self.w_down = nn.Parameter(torch.randn(e, h, i) * 0.02)
        self.shared = MLP(h, i * c["n_shared_experts"])

    def route(self, x):
        c = self.c
        e, ng = c["n_routed_experts"], c["n_group"]
        scores = torch.sigmoid(x.float() @ self.gate_weight.float().t())
        with torch.no_grad():
            choice = scores + self.bias[None]
            gs = choice.view(-1, ng, e // ng).topk(2, dim=-1)[0].sum(-1)
            gidx = gs.topk(c["topk_group"], dim=-1)[1]
            gmask = torch.zeros_like(gs).scatter_(1, gidx, 1.0)
            keep = gmask[:, :, None].expand(-1, ng, e // ng).reshape(-1, e).bool()
            idx = choice.masked_fill(~keep, 0.0).topk(c["num_experts_per_tok"], dim=-1)[1]
        w = scores.gather(1, idx)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * c["routed_scaling_factor"]
        return idx, w

    def forward(self, x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        e, i = self.c["n_routed_experts"], self.c["moe_intermediate_size"]
        idx, w = self.route(x2)
        combine = torch.zeros(x2.shape[0], e, device=x.device, dtype=w.dtype).scatter(1, idx, w)
        g = F.silu(x2 @ self.w_gate.reshape(e * i, -1).t().to(x2.dtype)) * (x2 @ self.w_up.reshape(e * i, -1).t().to(x2.dtype))
        g = (g.view(-1, e, i) * combine[:, :, None].to(g.dtype)).reshape(-1, e * i)
        y = g @ self.w_down.permute(1, 0, 2).reshape(shape[-1], e * i).t().to(g.dtype)
        load = torch.bincount(idx.flatten(), minlength=e)
        return (y + self.shared(x2)).view(shape), load


class Layer(nn.Module):
    def __init__(self, c, moe):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MoE(c) if moe else MLP(c["hidden_size"], c["intermediate_size"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        y = self.mlp(self.post_attention_layernorm(x))
        if isinstance(y, tuple):
            return x + y[0], y[1]
        return x + y, None


class DemoV3(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        h, eps = c["hidden_size"], c["rms_norm_eps"]
        self.embed_tokens = nn.Embedding(c["vocab_size"], h)
        self.layers = nn.ModuleList([Layer(c, l >= c["first_k_dense_replace"]) for l in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(h, eps)
        self.lm_head = lin(h, c["vocab_size"])
        # MTP module; it shares embed_tokens and lm_head with the main model (V3 paper).
        self.enorm, self.hnorm = RMSNorm(h, eps), RMSNorm(h, eps)
        self.eh_proj = lin(2 * h, h)
        self.mtp_layer = Layer(c, True)
        self.shared_head_norm = RMSNorm(h, eps)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def rope(self, t, device):
        return ref.rope_cos_sin(self.c, torch.arange(t, device=device))

    def forward(self, ids):
        b, t = ids.shape
        cos, sin = self.rope(t, ids.device)
        x = self.embed_tokens(ids)
        loads = []
        for layer in self.layers:
            x, load = layer(x, cos, sin)
            if load is not None:
                loads.append(load)
        hidden = self.norm(x)
        logits = self.lm_head(hidden)
        cos2, sin2 = cos[:t - 1], sin[:t - 1]
        m = self.eh_proj(torch.cat((self.enorm(self.embed_tokens(ids[:, 1:])), self.hnorm(hidden[:, :-1])), dim=-1))
        m, load = self.mtp_layer(m, cos2, sin2)
        loads.append(load)
        mtp_logits = self.lm_head(self.shared_head_norm(m))
        return logits, mtp_logits, loads

    def moe_layers(self):
        return [l.mlp for l in self.layers if isinstance(l.mlp, MoE)] + [self.mtp_layer.mlp]


# ================================================================== data

def build_data(args, renderer):
    t0 = time.time()
    roots = [args.text_root] if args.text_root else None
    train_docs, held_docs = dd.collect_text_files(args.text_bytes, roots)
    snippets = dd.extract_functions(train_docs, 3000)
    held_snippets = dd.extract_functions(held_docs, 300)
    chats = dd.ChatFactory(renderer, snippets, seed=1).samples(args.num_chats)
    held_chats = dd.ChatFactory(renderer, held_snippets, seed=999).samples(max(200, args.num_chats // 50))
    log(f"data: {len(train_docs)} train files, {len(held_docs)} held-out files, "
        f"{sum(len(t) for _, t in train_docs) / 1e6:.1f} MB text, {len(chats)} chats, "
        f"{len(snippets)} code snippets ({time.time() - t0:.1f}s)")
    return train_docs, held_docs, chats, held_chats


def encode_stream(tok, docs, chats, rng):
    """Packs documents (all tokens trained; half get a BOS) and chats (only replies trained)
    into (ids, mask) streams."""
    import numpy as np
    text_ids = tok.encode_batch([t for _, t in docs])
    tids, tmask = [], []
    for ids in text_ids:
        if rng.random() < 0.5:
            ids = [0] + ids
        tids.extend(ids)
        tmask.extend([1] * len(ids))
    flat = [seg for chat in chats for seg in chat]
    seg_ids = tok.encode_batch([s for s, _ in flat])
    cids, cmask = [], []
    for ids, (_, trained) in zip(seg_ids, flat):
        cids.extend(ids)
        cmask.extend([1 if trained else 0] * len(ids))
    return (np.array(tids, dtype=np.int32), np.array(tmask, dtype=np.uint8),
            np.array(cids, dtype=np.int32), np.array(cmask, dtype=np.uint8))


def batch_from(stream_ids, stream_mask, n, t, gen, device):
    starts = torch.randint(0, len(stream_ids) - t - 2, (n,), generator=gen)
    ids = torch.stack([torch.from_numpy(stream_ids[s:s + t + 1].astype("int64")) for s in starts.tolist()])
    mask = torch.stack([torch.from_numpy(stream_mask[s:s + t + 1].astype("float32")) for s in starts.tolist()])
    return ids.to(device, non_blocking=True), mask.to(device, non_blocking=True)


def losses(model, ids, mask):
    logits, mtp_logits, loads = model(ids)
    v = logits.shape[-1]
    main = F.cross_entropy(logits[:, :-1].reshape(-1, v).float(), ids[:, 1:].reshape(-1), reduction="none")
    m1 = mask[:, 1:].reshape(-1)
    main = (main * m1).sum() / m1.sum().clamp(min=1)
    mtp = F.cross_entropy(mtp_logits[:, :-1].reshape(-1, v).float(), ids[:, 2:].reshape(-1), reduction="none")
    m2 = mask[:, 2:].reshape(-1)
    mtp = (mtp * m2).sum() / m2.sum().clamp(min=1)
    return main, mtp, loads


# ================================================================== export

def quantize_fp8_block(w, block=128):
    """Per 128x128 block: scale = amax / 448, stored as weight_scale_inv (real = fp8 x scale)."""
    out_dim, in_dim = w.shape
    nb_o, nb_i = math.ceil(out_dim / block), math.ceil(in_dim / block)
    padded = torch.zeros(nb_o * block, nb_i * block, dtype=torch.float32, device=w.device)
    padded[:out_dim, :in_dim] = w.float()
    blocks = padded.view(nb_o, block, nb_i, block)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12)
    # Along an axis that is not a multiple of 128 and spans several blocks, every block gets
    # the same scale: then DeepSeek's reading (128-wide blocks, the last one partial) and
    # HF transformers' (the axis split evenly over the scale grid, e.g. 192 = 2 x 96) agree.
    if out_dim % block and nb_o > 1:
        amax = amax.amax(dim=0, keepdim=True).expand(nb_o, nb_i)
    if in_dim % block and nb_i > 1:
        amax = amax.amax(dim=1, keepdim=True).expand(nb_o, nb_i)
    scale = amax / 448.0
    q = (blocks / scale[:, None, :, None]).view(nb_o * block, nb_i * block)[:out_dim, :in_dim]
    return q.to(torch.float8_e4m3fn).contiguous(), scale.contiguous()


def hub_state(model, fp8):
    """Trained module -> {hub name: tensor} with per-expert names; MTP at index L."""
    c = model.c
    L = c["num_hidden_layers"]
    st = {}

    def put_linear(name, w):
        w = w.detach().float().cpu()
        if fp8:
            q, s = quantize_fp8_block(w)
            st[name + ".weight"], st[name + ".weight_scale_inv"] = q, s
        else:
            st[name + ".weight"] = w.to(torch.bfloat16)

    def put(name, t, dtype=torch.bfloat16):
        st[name] = t.detach().float().cpu().to(dtype).contiguous()

    def put_layer(p, layer):
        put(p + "input_layernorm.weight", layer.input_layernorm.weight)
        put(p + "post_attention_layernorm.weight", layer.post_attention_layernorm.weight)
        a = layer.self_attn
        for n in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"):
            put_linear(p + "self_attn." + n, getattr(a, n).weight)
        put(p + "self_attn.q_a_layernorm.weight", a.q_a_layernorm.weight)
        put(p + "self_attn.kv_a_layernorm.weight", a.kv_a_layernorm.weight)
        m = layer.mlp
        if isinstance(m, MoE):
            put(p + "mlp.gate.weight", m.gate_weight)
            put(p + "mlp.gate.e_score_correction_bias", m.bias, torch.float32)
            for e in range(c["n_routed_experts"]):
                put_linear(f"{p}mlp.experts.{e}.gate_proj", m.w_gate[e])
                put_linear(f"{p}mlp.experts.{e}.up_proj", m.w_up[e])
                put_linear(f"{p}mlp.experts.{e}.down_proj", m.w_down[e])
            for n in ("gate_proj", "up_proj", "down_proj"):
                put_linear(p + "mlp.shared_experts." + n, getattr(m.shared, n).weight)
        else:
            for n in ("gate_proj", "up_proj", "down_proj"):
                put_linear(p + "mlp." + n, getattr(m, n).weight)

    put("model.embed_tokens.weight", model.embed_tokens.weight)
    for l, layer in enumerate(model.layers):
        put_layer(f"model.layers.{l}.", layer)
    put("model.norm.weight", model.norm.weight)
    put("lm_head.weight", model.lm_head.weight)
    p = f"model.layers.{L}."
    put_layer(p, model.mtp_layer)
    put(p + "enorm.weight", model.enorm.weight)
    put(p + "hnorm.weight", model.hnorm.weight)
    put_linear(p + "eh_proj", model.eh_proj.weight)
    put(p + "shared_head.norm.weight", model.shared_head_norm.weight)
    put(p + "shared_head.head.weight", model.lm_head.weight)
    return st


def export(model, out_dir, cfg, fp8):
    from safetensors.torch import save_file
    st = hub_state(model, fp8)
    cfg = dict(cfg)
    if fp8:
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": [128, 128]}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_file(st, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": 1, "do_sample": True, "temperature": 0.6,
                   "top_p": 0.95}, f, indent=2)
    return cfg, st


# ================================================================== evaluation on the export

@torch.no_grad()
def evaluate_export(w, cfg, streams, seq_len, num_seqs, device):
    """Held-out loss (main, MTP), top-1 accuracies and expert loads, with the reference
    forward on the exported (dequantised) weights."""
    res = {}
    E = cfg["n_routed_experts"]
    moe_layers = list(range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"] + 1))
    loads = {l: torch.zeros(E, dtype=torch.long) for l in moe_layers}
    min_choice = float("inf")
    for name, (ids_np, mask_np) in streams.items():
        tot = {"main": 0.0, "mtp": 0.0, "n1": 0.0, "n2": 0.0, "acc1": 0.0, "acc2": 0.0}
        step = max(seq_len, (len(ids_np) - seq_len - 1) // max(1, num_seqs))
        for s in range(0, len(ids_np) - seq_len - 1, step)[:num_seqs]:
            ids = torch.from_numpy(ids_np[s:s + seq_len].astype("int64")).to(device)
            mask = torch.from_numpy(mask_np[s:s + seq_len].astype("float32")).to(device)
            routes = {}
            logits, hidden = ref.main_forward(w, cfg, ids, routes)
            mtp_logits, _ = ref.mtp_forward(w, cfg, hidden[:-1], ids[1:], torch.arange(len(ids) - 1, device=device),
                                            routes)
            for l, (idx, mk) in routes.items():
                loads[l] += torch.bincount(idx.flatten().cpu(), minlength=E)
                min_choice = min(min_choice, mk)
            m1, m2 = mask[1:], mask[2:]
            tot["main"] += (F.cross_entropy(logits[:-1], ids[1:], reduction="none") * m1).sum().item()
            tot["acc1"] += ((logits[:-1].argmax(-1) == ids[1:]).float() * m1).sum().item()
            tot["n1"] += m1.sum().item()
            tot["mtp"] += (F.cross_entropy(mtp_logits[:-1], ids[2:], reduction="none") * m2).sum().item()
            tot["acc2"] += ((mtp_logits[:-1].argmax(-1) == ids[2:]).float() * m2).sum().item()
            tot["n2"] += m2.sum().item()
        res[name] = {"main_loss": tot["main"] / max(1, tot["n1"]), "mtp_loss": tot["mtp"] / max(1, tot["n2"]),
                     "main_top1": tot["acc1"] / max(1, tot["n1"]), "mtp_top1_next_next": tot["acc2"] / max(1, tot["n2"]),
                     "tokens": int(tot["n1"])}
    res["expert_load"] = {str(l): loads[l].tolist() for l in moe_layers}
    res["expert_skew_max_over_mean"] = {str(l): (loads[l].max() / loads[l].float().mean()).item() for l in moe_layers}
    res["min_choice_score_in_kept_groups"] = min_choice
    return res


@torch.no_grad()
def greedy_ref(w, cfg, ids, n, stop_id=None):
    out = list(ids)
    for _ in range(n):
        logits, _ = ref.main_forward(w, cfg, torch.tensor(out, device=w["lm_head.weight"].device))
        nxt = int(logits[-1].argmax())
        out.append(nxt)
        if nxt == stop_id:
            break
    return out[len(ids):]


# ================================================================== HF check and fixture

def hf_load(out_dir, cfg, st_fp32, device):
    """Loads HF DeepseekV3ForCausalLM from a dequantised float32 copy of the export."""
    import tempfile
    from safetensors.torch import save_file
    from transformers import DeepseekV3ForCausalLM
    tmp = tempfile.mkdtemp()
    c = {k: v for k, v in cfg.items() if k != "quantization_config"}
    c["torch_dtype"] = "float32"
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(c, f)
    save_file({k: v.cpu().contiguous() for k, v in st_fp32.items()}, os.path.join(tmp, "model.safetensors"))
    model = DeepseekV3ForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager")
    return model.to(device).eval()


@torch.no_grad()
def hf_fixture(hf, prompts, tok, n_steps=24):
    cases = []
    for name, text, ids in prompts:
        cur = list(ids)
        greedy, margins, top1 = [], [], []
        last_top5 = None
        for step in range(n_steps):
            logits = hf(input_ids=torch.tensor([cur], device=hf.device), use_cache=False).logits[0, -1].float()
            top = logits.topk(5)
            if step == 0:
                last_top5 = {"ids": top.indices.tolist(), "logits": [round(v, 5) for v in top.values.tolist()]}
            nxt = int(top.indices[0])
            greedy.append(nxt)
            margins.append(round(float(top.values[0] - top.values[1]), 5))
            top1.append(round(float(top.values[0]), 5))
            cur.append(nxt)
        cases.append({"name": name, "prompt_text": text, "prompt_ids": ids, "greedy_ids": greedy,
                      "greedy_text": tok.decode(greedy), "step_top1_logit": top1,
                      "step_margin_top1_top2": margins, "last_prompt_position_top5": last_top5})
    return cases


def fixture_prompts(renderer, tok):
    chats = [
        ("chat_capital", [{"role": "user", "content": "What is the capital of France?"}]),
        ("chat_think", [{"role": "user", "content": "What is 37 + 45? Think step by step."}]),
        ("chat_tool", [{"role": "system", "content": dd.tools_system_prompt(dd.TOOLS)},
                       {"role": "user", "content": "What is the weather in Paris?"}]),
        ("chat_multiturn", [{"role": "user", "content": "Hello"},
                            {"role": "assistant", "content": "Hello! How can I help you today?"},
                            {"role": "user", "content": "Who are you?"}]),
    ]
    out = []
    for name, msgs in chats:
        text = renderer.render(msgs, True)
        out.append((name, text, tok.encode(text)))
    tool_msgs = [{"role": "user", "content": "What is the weather in Oslo?"},
                 {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {
                     "name": "get_weather", "arguments": json.dumps({"city": "Oslo", "unit": "celsius"})}}]},
                 {"role": "tool", "content": json.dumps({"city": "Oslo", "temperature": 4, "unit": "celsius",
                                                         "condition": "snowy"})}]
    text = renderer.render(tool_msgs, True)
    out.append(("chat_tool_result", text, tok.encode(text)))
    for name, text in (("text_code", "def fibonacci(n):\n"), ("text_import", "import numpy as np\n\n")):
        out.append((name, text, tok.encode(text)))
    return out


# ================================================================== card

def plot_loss(history, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=90)
    steps = [h["step"] for h in history]
    ax.plot(steps, [h["main"] for h in history], label="main (train)")
    ax.plot(steps, [h["mtp"] for h in history], label="MTP next-next (train)")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


# ================================================================== main

def main():
    ap = argparse.ArgumentParser(description="train and export models/demo")
    ap.add_argument("--out", required=True, help="output folder (model dir, fixtures, card stats)")
    ap.add_argument("--tokenizer-src", required=True, help="folder with DeepSeek-V3 tokenizer.json/config")
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--hidden", type=int, default=192)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--q-lora", type=int, default=96)
    ap.add_argument("--kv-lora", type=int, default=64)
    ap.add_argument("--rope-dim", type=int, default=32)
    ap.add_argument("--nope-dim", type=int, default=32)
    ap.add_argument("--v-dim", type=int, default=32)
    ap.add_argument("--dense-inter", type=int, default=256)
    ap.add_argument("--moe-inter", type=int, default=48)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--topk-groups", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--bias-rate", type=float, default=1e-3, help="aux-loss-free bias update speed")
    ap.add_argument("--train-seconds", type=float, default=360)
    ap.add_argument("--max-steps", type=int, default=10 ** 9)
    ap.add_argument("--text-bytes", type=int, default=40_000_000)
    ap.add_argument("--text-root", default=None)
    ap.add_argument("--num-chats", type=int, default=200_000)
    ap.add_argument("--chat-fraction", type=float, default=0.5, help="share of batch rows from chats")
    ap.add_argument("--eval-seqs", type=int, default=64)
    ap.add_argument("--no-fp8", action="store_true")
    ap.add_argument("--resume", default=None)
    ap.add_argument("--ckpt-out", default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    t_start = time.time()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model_dir = os.path.join(args.out, "demo")
    data_dir = os.path.join(args.out, "data")
    os.makedirs(model_dir, exist_ok=True)
    os.makedirs(data_dir, exist_ok=True)
    with open(os.path.join(args.tokenizer_src, "tokenizer_config.json")) as f:
        chat_template = json.load(f)["chat_template"]
    renderer = dd.ChatRenderer(chat_template)

    ckpt = torch.load(args.resume, map_location="cpu") if args.resume else None
    train_docs, held_docs, chats, held_chats = build_data(args, renderer)

    # ---- tokenizer
    t0 = time.time()
    tok_json = None
    if ckpt is not None and ckpt.get("tokenizer_json") and HAVE_TOKENIZERS:
        from tokenizers import Tokenizer
        tok = BpeTokenizer(Tokenizer.from_str(ckpt["tokenizer_json"]))
        tok_json = json.loads(ckpt["tokenizer_json"])
    elif HAVE_TOKENIZERS:
        def corpus():
            seen = 0
            for _, t in train_docs:
                yield t
                seen += len(t)
                if seen > 40_000_000:  # enough for 8k merges; keeps this stage short
                    break
            for chat in chats[:40000]:
                text = "".join(s for s, _ in chat)
                for sp in dd.SPECIAL_TOKENS:
                    text = text.replace(sp, "\n")
                yield text
        raw_tok, tok_json = train_tokenizer(corpus(), os.path.join(args.tokenizer_src, "tokenizer.json"), args.vocab)
        tok = BpeTokenizer(raw_tok)
    else:
        log("tokenizers not installed: byte-level stand-in (smoke test only)")
        tok = ByteTokenizer()
    vocab_size = max(args.vocab, tok.vocab_size()) if tok_json else tok.vocab_size()
    log(f"tokenizer: {tok.vocab_size()} entries, model vocab {vocab_size} ({time.time() - t0:.1f}s)")
    for sp in dd.SPECIAL_TOKENS:
        assert tok.encode(sp) == [dd.SPECIAL_TOKENS.index(sp)], sp

    # ---- token streams
    t0 = time.time()
    tr_t, tr_tm, tr_c, tr_cm = encode_stream(tok, train_docs, chats, rng)
    ho_t, ho_tm, ho_c, ho_cm = encode_stream(tok, held_docs, held_chats, random.Random(7))
    log(f"tokens: train text {len(tr_t) / 1e6:.1f}M, train chat {len(tr_c) / 1e6:.1f}M "
        f"({tr_cm.mean() * 100:.0f}% trained), held-out text {len(ho_t) / 1e6:.2f}M, chat {len(ho_c) / 1e6:.2f}M "
        f"({time.time() - t0:.1f}s)")

    # ---- model
    cfg = make_config(args, vocab_size)
    model = DemoV3(cfg).to(device)
    history, step = [], 0
    if ckpt is not None:
        model.load_state_dict({k: v.float() for k, v in ckpt["model"].items()})
        history, step = ckpt["history"], ckpt["step"]
        log(f"resumed at step {step}")
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f}M parameters (lm_head shared with the MTP head)")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(args.seed + step)
    n_chat = int(round(args.batch * args.chat_fraction))
    warmup = 200 if ckpt is None else 50
    t_train = time.time()
    first_step = step
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)
    model.train()
    while args.train_seconds > 0 and step - first_step < args.max_steps:
        frac = (time.time() - t_train) / args.train_seconds
        if frac >= 1.0:
            break
        lr = args.lr * min(1.0, (step - first_step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        ids_t, m_t = batch_from(tr_t, tr_tm, args.batch - n_chat, args.seq_len, gen, device)
        ids_c, m_c = batch_from(tr_c, tr_cm, n_chat, args.seq_len, gen, device)
        ids, mask = torch.cat((ids_t, ids_c)), torch.cat((m_t, m_c))
        with amp:
            main_loss, mtp_loss, loads = losses(model, ids, mask)
            loss = main_loss + args.mtp_weight * mtp_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        # Auxiliary-loss-free balancing: raise the bias of under-loaded experts, lower the
        # bias of over-loaded ones, by a fixed step.
        with torch.no_grad():
            for moe, load in zip(model.moe_layers(), loads):
                load = load.float()
                moe.bias += args.bias_rate * torch.sign(load.mean() - load)
                # A common shift changes no routing decision; keeping the smallest bias at 0
                # keeps every choice score positive, so masking non-selected groups with 0.0
                # (HF) or with -inf (DeepSeek's code) selects the same experts.
                moe.bias -= moe.bias.min()
        step += 1
        if step % 25 == 0 or step == first_step + 1:
            skew = [(l.max().float() / l.float().mean()).item() for l in loads]
            history.append({"step": step, "main": main_loss.item(), "mtp": mtp_loss.item(), "lr": lr,
                            "skew": [round(s, 3) for s in skew], "t": round(time.time() - t_train, 1)})
            if step % 250 == 0 or step == first_step + 1:
                log(f"step {step} main {main_loss.item():.3f} mtp {mtp_loss.item():.3f} lr {lr:.2e} "
                    f"skew {' '.join(f'{s:.2f}' for s in skew)} ({time.time() - t_train:.0f}s)")
    train_time = time.time() - t_train
    tokens_per_s = (step - first_step) * args.batch * args.seq_len / max(train_time, 1e-9)
    log(f"trained {step - first_step} steps in {train_time:.0f}s ({tokens_per_s / 1e3:.0f}k tokens/s); total step {step}")
    if args.ckpt_out:
        # bf16 copies of the matrices keep the checkpoint under the 16 MiB a file may be.
        state = {k: (v.to(torch.bfloat16) if v.dim() >= 2 else v) for k, v in model.state_dict().items()}
        torch.save({"model": state, "step": step, "history": history, "config": cfg,
                    "tokenizer_json": tok.to_json()}, args.ckpt_out)
        log(f"checkpoint: {args.ckpt_out}")
    model.eval()

    stats = {"steps": step, "train_seconds_this_run": round(train_time, 1), "tokens_per_s": round(tokens_per_s),
             "batch": args.batch, "seq_len": args.seq_len, "params": n_params,
             "train_tokens_text": int(len(tr_t)), "train_tokens_chat": int(len(tr_c)),
             "heldout_tokens_text": int(len(ho_t)), "heldout_tokens_chat": int(len(ho_c)),
             "num_train_files": len(train_docs), "num_heldout_files": len(held_docs), "num_chats": len(chats),
             "history_tail": history[-3:]}

    # Held-out loss of the trained float32 module (before export rounding), for comparison.
    with torch.no_grad():
        for name, (s_ids, s_mask) in {"text": (ho_t, ho_tm), "chat": (ho_c, ho_cm)}.items():
            if len(s_ids) > 4 * args.seq_len:
                ids, mask = batch_from(s_ids, s_mask, 16, args.seq_len, torch.Generator().manual_seed(5), device)
                with amp:
                    mainl, mtpl, _ = losses(model, ids, mask)
                stats[f"trained_module_heldout_{name}_loss_16seqs"] = [mainl.item(), mtpl.item()]
                log(f"trained module (bf16 autocast), held-out {name}: main {mainl.item():.3f} mtp {mtpl.item():.3f}")

    if tok_json is None or not hasattr(torch, "float8_e4m3fn") or args.no_fp8:
        if tok_json is None:
            log("no BPE tokenizer: stopping before export (smoke test)")
            json.dump(stats, open(os.path.join(args.out, "stats.json"), "w"), indent=2)
            return
    # ---- export
    fp8 = not args.no_fp8
    write_tokenizer_files(model_dir, tok_json, os.path.join(args.tokenizer_src, "tokenizer_config.json"))
    cfg_out, st = export(model, model_dir, cfg, fp8)
    sizes = {f: os.path.getsize(os.path.join(model_dir, f)) for f in os.listdir(model_dir)}
    log(f"export: {sizes} total {sum(sizes.values()) / 1e6:.2f} MB")
    stats["export_bytes"] = sizes
    w = ref.dequantize_state(st, cfg_out, device)

    # ---- evaluation on the exported weights
    t0 = time.time()
    ev = evaluate_export(w, cfg_out, {"text": (ho_t, ho_tm), "chat": (ho_c, ho_cm)}, args.seq_len, args.eval_seqs, device)
    stats["heldout"] = ev
    log(f"held-out (exported weights): {json.dumps({k: v for k, v in ev.items() if k != 'expert_load'})} "
        f"({time.time() - t0:.0f}s)")
    plot_loss(history, os.path.join(model_dir, "loss.png"))

    # ---- HF transformers check
    prompts = fixture_prompts(renderer, tok)
    try:
        hf = hf_load(model_dir, cfg_out, w, device)
        import transformers
        diffs = []
        for name, _, ids in prompts:
            x = torch.tensor(ids, device=device)
            with torch.no_grad():
                a = hf(input_ids=x[None], use_cache=False).logits[0].float()
                b, _ = ref.main_forward(w, cfg_out, x)
            diffs.append((a - b).abs().max().item())
        with torch.no_grad():
            tm, _, _ = model(torch.tensor([prompts[0][2]], device=device))
        stats["hf_check"] = {"transformers": transformers.__version__, "max_abs_logit_diff": max(diffs),
                             "per_prompt": diffs}
        log(f"HF check: max |logit diff| {max(diffs):.3e} over {len(prompts)} prompts")
        cases = hf_fixture(hf, prompts, tok)
        fixture = {"description": "HF transformers DeepseekV3ForCausalLM, float32, eager attention, FP8 weights "
                                  "dequantised; greedy continuation recomputed from scratch each step "
                                  "(no KV cache). Margins are top1 - top2 logits at each step.",
                   "generated_by": "tools/train_demo.py", "transformers": transformers.__version__,
                   "torch": torch.__version__, "model": "models/demo", "cases": cases}
        with open(os.path.join(data_dir, "demo_reference.json"), "w") as f:
            json.dump(fixture, f, ensure_ascii=False, indent=1)
        # The same greedy ids from the plain reference, as a third opinion.
        agree = []
        for case in cases:
            g = greedy_ref(w, cfg_out, case["prompt_ids"], len(case["greedy_ids"]))
            agree.append(g == case["greedy_ids"])
        stats["reference_greedy_matches_hf"] = agree
        log(f"plain reference greedy == HF greedy: {agree}")
        try:  # HF loading the FP8 directory itself, dequantising on load
            from transformers import DeepseekV3ForCausalLM, FineGrainedFP8Config
            hf8 = DeepseekV3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                        quantization_config=FineGrainedFP8Config(dequantize=True),
                                                        attn_implementation="eager").to(device).eval()
            x = torch.tensor(prompts[0][2], device=device)
            with torch.no_grad():
                d = (hf8(input_ids=x[None], use_cache=False).logits[0].float() - ref.main_forward(w, cfg_out, x)[0]).abs().max().item()
            # Diagnostic: the same reference with every dequantised matrix rounded to bf16.
            wb = {k: (v.to(torch.bfloat16).float() if v.dim() == 2 else v) for k, v in w.items()}
            with torch.no_grad():
                d16 = (hf8(input_ids=x[None], use_cache=False).logits[0].float() - ref.main_forward(wb, cfg_out, x)[0]).abs().max().item()
            stats["hf_fp8_dir_max_abs_logit_diff"] = d
            stats["hf_fp8_dir_vs_bf16_rounded_reference"] = d16
            stats["hf_fp8_dir_param_dtypes"] = sorted({str(p.dtype) for p in hf8.parameters()})
            log(f"HF on the FP8 directory (dequantize=True): max |logit diff| {d:.3e}; vs bf16-rounded "
                f"reference {d16:.3e}; parameter dtypes {stats['hf_fp8_dir_param_dtypes']}")
        except Exception as e:  # noqa: BLE001 - informative only
            stats["hf_fp8_dir_error"] = repr(e)[:300]
            log(f"HF on the FP8 directory failed: {e!r}"[:300])
        try:
            from transformers import AutoTokenizer
            at = AutoTokenizer.from_pretrained(model_dir)
            same = [at.encode(t, add_special_tokens=False) == ids for _, t, ids in prompts]
            stats["hf_autotokenizer_same_ids"] = same
            log(f"HF AutoTokenizer ids identical: {same}")
        except Exception as e:  # noqa: BLE001
            stats["hf_autotokenizer_error"] = repr(e)[:300]
    except ImportError as e:
        log(f"transformers missing, HF check skipped: {e}")

    # ---- MTP fixture
    mtp_seqs = [("code", tok.encode("def add(a, b):\n    return a + b\n")),
                ("chat", prompts[0][2] + tok.encode("The capital of France is Paris." + dd.EOS))]
    with torch.no_grad():
        mtp_fix = ref.make_fixture(w, cfg_out, mtp_seqs)
    with open(os.path.join(data_dir, "demo_mtp_reference.json"), "w") as f:
        json.dump(mtp_fix, f, ensure_ascii=False)
    with open(os.path.join(data_dir, "demo_expert_load.json"), "w") as f:
        json.dump({"description": "Tokens routed to each expert per MoE layer (MTP layer last) over held-out "
                                  "text and chats, exported models/demo, noaux_tc routing with the bias.",
                   "generated_by": "tools/train_demo.py", "load": ev["expert_load"]}, f, indent=1)

    # ---- sample chats for the card (plain reference, greedy, up to 80 tokens)
    samples = []
    for q in ["What is the capital of Japan?", "What is 12 + 30?", "Who are you?", "What is the weather in Oslo?",
              "Write a Python function that reverses a string.", "What is 23 + 19? Think step by step.",
              "Calculate 1234 * 56."]:
        ids = tok.encode(renderer.render([{"role": "user", "content": q}], True))
        out = greedy_ref(w, cfg_out, ids, 80, stop_id=1)
        samples.append({"user": q, "reply": tok.decode(out)})
    tool_msgs = [{"role": "user", "content": "What is the weather in Oslo?"},
                 {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {
                     "name": "get_weather", "arguments": json.dumps({"city": "Oslo", "unit": "celsius"})}}]},
                 {"role": "tool", "content": json.dumps({"city": "Oslo", "temperature": 4, "unit": "celsius",
                                                         "condition": "snowy"})}]
    ids = tok.encode(renderer.render(tool_msgs, True))
    samples.append({"user": "(after the get_weather result for Oslo)", "reply": tok.decode(greedy_ref(w, cfg_out, ids, 60, stop_id=1))})
    calc_msgs = [{"role": "user", "content": "Calculate 1234 * 56."},
                 {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {
                     "name": "calculator", "arguments": json.dumps({"expression": "1234 * 56"})}}]},
                 {"role": "tool", "content": json.dumps({"result": 69104})}]
    ids = tok.encode(renderer.render(calc_msgs, True))
    samples.append({"user": "(after the calculator result 69104)", "reply": tok.decode(greedy_ref(w, cfg_out, ids, 60, stop_id=1))})
    stats["samples"] = samples
    for s in samples:
        log(f"sample: {s['user']!r} -> {s['reply']!r}")
    stats["total_seconds"] = round(time.time() - t_start, 1)
    stats["config"] = cfg_out
    with open(os.path.join(args.out, "stats.json"), "w") as f:
        json.dump(stats, f, indent=2, ensure_ascii=False)
    with open(os.path.join(args.out, "history.json"), "w") as f:
        json.dump(history, f)
    log(f"done in {time.time() - t_start:.0f}s")


if __name__ == "__main__":
    main()

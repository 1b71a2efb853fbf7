#!/usr/bin/env python3
"""A model directory for serving benchmarks with random weights: a config.json (e.g.
bench/configs/v2_lite/config.json) and a byte-level tokenizer that gives text for every id of
the config's vocabulary (up to 242,444 ids), so that `dsinfer serve --dummy-weights --model
DIR` streams text for each generated token and `dsinfer bench-serve` times every token.

The tokenizer: DeepSeek's special tokens at ids 0..14 (BOS 0, EOS 1, as DeepSeek-V3's config
says), the 256 ByteLevel byte tokens at 16..271, then words of two and three letters or digits
up to the vocabulary size. No merges: text prompts take the byte tokens, and a generated id
decodes to its word. The chat template is DeepSeek-V3's (tests/data/templates/deepseek_v3.jinja).
The answers are noise, since the weights are random.

Usage: tools/serving_model_dir.py CONFIG_JSON OUT_DIR
Plain Python 3.
"""
import itertools
import json
import os
import shutil
import string
import sys

SPECIALS = [
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>",
    "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>",
]
USAGE = "usage: tools/serving_model_dir.py CONFIG_JSON OUT_DIR"
FIRST_BYTE_ID = 16
MAX_VOCAB = FIRST_BYTE_ID + 256 + 62 ** 2 + 62 ** 3


def byte_level_chars():
    """GPT-2's printable stand-ins for the 256 bytes, as ByteLevel uses them."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, extra = [], 256
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(extra))
            extra += 1
    return chars


def tokenizer(vocab_size):
    chars = byte_level_chars()
    vocab = {ch: FIRST_BYTE_ID + b for b, ch in enumerate(chars)}
    # Words of letters and digits (printable bytes stand for themselves), so that generated text
    # is readable UTF-8: 3,844 of two characters, then 238,328 of three.
    alnum = string.ascii_letters + string.digits
    words = itertools.chain((a + b for a in alnum for b in alnum),
                            (a + b + c for a in alnum for b in alnum for c in alnum))
    for token_id, word in zip(range(FIRST_BYTE_ID + 256, vocab_size), words):
        vocab[word] = token_id
    added = [{"id": i, "content": s, "special": True, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False} for i, s in enumerate(SPECIALS)]
    return {
        "version": "1.0",
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": []},
    }


def main(argv):
    if len(argv) != 3:
        print(USAGE, file=sys.stderr)
        return 2
    config_path, out_dir = argv[1], argv[2]
    with open(config_path) as f:
        config = json.load(f)
    vocab_size = int(config.get("vocab_size", 0))
    if not FIRST_BYTE_ID + 256 <= vocab_size <= MAX_VOCAB:
        print(f"error: {config_path}: vocab_size {vocab_size} is outside [{FIRST_BYTE_ID + 256}, {MAX_VOCAB}] (the "
              "special and byte tokens, then words of up to three letters or digits)", file=sys.stderr)
        return 2
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(repo, "tests/data/templates/deepseek_v3.jinja")) as f:
        template = f.read()
    os.makedirs(out_dir, exist_ok=True)
    shutil.copyfile(config_path, os.path.join(out_dir, "config.json"))
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(tokenizer(vocab_size), f, ensure_ascii=False)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": SPECIALS[0], "eos_token": SPECIALS[1], "add_bos_token": True,
                   "chat_template": template}, f, ensure_ascii=False)
    print(f"{out_dir}: config {config_path}, tokenizer of {vocab_size} ids")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

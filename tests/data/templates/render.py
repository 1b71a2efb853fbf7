#!/usr/bin/env python3
"""Renders DeepSeek chat templates with jinja2 the way HF transformers does (sandboxed
environment, trim_blocks, lstrip_blocks). The oracle of the prompt-renderer test.

usage: render.py TEMPLATE_DIR IN.jsonl OUT.jsonl
Each input line: {"family": "v3"|"v31"|"r1", "messages": [...], "add_generation_prompt": bool,
"thinking": bool, "bos_token": str, "eos_token": str}. Each output line: the prompt as a JSON string.
"""
import json
import sys

from jinja2.sandbox import ImmutableSandboxedEnvironment

FILES = {"v3": "deepseek_v3.jinja", "v31": "deepseek_v31.jinja", "r1": "deepseek_r1.jinja"}


def main():
    template_dir, in_path, out_path = sys.argv[1:4]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    templates = {}
    for family, name in FILES.items():
        with open(f"{template_dir}/{name}", encoding="utf-8") as f:
            templates[family] = env.from_string(f.read())
    with open(in_path, encoding="utf-8") as fin, open(out_path, "w", encoding="utf-8") as fout:
        for line in fin:
            case = json.loads(line)
            prompt = templates[case["family"]].render(
                messages=case["messages"],
                add_generation_prompt=case["add_generation_prompt"],
                thinking=case["thinking"],
                bos_token=case["bos_token"],
                eos_token=case["eos_token"],
            )
            fout.write(json.dumps(prompt, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()

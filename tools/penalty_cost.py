#!/usr/bin/env python3
"""What penalised sampling costs a served batch: 200 requests at once to a running `dsinfer serve`
(/v1/completions, 1,000 random prompt ids each, 100 greedy tokens, ignore_eos), plain and with
each penalty in turn, several rounds, the plain runs of the same call as the peer.

A penalised request keeps the engine one step at a time (its next choice needs the token the
step in flight is choosing), and each step carries its penalties to the device: a repetition
penalty one change per distinct prompt token. Request i of every run has the same prompt, so
after the warm-up the prompts come from the prefix cache and the runs time mostly decode.

Usage (on the GPU machine, with a server as tools/gpu_check.sh starts one: random weights, the
model served as `bench`, VOCAB its vocabulary size):
  tools/penalty_cost.py PORT VOCAB [ROUNDS]
"""
import json
import random
import statistics
import sys
import threading
import time
import urllib.request

NUM_REQUESTS, PROMPT_TOKENS, OUTPUT_TOKENS, MIN_PROMPT_ID = 200, 1000, 100, 300
VARIANTS = [("plain", {}), ("presence_penalty 0.5", {"presence_penalty": 0.5}),
            ("repetition_penalty 1.1", {"repetition_penalty": 1.1})]


def one_request(port, vocab, extra, seed, done):
    rng = random.Random(seed)
    body = {"model": "bench", "prompt": [rng.randrange(MIN_PROMPT_ID, vocab) for _ in range(PROMPT_TOKENS)],
            "max_tokens": OUTPUT_TOKENS, "ignore_eos": True, "temperature": 0}
    body.update(extra)
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        done.append(json.loads(r.read())["usage"]["completion_tokens"])


def run(port, vocab, name, extra):
    """Requests per second of one run of every request at once."""
    done = []
    threads = [threading.Thread(target=one_request, args=(port, vocab, extra, i, done)) for i in range(NUM_REQUESTS)]
    start = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.time() - start
    print(f"{name}: {len(done)} ok, {sum(done)} tokens, {seconds:.2f} s, {len(done) / seconds:.2f} req/s", flush=True)
    return len(done) / seconds


def main():
    port, vocab = int(sys.argv[1]), int(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    run(port, vocab, "warm-up", {})
    rates = {name: [] for name, _ in VARIANTS}
    for _ in range(rounds):
        for name, extra in VARIANTS:
            rates[name].append(run(port, vocab, name, extra))
    plain = statistics.median(rates["plain"])
    print("\n| sampling | median req/s | of plain |\n|---|---:|---:|")
    for name, _ in VARIANTS:
        rate = statistics.median(rates[name])
        print(f"| {name} | {rate:.2f} | {rate / plain:.3f} |")


if __name__ == "__main__":
    main()

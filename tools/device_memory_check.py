#!/usr/bin/env python3
"""The server's device memory on a GPU, end to end, with `dsinfer serve --dummy-weights` on a
model directory from tools/serving_model_dir.py:

1. By default the KV cache takes what 0.9 of the GPU's memory leaves after the weights and the
   largest step: the server logs the sizes, and a request is answered.
2. With a KV cache given by hand that leaves the device 512 MiB, a prompt of 16k tokens runs
   out of device memory in its prefill step. The engine lowers its step token budget and runs
   the prompt again in smaller chunks: the request is answered (200), the server logs the new
   budget, stays healthy, answers a short request, and /metrics counts the failed steps and
   shows the lowered budget.

Prints one line per check (ok / FAILED) and exits non-zero when a check fails.

Usage: tools/device_memory_check.py DSINFER_BINARY MODEL_DIR [LOG_DIR]
(MODEL_DIR from tools/serving_model_dir.py.) Plain Python 3.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

USAGE = "usage: tools/device_memory_check.py DSINFER_BINARY MODEL_DIR [LOG_DIR]"
SIZES = re.compile(r"KV cache of ([\d.]+) GiB: [\d.]+ of the device's ([\d.]+) GiB, less ([\d.]+) GiB in use "
                   r"after a step of (\d+) tokens \(([\d.]+) GiB before it\)")
SLACK_MIB = 512


class Server:
    def __init__(self, binary, model_dir, log_path, extra):
        self.log_path = log_path
        self.log = open(log_path, "w")
        args = [binary, "serve", "--backend", "cuda", "--dummy-weights", "--model", model_dir,
                "--served-model-name", "m", "--port", "0", "--no-kv-store"] + extra
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 300
        self.port = None
        while time.time() < deadline and self.proc.poll() is None:
            text = self.text()
            m = re.search(r"listening on http://[^:]+:(\d+)", text)
            if m and "ready" in text:
                self.port = int(m.group(1))
                break
            time.sleep(0.2)
        if self.port is None:
            self.stop()
            raise RuntimeError("the server did not start:\n" + self.text()[-3000:])

    def text(self):
        with open(self.log_path) as f:
            return f.read()

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def chat(self, content, max_tokens):
        body = {"model": "m", "temperature": 0, "max_tokens": max_tokens, "ignore_eos": True,
                "messages": [{"role": "user", "content": content}]}
        return request(self.url("/v1/chat/completions"), json.dumps(body).encode())

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            code = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.log.close()
        return code


def request(url, data=None):
    """(HTTP status, body text)."""
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(server, name):
    for line in request(server.url("/metrics"))[1].splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def main(argv):
    if len(argv) not in (3, 4):
        print(USAGE, file=sys.stderr)
        return 2
    binary, model_dir = argv[1], argv[2]
    log_dir = argv[3] if len(argv) == 4 else tempfile.mkdtemp()
    os.makedirs(log_dir, exist_ok=True)
    failures = []

    def check(ok, what):
        print(("ok      " if ok else "FAILED  ") + what, flush=True)
        if not ok:
            failures.append(what)

    server = Server(binary, model_dir, os.path.join(log_dir, "memory_default.log"), [])
    m = SIZES.search(server.text())
    check(m is not None, "the KV cache is sized to the device: " + (m.group(0) if m else "no sizing line"))
    status, _ = server.chat("Hello there", 8)
    check(status == 200, "a request on the sized cache: HTTP %d" % status)
    check(server.stop() == 0, "the server stops cleanly")
    if m is None:
        return 1
    total_gib, before_gib = float(m.group(2)), float(m.group(5))

    kv_mib = int((total_gib - before_gib) * 1024) - SLACK_MIB
    server = Server(binary, model_dir, os.path.join(log_dir, "memory_full.log"),
                    ["--kv-cache-mb", str(kv_mib), "--max-batched-tokens", "16384"])
    status, body = server.chat("a" * 16000, 4)
    check(status == 200, "a 16k-token prompt with %d MiB of the device left: HTTP %d %s"
          % (SLACK_MIB, status, body[:300]))
    lowered = re.findall(r"a step of (\d+) tokens ran out of memory \((.*?)\); steps now take at most (\d+) tokens",
                         server.text())
    check(len(lowered) >= 1 and "cannot allocate" in lowered[0][1],
          "the engine lowered its step budget: " + "; ".join("%s -> %s tokens" % (m[0], m[2]) for m in lowered))
    status, _ = request(server.url("/health"))
    check(status == 200, "/health after the failed steps: HTTP %d" % status)
    status, body = server.chat("Hello there", 8)
    check(status == 200, "a short request after it: HTTP %d %s" % (status, body[:200]))
    failed_steps = metric(server, "dsinfer_engine_failed_steps_total")
    budget = metric(server, "dsinfer_engine_step_token_budget")
    check(failed_steps == len(lowered) and budget is not None and budget < 16384,
          "/metrics: %s failed steps, step token budget %s" % (failed_steps, budget))
    check(server.stop() == 0, "the server stops cleanly")
    print("device memory check: %s" % ("passed" if not failures else "%d failed" % len(failures)))
    return 0 if not failures else 1


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except RuntimeError as e:
        print("FAILED  " + str(e))
        sys.exit(1)

// Starts `dsinfer serve` on a free loopback port and stops it with SIGTERM.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const binary = process.env.DSINFER_BINARY ?? path.join(here, '../../build/dsinfer');

// env: variables added to the server's environment (e.g. DSINFER_INJECT_FAULTS).
export async function startServer(extraArgs = [], env = {}) {
  const engine = extraArgs.includes('--engine') ? [] : ['--engine', 'echo'];
  // Tests never share the user's KV store (~/.cache/dsinfer/kv): a test that wants a store
  // names its own directory with --kv-store.
  const store = extraArgs.includes('--kv-store') ? [] : ['--no-kv-store'];
  const args = ['serve', ...engine, '--port', '0', ...store, ...extraArgs];
  const child = spawn(binary, args, { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, ...env } });
  let log = '';
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start:\n${log}`)), 20000);
    child.stderr.on('data', (chunk) => {
      log += chunk.toString();
      const m = log.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m && log.includes('ready')) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    child.on('exit', () => reject(new Error(`server exited:\n${log}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  return {
    port,
    base,
    child,
    log: () => log,
    exited,
    async stop() {
      if (child.exitCode === null) child.kill('SIGTERM');
      return exited;
    },
  };
}

// Parses the Prometheus text into {name{labels}: value}.
export async function metrics(base) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return out;
}

export async function waitFor(predicate, timeoutMs = 10000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await predicate()) return true;
    await new Promise((r) => setTimeout(r, 20));
  }
  return false;
}

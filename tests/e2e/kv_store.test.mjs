// Two `dsinfer serve` processes on one KV store directory: a long prompt answered by the first
// is a store hit on the second (its usage reports the cached tokens), /metrics shows the store
// tier, and the answers are the same.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { startServer } from './server.mjs';

const demoDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../models/demo');
const haveDemo = fs.existsSync(path.join(demoDir, 'model.safetensors'));

test('a prompt served by one process is a block-store hit on another', { skip: !haveDemo }, async () => {
  const storeDir = fs.mkdtempSync(path.join(os.tmpdir(), 'dsinfer-kv-e2e-'));
  const args = ['--engine', 'model', '--model', demoDir, '--served-model-name', 'demo', '--kv-store', storeDir];
  // A long system prompt: several 128-token store units.
  const system = Array.from({ length: 60 }, (_, i) => `Rule ${i}: answer briefly and politely.`).join('\n');
  const body = { model: 'demo', temperature: 0, max_tokens: 12,
    messages: [{ role: 'system', content: system }, { role: 'user', content: 'What is the capital of France?' }] };
  const first = await startServer(args);
  let a;
  try {
    const client = new OpenAI({ baseURL: `${first.base}/v1`, apiKey: 'x', maxRetries: 0 });
    a = await client.chat.completions.create(body, { headers: { 'x-dsinfer-traffic-class': 'agent' } });
    assert.equal(a.usage.prompt_tokens_details.cached_tokens, 0);
    assert.ok(a.usage.prompt_tokens > 512, `prompt of ${a.usage.prompt_tokens} tokens`);
  } finally {
    assert.equal((await first.stop()).code, 0);
  }
  assert.ok(fs.readdirSync(storeDir, { recursive: true }).length > 0, 'the first process wrote store objects');

  const second = await startServer(args);
  try {
    const client = new OpenAI({ baseURL: `${second.base}/v1`, apiKey: 'x', maxRetries: 0 });
    const b = await client.chat.completions.create(body);
    assert.ok(b.usage.prompt_tokens_details.cached_tokens >= 512,
      `second process cached ${b.usage.prompt_tokens_details.cached_tokens} of ${b.usage.prompt_tokens}`);
    assert.equal(b.usage.prompt_cache_hit_tokens, b.usage.prompt_tokens_details.cached_tokens);
    assert.equal(b.choices[0].message.content, a.choices[0].message.content);
    const metrics = await (await fetch(`${second.base}/metrics`)).text();
    const storeLine = metrics.split('\n').find((l) => l.startsWith('dsinfer_kv_prompt_tokens_total{tier="store"}'));
    assert.ok(storeLine && Number(storeLine.split(' ').pop()) >= 512, `metrics: ${storeLine}`);
    // A bad traffic class is the caller's error.
    const bad = await fetch(`${second.base}/v1/chat/completions`, { method: 'POST',
      headers: { 'content-type': 'application/json', 'x-dsinfer-traffic-class': 'forever' }, body: JSON.stringify(body) });
    assert.equal(bad.status, 400);
  } finally {
    assert.equal((await second.stop()).code, 0);
    fs.rmSync(storeDir, { recursive: true, force: true });
  }
});

// Engine failures through the official clients. A step whose launch fails (out of device memory)
// and cannot be split ends its requests with a 503 (a stream with an error event), one that can
// runs again in smaller steps, and the server goes on serving; a failure that ends the engine
// answers its requests, then /health and every new request, with 503.
// The failures are made by DSINFER_INJECT_FAULTS (src/core/fault_injection.h).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import OpenAI from 'openai';
import { startServer, metrics } from './server.mjs';
import { makeTinyModelDir } from './tiny_model.mjs';

const dir = makeTinyModelDir();
after(() => fs.rmSync(dir, { recursive: true, force: true }));

const engineArgs = ['--engine', 'model', '--model', dir, '--served-model-name', 'tiny', '--kv-cache-mb', '16'];
const body = {
  model: 'tiny', temperature: 0, max_tokens: 8, ignore_eos: true, messages: [{ role: 'user', content: 'Hello' }],
};

// Runs fn(server, client) on a server whose engine fails as `faults` says; the server must then
// stop cleanly.
async function withFaults(faults, fn) {
  const server = await startServer(engineArgs, { DSINFER_INJECT_FAULTS: faults });
  try {
    await fn(server, new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'x', maxRetries: 0 }));
  } finally {
    assert.equal((await server.stop()).code, 0);
  }
}

test('a failed step ends its request with 503 and the server serves on', async () => {
  // One request at a time on the cpu backend: step 1 is the first request's prompt, step 2 its
  // first decode step (fails); step 3 the second's prompt, step 4 its first decode step (fails).
  await withFaults('forward:2,forward:4', async (server, client) => {
    await assert.rejects(client.chat.completions.create(body), (e) => {
      assert.equal(e.status, 503);
      assert.match(e.message, /could not run a step with this request: injected fault at forward/);
      return true;
    });

    let chunks = 0;
    await assert.rejects(async () => {
      const stream = await client.chat.completions.create({ ...body, stream: true });
      for await (const chunk of stream) chunks += chunk.choices.length;
    }, (e) => {
      assert.match(e.message, /injected fault at forward/);
      return true;
    });
    assert.ok(chunks >= 1, 'the stream had begun (200, its first chunks) before the failed step');

    const ok = await client.chat.completions.create(body);
    assert.equal(ok.choices[0].finish_reason, 'length');
    assert.equal(ok.usage.completion_tokens, 8);
    assert.equal((await fetch(`${server.base}/health`)).status, 200);
    const m = await metrics(server.base);
    assert.equal(m.dsinfer_engine_failed_steps_total, 2);
    assert.equal(m.dsinfer_kv_blocks_used, 0, 'the failed requests gave their blocks back');
  });
});

test('a prompt whose step runs out of memory is answered in smaller steps', async () => {
  await withFaults('forward:1', async (server, client) => {
    const long = { ...body, messages: [{ role: 'user', content: 'x'.repeat(200) }] };
    const answer = await client.chat.completions.create(long);
    assert.equal(answer.choices[0].finish_reason, 'length');
    assert.equal(answer.usage.completion_tokens, 8);
    const m = await metrics(server.base);
    assert.equal(m.dsinfer_engine_failed_steps_total, 1);
    assert.equal(m.dsinfer_engine_step_token_budget, Math.floor(answer.usage.prompt_tokens / 2),
      'steps take at most half the failed step');
    assert.match(server.log(), /steps now take at most \d+ tokens/);
  });
});

test('an engine that fails answers 503 on /health and to every request, and still shuts down', async () => {
  await withFaults('engine_step:2', async (server, client) => {
    await assert.rejects(client.chat.completions.create(body), (e) => {
      assert.equal(e.status, 503);
      assert.match(e.message, /the engine failed: injected fault at engine_step/);
      return true;
    });
    const health = await fetch(`${server.base}/health`);
    assert.equal(health.status, 503);
    const h = await health.json();
    assert.equal(h.status, 'engine_failed');
    assert.match(h.message, /injected fault/);
    await assert.rejects(client.chat.completions.create(body), (e) => e.status === 503);
  });
});

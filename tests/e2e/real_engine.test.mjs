// `dsinfer serve` with the real engine core on a tiny random-weight model: the official clients
// get well-formed answers (whatever the noise says), usage adds up, cancellation frees blocks.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, metrics, waitFor } from './server.mjs';
import { makeTinyModelDir } from './tiny_model.mjs';

let server;
let dir;
before(async () => {
  dir = makeTinyModelDir();
  server = await startServer(['--engine', 'model', '--model', dir, '--served-model-name', 'tiny', '--kv-cache-mb', '16']);
});
after(async () => {
  assert.equal((await server.stop()).code, 0);
  fs.rmSync(dir, { recursive: true, force: true });
});

test('chat completion with the real engine: greedy, seeded, usage consistent', async () => {
  const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'x', maxRetries: 0 });
  const body = { model: 'tiny', temperature: 0, max_tokens: 12, messages: [{ role: 'user', content: 'Hello' }] };
  const a = await client.chat.completions.create(body);
  const b = await client.chat.completions.create(body);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content, 'greedy decoding is deterministic');
  assert.ok(['stop', 'length'].includes(a.choices[0].finish_reason));
  assert.ok(a.usage.completion_tokens >= 1 && a.usage.completion_tokens <= 12);
  assert.ok(a.usage.prompt_tokens > 5);
  // The same prompt again: the prefix cache may serve part of it, and the usage says how much.
  assert.ok(b.usage.prompt_tokens_details.cached_tokens >= 0);
  assert.equal(b.usage.prompt_cache_hit_tokens + b.usage.prompt_cache_miss_tokens, b.usage.prompt_tokens);

  let streamed = '';
  const stream = await client.chat.completions.create({ ...body, stream: true });
  for await (const chunk of stream) streamed += chunk.choices[0]?.delta?.content ?? '';
  assert.equal(streamed, a.choices[0].message.content, 'streamed and whole answers agree');

  // Three answers of a dozen tokens at most: steps counted, none of them replayed (the CPU
  // backend records no steps).
  const m = await metrics(server.base);
  assert.ok(m.dsinfer_engine_steps_total >= 3, `engine steps: ${m.dsinfer_engine_steps_total}`);
  assert.equal(m.dsinfer_engine_replayed_steps_total, 0);
});

test('responses and messages with the real engine', async () => {
  const openai = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'x', maxRetries: 0 });
  const r = await openai.responses.create({ model: 'tiny', input: 'Hi', max_output_tokens: 8, temperature: 0 });
  assert.ok(['completed', 'incomplete'].includes(r.status));
  assert.ok(r.usage.output_tokens >= 1);
  const anthropic = new Anthropic({ baseURL: server.base, apiKey: 'x', maxRetries: 0 });
  const m = await anthropic.messages.stream({ model: 'tiny', max_tokens: 8, temperature: 0, messages: [{ role: 'user', content: 'Hi' }] }).finalMessage();
  assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason));
  assert.ok(m.usage.output_tokens >= 1);
});

test('prompt + max_tokens over the model context is 400 context_length_exceeded', async () => {
  const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'x', maxRetries: 0 });
  await assert.rejects(client.chat.completions.create({ model: 'tiny', max_tokens: 100000, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e.status === 400 && e.code === 'context_length_exceeded');
});

test('a hung-up stream is cancelled and its KV blocks return', async (t) => {
  // A server of its own whose engine steps take 20 ms each (a slow device): the 200 tokens then
  // take seconds, so the hang-up surely comes while the request runs. (At full speed the tiny
  // model streams them in about 30 ms, and a client slowed by a busy machine hung up too late.)
  const slowed = await startServer(['--engine', 'model', '--model', dir, '--served-model-name', 'tiny',
    '--kv-cache-mb', '16'], { DSINFER_INJECT_FAULTS: 'engine_step:slow=20' });
  t.after(async () => assert.equal((await slowed.stop()).code, 0));
  const baseline = (await metrics(slowed.base)).dsinfer_kv_blocks_used;
  const controller = new AbortController();
  const client = new OpenAI({ baseURL: `${slowed.base}/v1`, apiKey: 'x', maxRetries: 0 });
  const stream = await client.chat.completions.create({
    model: 'tiny', stream: true, max_tokens: 200, messages: [{ role: 'user', content: 'Tell me a long story' }],
    ignore_eos: true,
  }, { signal: controller.signal });
  let chunks = 0;
  let usedWhileRunning = 0;
  try {
    for await (const _ of stream) {
      if (++chunks === 5) {
        usedWhileRunning = (await metrics(slowed.base)).dsinfer_kv_blocks_used;
        controller.abort();
      }
    }
  } catch (e) {
    assert.ok(e.name === 'AbortError' || /abort/i.test(String(e)), String(e));
  }
  assert.ok(usedWhileRunning > 0);
  assert.ok(await waitFor(async () => {
    const m = await metrics(slowed.base);
    return m.dsinfer_engine_running_requests === 0 && m.dsinfer_requests_cancelled_total >= 1 &&
      m.dsinfer_kv_blocks_used <= baseline;
  }), 'the request was cancelled and its blocks returned');
  assert.ok(usedWhileRunning > baseline);
});

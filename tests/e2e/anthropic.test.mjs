// The official `@anthropic-ai/sdk` client against `dsinfer serve`: Messages, streaming and not,
// tools, thinking, stop sequences, errors; under /v1/messages and /anthropic/v1/messages.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { startServer } from './server.mjs';

let server;
let client;
before(async () => {
  server = await startServer(['--api-key', 'ak']);
  client = new Anthropic({ baseURL: server.base, apiKey: 'ak', maxRetries: 0 });
});
after(async () => {
  const { code } = await server.stop();
  assert.equal(code, 0);
});

const tools = [{ name: 'get_weather', description: 'weather', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }];

test('message, not streamed', async () => {
  const m = await client.messages.create({ model: 'echo', max_tokens: 100, system: 'terse', messages: [{ role: 'user', content: 'Hello there' }] });
  assert.equal(m.type, 'message');
  assert.equal(m.content[0].type, 'text');
  assert.equal(m.content[0].text, 'Hello there');
  assert.equal(m.stop_reason, 'end_turn');
  assert.equal(m.usage.cache_read_input_tokens, 0);
  assert.ok(m.usage.input_tokens > 0 && m.usage.output_tokens > 0);
});

test('message, streamed, with thinking', async () => {
  const stream = client.messages.stream({
    model: 'echo', max_tokens: 100, thinking: { type: 'enabled', budget_tokens: 50 },
    messages: [{ role: 'user', content: '<think>reasoning</think>The answer' }],
  });
  let text = '';
  stream.on('text', (t) => { text += t; });
  const m = await stream.finalMessage();
  assert.equal(text, 'The answer');
  assert.equal(m.content[0].type, 'thinking');
  assert.equal(m.content[0].thinking, 'reasoning');
  assert.equal(m.content[1].text, 'The answer');
});

test('tool use, streamed and not, via the /anthropic prefix', async () => {
  const prefixed = new Anthropic({ baseURL: `${server.base}/anthropic`, apiKey: 'ak', maxRetries: 0 });
  const body = {
    model: 'echo', max_tokens: 200, tools, tool_choice: { type: 'any' },
    messages: [{ role: 'user', content: 'Checking.<tool_call>get_weather\n{"city":"Oslo"}</tool_call>' }],
  };
  const plain = await prefixed.messages.create(body);
  const streamed = await prefixed.messages.stream(body).finalMessage();
  for (const m of [plain, streamed]) {
    assert.equal(m.stop_reason, 'tool_use');
    const use = m.content.find((b) => b.type === 'tool_use');
    assert.equal(use.name, 'get_weather');
    assert.deepEqual(use.input, { city: 'Oslo' });
  }
});

test('tool result round trip', async () => {
  const m = await client.messages.create({
    model: 'echo', max_tokens: 50, tools,
    messages: [
      { role: 'user', content: 'weather?' },
      { role: 'assistant', content: [{ type: 'tool_use', id: 't1', name: 'get_weather', input: { city: 'Oslo' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't1', content: 'Sunny' }] },
    ],
  });
  assert.equal(m.content[0].text, 'Sunny');
});

test('stop sequences and max_tokens', async () => {
  const stopped = await client.messages.create({ model: 'echo', max_tokens: 50, stop_sequences: ['##'], messages: [{ role: 'user', content: 'one ## two' }] });
  assert.equal(stopped.stop_reason, 'stop_sequence');
  assert.equal(stopped.stop_sequence, '##');
  assert.equal(stopped.content[0].text, 'one ');
  const cut = await client.messages.create({ model: 'echo', max_tokens: 2, messages: [{ role: 'user', content: 'abcdef' }] });
  assert.equal(cut.stop_reason, 'max_tokens');
  assert.equal(cut.content[0].text, 'ab');
});

test('errors surface as the client error classes', async () => {
  await assert.rejects(client.messages.create({ model: 'echo', max_tokens: 5, messages: [] }), (e) => e instanceof Anthropic.BadRequestError);
  await assert.rejects(client.messages.create({ model: 'other', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof Anthropic.NotFoundError && e.error.type === 'error');
  const wrong = new Anthropic({ baseURL: server.base, apiKey: 'bad', maxRetries: 0 });
  await assert.rejects(wrong.messages.create({ model: 'echo', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof Anthropic.AuthenticationError && e.error.error.type === 'authentication_error');
});

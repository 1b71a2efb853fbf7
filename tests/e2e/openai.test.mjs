// The official `openai` client against `dsinfer serve`: Chat Completions and Responses,
// streaming and not, tools, usage, errors. The echo engine answers with the last message, so
// each test scripts the answer (<think>…</think> is reasoning, <tool_call>NAME\nARGS</tool_call>
// a tool call).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer } from './server.mjs';

let server;
let client;
before(async () => {
  server = await startServer(['--api-key', 'test-key']);
  client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'test-key', maxRetries: 0 });
});
after(async () => {
  const { code } = await server.stop();
  assert.equal(code, 0);
});

const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];

test('models list', async () => {
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ['echo']);
});

test('chat completion, not streamed', async () => {
  const r = await client.chat.completions.create({ model: 'echo', messages: [{ role: 'user', content: '<think>hmm</think>Hello, world' }] });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.content, 'Hello, world');
  assert.equal(r.choices[0].message.reasoning_content, 'hmm');
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(r.usage.prompt_cache_miss_tokens, r.usage.prompt_tokens);
});

test('chat completion, streamed with usage', async () => {
  const stream = await client.chat.completions.create({
    model: 'echo', stream: true, stream_options: { include_usage: true },
    messages: [{ role: 'user', content: '<think>a</think>Streamed text' }],
  });
  let content = '', reasoning = '', finish = null, usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      content += c.delta.content ?? '';
      reasoning += c.delta.reasoning_content ?? '';
      finish = c.finish_reason ?? finish;
    }
  }
  assert.equal(content, 'Streamed text');
  assert.equal(reasoning, 'a');
  assert.equal(finish, 'stop');
  assert.ok(usage.completion_tokens > 0);
});

test('chat stream helper accumulates tool calls', async () => {
  const runner = client.chat.completions.stream({
    model: 'echo', tools, messages: [{ role: 'user', content: 'Let me check.<tool_call>get_weather\n{"city": "Paris"}</tool_call>' }],
  });
  const final = await runner.finalChatCompletion();
  const msg = final.choices[0].message;
  assert.equal(final.choices[0].finish_reason, 'tool_calls');
  assert.equal(msg.content, 'Let me check.');
  assert.equal(msg.tool_calls.length, 1);
  assert.equal(msg.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(msg.tool_calls[0].function.arguments), { city: 'Paris' });
});

test('tool round trip, not streamed, with tool_choice required and named', async () => {
  for (const tool_choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
    const r = await client.chat.completions.create({
      model: 'echo', tools, tool_choice,
      messages: [
        { role: 'user', content: 'weather?' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'get_weather', arguments: '{}' } }] },
        { role: 'tool', tool_call_id: 'c1', content: '<tool_call>get_weather\n{"city":"Rome"}</tool_call>' },
      ],
    });
    assert.equal(r.choices[0].message.tool_calls[0].function.arguments, '{"city":"Rome"}');
  }
});

test('n choices, stop sequences and max_completion_tokens', async () => {
  const r = await client.chat.completions.create({ model: 'echo', n: 2, stop: ['END'], messages: [{ role: 'user', content: 'abc END def' }] });
  assert.equal(r.choices.length, 2);
  for (const c of r.choices) {
    assert.equal(c.message.content, 'abc ');
    assert.equal(c.finish_reason, 'stop');
  }
  const cut = await client.chat.completions.create({ model: 'echo', max_completion_tokens: 4, messages: [{ role: 'user', content: 'abcdefgh' }] });
  assert.equal(cut.choices[0].message.content, 'abcd');
  assert.equal(cut.choices[0].finish_reason, 'length');
});

test('legacy completions with token ids', async () => {
  const r = await client.completions.create({ model: 'echo', prompt: [72, 105], max_tokens: 8 });
  assert.equal(r.choices[0].text, 'Hi');
  assert.equal(r.choices[0].finish_reason, 'stop');
});

test('responses, not streamed', async () => {
  const r = await client.responses.create({ model: 'echo', instructions: 'be nice', input: '<think>ok</think>Answer here' });
  assert.equal(r.status, 'completed');
  assert.equal(r.output_text, 'Answer here');
  assert.equal(r.output[0].type, 'reasoning');
  assert.equal(r.usage.input_tokens_details.cached_tokens, 0);
  assert.ok(r.usage.output_tokens_details.reasoning_tokens > 0);
});

test('responses, streamed, with a function call', async () => {
  const stream = client.responses.stream({
    model: 'echo',
    tools: [{ type: 'function', name: 'lookup', parameters: { type: 'object' }, strict: false }],
    input: [{ role: 'user', content: 'Sure.<tool_call>lookup\n{"q":"x"}</tool_call>' }],
  });
  const deltas = [];
  stream.on('response.output_text.delta', (e) => deltas.push(e.delta));
  const final = await stream.finalResponse();
  assert.equal(deltas.join(''), 'Sure.');
  const call = final.output.find((o) => o.type === 'function_call');
  assert.equal(call.name, 'lookup');
  assert.deepEqual(JSON.parse(call.arguments), { q: 'x' });
  assert.equal(final.output_text, 'Sure.');
});

test('responses: max_output_tokens gives incomplete', async () => {
  const r = await client.responses.create({ model: 'echo', input: 'abcdefgh', max_output_tokens: 3 });
  assert.equal(r.status, 'incomplete');
  assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.equal(r.output_text, 'abc');
});

test('errors surface as the client error classes', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'nope', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
  await assert.rejects(client.chat.completions.create({ model: 'echo', messages: [] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'messages');
  await assert.rejects(client.chat.completions.create({ model: 'echo', max_tokens: 10000000, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded');
  const wrongKey = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrongKey.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
  await assert.rejects(client.responses.create({ model: 'echo', input: 'x', tool_choice: { type: 'function', name: 'absent' } }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'tool_choice');
});

test('json_object response format is accepted', async () => {
  const r = await client.chat.completions.create({
    model: 'echo', response_format: { type: 'json_object' }, messages: [{ role: 'user', content: '{"a": 1}' }],
  });
  assert.deepEqual(JSON.parse(r.choices[0].message.content), { a: 1 });
});

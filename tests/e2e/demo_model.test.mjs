// `dsinfer serve` on the trained demo model (models/demo, the default model): the official
// clients get real tool calls, and a repeated prompt reports its prefix-cache hit in each
// protocol's usage fields.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer } from './server.mjs';

const demoDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../models/demo');
const haveDemo = fs.existsSync(path.join(demoDir, 'model.safetensors'));

let server;
before(async () => {
  if (haveDemo) server = await startServer(['--engine', 'model', '--model', demoDir, '--served-model-name', 'demo']);
});
after(async () => {
  if (server) assert.equal((await server.stop()).code, 0);
});

const weatherTool = { name: 'get_weather', description: 'Get the current weather for a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } };
const question = 'What is the weather in Paris?';

test('Chat Completions: a weather question becomes a get_weather call, streamed and not', { skip: !haveDemo }, async () => {
  const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'x', maxRetries: 0 });
  const body = { model: 'demo', temperature: 0, max_tokens: 100, tools: [{ type: 'function', function: weatherTool }],
    messages: [{ role: 'user', content: question }] };
  const whole = await client.chat.completions.create(body);
  const streamed = await client.chat.completions.stream(body).finalChatCompletion();
  for (const r of [whole, streamed]) {
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    const call = r.choices[0].message.tool_calls[0];
    assert.equal(call.function.name, 'get_weather');
    assert.equal(JSON.parse(call.function.arguments).city, 'Paris');
  }
});

test('Messages and Responses: the same question gives tool_use / function_call', { skip: !haveDemo }, async () => {
  const anthropic = new Anthropic({ baseURL: server.base, apiKey: 'x', maxRetries: 0 });
  const m = await anthropic.messages.stream({
    model: 'demo', max_tokens: 100, temperature: 0,
    tools: [{ name: weatherTool.name, description: weatherTool.description, input_schema: weatherTool.parameters }],
    messages: [{ role: 'user', content: question }],
  }).finalMessage();
  assert.equal(m.stop_reason, 'tool_use');
  const use = m.content.find((b) => b.type === 'tool_use');
  assert.equal(use.name, 'get_weather');
  assert.equal(use.input.city, 'Paris');

  const openai = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'x', maxRetries: 0 });
  const r = await openai.responses.create({ model: 'demo', temperature: 0, max_output_tokens: 100,
    tools: [{ type: 'function', ...weatherTool, strict: false }], input: question });
  const call = r.output.find((o) => o.type === 'function_call');
  assert.equal(call.name, 'get_weather');
  assert.equal(JSON.parse(call.arguments).city, 'Paris');
});

test('a repeated long prompt reports cached tokens in every protocol', { skip: !haveDemo }, async () => {
  const system = 'You are a helpful assistant for a travel agency. '.repeat(20);
  const openai = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'x', maxRetries: 0 });
  const chat = { model: 'demo', temperature: 0, max_tokens: 8, messages: [{ role: 'system', content: system }, { role: 'user', content: 'Hello' }] };
  await openai.chat.completions.create(chat);
  const again = await openai.chat.completions.create(chat);
  assert.ok(again.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(again.usage));
  assert.equal(again.usage.prompt_cache_hit_tokens, again.usage.prompt_tokens_details.cached_tokens);
  const anthropic = new Anthropic({ baseURL: server.base, apiKey: 'x', maxRetries: 0 });
  const message = { model: 'demo', max_tokens: 8, temperature: 0, system, messages: [{ role: 'user', content: 'Hi there' }] };
  await anthropic.messages.create(message);
  const m = await anthropic.messages.create(message);
  assert.ok(m.usage.cache_read_input_tokens > 0, JSON.stringify(m.usage));
  const response = { model: 'demo', temperature: 0, max_output_tokens: 8, instructions: system, input: 'Good day' };
  await openai.responses.create(response);
  const r = await openai.responses.create(response);
  assert.ok(r.usage.input_tokens_details.cached_tokens > 0, JSON.stringify(r.usage));
});

const calculatorTool = { name: 'calculator', description: 'Evaluate an arithmetic expression',
  parameters: { type: 'object', properties: { expression: { type: 'string' } }, required: ['expression'] } };

test('tool_choice named and required force a call, whatever the question', { skip: !haveDemo }, async () => {
  const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'x', maxRetries: 0 });
  const tools = [{ type: 'function', function: weatherTool }, { type: 'function', function: calculatorTool }];
  // Named: the weather question must still be answered with the calculator.
  const named = { model: 'demo', temperature: 0, max_tokens: 80, tools, messages: [{ role: 'user', content: question }],
    tool_choice: { type: 'function', function: { name: 'calculator' } } };
  for (const r of [await client.chat.completions.create(named),
                   await client.chat.completions.stream(named).finalChatCompletion()]) {
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    assert.equal(r.choices[0].message.tool_calls[0].function.name, 'calculator');
    assert.equal(typeof JSON.parse(r.choices[0].message.tool_calls[0].function.arguments), 'object');
  }
  // Required: a question the model would answer in prose still gets a tool call.
  const required = await client.chat.completions.create({ model: 'demo', temperature: 0, max_tokens: 80, tools,
    tool_choice: 'required', messages: [{ role: 'user', content: 'What is the capital of France?' }] });
  assert.equal(required.choices[0].finish_reason, 'tool_calls');
  assert.ok(['get_weather', 'calculator'].includes(required.choices[0].message.tool_calls[0].function.name));
  // Anthropic's forms of the same: {type: 'tool', name} and {type: 'any'}.
  const anthropic = new Anthropic({ baseURL: server.base, apiKey: 'x', maxRetries: 0 });
  const aTools = [weatherTool, calculatorTool].map((t) => ({ name: t.name, description: t.description, input_schema: t.parameters }));
  const m = await anthropic.messages.create({ model: 'demo', max_tokens: 80, temperature: 0, tools: aTools,
    tool_choice: { type: 'tool', name: 'calculator' }, messages: [{ role: 'user', content: question }] });
  assert.equal(m.stop_reason, 'tool_use');
  assert.equal(m.content.find((b) => b.type === 'tool_use').name, 'calculator');
  const any = await anthropic.messages.create({ model: 'demo', max_tokens: 80, temperature: 0, tools: aTools,
    tool_choice: { type: 'any' }, messages: [{ role: 'user', content: 'What is the capital of France?' }] });
  assert.equal(any.stop_reason, 'tool_use');
});

test('logprobs: each answer token, its log-probability and the best alternatives', { skip: !haveDemo }, async () => {
  const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'x', maxRetries: 0 });
  const body = { model: 'demo', temperature: 0, max_tokens: 12, logprobs: true, top_logprobs: 3,
    messages: [{ role: 'user', content: 'Hello' }] };
  const whole = await client.chat.completions.create(body);
  const streamed = await client.chat.completions.stream(body).finalChatCompletion();
  const byte = (entries) => Buffer.concat(entries.map((e) => Buffer.from(e.bytes))).toString('utf8');
  for (const r of [whole, streamed]) {
    const entries = r.choices[0].logprobs.content;
    assert.equal(byte(entries), r.choices[0].message.content);
    for (const e of entries) {
      assert.ok(e.logprob <= 0 && e.logprob > -50, JSON.stringify(e));
      assert.equal(e.top_logprobs.length, 3);
      // Greedy: the chosen token is the likeliest, and the alternatives come best first.
      assert.equal(e.top_logprobs[0].token, e.token);
      assert.equal(e.top_logprobs[0].logprob, e.logprob);
      assert.ok(e.top_logprobs[1].logprob <= e.top_logprobs[0].logprob);
      assert.ok(e.top_logprobs[2].logprob <= e.top_logprobs[1].logprob);
    }
  }
  assert.deepEqual(streamed.choices[0].logprobs.content, whole.choices[0].logprobs.content);

  const completion = await client.completions.create({ model: 'demo', prompt: 'The weather in Paris', max_tokens: 6,
    temperature: 0, logprobs: 2 });
  const lp = completion.choices[0].logprobs;
  assert.equal(lp.tokens.join(''), completion.choices[0].text);
  assert.equal(lp.tokens.length, completion.usage.completion_tokens);
  assert.equal(lp.text_offset[0], 0);
  for (let i = 0; i < lp.tokens.length; ++i) {
    assert.equal(Object.keys(lp.top_logprobs[i]).length, 2);
    assert.equal(lp.top_logprobs[i][lp.tokens[i]], lp.token_logprobs[i]);
  }

  const response = await client.responses.create({ model: 'demo', temperature: 0, max_output_tokens: 12, input: 'Hello',
    include: ['message.output_text.logprobs'], top_logprobs: 2 });
  const part = response.output.find((o) => o.type === 'message').content[0];
  assert.equal(byte(part.logprobs), part.text);
  const chatLogprobs = whole.choices[0].logprobs.content.slice(0, part.logprobs.length);
  assert.deepEqual(part.logprobs.map((e) => e.logprob), chatLogprobs.map((e) => e.logprob));

  await assert.rejects(client.chat.completions.create({ ...body, logprobs: false }),
    (e) => e.status === 400 && e.param === 'top_logprobs');
});

test('penalties: presence, frequency and repetition stop a greedy loop', { skip: !haveDemo }, async () => {
  const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'x', maxRetries: 0 });
  const body = { model: 'demo', prompt: 'the the the the', max_tokens: 30, temperature: 0 };
  const plain = (await client.completions.create(body)).choices[0].text;
  assert.match(plain, /(theory of ){4}/);  // the model loops on this prompt
  for (const penalties of [{ frequency_penalty: 2, presence_penalty: 2 }, { repetition_penalty: 1.5 }]) {
    const text = (await client.completions.create({ ...body, ...penalties })).choices[0].text;
    assert.doesNotMatch(text, /(theory of ){2}/, JSON.stringify(penalties));
  }
  // A negative frequency penalty rewards repeats: the loop stays.
  const rewarded = (await client.completions.create({ ...body, frequency_penalty: -2 })).choices[0].text;
  assert.match(rewarded, /(theory of ){4}/);
  await assert.rejects(client.completions.create({ ...body, presence_penalty: 3 }),
    (e) => e.status === 400 && e.param === 'presence_penalty');
});

test('logit_bias: +100 makes one token every choice, -100 keeps it out', { skip: !haveDemo }, async () => {
  const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'x', maxRetries: 0 });
  const body = { model: 'demo', prompt: 'the the the the', max_tokens: 4, temperature: 0, logprobs: 0 };
  const forced = await client.completions.create({ ...body, logit_bias: { 1000: 100 } });
  const tokens = forced.choices[0].logprobs.tokens;
  assert.equal(tokens.length, 4);
  assert.ok(tokens.every((t) => t === tokens[0]) && tokens[0].length > 0, JSON.stringify(tokens));
  const plain = await client.completions.create(body);
  const first = plain.choices[0].logprobs.tokens[0];
  const banned = await client.completions.create({ ...body, max_tokens: 1, logit_bias: { 1000: -100 } });
  assert.equal(banned.choices[0].logprobs.tokens[0], first);  // token 1000 was not the greedy choice
  await assert.rejects(client.completions.create({ ...body, logit_bias: { 1000: 101 } }), (e) => e.status === 400);
  await assert.rejects(client.completions.create({ ...body, logit_bias: { 999999999: 1 } }), (e) => e.status === 400);
});

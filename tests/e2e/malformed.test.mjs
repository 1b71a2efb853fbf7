// A battery of malformed requests: each gets its documented status and its protocol's error
// shape, and the server stays healthy throughout.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startServer } from './server.mjs';

const kMaxBody = 65536;
let server;
before(async () => { server = await startServer(['--api-key', 'k', '--max-body-bytes', String(kMaxBody), '--max-context-tokens', '4096']); });
after(async () => { assert.equal((await server.stop()).code, 0); });

const user = [{ role: 'user', content: 'hi' }];
const chat = (extra) => JSON.stringify({ model: 'echo', messages: user, ...extra });
const msgs = (extra) => JSON.stringify({ model: 'echo', max_tokens: 5, messages: user, ...extra });

// [name, method, path, body, expected status, expected param (OpenAI shape) or null]
const C = '/v1/chat/completions', R = '/v1/responses', M = '/v1/messages', P = '/v1/completions';
const cases = [
  ['empty body', 'POST', C, '', 400],
  ['truncated JSON', 'POST', C, '{"model": "echo", "messages": [', 400],
  ['array body', 'POST', C, '[]', 400],
  ['null body', 'POST', C, 'null', 400],
  ['string body', 'POST', C, '"hello"', 400],
  ['trailing garbage', 'POST', C, chat({}) + ' x', 400],
  ['invalid UTF-8', 'POST', C, Buffer.concat([Buffer.from('{"model":"echo","messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xfe]), Buffer.from('"}]}')]), 400],
  ['deep nesting', 'POST', C, `{"model":"echo","messages":[{"role":"user","content":"x"}],"x":${'['.repeat(5000)}${']'.repeat(5000)}}`, 400],
  ['missing model', 'POST', C, JSON.stringify({ messages: user }), 400, 'model'],
  ['model is a number', 'POST', C, chat({ model: 5 }), 400, 'model'],
  ['missing messages', 'POST', C, JSON.stringify({ model: 'echo' }), 400, 'messages'],
  ['messages not an array', 'POST', C, chat({ messages: 'hi' }), 400, 'messages'],
  ['empty messages', 'POST', C, chat({ messages: [] }), 400, 'messages'],
  ['message not an object', 'POST', C, chat({ messages: [5] }), 400, 'messages[0]'],
  ['unknown role', 'POST', C, chat({ messages: [{ role: 'wizard', content: 'x' }] }), 400, 'messages[0].role'],
  ['missing role', 'POST', C, chat({ messages: [{ content: 'x' }] }), 400, 'messages[0].role'],
  ['content is a number', 'POST', C, chat({ messages: [{ role: 'user', content: 7 }] }), 400, 'messages[0].content'],
  ['image content part', 'POST', C, chat({ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }), 400, 'messages[0].content[0].type'],
  ['tool message without id', 'POST', C, chat({ messages: [{ role: 'tool', content: 'x' }] }), 400, 'messages[0].tool_call_id'],
  ['temperature string', 'POST', C, chat({ temperature: 'hot' }), 400, 'temperature'],
  ['temperature negative', 'POST', C, chat({ temperature: -1 }), 400, 'temperature'],
  ['top_p above 1', 'POST', C, chat({ top_p: 2 }), 400, 'top_p'],
  ['top_k string', 'POST', C, chat({ top_k: 'a' }), 400, 'top_k'],
  ['seed string', 'POST', C, chat({ seed: 'x' }), 400, 'seed'],
  ['max_tokens negative', 'POST', C, chat({ max_tokens: -1 }), 400, 'max_tokens'],
  ['max_tokens zero', 'POST', C, chat({ max_tokens: 0 }), 400, 'max_tokens'],
  ['max_tokens huge float', 'POST', C, chat({ max_tokens: 1e30 }), 400, 'max_tokens'],
  ['max_tokens over the context', 'POST', C, chat({ max_tokens: 1000000000 }), 400, 'messages'],
  ['max_completion_tokens string', 'POST', C, chat({ max_completion_tokens: '5' }), 400, 'max_completion_tokens'],
  ['n zero', 'POST', C, chat({ n: 0 }), 400, 'n'],
  ['n too many', 'POST', C, chat({ n: 1000 }), 400, 'n'],
  ['stream string', 'POST', C, chat({ stream: 'true' }), 400, 'stream'],
  ['stream_options not object', 'POST', C, chat({ stream: true, stream_options: true }), 400, 'stream_options'],
  ['stop is a number', 'POST', C, chat({ stop: 5 }), 400, 'stop'],
  ['too many stops', 'POST', C, chat({ stop: Array.from({ length: 20 }, (_, i) => `s${i}`) }), 400, 'stop'],
  ['tools not an array', 'POST', C, chat({ tools: {} }), 400, 'tools'],
  ['tool without a name', 'POST', C, chat({ tools: [{ type: 'function', function: {} }] }), 400, 'tools[0].function.name'],
  ['tool_choice names an absent tool', 'POST', C, chat({ tools: [{ type: 'function', function: { name: 'a' } }], tool_choice: { type: 'function', function: { name: 'b' } } }), 400, 'tool_choice'],
  ['tool_choice unknown string', 'POST', C, chat({ tool_choice: 'sometimes' }), 400, 'tool_choice'],
  ['tool_choice required without tools', 'POST', C, chat({ tool_choice: 'required' }), 400, 'tool_choice'],
  ['response_format xml', 'POST', C, chat({ response_format: { type: 'xml' } }), 400, 'response_format.type'],
  ['unknown model', 'POST', C, chat({ model: 'gpt-17' }), 404, 'model'],
  ['oversized body', 'POST', C, chat({ messages: [{ role: 'user', content: 'x'.repeat(kMaxBody * 2) }] }), 413],
  ['completions without prompt', 'POST', P, JSON.stringify({ model: 'echo' }), 400, 'prompt'],
  ['completions with negative ids', 'POST', P, JSON.stringify({ model: 'echo', prompt: [1, -5] }), 400, 'prompt'],
  ['completions id outside the vocabulary', 'POST', P, JSON.stringify({ model: 'echo', prompt: [1, 99999] }), 400, 'prompt'],
  ['responses without input', 'POST', R, JSON.stringify({ model: 'echo' }), 400, 'input'],
  ['responses with previous_response_id', 'POST', R, JSON.stringify({ model: 'echo', input: 'x', previous_response_id: 'resp_1' }), 400, 'previous_response_id'],
  ['responses item of unknown type', 'POST', R, JSON.stringify({ model: 'echo', input: [{ type: 'telepathy' }] }), 400, 'input[0].type'],
  ['responses hosted tool', 'POST', R, JSON.stringify({ model: 'echo', input: 'x', tools: [{ type: 'web_search' }] }), 400, 'tools[0].type'],
  ['messages without max_tokens', 'POST', M, JSON.stringify({ model: 'echo', messages: user }), 400],
  ['messages with a system role', 'POST', M, msgs({ messages: [{ role: 'system', content: 'x' }] }), 400],
  ['messages temperature above 1', 'POST', M, msgs({ temperature: 1.5 }), 400],
  ['messages image block', 'POST', M, msgs({ messages: [{ role: 'user', content: [{ type: 'image', source: {} }] }] }), 400],
  ['messages tool_choice absent tool', 'POST', M, msgs({ tools: [{ name: 'a', input_schema: {} }], tool_choice: { type: 'tool', name: 'b' } }), 400],
  ['messages empty', 'POST', M, msgs({ messages: [] }), 400],
  ['messages oversized', 'POST', '/anthropic/v1/messages', msgs({ system: 'y'.repeat(kMaxBody * 2) }), 413],
  ['messages unknown model', 'POST', M, msgs({ model: 'claude-0' }), 404],
  ['unknown route', 'POST', '/v1/embeddings', chat({}), 404],
  ['wrong method', 'GET', C, undefined, 405],
];

test(`battery of ${cases.length} malformed requests`, async () => {
  assert.ok(cases.length >= 40);
  for (const [name, method, path, body, status, param] of cases) {
    const res = await fetch(`${server.base}${path}`, {
      method, body, headers: { 'content-type': 'application/json', authorization: 'Bearer k' },
    });
    const text = await res.text();
    assert.equal(res.status, status, `${name}: ${text.slice(0, 300)}`);
    const json = JSON.parse(text);
    if (path.includes('messages') && method === 'POST' || path.startsWith('/anthropic')) {
      assert.equal(json.type, 'error', name);
      assert.equal(typeof json.error.type, 'string', name);
      assert.equal(typeof json.error.message, 'string', name);
    } else {
      assert.equal(typeof json.error.message, 'string', name);
      assert.equal(typeof json.error.type, 'string', name);
      if (param !== undefined) assert.equal(json.error.param, param, `${name}: ${json.error.message}`);
    }
    const health = await fetch(`${server.base}/health`);
    assert.equal(health.status, 200, `unhealthy after ${name}`);
  }
});

test('authentication: missing and wrong keys get 401 in each shape', async () => {
  for (const [path, headers, anthropic] of [
    [C, {}, false], [C, { authorization: 'Bearer nope' }, false], [M, { 'x-api-key': 'nope' }, true],
  ]) {
    const res = await fetch(`${server.base}${path}`, { method: 'POST', body: chat({ max_tokens: 5 }), headers });
    assert.equal(res.status, 401);
    const json = await res.json();
    assert.equal(anthropic ? json.error.type : json.error.type, 'authentication_error');
  }
});

test('not HTTP at all gets 400 and the server stays up', async () => {
  const reply = await new Promise((resolve, reject) => {
    const s = net.connect(server.port, '127.0.0.1', () => s.write('HELLO THERE\x00\x01\r\n\r\n'));
    let data = '';
    s.on('data', (d) => { data += d; });
    s.on('end', () => resolve(data));
    s.on('error', reject);
  });
  assert.match(reply, /^HTTP\/1\.1 400/);
  assert.equal((await fetch(`${server.base}/health`)).status, 200);
  const ok = await fetch(`${server.base}${C}`, { method: 'POST', body: chat({}), headers: { authorization: 'Bearer k' } });
  assert.equal(ok.status, 200);
});

test('pipelined requests on one connection are answered in order', async () => {
  const body = JSON.stringify({ model: 'echo', prompt: 'hey', max_tokens: 2 });
  const reply = await new Promise((resolve, reject) => {
    const s = net.connect(server.port, '127.0.0.1', () => s.write(
      'GET /health HTTP/1.1\r\nHost: x\r\n\r\n' +
      `POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}` +
      'GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nConnection: close\r\n\r\n'));
    let data = '';
    s.on('data', (d) => { data += d; });
    s.on('end', () => resolve(data));
    s.on('error', reject);
  });
  const statuses = [...reply.matchAll(/HTTP\/1\.1 (\d+)/g)].map((m) => Number(m[1]));
  assert.deepEqual(statuses, [200, 200, 200]);
  assert.ok(reply.indexOf('"status":"ok"') < reply.indexOf('"text":"he"'));
  assert.ok(reply.indexOf('"text":"he"') < reply.indexOf('"object":"list"'));
});

// Client disconnects cancel their requests and free their KV blocks; SIGTERM drains in-flight
// streams and exits 0; many concurrent streams complete.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { startServer, metrics, waitFor } from './server.mjs';

function streamRequest(port, content, onChunk) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: '/v1/chat/completions', headers: { 'content-type': 'application/json' } }, (res) => {
      let body = '';
      res.on('data', (d) => { body += d; onChunk?.(body, req); });
      res.on('end', () => resolve({ status: res.statusCode, body }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(JSON.stringify({ model: 'echo', stream: true, messages: [{ role: 'user', content }] }));
  });
}

test('a client that hangs up mid-stream is cancelled and its blocks come back', async () => {
  const server = await startServer(['--echo-step-us', '5000']);
  try {
    let hungUp = false;
    const blocksSeen = [];
    await new Promise((resolve) => {
      streamRequest(server.port, 'z'.repeat(2000), async (body, req) => {
        if (hungUp || body.length < 2000) return;
        hungUp = true;
        const m = await metrics(server.base);
        blocksSeen.push(m.dsinfer_kv_blocks_used);
        req.destroy();
        resolve();
      }).catch(() => resolve());
    });
    assert.ok(blocksSeen[0] > 0, 'the request held KV blocks while streaming');
    assert.ok(await waitFor(async () => {
      const m = await metrics(server.base);
      return m.dsinfer_kv_blocks_used === 0 && m.dsinfer_requests_cancelled_total === 1 && m.dsinfer_engine_running_requests === 0;
    }), 'blocks returned and the request was cancelled');
    assert.equal((await fetch(`${server.base}/health`)).status, 200);
  } finally {
    assert.equal((await server.stop()).code, 0);
  }
});

test('SIGTERM lets in-flight streams finish, refuses new work, exits 0', async () => {
  const server = await startServer(['--echo-step-us', '2000', '--grace-period-s', '20']);
  let signalled = false;
  let lateAttempt = null;
  const result = await streamRequest(server.port, 'w'.repeat(400), (body) => {
    if (!signalled && body.includes('"w"')) {
      signalled = true;
      server.child.kill('SIGTERM');
    } else if (signalled && !lateAttempt && body.length > 20000) {
      // Mid-drain: a new request is refused (503 or no connection at all).
      lateAttempt = fetch(`${server.base}/v1/chat/completions`, {
        method: 'POST', body: JSON.stringify({ model: 'echo', messages: [{ role: 'user', content: 'x' }] }),
      }).then((r) => r.status, () => 'refused');
    }
  });
  assert.ok(signalled);
  assert.ok(lateAttempt, 'a late request was tried');
  assert.ok([503, 'refused'].includes(await lateAttempt), `late request: ${await lateAttempt}`);
  assert.equal(result.status, 200);
  assert.ok(result.body.trimEnd().endsWith('data: [DONE]'), 'the stream ran to its end');
  const content = [...result.body.matchAll(/"content":"(w*)"/g)].map((m) => m[1]).join('');
  assert.equal(content.length, 400);
  const { code } = await server.exited;
  assert.equal(code, 0);
});

test('past the grace period, streams are ended and the server still exits 0', async () => {
  const server = await startServer(['--echo-step-us', '20000', '--grace-period-s', '0']);
  let signalled = false;
  const result = await streamRequest(server.port, 'v'.repeat(1000), (body) => {
    if (!signalled && body.includes('"v"')) {
      signalled = true;
      server.child.kill('SIGTERM');
    }
  });
  assert.equal(result.status, 200);
  assert.ok(result.body.includes('"finish_reason":"abort"'), 'the stream was ended by the server');
  assert.equal((await server.exited).code, 0);
});

test('1,000 concurrent streaming connections all complete', async () => {
  const server = await startServer(['--echo-step-us', '1000']);
  try {
    const agent = new http.Agent({ keepAlive: false, maxSockets: Infinity });
    const one = () => new Promise((resolve, reject) => {
      const req = http.request({ agent, host: '127.0.0.1', port: server.port, method: 'POST', path: '/v1/chat/completions' }, (res) => {
        let body = '';
        res.on('data', (d) => { body += d; });
        res.on('end', () => resolve(res.statusCode === 200 && body.endsWith('data: [DONE]\n\n')));
        res.on('error', reject);
      });
      req.on('error', reject);
      req.end(JSON.stringify({ model: 'echo', stream: true, messages: [{ role: 'user', content: 'x'.repeat(64) }] }));
    });
    const results = await Promise.allSettled(Array.from({ length: 1000 }, one));
    const ok = results.filter((r) => r.status === 'fulfilled' && r.value).length;
    assert.equal(ok, 1000);
  } finally {
    assert.equal((await server.stop()).code, 0);
  }
});

test('a client that stops reading is dropped and its request cancelled', async () => {
  const server = await startServer(['--echo-step-us', '0', '--max-context-tokens', '300000']);
  const net = await import('node:net');
  try {
    const body = JSON.stringify({ model: 'echo', stream: true, ignore_eos: true, max_tokens: 250000, messages: [{ role: 'user', content: 'x' }] });
    const socket = net.connect(server.port, '127.0.0.1');
    await new Promise((resolve) => socket.on('connect', resolve));
    socket.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    socket.pause();  // never read: the kernel buffers fill, then the server's per-connection queue
    socket.on('error', () => {});
    assert.ok(await waitFor(async () => {
      const m = await metrics(server.base);
      return m.dsinfer_requests_cancelled_total === 1 && m.dsinfer_kv_blocks_used === 0 && m.dsinfer_engine_running_requests === 0;
    }, 60000), 'the slow client was dropped and its request cancelled');
    const m = await metrics(server.base);
    assert.ok(m.dsinfer_generated_tokens_total < 250000, 'cancelled before the end of its answer');
    assert.equal((await fetch(`${server.base}/health`)).status, 200);
    socket.destroy();
  } finally {
    assert.equal((await server.stop()).code, 0);
  }
});

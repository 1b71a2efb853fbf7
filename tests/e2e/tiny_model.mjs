// Builds a real, tiny model directory for serving tests: the random-weight tiny DeepSeek-V3
// checkpoint of tests/data/tiny_v3 (vocab 512) with a tokenizer made to fit it: the DeepSeek
// special tokens at ids 0..14 (BOS 0 and EOS 1, as its config.json says), the 256 ByteLevel
// byte tokens at 16..271, no merges, and the V3 chat template. Everything the server does
// (template, tokenizer, engine, detokenizer, output parser) runs for real; only the answers are
// noise, since the weights are random.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '../..');

const kSpecials = [
  '<｜begin▁of▁sentence｜>', '<｜end▁of▁sentence｜>', '<｜User｜>', '<｜Assistant｜>', '<think>', '</think>',
  '<｜tool▁calls▁begin｜>', '<｜tool▁calls▁end｜>', '<｜tool▁call▁begin｜>', '<｜tool▁call▁end｜>', '<｜tool▁sep｜>',
  '<｜tool▁outputs▁begin｜>', '<｜tool▁outputs▁end｜>', '<｜tool▁output▁begin｜>', '<｜tool▁output▁end｜>',
];

// GPT-2's printable stand-ins for bytes, as ByteLevel uses them.
function byteLevelChars() {
  const printable = [];
  for (let b = 33; b <= 126; ++b) printable.push(b);
  for (let b = 161; b <= 172; ++b) printable.push(b);
  for (let b = 174; b <= 255; ++b) printable.push(b);
  const map = new Array(256);
  let next = 256;
  for (let b = 0; b < 256; ++b) map[b] = String.fromCodePoint(printable.includes(b) ? b : next++);
  return map;
}

export function makeTinyModelDir() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'dsinfer-tiny-'));
  for (const f of ['config.json', 'model.safetensors']) fs.symlinkSync(path.join(repo, 'tests/data/tiny_v3', f), path.join(dir, f));
  const vocab = {};
  byteLevelChars().forEach((ch, b) => { vocab[ch] = 16 + b; });
  const tokenizer = {
    version: '1.0',
    added_tokens: kSpecials.map((content, id) => ({ id, content, special: true, single_word: false, lstrip: false, rstrip: false, normalized: false })),
    normalizer: null,
    pre_tokenizer: { type: 'Sequence', pretokenizers: [{ type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false }] },
    decoder: { type: 'ByteLevel' },
    model: { type: 'BPE', vocab, merges: [] },
  };
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tokenizer));
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify({
    bos_token: kSpecials[0],
    eos_token: kSpecials[1],
    add_bos_token: true,
    chat_template: fs.readFileSync(path.join(repo, 'tests/data/templates/deepseek_v3.jinja'), 'utf8'),
  }));
  return dir;
}

// Rebuilds Meta's Llama 3 tokenizer.model (a .tiktoken rank file: one line
// "base64(token bytes) SP rank" per token, ranks 0..127999) from the vocabulary that npm
// llama3-tokenizer-js embeds in src/data-converted.js: 128,256 GPT-2 byte-level-unicode
// strings (base64 of the newline-joined UTF-8), of which ids 0..127,999 are the ranks.
// Usage: node scripts/rebuild_llama3_tokenizer.js DATA_CONVERTED_JS OUT_FILE
"use strict";
const fs = require("fs");

const [src, out] = process.argv.slice(2);
if (!src || !out) {
  console.error("usage: node rebuild_llama3_tokenizer.js .../llama3-tokenizer-js/src/data-converted.js OUT");
  process.exit(2);
}
const text = fs.readFileSync(src, "utf8");
const m = /const\s+llama_vocab_base64\s*=\s*"([A-Za-z0-9+/=]+)"/.exec(text);
if (!m) {
  console.error(`${src}: no llama_vocab_base64 string found`);
  process.exit(1);
}
const vocab = Buffer.from(m[1], "base64").toString("utf8").split("\n");

// GPT-2's bytes_to_unicode, inverted: byte-level-unicode code point -> byte.
const unicodeToByte = new Map();
const printable = [];
for (let b = 33; b <= 126; b++) printable.push(b);
for (let b = 161; b <= 172; b++) printable.push(b);
for (let b = 174; b <= 255; b++) printable.push(b);
for (const b of printable) unicodeToByte.set(b, b);
let n = 0;
for (let b = 0; b < 256; b++) {
  if (!printable.includes(b)) unicodeToByte.set(256 + n++, b);
}

const kBaseTokens = 128000;
if (vocab.length < kBaseTokens) {
  console.error(`${src}: vocabulary has ${vocab.length} entries, expected at least ${kBaseTokens}`);
  process.exit(1);
}
const lines = [];
for (let id = 0; id < kBaseTokens; id++) {
  const bytes = [];
  for (const ch of vocab[id]) {
    const b = unicodeToByte.get(ch.codePointAt(0));
    if (b === undefined) {
      console.error(`${src}: token ${id} holds U+${ch.codePointAt(0).toString(16)}, not a byte-level character`);
      process.exit(1);
    }
    bytes.push(b);
  }
  lines.push(`${Buffer.from(bytes).toString("base64")} ${id}\n`);
}
fs.writeFileSync(out, lines.join(""));

// tiktoken's speed (npm `tiktoken`: the Rust library compiled to WASM) on one thread,
// for benchmarks/tokenize_speed.sh: encode_ordinary of the whole text (llama3: in Meta's
// chunks, as llama/tokenizer.py calls it), best of repeated runs. One line per encoding: "tiktoken KIND MB_PER_S TOKENS HASH" (HASH: FNV-1a of the ids).
// Usage: node benchmarks/tiktoken_speed.js TOKENIZER_DIR TEXT_FILE [MIN_SECONDS]
"use strict";
const fs = require("fs");
const path = require("path");

const [dir, textFile, minArg] = process.argv.slice(2);
const minSeconds = Number(minArg || 2);
const tiktoken = require(path.join(path.resolve(dir), "node_modules", "tiktoken"));
const text = fs.readFileSync(textFile, "utf8");
const mb = Buffer.byteLength(text, "utf8") / 1e6;

const kLlama3Pattern =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// Meta's llama/tokenizer.py encode: tiktoken calls of <= 400,000 characters, each cut so
// that no slice has more than 25,000 consecutive space (str.isspace) or non-space characters.
function isspace(c) {
  return c === 0x20 || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f) || c === 0x85 || c === 0xa0 ||
    c === 0x1680 || (c >= 0x2000 && c <= 0x200a) || c === 0x2028 || c === 0x2029 || c === 0x202f || c === 0x205f ||
    c === 0x3000;
}
function metaEncode(enc, s) {
  const chars = Array.from(s);
  const out = [];
  for (let i = 0; i < chars.length; i += 400000) {
    const sub = chars.slice(i, i + 400000);
    let run = 0, runIsSpace = sub.length > 0 && isspace(sub[0].codePointAt(0)), start = 0;
    for (let k = 0; k < sub.length; k++) {
      const space = isspace(sub[k].codePointAt(0));
      if (space !== runIsSpace) {
        run = 1;
        runIsSpace = space;
      } else if (++run > 25000) {
        for (const id of enc.encode_ordinary(sub.slice(start, k).join(""))) out.push(id);
        start = k;
        run = 1;
      }
    }
    for (const id of enc.encode_ordinary(sub.slice(start).join(""))) out.push(id);
  }
  return out;
}

const encodings = [
  ["gpt2", tiktoken.get_encoding("gpt2"), (enc, s) => enc.encode_ordinary(s)],
  ["llama3", new tiktoken.Tiktoken(fs.readFileSync(path.join(dir, "llama3", "tokenizer.model"), "utf8"), {}, kLlama3Pattern),
   metaEncode],
];
for (const [kind, enc, encode] of encodings) {
  let best = Infinity, total = 0, ids = null;
  for (let rep = 0; rep < 3 || total < minSeconds; rep++) {
    const start = process.hrtime.bigint();
    ids = encode(enc, text);
    const s = Number(process.hrtime.bigint() - start) / 1e9;
    best = Math.min(best, s);
    total += s;
  }
  let h = 2166136261;
  for (const id of ids) h = Math.imul(h ^ id, 16777619) >>> 0;
  console.log(`tiktoken ${kind} ${(mb / best).toFixed(3)} ${ids.length} ${h >>> 0}`);
  enc.free();
}

// The reference ids for test_tokenizer.cpp: the real tiktoken (npm `tiktoken`, Rust
// compiled to WASM) encodes strings with GPT-2's encoding and with Meta's Llama 3
// tokenizer.model and pattern, as encode_ordinary (special-token strings are text).
// Usage: node tests/unit/tiktoken_reference.js TOKENIZER_DIR IN.json OUT.json
//   TOKENIZER_DIR: what scripts/fetch_tokenizers.sh made (node_modules/tiktoken, llama3/)
//   IN.json: {"strings": [...]}; OUT.json: {"gpt2": [[ids]...], "llama3": [[ids]...]}
"use strict";
const fs = require("fs");
const path = require("path");

const [dir, input, output] = process.argv.slice(2);
if (!dir || !input || !output) {
  console.error("usage: node tiktoken_reference.js TOKENIZER_DIR IN.json OUT.json");
  process.exit(2);
}
const tiktoken = require(path.join(path.resolve(dir), "node_modules", "tiktoken"));

// meta-llama/llama3 llama/tokenizer.py pat_str, verbatim.
const kLlama3Pattern =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const gpt2 = tiktoken.get_encoding("gpt2");
const llama3 = new tiktoken.Tiktoken(
  fs.readFileSync(path.join(dir, "llama3", "tokenizer.model"), "utf8"),
  { "<|begin_of_text|>": 128000, "<|end_of_text|>": 128001 },
  kLlama3Pattern,
);
const { strings } = JSON.parse(fs.readFileSync(input, "utf8"));
const result = { gpt2: [], llama3: [] };
for (const s of strings) {
  result.gpt2.push(Array.from(gpt2.encode_ordinary(s)));
  result.llama3.push(Array.from(llama3.encode_ordinary(s)));
}
fs.writeFileSync(output, JSON.stringify(result));
gpt2.free();
llama3.free();

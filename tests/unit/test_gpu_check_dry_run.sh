#!/usr/bin/env bash
# The GPU checks' plumbing on the CPU (benchmarks/gpu/check.sh and check2.sh --dry-run),
# so that a broken script is found here and not on a GPU loan:
#   check.sh --dry-run passes every step it runs, ends with its summary, writes its log
#     under $OUT (which wins over OUT_DIR);
#   a failing step fails the check (CHECK_DRY_RUN_FAULT=1: the first step gets an unknown
#     option), and a deadline passed skips the steps left, "skipped (deadline)", with the
#     summary still printed;
#   an unknown option: exit 2; a driver older than a CUDA build: one line, exit 2;
#   check2.sh --dry-run: its 2-rank verify runs (mpirun --oversubscribe -np 2) pass.
# About 40 s on 2 busy cores. Usage: bash tests/unit/test_gpu_check_dry_run.sh (from the
# repository root; the checks use build/, as on a loan). Prints "ok:"/"FAIL:" lines; exit 0
# when all pass; SKIP without build/trident.
set -uo pipefail
[ -x build/trident ] || { echo "SKIP: no build/trident"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
expect() {  # description, then a command that must succeed
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}
show() { sed -n '/^=== summary/,$p' "$1" | sed 's/^/  | /'; }

t=$SECONDS
OUT=$tmp/out bash benchmarks/gpu/check.sh --dry-run "$tmp/ignored" > "$tmp/dry.log" 2>&1
rc=$?
echo "check.sh --dry-run: exit $rc in $((SECONDS - t)) s"
show "$tmp/dry.log"
[ $rc = 0 ] || grep -E '^FAIL' "$tmp/dry.log" | head -5
expect "check.sh --dry-run exits 0" [ $rc = 0 ]
expect "no step failed" grep -qE '^[0-9]+ steps: [0-9]+ passed, 0 failed' "$tmp/dry.log"
expect "no step skipped at the deadline" grep -qE 'skipped \(0 at the deadline\)' "$tmp/dry.log"
expect "every reference verified" [ "$(grep -cE '^PASS: verify .* fp32' "$tmp/dry.log")" = "$(ls tests/data/*.h5 | wc -l)" ]
expect "host syncs per step reported by the MoE run" grep -qE '^PASS: qwen3_moe.*host syncs per step [0-9]+' "$tmp/dry.log"
expect "the log under \$OUT, not OUT_DIR" bash -c '[ -s "$0/out/check.log" ] && [ ! -e "$0/ignored" ]' "$tmp"

t=$SECONDS
CHECK_DRY_RUN_FAULT=1 CHECK_DEADLINE_S=6 bash benchmarks/gpu/check.sh --dry-run "$tmp/fault" > "$tmp/fault.log" 2>&1
rc=$?
echo "check.sh --dry-run with a fault and a deadline of 6 s: exit $rc in $((SECONDS - t)) s"
show "$tmp/fault.log"
expect "a failing step fails the check (exit 1)" [ $rc = 1 ]
expect "the failed step named" grep -qE '^FAIL: kernels: .*exit 2' "$tmp/fault.log"
expect "steps past the deadline skipped, with the summary" grep -qE '^  SKIP: .*skipped \(deadline\)' "$tmp/fault.log"
expect "the summary's verdict FAIL" grep -qx 'check: FAIL' "$tmp/fault.log"

bash benchmarks/gpu/check.sh --no-such-option > "$tmp/bad.log" 2>&1
expect "an unknown option: exit 2" [ $? = 2 ]

# A driver older than the build (a stand-in nvidia-smi saying CUDA 12.4; this build says
# 13.0 or later): one line naming both, exit 2, before any step.
mkdir -p "$tmp/bin"
printf '#!/bin/sh\ncase "$1" in --query-gpu=*) echo "name"; echo "NVIDIA H100";; *) echo "| CUDA Version: 12.4 |";; esac\n' \
  > "$tmp/bin/nvidia-smi"
chmod +x "$tmp/bin/nvidia-smi"
if build/trident --version | grep -q 'CUDA: built with'; then
  PATH=$tmp/bin:$PATH bash benchmarks/gpu/check.sh "$tmp/old_driver" > "$tmp/old_driver.log" 2>&1
  rc=$?
  tail -1 "$tmp/old_driver.log" | sed 's/^/  | /'
  expect "an older driver: exit 2" [ $rc = 2 ]
  expect "one line naming the driver's CUDA and the build's" grep -qE '^the driver supports CUDA 12\.4; this build needs CUDA [0-9]+\.[0-9]+: ' "$tmp/old_driver.log"
  expect "and no step run" bash -c '! grep -qE "^(PASS|FAIL|SKIP):" "$0"' "$tmp/old_driver.log"
fi

t=$SECONDS
bash benchmarks/gpu/check2.sh --dry-run "$tmp/two" > "$tmp/two.log" 2>&1
rc=$?
echo "check2.sh --dry-run: exit $rc in $((SECONDS - t)) s"
show "$tmp/two.log"
expect "check2.sh --dry-run exits 0" [ $rc = 0 ]
expect "check2.sh ran ep 2, cp 2, tp 2 and ZeRO-3" bash -c 'for l in "ep 2" "cp 2" "tp 2" "ZeRO-3"; do
  grep -q "^PASS: np 2: $l" "$0" || exit 1; done' "$tmp/two.log"

[ $failures = 0 ] && echo PASS || echo "FAIL: $failures checks"
[ $failures = 0 ]

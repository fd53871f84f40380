#!/usr/bin/env bash
# slurm/efa_env.sh's variables reach the ranks of every mpirun launch: slurm/mpirun_ec2.sh
# and slurm/train.sbatch's mpirun branch (its preflight and its training) each forward
# exactly the variables efa_env.sh sets, with their values, on an EFA machine and off one.
# The scripts themselves run, with fakes first on PATH: fi_info (EFA there or not) and
# mpirun (prints the variables its -x flags name, as a rank would get them). No Slurm,
# no build, no network needed.
# Prints "ok: ..." or "FAIL: ..." lines; exit 0 when all pass.
# Usage: bash tests/slurm/test_efa_env.sh   (from the repository root)
set -uo pipefail
export LC_ALL=C  # one sort order for sort, comm and diff
repo=$(pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
expect_same() {  # description, expected file, actual file
  if diff -u "$2" "$3" > "$tmp/diff"; then
    echo "ok: $1"
  else
    echo "FAIL: $1 (- expected, + found)"
    sed 's/^/  | /' "$tmp/diff"
    failures=$((failures + 1))
  fi
}

mkdir -p "$tmp/bin"
# fi_info -p efa succeeds where FAKE_EFA=1.
printf '#!/bin/sh\n[ "$FAKE_EFA" = 1 ]\n' > "$tmp/bin/fi_info"
# mpirun: one file per call (numbered in call order) with NAME=value for each -x NAME, as
# Open MPI hands them to its ranks; its command after the flags on a comment line.
cat > "$tmp/bin/mpirun" <<'EOF'
#!/usr/bin/env bash
out=$FAKE_MPIRUN_DIR/call.$(printf %03d "$(compgen -G "$FAKE_MPIRUN_DIR/call.*" | wc -l)")
: > "$out"
while [ $# -gt 0 ]; do
  case $1 in
    -x) { printenv "$2" > /dev/null && printf '%s=%s\n' "$2" "$(printenv "$2")" || echo "$2 unset"; } >> "$out"
        shift 2 ;;
    *build/trident) echo "# $*" >> "$out"; break ;;
    *) shift ;;
  esac
done
EOF
chmod +x "$tmp/bin/fi_info" "$tmp/bin/mpirun"
printf 'localhost slots=2\n' > "$tmp/hosts.txt"

# A clean environment, as a batch job or a login shell would start one (no OMP_NUM_THREADS,
# nothing of EFA's), with the fakes first on PATH.
clean() { env -i PATH="$tmp/bin:$PATH" HOME="$tmp" FAKE_MPIRUN_DIR="$tmp/calls" "$@"; }

for efa in 1 0; do
  where=$([ $efa = 1 ] && echo "on an EFA machine" || echo "without EFA")
  rm -rf "$tmp/calls" "$tmp/ckpt"
  mkdir -p "$tmp/calls"
  # What efa_env.sh sets: the environment after sourcing it, less the one before.
  clean FAKE_EFA=$efa bash -c 'env | sort > "$0/before"; source slurm/efa_env.sh; env | sort > "$0/after"' "$tmp"
  comm -13 "$tmp/before" "$tmp/after" | grep -v '^_=' > "$tmp/expected"
  if [ $efa = 1 ]; then
    expect_same "efa_env.sh $where sets the variables its list names, no other" \
      <(tr ' ' '\n' <<< "$(clean bash -c 'source slurm/efa_env.sh; echo $efa_env_names')" | sort) \
      <(sed 's/=.*//' "$tmp/expected" | sort)
  fi
  grep -q '^OMP_NUM_THREADS=1$' "$tmp/expected" || { echo "FAIL: efa_env.sh $where: no OMP_NUM_THREADS=1"; failures=$((failures + 1)); }

  clean FAKE_EFA=$efa bash slurm/mpirun_ec2.sh "$tmp/hosts.txt" 2 configs/tiny.ini --train.steps=1 \
    > "$tmp/ec2.log" 2>&1 || { echo "FAIL: mpirun_ec2.sh $where exited $?"; cat "$tmp/ec2.log"; failures=$((failures + 1)); }
  clean FAKE_EFA=$efa TRIDENT_LAUNCHER=mpirun TRIDENT_HOME="$repo" TRIDENT_CKPT_DIR="$tmp/ckpt" SLURM_JOB_ID=7 \
    SLURM_JOB_NAME=efa-env SLURM_TASKS_PER_NODE='2(x2)' bash slurm/train.sbatch configs/tiny.ini --train.steps=1 \
    > "$tmp/sbatch.log" 2>&1 || { echo "FAIL: train.sbatch $where exited $?"; cat "$tmp/sbatch.log"; failures=$((failures + 1)); }
  # Three calls in order: mpirun_ec2.sh's training, train.sbatch's preflight and its training.
  names=("mpirun_ec2.sh" "train.sbatch's preflight (doctor)" "train.sbatch's training")
  commands=("train --config configs/tiny.ini --train.steps=1" "doctor --config configs/tiny.ini"
            "train --config configs/tiny.ini")
  mapfile -t calls < <(compgen -G "$tmp/calls/call.*" | sort)
  if [ ${#calls[@]} != 3 ]; then
    echo "FAIL: $where: ${#calls[@]} mpirun calls, not 3 (mpirun_ec2.sh, train.sbatch's preflight and training)"
    cat "$tmp/ec2.log" "$tmp/sbatch.log"
    failures=$((failures + 1))
    continue
  fi
  for i in 0 1 2; do
    grep -q "^# .*build/trident ${commands[$i]}" "${calls[$i]}" ||
      { echo "FAIL: $where: call $i is not ${names[$i]}: $(grep '^#' "${calls[$i]}")"; failures=$((failures + 1)); }
    expect_same "${names[$i]} $where forwards what efa_env.sh sets" "$tmp/expected" <(grep -v '^#' "${calls[$i]}" | sort)
  done
done

[ $failures = 0 ] && echo PASS || echo "FAIL: $failures checks"
[ $failures = 0 ]

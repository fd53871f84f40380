#!/usr/bin/env bash
# trident on bare EC2 instances: mpirun over a hostfile ("host slots=N" per line, N the
# ranks of that host: its GPUs, or its cores for CPU runs). Every host needs the same
# checkout at the same path and passwordless ssh between hosts.
#
#   slurm/mpirun_ec2.sh hosts.txt 16 configs/gpt2-124m.ini --parallel.tp=2
#
# Paths (hostfile, config, flags) are relative to where it is called from.
# Ranks fill each host's slots in hostfile order, so ranks 0..N-1 share the first host
# (the node-local groups tp and the checkpoint's node files rely on that). One OpenMP
# thread per rank binds each rank to a core; more threads leave the placement to the OS.
# SIGUSR1 to this script (or to mpirun) reaches every rank: they checkpoint and exit 0.
#
# Restarts (docs/self_healing.md), as slurm/train.sbatch's inside an allocation:
# - a run that fails with exit 3 (infrastructure) or with a rank killed by a signal starts
#   again at once, at most TRIDENT_MAX_RESTARTS times (default 3), resuming from its
#   newest checkpoint (node memory with checkpoint.memory_every_steps, else disk or S3);
# - TRIDENT_SPARE_NODES=k: the last k hosts of the hostfile wait as spares; the host that
#   failed (trident's verdict in <checkpoint.dir>/health, or the host mpirun names for a
#   rank that died) is left out and a spare takes its place. A failed host with no spare
#   left ends the script with the run's exit status.
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: slurm/mpirun_ec2.sh HOSTFILE RANKS CONFIG [trident train flags...]" >&2
  exit 2
fi
hostfile=$1 ranks=$2 config=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
max_restarts=${TRIDENT_MAX_RESTARTS:-3}
spares_wanted=${TRIDENT_SPARE_NODES:-0}
[[ $max_restarts =~ ^[0-9]+$ ]] || { echo "trident: error: TRIDENT_MAX_RESTARTS=$max_restarts: expected a count (0 or more)" >&2; exit 2; }
[[ $spares_wanted =~ ^[0-9]+$ ]] || { echo "trident: error: TRIDENT_SPARE_NODES=$spares_wanted: expected a count of hosts (0 or more)" >&2; exit 2; }
[ -r "$hostfile" ] || { echo "trident: error: cannot read the hostfile $hostfile" >&2; exit 2; }
source "$here/efa_env.sh"
source "$here/launch_step.sh"
mapfile -t forward < <(efa_env_mpirun_flags)  # efa_env.sh's variables, to every rank
bind=none
[ "${OMP_NUM_THREADS:-}" = 1 ] && bind=core

# The hosts in order (comments and blank lines left out); the last TRIDENT_SPARE_NODES wait.
mapfile -t lines < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$hostfile")
if [ "${#lines[@]}" -le "$spares_wanted" ]; then
  echo "trident: error: TRIDENT_SPARE_NODES=$spares_wanted: $hostfile names ${#lines[@]} host(s), and needs more than its spares" >&2
  exit 2
fi
active=("${lines[@]:0:${#lines[@]}-spares_wanted}")
spares=("${lines[@]:${#lines[@]}-spares_wanted}")
# The verdict's folder: --checkpoint.dir among the flags (the config's own is not read here).
ckpt_dir=
for flag in "$@"; do [[ $flag == --checkpoint.dir=* ]] && ckpt_dir=${flag#--checkpoint.dir=}; done
health_file=${ckpt_dir:+$ckpt_dir/health/local.json}
work=$(mktemp -d "${TMPDIR:-/tmp}/trident-ec2.XXXXXX")
trap 'rm -rf "$work"' EXIT
step_pid= stopping=0
trap 'stopping=1; [ -n "$step_pid" ] && kill -USR1 "$step_pid" 2>/dev/null || true' USR1

failed_host() {  # the verdict's host, else the one mpirun names for a rank that died
  local host=
  [ -n "$health_file" ] && [ -s "$health_file" ] &&
    host=$(sed -n 's/^  "host": "\(.*\)",\{0,1\}$/\1/p' "$health_file" | head -1)
  [ -n "$host" ] || host=$(dead_rank_node "$work/mpirun.log")
  echo "$host"
}

restarts=0
while true; do
  printf '%s\n' "${active[@]}" > "$work/hosts"
  [ -z "$health_file" ] || rm -f "$health_file"
  start_step "$work/mpirun.log" mpirun --hostfile "$work/hosts" -np "$ranks" --map-by slot --bind-to "$bind" \
    "${forward[@]}" "$here/../build/trident" train --config "$config" "$@"
  wait_step
  { [ "$status" = 3 ] || [ "$status" -gt 128 ]; } && [ "$stopping" = 0 ] && [ "$restarts" -lt "$max_restarts" ] ||
    exit "$status"
  host=$(failed_host)
  host=${host%%,*}
  at=-1  # its line in the hostfile (the names trident and mpirun give may be short where it has FQDNs)
  for i in "${!active[@]}"; do
    read -r name _ <<< "${active[$i]}"
    { [ "$name" = "$host" ] || [ "${name%%.*}" = "$host" ]; } && at=$i
  done
  if [ "$at" -ge 0 ] && [ "$spares_wanted" -gt 0 ]; then
    [ "${#spares[@]}" -gt 0 ] || { echo "trident: host $host failed (exit $status), no spare left" >&2; exit "$status"; }
    active[$at]=${spares[0]}
    echo "trident: host $host failed (exit $status): spare ${spares[0]%% *} takes its place"
    spares=("${spares[@]:1}")
  fi
  restarts=$((restarts + 1))
  echo "trident: restarting at $(date -u +%FT%T.%3NZ) on $(printf '%s ' "${active[@]%% *}")($restarts of at most $max_restarts, TRIDENT_MAX_RESTARTS)"
done

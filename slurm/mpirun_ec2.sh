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
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: slurm/mpirun_ec2.sh HOSTFILE RANKS CONFIG [trident train flags...]" >&2
  exit 2
fi
hostfile=$1 ranks=$2 config=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
source "$here/efa_env.sh"
mapfile -t forward < <(efa_env_mpirun_flags)  # efa_env.sh's variables, to every rank
bind=none
[ "$OMP_NUM_THREADS" = 1 ] && bind=core
exec mpirun --hostfile "$hostfile" -np "$ranks" --map-by slot --bind-to "$bind" "${forward[@]}" \
  "$here/../build/trident" train --config "$config" "$@"

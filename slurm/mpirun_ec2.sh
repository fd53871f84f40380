#!/usr/bin/env bash
# trident on bare EC2 instances: mpirun over a hostfile ("host slots=N" per line).
#
#   slurm/mpirun_ec2.sh hosts.txt 16 configs/gpt2-124m.ini --parallel.tp=2
#
# SIGUSR1 to this script (or to mpirun) reaches every rank: they checkpoint and exit 0.
set -euo pipefail
hostfile=$1 ranks=$2 config=$3
shift 3
source "$(dirname "$0")/efa_env.sh"
exec mpirun --hostfile "$hostfile" -np "$ranks" --map-by ppr:1:core --bind-to core \
  -x OMP_NUM_THREADS -x FI_PROVIDER -x FI_EFA_USE_DEVICE_RDMA -x FI_EFA_FORK_SAFE -x NCCL_PROTO \
  build/trident train --config "$config" "$@"

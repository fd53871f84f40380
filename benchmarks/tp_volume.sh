#!/usr/bin/env bash
# Tensor-parallel bytes per step, measured by the communicator layer vs the formula.
# Usage: benchmarks/tp_volume.sh [BUILD_DIR] [--section.key=value ...]
set -euo pipefail
build=${1:-build}
shift || true
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
header=1
for np in 1 2 3 4 6; do
  TP_VOLUME_HEADER=$header mpirun --oversubscribe -x OMP_NUM_THREADS=1 -x TP_VOLUME_HEADER -np $np \
    "$build/bench/tp_volume" "$@" | grep '|'
  header=
done
